// SECURITY-CRITICAL (privileged): releasing this process's host state when it exits without close().
//
// A process that ends without `airlock.close()` (process.exit, an uncaught error or unhandled
// rejection, the natural end of a short script, SIGTERM/SIGINT/SIGHUP with no handler of the
// application's) would leave its warm slots and live sandboxes' mounts, cgroup dirs, sandbox dirs
// and uid leases on the host until some later Airlock start reaps them. Node's 'exit' listeners must
// be synchronous, so this is a synchronous sweep of what this very process owns (owner.json names
// its pid and start time): SIGKILL what runs in those cgroups, detach every mount under each
// sandbox dir (read from /proc/self/mountinfo, deepest first), remove the dir only once nothing is
// mounted under it (never recurse into a host dir that is still bound there), rmdir the cgroup dirs
// and drop the uid leases. Fds (netns, launch namespaces, pidfds) close with the process itself.
import { readFileSync, rmSync, rmdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { isMainThread } from 'node:worker_threads';
import { listCgroups, type CgroupLayout } from './cgroups.privileged.js';
import { libc } from '../../core/libc.privileged.js';
import { selfOwner, type Owner, type StateDirs } from './state.js';

const MNT_DETACH = 2;
const UMOUNT_NOFOLLOW = 8;
/** How long the sweep waits for killed processes to leave their cgroup (it blocks the exit). */
const CGROUP_EMPTY_WAIT_MS = 1000;
const EXIT_SIGNALS = ['SIGTERM', 'SIGINT', 'SIGHUP'] as const;

/** By key (one per state dir): many runtimes on one state dir need one sweep. */
const hooks = new Map<string, () => void>();
let installed = false;

/**
 * Run `hook` (synchronous) when the process exits, however it exits short of SIGKILL; a later hook
 * with the same key replaces it. A signal listener is only acted on when it is the only one: an
 * application that handles the signal itself decides when to exit (its exit then runs the hooks).
 */
export function onProcessExit(key: string, hook: () => void): void {
  // A worker thread's 'exit' is the thread's, not the process's: it must not sweep the process.
  if (!isMainThread) return;
  hooks.set(key, hook);
  if (installed) return;
  installed = true;
  process.on('exit', runHooks);
  for (const sig of EXIT_SIGNALS) {
    const onSignal = (): void => {
      if (process.listenerCount(sig) > 1) return; // the application's own handler decides
      runHooks();
      // Die of the signal as the process would have without this listener.
      process.removeListener(sig, onSignal);
      process.kill(process.pid, sig);
    };
    process.on(sig, onSignal);
  }
}

function runHooks(): void {
  const all = [...hooks.values()];
  hooks.clear();
  for (const h of all) {
    try {
      h();
    } catch {
      /* best effort: the next Airlock start reaps what is left */
    }
  }
}

function sameOwner(a: Owner | undefined, b: Owner): boolean {
  return a !== undefined && a.pid === b.pid && a.startTicks === b.startTicks;
}

/** Mount points under `dir` (this process's view), deepest first. */
function mountsUnder(dir: string): string[] {
  const out: string[] = [];
  for (const line of readFileSync('/proc/self/mountinfo', 'utf8').split('\n')) {
    const target = line.split(' ')[4];
    if (target && target.startsWith(dir + '/')) out.push(target.replace(/\\040/g, ' '));
  }
  return out.sort((a, b) => b.length - a.length);
}

function pidsOf(cgroupDir: string): number[] {
  try {
    return readFileSync(join(cgroupDir, 'cgroup.procs'), 'utf8').split('\n').filter(Boolean).map(Number);
  } catch {
    return [];
  }
}

function sleepSync(ms: number): void {
  Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ms);
}

/**
 * Release, synchronously, every sandbox (warm slot or live) of `dirs` that this process owns.
 * Returns how many sandbox dirs were removed.
 */
export function releaseOwnedSync(dirs: StateDirs, layout: CgroupLayout, cgPrefix: string): number {
  const me = selfOwner();
  const c = libc();
  const cgroups = listCgroups(layout, cgPrefix);
  const mine: Array<{ id: string; dir: string; uid?: number }> = [];
  for (const id of dirs.listSandboxIds()) {
    const dir = dirs.sandboxDir(id);
    try {
      const meta = JSON.parse(readFileSync(join(dir, 'owner.json'), 'utf8')) as {
        uid?: number;
        owner?: Owner;
      };
      if (sameOwner(meta.owner, me))
        mine.push({ id, dir, ...(meta.uid !== undefined ? { uid: meta.uid } : {}) });
    } catch {
      /* not ours, or being written by another process */
    }
  }
  // 1. Nothing of these sandboxes runs on (their processes pin mounts and cgroups).
  const cgDirs = mine.flatMap((s) => cgroups.get(s.id) ?? []);
  for (const d of cgDirs) {
    // cgroup v2: cgroup.kill kills the whole cgroup at once where the kernel has it.
    if (layout.version === 2) {
      try {
        writeFileSync(join(d, 'cgroup.kill'), '1');
      } catch {
        /* no cgroup.kill (older kernel) or gone: the pids are SIGKILLed below */
      }
    }
    for (const p of pidsOf(d)) {
      try {
        process.kill(p, 'SIGKILL');
      } catch {
        /* gone */
      }
    }
  }
  // 2. Mounts, dirs, leases.
  let removed = 0;
  for (const s of mine) {
    for (const m of mountsUnder(s.dir)) c.umount2(m, MNT_DETACH | UMOUNT_NOFOLLOW);
    if (mountsUnder(s.dir).length === 0) {
      try {
        rmSync(s.dir, { recursive: true, force: true });
        removed++;
      } catch {
        /* left for the reaper */
      }
    }
  }
  // 3. Cgroup dirs, once their killed processes have left them.
  const deadline = Date.now() + CGROUP_EMPTY_WAIT_MS;
  let left = cgDirs;
  while (left.length) {
    left = left.filter((d) => {
      try {
        rmdirSync(d);
        return false;
      } catch (e) {
        const code = (e as NodeJS.ErrnoException).code;
        if (code === 'ENOENT') return false;
        for (const p of pidsOf(d)) {
          try {
            process.kill(p, 'SIGKILL');
          } catch {
            /* gone */
          }
        }
        return true;
      }
    });
    if (!left.length || Date.now() > deadline) break;
    sleepSync(2);
  }
  // 4. Uid leases of ours (also any whose sandbox dir never got its owner.json), and lease temp files.
  dirs.pruneLeaseTemps(me);
  for (const l of dirs.listLeases()) {
    if (!sameOwner(l.owner, me)) continue;
    try {
      rmSync(join(dirs.leases, String(l.uid)), { force: true });
    } catch {
      /* left for the reaper */
    }
  }
  return removed;
}
