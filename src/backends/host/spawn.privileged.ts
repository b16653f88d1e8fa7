// SECURITY-CRITICAL (privileged): starting a process without forking Airlock.
//
// Node's child_process forks the whole Node process (copying the page tables of a 200 MB process)
// and blocks the event loop until the child has exec'd: 4–5 ms per sandbox exec on our 2-core host,
// the largest single cost of a one-shot sandbox. glibc's posix_spawn(3) starts the child with
// clone(CLONE_VM|CLONE_VFORK): it borrows our memory until its exec, so nothing is copied.
//
// What the child gets, and nothing else:
//  - the fds asked for, on 0..n-1 (pipes made here, or /dev/null). Every other fd of ours is marked
//    close-on-exec first (close_range), and pipes are made O_CLOEXEC;
//  - every signal at its default and none blocked (Node ignores SIGPIPE; an ignored signal would
//    survive the exec);
//  - cwd /, and the environment given (callers pass none);
//  - the identity asked for (`as`): uid and gid, no supplementary groups. posix_spawn
//    cannot change ids, and exec'ing setpriv first costs a millisecond, so the calling thread (only
//    it: Linux credentials are per thread, and the raw system calls don't broadcast the change to
//    the other threads as glibc's wrappers do) takes that identity around the posix_spawn call and
//    takes root back right after. Its saved uid/gid stay 0, which is what allows that; the child's
//    are set to the new ids by its exec. While it holds the identity the thread runs only the code
//    below (no JS callback, no await). The same is done for `capOpenFiles` (prlimit on another
//    process needs matching ids, or CAP_SYS_RESOURCE, which root here does not have);
//  - the network namespace of the calling thread (see withNetns).
// The child is ours but unknown to libuv (which reaps only the pids it spawned), so `reap()` collects
// its exit status through a pidfd: a pid that is still our unreaped child can't have been recycled.
import { closeSync, writeSync } from 'node:fs';
import { Socket } from 'node:net';
import { constants } from 'node:os';
import type { ProcessExit } from '../../core/backend.js';
import { libc, type CoreLibc } from '../../core/libc.privileged.js';
import { monotonicMs } from '../../core/units.js';

/**
 * What the child finds on one fd: a pipe it reads (we write), a pipe it writes (we read), /dev/null,
 * or a pipe it reads that we fill with one synchronous write (`feed`, see DirectChild.feed).
 */
export type ChildFd = 'read' | 'write' | 'null' | 'feed';

export interface SpawnIdentity {
  readonly uid: number;
  readonly gid: number;
}

export interface DirectChild {
  readonly pid: number;
  /** Our end of each pipe, by the child's fd number (null for /dev/null and feeds). */
  readonly pipes: ReadonlyArray<Socket | null>;
  /**
   * Write `data` to the feed pipe on the child's fd `fd` in one write(2) and close it. The pipe is
   * first made large enough to hold it all (the write then completes at once, even into a pipe
   * nobody reads yet), so the child reads either all of it or (if Airlock dies before this call)
   * nothing: never a prefix.
   */
  feed(fd: number, data: Buffer): void;
  /**
   * Lower the child's RLIMIT_NOFILE (soft and hard) to `nofile`. prlimit on another process needs
   * CAP_SYS_RESOURCE (root here lacks it) or the same ids, so the calling thread takes the child's
   * identity for the call (see the header).
   */
  capOpenFiles(nofile: number): Promise<void>;
  /** Close every feed not yet written (the child reads EOF). */
  closeFeeds(): void;
  /** SIGKILL, unless it has been reaped (a reaped pid may already belong to another process). */
  kill(): void;
  /**
   * The exit status once the child has exited (it is reaped then, and the pidfd closed; later calls
   * return the same status); undefined while it runs.
   */
  reap(): ProcessExit | undefined;
}

const O_CLOEXEC = 0o2000000;
const F_DUPFD_CLOEXEC = 1030;
const F_SETPIPE_SZ = 1031;
const PIPE_BUF = 4096;
const RLIMIT_NOFILE = 7;
const EPERM = 1;
/**
 * capOpenFiles retries while the child's exec has not committed its credentials: on the next
 * event-loop turn for CAP_SPIN_MS, then 1 ms apart, for CAP_WAIT_MS in all.
 */
const CAP_SPIN_MS = 1;
/** reaped(): polls on the next event-loop turn this many times before using timers. */
const REAP_SPINS = 20;
const CAP_WAIT_MS = 2000;
const P_PIDFD = 3;
const WEXITED = 4;
const WNOHANG = 1;
const CLD_EXITED = 1;
const SIGKILL = 9;

const SIGNAL_NAMES = new Map<number, NodeJS.Signals>(
  Object.entries(constants.signals).map(([name, n]) => [n, name as NodeJS.Signals]),
);

function errnoError(call: string, errno: number): NodeJS.ErrnoException {
  const code = Object.entries(constants.errno).find(([, n]) => n === errno)?.[0] ?? `errno ${errno}`;
  const e: NodeJS.ErrnoException = new Error(`${call}: ${code}`);
  e.code = code;
  e.errno = errno;
  return e;
}

/** Children started here and not reaped yet: their exit status is reap()'s to collect. */
const pendingDirect = new Set<number>();

/** Whether `pid` is a child of spawnDirect that reap() has not collected yet. */
export function isPendingDirectChild(pid: number): boolean {
  return pendingDirect.has(pid);
}

/** A close-on-exec copy of `fd` numbered `floor` or above (`fd` is closed). */
function lift(fd: number, floor: number): number {
  const c = libc();
  const high = c.fcntl(fd, F_DUPFD_CLOEXEC, floor);
  const err = c.errno();
  closeSync(fd);
  if (high < 0) throw errnoError('fcntl(F_DUPFD_CLOEXEC)', err);
  return high;
}

/**
 * Start `path` with `argv` and `env`, with fds 0..fds.length-1 as asked. Throws (ENOENT, EACCES …)
 * if it could not be exec'd; nothing is left open then. `via` makes the posix_spawn call itself
 * (another thread: see launcher.privileged.ts); by default this thread does.
 */
export function spawnDirect(
  path: string,
  argv: readonly string[],
  env: readonly string[],
  fds: readonly ChildFd[],
  as?: SpawnIdentity,
  via?: Spawner,
): DirectChild {
  const c = libc();
  // Fds Airlock inherited from its own parent (and any opened without O_CLOEXEC) never reach a child.
  if (c.cloexecFrom(3) !== 0) throw errnoError('close_range(CLOSE_RANGE_CLOEXEC)', c.errno());
  const ours: number[] = [];
  const theirs: number[] = [];
  const opened: number[] = [];
  try {
    const two = Buffer.alloc(8);
    for (const kind of fds) {
      if (kind === 'null') {
        ours.push(-1);
        theirs.push(-1);
        continue;
      }
      if (c.pipe2(two, O_CLOEXEC) !== 0) throw errnoError('pipe2', c.errno());
      const r = two.readInt32LE(0);
      const w = two.readInt32LE(4);
      opened.push(r, w);
      const [mine, child] = kind === 'write' ? [r, w] : [w, r];
      ours.push(mine);
      theirs.push(child);
    }
    // The child's dup2(theirs[i], i) calls must not overwrite an fd a later one still reads from
    // (nor be a no-op that keeps close-on-exec): move any child end below fds.length above it.
    for (let i = 0; i < fds.length; i++) {
      const old = theirs[i]!;
      if (old < 0 || old >= fds.length) continue;
      theirs[i] = lift(old, fds.length);
      opened[opened.indexOf(old)] = theirs[i]!;
    }
    let pid: number;
    try {
      pid = (via ?? localSpawn)({ path, argv, env, fds: theirs, ...(as ? { as } : {}) });
    } catch (e) {
      // An Error with `errno` (posixSpawnAs, withIdentity, the launcher): the same one with the
      // errno's name as its code, e.g. "posix_spawn /usr/bin/bwrap: ENOENT".
      const errno = (e as { errno?: number }).errno;
      throw errno === undefined ? e : errnoError((e as Error).message.replace(/: errno \d+$/, ''), errno);
    }
    pendingDirect.add(pid); // the orphan reaper leaves it to reap() (reaper.privileged.ts)
    for (const fd of theirs) if (fd >= 0) closeSync(fd);
    opened.length = 0; // from here on, our ends belong to their sockets
    // Our unreaped child: the pid is its own until we reap it, so this pidfd is.
    const pidfd = c.pidfdOpen(pid);
    if (pidfd < 0) {
      // Cannot happen for our own live or zombie child; never leave it running unaccounted.
      process.kill(pid, 'SIGKILL');
      pendingDirect.delete(pid); // left to the orphan reaper
      throw errnoError('pidfd_open', c.errno());
    }
    return directChild(pid, pidfd, ours, fds, as);
  } finally {
    for (const fd of opened) closeSync(fd);
  }
}

/** One posix_spawn: what the child finds on fds 0..n-1 (an fd of ours to dup there, or -1: /dev/null). */
export interface SpawnCall {
  readonly path: string;
  readonly argv: readonly string[];
  readonly env: readonly string[];
  readonly fds: readonly number[];
  readonly as?: SpawnIdentity;
}

/** Makes the posix_spawn call of spawnDirect; returns the pid, or throws an Error with `errno`. */
export type Spawner = (call: SpawnCall) => number;

const spawnCache: { attr?: Buffer } = {};

function localSpawn(call: SpawnCall): number {
  return posixSpawnAs(libc(), call, spawnCache, exitHalfPrivileged);
}

function exitHalfPrivileged(why: string): never {
  process.stderr.write(`airlock: ${why}; exiting\n`);
  process.exit(70);
}

/**
 * Run `f` with the calling thread's credentials set to `as` (see the header), then take root back.
 * If root cannot be taken back the process must not go on half-privileged: it exits.
 */
function asIdentity<T>(as: SpawnIdentity, f: () => T): T {
  return withIdentity(libc(), as, f, exitHalfPrivileged);
}

// The two functions below take their libc as an argument: the launcher's worker thread runs them with
// its own binding (launcher-worker.privileged.ts).

/**
 * posix_spawn `call` on the calling thread: every signal default and none blocked, cwd /, fds as
 * asked, as `call.as` if given (withIdentity). Returns the pid; throws an Error with `errno`.
 * `cache.attr` keeps the spawn attributes once made. `fatal` ends the process (see withIdentity).
 */
export function posixSpawnAs(
  c: CoreLibc,
  call: SpawnCall,
  cache: { attr?: Buffer },
  fatal: (why: string) => never,
): number {
  const O_RDWR = 2;
  const POSIX_SPAWN_SETSIGDEF = 0x04;
  const POSIX_SPAWN_SETSIGMASK = 0x08;
  const fail = (what: string, errno: number): never => {
    throw Object.assign(new Error(`${what}: errno ${errno}`), { errno });
  };
  if (!cache.attr) {
    const a = Buffer.alloc(512); // sizeof(posix_spawnattr_t) is 336 on x86_64 glibc
    const all = Buffer.alloc(128);
    const none = Buffer.alloc(128);
    if (c.sigfillset(all) !== 0) throw new Error('sigfillset failed');
    // glibc's sigfillset leaves out its two internal signals (32, 33), and its posix_spawn then sets
    // them to SIG_IGN in the child, which exec keeps. Add them as bits: every signal starts default.
    for (const sig of [32, 33]) all[(sig - 1) >> 3]! |= 1 << ((sig - 1) & 7);
    if (
      c.spawnAttrInit(a) !== 0 ||
      c.sigemptyset(none) !== 0 ||
      c.spawnAttrSetSigDefault(a, all) !== 0 ||
      c.spawnAttrSetSigMask(a, none) !== 0 ||
      c.spawnAttrSetFlags(a, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK) !== 0
    )
      throw new Error('posix_spawnattr setup failed');
    cache.attr = a;
  }
  const fa = Buffer.alloc(256); // sizeof(posix_spawn_file_actions_t) is 80
  if (c.spawnFileActionsInit(fa) !== 0) throw new Error('posix_spawn_file_actions_init failed');
  try {
    for (let i = 0; i < call.fds.length; i++) {
      const fd = call.fds[i]!;
      const rc =
        fd < 0
          ? c.spawnFileActionsAddOpen(fa, i, '/dev/null', O_RDWR, 0)
          : c.spawnFileActionsAddDup2(fa, fd, i);
      if (rc !== 0) fail('posix_spawn_file_actions', rc);
    }
    if (c.spawnFileActionsAddChdir(fa, '/') !== 0)
      throw new Error('posix_spawn_file_actions_addchdir_np failed');
    const pidOut = [0];
    const spawn = (): number => {
      const rc = c.posixSpawn(pidOut, call.path, fa, cache.attr!, [...call.argv, null], [...call.env, null]);
      if (rc !== 0) fail(`posix_spawn ${call.path}`, rc);
      return pidOut[0]!;
    };
    return call.as ? withIdentity(c, call.as, spawn, fatal) : spawn();
  } finally {
    c.spawnFileActionsDestroy(fa);
  }
}

/**
 * Run `f` with the calling thread's credentials set to `as` (see the header), then take root back.
 * If root cannot be taken back the process must not go on half-privileged: `fatal` ends it.
 */
export function withIdentity<T>(
  c: CoreLibc,
  as: SpawnIdentity,
  f: () => T,
  fatal: (why: string) => never,
): T {
  const PR_GET_PDEATHSIG = 2;
  const PR_GET_DUMPABLE = 3;
  const PR_SET_DUMPABLE = 4;
  const PR_SET_PDEATHSIG = 1;
  const fail = (what: string): never => {
    const errno = c.errno();
    throw Object.assign(new Error(`${what}: errno ${errno}`), { errno });
  };
  // The thread's exact supplementary groups (process.getgroups() would add the egid to them).
  const n = c.getgroups(0, null);
  if (n < 0) fail('getgroups');
  const groups = Buffer.alloc(4 * Math.max(1, n));
  if (c.getgroups(n, groups) !== n) fail('getgroups');
  const dumpable = c.prctl(PR_GET_DUMPABLE, 0);
  const pdeathsig = c.prctlGetInt(PR_GET_PDEATHSIG);
  // Order matters: groups and gid while still root, the uid last (then no capability is left).
  if (c.threadSetgroups(0, null) !== 0) fail('setgroups');
  try {
    if (c.threadSetresgid(as.gid, as.gid, 0) !== 0) fail('setresgid');
    if (c.threadSetresuid(as.uid, as.uid, 0) !== 0) fail('setresuid');
    return f();
  } finally {
    // Root back: the saved uid 0 allows the first call, which restores the capabilities.
    const ok =
      c.threadSetresuid(0, 0, 0) === 0 &&
      c.threadSetresgid(0, 0, 0) === 0 &&
      c.threadSetgroups(n, n > 0 ? groups : null) === 0;
    if (!ok) fatal(`could not restore root credentials (errno ${c.errno()})`);
    // A change of effective ids resets these process/thread attributes; put them back.
    if (dumpable >= 0) c.prctl(PR_SET_DUMPABLE, dumpable);
    if (pdeathsig > 0) c.prctl(PR_SET_PDEATHSIG, pdeathsig);
  }
}

function directChild(
  pid: number,
  pidfd: number,
  ours: number[],
  fds: readonly ChildFd[],
  as: SpawnIdentity | undefined,
): DirectChild {
  const c = libc();
  const pipes = ours.map((fd, i) =>
    fd < 0 || fds[i] === 'feed'
      ? null
      : new Socket({ fd, readable: fds[i] === 'write', writable: fds[i] === 'read' }),
  );
  const feeds = ours.map((fd, i) => (fds[i] === 'feed' ? fd : -1));
  let fd = pidfd;
  let reaped: ProcessExit | undefined;
  const info = Buffer.alloc(128); // siginfo_t
  return {
    pid,
    pipes,
    feed: (n, data) => {
      const f = feeds[n]!;
      if (f < 0) throw new Error(`fd ${n} is not an open feed`);
      feeds[n] = -1;
      try {
        // A pipe may be smaller than its usual 64 KiB (a user over pipe-user-pages-soft gets 4 KiB):
        // beyond PIPE_BUF, size it for the data, so the one write below never blocks half-way.
        if (data.length > PIPE_BUF) {
          const size = c.fcntl(f, F_SETPIPE_SZ, data.length);
          if (size < 0) throw errnoError('fcntl(F_SETPIPE_SZ)', c.errno());
          if (size < data.length) throw new Error(`feed of ${data.length} bytes exceeds the pipe (${size})`);
        }
        const n2 = writeSync(f, data);
        if (n2 !== data.length) throw new Error(`short write to a feed pipe (${n2}/${data.length})`);
      } finally {
        closeSync(f);
      }
    },
    capOpenFiles: async (nofile) => {
      if (!as) throw new Error('capOpenFiles needs a child started with an identity');
      const lim = Buffer.alloc(16);
      lim.writeBigUInt64LE(BigInt(nofile), 0);
      lim.writeBigUInt64LE(BigInt(nofile), 8);
      const start = monotonicMs();
      for (;;) {
        const err = asIdentity(as, () => (c.prlimit(pid, RLIMIT_NOFILE, lim, null) === 0 ? 0 : c.errno()));
        if (err === 0) return;
        // EPERM until the child's exec has committed its credentials (saved ids = the new ones):
        // posix_spawn returns a moment before that. Retry on the next event-loop turn at first,
        // then every millisecond.
        const waited = monotonicMs() - start;
        if (err !== EPERM || waited > CAP_WAIT_MS) throw errnoError('prlimit(RLIMIT_NOFILE)', err);
        await new Promise((r) => (waited < CAP_SPIN_MS ? setImmediate(r) : setTimeout(r, 1)));
      }
    },
    closeFeeds: () => {
      for (let i = 0; i < feeds.length; i++) if (feeds[i]! >= 0) closeSync(feeds[i]!);
      feeds.fill(-1);
    },
    kill: () => void (fd >= 0 && c.pidfdSignal(fd, SIGKILL)),
    reap: () => {
      if (reaped) return reaped;
      info.fill(0);
      const r = c.waitid(P_PIDFD, fd, info, WEXITED | WNOHANG);
      // si_pid (offset 16) stays 0 while the child runs.
      if (r === 0 && info.readInt32LE(16) === 0) return undefined;
      c.close(fd);
      fd = -1;
      pendingDirect.delete(pid);
      const code = info.readInt32LE(8); // si_code
      const status = info.readInt32LE(24); // si_status
      reaped =
        r !== 0
          ? { exitCode: null, signal: null } // ECHILD: reaped by someone else
          : code === CLD_EXITED
            ? { exitCode: status, signal: null }
            : { exitCode: null, signal: SIGNAL_NAMES.get(status) ?? 'SIGKILL' };
      return reaped;
    },
  };
}

/**
 * The child's exit status once it has exited (it is reaped then). Polls: on the next event-loop
 * turns first (a child whose exit is already under way, e.g. whose pipes just closed, is reapable
 * within microseconds), then with a growing delay, so a long-lived child never holds the loop.
 */
export async function reaped(child: DirectChild): Promise<ProcessExit> {
  for (let i = 0; ; i++) {
    const x = child.reap();
    if (x) return x;
    await new Promise((r) =>
      i < REAP_SPINS ? setImmediate(r) : setTimeout(r, Math.min(50, i - REAP_SPINS + 1)),
    );
  }
}

/** SIGKILL `child` and collect its exit status (resolves once it is reaped: no zombie is left). */
export function killAndReap(child: DirectChild): Promise<ProcessExit> {
  child.kill();
  return reaped(child);
}
