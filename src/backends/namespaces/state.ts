// Host-side bookkeeping for the namespaces tier: where each sandbox's files live, which host uid it
// holds, and which process owns it (so a restarted Airlock can reap what a killed one left behind).
// Leases are files created with O_EXCL, so concurrent Airlock processes never hand out one uid twice.
import { chmodSync, mkdirSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { mkdir as mkdirAsync, open, rm, writeFile as writeFileAsync } from 'node:fs/promises';
import { join } from 'node:path';
import { AirlockError } from '../../core/errors.js';
import { ensureDevTree, ensureRuntimeTmpfs, mkdirUnderRuntimeLock } from './mount.privileged.js';

export interface Owner {
  readonly pid: number;
  /** Kernel start time of `pid` (field 22 of /proc/<pid>/stat), to survive pid reuse. */
  readonly startTicks: string;
}

export interface UidRange {
  readonly first: number;
  readonly count: number;
}

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
   * Take the first free uid in the range; the lease file records the sandbox id and owner. The file
   * operations run off the event loop (the lease dir may be on a journaling disk).
   */
  async leaseUid(range: UidRange, sandboxId: string, owner: Owner): Promise<number> {
    // Start at a pseudo-random offset so concurrent processes rarely race on the same file.
    const start = Math.floor(Math.random() * range.count);
    for (let i = 0; i < range.count; i++) {
      const uid = range.first + ((start + i) % range.count);
      let fh: Awaited<ReturnType<typeof open>>;
      try {
        fh = await open(join(this.leases, String(uid)), 'wx', 0o600);
      } catch (e) {
        if ((e as NodeJS.ErrnoException).code === 'EEXIST') continue;
        throw e;
      }
      try {
        await fh.write(JSON.stringify({ sandboxId, stateDir: this.root, ...owner }));
      } finally {
        await fh.close();
      }
      return uid;
    }
    throw new AirlockError(
      'CAPACITY_EXHAUSTED',
      `all ${range.count} sandbox uids from ${range.first} are leased; kill idle sandboxes or widen the uid range`,
    );
  }

  releaseUid(uid: number): Promise<void> {
    return rm(join(this.leases, String(uid)), { force: true });
  }

  /** Leases taken by runtimes on this state dir (others belong to other state dirs' reapers). */
  listLeases(): Array<{ uid: number; sandboxId: string; owner: Owner }> {
    const out: Array<{ uid: number; sandboxId: string; owner: Owner }> = [];
    for (const name of safeReaddir(this.leases)) {
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
