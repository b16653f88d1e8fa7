// TenantScopedApi: the front server's SandboxApi. It wraps the supervisor's API (RemoteSandboxApi)
// and adds what only the front server knows: which tenant owns which sandbox (the store), quotas,
// the operator's policy on create requests, TTL mirroring, and `lost` sandboxes of a dead supervisor.
//
// The one scoping rule: a sandbox id the caller's tenant does not own answers SANDBOX_NOT_FOUND,
// exactly like an id that never existed (same code, same message shape), so ids are no oracle.
import type { NetworkPolicyInput } from '../core/network-spec.js';
import type { NetworkPolicyView } from './network-wire.js';
import type { EgressEvent } from '../egress/events.js';
import { AirlockError } from '../core/errors.js';
import type { CodeContextRef } from '../core/code.js';
import type { CodeEvent, CreateCodeContextRequest, RunCodeRequest } from './code-wire.js';
import type {
  Caller,
  CreateRequest,
  ExecEvent,
  ExecRequest,
  FileEntryView,
  FsEvent,
  ProcessView,
  SandboxApi,
  SandboxView,
  SnapshotView,
  TemplateBuildRequest,
  TemplateEvent,
  TemplateView,
} from './contract.js';
import { startAndFollow } from './contract.js';
import { QuotaError, usageOf, type Quotas } from './quotas.js';
import type { SandboxRow, Store } from './store.js';
import { TenantTemplates } from './templates.js';
import { checkImageAllowed } from './image-policy.js';

export interface TenantPolicy {
  /** Let clients send network.allowPrivate (default false: private/loopback targets stay refused). */
  readonly allowPrivateNetwork: boolean;
  /** Default queueTimeoutMs of a create (default 5000). */
  readonly defaultQueueTimeoutMs: number;
  /** Registries `image` may name (server config images.registries); none or absent: no images. */
  readonly imageRegistries?: readonly string[];
}

export interface TenantHooks {
  /** The supervisor's current boot id (stored with each sandbox). */
  bootId(): string;
  /** Ask the supervisor now whether it restarted (and mark the old boot's sandboxes lost). */
  refreshBoot?(): Promise<unknown>;
  onCreate?(outcome: 'ok' | 'error' | 'quota'): void;
  /** A create refused for quota: when to retry (the front server's Retry-After). */
  onQuota?(retryAfterSeconds: number): void;
  onExecDone?(seconds: number): void;
  onEgress?(e: EgressEvent): void;
}

const notFound = (id: string): AirlockError =>
  new AirlockError('SANDBOX_NOT_FOUND', `no sandbox "${id}"`, { field: 'id' });

export class TenantScopedApi implements SandboxApi {
  private readonly ttlTimers = new Map<string, NodeJS.Timeout>();
  /** Each tenant's own templates (server/templates.ts). */
  private readonly templates: TenantTemplates;

  constructor(
    private readonly inner: SandboxApi,
    private readonly store: Store,
    private readonly quotas: Quotas,
    private readonly policy: TenantPolicy,
    private readonly hooks: TenantHooks,
  ) {
    this.templates = new TenantTemplates(inner, store, quotas, policy, (s) => hooks.onQuota?.(s));
  }

  /** Re-arm the TTL mirror of every stored live sandbox (front server start). */
  armStoredDeadlines(): void {
    for (const r of this.store.sandboxes({ states: ['running', 'paused'] })) this.arm(r.id, r.deadline);
  }

  close(): void {
    for (const t of this.ttlTimers.values()) clearTimeout(t);
    this.ttlTimers.clear();
  }

  /** The live row of `id` if the caller's tenant owns it; else SANDBOX_NOT_FOUND (no oracle). */
  private owned(id: string, caller: Caller): SandboxRow {
    const r = typeof id === 'string' ? this.store.getSandbox(id) : undefined;
    if (!r || r.tenant !== caller.tenant) throw notFound(String(id));
    if (r.state === 'lost')
      throw new AirlockError(
        'SANDBOX_GONE',
        `sandbox "${id}" is lost: ${r.reason ?? 'its supervisor died'}`,
        {
          field: 'id',
        },
      );
    if (r.state !== 'running' && r.state !== 'paused')
      throw new AirlockError('SANDBOX_GONE', `sandbox "${id}" has ended (${r.state})`, { field: 'id' });
    return r;
  }

  /**
   * The supervisor says the sandbox is gone: either its supervisor restarted (then it is `lost`, which
   * the boot check records) or it ended there (expired if its deadline passed, else killed).
   */
  private async goneFromSupervisor<T>(id: string, op: () => Promise<T>): Promise<T> {
    try {
      return await op();
    } catch (e) {
      if (!AirlockError.is(e, 'SANDBOX_NOT_FOUND')) throw e;
      await this.hooks.refreshBoot?.().catch(() => {});
      const r = this.store.getSandbox(id);
      if (r?.state === 'lost') {
        throw new AirlockError(
          'SANDBOX_GONE',
          `sandbox "${id}" is lost: ${r.reason ?? 'its supervisor died'}`,
          {
            field: 'id',
          },
        );
      }
      const expired = r?.deadline != null && r.deadline <= Date.now();
      this.end(id, expired ? 'expired' : 'killed', expired ? 'its TTL ran out' : 'gone from the supervisor');
      throw e;
    }
  }

  private end(id: string, state: 'killed' | 'expired', reason: string | null): void {
    const t = this.ttlTimers.get(id);
    if (t) clearTimeout(t);
    this.ttlTimers.delete(id);
    if (this.store.endSandbox(id, state, reason)) this.quotas.wakeAll();
  }

  private arm(id: string, deadline: number | null): void {
    const old = this.ttlTimers.get(id);
    if (old) clearTimeout(old);
    this.ttlTimers.delete(id);
    if (deadline === null) return;
    // setTimeout's longest delay is 2^31-1 ms; a longer TTL re-arms on the way.
    const delay = Math.min(Math.max(0, deadline - Date.now()), 2 ** 31 - 1);
    const t = setTimeout(() => {
      this.ttlTimers.delete(id);
      const r = this.store.getSandbox(id);
      if (!r || r.deadline !== deadline) return;
      if (deadline > Date.now()) return this.arm(id, deadline);
      // The supervisor's own TTL kills it; the kill here is for the case it has not yet.
      void this.inner.kill(id, { tenant: r.tenant }).catch(() => {});
      this.end(id, 'expired', 'its TTL ran out');
    }, delay);
    t.unref();
    this.ttlTimers.set(id, t);
  }

  private view(r: SandboxRow, live?: SandboxView): SandboxView {
    return {
      ...(live ?? { id: r.id, backend: r.backend, createdAt: r.createdAt }),
      id: r.id,
      state: live?.state ?? r.state,
      expiresAt: r.deadline === null ? null : new Date(r.deadline).toISOString(),
      metadata: r.metadata,
      ...(r.template !== null ? { template: r.template } : {}),
      ...(r.reason !== null && r.state !== 'running' && r.state !== 'paused' ? { reason: r.reason } : {}),
    };
  }

  async create(req: CreateRequest, caller: Caller, signal?: AbortSignal): Promise<SandboxView> {
    const net = req.network as { allowPrivate?: unknown } | undefined;
    if (net?.allowPrivate !== undefined && net.allowPrivate !== false && !this.policy.allowPrivateNetwork) {
      throw new AirlockError(
        'PERMISSION_DENIED',
        'network.allowPrivate is disabled on this server (the operator can enable it in the server config)',
        { field: 'network.allowPrivate' },
      );
    }
    if (req.image !== undefined) checkImageAllowed(req.image, this.policy.imageRegistries ?? []);
    if (req.snapshot !== undefined && this.store.snapshotTenant(req.snapshot) !== caller.tenant) {
      throw new AirlockError('SNAPSHOT_NOT_FOUND', `no snapshot ${req.snapshot}`, { field: 'snapshot' });
    }
    // A template given by digest names a layer, and every snapshot is a layer: only the caller's own
    // snapshots and templates go by digest, or one tenant could start from another's files by its
    // id. A name is the caller's own template, else the operator's (server/templates.ts).
    const asked = req.template;
    if (asked !== undefined) req = { ...req, template: this.templates.resolve(asked, caller, 'template') };
    const want = usageOf(req.limits);
    let release: () => void;
    try {
      release = await this.quotas.reserve(
        caller.tenant,
        want,
        req.queueTimeoutMs ?? this.policy.defaultQueueTimeoutMs,
        signal,
      );
    } catch (e) {
      this.hooks.onCreate?.('quota');
      if (e instanceof QuotaError) this.hooks.onQuota?.(e.retryAfterSeconds);
      throw e;
    }
    try {
      const created = await this.inner.create(req, caller);
      // The caller's own name for its template, never the library's internal one.
      const v = asked !== undefined ? { ...created, template: asked } : created;
      // Read after the create: a create that succeeded after a restart was noticed ran on the new
      // supervisor (one in flight to a dying supervisor fails with it).
      const bootId = this.hooks.bootId();
      const deadline = v.expiresAt === null ? null : Date.parse(v.expiresAt);
      const row: SandboxRow = {
        id: v.id,
        tenant: caller.tenant,
        state: 'running',
        backend: v.backend,
        template: v.template ?? null,
        createdAt: v.createdAt,
        deadline,
        metadata: v.metadata,
        reason: null,
        bootId,
        ...want,
      };
      try {
        this.store.insertSandbox(row);
      } catch (e) {
        // Not recorded means no tenant could ever reach it: do not leave it running.
        await this.inner.kill(v.id, caller).catch(() => {});
        throw e;
      }
      this.arm(v.id, deadline);
      this.hooks.onCreate?.('ok');
      // The row just committed, not a read of it back (one statement less per create).
      return this.view(row, v);
    } catch (e) {
      this.hooks.onCreate?.('error');
      throw e;
    } finally {
      release();
    }
  }

  async get(id: string, caller: Caller): Promise<SandboxView> {
    const r = typeof id === 'string' ? this.store.getSandbox(id) : undefined;
    if (!r || r.tenant !== caller.tenant) throw notFound(String(id));
    if (r.state !== 'running' && r.state !== 'paused') return this.view(r); // lost/killed/expired, with reason
    try {
      return this.view(r, await this.goneFromSupervisor(id, () => this.inner.get(id, caller)));
    } catch (e) {
      const now = this.store.getSandbox(id);
      if (now && now.state !== 'running' && now.state !== 'paused') return this.view(now);
      throw e;
    }
  }

  async list(filter: { metadata?: Record<string, string> }, caller: Caller): Promise<SandboxView[]> {
    const mine = new Map(
      this.store.sandboxes({ tenant: caller.tenant, states: ['running', 'paused'] }).map((r) => [r.id, r]),
    );
    if (mine.size === 0) return [];
    const live = await this.inner.list(filter, caller);
    return live.filter((v) => mine.has(v.id)).map((v) => this.view(mine.get(v.id)!, v));
  }

  async setTimeout(id: string, ttlMs: number, caller: Caller): Promise<SandboxView> {
    const r = this.owned(id, caller);
    const v = await this.goneFromSupervisor(id, () => this.inner.setTimeout(id, ttlMs, caller));
    const deadline = v.expiresAt === null ? null : Date.parse(v.expiresAt);
    this.store.setDeadline(id, deadline);
    this.arm(id, deadline);
    return this.view({ ...r, deadline }, v);
  }

  async setNetworkPolicy(id: string, policy: NetworkPolicyInput, caller: Caller): Promise<NetworkPolicyView> {
    this.owned(id, caller); // another tenant's id: SANDBOX_NOT_FOUND, as for every call
    const inner = this.inner.setNetworkPolicy?.bind(this.inner);
    if (!inner) throw new AirlockError('BACKEND_UNAVAILABLE', 'this server cannot change network policies');
    const now = await this.goneFromSupervisor(id, () => inner(id, policy, caller));
    this.store.event('network.changed', caller.tenant, id, { policy: now });
    return now;
  }

  async pause(id: string, caller: Caller): Promise<SandboxView> {
    this.owned(id, caller);
    const v = await this.goneFromSupervisor(id, () => this.inner.pause(id, caller));
    this.store.setSandboxState(id, 'paused');
    return this.view(this.store.getSandbox(id)!, v);
  }

  async resume(id: string, caller: Caller): Promise<SandboxView> {
    this.owned(id, caller);
    const v = await this.goneFromSupervisor(id, () => this.inner.resume(id, caller));
    this.store.setSandboxState(id, 'running');
    return this.view(this.store.getSandbox(id)!, v);
  }

  async kill(id: string, caller: Caller): Promise<void> {
    this.owned(id, caller);
    try {
      await this.inner.kill(id, caller);
    } catch (e) {
      if (!AirlockError.is(e, 'SANDBOX_NOT_FOUND')) throw e; // already gone there: still ours to end
    }
    this.end(id, 'killed', 'killed by its client');
  }

  exec(id: string, req: ExecRequest, caller: Caller, signal?: AbortSignal): AsyncIterable<ExecEvent> {
    this.owned(id, caller); // before the stream starts: a refusal is a plain error status
    return this.timed(this.inner.exec(id, req, caller, signal));
  }

  runCode(id: string, req: RunCodeRequest, caller: Caller, signal?: AbortSignal): AsyncIterable<CodeEvent> {
    this.owned(id, caller); // before the stream starts: a refusal is a plain error status
    if (!this.inner.runCode)
      throw new AirlockError('BACKEND_UNAVAILABLE', 'this server does not run code (runCode)');
    return this.logged(id, req, caller, this.inner.runCode(id, req, caller, signal));
  }

  /** Every analysis decision of a run goes to the append-only event log (code.run / code.denied). */
  private async *logged(
    id: string,
    req: RunCodeRequest,
    caller: Caller,
    events: AsyncIterable<CodeEvent>,
  ): AsyncIterable<CodeEvent> {
    const language = req.language ?? (req.context !== undefined ? undefined : 'python');
    try {
      for await (const e of events) {
        if (e.type === 'end') {
          const findings = e.execution.findings;
          const decision = findings.some((f) => f.action === 'warn') ? 'warn' : 'allow';
          this.store.event('code.run', caller.tenant, id, {
            language,
            context: req.context,
            decision,
            findings,
          });
        }
        yield e;
      }
    } catch (e) {
      if (AirlockError.is(e, 'CODE_DENIED')) {
        const findings = (e as { findings?: unknown }).findings;
        this.store.event('code.denied', caller.tenant, id, {
          language,
          context: req.context,
          decision: 'deny',
          findings,
        });
      }
      throw e;
    }
  }

  createCodeContext(id: string, req: CreateCodeContextRequest, caller: Caller): Promise<CodeContextRef> {
    this.owned(id, caller);
    const inner = this.inner.createCodeContext?.bind(this.inner);
    if (!inner) throw new AirlockError('BACKEND_UNAVAILABLE', 'this server does not run code (runCode)');
    return this.goneFromSupervisor(id, () => inner(id, req, caller));
  }

  listCodeContexts(id: string, caller: Caller): Promise<CodeContextRef[]> {
    this.owned(id, caller);
    const inner = this.inner.listCodeContexts?.bind(this.inner);
    if (!inner) throw new AirlockError('BACKEND_UNAVAILABLE', 'this server does not run code (runCode)');
    return this.goneFromSupervisor(id, () => inner(id, caller));
  }

  closeCodeContext(id: string, contextId: string, caller: Caller): Promise<void> {
    this.owned(id, caller);
    const inner = this.inner.closeCodeContext?.bind(this.inner);
    if (!inner) throw new AirlockError('BACKEND_UNAVAILABLE', 'this server does not run code (runCode)');
    return this.goneFromSupervisor(id, () => inner(id, contextId, caller));
  }

  private async *timed(events: AsyncIterable<ExecEvent>): AsyncIterable<ExecEvent> {
    const started = process.hrtime.bigint();
    for await (const e of events) {
      if (e.type === 'exit') this.hooks.onExecDone?.(Number(process.hrtime.bigint() - started) / 1e9);
      yield e;
    }
  }

  startProcess(id: string, req: ExecRequest, caller: Caller): Promise<ProcessView> {
    this.owned(id, caller);
    return this.goneFromSupervisor(id, () => this.inner.startProcess(id, req, caller));
  }

  startAndFollow(
    id: string,
    req: ExecRequest,
    caller: Caller,
    signal?: AbortSignal,
  ): AsyncIterable<ExecEvent> {
    this.owned(id, caller); // before the stream starts: a refusal is a plain error status
    return this.followed(id, startAndFollow(this.inner, id, req, caller, signal));
  }

  /** The inner stream, with a failure before its first event read as startProcess's would be. */
  private async *followed(id: string, events: AsyncIterable<ExecEvent>): AsyncIterable<ExecEvent> {
    const it = events[Symbol.asyncIterator]();
    try {
      const first = await this.goneFromSupervisor(id, () => it.next());
      if (first.done) return;
      yield first.value;
      for (let r = await it.next(); !r.done; r = await it.next()) yield r.value;
    } finally {
      await it.return?.();
    }
  }

  listProcesses(id: string, caller: Caller): Promise<ProcessView[]> {
    this.owned(id, caller);
    return this.goneFromSupervisor(id, () => this.inner.listProcesses(id, caller));
  }

  connectProcess(id: string, pid: string, caller: Caller, signal?: AbortSignal): AsyncIterable<ExecEvent> {
    this.owned(id, caller);
    return this.inner.connectProcess(id, pid, caller, signal);
  }

  sendStdin(id: string, pid: string, data: Uint8Array, caller: Caller): Promise<void> {
    this.owned(id, caller);
    return this.inner.sendStdin(id, pid, data, caller);
  }

  closeStdin(id: string, pid: string, caller: Caller): Promise<void> {
    this.owned(id, caller);
    return this.inner.closeStdin(id, pid, caller);
  }

  killProcess(id: string, pid: string, caller: Caller): Promise<void> {
    this.owned(id, caller);
    return this.inner.killProcess(id, pid, caller);
  }

  readFile(id: string, path: string, caller: Caller): Promise<ReadableStream<Uint8Array>> {
    this.owned(id, caller);
    return this.goneFromSupervisor(id, () => this.inner.readFile(id, path, caller));
  }

  writeFile(
    id: string,
    path: string,
    body: ReadableStream<Uint8Array>,
    caller: Caller,
  ): Promise<FileEntryView> {
    this.owned(id, caller);
    return this.goneFromSupervisor(id, () => this.inner.writeFile(id, path, body, caller));
  }

  listDir(id: string, path: string, caller: Caller): Promise<FileEntryView[]> {
    this.owned(id, caller);
    return this.goneFromSupervisor(id, () => this.inner.listDir(id, path, caller));
  }

  stat(id: string, path: string, caller: Caller): Promise<FileEntryView> {
    this.owned(id, caller);
    return this.goneFromSupervisor(id, () => this.inner.stat(id, path, caller));
  }

  remove(id: string, path: string, caller: Caller): Promise<void> {
    this.owned(id, caller);
    return this.goneFromSupervisor(id, () => this.inner.remove(id, path, caller));
  }

  makeDir(id: string, path: string, caller: Caller): Promise<FileEntryView> {
    this.owned(id, caller);
    return this.goneFromSupervisor(id, () => this.inner.makeDir(id, path, caller));
  }

  watch(id: string, path: string, caller: Caller, signal?: AbortSignal): AsyncIterable<FsEvent> {
    this.owned(id, caller);
    return this.inner.watch(id, path, caller, signal);
  }

  async snapshot(id: string, caller: Caller): Promise<SnapshotView> {
    this.owned(id, caller);
    const s = await this.goneFromSupervisor(id, () => this.inner.snapshot(id, caller));
    this.store.recordSnapshot(s.id, caller.tenant);
    return s;
  }

  async listSnapshots(caller: Caller): Promise<SnapshotView[]> {
    return (await this.inner.listSnapshots(caller)).filter(
      (s) => this.store.snapshotTenant(s.id) === caller.tenant,
    );
  }

  async removeSnapshot(snapshotId: string, caller: Caller): Promise<void> {
    if (this.store.snapshotTenant(snapshotId) !== caller.tenant)
      throw new AirlockError('SNAPSHOT_NOT_FOUND', `no snapshot ${String(snapshotId)}`, { field: 'id' });
    await this.inner.removeSnapshot(snapshotId, caller);
    this.store.forgetSnapshot(snapshotId);
  }

  buildTemplate(
    req: TemplateBuildRequest,
    caller: Caller,
    signal?: AbortSignal,
  ): AsyncIterable<TemplateEvent> {
    return this.templates.build(req, caller, signal);
  }

  async listTemplates(caller: Caller): Promise<TemplateView[]> {
    return this.templates.list(caller);
  }

  async getTemplate(name: string, caller: Caller): Promise<TemplateView> {
    return this.templates.get(name, caller);
  }

  removeTemplate(name: string, caller: Caller): Promise<void> {
    return this.templates.remove(name, caller);
  }

  egressEvents(id: string, caller: Caller, signal?: AbortSignal): AsyncIterable<EgressEvent> {
    this.owned(id, caller);
    return this.counted(this.inner.egressEvents(id, caller, signal));
  }

  private async *counted(events: AsyncIterable<EgressEvent>): AsyncIterable<EgressEvent> {
    for await (const e of events) {
      this.hooks.onEgress?.(e);
      yield e;
    }
  }
}
