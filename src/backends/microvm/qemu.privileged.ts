// SECURITY-CRITICAL: starting one sandbox's QEMU so that none of it ever runs outside the sandbox's
// cgroup or as root, even if Airlock dies half-way. The gate of the gVisor tier
// (src/backends/gvisor/process.privileged.ts):
//  1. spawn a trampoline (/bin/sh, empty env, cwd /) inside the sandbox's netns (which has no route:
//     QEMU gets no network device anyway) that blocks reading a gate pipe; Airlock's inherited fds
//     are close-on-exec first;
//  2. move it into the sandbox's cgroup (QEMU and its threads inherit it);
//  3. open the gate: it execs setpriv, which drops to the sandbox's leased uid and gid (no groups, no
//     capabilities, no_new_privs, SIGKILL when Airlock dies) and execs QEMU. If Airlock died before,
//     the gate reads EOF and nothing runs.
// QEMU then also applies its own seccomp filter (-sandbox on, see qemu.ts). What a guest escape into
// QEMU lands as: an unprivileged uid in a cgroup, in a netns without routes.
import { spawn } from 'node:child_process';
import type { Readable, Writable } from 'node:stream';
import type { ProcessExit } from '../../core/backend.js';
import { AirlockError } from '../../core/errors.js';
import { libc } from '../../core/libc.privileged.js';
import { childExited } from '../host/child-exit.js';

const GATE_FD = 3;
const TRAMPOLINE = `read -r _ <&${GATE_FD} || exit 125; exec ${GATE_FD}<&-; exec /usr/bin/setpriv "$@"`;
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
  if (!Number.isInteger(o.uid) || o.uid <= 0)
    throw new AirlockError('INTERNAL', `refusing to run QEMU as uid ${o.uid}`);
  const setpriv = [
    `--reuid=${o.uid}`,
    `--regid=${o.uid}`,
    '--clear-groups',
    '--inh-caps=-all',
    '--bounding-set=-all',
    '--no-new-privs',
    '--pdeathsig',
    'KILL',
    '--',
    o.qemu,
    ...o.args,
  ];
  libc().cloexecFrom(3);
  const child = o.enterNetns(() =>
    spawn('/bin/sh', ['-c', TRAMPOLINE, 'setpriv', ...setpriv], {
      env: {},
      cwd: '/',
      // fd 4 (the tap, if any) survives the trampoline and setpriv: neither closes inherited fds.
      stdio: ['ignore', 'ignore', 'pipe', 'pipe', ...(o.tapFd !== undefined ? [o.tapFd] : [])],
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
