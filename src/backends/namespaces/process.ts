// SECURITY-CRITICAL: starting one sandboxed process so that no instruction of it ever runs outside
// the sandbox's cgroup, even if Airlock dies half-way.
//
//  1. Start bwrap with posix_spawn (spawn.privileged.ts: Airlock is not forked) as the sandbox's host
//     uid and gid, no supplementary groups, a fixed malloc setting as its only env, and cwd /. Every
//     fd of Airlock >= 3 is close-on-exec first, so nothing Airlock inherited reaches it. bwrap's
//     first act is to read its options from the --args pipe (the gate): it blocks there, before it
//     creates a namespace or a process, and before anything of the sandbox exists.
//  2. Move bwrap into the sandbox's cgroups (everything it starts inherits them) and cap its
//     RLIMIT_NOFILE (inherited the same way).
//  3. Open the gate: write the seccomp program, then the options, each in one write that the pipe
//     holds whole (bwrap reads all of them or none, never a prefix). bwrap sets up the namespaces
//     and reports the sandbox init's pid. If Airlock died before this point, bwrap reads no options:
//     its root is then an empty tmpfs where the command cannot even be found, so nothing runs.
//  4. Take a pidfd on the (still blocked) init, so kill() can never hit a recycled pid, and release
//     bwrap's --block-fd. If Airlock dies now, the command runs inside its cgroup and the reaper kills it.
// bwrap's --json-status-fd (which its sandboxed child never inherits) reaches EOF when bwrap exits:
// that is when its exit status is collected.
import { EventEmitter } from 'node:events';
import { Readable, type Writable } from 'node:stream';
import type { BackendProcess } from '../../core/backend.js';
import { AirlockError } from '../../core/errors.js';
import { FD } from './bwrap.js';
import { childExited, type ExitSource } from '../host/child-exit.js';
import { libc } from '../../core/libc.privileged.js';
import { openFileLimit } from '../host/nofile.privileged.js';
import { reaped, spawnDirect, type DirectChild, type Spawner } from '../host/spawn.privileged.js';

/** RLIMIT_NOFILE inside the sandbox (Node raises its own limit; the sandbox must not inherit that). */
const NOFILE = 4096;
const SIGKILL = 9;
/**
 * bwrap parses the host's mount table once per bind, and with 1,000 sandboxes live that table holds
 * 2,000 of their mounts: glibc's malloc then keeps the large freed buffers in the heap of the
 * sandbox's long-lived pid-1 bwrap (its mmap threshold adapts upward), about 0.6 MiB each. A fixed
 * threshold returns them to the kernel on free (measured: 1.25 → 0.6 MiB PSS per sandbox at 2,000
 * host mounts).
 */
const BWRAP_MALLOC =
  'GLIBC_TUNABLES=glibc.malloc.mmap_threshold=16384:glibc.malloc.trim_threshold=0:glibc.malloc.top_pad=0';

export interface StartOptions {
  readonly bwrapPath: string;
  readonly hostUid: number;
  readonly options: readonly string[];
  readonly argv: readonly string[];
  readonly seccomp: Buffer;
  readonly stdin: boolean;
  /** Place a process (bwrap, blocked before it has read its options) in the sandbox's cgroups. */
  readonly enroll: (pid: number) => Promise<void>;
  /** True once the sandbox is being destroyed: the gate then never opens. */
  readonly cancelled?: () => boolean;
  /** Runs the (synchronous) spawn with the calling thread inside the sandbox's netns. */
  readonly enterNetns?: <T>(f: () => T) => T;
  /** Makes the posix_spawn call (in the sandbox's netns itself); see spawnDirect. */
  readonly via?: Spawner;
}

export async function startSandboxedProcess(o: StartOptions): Promise<BackendProcess> {
  const c = libc();
  const enter = o.enterNetns ?? ((f) => f());
  let child: DirectChild;
  try {
    child = enter(() =>
      spawnDirect(
        o.bwrapPath,
        [o.bwrapPath, '--args', String(FD.args), '--', ...o.argv],
        // bwrap gets no environment (no LD_PRELOAD and the like) but a fixed malloc setting; its
        // --clearenv keeps that from the sandboxed command.
        [BWRAP_MALLOC],
        [o.stdin ? 'read' : 'null', 'write', 'write', 'feed', 'feed', 'write', 'read'],
        { uid: o.hostUid, gid: o.hostUid },
        o.via,
      ),
    );
  } catch (e) {
    throw new AirlockError('INTERNAL', `could not start bwrap: ${(e as Error).message}`, { cause: e });
  }
  const stdio = child.pipes as Array<(Readable & Writable) | null>;
  const stdout = stdio[1]!;
  const stderr = stdio[2]!;
  const stdin = stdio[0] ?? null;
  const pipes = { info: stdio[FD.info]!, block: stdio[FD.block]! };
  for (const p of [pipes.info, pipes.block, stdin]) p?.on('error', () => {});
  // Read from the start, so the status pipe always flows to its EOF (which marks the exit).
  const initPidP = readInfo(pipes.info);
  const source = exitWhenClosed(child, pipes.info, stdout, stderr);

  let pidfd = -1;
  let exited = false;
  const exitedP = childExited(source, () => {
    exited = true;
    if (pidfd >= 0) c.close(pidfd);
    pidfd = -1;
  });

  const kill = (): void => {
    if (exited) return;
    // The init through its pidfd (its whole pid namespace dies with it); before it is known, the
    // bwrap monitor, through its pidfd (our own child: see spawnDirect).
    if (pidfd >= 0) c.pidfdSignal(pidfd, SIGKILL);
    else child.kill();
  };

  // The command never runs (it printed nothing): bwrap dies at its gate. Fresh empty streams,
  // since bwrap's may already be destroyed (see childExited).
  const neverRan = async (): Promise<BackendProcess> => {
    child.kill();
    child.closeFeeds();
    await exitedP;
    stdout.destroy();
    stderr.destroy();
    stdin?.destroy();
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
  try {
    // Never above Airlock's own hard limit: raising a hard limit needs CAP_SYS_RESOURCE (EPERM).
    await child.capOpenFiles(Math.min(NOFILE, openFileLimit().hard));
    if (o.cancelled?.()) return neverRan();
    child.feed(FD.seccomp, o.seccomp);
    child.feed(FD.args, Buffer.from(o.options.map((s) => `${s}\0`).join(''))); // the gate opens
  } catch (e) {
    await neverRan();
    throw new AirlockError('INTERNAL', `could not hand bwrap its options: ${(e as Error).message}`, {
      cause: e,
    });
  }

  const initPid = await initPidP;
  if (initPid !== undefined && !exited) {
    // The init is blocked on --block-fd, so it is alive and this pid is still its own.
    const fd = c.pidfdOpen(initPid);
    if (fd >= 0) pidfd = fd;
  }
  pipes.block.end('1');

  return { stdout, stderr, stdin, exited: exitedP, kill };
}

/**
 * An 'exit' event for a child started by spawnDirect: once `status` (a pipe only that process
 * holds) reaches EOF, the process is exiting; its status is collected then (retried briefly: EOF
 * comes when its fds are closed, a moment before it becomes a zombie).
 */
function exitWhenClosed(
  child: DirectChild,
  status: Readable,
  stdout: Readable,
  stderr: Readable,
): ExitSource {
  const ev = new EventEmitter();
  status.once('close', () => void reaped(child).then((x) => ev.emit('exit', x.exitCode, x.signal)));
  return { stdout, stderr, on: ev.on.bind(ev) } as unknown as ExitSource;
}

/**
 * Read the sandbox init's pid from bwrap's status JSON ({"child-pid": N, ...}); undefined if bwrap
 * exits first. The pipe keeps being drained after that (bwrap writes the exit code too, and must
 * never get SIGPIPE).
 */
function readInfo(pipe: Readable): Promise<number | undefined> {
  return new Promise((resolve) => {
    let buf = '';
    let found = false;
    pipe.on('data', (d: Buffer) => {
      if (found) return;
      buf += d.toString('utf8');
      const m = /"child-pid"\s*:\s*(\d+)/.exec(buf);
      if (!m) return;
      found = true;
      resolve(Number(m[1]));
    });
    pipe.on('close', () => resolve(undefined));
  });
}
