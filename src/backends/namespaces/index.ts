// The namespaces tier: bubblewrap + a size-capped tmpfs disk + overlayfs workspace + cgroups + seccomp.
// A sandbox is host state (disk, workspace mount, cgroup, uid lease); each exec is one bwrap process
// tree entering fresh namespaces over that state. See docs/threat-model.md for what this stops.
import { execFileSync } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import {
  chmodSync,
  chownSync,
  closeSync,
  existsSync,
  mkdirSync,
  readFileSync,
  realpathSync,
  renameSync,
  rmdirSync,
  rmSync,
  statSync,
  writeFileSync,
  type Stats,
} from 'node:fs';
import { join } from 'node:path';
import type {
  BackendContext,
  BackendProbe,
  BackendSandbox,
  BackendV1,
  ProbeCheck,
  ReapReport,
  SnapshotStoreV1,
} from '../../core/backend.js';
import { AirlockError } from '../../core/errors.js';
import type { SnapshotRecord } from '../../core/snapshot.js';
import {
  forbiddenMountSourceReason,
  forbiddenWorkspaceReason,
  LimitsSchema,
  type BackendName,
  type Limits,
  type SandboxSpec,
} from '../../core/spec.js';
import type { BwrapLayout } from './bwrap.js';
import {
  attachCgroup,
  createCgroup,
  detectCgroups,
  favorDynmods,
  listCgroups,
  type CgroupLayout,
} from '../host/cgroups.privileged.js';
import { bindReadOnly, mappingUserns, mountIdmappedAll } from '../host/idmap.privileged.js';
import { LAYER_SELF_ID, type CaptureSource } from '../host/layer-capture.privileged.js';
import { closeLaunchNamespace, Launcher } from '../host/launcher.privileged.js';
import { LayerStore } from '../host/layers.js';
import { HostResources, launchSharesKey, NamespacesSandbox, type NamespacesSandboxParts } from './sandbox.js';
import {
  DNS_PORT,
  PROXY_ADDRESS,
  PROXY_PORT,
  TRANSPARENT_ADDRESS,
  TRANSPARENT_PORT,
} from '../../egress/gateway.js';
import {
  createNetns,
  createNetnsOff,
  prepareEgressInNetns,
  recreateNetns,
  type NetnsHandle,
} from '../host/netns.privileged.js';
import {
  mountDevpts,
  mountOverlay,
  mountTmpfs,
  resizeTmpfs,
  unmountAsync,
} from '../host/mount.privileged.js';
import { ensureEtc } from '../host/rootfs.js';
import { onProcessExit, releaseOwnedSync } from '../host/exit-release.privileged.js';
import { startChildReaper } from '../host/reaper.privileged.js';
import { buildSeccompFilter } from '../host/seccomp.privileged.js';
import {
  DEFAULT_UID_RANGE,
  killProcessesOfUids,
  ownerAlive,
  selfOwner,
  StateDirs,
  type Owner,
  type UidRange,
} from '../host/state.js';

interface Slot {
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
   * The netns already holds transparent interception (made ahead once the last create asked for
   * it). Only a sandbox whose policy asks for it gets such a netns; any other gets a fresh one.
   */
  intercepting?: boolean;
  /**
   * The user namespace that idmaps snapshot layers to this slot's uid, made ahead of time once this
   * backend has started a sandbox on a snapshot (its helper process costs milliseconds).
   */
  layerUserns?: Promise<number | undefined>;
  /**
   * The user namespace that idmaps a workspace host dir's owner to this slot's uid, made ahead of
   * time for the owner of the last host-dir workspace this backend mounted (same reason).
   */
  wsUserns?: { readonly owner: WsOwner; readonly fd: Promise<number | undefined> };
  /** The last create's workspace, mounted ahead (prepareWorkspace); only a create asking for it uses it. */
  ws?: WsAhead;
  /** prepareWorkspace in progress (rejects if it left the slot half mounted). */
  preparing?: Promise<void>;
}

/** A workspace over a host dir, as a create asked for it (the dir already resolved and checked). */
interface WsPlan {
  readonly hostDir: string;
  readonly mode: 'ro' | 'cow';
}

/** A workspace mounted ahead: for which dir (its inode and owner when mounted), and where. */
interface WsAhead {
  readonly plan: WsPlan;
  readonly dev: number;
  readonly ino: number;
  readonly owner: WsOwner;
  readonly workspaceDir: string;
  readonly wsSource: CaptureSource;
}

/** Whether a workspace mounted ahead is exactly the one asked for: same dir, inode, owner and mode. */
function aheadFits(a: WsAhead, hostDir: string, mode: string): boolean {
  if (a.plan.hostDir !== hostDir || a.plan.mode !== mode) return false;
  try {
    const st = statSync(hostDir);
    return st.dev === a.dev && st.ino === a.ino && st.uid === a.owner.uid && st.gid === a.owner.gid;
  } catch {
    return false;
  }
}

interface WsOwner {
  readonly uid: number;
  readonly gid: number;
}

/** When the warm pool is refilled after a create if no process of the new sandbox has started. */
const REFILL_FALLBACK_MS = 10;
/**
 * Killed sandboxes' host state is released in batches (see deferTeardown): once this many wait, or
 * TEARDOWN_DELAY_MS after the first of them, whichever comes first.
 */
const TEARDOWN_BATCH = 8;
const TEARDOWN_DELAY_MS = 100;

/** Pseudo-terminals per sandbox (its own devpts instance). */
const MAX_PTYS = 64;

const DEFAULT_LIMITS: Limits = LimitsSchema.parse({});

export interface NamespacesOptions {
  /**
   * Sandboxes' host state prepared ahead of time (default 1): `create` then only applies the spec.
   * Prepared slots hold a uid, an empty tmpfs, a netns (with transparent egress interception when
   * the last create asked for it) and a cgroup; `close()` releases them.
   */
  readonly warmPool?: number;
  readonly uidRange?: UidRange;
  /** Host-wide uid lease dir (default /run/airlock/uid-leases). */
  readonly uidLeaseDir?: string;
  readonly bwrapPath?: string;
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

interface OwnerFile {
  readonly id: string;
  readonly uid: number;
  readonly owner: Owner;
  /** Snapshot layers the sandbox runs on (written before it opens them; see LayerStore.remove). */
  readonly layers?: readonly string[];
}

export class NamespacesBackend implements BackendV1 {
  readonly specificationVersion = 'v1' as const;
  readonly name: BackendName = 'namespaces';
  protected readonly dirs: StateDirs;
  private readonly uidRange: UidRange;
  private readonly bwrapPath: string;
  private cgroupLayout: CgroupLayout | undefined;
  protected etcDir: string | undefined;
  /** The shared read-only /dev tree (undefined: bwrap's --dev in each exec). */
  private devDir: string | undefined;
  private readonly launchNamespaces: boolean;
  /** Starts bwrap in each sandbox's launch namespace (undefined: from the host's). */
  private launcher: Launcher | undefined;
  /** Whether this tier's sandboxes run bwrap (only then are launch namespaces made for them). */
  protected readonly startsBwrap: boolean = true;
  private seccomp: Buffer | undefined;
  private probed: BackendProbe | undefined;
  private readonly pool: Slot[] = [];
  private readonly warmPool: number;
  private readonly favorCgroupMigration: boolean;
  /** A refill due: started when a sandbox's process has started, or REFILL_FALLBACK_MS after create. */
  private refillTimer: NodeJS.Timeout | undefined;
  /** The refill in progress (close() waits for it: it may be about to add a slot). */
  private refilling: Promise<void> | undefined;
  /** Releases of killed sandboxes' host state still in progress (see NamespacesSandbox.destroy). */
  private readonly teardowns = new Set<Promise<void>>();
  /** Releases of killed sandboxes' host state not started yet (see deferTeardown). */
  private readonly deferred: Array<() => Promise<void>> = [];
  private teardownTimer: NodeJS.Timeout | undefined;
  /** Set by the first sandbox on a snapshot: from then on warm slots also prepare layerUserns. */
  private forksSeen = false;
  /** Whether the last create asked for transparent egress: warm slots then prepare it. */
  private interceptAhead = false;
  /** The last create had egress: make the egress listeners ahead in warm slots (prepareEgress). */
  private egressAhead = false;
  /** The owner of the last workspace host dir: warm slots prepare wsUserns for it. */
  private wsOwner: WsOwner | undefined;
  /** The last create's workspace over a host dir: warm slots mount it ahead (prepareWorkspace). */
  private wsAhead: WsPlan | undefined;
  /** Cgroup names are `<prefix><id>`: several state dirs on one host never reap each other's. */
  private readonly cgPrefix: string;
  protected readonly layerStore: LayerStore;
  readonly snapshots: SnapshotStoreV1;

  constructor(
    protected readonly ctx: BackendContext,
    opts: NamespacesOptions = {},
  ) {
    this.dirs = new StateDirs(ctx.stateDir, opts.uidLeaseDir);
    this.uidRange = opts.uidRange ?? DEFAULT_UID_RANGE;
    this.bwrapPath = opts.bwrapPath ?? findBwrap();
    this.warmPool = opts.warmPool ?? 1;
    this.favorCgroupMigration = opts.favorCgroupMigration ?? true;
    this.launchNamespaces = opts.launchNamespaces ?? true;
    this.cgPrefix = `${createHash('sha256').update(ctx.stateDir).digest('hex').slice(0, 8)}-`;
    const store = new LayerStore(ctx.stateDir, (d) => this.liveUsers(d));
    this.layerStore = store;
    // One layer store per state dir, shared by the tiers that use host layers; each lists its own.
    const mine = (r: SnapshotRecord | undefined): SnapshotRecord | undefined =>
      r?.backend === this.name ? r : undefined;
    this.snapshots = {
      list: async () => store.list().filter((r) => r.backend === this.name),
      get: async (d) => mine(store.get(d)),
      // A killed sandbox lists its layers until its teardown has unmounted them.
      users: async (d) => (await this.teardownsSettled(), store.users(d)),
      remove: async (d) => {
        await this.teardownsSettled();
        await store.remove(d, async () => void (await this.reapOrphans()));
      },
    };
  }

  private trackTeardown(release: Promise<void>): void {
    const t: Promise<void> = release
      .catch((e: unknown) => {
        this.ctx.logger.warn({ err: (e as Error).message }, 'sandbox cleanup incomplete');
      })
      .finally(() => this.teardowns.delete(t));
    this.teardowns.add(t);
  }

  /**
   * A killed sandbox's host state (its disk, mounts, netns, cgroup dirs, uid lease; every process of
   * it is gone by now), released together with others' a little later: a release is kernel work
   * (unmounts, each with an RCU grace period, cgroup removal, netns teardown) that slows whatever runs
   * beside it; released in batches it lands on fewer of the sandboxes that run meanwhile (measured,
   * back-to-back create → exec → kill, batches of 8: p50 -0.8 ms plain and -1.2 ms with egress and
   * overlay, mean -0.2 / -0.7 ms, p90 +0.5 / +1.1 ms). At most TEARDOWN_BATCH wait, none longer than
   * TEARDOWN_DELAY_MS (this timer keeps the process alive until they have started); close() and
   * whatever needs them gone start them at once.
   */
  private deferTeardown(release: () => Promise<void>): void {
    this.deferred.push(release);
    if (this.deferred.length >= TEARDOWN_BATCH) this.startTeardowns();
    else this.teardownTimer ??= setTimeout(() => this.startTeardowns(), TEARDOWN_DELAY_MS);
  }

  private startTeardowns(): void {
    clearTimeout(this.teardownTimer);
    this.teardownTimer = undefined;
    for (const release of this.deferred.splice(0)) this.trackTeardown(Promise.resolve().then(release));
  }

  /** Resolves once every teardown started or deferred so far (and any started meanwhile) has settled. */
  private async teardownsSettled(): Promise<void> {
    this.startTeardowns();
    while (this.teardowns.size) await Promise.allSettled([...this.teardowns]);
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

  async probe(): Promise<BackendProbe> {
    if (this.probed) return this.probed;
    const checks: ProbeCheck[] = [];
    const isRoot = process.getuid?.() === 0;
    checks.push({
      name: 'root',
      ok: isRoot,
      detail: isRoot
        ? 'running as root'
        : 'the namespaces tier mounts overlayfs and writes cgroups: run Airlock as root',
    });
    try {
      const v = execFileSync(this.bwrapPath, ['--version'], { encoding: 'utf8' }).trim();
      checks.push({ name: 'bwrap', ok: true, detail: `${v} at ${this.bwrapPath}` });
    } catch {
      checks.push({ name: 'bwrap', ok: false, detail: 'bubblewrap not found: apt-get install bubblewrap' });
    }
    const userns = readTrim('/proc/sys/user/max_user_namespaces');
    const usernsOk =
      userns !== undefined &&
      Number(userns) > 0 &&
      readTrim('/proc/sys/kernel/unprivileged_userns_clone') !== '0';
    checks.push({
      name: 'userns',
      ok: usernsOk,
      detail: usernsOk
        ? `unprivileged user namespaces enabled (max ${userns})`
        : 'unprivileged user namespaces are disabled (sysctl user.max_user_namespaces / kernel.unprivileged_userns_clone)',
    });
    const layout = this.layout();
    checks.push({
      name: 'cgroups',
      ok: layout.version !== 0,
      detail:
        layout.version === 1
          ? `cgroup v1 (${Object.entries(layout.mounts)
              .map(([c, m]) => `${c}:${m}`)
              .join(' ')})`
          : layout.version === 2
            ? `cgroup v2 at ${layout.root}`
            : layout.reason,
    });
    if (isRoot && layout.version !== 0 && this.favorCgroupMigration) {
      const f = favorDynmods();
      checks.push({ name: 'cgroup-migration', ok: f.on, optional: true, detail: f.detail });
    }
    const overlayOk =
      /\toverlay$/m.test(readTrim('/proc/filesystems') ?? '') || existsSync('/sys/module/overlay');
    checks.push({
      name: 'overlayfs',
      ok: overlayOk,
      detail: overlayOk
        ? 'overlay filesystem available'
        : 'overlayfs not in /proc/filesystems (modprobe overlay)',
    });
    const seccompOk = existsSync('/proc/sys/kernel/seccomp/actions_avail');
    checks.push({
      name: 'seccomp',
      ok: seccompOk,
      detail: seccompOk
        ? `filter actions: ${readTrim('/proc/sys/kernel/seccomp/actions_avail')}`
        : 'kernel lacks seccomp filters',
    });
    // Transparent interception is configured over netlink (no ip/nft binaries): it needs the
    // kernel's netfilter (nf_tables with NAT); a kernel without it fails the create that asks for it.
    const netfilter = existsSync('/proc/sys/net/netfilter');
    checks.push({
      name: 'egress',
      ok: netfilter,
      optional: true,
      detail: netfilter
        ? 'netfilter in the kernel: transparent egress interception available (nf_tables over netlink)'
        : 'no netfilter in this kernel: network policies need `transparent: false`',
    });
    const failed = checks.filter((c) => !c.ok && !c.optional);
    this.probed = failed.length
      ? { available: false, reason: failed.map((c) => `${c.name}: ${c.detail}`).join('; '), checks }
      : { available: true, checks };
    return this.probed;
  }

  private layout(): CgroupLayout {
    this.cgroupLayout ??= detectCgroups();
    return this.cgroupLayout;
  }

  /**
   * Host state for one sandbox that does not depend on its spec (uid lease, dirs, a tmpfs disk,
   * netns, cgroup), made ahead of time so that `create` only applies the spec. The file operations
   * on the state dir's (journaling) disk run off the event loop.
   */
  private async prepareSlot(limits: Limits): Promise<Slot> {
    if (this.etcDir === undefined) {
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
        this.ctx.logger.warn(
          { reason: dev.reason },
          'no shared /dev tree: each exec builds its own (slower)',
        );
      // A launch namespace holds no device nodes but /dev/null: bwrap's own --dev (the fallback
      // when there is no /dev tree) would find none to bind there.
      if (this.launchNamespaces && this.devDir && this.startsBwrap) {
        try {
          const l = Launcher.get();
          if (!(l instanceof Launcher)) throw new Error(l.failed);
          // What every launch namespace made ahead has (a sandbox's layout may add more).
          for (const d of launchSharesKey({ etcDir: this.etcDir, devDir: this.devDir }).split('\0'))
            l.share(d);
          this.launcher = l;
        } catch (e) {
          this.ctx.logger.warn(
            { reason: (e as Error).message },
            'bwrap starts in the host mount namespace (slower)',
          );
        }
      }
    }
    const id = `sbx-${randomBytes(8).toString('hex')}`;
    const owner = selfOwner();
    const uid = await this.dirs.leaseUid(this.uidRange, id, owner).catch(async (e: unknown) => {
      // Killed sandboxes keep their uids until their (batched) release: run those now, then retry.
      if (!AirlockError.is(e, 'CAPACITY_EXHAUSTED') || !(this.deferred.length || this.teardowns.size))
        throw e;
      await this.teardownsSettled();
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
      this.trackTeardown(res.release()); // close() waits for it like for a killed sandbox's
      throw e;
    }
  }

  /** A sandbox's process has started: run a due refill now, while that command runs on another core. */
  private processStarted(): void {
    if (this.refillTimer === undefined) return;
    clearTimeout(this.refillTimer);
    this.refill();
  }

  /**
   * Keep `warmPool` slots ready. Runs once the new sandbox's first process has started (not while
   * it is starting: the event loop's turns then are on that command's critical path), or shortly
   * after create if none starts. One refill at a time.
   */
  private refill(): void {
    this.refillTimer = undefined;
    if (this.refilling) return; // its loop sees the slot just taken
    const run = async (): Promise<void> => {
      try {
        while (this.pool.length < this.warmPool)
          this.pool.push(await this.prepareSlot(this.hostLimits(DEFAULT_LIMITS)));
        if (this.forksSeen) for (const slot of this.pool) prepareLayerUserns(slot);
        // (A slot whose workspace is mounted ahead has used its user namespace already.)
        if (this.wsOwner) for (const slot of this.pool) if (!slot.ws) prepareWsUserns(slot, this.wsOwner);
        if (this.egressAhead) for (const slot of this.pool) prepareEgress(slot, this.interceptAhead);
        const plan = this.wsAhead;
        // A create that takes a slot being mounted into waits for that first (see create).
        for (const slot of plan ? this.pool.filter((s) => !s.ws) : []) {
          if (!this.pool.includes(slot)) continue; // taken meanwhile
          const preparing = this.prepareWorkspace(slot, plan!);
          slot.preparing = preparing;
          try {
            await preparing;
          } catch (e) {
            // Half mounted and not undone: not a slot to hand out (a create that took it meanwhile
            // releases it itself).
            const i = this.pool.indexOf(slot);
            if (i >= 0) {
              this.pool.splice(i, 1);
              this.discardSlot(slot);
            }
            throw e;
          } finally {
            slot.preparing = undefined;
          }
        }
      } catch (e) {
        this.ctx.logger.warn({ err: (e as Error).message }, 'warm pool refill failed');
      }
    };
    const p: Promise<void> = run().finally(() => {
      if (this.refilling === p) this.refilling = undefined;
    });
    this.refilling = p;
  }

  /**
   * The cgroup limits that hold a sandbox with these limits: the same on this tier; a tier whose
   * runtime lives in the sandbox's cgroup (gVisor) adds its own footprint.
   */
  protected hostLimits(l: Limits): Limits {
    return l;
  }

  /**
   * The workspace at <dir>/ws: an overlay over `lowers` (snapshot layers) and, with `host`, the host
   * dir seen through an idmapped mount at <dir>/lower, so the sandbox uid owns what the dir's owner
   * owns (the plain dir where the filesystem cannot idmap). `rw`: writes go to an upper on the disk.
   */
  private async mountWorkspace(
    slot: Slot,
    host: { dir: string; owner: WsOwner; prepared: Promise<number | undefined> | undefined } | undefined,
    mode: 'ro' | 'rw',
    lowers: string[],
    rootMode: number,
  ): Promise<{ workspaceDir: string; wsSource: CaptureSource; hostLower?: string }> {
    const { dir, disk, uid } = slot;
    let hostLower: string | undefined;
    if (host) {
      const lower = join(dir, 'lower');
      mkdirSync(lower, { mode: 0o755 });
      const prepared = await host.prepared;
      // Always read-only: overlayfs never writes to its lower layers, and a writable host-side alias
      // of the caller's dir owned by the sandbox uid would be one mistake away from a write-through.
      const mapped =
        (await mountIdmappedAll([{ source: host.dir, target: lower }], host.owner, uid, true, prepared)) ===
        undefined;
      if (!mapped)
        this.ctx.logger.warn(
          { hostDir: host.dir },
          'idmapped mount unavailable; workspace keeps host owners',
        );
      hostLower = mapped ? lower : host.dir;
      lowers.push(hostLower);
    }
    const workspaceDir = join(dir, 'ws');
    mkdirSync(workspaceDir, { mode: 0o755 });
    if (mode === 'ro') {
      // overlayfs needs two lowers when it has no upper: add an empty one if needed.
      if (lowers.length < 2) {
        const empty = join(dir, 'empty');
        mkdirSync(empty, { mode: 0o755 });
        lowers.push(empty);
      }
      mountOverlay(workspaceDir, lowers);
      return {
        workspaceDir,
        wsSource: { area: 'workspace', kind: 'none', dir: workspaceDir },
        ...(hostLower ? { hostLower } : {}),
      };
    }
    const upper = mkOwned(join(disk, 'upper'), uid, rootMode);
    const work = mkOwned(join(disk, 'work'), 0, 0o700);
    mountOverlay(workspaceDir, lowers, { dir: upper, work });
    return {
      workspaceDir,
      wsSource: { area: 'workspace', kind: 'diff', dir: upper },
      ...(hostLower ? { hostLower } : {}),
    };
  }

  /**
   * Mount the last create's workspace in a warm slot ahead of time, into its launch namespace too
   * (the create that takes the slot then mounts nothing: see aheadFits). Best effort: on failure the
   * slot is left as it was and create mounts the workspace itself.
   */
  private async prepareWorkspace(slot: Slot, plan: WsPlan): Promise<void> {
    let st: Stats;
    try {
      st = statSync(plan.hostDir);
    } catch {
      return; // gone: the next create says so
    }
    const owner: WsOwner = { uid: st.uid, gid: st.gid };
    const w = takeWsUserns(slot);
    const same = w && w.owner.uid === owner.uid && w.owner.gid === owner.gid;
    if (!same) discardUserns(w?.fd);
    try {
      const { hostLower, ...m } = await this.mountWorkspace(
        slot,
        { dir: plan.hostDir, owner, prepared: same ? w!.fd : undefined },
        plan.mode === 'ro' ? 'ro' : 'rw',
        [],
        0o755,
      );
      // What is mounted must be the dir that was stat'ed (not one renamed into its place meanwhile):
      // the idmapped clone, or where the filesystem cannot idmap, the host dir itself.
      const seen = statSync(hostLower!);
      if (seen.dev !== st.dev || seen.ino !== st.ino)
        throw new Error(`${plan.hostDir} changed while mounted`);
      if (slot.res.launchNs !== undefined)
        await this.launcher!.addMountAsync(slot.res.launchNs, m.workspaceDir);
      slot.ws = { plan, dev: st.dev, ino: st.ino, owner, ...m };
    } catch (e) {
      this.ctx.logger.debug({ err: (e as Error).message }, 'workspace not mounted ahead');
      await this.dropWorkspace(slot); // throws if it cannot be undone
    }
  }

  /** Release a slot that will never be handed out. */
  private discardSlot(slot: Slot): void {
    discardSlotUserns(slot);
    this.trackTeardown(slot.res.release());
  }

  /**
   * Undo whatever of a workspace is mounted in a slot (prepareWorkspace's, or half of it), and drop
   * its launch namespace, which may hold a clone of it (the first exec makes a new one).
   */
  private async dropWorkspace(slot: Slot): Promise<void> {
    const ns = slot.res.launchNs;
    slot.res.launchNs = undefined;
    await closeLaunchNamespace(ns);
    await unmountAsync(join(slot.dir, 'ws'));
    await unmountAsync(join(slot.dir, 'lower'));
    // Never a recursive removal where a mount may have been: an empty dir or nothing, else it fails.
    for (const name of ['ws', 'lower', 'empty']) {
      try {
        rmdirSync(join(slot.dir, name));
      } catch (e) {
        if ((e as NodeJS.ErrnoException).code !== 'ENOENT') throw e;
      }
    }
    // On the slot's own disk (no mount there): what an overlay left in its upper and work dirs.
    for (const name of ['upper', 'work']) rmSync(join(slot.disk, name), { recursive: true, force: true });
  }

  /** The live sandbox over prepared host state (a tier that runs processes differently overrides). */
  protected makeSandbox(parts: NamespacesSandboxParts): Promise<NamespacesSandbox> {
    return Promise.resolve(new NamespacesSandbox(parts));
  }

  async create(spec: SandboxSpec): Promise<BackendSandbox> {
    const probe = await this.probe();
    if (!probe.available)
      throw new AirlockError('BACKEND_UNAVAILABLE', `${this.name} backend unavailable: ${probe.reason}`);
    this.seccomp ??= buildSeccompFilter();

    const ws = spec.workspace;
    let hostDir: string | undefined;
    if (ws.hostDir !== undefined) hostDir = checkHostDir(ws.hostDir, realpathOr(this.ctx.stateDir));
    const layers = spec.layers ?? [];
    if (layers.length) this.layerStore.resolveChain(layers, ws, this.name);

    const want = this.hostLimits(spec.limits);
    let slot = this.pool.pop() ?? (await this.prepareSlot(want));
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
    if (layers.length) this.forksSeen = true;
    else discardLayerUserns(slot);
    let wsUserns = takeWsUserns(slot); // consumed or discarded below (undefined once it is)
    this.egressAhead = spec.network !== undefined;
    this.interceptAhead = spec.network?.transparent === true;
    // Egress listeners made ahead are for a sandbox with egress, no other (they would hold its ports).
    if (!this.egressAhead) slot.netns.dropSockets();
    // A netns prepared for transparent egress is for a sandbox whose policy asks for it, no other.
    if (slot.intercepting && !this.interceptAhead) {
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
    if (this.warmPool > 0 && this.refillTimer === undefined)
      this.refillTimer = setTimeout(() => this.refill(), REFILL_FALLBACK_MS);
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
        await this.dropWorkspace(slot);
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
        let host:
          { dir: string; owner: WsOwner; prepared: Promise<number | undefined> | undefined } | undefined;
        if (ws.mode !== 'empty') {
          const st = statSync(hostDir!);
          const owner: WsOwner = { uid: st.uid, gid: st.gid };
          // Made ahead of time for this very owner and uid, or else now.
          const same = wsUserns && wsUserns.owner.uid === owner.uid && wsUserns.owner.gid === owner.gid;
          if (!same) discardUserns(wsUserns?.fd);
          host = { dir: hostDir!, owner, prepared: same ? wsUserns!.fd : undefined };
        } else discardUserns(wsUserns?.fd);
        wsUserns = undefined; // mountWorkspace closes it
        if (host) this.wsOwner = host.owner;
        ({ workspaceDir, wsSource } = await this.mountWorkspace(
          slot,
          host,
          ws.mode === 'ro' ? 'ro' : 'rw',
          layerRoots.map((r) => join(r, 'workspace')),
          layers.length ? this.layerStore.rootMode(layers[0]!, 'workspace') : 0o755,
        ));
      }
      // Warm slots mount this one ahead from now on (a workspace over a host dir, not on a snapshot).
      this.wsAhead =
        hostDir !== undefined && ws.mode !== 'empty' && !layers.length
          ? { hostDir, mode: ws.mode }
          : undefined;
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
      // Read-only host mounts (e.g. an MCP server's package): each a detached read-only clone under
      // the sandbox dir, which bwrap then binds at its sandbox path.
      const roMounts: Array<readonly [string, string]> = [];
      for (const [i, m] of spec.mounts.entries()) {
        const src = checkMountSource(m.hostPath, realpathOr(this.ctx.stateDir), i);
        const target = join(dir, `ro-${i}`);
        if (statSync(src).isDirectory()) mkdirSync(target, { mode: 0o755 });
        else writeFileSync(target, '', { mode: 0o444 });
        bindReadOnly(src, target);
        roMounts.push([target, m.path]);
      }
      // What bwrap binds that was mounted under the sandbox dir since the slot was prepared goes
      // into the launch namespace made then (an overlay's lowers need not: its mount holds them).
      // If that fails, the first exec makes a new namespace.
      const added = [
        ...(workspaceDir === join(dir, 'ws') && !ahead ? [workspaceDir] : []),
        ...(homeDir !== slot.homeDir ? [homeDir] : []),
        ...roMounts.map(([host]) => host),
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
      const layout: BwrapLayout = {
        etcDir: this.etcDir!,
        ...(this.devDir ? { devDir: this.devDir } : {}),
        roMounts,
        workspaceDir,
        workspaceReadOnly: ws.mode === 'ro', // also bound read-only
        tmpDir: slot.tmpDir,
        homeDir,
        shmDir: slot.shmDir,
        ptsDir: slot.ptsDir,
        inSandboxNetns: true,
      };
      return await this.makeSandbox({
        id,
        hostUid: uid,
        layout,
        res,
        bwrapPath: this.bwrapPath,
        seccomp: this.seccomp,
        netns: slot.netns,
        spec,
        store: this.layerStore,
        sources: [wsSource, homeSource],
        disk,
        ...(slot.intercepting
          ? { intercepting: { address: TRANSPARENT_ADDRESS, port: TRANSPARENT_PORT } }
          : {}),
        teardown: (release) => this.deferTeardown(release),
        processStarted: () => this.processStarted(),
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
    clearTimeout(this.refillTimer);
    this.refillTimer = undefined;
    while (this.refilling) await this.refilling;
    const slots = this.pool.splice(0);
    for (const s of slots) discardSlotUserns(s);
    await Promise.allSettled(slots.map((s) => s.res.release()));
    await this.teardownsSettled();
  }

  async reapOrphans(): Promise<ReapReport> {
    const layout = this.layout();
    const live = new Set<string>();
    const orphans: Array<{ id: string; dir: string; uid: number | undefined }> = [];
    for (const id of this.dirs.listSandboxIds()) {
      const dir = this.dirs.sandboxDir(id);
      const meta = readOwnerFile(dir);
      if ((meta && ownerAlive(meta.owner)) || (!meta && recentlyCreated(dir))) {
        live.add(id); // alive, or being created right now by another process (owner.json is next)
        continue;
      }
      orphans.push({ id, dir, uid: meta?.uid });
    }
    const deadLeases = this.dirs.listLeases().filter((l) => !ownerAlive(l.owner) && !live.has(l.sandboxId));
    // Nothing may still run as a uid that is about to be handed out again, whatever cgroup it is in.
    const uids = new Set<number>([
      ...orphans.flatMap((o) => (o.uid === undefined ? [] : [o.uid])),
      ...deadLeases.map((l) => l.uid),
    ]);
    killProcessesOfUids(uids);

    const cgroups = listCgroups(layout, this.cgPrefix);
    let reaped = 0;
    for (const o of orphans) {
      const res = new HostResources(o.dir, o.uid, this.dirs);
      const cg = cgroups.get(o.id);
      if (cg) res.cgroup = attachCgroup(layout, cg);
      try {
        await res.release();
        reaped++;
      } catch (e) {
        this.ctx.logger.warn({ id: o.id, err: (e as Error).message }, 'could not fully reap sandbox');
      }
    }
    // Cgroups without a sandbox dir, and leases whose owner died.
    for (const [id, cgDirs] of cgroups) {
      if (live.has(id) || existsSync(this.dirs.sandboxDir(id))) continue;
      await attachCgroup(layout, cgDirs)
        .destroy()
        .catch(() => {});
    }
    for (const l of deadLeases) await this.dirs.releaseUid(l.uid);
    this.dirs.pruneLeaseTemps();
    // After the orphans' mounts are gone: interrupted captures and removals (never a whole layer).
    this.layerStore.reap();
    return { sandboxes: reaped };
  }
}

function mkOwned(path: string, uid: number, mode: number): string {
  mkdirSync(path);
  chownSync(path, uid, uid);
  chmodSync(path, mode); // after chown, and not subject to the umask
  return path;
}

function checkHostDir(p: string, stateDir: string): string {
  let real: string;
  try {
    real = realpathSync(p);
  } catch {
    throw new AirlockError('INVALID_SPEC', `workspace.hostDir "${p}" does not exist`, {
      field: 'workspace.hostDir',
    });
  }
  if (!statSync(real).isDirectory()) {
    throw new AirlockError('INVALID_SPEC', `workspace.hostDir "${p}" is not a directory`, {
      field: 'workspace.hostDir',
    });
  }
  const why = forbiddenWorkspaceReason(real, stateDir);
  if (why) {
    throw new AirlockError('INVALID_SPEC', `${why} (resolved from "${p}")`, { field: 'workspace.hostDir' });
  }
  return real;
}

function checkMountSource(p: string, stateDir: string, i: number): string {
  const field = `mounts.${i}.hostPath`;
  let real: string;
  try {
    real = realpathSync(p);
  } catch {
    throw new AirlockError('INVALID_SPEC', `${field} "${p}" does not exist`, { field });
  }
  const st = statSync(real);
  if (!st.isDirectory() && !st.isFile()) {
    throw new AirlockError('INVALID_SPEC', `${field} "${p}" is neither a file nor a directory`, { field });
  }
  const why = forbiddenMountSourceReason(real, stateDir);
  if (why) throw new AirlockError('INVALID_SPEC', `${why} (resolved from "${p}")`, { field });
  return real;
}

function prepareLayerUserns(slot: Slot): void {
  slot.layerUserns ??= mappingUserns(LAYER_SELF_ID, LAYER_SELF_ID, slot.uid).catch(() => undefined);
}

/** The listening sockets of every sandbox's egress (gateway.ts: its proxy and its DNS). */
const EGRESS_SOCKETS = [
  { kind: 'tcp', address: PROXY_ADDRESS, port: PROXY_PORT },
  { kind: 'udp', address: PROXY_ADDRESS, port: DNS_PORT },
] as const;
const TRANSPARENT_SOCKET = { kind: 'tcp', address: TRANSPARENT_ADDRESS, port: TRANSPARENT_PORT } as const;

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
      interceptNow ? { address: TRANSPARENT_ADDRESS, port: TRANSPARENT_PORT } : undefined,
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
function discardSlotUserns(slot: Slot): void {
  discardLayerUserns(slot);
  discardUserns(takeWsUserns(slot)?.fd);
}

function discardLayerUserns(slot: Slot): void {
  discardUserns(slot.layerUserns);
  slot.layerUserns = undefined;
}

function prepareWsUserns(slot: Slot, owner: WsOwner): void {
  if (slot.wsUserns && (slot.wsUserns.owner.uid !== owner.uid || slot.wsUserns.owner.gid !== owner.gid)) {
    discardUserns(takeWsUserns(slot)?.fd);
  }
  slot.wsUserns ??= { owner, fd: mappingUserns(owner.uid, owner.gid, slot.uid).catch(() => undefined) };
}

function takeWsUserns(slot: Slot): Slot['wsUserns'] {
  const w = slot.wsUserns;
  slot.wsUserns = undefined;
  return w;
}

function discardUserns(fd: Promise<number | undefined> | undefined): void {
  void fd?.then((n) => n !== undefined && closeSync(n));
}

function writeOwnerFile(dir: string, meta: OwnerFile): void {
  // Atomic (tmp + rename): the reaper and LayerStore.remove read it concurrently.
  const tmp = join(dir, 'owner.json.tmp');
  writeFileSync(tmp, JSON.stringify(meta), { mode: 0o600 });
  renameSync(tmp, join(dir, 'owner.json'));
}

function readOwnerFile(dir: string): OwnerFile | undefined {
  try {
    return JSON.parse(readFileSync(join(dir, 'owner.json'), 'utf8')) as OwnerFile;
  } catch {
    return undefined;
  }
}

function realpathOr(p: string): string {
  try {
    return realpathSync(p);
  } catch {
    return p;
  }
}

function recentlyCreated(dir: string): boolean {
  try {
    return Date.now() - statSync(dir).mtimeMs < 10_000;
  } catch {
    return false;
  }
}

function readTrim(p: string): string | undefined {
  try {
    return readFileSync(p, 'utf8').trim();
  } catch {
    return undefined;
  }
}

function findBwrap(): string {
  for (const p of ['/usr/bin/bwrap', '/usr/local/bin/bwrap']) if (existsSync(p)) return p;
  return 'bwrap';
}
