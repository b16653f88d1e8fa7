// SECURITY-CRITICAL: starting one runsc process (run or restore) so that none of it — runsc, its
// gofer, the sentry and the sandboxed process inside — ever runs outside the sandbox's cgroup, even
// if Airlock dies half-way. Same gate as the namespaces tier (src/backends/namespaces/process.ts):
//  1. spawn a trampoline (/bin/sh, empty env, cwd /) that blocks reading a gate pipe; Airlock's own
//     inherited fds are close-on-exec first;
//  2. move it into the sandbox's cgroups (everything it starts inherits them);
//  3. open the gate: it execs runsc. If Airlock died before, the gate reads EOF and nothing runs.
// runsc runs as root (it must set up the sentry's namespaces and chroot); the sandboxed process runs
// as sandbox uid 1000 inside the sentry. SIGKILL to runsc kills its gofer and sentry (they die with
// their parent); the cgroup is the backstop that destroy() empties.
import { spawn } from 'node:child_process';
import type { Readable, Writable } from 'node:stream';
import type { BackendProcess } from '../../core/backend.js';
import { AirlockError } from '../../core/errors.js';
import { libc } from '../../core/libc.privileged.js';
import { childExited } from '../host/child-exit.js';

const GATE_FD = 3;
// setpriv --pdeathsig: runsc gets SIGKILL if Airlock dies (bwrap's --die-with-parent on the other
// tier); its gofer and sentry die with it.
const TRAMPOLINE = `read -r _ <&${GATE_FD} || exit 125; exec ${GATE_FD}<&-; exec /usr/bin/setpriv --pdeathsig KILL -- "$0" "$@"`;

export interface RunscStart {
  readonly runsc: string;
  readonly args: readonly string[];
  readonly stdin: boolean;
  readonly enroll: (pid: number) => void;
  readonly enterNetns: <T>(f: () => T) => T;
}

export async function startRunsc(o: RunscStart): Promise<BackendProcess> {
  libc().cloexecFrom(3);
  const child = o.enterNetns(() =>
    spawn('/bin/sh', ['-c', TRAMPOLINE, o.runsc, ...o.args], {
      env: {},
      cwd: '/',
      stdio: [o.stdin ? 'pipe' : 'ignore', 'pipe', 'pipe', 'pipe'],
    }),
  );
  const gate = (child.stdio as unknown as Array<Readable & Writable>)[GATE_FD]!;
  gate.on('error', () => {});
  let exited = false;
  const exitedP = childExited(child, () => (exited = true));
  // runsc is our own unreaped child until 'exit', so its pid cannot have been recycled.
  const kill = (): void => void (exited || child.kill('SIGKILL'));
  const proc: BackendProcess = {
    stdout: child.stdout!,
    stderr: child.stderr!,
    stdin: child.stdin ?? null,
    exited: exitedP,
    kill,
  };
  if (child.pid === undefined) return proc;
  try {
    o.enroll(child.pid);
  } catch (e) {
    child.kill('SIGKILL');
    gate.destroy();
    await exitedP;
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return { ...proc, stdin: null };
    throw new AirlockError(
      'INTERNAL',
      `could not place runsc in the sandbox's cgroup: ${(e as Error).message}`,
      {
        cause: e,
      },
    );
  }
  gate.end('go\n');
  return proc;
}
