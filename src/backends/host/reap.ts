// Residue of sandboxes whose owning process died (SIGKILL, crash), of any tier on a state dir:
// their processes, cgroups, mounts, dirs and uid leases.
import { existsSync, statSync } from 'node:fs';
import type { Logger, ReapReport } from '../../core/backend.js';
import { attachCgroup, listCgroups, type CgroupLayout } from './cgroups.privileged.js';
import type { LayerStore } from './layers.js';
import { HostResources, readOwnerFile } from './resources.js';
import { killProcessesOfUids, ownerAlive, type StateDirs } from './state.js';

export interface ReapScope {
  readonly dirs: StateDirs;
  readonly layout: CgroupLayout;
  /** Only cgroups named with this prefix (this state dir's) are reaped. */
  readonly cgPrefix: string;
  readonly layerStore: LayerStore;
  readonly logger: Logger;
}

/** Reap what the dead left on this state dir; the number of sandboxes reaped. */
export async function reapOrphans({
  dirs,
  layout,
  cgPrefix,
  layerStore,
  logger,
}: ReapScope): Promise<ReapReport> {
  const live = new Set<string>();
  const orphans: Array<{ id: string; dir: string; uid: number | undefined }> = [];
  for (const id of dirs.listSandboxIds()) {
    const dir = dirs.sandboxDir(id);
    const meta = readOwnerFile(dir);
    if ((meta && ownerAlive(meta.owner)) || (!meta && recentlyCreated(dir))) {
      live.add(id); // alive, or being created right now by another process (owner.json is next)
      continue;
    }
    orphans.push({ id, dir, uid: meta?.uid });
  }
  const deadLeases = dirs.listLeases().filter((l) => !ownerAlive(l.owner) && !live.has(l.sandboxId));
  // Nothing may still run as a uid that is about to be handed out again, whatever cgroup it is in.
  const uids = new Set<number>([
    ...orphans.flatMap((o) => (o.uid === undefined ? [] : [o.uid])),
    ...deadLeases.map((l) => l.uid),
  ]);
  killProcessesOfUids(uids);

  const cgroups = listCgroups(layout, cgPrefix);
  let reaped = 0;
  for (const o of orphans) {
    const res = new HostResources(o.dir, o.uid, dirs);
    const cg = cgroups.get(o.id);
    if (cg) res.cgroup = attachCgroup(layout, cg);
    try {
      await res.release();
      reaped++;
    } catch (e) {
      logger.warn({ id: o.id, err: (e as Error).message }, 'could not fully reap sandbox');
    }
  }
  // Cgroups without a sandbox dir, and leases whose owner died.
  for (const [id, cgDirs] of cgroups) {
    if (live.has(id) || existsSync(dirs.sandboxDir(id))) continue;
    await attachCgroup(layout, cgDirs)
      .destroy()
      .catch(() => {});
  }
  for (const l of deadLeases) await dirs.releaseUid(l.uid);
  dirs.pruneLeaseTemps();
  // After the orphans' mounts are gone: interrupted captures and removals (never a whole layer).
  layerStore.reap();
  return { sandboxes: reaped };
}

function recentlyCreated(dir: string): boolean {
  try {
    return Date.now() - statSync(dir).mtimeMs < 10_000;
  } catch {
    return false;
  }
}
