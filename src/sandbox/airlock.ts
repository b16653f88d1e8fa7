// The Airlock runtime: which backends exist, where host state lives, and the live sandboxes of this
// process. No hidden global: `Sandbox.create` without an explicit runtime uses one created on first
// use with defaults (state dir from AIRLOCK_STATE_DIR or /var/lib/airlock).
import {
  chmodSync,
  mkdirSync,
  readFileSync,
  readdirSync,
  renameSync,
  rmSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import { join } from 'node:path';
import type { BackendProbe, BackendSandbox, BackendV1, Logger, PreparePlan } from '../core/backend.js';
import { silentLogger } from '../core/backend.js';
import { AirlockError } from '../core/errors.js';
import { FdBudget, type FdBudgetOptions } from '../core/fd-budget.js';
import { deepFreeze, isDeepFrozen } from '../core/freeze.js';
import type { ImageResolver, ResolvedImage } from '../core/image.js';
import { defaultImageResolver, rootOfLayer, withExecutables } from './images.js';
import type { SnapshotRecord } from '../core/snapshot.js';
import {
  DIGEST_RE,
  parseOrThrow,
  parseSandboxSpec,
  RootfsSchema,
  type BackendName,
  type Rootfs,
  type SandboxSpec,
  type SandboxSpecInput,
} from '../core/spec.js';
import type { EgressEvent } from '../egress/events.js';
import type { AuditSink } from '../mcp/audit.js';
import type { EgressGateway } from '../egress/gateway.js';
import type { MitmCa } from '../egress/mitm.js';
import type { Dialer, Resolver } from '../egress/vet.js';
import type { SecretLease } from '../secrets/sentinels.js';
import { BACKEND_NAMES } from '../core/backend-names.js';
import { NamespacesBackend } from '../backends/namespaces/index.js';
import { checkPreparePlan } from '../backends/host/host.js';
import { countOpenFds, raiseOpenFileLimit } from '../backends/host/nofile.privileged.js';
import type { UidRange } from '../backends/host/state.js';
import { SandboxBase, type SandboxHooks } from './sandbox.js';
import { SnapshotBase, type SnapshotRuntime } from './snapshot.js';
import type { Templates } from './templates.js';
import {
  REMOTE_RUNTIME_OPTIONS,
  remoteRuntime,
  type PortableSandbox,
  type RemoteRuntime,
  type RemoteRuntimeOptions,
} from './portable.js';

/** `airlock.snapshots`: the snapshots stored in this runtime's state dir (shared by its processes). */
// `Sandbox` and `Snapshot` are defined here, beside the runtime that makes them: a Sandbox is made by
// an Airlock (Sandbox.create uses the default one), and a Snapshot forks Sandboxes. sandbox.ts and
// snapshot.ts hold their mechanics and import neither this file nor each other's classes.

let defaultRuntime: Airlock | undefined;
let envRemote: { readonly key: string; readonly runtime: RemoteRuntime } | undefined;

/**
 * The local runtime `Sandbox.create` uses when it is given none and AIRLOCK_API_URL is not set
 * (created lazily: state dir from AIRLOCK_STATE_DIR, host uids from AIRLOCK_UID_RANGE, as the CLI's).
 * It always runs sandboxes on this host.
 */
export function defaultAirlock(): Airlock {
  if (defaultRuntime === undefined) {
    const uidRange = uidRangeFromEnv(process.env.AIRLOCK_UID_RANGE);
    defaultRuntime = new Airlock(uidRange ? { uidRange } : {});
  }
  return defaultRuntime;
}

/** `AIRLOCK_UID_RANGE=FIRST:COUNT` (as the CLI reads it), or undefined when unset. */
function uidRangeFromEnv(value: string | undefined): UidRange | undefined {
  if (value === undefined || value === '') return undefined;
  const m = /^(\d+):(\d+)$/.exec(value.trim());
  const first = m ? Number(m[1]) : NaN;
  const count = m ? Number(m[2]) : NaN;
  if (!m || first < 1000 || count < 1 || first + count > 2 ** 32 - 2) {
    throw new AirlockError(
      'INVALID_ARGUMENT',
      `AIRLOCK_UID_RANGE: "${value}" is not FIRST:COUNT of unused host uids (FIRST >= 1000); use e.g. 3000000:65536`,
      { field: 'AIRLOCK_UID_RANGE' },
    );
  }
  return { first, count };
}

/**
 * The runtime on the server AIRLOCK_API_URL names (AIRLOCK_API_KEY its key), or undefined when it is
 * not set. One per URL and key: a changed environment gets a new one.
 */
function envRemoteRuntime(env: NodeJS.ProcessEnv = process.env): RemoteRuntime | undefined {
  const apiUrl = env.AIRLOCK_API_URL || undefined;
  if (apiUrl === undefined) return undefined;
  const apiKey = env.AIRLOCK_API_KEY || undefined;
  const key = `${apiUrl}\0${apiKey ?? ''}`;
  if (envRemote?.key !== key) {
    try {
      envRemote = { key, runtime: remoteRuntime({ apiUrl, ...(apiKey !== undefined ? { apiKey } : {}) }) };
    } catch (e) {
      // Say which setting to fix: the variable, not an option the caller never wrote.
      if (AirlockError.is(e, 'INVALID_ARGUMENT') && e.field === 'apiUrl') {
        throw new AirlockError('INVALID_ARGUMENT', `AIRLOCK_API_URL: ${e.message}`, {
          field: 'AIRLOCK_API_URL',
          cause: e,
        });
      }
      throw e;
    }
  }
  return envRemote.runtime;
}

/**
 * Anything that makes sandboxes from a spec: an `Airlock`, or a runtime on a server (the remote SDK's
 * `RemoteAirlock`), so that `Sandbox.create(spec, { airlock })` runs unchanged against either.
 */
export interface SandboxRuntime<S> {
  create(spec?: SandboxSpecInput): Promise<S>;
}

/** `Sandbox`: the public class. `Sandbox.create(spec)` is the E2B-style entry point. */
export class Sandbox extends SandboxBase implements PortableSandbox {
  /**
   * A sandbox from `spec`. Given a runtime, on it. Given none: on the server AIRLOCK_API_URL names
   * (with AIRLOCK_API_KEY) when that is set, else in this process (the default local runtime). So
   * the result is typed as what both have (PortableSandbox); `instanceof Sandbox` narrows to a
   * local one, or pass `{ airlock }` to choose.
   */
  static create(spec: SandboxSpecInput | undefined, opts: { airlock: Airlock }): Promise<Sandbox>;
  static create<S>(spec: SandboxSpecInput | undefined, opts: { airlock: SandboxRuntime<S> }): Promise<S>;
  static create(spec?: SandboxSpecInput, opts?: { airlock?: Airlock }): Promise<PortableSandbox>;
  static create(
    spec: SandboxSpecInput = {},
    opts: { airlock?: SandboxRuntime<unknown> } = {},
  ): Promise<unknown> {
    if (opts.airlock) return opts.airlock.create(spec);
    try {
      return (envRemoteRuntime() ?? defaultAirlock()).create(spec);
    } catch (e) {
      return Promise.reject(e);
    }
  }
}

/** `Snapshot`: an immutable filesystem state taken from a sandbox; `fork()` starts Sandboxes from it. */
export class Snapshot extends SnapshotBase<Sandbox> {}

export interface Snapshots {
  /** Every snapshot, oldest first. */
  list(): Promise<Snapshot[]>;
  /** One snapshot by id ("sha256:…"); SNAPSHOT_NOT_FOUND if there is none. */
  inspect(id: string): Promise<Snapshot>;
  /** Delete a snapshot and free its disk; SNAPSHOT_IN_USE while a live fork or later snapshot uses it. */
  remove(id: string): Promise<void>;
}

/** Options of `new Airlock()`. */
export interface AirlockOptions {
  readonly stateDir?: string;
  readonly logger?: Logger;
  /** Host uids handed to sandboxes, one per live sandbox (default 3000000, 65536 of them). */
  readonly uidRange?: UidRange;
  /** Sandboxes prepared ahead of time so `create` is cheap (default 1; 0 for one-shot tools). */
  readonly warmPool?: number;
  /**
   * Turn on the kernel's cgroup `favordynmods` mode (default true; host-wide, Linux ≥ 6.1): without it
   * each exec's cgroup enrolment can wait milliseconds for an RCU grace period. See docs/threat-model.md.
   */
  readonly favorCgroupMigration?: boolean;
  /**
   * Start each sandbox's bwrap in a mount namespace holding only what it binds from (default true):
   * its cost then depends neither on the host's mounts nor on other live sandboxes. See
   * docs/threat-model.md.
   */
  readonly launchNamespaces?: boolean;
  /**
   * microVM creates restore a baked boot snapshot of their machine shape instead of booting a guest
   * (default true); false boots every one (docs/microvm.md).
   */
  readonly microvmBootSnapshots?: boolean;
  /** Host-wide directory of uid leases, shared by every runtime on the host (default /run/airlock/uid-leases). */
  readonly uidLeaseDir?: string;
  /** All spill files of one sandbox together are cut at this size (default 2 GiB). */
  readonly maxSpillBytes?: number;
  /** Spill files older than this are deleted by the reaper (default 24 h). */
  readonly spillRetentionMs?: number;
  /**
   * Egress plumbing overrides. Tests inject a resolver (names to test addresses) and a dialer that
   * refuses anything outside the test's own network namespace; `upstreamCa` adds trusted CAs for
   * intercepted TLS upstreams. Production uses the system resolver and plain TCP connects.
   */
  readonly egress?: { resolver?: Resolver; dialer?: Dialer; upstreamCa?: readonly string[] };
  /** Environment secrets resolve `fromEnv` against (default: this process's environment). */
  readonly secretEnv?: NodeJS.ProcessEnv;
  /**
   * Airlock's file-descriptor budget (see core/fd-budget.ts): sandboxes' egress connections are
   * refused, each with its reason, before they could take the fds kept for exec and create.
   */
  readonly fdBudget?: FdBudgetOptions;
  /**
   * Resolves `image` references of sandbox specs to unpacked layers. Default: the OCI image store in
   * the state dir (registry settings from AIRLOCK_IMAGE_REGISTRY, AIRLOCK_INSECURE_REGISTRIES,
   * AIRLOCK_REGISTRY_AUTH_FILE, AIRLOCK_MAX_IMAGE_BYTES; see docs/images.md), closed (its watches)
   * by `close()`; one given here is the caller's to close. `false`: a spec with `image` is refused
   * (BACKEND_UNAVAILABLE).
   */
  readonly images?: ImageResolver | false;
  /** Where every sandbox's code-analysis decisions go (`sbx.runCode`; see src/mcp/audit.ts). */
  readonly audit?: AuditSink;
}

/** Where Airlock keeps host state unless `AIRLOCK_STATE_DIR` or `stateDir` says otherwise. */
export const DEFAULT_STATE_DIR = '/var/lib/airlock';
/**
 * Tiers whose backend has prepare() (warm slots), and of those the ones whose slots are the host's
 * (backends/host: SandboxHost.prepare checks the plan). Airlock.prepare refuses a plan for a tier not
 * loaded yet from these, as the tier itself would; test/unit/prepare-plan.test.ts holds them equal
 * to the backends.
 */
export const TIERS_WITH_WARM_SLOTS: readonly BackendName[] = ['namespaces', 'gvisor', 'wasm'];
export const HOST_SLOT_TIERS: readonly BackendName[] = ['namespaces', 'gvisor'];

const HOST_CA_BUNDLE = '/etc/ssl/certs/ca-certificates.crt';
/** Where a sandbox with secrets finds the trust bundle (system CAs + Airlock's egress CA). */
const SANDBOX_CA_BUNDLE = '/etc/ssl/certs/ca-certificates.crt';
const SANDBOX_CA_CERT = '/etc/ssl/certs/airlock-egress-ca.pem';

/**
 * The egress gateway, its MITM CA and secret leases: loaded by the first sandbox with a network (a
 * sandbox without one, e.g. a plain `airlock run`, never loads them: they are a good part of the
 * CLI's start-up).
 */
interface EgressStack {
  readonly EgressGateway: typeof EgressGateway;
  readonly MitmCa: typeof MitmCa;
  readonly SecretLease: typeof SecretLease;
}
const loadEgressStack = async (): Promise<EgressStack> => {
  const [gateway, mitm, sentinels] = await Promise.all([
    import('../egress/gateway.js'),
    import('../egress/mitm.js'),
    import('../secrets/sentinels.js'),
  ]);
  return { EgressGateway: gateway.EgressGateway, MitmCa: mitm.MitmCa, SecretLease: sentinels.SecretLease };
};

/** `airlock.templates`: what Templates offers (every method async). */
export type TemplateStore = Pick<Templates, 'build' | 'list' | 'inspect' | 'remove' | 'resolve'>;

/** A TemplateStore whose Templates is made (its module imported) by the first method call. */
function lazyTemplates(make: () => Promise<Templates>): TemplateStore {
  let made: Promise<Templates> | undefined;
  const store = (): Promise<Templates> => {
    made ??= make();
    made.catch(() => (made = undefined)); // a failed import may be retried
    return made;
  };
  return {
    build: async (...a) => (await store()).build(...a),
    list: async () => (await store()).list(),
    inspect: async (...a) => (await store()).inspect(...a),
    remove: async (...a) => (await store()).remove(...a),
    resolve: async (...a) => (await store()).resolve(...a),
  };
}

/** A runtime: owns a state dir, its sandboxes, snapshots and templates; `close()` releases all of it. */
export class Airlock {
  // The fields marked `!` are set by the constructor, except in the one branch where it returns a
  // remote runtime instead of this object (see the constructor).
  readonly stateDir!: string;
  readonly logger!: Logger;
  /** The tiers loaded so far (namespaces from the start; the others on first use: see tierLoaders). */
  private readonly backends: Partial<Record<BackendName, BackendV1>> = {};
  private readonly loading = new Map<BackendName, Promise<BackendV1>>();
  private readonly tierLoaders!: Readonly<
    Record<Exclude<BackendName, 'namespaces'>, () => Promise<BackendV1>>
  >;
  private readonly live = new Map<string, Sandbox>();
  private readonly redactions = new Map<string, ReturnType<SecretLease['redactionSet']>>();
  /** Each tier's reap of orphans, started at most once (see reapOrphans). */
  private readonly reaped = new Map<BackendName, Promise<void>>();
  private spillsPruned: Promise<void> | undefined;
  private readonly maxSpillBytes!: number;
  private readonly spillRetentionMs!: number;
  private readonly egressOpts: AirlockOptions['egress'];
  private readonly secretEnv!: NodeJS.ProcessEnv;
  private gatewayInstance: EgressGateway | undefined;
  private readonly fdBudget!: FdBudget;
  private ca: MitmCa | undefined;
  private egressStack: EgressStack | undefined;
  private caPublic: { bundle: string; cert: string } | undefined;
  readonly snapshots!: Snapshots;
  /** `airlock.templates`: build, list, inspect and remove templates (namespaces tier). */
  readonly templates!: TemplateStore;
  private readonly snapshotRuntime!: SnapshotRuntime<Sandbox>;
  /** The image resolver `image` references go through (undefined: images are not available). */
  private readonly imageResolver: ImageResolver | undefined;
  /** imageResolver when it is the default one, made here: close() closes it. */
  private readonly ownImageResolver: ImageResolver | undefined;
  /**
   * The root filesystem checked from a resolved image that is frozen throughout (ImageStore hands
   * out the same one while the image is unchanged): a create from it checks nothing again.
   */
  private readonly rootfsChecked = new WeakMap<ResolvedImage, Rootfs>();
  private readonly auditSink: AuditSink | undefined;

  /**
   * A runtime on this host; with `apiUrl` (and `apiKey`), a runtime on that server instead: the
   * object constructed is then the remote SDK's RemoteAirlock (the package entry types it so). An
   * Airlock without apiUrl runs here even when AIRLOCK_API_URL is set: that variable steers only
   * `Sandbox.create` without a runtime (and `airlockFromEnv`).
   */
  constructor(opts: AirlockOptions = {}) {
    const remote = remoteOptions(opts);
    if (remote) {
      // The remote runtime stands in for this one (a constructor may return another object).
      return remoteRuntime(remote) as unknown as Airlock;
    }
    this.stateDir = opts.stateDir ?? process.env.AIRLOCK_STATE_DIR ?? DEFAULT_STATE_DIR;
    this.logger = opts.logger ?? silentLogger;
    this.maxSpillBytes = opts.maxSpillBytes ?? 2 * 1024 ** 3;
    this.spillRetentionMs = opts.spillRetentionMs ?? 24 * 3_600_000;
    this.egressOpts = opts.egress;
    this.secretEnv = opts.secretEnv ?? process.env;
    this.auditSink = opts.audit;
    const images = opts.images;
    this.imageResolver = images === false ? undefined : (images ?? defaultImageResolver(this.stateDir));
    if (images === undefined) this.ownImageResolver = this.imageResolver;
    // At start: the soft RLIMIT_NOFILE up to the hard one; the budget never exceeds what is in force.
    const nofile = raiseOpenFileLimit();
    this.fdBudget = new FdBudget(
      { ...opts.fdBudget, maxFds: Math.min(opts.fdBudget?.maxFds ?? nofile.soft, nofile.soft) },
      countOpenFds,
    );
    const ctx = { stateDir: this.stateDir, logger: this.logger };
    const hostOpts = {
      ...(opts.uidRange ? { uidRange: opts.uidRange } : {}),
      ...(opts.uidLeaseDir ? { uidLeaseDir: opts.uidLeaseDir } : {}),
      ...(opts.warmPool !== undefined ? { warmPool: opts.warmPool } : {}),
      ...(opts.favorCgroupMigration !== undefined ? { favorCgroupMigration: opts.favorCgroupMigration } : {}),
      ...(opts.launchNamespaces !== undefined ? { launchNamespaces: opts.launchNamespaces } : {}),
    };
    this.backends.namespaces = new NamespacesBackend(ctx, hostOpts);
    // The other tiers' modules are imported (and their backends made) when a call first needs that
    // tier: a one-shot on the namespaces tier (airlock run) initialises none of their code.
    this.tierLoaders = {
      gvisor: async () => new (await import('../backends/gvisor/index.js')).GvisorBackend(ctx, hostOpts),
      microvm: async () =>
        new (await import('../backends/microvm/index.js')).MicrovmBackend(ctx, {
          ...hostOpts,
          ...(opts.microvmBootSnapshots !== undefined ? { bootSnapshots: opts.microvmBootSnapshots } : {}),
        }),
      wasm: async () =>
        new (await import('../backends/wasm/index.js')).WasmBackend(
          ctx,
          opts.warmPool !== undefined ? { warmPool: opts.warmPool } : {},
        ),
    };
    this.snapshotRuntime = {
      create: (spec) => this.create(spec),
      exists: async (b, d) => (await (await this.snapshotStore(b)).get(d)) !== undefined,
      users: async (b, d) => (await this.snapshotStore(b)).users(d),
      remove: async (b, d) => (await this.snapshotStore(b)).remove(d),
    };
    const find = async (id: string): Promise<{ backend: BackendName; record: SnapshotRecord }> => {
      if (typeof id !== 'string' || !DIGEST_RE.test(id)) {
        throw new AirlockError('INVALID_ARGUMENT', `"${String(id)}" is not a snapshot id (sha256:<64 hex>)`, {
          field: 'id',
        });
      }
      for (const b of await this.allBackends()) {
        const record = await b.snapshots?.get(id);
        if (record) return { backend: b.name, record };
      }
      throw new AirlockError('SNAPSHOT_NOT_FOUND', `no snapshot ${id} in ${this.stateDir}`, { field: 'id' });
    };
    // Templates' module (and its schemas) is imported by the first call that needs it: a one-shot
    // without --template never does.
    this.templates = lazyTemplates(async () => {
      const { Templates } = await import('./templates.js');
      return new Templates(this.stateDir, {
        create: (spec) => this.create(spec),
        // Layers of any tier (a template build runs on its base's tier; see Templates.build).
        layer: (d) => this.layerRecord(d),
        removeLayer: async (d) =>
          (await this.snapshotStore((await this.layerRecord(d))?.backend ?? 'namespaces')).remove(d),
      });
    });
    this.snapshots = {
      list: async () => {
        const all: SnapshotRecord[] = [];
        for (const b of await this.allBackends()) all.push(...((await b.snapshots?.list()) ?? []));
        all.sort((a, b) => a.createdAt.localeCompare(b.createdAt) || a.digest.localeCompare(b.digest));
        return all.map((r) => this.snapshotOf(r));
      },
      inspect: async (id) => this.snapshotOf((await find(id)).record),
      remove: async (id) => {
        const { backend } = await find(id);
        await (await this.snapshotStore(backend)).remove(id);
      },
    };
  }

  private async snapshotStore(name: BackendName): Promise<NonNullable<BackendV1['snapshots']>> {
    const store = (await this.backend(name)).snapshots;
    if (!store) throw new AirlockError('BACKEND_UNAVAILABLE', `backend "${name}" cannot take snapshots`);
    return store;
  }

  /** The record of a layer digest on whichever tier took it, or undefined. */
  private async layerRecord(digest: string): Promise<SnapshotRecord | undefined> {
    for (const b of await this.allBackends()) {
      const r = await b.snapshots?.get(digest);
      if (r) return r;
    }
    return undefined;
  }

  private snapshotOf(record: SnapshotRecord): Snapshot {
    return new Snapshot(this.snapshotRuntime, record);
  }

  /** Tier `name`, its module imported and its backend made on first use. */
  private backend(name: BackendName): Promise<BackendV1> {
    const loaded = this.backends[name];
    if (loaded) return Promise.resolve(loaded);
    const load = name === 'namespaces' ? undefined : this.tierLoaders[name];
    if (!load) {
      return Promise.reject(
        new AirlockError(
          'BACKEND_UNAVAILABLE',
          `backend "${String(name)}" is not available in this version of Airlock; use backend: "namespaces"`,
          { field: 'backend' },
        ),
      );
    }
    let loading = this.loading.get(name);
    if (loading === undefined) {
      loading = load().then((b) => (this.backends[name] = b));
      // A failed import may be retried by a later call (it left nothing behind).
      loading.catch(() => this.loading.delete(name));
      this.loading.set(name, loading);
    }
    return loading;
  }

  /** Every tier (loading those not loaded yet): for what looks across tiers (snapshots, layers). */
  private allBackends(): Promise<BackendV1[]> {
    return Promise.all(BACKEND_NAMES.map((n) => this.backend(n)));
  }

  /**
   * Tell a tier what its next sandboxes will need (egress, forks of snapshots, a workspace over a
   * host dir), so its warm slots are made ready for exactly that instead of for whatever the last
   * create asked. A hint: a create asking for something else still gets what it asks for.
   */
  prepare(plan: PreparePlan & { readonly backend?: BackendName }): void {
    const { backend = 'namespaces', ...rest } = plan;
    const apply = (b: BackendV1): void => {
      if (!b.prepare)
        throw new AirlockError('BACKEND_UNAVAILABLE', `backend "${backend}" has no warm slots to prepare`);
      b.prepare(rest);
    };
    const loaded = this.backends[backend];
    if (loaded) return apply(loaded);
    // A tier not loaded yet (never namespaces): what would refuse the plan is checked now, so the
    // caller hears of it as before; the plan applies once the tier's module is in.
    if (!TIERS_WITH_WARM_SLOTS.includes(backend))
      throw new AirlockError('BACKEND_UNAVAILABLE', `backend "${backend}" has no warm slots to prepare`);
    if (HOST_SLOT_TIERS.includes(backend)) checkPreparePlan(rest, this.stateDir);
    this.backend(backend)
      .then(apply)
      .catch((e: unknown) => this.logger.warn({ err: e, backend }, 'prepare plan not applied'));
  }

  async probe(name: BackendName): Promise<BackendProbe> {
    if (!(BACKEND_NAMES as readonly string[]).includes(name))
      return { available: false, reason: `backend "${name}" is not implemented yet`, checks: [] };
    return (await this.backend(name)).probe();
  }

  /**
   * Remove what crashed Airlock processes left behind: `backend`'s residue (create calls this with
   * its tier, before that tier's first sandbox), or every tier's. Once per tier per runtime; old
   * spill files are pruned with the first of these.
   */
  async reapOrphans(backend?: BackendName): Promise<void> {
    this.spillsPruned ??= Promise.resolve().then(() => this.pruneSpills());
    const names = backend === undefined ? BACKEND_NAMES : [backend];
    for (const name of names) await this.reapTier(name);
    await this.spillsPruned;
  }

  private reapTier(name: BackendName): Promise<void> {
    let reaped = this.reaped.get(name);
    if (reaped === undefined) {
      reaped = (async () => {
        const b = await this.backend(name);
        const r = await b.reapOrphans();
        if (r.sandboxes)
          this.logger.info({ reaped: r.sandboxes, backend: b.name }, 'reaped orphaned sandboxes');
      })();
      this.reaped.set(name, reaped);
    }
    return reaped;
  }

  async create(input: SandboxSpecInput = {}): Promise<Sandbox> {
    let spec = parseSandboxSpec(input);
    if (spec.image !== undefined) spec = this.withCachedImage(spec) ?? (await this.withImage(spec));
    if (spec.executables !== undefined) spec = await withExecutables(this.stateDir, spec);
    if (spec.template !== undefined) spec = await this.withTemplate(spec, input);
    else if (spec.layers?.length && input.backend === undefined) {
      // On snapshot layers with no tier named: the tier the top layer was taken on, not the default.
      const top = await this.layerRecord(spec.layers[0]!);
      if (top) spec = { ...spec, backend: top.backend };
    }
    if (spec.layers?.length && spec.template === undefined && !spec.rootfs) {
      // A fork of a snapshot taken on an image: on that image again (its layers hold the root's changes).
      const top = await this.layerRecord(spec.layers[0]!);
      const rootfs = top ? await rootOfLayer(top, this.imageResolver) : undefined;
      if (rootfs) spec = { ...spec, rootfs };
    }
    const backend = await this.backend(spec.backend);
    if (spec.layers && !backend.snapshots) {
      throw new AirlockError('BACKEND_UNAVAILABLE', `backend "${spec.backend}" cannot start from snapshots`, {
        field: 'layers',
      });
    }
    // Only this tier's: a one-shot (airlock run) pays for no other tier's reap.
    await this.reapOrphans(spec.backend);
    const bs = await backend.create(spec);
    const id = bs.id;
    const spillDir = join(this.stateDir, 'spill');
    mkdirSync(spillDir, { recursive: true, mode: 0o700 });
    let net: Awaited<ReturnType<Airlock['attachEgress']>> | undefined;
    const ref: { sbx?: Sandbox } = {}; // egress events arrive only after the sandbox exists
    if (spec.network) {
      try {
        net = await this.attachEgress(bs, spec, (e) => ref.sbx?.recordEgress(e));
      } catch (e) {
        await bs.destroy().catch(() => {});
        throw e;
      }
    }
    const sbx = new Sandbox(bs, spec, {
      spillDir,
      maxSpillBytes: this.maxSpillBytes,
      onGone: (gone) => {
        this.live.delete(gone);
        this.redactions.delete(gone);
      },
      ...(net
        ? { env: net.env, onKill: net.close, egressQuiet: net.quiet, setNetworkPolicy: net.setPolicy }
        : {}),
      snapshot: (record) => this.snapshotOf(record),
      ...(this.auditSink ? { audit: this.auditSink } : {}),
    });
    ref.sbx = sbx;
    try {
      for (const f of net?.canaryFiles ?? []) await sbx.files.write(f.path, f.content);
    } catch (e) {
      await sbx.kill().catch(() => {});
      throw e;
    }
    this.live.set(id, sbx);
    if (net?.redaction) this.redactions.set(id, net.redaction);
    return sbx;
  }

  /**
   * A spec naming an image → the spec of a sandbox on its root (`rootfs`): the reference resolves
   * (and is pulled, per `pull`) here, once; the digest that runs is recorded with it.
   */
  private async withImage(spec: SandboxSpec): Promise<SandboxSpec> {
    if (!this.imageResolver) {
      throw new AirlockError(
        'BACKEND_UNAVAILABLE',
        'images are not available in this runtime: it has no image store (the `images` option of new Airlock())',
        { field: 'image' },
      );
    }
    const img = await this.imageResolver.resolve(
      spec.image!,
      spec.pull !== undefined ? { pull: spec.pull } : {},
    );
    return this.onImage(spec, img);
  }

  /**
   * withImage without an asynchronous step, when the resolver knows the image at once (a cached
   * image: ImageResolver.cached); undefined otherwise.
   */
  private withCachedImage(spec: SandboxSpec): SandboxSpec | undefined {
    const img = this.imageResolver?.cached?.(spec.image!, spec.pull !== undefined ? { pull: spec.pull } : {});
    return img && this.onImage(spec, img);
  }

  /** The spec on the root of resolved image `img`. */
  private onImage(spec: SandboxSpec, img: ResolvedImage): SandboxSpec {
    // Checked like any spec field: the resolver is a seam (absolute layer dirs, a well-formed config).
    let rootfs = this.rootfsChecked.get(img);
    if (!rootfs) {
      rootfs = parseOrThrow(
        RootfsSchema,
        { layers: [...img.layers], config: img.config, image: { ref: img.ref, digest: img.digest } },
        `image ${spec.image}`,
      );
      if (isDeepFrozen(img)) this.rootfsChecked.set(img, deepFreeze(rootfs));
    }
    return { ...spec, rootfs };
  }

  /**
   * A spec naming a template → the spec of a sandbox on its layers, with the digest recorded
   * (`spec.template = { name?, digest }`): a name resolves to its digest here, once.
   */
  private async withTemplate(spec: SandboxSpec, input: SandboxSpecInput): Promise<SandboxSpec> {
    const t = spec.template!;
    const ref = typeof t === 'string' ? t : t.digest;
    // Template layers are filesystem layers (built on the namespaces tier): any tier that starts
    // from host layers runs them.
    if (!(await this.backend(spec.backend)).snapshots) {
      throw new AirlockError('BACKEND_UNAVAILABLE', `the ${spec.backend} tier cannot start from templates`, {
        field: 'template',
      });
    }
    const r = await this.templates.resolve(ref);
    const name = typeof t === 'string' ? r.name : t.name;
    // Made on an image: its layers hold that root's changes, so the sandbox runs on the same image
    // (by digest), with the template's config over the image's.
    const top = await this.layerRecord(r.digest);
    const rootfs = top ? await rootOfLayer(top, this.imageResolver, r) : undefined;
    // On the host root a template's ENV lies under the spec's env (on an image it is in the config).
    const env = rootfs ? {} : Object.fromEntries((r.config?.env ?? []).map((e) => e.split(/=(.*)/s, 2)));
    return {
      ...spec,
      ...(rootfs ? { rootfs } : {}),
      env: { ...env, ...spec.env },
      // The tier its layer was taken on, unless the input names one: never silently a weaker tier.
      backend: input.backend === undefined ? r.backend : spec.backend,
      // A template keeps the workspace it was built over (given one must match; see resolveChain).
      workspace: input.workspace === undefined ? { ...r.workspace } : spec.workspace,
      layers: [...r.layers],
      template: name ? { name, digest: r.digest } : { digest: r.digest },
    };
  }

  /**
   * What output guards must scrub for a sandbox of this runtime: its secrets' real values and
   * sentinels, and its canary tokens (empty lists when it has none). Operator-side only.
   */
  redactionSetFor(sandboxId: string): ReturnType<SecretLease['redactionSet']> {
    return this.redactions.get(sandboxId) ?? { secrets: [], sentinels: [], canaries: [] };
  }

  private gateway({ EgressGateway }: EgressStack): EgressGateway {
    this.gatewayInstance ??= new EgressGateway({
      ...(this.egressOpts?.resolver ? { resolver: this.egressOpts.resolver } : {}),
      ...(this.egressOpts?.dialer ? { dialer: this.egressOpts.dialer } : {}),
      ...(this.egressOpts?.upstreamCa ? { upstreamCa: this.egressOpts.upstreamCa } : {}),
      ca: () => this.mitmCa(),
      fdBudget: this.fdBudget,
      logger: this.logger,
    });
    return this.gatewayInstance;
  }

  /** The per-installation CA (created 0600 on first use, outside every sandbox). */
  private mitmCa(): MitmCa {
    // Only the egress stack calls this, after loadEgressStack.
    this.ca ??= this.egressStack!.MitmCa.loadOrCreate(join(this.stateDir, 'ca'));
    return this.ca;
  }

  /** Listeners in the sandbox's netns, sentinels for its secrets, and the CA it must trust. */
  private async attachEgress(
    bs: BackendSandbox,
    spec: SandboxSpec,
    onEvent: (e: EgressEvent) => void,
  ): Promise<{
    env: Record<string, string>;
    close: () => Promise<void>;
    quiet: NonNullable<SandboxHooks['egressQuiet']>;
    setPolicy: NonNullable<SandboxHooks['setNetworkPolicy']>;
    canaryFiles: Array<{ path: string; content: string }>;
    redaction?: ReturnType<SecretLease['redactionSet']>;
  }> {
    const plumbing = bs.egress;
    if (!plumbing) {
      throw new AirlockError(
        'BACKEND_UNAVAILABLE',
        `backend "${spec.backend}" has no egress support yet; remove network`,
        {
          field: 'network',
        },
      );
    }
    const stack = (this.egressStack ??= await loadEgressStack());
    const lease =
      spec.secrets.length || spec.canaries.length
        ? await stack.SecretLease.create(spec.secrets, { env: this.secretEnv, canaries: spec.canaries })
        : undefined;
    try {
      const env: Record<string, string> = {};
      if (lease && spec.secrets.length) {
        const { bundle, cert } = this.caFiles();
        plumbing.bindReadOnlyFiles([
          [bundle, SANDBOX_CA_BUNDLE],
          [cert, SANDBOX_CA_CERT],
        ]);
        Object.assign(env, {
          SSL_CERT_FILE: SANDBOX_CA_BUNDLE,
          CURL_CA_BUNDLE: SANDBOX_CA_BUNDLE,
          REQUESTS_CA_BUNDLE: SANDBOX_CA_BUNDLE,
          NODE_EXTRA_CA_CERTS: SANDBOX_CA_CERT,
        });
      }
      const egress = this.gateway(stack).attach({
        sandboxId: bs.id,
        plumbing,
        policy: spec.network!,
        ...(lease ? { secrets: lease } : {}),
        bodySwap: new Set(spec.secrets.filter((x) => x.body).map((x) => x.name)),
        onEvent,
      });
      Object.assign(env, egress.env(), lease?.env() ?? {});
      return {
        env,
        close: () => egress.close(),
        quiet: { mark: () => egress.activityMark(), since: (m) => egress.quietSince(m) },
        setPolicy: (p) => egress.setPolicy(p),
        canaryFiles: lease?.canaryFiles() ?? [],
        ...(lease ? { redaction: lease.redactionSet() } : {}),
      };
    } catch (e) {
      lease?.revoke();
      throw e;
    }
  }

  /**
   * Public copies of the CA (the key never leaves `ca/`): its cert, and the host bundle plus it.
   * Written once per runtime, each atomically (tmp + rename), because live sandboxes bind them.
   */
  private caFiles(): { bundle: string; cert: string } {
    if (this.caPublic) return this.caPublic;
    const ca = this.mitmCa();
    const dir = join(this.stateDir, 'ca-public');
    mkdirSync(dir, { recursive: true, mode: 0o755 });
    chmodSync(dir, 0o755);
    let hostBundle = '';
    try {
      hostBundle = readFileSync(HOST_CA_BUNDLE, 'utf8');
    } catch {
      /* no system bundle: the sandbox trusts only Airlock's CA */
    }
    const write = (name: string, content: string): string => {
      const path = join(dir, name);
      const tmp = `${path}.${process.pid}.tmp`;
      writeFileSync(tmp, content, { mode: 0o644 });
      renameSync(tmp, path);
      return path;
    };
    this.caPublic = {
      cert: write('airlock-egress-ca.pem', ca.certPem),
      bundle: write('ca-bundle.pem', `${hostBundle.trimEnd()}\n${ca.certPem}`),
    };
    return this.caPublic;
  }

  /** A live sandbox of this runtime; one whose kill (or TTL) has begun is no longer live. */
  get(id: string): Sandbox {
    const s = this.live.get(id);
    // A slow teardown (a microVM's QEMU under TCG) must not let a dying sandbox be found again.
    if (!s || !s.alive)
      throw new AirlockError('SANDBOX_NOT_FOUND', `no live sandbox with id "${id}" in this process`, {
        field: 'id',
      });
    return s;
  }

  /** The live sandboxes of this runtime (not those being killed). */
  list(): Sandbox[] {
    return [...this.live.values()].filter((s) => s.alive);
  }

  /** Kill every live sandbox of this runtime and release prepared (warm) ones, e.g. on shutdown. */
  async killAll(): Promise<void> {
    await Promise.allSettled([...this.live.values()].map((s) => s.kill()));
    await Promise.allSettled(this.loading.values()); // a tier being loaded is closed too
    await Promise.allSettled(Object.values(this.backends).map((b) => b.close()));
    // The egress gateway's fd relay worker (it carries nothing once every sandbox is gone).
    const gw = this.gatewayInstance;
    this.gatewayInstance = undefined; // a later create makes a new one
    await gw?.close().catch(() => {});
    // The image store's watches (a later create from an image watches again).
    await this.ownImageResolver?.close?.().catch(() => {});
  }

  /** Same as killAll: after it, this runtime holds nothing on the host (it can still create again). */
  close(): Promise<void> {
    return this.killAll();
  }

  private pruneSpills(): void {
    const dir = join(this.stateDir, 'spill');
    let names: string[] = [];
    try {
      names = readdirSync(dir);
    } catch {
      return;
    }
    const cutoff = Date.now() - this.spillRetentionMs;
    for (const n of names) {
      const p = join(dir, n);
      try {
        if (statSync(p).mtimeMs < cutoff) rmSync(p, { force: true });
      } catch {
        /* raced with another reaper */
      }
    }
  }
}

/**
 * The remote options of `new Airlock(opts)` when it names a server (apiUrl), else undefined. With a
 * server, an option that only this host could honour (its state dir, uids, warm pool, egress
 * plumbing, environment…) is refused, naming it: the server's operator sets those.
 */
function remoteOptions(opts: AirlockOptions): RemoteRuntimeOptions | undefined {
  const o = opts as AirlockOptions & { apiUrl?: unknown; apiKey?: unknown };
  if (o.apiUrl === undefined) {
    if (o.apiKey !== undefined) {
      throw new AirlockError('INVALID_ARGUMENT', 'apiKey is the key of a server: give its apiUrl too', {
        field: 'apiKey',
      });
    }
    return undefined;
  }
  if (typeof o.apiUrl !== 'string') {
    throw new AirlockError('INVALID_ARGUMENT', 'apiUrl must be a URL string, e.g. http://127.0.0.1:8787', {
      field: 'apiUrl',
    });
  }
  if (o.apiKey !== undefined && typeof o.apiKey !== 'string') {
    throw new AirlockError('INVALID_ARGUMENT', 'apiKey must be a string', { field: 'apiKey' });
  }
  for (const [k, v] of Object.entries(o)) {
    if (v !== undefined && !REMOTE_RUNTIME_OPTIONS.has(k)) {
      throw new AirlockError(
        'INVALID_ARGUMENT',
        `${k} is an option of a runtime on this host; a runtime on a server (apiUrl) takes only ` +
          `${[...REMOTE_RUNTIME_OPTIONS].join(', ')} (the server's operator sets the rest)`,
        { field: k },
      );
    }
  }
  return o as RemoteRuntimeOptions;
}
