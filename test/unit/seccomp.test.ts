import { spawn, spawnSync } from 'node:child_process';
import { accessSync, constants } from 'node:fs';
import { delimiter, join } from 'node:path';
import type { Writable } from 'node:stream';
import { describe, it, expect } from 'vitest';
import { AirlockError } from '../../src/core/errors.js';
import {
  buildSeccompFilter,
  DENIED_SYSCALLS,
  HIGHEST_REVIEWED_SYSCALL,
  UNAVAILABLE_SYSCALLS,
  X86_64_SYSCALLS,
} from '../../src/backends/host/seccomp.privileged.js';

// Expected values are spelled out here, independently of the module under test.
const ALLOW = 0x7fff0000;
const KILL_PROCESS = 0x80000000;
const ERRNO = (e: number): number => 0x00050000 | e;
const EPERM = 1;
const ENOSYS = 38;
const AUDIT_ARCH_X86_64 = 0xc000003e;
const AUDIT_ARCH_I386 = 0x40000003;
const CLONE_NEWNS = 0x00020000;
const CLONE_NEWUSER = 0x10000000;
const SIGCHLD = 17;

function nr(name: string): number {
  const n = X86_64_SYSCALLS[name];
  if (n === undefined) throw new Error(`test: no number for ${name}`);
  return n;
}

// ---------------------------------------------------------------------------------------------------
// A minimal classic-BPF interpreter for the subset a seccomp filter uses (see linux/filter.h).
// ---------------------------------------------------------------------------------------------------

interface SockFilter {
  code: number;
  jt: number;
  jf: number;
  k: number;
}

function decode(prog: Buffer): SockFilter[] {
  const out: SockFilter[] = [];
  for (let at = 0; at < prog.length; at += 8) {
    out.push({
      code: prog.readUInt16LE(at),
      jt: prog.readUInt8(at + 2),
      jf: prog.readUInt8(at + 3),
      k: prog.readUInt32LE(at + 4),
    });
  }
  return out;
}

function seccompData(
  sysNr: number,
  args: readonly (number | bigint)[] = [],
  arch = AUDIT_ARCH_X86_64,
): Buffer {
  const d = Buffer.alloc(64);
  d.writeUInt32LE(sysNr >>> 0, 0);
  d.writeUInt32LE(arch >>> 0, 4);
  d.writeBigUInt64LE(0x401000n, 8);
  args.forEach((a, i) => d.writeBigUInt64LE(BigInt.asUintN(64, BigInt(a)), 16 + 8 * i));
  return d;
}

/** Runs the program; returns the u32 seccomp action. Throws on anything outside the expected subset. */
function run(prog: Buffer, data: Buffer): number {
  const insns = decode(prog);
  let a = 0;
  let pc = 0;
  for (let steps = 0; steps <= insns.length; steps++) {
    const i = insns[pc];
    if (i === undefined) throw new Error(`pc ${pc} fell off the program`);
    switch (i.code) {
      case 0x20: // BPF_LD | BPF_W | BPF_ABS
        if (i.k % 4 !== 0 || i.k + 4 > data.length) throw new Error(`bad load offset ${i.k}`);
        a = data.readUInt32LE(i.k);
        pc++;
        break;
      case 0x54: // BPF_ALU | BPF_AND | BPF_K
        a = (a & i.k) >>> 0;
        pc++;
        break;
      case 0x15: // BPF_JMP | BPF_JEQ | BPF_K
        pc += 1 + (a === i.k ? i.jt : i.jf);
        break;
      case 0x25: // BPF_JMP | BPF_JGT | BPF_K (unsigned)
        pc += 1 + (a >>> 0 > i.k >>> 0 ? i.jt : i.jf);
        break;
      case 0x45: // BPF_JMP | BPF_JSET | BPF_K
        pc += 1 + ((a & i.k) !== 0 ? i.jt : i.jf);
        break;
      case 0x06: // BPF_RET | BPF_K
        return i.k;
      default:
        throw new Error(`unexpected opcode 0x${i.code.toString(16)} at ${pc}`);
    }
  }
  throw new Error('program did not terminate');
}

// Spelled out from arch/x86/entry/syscalls/syscall_64.tbl (Linux 6.18), not from the module.
const REVIEWED: ReadonlyArray<[string, number, number]> = [
  ['open_tree', 428, EPERM],
  ['move_mount', 429, EPERM],
  ['fsopen', 430, EPERM],
  ['fsconfig', 431, EPERM],
  ['fsmount', 432, EPERM],
  ['fspick', 433, EPERM],
  ['pidfd_getfd', 438, EPERM],
  ['process_madvise', 440, EPERM],
  ['mount_setattr', 442, EPERM],
  ['quotactl_fd', 443, EPERM],
  ['memfd_secret', 447, ENOSYS],
  ['process_mrelease', 448, EPERM],
  ['set_mempolicy_home_node', 450, EPERM],
  ['cachestat', 451, ENOSYS],
  ['statmount', 457, ENOSYS],
  ['listmount', 458, ENOSYS],
  ['lsm_get_self_attr', 459, ENOSYS],
  ['lsm_set_self_attr', 460, ENOSYS],
  ['lsm_list_modules', 461, ENOSYS],
  ['mseal', 462, ENOSYS],
  ['open_tree_attr', 467, EPERM],
  ['ustat', 136, EPERM],
  ['sysfs', 139, EPERM],
  ['modify_ldt', 154, EPERM],
  ['mbind', 237, EPERM],
  ['set_mempolicy', 238, EPERM],
  ['get_mempolicy', 239, EPERM],
  ['migrate_pages', 256, EPERM],
  ['move_pages', 279, EPERM],
];
/** Reviewed and left allowed (see the policy comment in the module). */
const REVIEWED_ALLOWED: ReadonlyArray<[string, number]> = [
  ['pidfd_open', 434],
  ['close_range', 436],
  ['openat2', 437],
  ['faccessat2', 439],
  ['epoll_pwait2', 441],
  ['landlock_create_ruleset', 444],
  ['landlock_add_rule', 445],
  ['landlock_restrict_self', 446],
  ['futex_waitv', 449],
  ['fchmodat2', 452],
  ['map_shadow_stack', 453],
  ['futex_wake', 454],
  ['futex_wait', 455],
  ['futex_requeue', 456],
  ['setxattrat', 463],
  ['getxattrat', 464],
  ['listxattrat', 465],
  ['removexattrat', 466],
  ['file_getattr', 468],
  ['file_setattr', 469],
  ['uretprobe', 335],
  ['uprobe', 336],
];

const prog = buildSeccompFilter();
const call = (name: string, ...args: (number | bigint)[]): number => run(prog, seccompData(nr(name), args));

describe('seccomp filter: structure', () => {
  it('is a whole number of sock_filter entries within the kernel limit', () => {
    expect(prog.length % 8).toBe(0);
    expect(prog.length / 8).toBeGreaterThan(0);
    expect(prog.length / 8).toBeLessThanOrEqual(4096);
  });

  it('first loads seccomp_data.arch and checks it', () => {
    const [first, second] = decode(prog);
    expect(first).toEqual({ code: 0x20, jt: 0, jf: 0, k: 4 });
    expect(second?.code).toBe(0x15);
    expect(second?.k).toBe(AUDIT_ARCH_X86_64);
  });

  it('keeps every jump inside the program and ends with RET', () => {
    const insns = decode(prog);
    insns.forEach((i, pc) => {
      if ((i.code & 0x07) === 0x05) {
        expect(pc + 1 + i.jt).toBeLessThan(insns.length);
        expect(pc + 1 + i.jf).toBeLessThan(insns.length);
      } else {
        expect(i.jt).toBe(0);
        expect(i.jf).toBe(0);
      }
      if (i.code === 0x20) expect(i.k % 4 === 0 && i.k < 64).toBe(true);
    });
    expect(insns.at(-1)?.code).toBe(0x06);
  });

  it('is deterministic', () => {
    expect(buildSeccompFilter().equals(prog)).toBe(true);
  });
});

describe('seccomp filter: policy (interpreted)', () => {
  it('kills other architectures', () => {
    expect(run(prog, seccompData(39, [], AUDIT_ARCH_I386))).toBe(KILL_PROCESS);
    expect(run(prog, seccompData(39, [], 0))).toBe(KILL_PROCESS);
  });

  it('denies the x32 ABI', () => {
    expect(run(prog, seccompData(0x40000000 | 39))).toBe(ERRNO(EPERM));
    expect(run(prog, seccompData(0x40000000 | nr('socket'), [2]))).toBe(ERRNO(EPERM));
  });

  it('allows ordinary syscalls', () => {
    expect(run(prog, seccompData(39))).toBe(ALLOW); // getpid
    expect(run(prog, seccompData(0, [0, 0, 0]))).toBe(ALLOW); // read
    expect(run(prog, seccompData(59))).toBe(ALLOW); // execve
    expect(run(prog, seccompData(161))).toBe(ALLOW); // chroot stays allowed
    expect(run(prog, seccompData(444))).toBe(ALLOW); // landlock_create_ruleset stays allowed
  });

  it('denies ptrace and mount', () => {
    expect(call('ptrace', 0)).toBe(ERRNO(EPERM));
    expect(call('mount', 0, 0, 0, 0, 0)).toBe(ERRNO(EPERM));
  });

  it('denies every name in DENIED_SYSCALLS, whatever the arguments', () => {
    expect(DENIED_SYSCALLS.length).toBeGreaterThan(40);
    for (const name of DENIED_SYSCALLS) {
      expect(call(name), name).toBe(ERRNO(EPERM));
      expect(call(name, 2, CLONE_NEWNS, -1, 0, 0, 0), name).toBe(ERRNO(EPERM));
    }
  });

  it('restricts socket and socketpair domains', () => {
    for (const name of ['socket', 'socketpair']) {
      expect(call(name, 1, 1, 0), name).toBe(ALLOW); // AF_UNIX
      expect(call(name, 2, 1, 0), name).toBe(ALLOW); // AF_INET
      expect(call(name, 10, 2, 0), name).toBe(ALLOW); // AF_INET6
      expect(call(name, 16, 3, 0), name).toBe(ERRNO(EPERM)); // AF_NETLINK
      expect(call(name, 17, 3, 0), name).toBe(ERRNO(EPERM)); // AF_PACKET
      expect(call(name, 38, 5, 0), name).toBe(ERRNO(EPERM)); // AF_ALG
      expect(call(name, 0, 1, 0), name).toBe(ERRNO(EPERM)); // AF_UNSPEC
    }
    // The kernel reads `int family`: high garbage does not change the verdict on the low half.
    expect(call('socket', 0x1_0000_0002n, 1, 0)).toBe(ALLOW);
    expect(call('socket', 0x1_0000_0010n, 1, 0)).toBe(ERRNO(EPERM));
  });

  it('denies new user namespaces via unshare and clone, and sends clone3 to ENOSYS', () => {
    expect(call('unshare', CLONE_NEWUSER)).toBe(ERRNO(EPERM));
    expect(call('unshare', CLONE_NEWUSER | CLONE_NEWNS)).toBe(ERRNO(EPERM));
    expect(call('unshare', CLONE_NEWNS)).toBe(ALLOW);
    expect(call('unshare', 0)).toBe(ALLOW);
    expect(call('clone', CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0)).toBe(ERRNO(EPERM));
    expect(call('clone', 0x003d0f00, 0x7f0000001000, 0, 0, 0)).toBe(ALLOW); // pthread_create's flags
    expect(call('clone', SIGCHLD)).toBe(ALLOW); // fork()
    expect(call('clone3', 0, 88)).toBe(ERRNO(ENOSYS));
  });

  it('allows only the Docker personality values', () => {
    for (const p of [0x0, 0x8, 0x20000, 0x20008, 0xffffffff])
      expect(call('personality', p), `${p}`).toBe(ALLOW);
    for (const p of [0x0400000, 0x0040000, 0x1, 0x0400008, 0xfffffffe]) {
      expect(call('personality', p), `${p}`).toBe(ERRNO(EPERM));
    }
  });

  it('changes nothing else: a sweep over 0..1023 with zero args', () => {
    const special: Record<string, number> = {
      [nr('clone3')]: ERRNO(ENOSYS),
      [nr('socket')]: ERRNO(EPERM), // AF_UNSPEC
      [nr('socketpair')]: ERRNO(EPERM),
    };
    for (const name of DENIED_SYSCALLS) special[nr(name)] = ERRNO(EPERM);
    for (const name of UNAVAILABLE_SYSCALLS) special[nr(name)] = ERRNO(ENOSYS);
    for (let n = 0; n < 1024; n++) {
      const want = n > 469 ? ERRNO(ENOSYS) : (special[n] ?? ALLOW);
      expect(run(prog, seccompData(n, [0])), `nr ${n}`).toBe(want);
    }
  });

  it('answers each syscall of the review with its errno, whatever the arguments', () => {
    for (const [name, n, errno] of REVIEWED) {
      expect(X86_64_SYSCALLS[name], name).toBe(n);
      for (const args of [[], [0, 0, 0, 0, 0, 0], [-1, -1, -1, -1, -1, -1], [2, CLONE_NEWNS, 0x80000, 1]]) {
        expect(run(prog, seccompData(n, args)), `${name} ${args.join(',')}`).toBe(ERRNO(errno));
      }
    }
    for (const [name, n] of REVIEWED_ALLOWED) expect(run(prog, seccompData(n, [0])), name).toBe(ALLOW);
  });

  it('sends every syscall newer than the review to ENOSYS, and only those', () => {
    expect(HIGHEST_REVIEWED_SYSCALL).toBe(469);
    for (const n of [470, 471, 500, 511, 512, 547, 1000, 0xffff, 0x3fffffff]) {
      expect(run(prog, seccompData(n, [0])), `nr ${n}`).toBe(ERRNO(ENOSYS));
    }
    // The top of the unsigned range too (a negative nr as the kernel sees it: no syscall).
    expect(run(prog, seccompData(0xffffffff, [0]))).toBe(ERRNO(EPERM)); // x32 bit set: x32 rule first
    expect(run(prog, seccompData(469, [0]))).toBe(ALLOW);
    // An extra denial above the reviewed range keeps its EPERM.
    expect(run(buildSeccompFilter({ extraDeniedSyscalls: [600] }), seccompData(600))).toBe(ERRNO(EPERM));
    // ...and an extra denial of an unavailable one turns it into EPERM.
    expect(run(buildSeccompFilter({ extraDeniedSyscalls: ['statmount'] }), seccompData(457))).toBe(
      ERRNO(EPERM),
    );
  });

  it('honours extraDeniedSyscalls, before the argument filters', () => {
    const p = buildSeccompFilter({ extraDeniedSyscalls: [161, 'socket'] });
    expect(run(p, seccompData(161))).toBe(ERRNO(EPERM));
    expect(run(p, seccompData(nr('socket'), [2, 1, 0]))).toBe(ERRNO(EPERM));
    expect(run(p, seccompData(nr('socketpair'), [1, 1, 0]))).toBe(ALLOW);
    expect(run(p, seccompData(39))).toBe(ALLOW);
  });

  it('rejects unknown extra syscalls with a typed error', () => {
    for (const bad of ['no_such_syscall', 'toString', -1, 0x40000000, 1.5]) {
      let caught: unknown;
      try {
        buildSeccompFilter({ extraDeniedSyscalls: [bad] });
      } catch (e) {
        caught = e;
      }
      expect(AirlockError.is(caught, 'INVALID_ARGUMENT'), String(bad)).toBe(true);
    }
  });
});

// ---------------------------------------------------------------------------------------------------
// Cross-check the syscall numbers against the system headers, when a C compiler is available.
// ---------------------------------------------------------------------------------------------------

const hasGcc = spawnSync('gcc', ['--version'], { stdio: 'ignore' }).status === 0;

describe('seccomp filter: syscall numbers', () => {
  it.skipIf(!hasGcc)(`match <sys/syscall.h>${hasGcc ? '' : ' (skipped: gcc not found)'}`, () => {
    const names = Object.keys(X86_64_SYSCALLS);
    const src = ['#include <sys/syscall.h>', ...names.map((n) => `${n} SYS_${n}`)].join('\n');
    const r = spawnSync('gcc', ['-E', '-P', '-'], { input: src, encoding: 'utf8' });
    expect(r.status).toBe(0);
    const fromHeaders = new Map<string, number>();
    for (const line of r.stdout.split('\n')) {
      const m = /^(\w+) (\d+)$/.exec(line.trim());
      if (m?.[1] && m[2]) fromHeaders.set(m[1], Number(m[2]));
    }
    // Headers older than the kernel lack the newest names: those must be newer than all they know
    // (the real-kernel test below shows the kernel implements each).
    const newestKnown = Math.max(...fromHeaders.values());
    for (const name of names) {
      const fromHeader = fromHeaders.get(name);
      if (fromHeader !== undefined) expect(fromHeader, name).toBe(X86_64_SYSCALLS[name]);
      else expect(X86_64_SYSCALLS[name], `${name} (not in these headers)`).toBeGreaterThan(newestKnown);
    }
  });
});

// ---------------------------------------------------------------------------------------------------
// The real thing: install the filter with bwrap and make the syscalls from perl.
// ---------------------------------------------------------------------------------------------------

function findOnPath(cmd: string): string | undefined {
  for (const dir of (process.env['PATH'] ?? '').split(delimiter)) {
    if (!dir) continue;
    const p = join(dir, cmd);
    try {
      accessSync(p, constants.X_OK);
      return p;
    } catch {
      // keep looking
    }
  }
  return undefined;
}

const bwrap = findOnPath('bwrap');
const isRoot = process.getuid?.() === 0;
const hasPerl = findOnPath('perl') !== undefined;
const skipReason = [
  bwrap === undefined ? 'bwrap not on PATH' : '',
  isRoot ? '' : 'not root (the test drops to uid 300999 itself)',
  hasPerl ? '' : 'perl not on PATH',
]
  .filter(Boolean)
  .join(', ');
const canRun = skipReason === '';

// For each "name,nr,arg..." in @ARGV: make the syscall, print "name ret errno".
const PERL_SCRIPT = `
for my $spec (@ARGV) {
  my ($name, $nr, @args) = split /,/, $spec;
  $! = 0;
  my $r = syscall($nr + 0, map { $_ + 0 } @args);
  print "$name $r ", ($r == -1 ? $! + 0 : 0), "\\n";
}
`;

interface Outcome {
  ret: number;
  errno: number;
}

async function runUnderBwrap(
  bwrapPath: string,
  /** undefined: no filter (a control run: what the kernel itself answers). */
  filter: Buffer | undefined,
  specs: readonly string[],
): Promise<Map<string, Outcome>> {
  // prettier-ignore
  const args = [
    '--unshare-all', '--unshare-user', '--disable-userns', '--die-with-parent',
    '--ro-bind', '/usr', '/usr',
    '--symlink', 'usr/bin', '/bin', '--symlink', 'usr/lib', '/lib', '--symlink', 'usr/lib64', '/lib64',
    '--proc', '/proc', '--dev', '/dev',
    ...(filter ? ['--seccomp', '3'] : []),
    '--', 'perl', '-e', PERL_SCRIPT, ...specs,
  ];
  const child = spawn(bwrapPath, args, {
    uid: 300999,
    gid: 300999,
    env: {},
    cwd: '/',
    stdio: ['ignore', 'pipe', 'pipe', 'pipe'],
  });
  const fd3 = child.stdio[3] as Writable;
  fd3.on('error', () => {
    // bwrap failing early closes its end; the exit code and stderr below report why.
  });
  fd3.end(filter ?? Buffer.alloc(0));

  let stdout = '';
  let stderr = '';
  child.stdout?.setEncoding('utf8').on('data', (s: string) => (stdout += s));
  child.stderr?.setEncoding('utf8').on('data', (s: string) => (stderr += s));
  const code = await new Promise<number | null>((resolve, reject) => {
    child.on('error', reject);
    child.on('close', (c) => resolve(c));
  });
  expect({ code, stderr }).toEqual({ code: 0, stderr: '' });

  const results = new Map<string, Outcome>();
  for (const line of stdout.split('\n')) {
    const [name, ret, errno] = line.split(' ');
    if (name && ret !== undefined && errno !== undefined) {
      results.set(name, { ret: Number(ret), errno: Number(errno) });
    }
  }
  return results;
}

describe('seccomp filter: real kernel via bwrap', () => {
  it.skipIf(!canRun)(`enforces the policy${canRun ? '' : ` (skipped: ${skipReason})`}`, async () => {
    const zeros = ',0,0,0,0,0,0';
    const specs = [
      ...DENIED_SYSCALLS.map((name) => `${name},${nr(name)}${zeros}`),
      `getpid,39`,
      `x32_getpid,${0x40000000 | 39}`,
      `socket_netlink,${nr('socket')},16,3,0`,
      `socket_inet,${nr('socket')},2,1,0`,
      `socketpair_unix,${nr('socketpair')},1,1,0,0`, // NULL sv: EFAULT from the kernel, not EPERM
      `unshare_newuser,${nr('unshare')},${CLONE_NEWUSER}`,
      `unshare_none,${nr('unshare')},0`,
      `clone3,${nr('clone3')},0,0`,
      `personality_query,${nr('personality')},${0xffffffff}`,
      `personality_rie,${nr('personality')},${0x0400000}`,
    ];
    const r = await runUnderBwrap(bwrap as string, buildSeccompFilter(), specs);

    for (const name of DENIED_SYSCALLS) expect(r.get(name), name).toEqual({ ret: -1, errno: EPERM });
    expect(r.get('getpid')?.ret).toBeGreaterThan(0);
    expect(r.get('x32_getpid')).toEqual({ ret: -1, errno: EPERM });
    expect(r.get('socket_netlink')).toEqual({ ret: -1, errno: EPERM });
    expect(r.get('socket_inet')?.ret).toBeGreaterThanOrEqual(0);
    expect(r.get('socketpair_unix')).toEqual({ ret: -1, errno: 14 }); // EFAULT: reached the kernel
    // Without the filter --disable-userns would give ENOSPC here; EPERM shows the filter answered.
    expect(r.get('unshare_newuser')).toEqual({ ret: -1, errno: EPERM });
    expect(r.get('unshare_none')).toEqual({ ret: 0, errno: 0 });
    expect(r.get('clone3')).toEqual({ ret: -1, errno: ENOSYS });
    expect(r.get('personality_query')?.ret).toBeGreaterThanOrEqual(0);
    expect(r.get('personality_rie')).toEqual({ ret: -1, errno: EPERM });
  });
  it.skipIf(!canRun)(
    `denies each syscall of the review, which this kernel implements, and everything newer${canRun ? '' : ` (skipped: ${skipReason})`}`,
    async () => {
      const zeros = ',0,0,0,0,0,0';
      const FUTURE = [470, 471, 500, 1000, 0x3fffffff];
      const specs = [
        ...REVIEWED.map(([name, n]) => `${name},${n}${zeros}`),
        ...REVIEWED_ALLOWED.filter(([name]) => !name.endsWith('probe')).map(
          ([name, n]) => `${name},${n}${zeros}`,
        ),
        ...FUTURE.map((n) => `future${n},${n}${zeros}`),
      ];
      // Control: without the filter the kernel itself answers (it has each of these syscalls, so not
      // ENOSYS; a config-dependent one is reported, not required).
      const bare = await runUnderBwrap(bwrap as string, undefined, specs);
      const configDependent = new Set([
        'memfd_secret',
        'cachestat',
        'quotactl_fd',
        'modify_ldt',
        'map_shadow_stack',
      ]);
      for (const [name] of REVIEWED) {
        if (configDependent.has(name)) continue;
        expect(bare.get(name)?.errno, `${name} unfiltered`).not.toBe(ENOSYS);
      }
      const filtered = await runUnderBwrap(bwrap as string, buildSeccompFilter(), specs);
      for (const [name, , errno] of REVIEWED) expect(filtered.get(name), name).toEqual({ ret: -1, errno });
      for (const n of FUTURE)
        expect(filtered.get(`future${n}`), `nr ${n}`).toEqual({ ret: -1, errno: ENOSYS });
      // What the review left allowed still reaches the kernel: the same answer as without the filter.
      for (const [name] of REVIEWED_ALLOWED.filter(([x]) => !x.endsWith('probe'))) {
        expect(filtered.get(name), name).toEqual(bare.get(name));
      }
    },
  );
});
