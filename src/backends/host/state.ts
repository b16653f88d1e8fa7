// Host-side bookkeeping for the namespaces tier: where each sandbox's files live, which host uid it
// holds, and which process owns it (so a restarted Airlock can reap what a killed one left behind).
// Leases are files created with O_EXCL, so concurrent Airlock processes never hand out one uid twice.
import {
  chmodSync,
  linkSync,
  mkdirSync,
  readFileSync,
  readdirSync,
  realpathSync,
  rmSync,
  statfsSync,
  writeFileSync,
} from 'node:fs';
import { link, mkdir as mkdirAsync, rm, writeFile as writeFileAsync } from 'node:fs/promises';
import { randomBytes } from 'node:crypto';
import { join } from 'node:path';
import { AirlockError } from '../../core/errors.js';
import {
  ensureDevTree,
  ensureRuntimeTmpfs,
  mkdirUnderRuntimeLock,
  mountinfoPath,
  unmount,
} from './mount.privileged.js';

export interface Owner {
  readonly pid: number;
  /** Kernel start time of `pid` (field 22 of /proc/<pid>/stat), to survive pid reuse. */
  readonly startTicks: string;
}

export interface UidRange {
  readonly first: number;
  readonly count: number;
}

const TMPFS_MAGIC = 0x01021994;

export const DEFAULT_UID_RANGE: UidRange = { first: 3_000_000, count: 65_536 };

/**
 * Uid leases are host-wide, not per state dir: two Airlock runtimes with different state dirs must
 * never hand the same host uid to two live sandboxes. /run is cleared at boot, as are the processes.
 */
export const DEFAULT_UID_LEASE_DIR = '/run/airlock/uid-leases';

export function processStartTicks(pid: number): string | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    // comm (field 2) may contain spaces and parens: split after the last ')'.
    return stat.slice(stat.lastIndexOf(')') + 2).split(' ')[19];
  } catch {
    return undefined;
  }
}

let self: Owner | undefined;

/** This process as an owner (read once: neither its pid nor its start time changes). */
export function selfOwner(): Owner {
  self ??= { pid: process.pid, startTicks: processStartTicks(process.pid) ?? '0' };
  return self;
}

export function ownerAlive(o: Owner): boolean {
  return processStartTicks(o.pid) === o.startTicks;
}

/**
 * Remove a throwaway state dir with no live sandbox left (e.g. the build's one-shot, see
 * oneShotForCache in src/cli/main.ts): its host mounts (the runtime tmpfs and the /dev tree, which
 * otherwise stay for later runtimes) are detached first. If anything else is still mounted under it,
 * nothing is removed (a recursive delete must never cross into a mount) and the error says what.
 */
export function removeStateDir(dir: string): void {
  // Canonical, and spelled as mountinfo spells it: a symlinked or blank-holding path must not make
  // the check below miss a mount that the recursive delete would then cross.
  const root = realpathSync(dir);
  const dirs = new StateDirs(root);
  unmount(dirs.sandboxes);
  unmount(dirs.dev);
  const at = mountinfoPath(root);
  const left = readFileSync('/proc/self/mountinfo', 'latin1')
    .split('\n')
    .map((line) => line.split(' ')[4])
    .filter((m) => m !== undefined && (m === at || m.startsWith(`${at}/`)));
  if (left.length > 0)
    throw new AirlockError('INTERNAL', `${root} still has mounts (${left.join(', ')}); not removed`);
  rmSync(root, { recursive: true, force: true });
}

export class StateDirs {
  readonly sandboxes: string;
  readonly leases: string;
  readonly spill: string;
  /** The read-only tree every sandbox's /dev is a bind of (see ensureDevTree). */
  readonly dev: string;
  /** The sandboxes dir is on a tmpfs (set by ensure()): its file operations never wait for a disk. */
  runtimeTmpfs = false;

  constructor(
    readonly root: string,
    leaseDir: string = DEFAULT_UID_LEASE_DIR,
  ) {
    this.sandboxes = join(root, 'sandboxes');
    this.leases = leaseDir;
    this.spill = join(root, 'spill');
    this.dev = join(root, 'dev');
  }

  /** Make the dirs; the sandboxes dir on a tmpfs where it can be (see ensureRuntimeTmpfs). */
  ensure(): ReturnType<typeof ensureRuntimeTmpfs> {
    // 0711: sandbox uids may traverse to their own (bind-mounted) dirs but never list others.
    for (const d of [this.root, this.sandboxes]) {
      mkdirSync(d, { recursive: true, mode: 0o711 });
      chmodSync(d, 0o711); // also when it pre-existed or the umask narrowed it
    }
    mkdirSync(this.leases, { recursive: true, mode: 0o700 });
    mkdirSync(this.spill, { recursive: true, mode: 0o700 });
    const r = ensureRuntimeTmpfs(this.sandboxes, this.lockFile());
    this.runtimeTmpfs = r.tmpfs;
    return r;
  }

  /** Mount (or check) the /dev tree; ensure() first. */
  ensureDev(): ReturnType<typeof ensureDevTree> {
    return ensureDevTree(this.dev, this.lockFile());
  }

  private lockFile(): string {
    return join(this.root, '.sandboxes.lock');
  }

  // Files under a sandbox dir: on the runtime tmpfs these never wait for a disk and are done
  // directly (a thread-pool round trip costs more than the operation); on a disk, off the event loop.

  async mkdirIn(path: string, mode: number): Promise<void> {
    if (this.runtimeTmpfs) mkdirSync(path, { mode });
    else await mkdirAsync(path, { mode });
  }

  /** Create `path` with `data`, failing if it exists. */
  async writeNew(path: string, data: string, mode: number): Promise<void> {
    if (this.runtimeTmpfs) writeFileSync(path, data, { mode, flag: 'wx' });
    else await writeFileAsync(path, data, { mode, flag: 'wx' });
  }

  async removeTree(path: string): Promise<void> {
    if (this.runtimeTmpfs) rmSync(path, { recursive: true, force: true });
    else await rm(path, { recursive: true, force: true });
  }

  /** mkdir a new sandbox's dir (on disk: under the lock that ensureRuntimeTmpfs honours). */
  makeSandboxDir(id: string): string {
    const dir = this.sandboxDir(id);
    if (this.runtimeTmpfs) mkdirSync(dir, { mode: 0o711 });
    else this.runtimeTmpfs = mkdirUnderRuntimeLock(dir, this.lockFile(), 0o711);
    return dir;
  }

  sandboxDir(id: string): string {
    return join(this.sandboxes, id);
  }

  /**
   * Take the first free uid in the range; the lease file records the sandbox id and owner. It is
   * written whole to a temp file named after the owner, then linked in place (EEXIST: taken), so a
   * lease is never seen empty, even if this process exits half-way: the temp file names its owner,
   * whose exit sweep or whose reaper removes it (pruneLeaseTemps). The file operations run off the
   * event loop (the lease dir may be on a journaling disk).
   */
  async leaseUid(range: UidRange, sandboxId: string, owner: Owner): Promise<number> {
    // On a tmpfs (/run, the default) each step is done at once: it never waits for a disk, and an
    // exit sweep (exit-release.privileged.ts) then never races with one still in flight.
    const sync = this.leasesOnTmpfs();
    const tmp = join(this.leases, `${leaseTempPrefix(owner)}${randomBytes(6).toString('hex')}.tmp`);
    const content = JSON.stringify({ sandboxId, stateDir: this.root, ...owner });
    const opts = { mode: 0o600, flag: 'wx' } as const;
    if (sync) writeFileSync(tmp, content, opts);
    else await writeFileAsync(tmp, content, opts);
    try {
      // Start at a pseudo-random offset so concurrent processes rarely race on the same file.
      const start = Math.floor(Math.random() * range.count);
      for (let i = 0; i < range.count; i++) {
        const uid = range.first + ((start + i) % range.count);
        const path = join(this.leases, String(uid));
        try {
          if (sync) linkSync(tmp, path);
          else await link(tmp, path);
        } catch (e) {
          if ((e as NodeJS.ErrnoException).code === 'EEXIST') continue;
          throw e;
        }
        return uid;
      }
    } finally {
      if (sync) rmSync(tmp, { force: true });
      else await rm(tmp, { force: true });
    }
    throw new AirlockError(
      'CAPACITY_EXHAUSTED',
      `all ${range.count} sandbox uids from ${range.first} are leased; kill idle sandboxes or widen the uid range`,
    );
  }

  private leasesTmpfs: boolean | undefined;

  private leasesOnTmpfs(): boolean {
    if (this.leasesTmpfs === undefined) {
      try {
        this.leasesTmpfs = statfsSync(this.leases).type === TMPFS_MAGIC;
      } catch {
        this.leasesTmpfs = false;
      }
    }
    return this.leasesTmpfs;
  }

  releaseUid(uid: number): Promise<void> {
    return rm(join(this.leases, String(uid)), { force: true });
  }

  /** Remove lease temp files (see leaseUid) of owners that are gone, or of `owner` (its exit). */
  pruneLeaseTemps(owner?: Owner): void {
    for (const name of safeReaddir(this.leases)) {
      const m = /^\.lease\.(\d+)\.(\d+)\./.exec(name);
      if (!m) continue;
      const of: Owner = { pid: Number(m[1]), startTicks: m[2]! };
      const mine = owner !== undefined && of.pid === owner.pid && of.startTicks === owner.startTicks;
      if (mine || !ownerAlive(of)) rmSync(join(this.leases, name), { force: true });
    }
  }

  /** Leases taken by runtimes on this state dir (others belong to other state dirs' reapers). */
  listLeases(): Array<{ uid: number; sandboxId: string; owner: Owner }> {
    const out: Array<{ uid: number; sandboxId: string; owner: Owner }> = [];
    for (const name of safeReaddir(this.leases)) {
      if (name.startsWith('.')) continue; // a lease being written (see leaseUid)
      try {
        const j = JSON.parse(readFileSync(join(this.leases, name), 'utf8')) as {
          sandboxId: string;
          pid: number;
          startTicks: string;
          stateDir: string;
        };
        if (j.stateDir !== this.root) continue;
        out.push({
          uid: Number(name),
          sandboxId: j.sandboxId,
          owner: { pid: j.pid, startTicks: j.startTicks },
        });
      } catch {
        // A lease being written right now (empty) or corrupt: the reaper decides by sandbox dir.
      }
    }
    return out;
  }

  listSandboxIds(): string[] {
    return safeReaddir(this.sandboxes);
  }
}

/** The start of an owner's lease temp file names (see leaseUid). */
function leaseTempPrefix(o: Owner): string {
  return `.lease.${o.pid}.${o.startTicks}.`;
}

function safeReaddir(d: string): string[] {
  try {
    return readdirSync(d);
  } catch {
    return [];
  }
}

/**
 * SIGKILL every process whose real uid is one of `uids` (defence in depth for the reaper: a uid is
 * only handed out again once nothing runs as it). Returns how many were signalled.
 */
export function killProcessesOfUids(uids: ReadonlySet<number>): number {
  if (uids.size === 0) return 0;
  let n = 0;
  for (const name of safeReaddir('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    let uid: number;
    try {
      uid = Number(/^Uid:\s+(\d+)/m.exec(readFileSync(`/proc/${name}/status`, 'utf8'))?.[1]);
    } catch {
      continue; // exited meanwhile
    }
    if (!uids.has(uid)) continue;
    try {
      process.kill(Number(name), 'SIGKILL');
      n++;
    } catch {
      /* gone */
    }
  }
  return n;
}
