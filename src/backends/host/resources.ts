// Everything one sandbox holds on the host (its dir and mounts, netns, cgroup, launch namespace, uid
// lease), released in dependency order; and its owner.json, which says whose it is (the reaper and
// the layer store read it).
import { closeSync, linkSync, readdirSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { AirlockError } from '../../core/errors.js';
import type { CgroupHandle } from './cgroups.privileged.js';
import { closeLaunchNamespace } from './launcher.privileged.js';
import { unmountAsync } from './mount.privileged.js';
import type { NetnsHandle } from './netns.privileged.js';
import { slotClaimHeld } from './slot-claim.privileged.js';
import { ownerAlive, type Owner, type StateDirs } from './state.js';

/** Everything a sandbox holds on the host, released in dependency order, each step attempted. */
export class HostResources {
  cgroup: CgroupHandle | undefined;
  /** The sandbox's network namespace (held by an fd of this process; none for a reaped orphan). */
  netns: NetnsHandle | undefined;
  /** The mount namespace its bwrap starts in (launcher.privileged.ts), once made. */
  launchNs: number | undefined;
  /**
   * The open fd of its image-claim file (a warm slot with an image root mounted ahead), locked once
   * a create took the slot: closed last, after the unmounts (slot-claim.privileged.ts).
   */
  claimFd: number | undefined;
  constructor(
    readonly dir: string,
    readonly uid: number | undefined,
    private readonly dirs: StateDirs,
  ) {}

  async release(): Promise<void> {
    const errors: unknown[] = [];
    const step = async (f: () => unknown): Promise<void> => {
      try {
        await f();
      } catch (e) {
        errors.push(e);
      }
    };
    // 1. processes (they pin the mounts), 2. mounts, innermost first (the overlays, then what they
    // lie on), 3. files, 4. uid lease.
    // Unmounts run off the event loop (unmountAsync), one after the other in this order.
    const names = readdirOr(this.dir);
    const unmount = (name: string): Promise<void> =>
      names.includes(name) ? step(() => unmountAsync(join(this.dir, name))) : Promise.resolve();
    await step(() => this.cgroup?.destroy());
    await step(() => closeLaunchNamespace(this.launchNs));
    this.launchNs = undefined;
    await unmount('ws');
    await unmount('home');
    // An image root: the overlay, its helper bind, then the layer views under it.
    await unmount('root');
    await unmount('helper');
    for (const name of names) if (/^(ro|layer|img|imgsnap)-\d+$/.test(name)) await unmount(name);
    await unmount('lower');
    await unmount('disk');
    // Held by an fd (its dir entry is only a symlink), or a reaped orphan's: then possibly the
    // bind-mounted netns of an older Airlock.
    if (this.netns) await step(() => this.netns!.close());
    else await unmount('netns');
    await unmount('pts');
    // The claim (and its lock: a remover may take the layers now) goes once nothing is mounted.
    if (this.claimFd !== undefined) await step(() => closeSync(this.claimFd!));
    this.claimFd = undefined;
    await step(() => this.dirs.removeTree(this.dir));
    if (this.uid !== undefined) await step(() => this.dirs.releaseUid(this.uid!));
    if (errors.length) {
      throw new AirlockError(
        'INTERNAL',
        `sandbox cleanup incomplete: ${errors.map((e) => (e as Error).message).join('; ')}`,
      );
    }
  }
}

/** A sandbox dir's owner.json. */
export interface OwnerFile {
  readonly id: string;
  readonly uid: number;
  readonly owner: Owner;
  /** Snapshot layers the sandbox runs on (written before it opens them; see LayerStore.remove). */
  readonly layers?: readonly string[];
  /**
   * Host dirs of the image layers its root is made of (written before they are mounted), so that an
   * image store never deletes a layer a live sandbox is about to mount or runs on.
   */
  readonly imageLayers?: readonly string[];
  /**
   * Image layer dirs a warm slot holds mounted ahead for a sandbox not created yet. Not a use: an
   * image store may remove them, and the slot is then dropped (slots.ts SlotPool.sweep).
   */
  readonly preparedImageLayers?: readonly string[];
}

export function writeOwnerFile(dir: string, meta: OwnerFile): void {
  // Atomic (tmp + rename): the reaper and LayerStore.remove read it concurrently.
  const tmp = join(dir, 'owner.json.tmp');
  writeFileSync(tmp, JSON.stringify(meta), { mode: 0o600 });
  renameSync(tmp, join(dir, 'owner.json'));
}

/**
 * The owner.json a sandbox dir is to have later, written now beside it (owner.json.staged) so that
 * useStagedOwnerFile puts it in place with one rename, when it must be in place at once.
 */
export function stageOwnerFile(dir: string, meta: OwnerFile): void {
  writeFileSync(join(dir, 'owner.json.staged'), JSON.stringify(meta), { mode: 0o600 });
  // A second name for the owner.json it will replace: that rename then only unlinks a name, and the
  // file is freed with the dir (at teardown), not on the create's path (best effort: speed only).
  try {
    linkSync(join(dir, 'owner.json'), join(dir, 'owner.json.prepared'));
  } catch {
    /* the rename frees it then */
  }
}

/** Puts the staged owner.json in place (atomic, like writeOwnerFile); false if none was staged. */
export function useStagedOwnerFile(dir: string): boolean {
  try {
    renameSync(join(dir, 'owner.json.staged'), join(dir, 'owner.json'));
    return true;
  } catch {
    return false;
  }
}

export function readOwnerFile(dir: string): OwnerFile | undefined {
  try {
    return JSON.parse(readFileSync(join(dir, 'owner.json'), 'utf8')) as OwnerFile;
  } catch {
    return undefined;
  }
}

/**
 * Ids of the live sandboxes (of any process on the state dir `root`) whose owner.json names the image
 * layer dir `layerDir` in use. Records only: a create that took a warm slot holds its claim before its
 * record lands, so a remover asks imageLayerInUse (below), which counts held claims too.
 */
export function imageLayerUsers(root: string, layerDir: string): string[] {
  const sandboxes = join(root, 'sandboxes');
  return readdirOr(sandboxes)
    .filter((id) => {
      const meta = readOwnerFile(join(sandboxes, id));
      return meta?.imageLayers?.includes(layerDir) === true && ownerAlive(meta.owner);
    })
    .sort();
}

/**
 * Whether a live sandbox of the state dir `root` uses the image layer dir `layerDir`: asked by a
 * remover (an image store's or the closure prune's `inUse`) after it renamed that dir away. A record
 * naming it in use counts, and so does a warm slot holding it prepared whose claim a create took;
 * every other live slot holding it prepared is revoked on the way, so that no create takes it from
 * now on (slot-claim.privileged.ts says why that is safe across processes).
 */
export function imageLayerInUse(root: string, layerDir: string): boolean {
  const sandboxes = join(root, 'sandboxes');
  for (const id of readdirOr(sandboxes)) {
    const dir = join(sandboxes, id);
    const meta = readOwnerFile(dir);
    if (!meta || !ownerAlive(meta.owner)) continue;
    if (meta.imageLayers?.includes(layerDir)) return true;
    if (meta.preparedImageLayers?.includes(layerDir) && slotClaimHeld(dir)) return true;
  }
  return false;
}

/**
 * Whether `mountPoint` lies in a warm slot of the state dir `root` that holds an image root mounted
 * ahead for no sandbox yet (its record names the layers as prepared, not in use): an image store
 * does not count such a mount as a use, and the slot's owner drops it once the layers are gone.
 */
export function preparedSlotMount(root: string): (mountPoint: string) => boolean {
  const prefix = join(root, 'sandboxes') + '/';
  return (mountPoint) => {
    if (!mountPoint.startsWith(prefix)) return false;
    const id = mountPoint.slice(prefix.length).split('/')[0]!;
    const meta = readOwnerFile(join(prefix, id));
    return meta?.preparedImageLayers !== undefined && meta.imageLayers === undefined;
  };
}

function readdirOr(dir: string): string[] {
  try {
    return readdirSync(dir);
  } catch {
    return [];
  }
}
