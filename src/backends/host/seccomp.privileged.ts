// SECURITY-CRITICAL: this file generates the seccomp filter that every namespaces-tier sandbox runs under.
// The bytes returned by buildSeccompFilter() are handed to bubblewrap (`bwrap --seccomp FD`), which sets
// no_new_privs and installs them with prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER) right before exec'ing
// the sandboxed command. A mistake here (a wrong syscall number, a jump landing one instruction off, a
// missing architecture check) silently re-opens kernel attack surface, so:
//   - the program is built by a tiny classic-BPF assembler that resolves labels and refuses (throws) on
//     any jump it cannot encode, instead of emitting something subtly different;
//   - syscall numbers are x86_64 only, copied from arch/x86/entry/syscalls/syscall_64.tbl and checked
//     against <sys/syscall.h>;
//   - test/unit/seccomp.test.ts runs the program through an independent BPF interpreter and, when
//     possible, for real under bwrap.
//
// Policy, in the spirit of Docker's default profile (default action: ALLOW):
//   1. seccomp_data.arch must be AUDIT_ARCH_X86_64, otherwise KILL_PROCESS. Without this a process could
//      reach the i386 syscall table (int 0x80), where the numbers below mean different syscalls.
//   2. x32 ABI syscalls (nr with bit 0x40000000) → EPERM; they alias x86_64 syscalls under other numbers.
//   3. DENIED_SYSCALLS → EPERM (namespace/mount manipulation, kernel modules, keyrings, bpf, ptrace, ...).
//      UNAVAILABLE_SYSCALLS → ENOSYS: newer calls a sandbox has no need for, whose callers probe for them
//      and fall back when the kernel lacks them (statmount → /proc/self/mountinfo, lsm_* → /proc/self/attr).
//   4. Any number above HIGHEST_REVIEWED_SYSCALL → ENOSYS: a syscall added to the kernel after this table
//      was reviewed never reaches the kernel unreviewed (runc answers syscalls newer than its profile so).
//   5. clone/unshare with CLONE_NEWUSER → EPERM; clone3 → ENOSYS so libc falls back to clone(2), whose
//      flags (a register, unlike clone3's struct in user memory) the filter can inspect.
//   6. socket/socketpair only for AF_UNIX, AF_INET, AF_INET6 → otherwise EPERM (no netlink, packet, ...).
//   7. personality only for the persona values Docker allows → otherwise EPERM.
// Landlock syscalls and chroot stay allowed: a sandbox may restrict itself further.
//
// Reviewed against Linux 6.18's table (up to file_setattr, 469) and Docker's default profile. Newer
// syscalls left allowed, and why: landlock_* (self-restriction); futex_waitv/wake/wait/requeue (futex2:
// the futex code, used by Wine and newer libcs); fchmodat2, openat2, faccessat2, close_range,
// epoll_pwait2, setxattrat/getxattrat/listxattrat/removexattrat, file_getattr/file_setattr (variants of
// allowed calls, with the same permission checks); map_shadow_stack (CET hardening of the caller's own
// memory); pidfd_open/pidfd_send_signal (processes of the sandbox's own pid namespace); rseq,
// io_pgetevents; uretprobe/uprobe (the kernel honours them only from its own probe trampolines).

import { AirlockError } from '../../core/errors.js';

// ---------------------------------------------------------------------------------------------------
// Constants (include/uapi/linux/{filter,bpf_common,seccomp,audit}.h)
// ---------------------------------------------------------------------------------------------------

// Classic BPF opcodes: class | size | mode (loads) or class | op | src (jumps/ALU).
const BPF_LD = 0x00;
const BPF_JMP = 0x05;
const BPF_RET = 0x06;
const BPF_W = 0x00;
const BPF_ABS = 0x20;
const BPF_JEQ = 0x10;
const BPF_JGT = 0x20;
const BPF_JSET = 0x40;
const BPF_K = 0x00;

const SECCOMP_RET_KILL_PROCESS = 0x80000000;
const SECCOMP_RET_ERRNO = 0x00050000;
const SECCOMP_RET_ALLOW = 0x7fff0000;
const SECCOMP_RET_DATA = 0x0000ffff;

const EPERM = 1;
const ENOSYS = 38;

const AUDIT_ARCH_X86_64 = 0xc000003e;
const X32_SYSCALL_BIT = 0x40000000;

const CLONE_NEWUSER = 0x10000000;
const AF_UNIX = 1;
const AF_INET = 2;
const AF_INET6 = 10;

/** personality(2) values Docker's default profile allows: PER_LINUX, PER_LINUX32, UNAME26 variants, query. */
const ALLOWED_PERSONALITIES = [0x0, 0x8, 0x20000, 0x20008, 0xffffffff] as const;

// struct seccomp_data { int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6]; } — 64 bytes.
// Classic BPF loads are 32-bit, so an argument is read as its low half; on little-endian x86_64 that is
// at 16 + 8*i. Every argument checked below is truncated to 32 bits by the kernel itself (int/unsigned
// int parameters; clone(2) uses lower_32_bits(flags)), so the low half is exactly what the kernel sees.
const SECCOMP_DATA_NR = 0;
const SECCOMP_DATA_ARCH = 4;
const SECCOMP_DATA_SIZE = 64;
const argLow = (i: number): number => 16 + 8 * i;

/** Kernel limit on a classic BPF program (BPF_MAXINSNS). */
const BPF_MAXINSNS = 4096;

// ---------------------------------------------------------------------------------------------------
// Syscall table
// ---------------------------------------------------------------------------------------------------

/** x86_64 numbers (arch/x86/entry/syscalls/syscall_64.tbl) for every syscall this filter mentions. */
export const X86_64_SYSCALLS: Readonly<Record<string, number>> = Object.freeze({
  clone: 56,
  socket: 41,
  socketpair: 53,
  ptrace: 101,
  syslog: 103,
  personality: 135,
  uselib: 134,
  vhangup: 153,
  pivot_root: 155,
  adjtimex: 159,
  acct: 163,
  settimeofday: 164,
  mount: 165,
  umount2: 166,
  swapon: 167,
  swapoff: 168,
  reboot: 169,
  iopl: 172,
  ioperm: 173,
  init_module: 175,
  delete_module: 176,
  quotactl: 179,
  nfsservctl: 180,
  lookup_dcookie: 212,
  clock_settime: 227,
  kexec_load: 246,
  add_key: 248,
  request_key: 249,
  keyctl: 250,
  unshare: 272,
  perf_event_open: 298,
  fanotify_init: 300,
  name_to_handle_at: 303,
  open_by_handle_at: 304,
  clock_adjtime: 305,
  setns: 308,
  process_vm_readv: 310,
  process_vm_writev: 311,
  kcmp: 312,
  pidfd_getfd: 438,
  process_madvise: 440,
  finit_module: 313,
  kexec_file_load: 320,
  bpf: 321,
  userfaultfd: 323,
  io_uring_setup: 425,
  io_uring_enter: 426,
  io_uring_register: 427,
  open_tree: 428,
  move_mount: 429,
  fsopen: 430,
  fsconfig: 431,
  fsmount: 432,
  fspick: 433,
  clone3: 435,
  mount_setattr: 442,
  quotactl_fd: 443,
  // Older calls Docker's default profile also denies.
  ustat: 136,
  sysfs: 139,
  modify_ldt: 154,
  mbind: 237,
  set_mempolicy: 238,
  get_mempolicy: 239,
  migrate_pages: 256,
  move_pages: 279,
  // Linux 5.14 .. 6.18.
  memfd_secret: 447,
  process_mrelease: 448,
  set_mempolicy_home_node: 450,
  cachestat: 451,
  statmount: 457,
  listmount: 458,
  lsm_get_self_attr: 459,
  lsm_set_self_attr: 460,
  lsm_list_modules: 461,
  mseal: 462,
  open_tree_attr: 467,
  file_setattr: 469,
});

/**
 * The highest syscall number this policy was reviewed against (file_setattr, Linux 6.18). Anything
 * above it fails with ENOSYS, as on a kernel that does not have it yet.
 */
export const HIGHEST_REVIEWED_SYSCALL = syscallNumber('file_setattr');

/** Syscalls that always fail with EPERM, whatever their arguments. */
export const DENIED_SYSCALLS: readonly string[] = Object.freeze([
  // Inspecting / tampering with other processes.
  'ptrace',
  'process_vm_readv',
  'process_vm_writev',
  'kcmp',
  'pidfd_getfd', // steals another process's fd: ptrace-class
  'process_madvise', // acts on another process's memory: ptrace-class
  'process_mrelease', // reaps another (dying) process's memory
  'migrate_pages', // moves another process's pages between NUMA nodes
  'move_pages', // the same, page by page
  // NUMA placement (Docker: CAP_SYS_NICE only).
  'mbind',
  'set_mempolicy',
  'set_mempolicy_home_node',
  'get_mempolicy',
  // Mount table and namespaces (bwrap has already built the sandbox's view).
  'mount',
  'umount2',
  'pivot_root',
  'move_mount',
  'open_tree',
  'fsopen',
  'fsconfig',
  'fsmount',
  'fspick',
  'mount_setattr',
  'open_tree_attr',
  'setns',
  // Kernel keyrings are not namespaced.
  'keyctl',
  'add_key',
  'request_key',
  // Large, frequently exploited kernel surfaces.
  'bpf',
  'perf_event_open',
  'userfaultfd',
  'io_uring_setup',
  'io_uring_enter',
  'io_uring_register',
  // Kernel code loading and machine state.
  'kexec_load',
  'kexec_file_load',
  'init_module',
  'finit_module',
  'delete_module',
  'reboot',
  'swapon',
  'swapoff',
  'acct',
  'syslog',
  'quotactl',
  'quotactl_fd',
  'lookup_dcookie',
  'uselib',
  'ustat', // filesystem statistics of any device: obsolete (statfs)
  'sysfs', // obsolete filesystem-type query
  'modify_ldt', // 16-bit segments: a long record of kernel bugs, needed only by DOS/Win16 emulation
  'nfsservctl',
  'vhangup',
  'fanotify_init',
  // Raw I/O port access.
  'iopl',
  'ioperm',
  // File handles bypass path-based confinement (the "shocker" escape).
  'open_by_handle_at',
  'name_to_handle_at',
  // The clock is global, not namespaced.
  'settimeofday',
  'clock_settime',
  'clock_adjtime',
  'adjtimex',
]);

/**
 * Syscalls that fail with ENOSYS, as on a kernel without them: newer calls a sandbox has no need for,
 * whose callers check for ENOSYS and fall back.
 */
export const UNAVAILABLE_SYSCALLS: readonly string[] = Object.freeze([
  // Mount-table introspection by mount id, beside the mount API (fallback: /proc/self/mountinfo).
  'statmount',
  'listmount',
  // LSM attributes of the caller (fallback: /proc/self/attr); the LSM set is the host's business.
  'lsm_get_self_attr',
  'lsm_set_self_attr',
  'lsm_list_modules',
  // Memory taken out of the kernel's direct map: memory the host cannot inspect or reclaim.
  'memfd_secret',
  // Sealing mappings against change: new mm code, no need in a sandbox (callers skip sealing).
  'mseal',
  // Page-cache state of any file it can open: a side channel on files shared with others (fallback: mincore).
  'cachestat',
]);

// ---------------------------------------------------------------------------------------------------
// A tiny classic-BPF assembler
// ---------------------------------------------------------------------------------------------------

/**
 * A jump target: a label name, or a number of instructions to skip (0 = fall through to the next one).
 * Classic BPF only jumps forward, by an unsigned 8-bit offset.
 */
type Target = string | number;

type Insn =
  | { readonly op: 'ld'; readonly offset: number } // A = u32 at seccomp_data[offset]
  | { readonly op: 'jeq' | 'jgt' | 'jset'; readonly k: number; readonly jt: Target; readonly jf: Target }
  | { readonly op: 'ret'; readonly k: number }
  | { readonly op: 'label'; readonly name: string }; // pseudo-instruction, emits nothing

const ld = (offset: number): Insn => ({ op: 'ld', offset });
/** if (A == k) goto jt else goto jf */
const jeq = (k: number, jt: Target, jf: Target): Insn => ({ op: 'jeq', k, jt, jf });
/** if (A > k) goto jt else goto jf (unsigned) */
const jgt = (k: number, jt: Target, jf: Target): Insn => ({ op: 'jgt', k, jt, jf });
/** if (A & k) goto jt else goto jf */
const jset = (k: number, jt: Target, jf: Target): Insn => ({ op: 'jset', k, jt, jf });
const ret = (k: number): Insn => ({ op: 'ret', k });
const label = (name: string): Insn => ({ op: 'label', name });

const retErrno = (errno: number): Insn => ret(SECCOMP_RET_ERRNO | (errno & SECCOMP_RET_DATA));
const RET_ALLOW = ret(SECCOMP_RET_ALLOW);

function assemblerError(message: string): AirlockError {
  // A failure here is a bug in the policy below, never bad user input.
  return new AirlockError('INTERNAL', `seccomp assembler: ${message}`);
}

function checkU32(k: number, what: string): void {
  if (!Number.isInteger(k) || k < 0 || k > 0xffffffff) throw assemblerError(`${what} is not a u32: ${k}`);
}

/** Resolves labels and encodes `struct sock_filter[]` (u16 code, u8 jt, u8 jf, u32 k; little-endian). */
function assemble(program: readonly Insn[]): Buffer {
  // Pass 1: give each label the index of the next real instruction.
  const labels = new Map<string, number>();
  let count = 0;
  for (const insn of program) {
    if (insn.op === 'label') {
      if (labels.has(insn.name)) throw assemblerError(`duplicate label ${insn.name}`);
      labels.set(insn.name, count);
    } else {
      count++;
    }
  }
  if (count === 0 || count > BPF_MAXINSNS) throw assemblerError(`program length ${count} out of range`);

  // Offset from the instruction after `pc` to `target`; must fit in a u8 and land inside the program.
  const resolve = (pc: number, target: Target): number => {
    let off: number;
    if (typeof target === 'number') {
      off = target;
    } else {
      const at = labels.get(target);
      if (at === undefined) throw assemblerError(`undefined label ${target}`);
      off = at - (pc + 1);
    }
    if (!Number.isInteger(off) || off < 0 || off > 255) {
      throw assemblerError(`jump at ${pc} to ${String(target)} has offset ${off}, outside 0..255`);
    }
    if (pc + 1 + off >= count) throw assemblerError(`jump at ${pc} to ${String(target)} leaves the program`);
    return off;
  };

  const out = Buffer.alloc(count * 8);
  let pc = 0;
  for (const insn of program) {
    if (insn.op === 'label') continue;
    let code: number;
    let jt = 0;
    let jf = 0;
    let k: number;
    switch (insn.op) {
      case 'ld':
        // The kernel's seccomp checker only accepts aligned 32-bit loads inside struct seccomp_data.
        if (!Number.isInteger(insn.offset) || insn.offset % 4 !== 0 || insn.offset >= SECCOMP_DATA_SIZE) {
          throw assemblerError(`bad seccomp_data offset ${insn.offset}`);
        }
        code = BPF_LD | BPF_W | BPF_ABS;
        k = insn.offset;
        break;
      case 'jeq':
      case 'jgt':
      case 'jset':
        code = BPF_JMP | { jeq: BPF_JEQ, jgt: BPF_JGT, jset: BPF_JSET }[insn.op] | BPF_K;
        jt = resolve(pc, insn.jt);
        jf = resolve(pc, insn.jf);
        k = insn.k;
        break;
      case 'ret':
        code = BPF_RET | BPF_K;
        k = insn.k;
        break;
    }
    checkU32(k, `k at ${pc}`);
    const at = pc * 8;
    out.writeUInt16LE(code, at);
    out.writeUInt8(jt, at + 2);
    out.writeUInt8(jf, at + 3);
    out.writeUInt32LE(k, at + 4);
    pc++;
  }
  // Every path must end in a RET: the last instruction has no successor to fall through to.
  if ((out.readUInt16LE(out.length - 8) & 0x07) !== BPF_RET)
    throw assemblerError('program does not end in RET');
  return out;
}

// ---------------------------------------------------------------------------------------------------
// The policy
// ---------------------------------------------------------------------------------------------------

export interface SeccompOptions {
  /**
   * More syscalls to fail with EPERM: names from X86_64_SYSCALLS, or raw x86_64 numbers. Unconditional
   * denials are checked before the argument filters, so listing e.g. 'socket' denies every socket.
   */
  extraDeniedSyscalls?: readonly (string | number)[];
}

function syscallNumber(name: string): number {
  const nr = Object.hasOwn(X86_64_SYSCALLS, name) ? X86_64_SYSCALLS[name] : undefined;
  if (nr === undefined) throw assemblerError(`no x86_64 number for ${name}`);
  return nr;
}

function resolveExtra(entry: string | number): number {
  if (typeof entry === 'number') {
    if (!Number.isInteger(entry) || entry < 0 || entry >= X32_SYSCALL_BIT) {
      throw new AirlockError('INVALID_ARGUMENT', `not an x86_64 syscall number: ${entry}`, {
        field: 'extraDeniedSyscalls',
      });
    }
    return entry;
  }
  if (!Object.hasOwn(X86_64_SYSCALLS, entry)) {
    throw new AirlockError('INVALID_ARGUMENT', `unknown syscall name: ${entry}`, {
      field: 'extraDeniedSyscalls',
    });
  }
  return syscallNumber(entry);
}

/** Returns the raw filter program (struct sock_filter[], little-endian) for `bwrap --seccomp FD`. */
export function buildSeccompFilter(opts: SeccompOptions = {}): Buffer {
  const denied = new Set<number>(DENIED_SYSCALLS.map(syscallNumber));
  for (const extra of opts.extraDeniedSyscalls ?? []) denied.add(resolveExtra(extra));
  // An extra EPERM wins over ENOSYS for the same number.
  const unavailable = UNAVAILABLE_SYSCALLS.map(syscallNumber).filter((n) => !denied.has(n));

  const nr = syscallNumber;
  const program: Insn[] = [
    // 1. Architecture: anything but native x86_64 is killed.
    ld(SECCOMP_DATA_ARCH),
    jeq(AUDIT_ARCH_X86_64, 1, 0),
    ret(SECCOMP_RET_KILL_PROCESS),

    // From here on A holds the syscall number until a block loads an argument (and then returns).
    ld(SECCOMP_DATA_NR),

    // 2. x32 ABI.
    jset(X32_SYSCALL_BIT, 0, 1),
    retErrno(EPERM),
  ];

  // 3. Unconditional denials, as self-contained pairs so no jump ever spans the list, however long:
  //    if (nr == k) fall through to RET EPERM, else skip it.
  for (const n of [...denied].sort((a, b) => a - b)) program.push(jeq(n, 0, 1), retErrno(EPERM));
  for (const n of unavailable.sort((a, b) => a - b)) program.push(jeq(n, 0, 1), retErrno(ENOSYS));

  program.push(
    // 4. Newer than the review: if (nr > HIGHEST) ENOSYS. (x32 numbers were answered above; an extra
    //    denial above the review, checked before this, keeps its EPERM.)
    jgt(HIGHEST_REVIEWED_SYSCALL, 0, 1),
    retErrno(ENOSYS),

    // 5a. clone3 → ENOSYS: glibc/musl then fall back to clone(2), checked next.
    jeq(nr('clone3'), 0, 1),
    retErrno(ENOSYS),

    // 5b. unshare(flags) / clone(flags, ...): no new user namespaces (they unlock lots of kernel code
    //     that otherwise needs real privilege).
    jeq(nr('unshare'), 'newuser', 0),
    jeq(nr('clone'), 'newuser', 'newuser_end'),
    label('newuser'),
    ld(argLow(0)),
    jset(CLONE_NEWUSER, 0, 1),
    retErrno(EPERM),
    RET_ALLOW,
    label('newuser_end'),

    // 6. socket(domain, ...) / socketpair(domain, ...): unix and IP only.
    jeq(nr('socket'), 'socket', 0),
    jeq(nr('socketpair'), 'socket', 'socket_end'),
    label('socket'),
    ld(argLow(0)),
    jeq(AF_UNIX, 'socket_allow', 0),
    jeq(AF_INET, 'socket_allow', 0),
    jeq(AF_INET6, 'socket_allow', 0),
    retErrno(EPERM),
    label('socket_allow'),
    RET_ALLOW,
    label('socket_end'),

    // 7. personality(persona): only the allowed values (e.g. no READ_IMPLIES_EXEC, no ADDR_NO_RANDOMIZE).
    jeq(nr('personality'), 0, 'personality_end'),
    ld(argLow(0)),
    ...ALLOWED_PERSONALITIES.map((p) => jeq(p, 'personality_allow', 0)),
    retErrno(EPERM),
    label('personality_allow'),
    RET_ALLOW,
    label('personality_end'),

    // Default action.
    RET_ALLOW,
  );

  return assemble(program);
}
