// SECURITY-CRITICAL: starting one sandbox's QEMU so that none of it ever runs outside the sandbox's
// cgroup or as root, even if Airlock dies half-way. The gate of the gVisor tier
// (src/backends/gvisor/process.privileged.ts):
//  1. spawn the jail helper (guest/vmm-jail.c, one static C program, empty env, cwd /) inside
//     the sandbox's netns (which has no route: QEMU's only network device is the sandbox's tap);
//     Airlock's inherited fds are close-on-exec first; it blocks reading a gate pipe;
//  2. move it into the sandbox's cgroup (QEMU and its threads inherit it);
//  3. open the gate: the helper sets SIGKILL on Airlock's death, makes a mount and a PID namespace of
//     its own and forks (the outer waits, and its death SIGKILLs the inner, PID 1 of the namespace,
//     so Airlock's kill() of the outer takes the VM along); the inner pivot_roots into a read-only
//     root of mount points holding only /usr read-only, the guest's kernel, initramfs and rootfs
//     read-only, the VM's socket dir, /dev/null and /dev/urandom (and /dev/kvm under KVM), drops to
//     the sandbox's leased uid and gid (no groups, no capabilities, no_new_privs, SIGKILL when the
//     outer dies) and verifies it, installs Airlock's seccomp filter (fd 6) and execs QEMU. Any
//     failure exits before the exec; if Airlock died before the gate opened, it reads EOF and
//     nothing runs.
// QEMU then also applies its own seccomp filter (-sandbox on, see qemu.ts). What a guest escape into
// QEMU lands as: an unprivileged uid in a cgroup, in a netns without routes, PID 1 of a PID namespace
// of its own, with a root that holds no host file but /usr and the VM's own.
import { spawn } from 'node:child_process';
import { closeSync, mkdirSync, openSync, symlinkSync } from 'node:fs';
import { join } from 'node:path';
import type { Readable, Writable } from 'node:stream';
import type { ProcessExit } from '../../core/backend.js';
import { AirlockError } from '../../core/errors.js';
import { libc } from '../../core/libc.privileged.js';
import { childExited } from '../host/child-exit.js';

const GATE_FD = 3;
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
   * The jail helper (guest/vmm-jail.c, built by assets.ts: namespaces, mounts, uid drop, and
   * Airlock's own seccomp filter on QEMU beside QEMU's `-sandbox`) and an fd holding the filter's raw
   * program (seccomp.ts), read by the helper as fd 6.
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

export async function startQemu(o: QemuStart): Promise<QemuProcess> {
  // The jail shows QEMU the host's /usr and nothing else of it.
  if (!o.qemu.startsWith('/usr/'))
    throw new AirlockError(
      'BACKEND_UNAVAILABLE',
      `QEMU must live under /usr (the jail shows only /usr): ${o.qemu}`,
    );
  const j = o.jail;
  jailSkeleton(j.dir, j.kvm);
  libc().cloexecFrom(3);
  const child = o.enterNetns(() =>
    spawn(o.seccomp.helper, jailArgv(o.uid, j, [o.qemu, ...o.args]), {
      env: {},
      cwd: '/',
      // fds 4-6: the tap, the migration stream, the seccomp filter (the helper reads and closes it).
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
  // The helper's outer process is our own unreaped child until 'exit', so its pid cannot have been
  // recycled; SIGKILL to it kills the inner (QEMU, PID 1 of its namespace) by its parent-death signal.
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
const SKELETON_FILES = ['boot/vmlinuz', 'boot/initramfs', 'boot/rootfs', 'dev/null', 'dev/urandom'];

/**
 * The jail's root in `dir` (root-owned, in the sandbox's root-owned dir, so the sandbox's uid can
 * change none of it; the jail shows it read-only): the mount points jailArgv binds onto, and lib,
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
 * The jail helper's argv (guest/vmm-jail.c: UID ROOT N (SRC DEST FLAGS){N} -- PROGRAM ARGS...):
 * `j.dir` becomes the read-only root (the helper binds it onto itself), and into it, in order, /usr,
 * the guest's kernel, initramfs and rootfs read-only; the VM dir and the spill dir writable but
 * noexec; /dev/null and /dev/urandom read-only (and /dev/kvm under KVM). Every path is absolute (the
 * helper refuses others, and "." or ".." components); argv needs no escaping.
 */
export function jailArgv(uid: number, j: QemuStart['jail'], program: readonly string[]): string[] {
  if (!Number.isInteger(uid) || uid <= 0)
    throw new AirlockError('INTERNAL', `refusing to run QEMU as uid ${uid}`);
  const ro = 'ro,nosuid,nodev';
  const rows: Array<[source: string, at: string, flags: string]> = [
    ['/usr', '/usr', ro],
    [j.kernel, '/boot/vmlinuz', ro],
    [j.initramfs, '/boot/initramfs', ro],
    [j.rootfs, '/boot/rootfs', ro],
    [j.vmDir, '/vm', 'nosuid,nodev,noexec'],
    [j.spillDir, '/spill', 'nosuid,nodev,noexec'],
    ['/dev/null', '/dev/null', 'ro,nosuid,noexec'],
    ['/dev/urandom', '/dev/urandom', 'ro,nosuid,noexec'],
    ...(j.kvm ? [['/dev/kvm', '/dev/kvm', 'nosuid,noexec'] as [string, string, string]] : []),
  ];
  const sources = [j.dir, ...rows.map((r) => r[0])];
  if (sources.some((a) => !a.startsWith('/')))
    throw new AirlockError('INTERNAL', `jail paths must be absolute: ${sources.join(' ')}`);
  return [String(uid), j.dir, String(rows.length), ...rows.flat(), '--', ...program];
}
