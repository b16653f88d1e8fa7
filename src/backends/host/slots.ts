// The warm-slot pool: sandboxes' host state made ahead of time (uid lease, dirs, a tmpfs disk, netns,
// cgroup, launch namespace), so that `create` only applies the spec. What else a slot gets ahead
// (egress listeners and interception, user namespaces that idmap, a workspace mounted) follows an
// explicit prepare plan (core/backend.ts PreparePlan): given by the caller (backend.prepare), or
// else learned from each create (the next create most likely looks like the last one).
import { closeSync, lstatSync, statSync, watch, type FSWatcher } from 'node:fs';
import { dirname } from 'node:path';
import type { Logger, PreparePlan } from '../../core/backend.js';
import type { Limits, Rootfs } from '../../core/spec.js';
import { EGRESS_SOCKETS, TRANSPARENT_SOCKET } from '../../core/sandbox-sockets.js';
import { mappingUserns } from './idmap.privileged.js';
import { LAYER_SELF_ID, type CaptureSource } from './layer-capture.privileged.js';
import { prepareEgressInNetns, recreateNetns, type NetnsHandle } from './netns.privileged.js';
import type { HostResources } from './resources.js';

export interface Slot {
  readonly id: string;
  readonly uid: number;
  readonly dir: string;
  readonly disk: string;
  readonly diskBytes: number;
  readonly limits: Limits;
  readonly res: HostResources;
  readonly tmpDir: string;
  readonly homeDir: string;
  readonly shmDir: string;
  /** The sandbox's network namespace (replaced once if a prepared interception is not wanted). */
  netns: NetnsHandle;
  readonly ptsDir: string;
  /**
   * The netns already holds transparent interception (made ahead by the plan). Only a sandbox whose
   * policy asks for it gets such a netns; any other gets a fresh one.
   */
  intercepting?: boolean;
  /**
   * The user namespace that idmaps snapshot layers to this slot's uid, made ahead of time when the
   * plan has forks of snapshots (its helper process costs milliseconds).
   */
  layerUserns?: Promise<number | undefined>;
  /**
   * The user namespace that idmaps a workspace host dir's owner to this slot's uid, made ahead of
   * time for the owner of the planned (or else the last mounted) host-dir workspace (same reason).
   */
  wsUserns?: { readonly owner: WsOwner; readonly fd: Promise<number | undefined> };
  /** The planned workspace, mounted ahead (prepareWorkspace); only a create asking for it uses it. */
  ws?: WsAhead;
  /** prepareWorkspace in progress (rejects if it left the slot half mounted). */
  preparing?: Promise<void>;
  /** The image root mounted ahead (prepareImage): only a create of this very image key takes it. */
  image?: ImageAhead;
}

/** An image root mounted ahead in a warm slot, for exactly one image (layers and config). */
export interface ImageAhead {
  readonly key: string;
  /** What mountImageRoot made (its ImageRoot; named here by shape, not imported: no cycle). */
  readonly root: { readonly dir: string; readonly upper: string; readonly generated: readonly string[] };
  /** The read-only bind of the image helper in the sandbox dir. */
  readonly helper: string;
  /** Whether the root and the helper were added to the slot's launch namespace already. */
  readonly inLaunchNs: boolean;
  /** Each layer dir as it was when mounted: a slot is stale once any is gone or replaced. */
  readonly layerIds: ReadonlyArray<LayerId>;
}

export interface LayerId {
  readonly path: string;
  readonly dev: number;
  readonly ino: number;
}

/** The identity of each layer dir now (undefined: one is missing or not a dir). */
export function layerIds(layers: readonly string[]): LayerId[] | undefined {
  const out: LayerId[] = [];
  for (const path of layers) {
    const st = lstatSync(path, { throwIfNoEntry: false });
    if (!st?.isDirectory()) return undefined;
    out.push({ path, dev: st.dev, ino: st.ino });
  }
  return out;
}

/** Whether every layer dir an image root was mounted from is still the same dir at the same path. */
export function layersUnchanged(ids: ReadonlyArray<LayerId>): boolean {
  const now = layerIds(ids.map((l) => l.path));
  return now !== undefined && now.every((l, i) => l.dev === ids[i]!.dev && l.ino === ids[i]!.ino);
}

/** A layer dir is `<store>/layers/<digest>/fs`: a rename or removal of `<digest>` shows in `layers`. */
function watchDirOf(layer: string): string {
  return dirname(dirname(layer));
}

/** Images whose roots warm slots hold mounted ahead (the most recently created from), at most. */
export const MAX_IMAGE_SLOTS = 2;

/** A workspace over a host dir, as a create asks for it. */
export interface WsPlan {
  readonly hostDir: string;
  readonly mode: 'ro' | 'cow';
}

export interface WsOwner {
  readonly uid: number;
  readonly gid: number;
}

/** A workspace mounted ahead: for which dir (its inode and owner when mounted), and where. */
export interface WsAhead {
  readonly plan: WsPlan;
  readonly dev: number;
  readonly ino: number;
  readonly owner: WsOwner;
  readonly workspaceDir: string;
  readonly wsSource: CaptureSource;
}

/** What the pool needs of the host state that owns it. */
export interface SlotPoolDeps {
  readonly size: number;
  /** A new slot with the default limits. */
  prepareSlot(): Promise<Slot>;
  /** Mount `plan`'s workspace in `slot` ahead (best effort; rejects if it left it half mounted). */
  prepareWorkspace(slot: Slot, plan: WsPlan): Promise<void>;
  /** Mount the image root of `rootfs` in `slot` ahead (rejects if it could not: the slot is discarded). */
  prepareImage(slot: Slot, key: string, rootfs: Rootfs): Promise<void>;
  /** Release a slot that will never be handed out. */
  discard(slot: Slot): void;
  readonly logger: Logger;
}

/** The plan before the first create: nothing but the bare slot. */
const NOTHING_AHEAD: PreparePlan = { network: 'none', snapshotForks: false };

/** When the warm pool is refilled after a create if no process of the new sandbox has started. */
const REFILL_FALLBACK_MS = 10;

export class SlotPool {
  private readonly slots: Slot[] = [];
  private planned: PreparePlan = NOTHING_AHEAD;
  /** Whether the plan was given (backend.prepare): then creates do not change it. */
  private fixed = false;
  /** The owner of the last workspace host dir mounted: slots prepare wsUserns for it. */
  private wsOwner: WsOwner | undefined;
  /** A refill due: started when a sandbox's process has started, or REFILL_FALLBACK_MS after create. */
  private refillTimer: NodeJS.Timeout | undefined;
  /** The refill in progress (close() waits for it: it may be about to add a slot). */
  private refilling: Promise<void> | undefined;
  /** Images created from, most recent last (at most MAX_IMAGE_SLOTS): a slot each is mounted ahead. */
  private images: Array<{ key: string; rootfs: Rootfs }> = [];
  /** Watches on the dirs holding those images' layer dirs: a removal there drops stale slots. */
  private readonly watchers = new Map<string, FSWatcher>();
  /**
   * The rootfs last noted, when it is the most recent image and each of its dirs is watched: noting
   * it again then changes nothing (the common case, creates from one image; noteImage returns at
   * once). Cleared whenever the images or the watches change.
   */
  private noted: Rootfs | undefined;
  /** What takes left to do off the create's path (afterTake). */
  private readonly afterTakes: Array<() => void> = [];

  constructor(private readonly deps: SlotPoolDeps) {}

  /** What slots are made ready for from now on. */
  get plan(): PreparePlan {
    return this.planned;
  }

  /** Make slots ready for `plan` from now on (and stop learning it from creates). */
  prepare(plan: PreparePlan): void {
    this.planned = plan;
    this.fixed = true;
    this.scheduleRefill();
  }

  /** A create asked for this: the plan follows it unless one was given. */
  learn(plan: PreparePlan): void {
    if (this.fixed) return;
    // Once a fork of a snapshot was seen, slots keep preparing for forks.
    this.planned = { ...plan, snapshotForks: plan.snapshotForks || this.planned.snapshotForks };
  }

  /** A workspace over a host dir of this owner was mounted. */
  noteWorkspaceOwner(owner: WsOwner): void {
    this.wsOwner = owner;
  }

  /** A slot to use, if one is ready (a refill follows: see scheduleRefill). */
  take(): Slot | undefined {
    const i = this.slots.findLastIndex((s) => !s.image);
    return i < 0 ? undefined : this.slots.splice(i, 1)[0];
  }

  /** The slot with the root of image `key` mounted ahead, if one is ready (never another image's). */
  takeImage(key: string): Slot | undefined {
    const i = this.slots.findIndex((s) => s.image?.key === key);
    return i < 0 ? undefined : this.slots.splice(i, 1)[0];
  }

  /**
   * A create from image `key` (no snapshot layers, no read-only mounts): refills mount its root ahead
   * from now on. The least recently created image beyond MAX_IMAGE_SLOTS loses its slot.
   */
  noteImage(key: string, rootfs: Rootfs): void {
    if (this.deps.size <= 0) return;
    const last = this.images.at(-1);
    if (this.noted === rootfs && last?.rootfs === rootfs && last.key === key) return;
    this.noted = undefined;
    this.images = [...this.images.filter((i) => i.key !== key), { key, rootfs }];
    while (this.images.length > MAX_IMAGE_SLOTS) this.dropImage(this.images.shift()!.key);
    const dirs = rootfs.layers.map(watchDirOf);
    for (const d of dirs) this.watchLayers(d);
    if (dirs.every((d) => this.watchers.has(d))) this.noted = rootfs;
  }

  /**
   * Drop every slot (and the plan) of images whose layer dirs are gone or replaced: an image removed
   * from its store (`airlock image rm`, prune) leaves no mount of it in a warm slot.
   */
  sweep(): void {
    this.noted = undefined;
    for (const img of [...this.images]) {
      if (layerIds(img.rootfs.layers) === undefined) {
        this.images = this.images.filter((i) => i !== img);
        this.dropImage(img.key);
      }
    }
    for (const s of this.slots.filter((s) => s.image && !layersUnchanged(s.image.layerIds))) {
      this.slots.splice(this.slots.indexOf(s), 1);
      this.deps.discard(s);
    }
    const dirs = new Set(this.images.flatMap((i) => i.rootfs.layers.map(watchDirOf)));
    for (const [d, w] of this.watchers) {
      if (!dirs.has(d)) {
        w.close();
        this.watchers.delete(d);
      }
    }
  }

  private dropImage(key: string): void {
    for (const s of this.slots.filter((s) => s.image?.key === key)) {
      this.slots.splice(this.slots.indexOf(s), 1);
      this.deps.discard(s);
    }
  }

  private watchLayers(d: string): void {
    if (this.watchers.has(d)) return;
    try {
      const w = watch(d, { persistent: false }, () => this.sweep());
      w.on('error', () => {
        w.close();
        this.watchers.delete(d);
        this.noted = undefined;
      });
      this.watchers.set(d, w);
    } catch {
      // Not watchable: stale slots are still refused at take (HostState.create checks the layers).
    }
  }

  /**
   * Run `f` with the refill a take schedules (off the create's path: when the new sandbox's first
   * process has started, or shortly after), or at drain. Best effort: `f` must not throw.
   */
  afterTake(f: () => void): void {
    this.afterTakes.push(f);
  }

  private runAfterTake(): void {
    for (const f of this.afterTakes.splice(0)) f();
  }

  /** Refill shortly (or when a process of the new sandbox has started: processStarted). */
  scheduleRefill(): void {
    if (this.deps.size > 0 && this.refillTimer === undefined)
      this.refillTimer = setTimeout(() => this.refill(), REFILL_FALLBACK_MS);
  }

  /** A sandbox's process has started: run a due refill now, while that command runs on another core. */
  processStarted(): void {
    if (this.refillTimer === undefined) return;
    clearTimeout(this.refillTimer);
    this.refill();
  }

  /**
   * Keep `size` slots ready. Runs once the new sandbox's first process has started (not while it is
   * starting: the event loop's turns then are on that command's critical path), or shortly after
   * create if none starts. One refill at a time.
   */
  private refill(): void {
    this.refillTimer = undefined;
    this.runAfterTake();
    if (this.refilling) return; // its loop sees the slot just taken
    const run = async (): Promise<void> => {
      try {
        // Generic slots first (a create on the host root must not wait for an image's), then one
        // for each image planned; checked again after each slot, as creates take them meanwhile.
        for (;;) {
          if (this.slots.filter((s) => !s.image).length < this.deps.size) {
            this.slots.push(await this.deps.prepareSlot());
            continue;
          }
          const img = this.images.find((i) => !this.slots.some((s) => s.image?.key === i.key));
          if (!img) break;
          const making = (async (): Promise<Slot> => {
            const slot = await this.deps.prepareSlot();
            try {
              await this.deps.prepareImage(slot, img.key, img.rootfs);
            } catch (e) {
              this.deps.discard(slot);
              throw e;
            }
            return slot;
          })();
          let slot: Slot;
          try {
            slot = await making;
          } catch (e) {
            this.images = this.images.filter((i) => i.key !== img.key); // not retried until a create
            this.noted = undefined;
            throw e;
          }
          // Dropped meanwhile (evicted, or its layers removed): never handed out. (Noted again meanwhile,
          // by a create that resolved the image anew, it is another entry of the same key: kept.)
          if (!this.images.some((i) => i.key === img.key) || !layersUnchanged(slot.image!.layerIds))
            this.deps.discard(slot);
          else this.slots.push(slot);
        }
        const plan = this.planned;
        if (plan.snapshotForks) for (const slot of this.slots) if (!slot.image) prepareLayerUserns(slot);
        const owner = plannedOwner(plan) ?? this.wsOwner;
        // (A slot whose workspace is mounted ahead has used its user namespace already.)
        if (owner) for (const slot of this.slots) if (!slot.ws) prepareWsUserns(slot, owner);
        // (A slot holding an image root has used its layer user namespace: see prepareImage.)
        if (plan.network !== 'none')
          for (const slot of this.slots) prepareEgress(slot, plan.network === 'transparent');
        const ws = plan.workspace && !plan.workspace.onSnapshot ? plan.workspace : undefined;
        // A create that takes a slot being mounted into waits for that first (see HostState.create).
        for (const slot of ws ? this.slots.filter((s) => !s.ws && !s.image) : []) {
          if (!this.slots.includes(slot)) continue; // taken meanwhile
          const preparing = this.deps.prepareWorkspace(slot, { hostDir: ws!.hostDir, mode: ws!.mode });
          slot.preparing = preparing;
          try {
            await preparing;
          } catch (e) {
            // Half mounted and not undone: not a slot to hand out (a create that took it meanwhile
            // releases it itself).
            const i = this.slots.indexOf(slot);
            if (i >= 0) {
              this.slots.splice(i, 1);
              this.deps.discard(slot);
            }
            throw e;
          } finally {
            slot.preparing = undefined;
          }
        }
      } catch (e) {
        this.deps.logger.warn({ err: (e as Error).message }, 'warm pool refill failed');
      }
    };
    const p: Promise<void> = run().finally(() => {
      if (this.refilling === p) this.refilling = undefined;
    });
    this.refilling = p;
  }

  /** Stop refilling and hand back every slot (the caller releases them). */
  async drain(): Promise<Slot[]> {
    clearTimeout(this.refillTimer);
    this.refillTimer = undefined;
    this.runAfterTake();
    while (this.refilling) await this.refilling;
    for (const w of this.watchers.values()) w.close();
    this.watchers.clear();
    this.images = [];
    this.noted = undefined;
    return this.slots.splice(0);
  }
}

/** The owner of the planned workspace host dir (undefined: none planned, or it is gone). */
function plannedOwner(plan: PreparePlan): WsOwner | undefined {
  if (!plan.workspace) return undefined;
  try {
    const st = statSync(plan.workspace.hostDir);
    return { uid: st.uid, gid: st.gid };
  } catch {
    return undefined;
  }
}

/** Whether a workspace mounted ahead is exactly the one asked for: same dir, inode, owner and mode. */
export function aheadFits(a: WsAhead, hostDir: string, mode: string): boolean {
  if (a.plan.hostDir !== hostDir || a.plan.mode !== mode) return false;
  try {
    const st = statSync(hostDir);
    return st.dev === a.dev && st.ino === a.ino && st.uid === a.owner.uid && st.gid === a.owner.gid;
  } catch {
    return false;
  }
}

function prepareLayerUserns(slot: Slot): void {
  slot.layerUserns ??= mappingUserns(LAYER_SELF_ID, LAYER_SELF_ID, slot.uid).catch(() => undefined);
}

/**
 * A warm slot's netns made ready for egress, ahead of a create asking for it: the egress listeners,
 * and for transparent egress the interception and its listener, in one switch into the netns
 * (about 0.2 ms of the create otherwise). create() drops the listeners for a sandbox without egress
 * and gives a sandbox that does not want interception a fresh netns.
 */
function prepareEgress(slot: Slot, intercept: boolean): void {
  if (slot.netns.hasSocketsAhead && (!intercept || slot.intercepting)) return;
  slot.netns.dropSockets(); // (made for proxy-only egress: remade beside the interception)
  const interceptNow = intercept && !slot.intercepting;
  try {
    prepareEgressInNetns(
      slot.netns,
      intercept ? [...EGRESS_SOCKETS, TRANSPARENT_SOCKET] : EGRESS_SOCKETS,
      interceptNow ? TRANSPARENT_SOCKET : undefined,
    );
  } catch (e) {
    // The interception may be half made: give the slot a fresh netns (the create that asks for
    // egress then makes it on its path, and reports why it cannot).
    if (interceptNow) slot.netns = slot.res.netns = recreateNetns(slot.netns);
    throw e;
  }
  if (interceptNow) slot.intercepting = true;
}

/** Close the user namespaces a slot holds made ahead (it is released, not handed out). */
export function discardSlotUserns(slot: Slot): void {
  discardLayerUserns(slot);
  discardUserns(takeWsUserns(slot)?.fd);
}

export function discardLayerUserns(slot: Slot): void {
  discardUserns(slot.layerUserns);
  slot.layerUserns = undefined;
}

function prepareWsUserns(slot: Slot, owner: WsOwner): void {
  if (slot.wsUserns && (slot.wsUserns.owner.uid !== owner.uid || slot.wsUserns.owner.gid !== owner.gid)) {
    discardUserns(takeWsUserns(slot)?.fd);
  }
  slot.wsUserns ??= { owner, fd: mappingUserns(owner.uid, owner.gid, slot.uid).catch(() => undefined) };
}

export function takeWsUserns(slot: Slot): Slot['wsUserns'] {
  const w = slot.wsUserns;
  slot.wsUserns = undefined;
  return w;
}

export function discardUserns(fd: Promise<number | undefined> | undefined): void {
  void fd?.then((n) => n !== undefined && closeSync(n));
}
