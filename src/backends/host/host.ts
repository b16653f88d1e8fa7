// The host state of one state dir, as every tier that runs sandboxes over host mounts composes it:
// the state dirs and uid leases, the cgroup layout, the generated /etc and /dev tree, the launcher,
// the layer store, the warm-slot pool, and the batched teardowns. `create` makes a sandbox's host
// state (disk, workspace and home mounts, read-only mounts, netns, cgroup) from a warm slot and hands
// it to the tier, which makes the live sandbox (HostTier.makeSandbox).
import { createHash, randomBytes } from 'node:crypto';
import { chmodSync, mkdirSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type {
  BackendContext,
  BackendSandbox,
  PreparePlan,
  ProbeCheck,
  ReapReport,
  SnapshotStoreV1,
} from '../../core/backend.js';
import { AirlockError } from '../../core/errors.js';
import { isDeepFrozen } from '../../core/freeze.js';
import { TRANSPARENT_ADDRESS, TRANSPARENT_PORT } from '../../core/sandbox-sockets.js';
import type { SnapshotRecord } from '../../core/snapshot.js';
import {
  LimitsSchema,
  type BackendName,
  type Limits,
  type Rootfs,
  type SandboxSpec,
} from '../../core/spec.js';
import { createCgroup, detectCgroups, type CgroupLayout } from './cgroups.privileged.js';
import { bindReadOnly } from './idmap.privileged.js';
import { ensureImageHelper, mountImageRoot } from './image-root.privileged.js';
import { hostChecks } from './probe.js';
import { reapOrphans } from './reap.js';
import { onProcessExit, releaseOwnedSync } from './exit-release.privileged.js';
import type { CaptureSource } from './layer-capture.privileged.js';
import { closeLaunchNamespace, Launcher } from './launcher.privileged.js';
import { LayerStore } from './layers.js';
import type { SandboxLayout } from './layout.js';
import { mountDevpts, mountOverlay, mountTmpfs, resizeTmpfs } from './mount.privileged.js';
import { createNetns, createNetnsOff, recreateNetns } from './netns.privileged.js';
import { startChildReaper } from './reaper.privileged.js';
import {
  HostResources,
  readOwnerFile,
  stageOwnerFile,
  useStagedOwnerFile,
  writeOwnerFile,
  type OwnerFile,
} from './resources.js';
import { launchSharesKey, type HostSandboxParts } from './sandbox.js';
import {
  aheadFits,
  discardLayerUserns,
  discardSlotUserns,
  discardUserns,
  layerIds,
  SlotPool,
  takeWsUserns,
  type Slot,
  type WsOwner,
} from './slots.js';
import { ensureEtc } from './rootfs.js';
import { openSlotClaim, takeSlotClaim } from './slot-claim.privileged.js';
import { DEFAULT_UID_RANGE, ownerAlive, selfOwner, StateDirs, type UidRange } from './state.js';
import { Teardowns } from './teardowns.js';
import {
  checkHostDir,
  dropWorkspace,
  mkOwned,
  mountReadOnly,
  mountWorkspace,
  prepareWorkspace,
  realpathOr,
  type HostWorkspace,
} from './workspace.js';

/** Pseudo-terminals per sandbox (its own devpts instance). */
const MAX_PTYS = 64;

const DEFAULT_LIMITS: Limits = LimitsSchema.parse({});

/** Options of the host state (every tier built on it takes these). */
export interface HostOptions {
  /**
   * Sandboxes' host state prepared ahead of time (default 1): `create` then only applies the spec.
   * Prepared slots hold a uid, an empty tmpfs, a netns (with what the prepare plan asks for) and a
   * cgroup; `close()` releases them.
   */
  readonly warmPool?: number;
  /** What warm slots are made ready for (default: learned from each create; see PreparePlan). */
  readonly prepare?: PreparePlan;
  readonly uidRange?: UidRange;
  /** Host-wide uid lease dir (default /run/airlock/uid-leases). */
  readonly uidLeaseDir?: string;
  /**
   * Turn on the kernel's cgroup `favordynmods` mode if it is off (default true): each exec's cgroup
   * enrolment then never waits for an RCU grace period (milliseconds). Host-wide; see favorDynmods.
   */
  readonly favorCgroupMigration?: boolean;
  /**
   * Start each sandbox's bwrap in a mount namespace holding only what it binds from (default true;
   * see launcher.privileged.ts): its cost then depends neither on the host's mounts nor on the
   * other live sandboxes. false: bwrap starts in the host's mount namespace.
   */
  readonly launchNamespaces?: boolean;
}

/**
 * A prepare plan checked as a create's would be (INVALID_ARGUMENT; INVALID_SPEC for a workspace that
 * may not be one), its workspace's host dir resolved. Airlock.prepare also calls it for a tier whose
 * module is not loaded yet, so a bad plan is refused at once on every tier.
 */
export function checkPreparePlan(plan: PreparePlan, stateDir: string): PreparePlan {
  if (!['none', 'proxy', 'transparent'].includes(plan.network)) {
    throw new AirlockError(
      'INVALID_ARGUMENT',
      `prepare plan: network must be "none", "proxy" or "transparent", not ${JSON.stringify(plan.network)}`,
    );
  }
  const workspace = plan.workspace;
  if (!workspace) return plan;
  if (workspace.mode !== 'ro' && workspace.mode !== 'cow') {
    throw new AirlockError(
      'INVALID_ARGUMENT',
      `prepare plan: workspace.mode must be "ro" or "cow", not ${JSON.stringify(workspace.mode)}`,
    );
  }
  return {
    ...plan,
    workspace: { ...workspace, hostDir: checkHostDir(workspace.hostDir, realpathOr(stateDir)) },
  };
}

/** What a tier tells the host state about itself. */
export interface HostTier {
  readonly name: BackendName;
  /** Whether its processes are started by bwrap (only then are launch namespaces made for them). */
  readonly startsBwrap: boolean;
  /**
   * The cgroup limits that hold a sandbox with these limits: the spec's own, plus the footprint of a
   * runtime that lives in the sandbox's cgroup (gVisor).
   */
  hostLimits(l: Limits): Limits;
  /**
   * false: warm slots never get egress made ahead (listeners at 127.0.0.1, output-hook
   * interception): the tier plumbs egress its own way (the microVM tier's tap). Default true.
   */
  readonly egressAhead?: boolean;
}

export class SandboxHost {
  readonly dirs: StateDirs;
  readonly layerStore: LayerStore;
  /** This tier's snapshots (one layer store per state dir, shared by the tiers; each lists its own). */
  readonly snapshots: SnapshotStoreV1;
  private readonly uidRange: UidRange;
  private cgroupLayout: CgroupLayout | undefined;
  private etcDir: string | undefined;
  /** The shared read-only /dev tree (undefined: bwrap's --dev in each exec). */
  private devDir: string | undefined;
  private readonly launchNamespaces: boolean;
  /** Starts bwrap in each sandbox's launch namespace (undefined: from the host's). */
  private launcher: Launcher | undefined;
  private readonly favorCgroupMigration: boolean;
  private readonly pool: SlotPool;
  private readonly teardowns: Teardowns;
  /** Cgroup names are `<prefix><id>`: several state dirs on one host never reap each other's. */
  private readonly cgPrefix: string;
  /** The static helper bound into sandboxes on an image root (made at the first one). */
  private imageHelper: ReturnType<typeof ensureImageHelper> | undefined;
  /** rootfsKey of each rootfs frozen throughout (Airlock hands out the same one per cached image). */
  private readonly rootfsKeys = new WeakMap<Rootfs, string>();

  constructor(
    private readonly ctx: BackendContext,
    private readonly tier: HostTier,
    opts: HostOptions = {},
  ) {
    this.dirs = new StateDirs(ctx.stateDir, opts.uidLeaseDir);
    this.uidRange = opts.uidRange ?? DEFAULT_UID_RANGE;
    this.favorCgroupMigration = opts.favorCgroupMigration ?? true;
    this.launchNamespaces = opts.launchNamespaces ?? true;
    // The launcher thread boots (loads its module and koffi) while the first create does its own work.
    if (this.launchNamespaces && tier.startsBwrap) Launcher.warm();
    this.cgPrefix = `${createHash('sha256').update(ctx.stateDir).digest('hex').slice(0, 8)}-`;
    this.teardowns = new Teardowns(ctx.logger);
    this.pool = new SlotPool({
      size: opts.warmPool ?? 1,
      prepareSlot: () => this.prepareSlot(tier.hostLimits(DEFAULT_LIMITS)),
      prepareWorkspace: (slot, plan) => prepareWorkspace(slot, plan, this.launcher, ctx.logger),
      prepareImage: (slot, key, rootfs) => this.prepareImage(slot, key, rootfs),
      discard: (slot) => this.discardSlot(slot),
      logger: ctx.logger,
    });
    if (opts.prepare) this.prepare(opts.prepare);
    const store = new LayerStore(ctx.stateDir, (d) => this.liveUsers(d));
    this.layerStore = store;
    const mine = (r: SnapshotRecord | undefined): SnapshotRecord | undefined =>
      r?.backend === tier.name ? r : undefined;
    this.snapshots = {
      list: async () => store.list().filter((r) => r.backend === tier.name),
      get: async (d) => mine(store.get(d)),
      // A killed sandbox lists its layers until its teardown has unmounted them.
      users: async (d) => (await this.teardowns.settled(), store.users(d)),
      remove: async (d) => {
        await this.teardowns.settled();
        await store.remove(d, async () => void (await this.reapOrphans()));
      },
    };
  }

  /**
   * Make warm slots ready for `plan` from now on (instead of learning it from each create). A
   * planned workspace is checked as a create's would be (INVALID_SPEC if it may not be one).
   */
  prepare(plan: PreparePlan): void {
    const { workspace } = checkPreparePlan(plan, this.ctx.stateDir);
    this.pool.prepare({
      ...plan,
      ...(this.tier.egressAhead === false ? { network: 'none' as const } : {}),
      ...(workspace ? { workspace } : {}),
    });
  }

  /** What warm slots are made ready for now. */
  get plan(): PreparePlan {
    return this.pool.plan;
  }

  /** Live sandboxes (of any process on this state dir) whose owner.json lists `digest`. */
  private liveUsers(digest: string): string[] {
    const out: string[] = [];
    for (const id of this.dirs.listSandboxIds()) {
      const meta = readOwnerFile(this.dirs.sandboxDir(id));
      if (meta?.layers?.includes(digest) && ownerAlive(meta.owner)) out.push(id);
    }
    return out.sort();
  }

  /**
   * What the host must offer every tier built on it: root, user namespaces, cgroups, overlayfs,
   * seccomp (and, optional, netfilter for transparent egress). A tier adds its own.
   */
  checks(): ProbeCheck[] {
    return hostChecks(this.layout(), this.favorCgroupMigration);
  }

  private layout(): CgroupLayout {
    this.cgroupLayout ??= detectCgroups();
    return this.cgroupLayout;
  }

  /** Once per host state, before the first slot: what every sandbox of it shares. */
  private setUp(): void {
    // An exit without close() releases what this process holds here (exit-release.privileged.ts).
    const [dirs, layout, cgPrefix] = [this.dirs, this.layout(), this.cgPrefix];
    onProcessExit(`${dirs.root}\0${dirs.leases}`, () => void releaseOwnedSync(dirs, layout, cgPrefix));
    // Orphaned sandbox processes (and anything else adopted) are reaped here, not left as zombies.
    startChildReaper();
    const run = this.dirs.ensure();
    if (!run.tmpfs)
      this.ctx.logger.warn({ reason: run.reason }, 'sandbox dirs stay on disk (slower create and kill)');
    this.etcDir = ensureEtc(this.ctx.stateDir);
    const dev = this.dirs.ensureDev();
    if (dev.ok) this.devDir = this.dirs.dev;
    else
      this.ctx.logger.warn({ reason: dev.reason }, 'no shared /dev tree: each exec builds its own (slower)');
    // A launch namespace holds no device nodes but /dev/null: bwrap's own --dev (the fallback
    // when there is no /dev tree) would find none to bind there.
    if (this.launchNamespaces && this.devDir && this.tier.startsBwrap) {
      try {
        const l = Launcher.get();
        if (!(l instanceof Launcher)) throw new Error(l.failed);
        // What every launch namespace made ahead has (a sandbox's layout may add more).
        for (const d of launchSharesKey({ etcDir: this.etcDir, devDir: this.devDir }).split('\0')) l.share(d);
        this.launcher = l;
      } catch (e) {
        this.ctx.logger.warn(
          { reason: (e as Error).message },
          'bwrap starts in the host mount namespace (slower)',
        );
      }
    }
  }

  /**
   * Host state for one sandbox that does not depend on its spec (uid lease, dirs, a tmpfs disk,
   * netns, cgroup), made ahead of time so that `create` only applies the spec. The file operations
   * on the state dir's (journaling) disk run off the event loop.
   */
  private async prepareSlot(limits: Limits): Promise<Slot> {
    if (this.etcDir === undefined) this.setUp();
    const id = `sbx-${randomBytes(8).toString('hex')}`;
    const owner = selfOwner();
    const uid = await this.dirs.leaseUid(this.uidRange, id, owner).catch(async (e: unknown) => {
      // Killed sandboxes keep their uids until their (batched) release: run those now, then retry.
      if (!AirlockError.is(e, 'CAPACITY_EXHAUSTED') || !this.teardowns.pending) throw e;
      await this.teardowns.settled();
      return this.dirs.leaseUid(this.uidRange, id, owner);
    });
    const dir = this.dirs.sandboxDir(id);
    const res = new HostResources(dir, uid, this.dirs);
    try {
      this.dirs.makeSandboxDir(id);
      // Written in place, not tmp + rename: the dir is new, and a reader that finds the file empty or
      // partial treats the dir as one being created (see reapOrphans).
      const ownerJson = JSON.stringify({ id, uid, owner } satisfies OwnerFile);
      await this.dirs.writeNew(join(dir, 'owner.json'), ownerJson, 0o600);
      const disk = join(dir, 'disk');
      await this.dirs.mkdirIn(disk, 0o700);
      mountTmpfs(disk, limits.diskBytes, uid, 0o700);
      const slot: Slot = {
        id,
        uid,
        dir,
        disk,
        diskBytes: limits.diskBytes,
        limits,
        res,
        tmpDir: mkOwned(join(disk, 'tmp'), uid, 0o1777),
        homeDir: mkOwned(join(disk, 'home'), uid, 0o700),
        shmDir: mkOwned(join(disk, 'shm'), uid, 0o1777),
        // Off this thread where the launcher runs (its kernel work would hold up the event loop).
        netns: (res.netns = this.launcher
          ? await createNetnsOff(() => this.launcher!.netns(), join(dir, 'netns'))
          : createNetns(join(dir, 'netns'))),
        ptsDir: join(dir, 'pts'),
      };
      await this.dirs.mkdirIn(slot.ptsDir, 0o755);
      mountDevpts(slot.ptsDir, MAX_PTYS);
      res.cgroup = await createCgroup(this.layout(), this.cgPrefix + id, limits);
      // The launch namespace for a sandbox that adds no mount at create (see NamespacesSandbox).
      if (this.launcher) res.launchNs = await this.launcher.sandboxNamespaceAsync(dir);
      return slot;
    } catch (e) {
      this.teardowns.track(res.release()); // close() waits for it like for a killed sandbox's
      throw e;
    }
  }

  /** The static helper bound into sandboxes on an image root (BACKEND_UNAVAILABLE without one). */
  private helperPath(): string {
    const helper = (this.imageHelper ??= ensureImageHelper(this.ctx.stateDir));
    if (helper.path === undefined) {
      throw new AirlockError('BACKEND_UNAVAILABLE', `sandboxes on an image need ${helper.reason}`, {
        field: 'image',
      });
    }
    return helper.path;
  }

  /**
   * Mount the root of image `rootfs` in a warm slot ahead of a create from it: the layer views, the
   * upper with Airlock's /etc files and mount points, the overlay, the helper bind, all added to the
   * slot's launch namespace. The slot's record names the layers as prepared only, not as in use: an
   * image store may remove them: it revokes the slot's claim first (slot-claim.privileged.ts), and
   * the pool drops the slot (SlotPool.sweep; the take checks the claim). The claim is made before the
   * record, and the layers are checked after it: a remover that looked before the record existed had
   * renamed its layer away already. The record that names them in use is written now beside it, for
   * the create that takes the slot to put in place with one rename, after the take (takeImageSlot).
   */
  private async prepareImage(slot: Slot, key: string, rootfs: Rootfs): Promise<void> {
    slot.res.claimFd = openSlotClaim(slot.dir);
    writeOwnerFile(slot.dir, {
      id: slot.id,
      uid: slot.uid,
      owner: selfOwner(),
      preparedImageLayers: rootfs.layers,
    });
    stageOwnerFile(slot.dir, inUseRecord(slot, rootfs));
    const ids = layerIds(rootfs.layers);
    if (!ids)
      throw new AirlockError('IMAGE_NOT_FOUND', `a layer of image ${key} is gone`, { field: 'image' });
    const helperPath = this.helperPath();
    const root = await mountImageRoot({
      rootfs,
      dir: slot.dir,
      disk: slot.disk,
      hostUid: slot.uid,
      mountTargets: [],
    });
    const at = join(slot.dir, 'helper');
    writeFileSync(at, '', { mode: 0o444 });
    bindReadOnly(helperPath, at);
    let inLaunchNs = false;
    if (slot.res.launchNs !== undefined) {
      try {
        for (const p of [root.dir, at]) this.launcher!.addMount(slot.res.launchNs, p);
        inLaunchNs = true;
      } catch {
        void closeLaunchNamespace(slot.res.launchNs);
        slot.res.launchNs = undefined;
      }
    }
    slot.image = { key, root, helper: at, inLaunchNs, layerIds: ids };
  }

  /**
   * The warm slot holding the root of image `key`, if one is ready and no image store has revoked it.
   * Taking its claim (one lock, one fstat: slot-claim.privileged.ts) is what makes its layers in use:
   * a store removing one of them either revoked the claim first (the slot is dropped here) or finds
   * it held (and keeps the layer). The record that says so for readers of owner.json only (staged at
   * prepare: it names these very layers) is put in place with one rename by the refill this take
   * schedules, off the create's path (a rename, and even a setImmediate, cost tens of µs on it).
   */
  private takeImageSlot(key: string): Slot | undefined {
    const slot = this.pool.takeImage(key);
    if (!slot) return undefined;
    if (slot.res.claimFd !== undefined && takeSlotClaim(slot.res.claimFd)) {
      this.pool.afterTake(() => useStagedOwnerFile(slot.dir));
      return slot;
    }
    this.discardSlot(slot);
    return undefined;
  }

  private rootfsKey(rootfs: Rootfs): string {
    let key = this.rootfsKeys.get(rootfs);
    if (key === undefined) {
      key = rootfsKey(rootfs);
      if (isDeepFrozen(rootfs)) this.rootfsKeys.set(rootfs, key);
    }
    return key;
  }

  /** Release a slot that will never be handed out. */
  private discardSlot(slot: Slot): void {
    discardSlotUserns(slot);
    this.teardowns.track(slot.res.release());
  }

  /**
   * A sandbox's host state for `spec`, made from a warm slot (or now), handed to `make` for the live
   * sandbox. If anything fails, everything made for it is released before the error is thrown.
   */
  async create<S extends BackendSandbox>(
    spec: SandboxSpec,
    make: (parts: HostSandboxParts) => Promise<S>,
  ): Promise<S> {
    const ws = spec.workspace;
    let hostDir: string | undefined;
    if (ws.hostDir !== undefined) hostDir = checkHostDir(ws.hostDir, realpathOr(this.ctx.stateDir));
    const layers = spec.layers ?? [];
    if (layers.length) this.layerStore.resolveChain(layers, ws, this.tier.name);

    const want = this.tier.hostLimits(spec.limits);
    // A create from an image (no snapshot layers, no read-only mounts to add to its root) may take a
    // slot with that very image's root mounted ahead; the pool prepares one for the next such create.
    const imageKey =
      spec.rootfs && !layers.length && !spec.mounts.length ? this.rootfsKey(spec.rootfs) : undefined;
    // Without a ready slot of its image, it makes its own rather than take the host-root slot (a
    // create on the host root would then wait for a new one).
    let slot =
      (imageKey !== undefined ? this.takeImageSlot(imageKey) : this.pool.take()) ??
      (await this.prepareSlot(want));
    // A slot whose workspace is being mounted ahead: that is nearly done; wait for it.
    if (
      slot.preparing &&
      !(await slot.preparing.then(
        () => true,
        () => false,
      ))
    ) {
      this.discardSlot(slot);
      slot = await this.prepareSlot(want);
    }
    // (On an image root with no snapshot layers it may serve the image's layer views: see below.)
    if (!layers.length && !spec.rootfs) discardLayerUserns(slot);
    let wsUserns = takeWsUserns(slot); // consumed or discarded below (undefined once it is)
    const egress = spec.network !== undefined;
    const intercept = spec.network?.transparent === true;
    this.pool.learn({
      network:
        this.tier.egressAhead === false ? 'none' : intercept ? 'transparent' : egress ? 'proxy' : 'none',
      snapshotForks: layers.length > 0,
      ...(hostDir !== undefined && ws.mode !== 'empty'
        ? { workspace: { hostDir, mode: ws.mode, onSnapshot: layers.length > 0 } }
        : {}),
    });
    // Egress listeners made ahead are for a sandbox with egress, no other (they would hold its ports).
    if (!egress) slot.netns.dropSockets();
    if (imageKey !== undefined) this.pool.noteImage(imageKey, spec.rootfs!);
    // A netns prepared for transparent egress is for a sandbox whose policy asks for it, no other.
    if (slot.intercepting && !intercept) {
      try {
        slot.netns = slot.res.netns = recreateNetns(slot.netns);
        slot.intercepting = false;
      } catch (e) {
        discardLayerUserns(slot);
        discardUserns(wsUserns?.fd);
        await slot.res.release().catch(() => {});
        throw e;
      }
    }
    this.pool.scheduleRefill();
    const { id, uid, dir, disk, res } = slot;
    try {
      if (slot.diskBytes !== spec.limits.diskBytes) resizeTmpfs(disk, spec.limits.diskBytes);
      const l = slot.limits;
      if (l.memoryBytes !== want.memoryBytes || l.pids !== want.pids || l.cpus !== want.cpus) {
        res.cgroup!.setLimits(want);
      }
      // A sandbox on a snapshot: record the layers it uses, then open them (this order lets
      // LayerStore.remove never delete a layer a sandbox is about to mount).
      let layerRoots: string[] = [];
      if (layers.length) {
        writeOwnerFile(dir, { id, uid, owner: selfOwner(), layers });
        const usernsFd = await slot.layerUserns;
        slot.layerUserns = undefined; // mountChain closes it
        layerRoots = await this.layerStore.mountChain(layers, dir, uid, usernsFd);
      }
      let workspaceDir: string;
      let wsSource: CaptureSource;
      // A workspace mounted ahead in the warm slot serves only the very dir (same inode, same owner)
      // and mode it was made for; any other is unmounted first.
      let ahead = slot.ws;
      slot.ws = undefined;
      if (ahead && !(hostDir !== undefined && !layers.length && aheadFits(ahead, hostDir, ws.mode))) {
        await dropWorkspace(slot);
        ahead = undefined;
      }
      if (ahead) {
        discardUserns(wsUserns?.fd);
        wsUserns = undefined;
        ({ workspaceDir, wsSource } = ahead);
      } else if (ws.mode === 'empty' && !layers.length) {
        discardUserns(wsUserns?.fd);
        wsUserns = undefined;
        workspaceDir = mkOwned(join(disk, 'ws'), uid, 0o755);
        wsSource = { area: 'workspace', kind: 'full', dir: workspaceDir };
      } else {
        let host: HostWorkspace | undefined;
        if (ws.mode !== 'empty') {
          const st = statSync(hostDir!);
          const owner: WsOwner = { uid: st.uid, gid: st.gid };
          // Made ahead of time for this very owner and uid, or else now.
          const same = wsUserns && wsUserns.owner.uid === owner.uid && wsUserns.owner.gid === owner.gid;
          if (!same) discardUserns(wsUserns?.fd);
          host = { dir: hostDir!, owner, prepared: same ? wsUserns!.fd : undefined };
        } else discardUserns(wsUserns?.fd);
        wsUserns = undefined; // mountWorkspace closes it
        if (host) this.pool.noteWorkspaceOwner(host.owner);
        ({ workspaceDir, wsSource } = await mountWorkspace(
          slot,
          host,
          ws.mode === 'ro' ? 'ro' : 'rw',
          layerRoots.map((r) => join(r, 'workspace')),
          layers.length ? this.layerStore.rootMode(layers[0]!, 'workspace') : 0o755,
          this.ctx.logger,
        ));
      }
      // /home/user: a plain dir on the disk, or on a snapshot an overlay whose upper is that dir.
      let homeDir = slot.homeDir;
      let homeSource: CaptureSource = { area: 'home', kind: 'full', dir: slot.homeDir };
      if (layers.length) {
        chmodSync(slot.homeDir, this.layerStore.rootMode(layers[0]!, 'home'));
        const work = mkOwned(join(disk, 'home-work'), 0, 0o700);
        homeDir = join(dir, 'home');
        mkdirSync(homeDir, { mode: 0o755 });
        mountOverlay(
          homeDir,
          layerRoots.map((r) => join(r, 'home')),
          { dir: slot.homeDir, work },
        );
        homeSource = { area: 'home', kind: 'diff', dir: slot.homeDir };
      }
      const roMounts = mountReadOnly(spec, dir, realpathOr(this.ctx.stateDir));
      // On an image: its layers and the sandbox's upper dir become "/" (host/image-root.privileged.ts).
      let imageRoot: SandboxLayout['imageRoot'];
      let rootSource: CaptureSource | undefined;
      const imageAhead = slot.image;
      slot.image = undefined;
      if (spec.rootfs && imageAhead) {
        const root = imageAhead.root;
        rootSource = { area: 'root', kind: 'diff', dir: root.upper, exclude: root.generated };
        imageRoot = { dir: root.dir, helper: imageAhead.helper };
      } else if (spec.rootfs) {
        writeOwnerFile(dir, {
          id,
          uid,
          owner: selfOwner(),
          ...(layers.length ? { layers } : {}),
          imageLayers: spec.rootfs.layers,
        });
        const helperPath = this.helperPath();
        const aheadUserns = layers.length ? undefined : slot.layerUserns;
        slot.layerUserns = undefined;
        const rootUserns = await aheadUserns;
        const root = await mountImageRoot({
          ...(rootUserns !== undefined ? { rootUserns } : {}),
          rootfs: spec.rootfs,
          dir,
          disk,
          hostUid: uid,
          mountTargets: roMounts.map(([host, path]) => ({ path, file: !statSync(host).isDirectory() })),
          // On a template or snapshot of this image: what its builds changed in the root.
          ...(layers.length
            ? { snapshotRoots: layers.map((d) => join(this.layerStore.fsDir(d), 'root')) }
            : {}),
        });
        rootSource = { area: 'root', kind: 'diff', dir: root.upper, exclude: root.generated };
        // A read-only bind inside the sandbox dir, so that the launch namespace gets it like any
        // other mount of the sandbox (addMount below).
        const at = join(dir, 'helper');
        writeFileSync(at, '', { mode: 0o444 });
        bindReadOnly(helperPath, at);
        imageRoot = { dir: root.dir, helper: at };
      }
      // What bwrap binds that was mounted under the sandbox dir since the slot was prepared goes
      // into the launch namespace made then (an overlay's lowers need not: its mount holds them).
      // If that fails, the first exec makes a new namespace.
      const added = [
        ...(workspaceDir === join(dir, 'ws') && !ahead ? [workspaceDir] : []),
        ...(homeDir !== slot.homeDir ? [homeDir] : []),
        ...roMounts.map(([host]) => host),
        ...(imageRoot && !imageAhead?.inLaunchNs ? [imageRoot.dir, imageRoot.helper] : []),
      ];
      if (res.launchNs !== undefined && added.length) {
        try {
          for (const p of added) this.launcher!.addMount(res.launchNs, p);
        } catch (e) {
          this.ctx.logger.warn({ err: (e as Error).message }, 'launch namespace remade at the first exec');
          void closeLaunchNamespace(res.launchNs);
          res.launchNs = undefined;
        }
      }
      const layout: SandboxLayout = {
        etcDir: this.etcDir!,
        ...(this.devDir ? { devDir: this.devDir } : {}),
        roMounts,
        workspaceDir,
        workspaceReadOnly: ws.mode === 'ro', // also bound read-only
        tmpDir: slot.tmpDir,
        homeDir,
        shmDir: slot.shmDir,
        ptsDir: slot.ptsDir,
        ...(imageRoot ? { imageRoot } : {}),
        inSandboxNetns: true,
      };
      return await make({
        id,
        hostUid: uid,
        layout,
        res,
        netns: slot.netns,
        spec,
        store: this.layerStore,
        sources: [wsSource, homeSource, ...(rootSource ? [rootSource] : [])],
        disk,
        ...(slot.intercepting
          ? { intercepting: { address: TRANSPARENT_ADDRESS, port: TRANSPARENT_PORT } }
          : {}),
        teardown: (release) => this.teardowns.defer(release),
        processStarted: () => this.pool.processStarted(),
        ...(this.launcher ? { launcher: this.launcher } : {}),
      });
    } catch (e) {
      discardLayerUserns(slot);
      discardUserns(wsUserns?.fd);
      await res.release().catch(() => {});
      throw e;
    }
  }

  /**
   * Release the warm pool (prepared, never used slots) and wait for killed sandboxes' teardowns.
   * Creating again refills it.
   */
  async close(): Promise<void> {
    const slots = await this.pool.drain();
    for (const s of slots) discardSlotUserns(s);
    await Promise.allSettled(slots.map((s) => s.res.release()));
    await this.teardowns.settled();
  }

  /** Remove residue of sandboxes whose owning process died (any tier's on this state dir). */
  reapOrphans(): Promise<ReapReport> {
    return reapOrphans({
      dirs: this.dirs,
      layout: this.layout(),
      cgPrefix: this.cgPrefix,
      layerStore: this.layerStore,
      logger: this.ctx.logger,
    });
  }
}

/** Which image root a rootfs is: its layer dirs and its config (a template's config differs). */
function rootfsKey(rootfs: Rootfs): string {
  return createHash('sha256')
    .update(JSON.stringify([rootfs.layers, rootfs.config]))
    .digest('hex');
}

/** The record of a sandbox dir whose sandbox uses the image layers of `rootfs` (image rm keeps them). */
function inUseRecord(slot: Slot, rootfs: Rootfs): OwnerFile {
  return { id: slot.id, uid: slot.uid, owner: selfOwner(), imageLayers: rootfs.layers };
}
