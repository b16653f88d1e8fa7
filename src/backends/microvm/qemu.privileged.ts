// SECURITY-CRITICAL: starting one sandbox's QEMU so that none of it ever runs outside the sandbox's
// cgroup or as root, even if Airlock dies half-way. The gate of the gVisor tier
// (src/backends/gvisor/process.privileged.ts):
//  1. spawn a trampoline (/bin/sh, empty env, cwd /) inside the sandbox's netns (which has no route:
//     QEMU gets no network device anyway) that blocks reading a gate pipe; Airlock's inherited fds
//     are close-on-exec first;
//  2. move it into the sandbox's cgroup (QEMU and its threads inherit it);
//  3. open the gate: it jails itself (JAIL below: a mount and a PID namespace of its own, pivot_root
//     into a read-only root of mount points holding only /usr read-only, the guest's kernel,
//     initramfs and rootfs read-only, the VM's socket dir, /dev/null and /dev/urandom (and /dev/kvm under KVM)), then execs setpriv,
//     which drops to the sandbox's leased uid and gid (no groups, no capabilities, no_new_privs,
//     SIGKILL when its parent dies) and execs QEMU. If Airlock died before, the gate reads EOF and
//     nothing runs.
// QEMU then also applies its own seccomp filter (-sandbox on, see qemu.ts). What a guest escape into
// QEMU lands as: an unprivileged uid in a cgroup, in a netns without routes, PID 1 of a PID namespace
// of its own, with a root that holds no host file but /usr and the VM's own.
import { spawn } from 'node:child_process';
import { closeSync, mkdirSync, openSync, symlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Readable, Writable } from 'node:stream';
import type { ProcessExit } from '../../core/backend.js';
import { AirlockError } from '../../core/errors.js';
import { libc } from '../../core/libc.privileged.js';
import { childExited } from '../host/child-exit.js';

const GATE_FD = 3;
/**
 * The jail, as root in fresh mount and PID namespaces (unshare forks: this runs as the namespace's
 * PID 1 and QEMU becomes it; unshare waits outside and dies with Airlock, taking it along). $1 the
 * jail's mount point (a root-owned skeleton of empty mount points, jailSkeleton below), $2 the jail's
 * fstab (jailFstab below, root-only: the skeleton bound read-only onto itself, then every bind mount
 * into it, read-only ones with ro, all nosuid); the rest is setpriv's command line (setpriv execs the
 * seccomp helper shown at /boot/vmm-seccomp, which installs the filter from fd 6 and execs QEMU).
 * `set -e`: any failure and QEMU never starts (`mount --all` exits non-zero if any entry fails).
 * Each exec here costs a loaded host 10-20 ms before QEMU starts, so the skeleton is made by Airlock
 * (file system calls, no process) and one `mount --all` makes every mount, the read-only root too.
 * After pivot_root there is no /proc, which util-linux's libmount needs: busybox (static) unmounts
 * the old root (its empty mount point stays: the jail's root is read-only).
 */
const JAIL = `set -e
J=$1; T=$2; shift 2
/usr/bin/mount --all --fstab "$T"
cd "$J"
/usr/sbin/pivot_root . .old
cd /
/usr/bin/busybox umount -l /.old
exec /usr/bin/setpriv "$@"`;
const TRAMPOLINE =
  `read -r _ <&${GATE_FD} || exit 125; exec ${GATE_FD}<&-; ` +
  `exec /usr/bin/setpriv --pdeathsig KILL -- /usr/bin/unshare --mount --pid --fork --kill-child ` +
  `--propagation private -- /bin/sh -c '${JAIL}' jail "$@"`;
/** The tail of QEMU's stderr kept to explain a failed boot. */
const STDERR_KEEP = 4000;

export interface QemuStart {
  readonly qemu: string;
  readonly args: readonly string[];
  /** Leased host uid (and gid) QEMU runs as; never 0. */
  readonly uid: number;
  readonly enroll: (pid: number) => Promise<void> | void;
  readonly enterNetns: <T>(f: () => T) => T;
  /** An fd QEMU inherits as its fd 4 (TAP_FD in qemu.ts): the guest's tap. */
  readonly tapFd?: number;
  /** An fd QEMU inherits as its fd 5 (INCOMING_FD in qemu.ts): a snapshot's migration stream. */
  readonly incomingFd?: number;
  /**
   * Airlock's own seccomp filter on QEMU, beside QEMU's `-sandbox`: the helper (guest/vmm-seccomp.c,
   * built by assets.ts) and an fd holding the raw program (seccomp.ts), read by the helper as fd 6.
   */
  readonly seccomp: { readonly helper: string; readonly filterFd: number };
  /** What the jail shows QEMU (at the paths of JAILED in qemu.ts, which `args` must use). */
  readonly jail: {
    /** An empty dir owned by root: the jail's mount point (in QEMU's mount namespace only). */
    readonly dir: string;
    readonly kernel: string;
    readonly initramfs: string;
    readonly rootfs: string;
    /** The VM's dir (agent socket, console log), owned by the sandbox uid. */
    readonly vmDir: string;
    /**
     * A dir on disk, owned by the sandbox uid, where QEMU writes a snapshot's migration stream (the
     * VM dir is on a small shared tmpfs whose pages would count against the sandbox's memory).
     */
    readonly spillDir: string;
    readonly kvm: boolean;
  };
}

export interface QemuProcess {
  readonly pid: number | undefined;
  readonly exited: Promise<ProcessExit>;
  /** SIGKILL QEMU (the whole VM). Idempotent. */
  kill(): void;
  /** The last lines QEMU wrote to stderr. */
  stderr(): string;
}

/**
 * setpriv's options that drop the jail to the sandbox's leased `uid` before QEMU runs (the command
 * follows them): that uid and gid, no supplementary groups, no capabilities (inheritable or bounding),
 * no_new_privs, and SIGKILL when its parent dies. bench/microvm-jail.ts runs a raw QEMU behind them.
 */
export function setprivDrop(uid: number): string[] {
  return [
    `--reuid=${uid}`,
    `--regid=${uid}`,
    '--clear-groups',
    '--inh-caps=-all',
    '--bounding-set=-all',
    '--no-new-privs',
    '--pdeathsig',
    'KILL',
    '--',
  ];
}

export async function startQemu(o: QemuStart): Promise<QemuProcess> {
  if (!Number.isInteger(o.uid) || o.uid <= 0)
    throw new AirlockError('INTERNAL', `refusing to run QEMU as uid ${o.uid}`);
  const setpriv = [...setprivDrop(o.uid), '/boot/vmm-seccomp', o.qemu, ...o.args];
  // The jail shows QEMU the host's /usr and nothing else of it.
  if (!o.qemu.startsWith('/usr/'))
    throw new AirlockError(
      'BACKEND_UNAVAILABLE',
      `QEMU must live under /usr (the jail shows only /usr): ${o.qemu}`,
    );
  const j = o.jail;
  const sources = [j.dir, j.kernel, j.initramfs, j.rootfs, j.vmDir, j.spillDir, o.seccomp.helper];
  if (sources.some((a) => !a.startsWith('/')))
    throw new AirlockError('INTERNAL', `jail paths must be absolute: ${sources.join(' ')}`);
  // Root-only, beside the jail's mount point in the sandbox's (root) dir.
  const fstab = `${j.dir}.fstab`;
  jailSkeleton(j.dir, j.kvm);
  writeFileSync(fstab, jailFstab(j, o.seccomp.helper), { mode: 0o600 });
  const jail = [j.dir, fstab];
  libc().cloexecFrom(3);
  const child = o.enterNetns(() =>
    spawn('/bin/sh', ['-c', TRAMPOLINE, 'trampoline', ...jail, ...setpriv], {
      env: {},
      cwd: '/',
      // fds 4-6 (the tap, the migration stream, the seccomp filter) survive the trampoline and setpriv:
      // neither closes inherited fds.
      stdio: [
        'ignore',
        'ignore',
        'pipe',
        'pipe',
        o.tapFd ?? 'ignore',
        o.incomingFd ?? 'ignore',
        o.seccomp.filterFd,
      ],
    }),
  );
  const gate = (child.stdio as unknown as Array<Readable & Writable>)[GATE_FD]!;
  gate.on('error', () => {});
  let err = '';
  child.stderr!.on('data', (c: Buffer) => void (err = (err + c.toString()).slice(-STDERR_KEEP)));
  let exited = false;
  const exitedP = childExited(child, () => (exited = true));
  // QEMU is our own unreaped child until 'exit', so its pid cannot have been recycled.
  const proc: QemuProcess = {
    pid: child.pid,
    exited: exitedP,
    kill: () => void (exited || child.kill('SIGKILL')),
    stderr: () => err,
  };
  if (child.pid === undefined) return proc;
  try {
    await o.enroll(child.pid);
  } catch (e) {
    child.kill('SIGKILL');
    gate.destroy();
    await exitedP;
    throw new AirlockError(
      'INTERNAL',
      `could not place QEMU in the sandbox's cgroup: ${(e as Error).message}`,
      {
        cause: e,
      },
    );
  }
  gate.end('go\n');
  return proc;
}

/** The jail root's entries: mount points only (dirs, and empty files where a file is bound). */
const SKELETON_DIRS = ['usr', 'boot', 'vm', 'spill', 'dev', '.old'];
const SKELETON_FILES = [
  'boot/vmlinuz',
  'boot/initramfs',
  'boot/rootfs',
  'boot/vmm-seccomp',
  'dev/null',
  'dev/urandom',
];

/**
 * The jail's root in `dir` (root-owned, in the sandbox's root-owned dir, so the sandbox's uid can
 * change none of it; the jail shows it read-only): the mount points jailFstab binds onto, and lib,
 * lib64 → usr/lib, usr/lib64 (the dynamic loader's paths). Idempotent (a second start of a sandbox).
 */
export function jailSkeleton(dir: string, kvm: boolean): void {
  for (const d of SKELETON_DIRS) mkdirSync(join(dir, d), { recursive: true, mode: 0o755 });
  for (const f of [...SKELETON_FILES, ...(kvm ? ['dev/kvm'] : [])])
    closeSync(openSync(join(dir, f), 'a', 0o644));
  for (const l of ['lib', 'lib64'])
    try {
      symlinkSync(`usr/${l}`, join(dir, l));
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'EEXIST') throw e;
    }
}

/**
 * The jail's mounts as an fstab for `mount --all` (util-linux applies `ro` to a bind mount, as
 * `mount --bind -o ro` does), in order: `j.dir` bound onto itself read-only (the skeleton becomes the
 * jail's read-only root, a mount point as pivot_root needs), then under it /usr, the guest's kernel,
 * initramfs and rootfs and the seccomp helper read-only; the VM dir and the spill dir writable but
 * noexec; /dev/null and /dev/urandom read-only (and /dev/kvm under KVM). Paths are octal-escaped
 * (fstab splits on blanks).
 */
export function jailFstab(j: QemuStart['jail'], seccompHelper: string): string {
  const rows: Array<[source: string, at: string, options: string]> = [
    [j.dir, '.', 'ro,nosuid,nodev'],
    ['/usr', 'usr', 'ro,nosuid,nodev'],
    [j.kernel, 'boot/vmlinuz', 'ro,nosuid,nodev'],
    [j.initramfs, 'boot/initramfs', 'ro,nosuid,nodev'],
    [j.rootfs, 'boot/rootfs', 'ro,nosuid,nodev'],
    [seccompHelper, 'boot/vmm-seccomp', 'ro,nosuid,nodev'],
    [j.vmDir, 'vm', 'nosuid,nodev,noexec'],
    [j.spillDir, 'spill', 'nosuid,nodev,noexec'],
    ['/dev/null', 'dev/null', 'ro,nosuid,noexec'],
    ['/dev/urandom', 'dev/urandom', 'ro,nosuid,noexec'],
    ...(j.kvm ? [['/dev/kvm', 'dev/kvm', 'nosuid,noexec'] as [string, string, string]] : []),
  ];
  return rows
    .map(([src, at, opts]) => `${fstabPath(src)} ${fstabPath(join(j.dir, at))} none bind,${opts} 0 0\n`)
    .join('');
}

/** A path as an fstab field: every byte but [A-Za-z0-9/._+,:@=-] as \ooo (libmount unescapes it). */
function fstabPath(p: string): string {
  let out = '';
  for (const b of Buffer.from(p))
    out += /[A-Za-z0-9/._+,:@=-]/.test(String.fromCharCode(b))
      ? String.fromCharCode(b)
      : `\\${b.toString(8).padStart(3, '0')}`;
  return out;
}
