// SECURITY-CRITICAL (privileged): no zombie of a sandbox is left for the host's init to reap.
//
// A sandbox's processes can outlive the process Airlock started: bwrap's pid 1 when its monitor is
// killed first (a cgroup kill hits both), runsc's gofer and sentry when runsc is killed, anything a
// sandboxed tool double-forks outside a pid namespace. Orphans go to the nearest child subreaper, or
// to init — and when Airlock itself is PID 1 in a container, init is Airlock, which (being Node)
// never reaps a child it does not know. So Airlock becomes a child subreaper (PR_SET_CHILD_SUBREAPER;
// as PID 1 it is the reaper anyway) and reaps the orphans it adopts.
//
// It must never reap a child someone else waits for: libuv waits for the pids of child_process
// (waitpid on each of its own pids) and spawn.privileged.ts for its own (waitid on a pidfd); reaping
// one of those first would lose its exit status. So on each SIGCHLD (and now and then) it lists the
// zombie children of the main thread (/proc/<pid>/task/<pid>/children: an orphan is adopted by the
// main thread; a child a worker thread spawned has that thread as parent and is never touched) and
// reaps, by pid, only those that are neither a pending child of spawnDirect nor a live child_process
// of this thread (known through the 'child_process' diagnostics channel). A zombie's pid cannot be
// reused until it is reaped, so the waitid(P_PID) below collects exactly the process looked at.
import { subscribe } from 'node:diagnostics_channel';
import { ChildProcess } from 'node:child_process';
import { readFileSync, readdirSync } from 'node:fs';
import { isMainThread } from 'node:worker_threads';
import { libc } from '../../core/libc.privileged.js';
import { isPendingDirectChild } from './spawn.privileged.js';

const PR_SET_CHILD_SUBREAPER = 36;
const P_PID = 1;
const WEXITED = 4;
const WNOHANG = 1;
/** A backstop scan this often, should a SIGCHLD be missed (coalesced signals are not: a scan sees all). */
const SCAN_INTERVAL_MS = 5_000;

/** child_process children of this thread that libuv has not reaped yet. */
const libuvChildren = new Set<ChildProcess>();
let started: { subreaper: boolean } | undefined;
let reapedCount = 0;

/**
 * Make this process a child subreaper and reap the orphans it adopts from now on (idempotent).
 * Returns whether the subreaper flag is set (false where the kernel refused it: then only PID 1
 * adopts orphans, and they are still reaped here).
 */
export function startChildReaper(): { subreaper: boolean } {
  if (started) return started;
  // Signals reach the main thread only; the process's children are its business (see the header).
  if (!isMainThread) return { subreaper: false };
  const c = libc();
  started = { subreaper: c.prctl(PR_SET_CHILD_SUBREAPER, 1) === 0 };
  const track = (cp: ChildProcess): void => {
    libuvChildren.add(cp);
    cp.once('exit', () => libuvChildren.delete(cp));
  };
  subscribe('child_process', (m) => {
    const cp = (m as { process?: ChildProcess }).process;
    if (cp) track(cp);
  });
  // child_process children spawned before the reaper started (the channel above never saw them):
  // libuv still waits for each, so they are known too. Node lists them among its active handles (an
  // undocumented but long-stable API; a child whose handle was unref()ed is not listed).
  const handles = (process as unknown as { _getActiveHandles?: () => unknown[] })._getActiveHandles?.();
  for (const h of handles ?? []) if (h instanceof ChildProcess && h.exitCode === null) track(h);
  process.on('SIGCHLD', reapOrphans); // a signal listener keeps no process alive
  setInterval(reapOrphans, SCAN_INTERVAL_MS).unref();
  reapOrphans();
  return started;
}

/** How many adopted orphans this process has reaped (tests and diagnostics). */
export function orphansReaped(): number {
  return reapedCount;
}

/** The main thread's children (pids); falls back to a /proc scan where the kernel lacks the list. */
function children(): number[] {
  try {
    return readFileSync(`/proc/${process.pid}/task/${process.pid}/children`, 'utf8')
      .split(' ')
      .filter((s) => s.trim() !== '')
      .map(Number);
  } catch {
    const out: number[] = [];
    for (const name of readdirSync('/proc')) {
      if (!/^\d+$/.test(name)) continue;
      const f = statFields(Number(name));
      if (f && f.ppid === process.pid) out.push(Number(name));
    }
    return out;
  }
}

function statFields(pid: number): { state: string; ppid: number } | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    // comm (field 2) may hold spaces and parens: split after the last ')'.
    const rest = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return { state: rest[0]!, ppid: Number(rest[1]) };
  } catch {
    return undefined;
  }
}

/** Reap every zombie child that nobody else waits for (see the header). */
function reapOrphans(): void {
  const known = new Set<number>();
  for (const cp of libuvChildren) {
    if (cp.pid === undefined)
      libuvChildren.delete(cp); // its spawn failed: there is no process
    else if (cp.exitCode === null && cp.signalCode === null) known.add(cp.pid);
  }
  const c = libc();
  const info = Buffer.alloc(128); // siginfo_t
  for (const pid of children()) {
    if (known.has(pid) || isPendingDirectChild(pid)) continue;
    if (statFields(pid)?.state !== 'Z') continue;
    if (c.waitid(P_PID, pid, info, WEXITED | WNOHANG) === 0 && info.readInt32LE(16) === pid) reapedCount++;
  }
}
