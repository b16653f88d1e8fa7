// SECURITY-CRITICAL: starting one sandboxed process so that no instruction of it ever runs outside
// the sandbox's cgroup, even if Airlock dies half-way.
//
//  1. Spawn a tiny trampoline (/bin/sh, as the sandbox's host uid, empty env) that blocks reading a
//     gate pipe. Every fd of Airlock >= 3 is marked close-on-exec first, so nothing Airlock inherited
//     reaches it.
//  2. Move the trampoline into the sandbox's cgroups. Everything it becomes or starts inherits them.
//  3. Open the gate: the trampoline caps RLIMIT_NOFILE and execs bwrap, which reads its options and
//     the seccomp program from pipes, sets up the namespaces and reports the sandbox init's pid.
//     If Airlock died before this point, the gate reads EOF and the trampoline exits: nothing ran.
//  4. Take a pidfd on the (still blocked) init, so kill() can never hit a recycled pid, and release
//     bwrap's --block-fd. If Airlock dies now, the command runs inside its cgroup and the reaper kills it.
import { spawn, type ChildProcess } from 'node:child_process';
import { Readable, type Writable } from 'node:stream';
import type { BackendProcess, ProcessExit } from '../../core/backend.js';
import { AirlockError } from '../../core/errors.js';
import { FD } from './bwrap.js';
import { libc } from './libc.privileged.js';

/** The trampoline's gate fd (after bwrap's own fds 3–6). */
const GATE_FD = 7;
/** RLIMIT_NOFILE inside the sandbox (Node raises its own limit; the sandbox must not inherit that). */
const NOFILE = 4096;
/** How long an exec may hold its stdio open after its process tree is gone (fds handed to others). */
const STDIO_GRACE_MS = 500;
const SIGKILL = 9;

const TRAMPOLINE = `read -r _ <&${GATE_FD} || exit 125; exec ${GATE_FD}<&-; ulimit -n ${NOFILE}; exec "$0" "$@"`;

export interface StartOptions {
  readonly bwrapPath: string;
  readonly hostUid: number;
  readonly options: readonly string[];
  readonly argv: readonly string[];
  readonly seccomp: Buffer;
  readonly stdin: boolean;
  /** Place a process (the trampoline, before it runs anything) in the sandbox's cgroups. */
  readonly enroll: (pid: number) => Promise<void>;
  /** True once the sandbox is being destroyed: the gate then never opens. */
  readonly cancelled?: () => boolean;
  /** Runs the (synchronous) spawn with the calling thread inside the sandbox's netns. */
  readonly enterNetns?: <T>(f: () => T) => T;
}

export async function startSandboxedProcess(o: StartOptions): Promise<BackendProcess> {
  const c = libc();
  const enter = o.enterNetns ?? ((f) => f());
  c.cloexecFrom(3); // fds Airlock inherited from its own parent must never reach a sandbox
  const child = enter(() =>
    spawn('/bin/sh', ['-c', TRAMPOLINE, o.bwrapPath, '--args', String(FD.args), '--', ...o.argv], {
      uid: o.hostUid,
      gid: o.hostUid, // libuv also drops supplementary groups (setgroups(0)) when changing ids
      env: {}, // neither the trampoline nor bwrap gets an environment (no LD_PRELOAD and the like)
      cwd: '/', // not Airlock's own cwd: the shell would export it as PWD, readable in /proc/1/environ
      stdio: [o.stdin ? 'pipe' : 'ignore', 'pipe', 'pipe', 'pipe', 'pipe', 'pipe', 'pipe', 'pipe'],
    }),
  );
  const stdio = child.stdio as unknown as Array<Readable & Writable>;
  const pipes = {
    args: stdio[FD.args]!,
    seccomp: stdio[FD.seccomp]!,
    info: stdio[FD.info]!,
    block: stdio[FD.block]!,
  };
  const gate = stdio[GATE_FD]!;
  for (const p of [...Object.values(pipes), gate]) p.on('error', () => {});

  let pidfd = -1;
  let exited = false;
  const exitedP = childExited(child, () => {
    exited = true;
    if (pidfd >= 0) c.close(pidfd);
    pidfd = -1;
  });

  const kill = (): void => {
    if (exited) return;
    // The init through its pidfd (its whole pid namespace dies with it); before it is known, the
    // trampoline/bwrap monitor, which is our own unreaped child and so cannot be a recycled pid.
    if (pidfd >= 0) c.pidfdSignal(pidfd, SIGKILL);
    else child.kill('SIGKILL');
  };

  if (child.pid === undefined) {
    return {
      stdout: child.stdout!,
      stderr: child.stderr!,
      stdin: child.stdin ?? null,
      exited: exitedP,
      kill,
    };
  }
  // The command never runs (it printed nothing): the trampoline dies at its gate. Fresh empty
  // streams, since the trampoline's may already be destroyed (see childExited).
  const neverRan = async (): Promise<BackendProcess> => {
    child.kill('SIGKILL');
    gate.destroy();
    await exitedP;
    child.stdout?.destroy();
    child.stderr?.destroy();
    const none = (): Readable => Readable.from([]);
    return { stdout: none(), stderr: none(), stdin: null, exited: exitedP, kill };
  };
  try {
    await o.enroll(child.pid);
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    // The sandbox is being destroyed (its cgroup is gone).
    if (code === 'ENOENT' || code === 'ENODEV') return neverRan();
    await neverRan();
    throw new AirlockError(
      'INTERNAL',
      `could not place sandbox process in its cgroup: ${(e as Error).message}`,
      {
        cause: e,
      },
    );
  }
  // Killed while the enrolment was in flight: its final cgroup sweep may already be done, so the
  // gate must stay shut (kill() promises that nothing of the sandbox runs once it resolves).
  if (o.cancelled?.()) return neverRan();
  pipes.args.end(Buffer.from(o.options.map((s) => `${s}\0`).join('')));
  pipes.seccomp.end(o.seccomp);
  gate.end('go\n');

  const initPid = await readInfo(pipes.info, exitedP);
  if (initPid !== undefined && !exited) {
    // The init is blocked on --block-fd, so it is alive and this pid is still its own.
    const fd = c.pidfdOpen(initPid);
    if (fd >= 0) pidfd = fd;
  }
  pipes.block.end('1');
  pipes.info.resume(); // keep draining: bwrap may write more and must never get SIGPIPE

  return { stdout: child.stdout!, stderr: child.stderr!, stdin: child.stdin ?? null, exited: exitedP, kill };
}

/**
 * When a spawned sandbox process is done: after its exit (`onExit` runs then) and after its stdout
 * and stderr close — or STDIO_GRACE_MS later, since a process of another exec it handed them to
 * may hold them open (results and timeouts must still hold). A spawn error is exit 127.
 */
export function childExited(child: ChildProcess, onExit: () => void): Promise<ProcessExit> {
  return new Promise<ProcessExit>((resolve) => {
    child.on('error', () => {
      onExit();
      resolve({ exitCode: 127, signal: null });
    });
    child.on('exit', (code, signal) => {
      onExit();
      const grace = setTimeout(() => {
        child.stdout?.destroy();
        child.stderr?.destroy();
      }, STDIO_GRACE_MS);
      let open = 2;
      const done = (): void => {
        if (--open > 0) return;
        clearTimeout(grace);
        resolve({ exitCode: code, signal });
      };
      for (const s of [child.stdout, child.stderr]) {
        if (!s || s.destroyed || s.readableEnded) done();
        else s.once('close', done);
      }
    });
  });
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
