// Starting one sandboxed process: spawn bwrap as the sandbox's host uid, hand it its options and the
// seccomp program on pipes, learn the sandbox's pid-1 from --info-fd, move both into the sandbox's
// cgroups, and only then release it (--block-fd) so that nothing the command does runs unaccounted.
import { spawn } from 'node:child_process';
import type { Readable, Writable } from 'node:stream';
import type { BackendProcess, ProcessExit } from '../../core/backend.js';
import { AirlockError } from '../../core/errors.js';
import { FD } from './bwrap.js';

export interface StartOptions {
  readonly bwrapPath: string;
  readonly hostUid: number;
  readonly options: readonly string[];
  readonly argv: readonly string[];
  readonly seccomp: Buffer;
  readonly stdin: boolean;
  /**
   * Called with the sandbox init's host pid (its pid 1) before the command is released; everything the
   * command starts descends from it. bwrap's outer monitor is Airlock's helper and stays outside.
   */
  readonly enroll: (pids: readonly number[]) => void;
  /** Runs the (synchronous) spawn with the calling thread inside the sandbox's netns. */
  readonly enterNetns?: <T>(f: () => T) => T;
}

export async function startSandboxedProcess(o: StartOptions): Promise<BackendProcess> {
  const enter = o.enterNetns ?? ((f) => f());
  const child = enter(() =>
    spawn(o.bwrapPath, ['--args', String(FD.args), '--', ...o.argv], {
      uid: o.hostUid,
      gid: o.hostUid, // libuv also drops supplementary groups (setgroups(0)) when changing ids
      env: {}, // bwrap itself gets no environment: nothing like LD_PRELOAD can reach it
      stdio: [o.stdin ? 'pipe' : 'ignore', 'pipe', 'pipe', 'pipe', 'pipe', 'pipe', 'pipe'],
      detached: false,
    }),
  );
  const stdio = child.stdio as unknown as Array<Readable & Writable>;
  const argsPipe = stdio[FD.args]!;
  const seccompPipe = stdio[FD.seccomp]!;
  const infoPipe = stdio[FD.info]!;
  const blockPipe = stdio[FD.block]!;
  for (const p of [argsPipe, seccompPipe, infoPipe, blockPipe]) p.on('error', () => {});

  let initPid: number | undefined;
  let exited = false;
  const exitedP = new Promise<ProcessExit>((resolve) => {
    child.on('error', () => {
      exited = true;
      resolve({ exitCode: 127, signal: null });
    });
    child.on('close', (code, signal) => {
      exited = true;
      resolve({ exitCode: code, signal });
    });
  });

  const kill = (): void => {
    // SIGKILL the sandbox's pid-1: the kernel then kills every process in its pid namespace.
    // Before the init pid is known, killing bwrap suffices (--die-with-parent takes the child along).
    const pid = initPid ?? child.pid;
    if (pid === undefined) return;
    try {
      process.kill(pid, 'SIGKILL');
    } catch {
      /* gone */
    }
  };

  argsPipe.end(Buffer.from(o.options.map((s) => `${s}\0`).join('')));
  seccompPipe.end(o.seccomp);

  const info = await readInfo(infoPipe, exitedP);
  if (info === undefined) {
    // bwrap failed during setup (its message is on stderr); still a process result, not a throw.
    blockPipe.destroy();
  } else {
    initPid = info;
    try {
      o.enroll([initPid]);
      blockPipe.end('1');
    } catch (e) {
      // ESRCH: bwrap's setup failed and it already exited (its reason is on stderr): the caller gets
      // that as the process result. Anything else means the limits cannot be applied: fail closed.
      kill();
      blockPipe.destroy();
      // ENOENT: the sandbox is being destroyed and its cgroup is gone; the command never ran.
      if (!['ESRCH', 'ENOENT'].includes((e as NodeJS.ErrnoException).code ?? '')) {
        await exitedP;
        throw new AirlockError(
          'INTERNAL',
          `could not place sandbox process in its cgroup: ${(e as Error).message}`,
          {
            cause: e,
          },
        );
      }
    }
  }
  infoPipe.resume(); // keep draining: bwrap may write more and must never get SIGPIPE

  return {
    stdout: child.stdout!,
    stderr: child.stderr!,
    stdin: child.stdin ?? null,
    exited: exitedP,
    kill: () => {
      if (!exited) kill();
    },
  };
}

/** Read bwrap's info JSON ({"child-pid": N, ...}); undefined if bwrap exits first. */
function readInfo(pipe: Readable, exited: Promise<ProcessExit>): Promise<number | undefined> {
  return new Promise((resolve) => {
    let buf = '';
    const done = (v: number | undefined): void => {
      pipe.removeAllListeners('data');
      resolve(v);
    };
    pipe.on('data', (d: Buffer) => {
      buf += d.toString('utf8');
      const m = /"child-pid"\s*:\s*(\d+)/.exec(buf);
      if (m) done(Number(m[1]));
    });
    pipe.on('end', () => done(undefined));
    void exited.then(() => done(undefined));
  });
}
