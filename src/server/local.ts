import type { NetworkPolicyInput } from '../core/network-spec.js';
import type { NetworkPolicyView } from './network-wire.js';
import type { Duplex } from 'node:stream';
import { PreviewAccessTable } from './preview.js';
// LocalSandboxApi: the SandboxApi over an Airlock in this process (the supervisor serves it). It maps
// the server's wire shapes onto the library and keeps what the library does not: background process
// tables. Tenants are not its business (the front server scopes them); it keeps the metadata it is given.
import { AirlockError } from '../core/errors.js';
import type { SandboxSpecInput } from '../core/spec.js';
import type { EgressEvent } from '../egress/events.js';
import type { Airlock, Sandbox, Snapshot } from '../sandbox/airlock.js';
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
import { buildTemplateEvents, getTemplateView, listTemplateViews } from './local-templates.js';
import { listPath, makeDir, readStream, removePath, statPath, writeStream } from './local-files.js';
import { ProcessTable, foregroundEvents } from './local-processes.js';
import { pollWatch, type WatchStream } from './local-watch.js';
import type { CodeContextRef } from '../core/code.js';
import {
  runCodeEvents,
  type CodeEvent,
  type CreateCodeContextRequest,
  type RunCodeRequest,
} from './code-wire.js';

export interface LocalSandboxApiOptions {
  /** Output kept per stream of each background process for connect() (default 1 MiB). */
  readonly processOutputBytes?: number;
  /** How often watch() lists the directory (default 250 ms). */
  readonly watchIntervalMs?: number;
}

/** Default timeout of an exec through the API (as the library's exec), and the longest allowed. */
const DEFAULT_EXEC_TIMEOUT_MS = 60_000;
const MAX_EXEC_TIMEOUT_MS = 86_400_000;
const SANDBOX_ID_RE = /^[A-Za-z0-9_-]{1,128}$/;
/** Watches polling one sandbox at once (each lists its directory in the sandbox every interval). */
export const MAX_WATCHES_PER_SANDBOX = 16;

function checkExec(req: ExecRequest): void {
  if (req.timeoutMs !== undefined && req.timeoutMs > MAX_EXEC_TIMEOUT_MS) {
    throw new AirlockError('INVALID_ARGUMENT', `timeoutMs is at most ${MAX_EXEC_TIMEOUT_MS} (a day)`, {
      field: 'timeoutMs',
    });
  }
}

/** CreateRequest → the library's spec (fork options when from a snapshot). */
function specOf(req: CreateRequest): SandboxSpecInput {
  return {
    ...(req.backend !== undefined ? { backend: req.backend } : {}),
    ...(req.template !== undefined ? { template: req.template } : {}),
    ...(req.image !== undefined ? { image: req.image } : {}),
    ...(req.executables !== undefined ? { executables: req.executables } : {}),
    ...(req.ttlMs !== undefined ? { ttlMs: req.ttlMs } : {}),
    ...(req.limits !== undefined ? { limits: req.limits } : {}),
    ...(req.env !== undefined ? { env: req.env } : {}),
    ...(req.metadata !== undefined ? { metadata: req.metadata } : {}),
    ...(req.network !== undefined ? { network: req.network as SandboxSpecInput['network'] } : {}),
    ...(req.secrets !== undefined
      ? { secrets: req.secrets.map((s) => ({ name: s.name, value: { literal: s.value }, hosts: s.hosts })) }
      : {}),
    ...(req.codePolicy !== undefined ? { codePolicy: req.codePolicy } : {}),
  };
}

export function sandboxView(sbx: Sandbox): SandboxView {
  const info = sbx.info;
  const template = info.template?.name ?? info.template?.digest;
  return {
    id: info.id,
    state: info.paused ? 'paused' : 'running',
    backend: info.backend,
    ...(template !== undefined ? { template } : {}),
    createdAt: info.createdAt.toISOString(),
    expiresAt: info.expiresAt ? info.expiresAt.toISOString() : null,
    metadata: { ...info.metadata },
  };
}

export function snapshotView(s: Snapshot): SnapshotView {
  return {
    id: s.id,
    backend: s.backend,
    createdAt: s.createdAt.toISOString(),
    sizeBytes: s.sizeBytes,
    parent: s.parent.layers[0] ?? null,
  };
}

export class LocalSandboxApi implements SandboxApi {
  private readonly access = new PreviewAccessTable();
  private view(sbx: Sandbox): SandboxView {
    return { ...sandboxView(sbx), ...this.access.of(sbx) };
  }
  private readonly tables = new Map<string, ProcessTable>();
  private readonly processOutputBytes: number;
  private readonly watchIntervalMs: number;
  private watching = 0;
  private readonly watchesOf = new Map<string, number>();

  constructor(
    readonly airlock: Airlock,
    opts: LocalSandboxApiOptions = {},
  ) {
    this.processOutputBytes = opts.processOutputBytes ?? 1024 * 1024;
    this.watchIntervalMs = opts.watchIntervalMs ?? 250;
  }

  /** A live sandbox by id; SANDBOX_NOT_FOUND for an unknown (or dead) one. */
  private sbx(id: string): Sandbox {
    this.prune();
    // Not an id at all (the message would echo whatever was sent): the same answer as an unknown one.
    if (!SANDBOX_ID_RE.test(id)) {
      throw new AirlockError('SANDBOX_NOT_FOUND', 'no live sandbox with that id', { field: 'id' });
    }
    return this.airlock.get(id);
  }

  /** Forget process tables of sandboxes that are gone (killed, TTL). */
  private prune(): void {
    if (this.tables.size === 0) return;
    const live = new Set(this.airlock.list().map((s) => s.id));
    for (const id of this.tables.keys()) if (!live.has(id)) this.tables.delete(id);
  }

  private table(id: string): ProcessTable {
    let t = this.tables.get(id);
    if (!t) this.tables.set(id, (t = new ProcessTable(id, this.processOutputBytes)));
    return t;
  }

  async create(req: CreateRequest, _caller: Caller): Promise<SandboxView> {
    const spec = specOf(req);
    let sbx: Sandbox;
    if (req.snapshot !== undefined) {
      for (const key of ['template', 'backend'] as const) {
        if (req[key] !== undefined) {
          throw new AirlockError('INVALID_ARGUMENT', `a fork keeps its snapshot's ${key}; leave ${key} out`, {
            field: key,
          });
        }
      }
      const snap = await this.airlock.snapshots.inspect(req.snapshot).catch((e: unknown) => {
        throw AirlockError.isInstance(e) ? new AirlockError(e.code, e.message, { field: 'snapshot' }) : e;
      });
      sbx = await snap.fork(spec);
    } else {
      sbx = await this.airlock.create(spec);
    }
    this.access.issue(sbx, req.publicPorts);
    return this.view(sbx);
  }

  async get(id: string, _caller: Caller): Promise<SandboxView> {
    return this.view(this.sbx(id));
  }

  async list(filter: { metadata?: Record<string, string> }, _caller: Caller): Promise<SandboxView[]> {
    this.prune();
    const want = Object.entries(filter.metadata ?? {});
    return this.airlock
      .list()
      .filter((s) => s.alive && want.every(([k, v]) => s.info.metadata[k] === v))
      .map((s) => this.view(s));
  }

  async setTimeout(id: string, ttlMs: number, _caller: Caller): Promise<SandboxView> {
    const sbx = this.sbx(id);
    sbx.setTimeout(ttlMs);
    return this.view(sbx);
  }

  async setNetworkPolicy(
    id: string,
    policy: NetworkPolicyInput,
    _caller: Caller,
  ): Promise<NetworkPolicyView> {
    const sbx = this.sbx(id);
    await sbx.setNetworkPolicy(policy);
    const n = sbx.spec.network!;
    return {
      allow: [...n.allow],
      deny: [...n.deny],
      transparent: n.transparent,
      allowPrivate: [...n.allowPrivate],
    };
  }

  async pause(id: string, _caller: Caller): Promise<SandboxView> {
    const sbx = this.sbx(id);
    await sbx.pause();
    return this.view(sbx);
  }

  async resume(id: string, _caller: Caller): Promise<SandboxView> {
    const sbx = this.sbx(id);
    await sbx.resume();
    return this.view(sbx);
  }

  connectPort(id: string, port: number, _caller: Caller, signal?: AbortSignal): Promise<Duplex> {
    return this.sbx(id).connectPort(port, signal ? { signal } : {});
  }

  async kill(id: string, _caller: Caller): Promise<void> {
    const sbx = this.sbx(id);
    await sbx.kill();
    this.tables.delete(id);
  }

  runCode(id: string, req: RunCodeRequest, _caller: Caller, signal?: AbortSignal): AsyncIterable<CodeEvent> {
    const sbx = this.sbx(id);
    // The runner finds a context by its id (and checks the language against the context's own).
    const context =
      req.context !== undefined
        ? ({ id: req.context, language: req.language ?? 'python' } as CodeContextRef)
        : undefined;
    return runCodeEvents(sbx, req, context, signal);
  }

  createCodeContext(id: string, req: CreateCodeContextRequest, _caller: Caller): Promise<CodeContextRef> {
    return this.sbx(id).createCodeContext(req);
  }

  listCodeContexts(id: string, _caller: Caller): Promise<CodeContextRef[]> {
    return this.sbx(id).listCodeContexts();
  }

  closeCodeContext(id: string, contextId: string, _caller: Caller): Promise<void> {
    return this.sbx(id).closeCodeContext(contextId);
  }

  async *exec(id: string, req: ExecRequest, _caller: Caller, signal?: AbortSignal): AsyncIterable<ExecEvent> {
    const sbx = this.sbx(id);
    checkExec(req);
    const proc = await sbx.spawn(req.cmd, {
      ...(req.cwd !== undefined ? { cwd: req.cwd } : {}),
      ...(req.env !== undefined ? { env: req.env } : {}),
      ...(signal ? { signal } : {}),
    });
    yield* foregroundEvents(proc, {
      stdin: req.stdin,
      timeoutMs: req.timeoutMs ?? DEFAULT_EXEC_TIMEOUT_MS,
      maxOutputBytes: req.maxOutputBytes,
      signal,
    });
  }

  async startProcess(id: string, req: ExecRequest, _caller: Caller): Promise<ProcessView> {
    const sbx = this.sbx(id);
    checkExec(req);
    const table = this.table(id);
    table.checkRoom();
    const proc = await sbx.spawn(req.cmd, {
      ...(req.cwd !== undefined ? { cwd: req.cwd } : {}),
      ...(req.env !== undefined ? { env: req.env } : {}),
    });
    const cmd = typeof req.cmd === 'string' ? ['/bin/sh', '-c', req.cmd] : [...req.cmd];
    return table.add(proc, cmd, {
      stdin: req.stdin,
      timeoutMs: req.timeoutMs,
      maxOutputBytes: req.maxOutputBytes,
    });
  }

  async listProcesses(id: string, _caller: Caller): Promise<ProcessView[]> {
    this.sbx(id);
    return this.table(id).list();
  }

  async *connectProcess(
    id: string,
    pid: string,
    _caller: Caller,
    signal?: AbortSignal,
  ): AsyncIterable<ExecEvent> {
    this.sbx(id);
    yield* this.table(id).get(pid).follow(signal);
  }

  async sendStdin(id: string, pid: string, data: Uint8Array, _caller: Caller): Promise<void> {
    this.sbx(id);
    await this.table(id).sendStdin(pid, data);
  }

  async closeStdin(id: string, pid: string, _caller: Caller): Promise<void> {
    this.sbx(id);
    this.table(id).closeStdin(pid);
  }

  async killProcess(id: string, pid: string, _caller: Caller): Promise<void> {
    this.sbx(id);
    await this.table(id).kill(pid);
  }

  async readFile(
    id: string,
    path: string,
    _caller: Caller,
    signal?: AbortSignal,
  ): Promise<ReadableStream<Uint8Array>> {
    return readStream(this.sbx(id), path, signal);
  }

  async writeFile(
    id: string,
    path: string,
    body: ReadableStream<Uint8Array>,
    _caller: Caller,
  ): Promise<FileEntryView> {
    return writeStream(this.sbx(id), path, body);
  }

  async listDir(id: string, path: string, _caller: Caller): Promise<FileEntryView[]> {
    return listPath(this.sbx(id), path);
  }

  async stat(id: string, path: string, _caller: Caller): Promise<FileEntryView> {
    return statPath(this.sbx(id), path);
  }

  async remove(id: string, path: string, _caller: Caller): Promise<void> {
    await removePath(this.sbx(id), path);
  }

  async makeDir(id: string, path: string, _caller: Caller): Promise<FileEntryView> {
    return makeDir(this.sbx(id), path);
  }

  /**
   * Polls inside the sandbox (see local-watch.ts); `ready` resolves once the first listing is taken.
   * At most MAX_WATCHES_PER_SANDBOX at once: each one runs a listing in the sandbox every interval.
   */
  watch(id: string, path: string, _caller: Caller, signal?: AbortSignal): WatchStream {
    let sbx: Sandbox;
    try {
      sbx = this.sbx(id);
      if ((this.watchesOf.get(id) ?? 0) >= MAX_WATCHES_PER_SANDBOX) {
        throw new AirlockError(
          'CAPACITY_EXHAUSTED',
          `sandbox ${id} already has ${MAX_WATCHES_PER_SANDBOX} watches (the most); close one first`,
        );
      }
    } catch (e) {
      const failed = Promise.reject(e);
      failed.catch(() => {});
      return {
        ready: failed,
        // eslint-disable-next-line require-yield
        async *[Symbol.asyncIterator](): AsyncGenerator<FsEvent> {
          throw e;
        },
      };
    }
    const stream = pollWatch(sbx, path, {
      intervalMs: this.watchIntervalMs,
      signal,
      onEnd: () => {
        this.watching--;
        const n = (this.watchesOf.get(id) ?? 1) - 1;
        if (n > 0) this.watchesOf.set(id, n);
        else this.watchesOf.delete(id);
      },
    });
    // Counted after pollWatch: a bad path throws before any polling starts.
    this.watching++;
    this.watchesOf.set(id, (this.watchesOf.get(id) ?? 0) + 1);
    return stream;
  }

  /** Watches still polling (a watch ends when its signal aborts or its sandbox dies). */
  get activeWatches(): number {
    return this.watching;
  }

  async snapshot(id: string, _caller: Caller): Promise<SnapshotView> {
    return snapshotView(await this.sbx(id).snapshot());
  }

  async listSnapshots(_caller: Caller): Promise<SnapshotView[]> {
    return (await this.airlock.snapshots.list()).map(snapshotView);
  }

  async removeSnapshot(snapshotId: string, _caller: Caller): Promise<void> {
    await this.airlock.snapshots.remove(snapshotId);
  }

  // ---- templates (server/local-templates.ts; the front server scopes names per tenant) ----
  buildTemplate(
    req: TemplateBuildRequest,
    _caller: Caller,
    signal?: AbortSignal,
  ): AsyncIterable<TemplateEvent> {
    return buildTemplateEvents(this.airlock, req, signal);
  }

  listTemplates(_caller: Caller): Promise<TemplateView[]> {
    return listTemplateViews(this.airlock);
  }

  getTemplate(name: string, _caller: Caller): Promise<TemplateView> {
    return getTemplateView(this.airlock, name);
  }

  async removeTemplate(name: string, _caller: Caller): Promise<void> {
    await this.airlock.templates.remove(name);
  }

  /** The events so far (the newest 10,000), then live ones until the sandbox dies or `signal` aborts. */
  async *egressEvents(id: string, _caller: Caller, signal?: AbortSignal): AsyncIterable<EgressEvent> {
    const sbx = this.sbx(id);
    const live = sbx.watchEgress(signal);
    // next() runs the generator to its first await, which is after it subscribed: taking the past
    // events in this same turn leaves no gap and no overlap between the two.
    const first = live.next();
    const past = [...sbx.egressEvents];
    yield* past;
    const r = await first;
    if (r.done) return;
    yield r.value;
    yield* live;
  }
}
