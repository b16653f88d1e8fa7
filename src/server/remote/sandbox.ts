// A sandbox that lives on a server: the library's Sandbox surface (exec with background handles and
// output callbacks, files, setTimeout, pause/resume, snapshot, kill, `await using`) over a SandboxApi
// (RemoteSandboxApi: the native REST API). What only the server's host can do (spawn with raw pipes,
// host workspace diffs) is not here.
import type { NetworkPolicyInput } from '../../core/network-spec.js';
import type { NetworkPolicyView } from '../network-wire.js';
import { Readable } from 'node:stream';
import { AirlockError } from '../../core/errors.js';
import {
  ExecOptionsSchema,
  parseCommand,
  parseOrThrow,
  type ExecCommand,
  type SandboxSpec,
} from '../../core/spec.js';
import type {
  ExecHandle,
  ExecOptions,
  ExecResult,
  SandboxProcess,
  SpawnOptions,
} from '../../sandbox/sandbox.js';
import type { EgressEvent } from '../../egress/events.js';
import type { PortableSandbox } from '../../sandbox/portable.js';
import type { Caller, ExecEvent, ExecRequest, SandboxApi, SandboxView, SnapshotView } from '../contract.js';
import { checkSpillDir, shapeExec } from './exec.js';
import { RemoteFiles } from './files.js';
import type { CodeContextRef, CreateCodeContextOptions, Execution, RunCodeOptions } from '../../core/code.js';
import { executionFromEvents, type RunCodeRequest } from '../code-wire.js';
import { remoteSpawn } from './spawn.js';

/** A remote sandbox's public facts (the library's SandboxInfo less what stays on the server's host). */
export interface RemoteSandboxInfo {
  readonly id: string;
  readonly backend: string;
  readonly createdAt: Date;
  /** When the TTL ends it (the server's deadline); null when it has none. */
  readonly expiresAt: Date | null;
  readonly persistent: boolean;
  readonly paused: boolean;
  readonly metadata: Readonly<Record<string, string>>;
  /** The template it started from, as the server names it (its name, or its digest). */
  readonly template?: string;
}

/** What a RemoteSandbox needs from the RemoteAirlock that made it. */
export interface RemoteContext {
  readonly api: SandboxApi;
  readonly caller: Caller;
  readonly spillDir: string;
  readonly maxSpillBytes: number;
  readonly onGone: (id: string) => void;
  readonly fork: (snapshotId: string) => Promise<RemoteSandbox>;
}

/** A snapshot taken on the server: `fork()` starts new sandboxes from it there. */
export class RemoteSnapshot {
  readonly id: string;
  readonly backend: string;
  readonly createdAt: Date;
  readonly sizeBytes: number;
  readonly parent: string | null;

  constructor(
    view: SnapshotView,
    private readonly forkOne: (id: string) => Promise<RemoteSandbox>,
  ) {
    this.id = view.id;
    this.backend = view.backend;
    this.createdAt = new Date(view.createdAt);
    this.sizeBytes = view.sizeBytes;
    this.parent = view.parent;
  }

  /** One sandbox started from this snapshot (`{ count }` for several). */
  fork(): Promise<RemoteSandbox>;
  fork(opts: { count: number }): Promise<RemoteSandbox[]>;
  async fork(opts?: { count: number }): Promise<RemoteSandbox | RemoteSandbox[]> {
    if (opts === undefined) return this.forkOne(this.id);
    const n = opts.count;
    if (!Number.isInteger(n) || n < 1 || n > 64) {
      throw new AirlockError('INVALID_ARGUMENT', 'fork count must be an integer from 1 to 64', {
        field: 'count',
      });
    }
    const made = await Promise.allSettled(Array.from({ length: n }, () => this.forkOne(this.id)));
    const ok = made.flatMap((r) => (r.status === 'fulfilled' ? [r.value] : []));
    const bad = made.find((r): r is PromiseRejectedResult => r.status === 'rejected');
    if (bad) {
      await Promise.allSettled(ok.map((s) => s.kill()));
      throw bad.reason;
    }
    return ok;
  }
}

export class RemoteSandbox implements PortableSandbox {
  readonly id: string;
  /** The spec as this client asked for it (with the library's defaults); undefined after connect(). */
  readonly spec: SandboxSpec | undefined;
  readonly files: RemoteFiles;
  private view: SandboxView;
  private expiresAtMs: number;
  private gone: 'killed' | 'ttl' | 'lost' | undefined;
  private pausedState: boolean;
  private killing: Promise<void> | undefined;
  /** Spill files of this sandbox's execs together stay under maxSpillBytes. */
  private readonly budget: { left: number };
  /** Background handles still running: the sandbox's kill ends them. */
  private readonly running = new Set<{ settle: () => Promise<void> }>();
  /** Open egress streams of onEgress listeners: the sandbox's kill closes them. */
  private readonly egressStops = new Set<() => void>();

  constructor(
    view: SandboxView,
    spec: SandboxSpec | undefined,
    private readonly ctx: RemoteContext,
  ) {
    this.id = view.id;
    this.spec = spec;
    this.view = view;
    this.expiresAtMs = view.expiresAt === null ? Infinity : Date.parse(view.expiresAt);
    this.pausedState = view.state === 'paused';
    this.budget = { left: ctx.maxSpillBytes };
    this.files = new RemoteFiles(
      this.id,
      ctx.api,
      ctx.caller,
      () => this.assertRunnable(),
      (e) => this.mapGone(e),
    );
  }

  get info(): RemoteSandboxInfo {
    const t = this.view.template;
    return {
      id: this.id,
      backend: this.view.backend,
      createdAt: new Date(this.view.createdAt),
      expiresAt: Number.isFinite(this.expiresAtMs) ? new Date(this.expiresAtMs) : null,
      persistent: !Number.isFinite(this.expiresAtMs),
      paused: this.pausedState,
      metadata: this.view.metadata,
      ...(t !== undefined ? { template: t } : {}),
    };
  }

  get paused(): boolean {
    return this.pausedState;
  }

  /** False once killed, past its TTL (by the server's deadline), or found gone on the server. */
  get alive(): boolean {
    if (this.gone === undefined && Date.now() >= this.expiresAtMs) this.markGone('ttl');
    return this.gone === undefined;
  }

  /**
   * Move the TTL to `ttlMs` from now. The local deadline moves at once (so `info` and `alive` see
   * it); the returned promise settles when the server has it. A caller that does not await it (as
   * with the library's synchronous setTimeout) is not left with an unhandled rejection.
   */
  setTimeout(ttlMs: number): Promise<void> {
    const done = (async () => {
      this.assertAlive();
      if (!Number.isInteger(ttlMs) || ttlMs < 1000 || ttlMs > 86_400_000) {
        throw new AirlockError('INVALID_ARGUMENT', 'ttlMs must be an integer from 1000 to 86400000', {
          field: 'ttlMs',
        });
      }
      const previous = this.expiresAtMs;
      this.expiresAtMs = Date.now() + ttlMs;
      try {
        this.adopt(await this.ctx.api.setTimeout(this.id, ttlMs, this.ctx.caller));
      } catch (e) {
        this.expiresAtMs = previous;
        throw this.mapGone(e);
      }
    })();
    done.catch(() => {});
    return done;
  }

  exec(cmd: ExecCommand, opts: ExecOptions & { background: true }): Promise<ExecHandle>;
  exec(cmd: ExecCommand, opts?: ExecOptions & { background?: false }): Promise<ExecResult>;
  async exec(cmd: ExecCommand, opts: ExecOptions = {}): Promise<ExecResult | ExecHandle> {
    this.assertRunnable();
    const argv = parseCommand(cmd);
    const o = parseOrThrow(ExecOptionsSchema, opts, 'exec options', 'INVALID_ARGUMENT');
    if (opts.signal?.aborted) throw new AirlockError('ABORTED', 'exec aborted before it started');
    checkSpillDir(this.ctx.spillDir); // before the command runs, not once its output overflows
    const req: ExecRequest = {
      cmd: typeof cmd === 'string' ? cmd : argv,
      cwd: o.cwd,
      ...(Object.keys(o.env).length ? { env: o.env } : {}),
      // No maxOutputBytes: the server would drop output past it, and this client shapes the output
      // itself (callbacks see every byte, the spill file gets the whole stream).
      ...(opts.background && opts.timeoutMs === undefined ? {} : { timeoutMs: o.timeoutMs }),
    };
    const shape = {
      maxOutputBytes: o.maxOutputBytes,
      spillDir: this.ctx.spillDir,
      maxSpillBytes: this.ctx.maxSpillBytes,
      budget: this.budget,
      onStdout: opts.onStdout,
      onStderr: opts.onStderr,
    };
    const text = stdinText(opts.stdin);
    if (!opts.background && (opts.stdin === undefined || text !== undefined)) {
      // One request: the command's stdin (if any) goes with it as text.
      const ac = new AbortController();
      const onAbort = (): void => ac.abort();
      opts.signal?.addEventListener('abort', onAbort, { once: true });
      try {
        const events = this.ctx.api.exec(
          this.id,
          text === undefined ? req : { ...req, stdin: text },
          this.ctx.caller,
          ac.signal,
        );
        return await shapeExec(this.guard(events), shape, { aborted: () => ac.signal.aborted });
      } catch (e) {
        throw this.mapGone(e);
      } finally {
        opts.signal?.removeEventListener('abort', onAbort);
      }
    }
    // A process: stdin streamed to it (bytes or a Readable), or a background command.
    let pv;
    try {
      pv = await this.ctx.api.startProcess(this.id, req, this.ctx.caller);
    } catch (e) {
      throw this.mapGone(e);
    }
    const pid = pv.pid;
    const kill = (): Promise<void> => this.ctx.api.killProcess(this.id, pid, this.ctx.caller).catch(() => {});
    const onAbort = (): void => void kill();
    opts.signal?.addEventListener('abort', onAbort, { once: true });
    if (opts.signal?.aborted) onAbort();
    void this.feed(pid, opts.stdin);
    const result = shapeExec(this.guard(this.ctx.api.connectProcess(this.id, pid, this.ctx.caller)), shape, {
      aborted: () => false,
    })
      .catch((e: unknown) => {
        throw this.mapGone(e);
      })
      .finally(() => {
        opts.signal?.removeEventListener('abort', onAbort);
        this.running.delete(entry);
      });
    const entry = {
      settle: () =>
        result.then(
          () => {},
          () => {},
        ),
    };
    this.running.add(entry);
    if (!opts.background) return result;
    result.catch(() => {}); // surfaced by wait()
    return {
      id: pid,
      wait: () => result,
      kill: async () => {
        await kill();
        await entry.settle();
      },
    };
  }

  /**
   * A process with raw stdin/stdout/stderr streams and no output shaping (e.g. a stdio MCP server),
   * as the library's spawn. It dies with the sandbox, with kill(), and with `signal`.
   */
  async spawn(cmd: ExecCommand, opts: SpawnOptions = {}): Promise<SandboxProcess> {
    this.assertRunnable();
    const argv = parseCommand(cmd);
    const o = parseOrThrow(
      ExecOptionsSchema,
      { cwd: opts.cwd, env: opts.env },
      'spawn options',
      'INVALID_ARGUMENT',
    );
    if (opts.signal?.aborted) throw new AirlockError('ABORTED', 'spawn aborted before it started');
    const req: ExecRequest = {
      cmd: typeof cmd === 'string' ? cmd : argv,
      cwd: o.cwd,
      ...(Object.keys(o.env).length ? { env: o.env } : {}),
    };
    try {
      return await remoteSpawn(this.ctx.api, this.ctx.caller, this.id, req, opts.signal);
    } catch (e) {
      throw this.mapGone(e);
    }
  }

  /** Send a process its stdin (bytes or a stream) and then EOF; errors mean it exited already. */
  private async feed(pid: string, stdin: ExecOptions['stdin']): Promise<void> {
    const api = this.ctx.api;
    try {
      if (stdin instanceof Readable) {
        for await (const chunk of stdin as AsyncIterable<Buffer | string>) {
          const b = typeof chunk === 'string' ? Buffer.from(chunk) : chunk;
          if (b.length) await api.sendStdin(this.id, pid, b, this.ctx.caller);
        }
      } else if (stdin !== undefined) {
        const b = typeof stdin === 'string' ? Buffer.from(stdin) : stdin;
        // Bounded requests: a large input goes in 1 MiB parts.
        for (let i = 0; i < b.length; i += 1 << 20) {
          await api.sendStdin(this.id, pid, b.subarray(i, i + (1 << 20)), this.ctx.caller);
        }
      }
      await api.closeStdin(this.id, pid, this.ctx.caller);
    } catch {
      /* the process is gone (or ignores its input): its exit says why */
    }
  }

  /**
   * Run code on the server's sandbox (the library's runCode: the analysis runs there, a denial throws
   * CODE_DENIED with its findings). Aborting `signal` mid-run closes the stream: the server kills the
   * run, and this throws ABORTED.
   */
  async runCode(code: string, opts: RunCodeOptions = {}): Promise<Execution> {
    this.assertRunnable();
    const api = this.codeApi();
    if (opts.signal?.aborted) throw new AirlockError('ABORTED', 'runCode aborted before it started');
    const req: RunCodeRequest = {
      code,
      ...(opts.language !== undefined ? { language: opts.language } : {}),
      ...(opts.context !== undefined ? { context: opts.context.id } : {}),
      ...(opts.timeoutMs !== undefined ? { timeoutMs: opts.timeoutMs } : {}),
      ...(opts.envs !== undefined ? { envs: { ...opts.envs } } : {}),
      ...(opts.policy !== undefined ? { policy: opts.policy } : {}),
    };
    try {
      return await executionFromEvents(api.runCode(this.id, req, this.ctx.caller, opts.signal), opts);
    } catch (e) {
      throw this.mapGone(e);
    }
  }

  /** A stateful code context on the server's sandbox. */
  async createCodeContext(opts: CreateCodeContextOptions = {}): Promise<CodeContextRef> {
    this.assertRunnable();
    const req = {
      ...(opts.language !== undefined ? { language: opts.language } : {}),
      ...(opts.cwd !== undefined ? { cwd: opts.cwd } : {}),
      ...(opts.envs !== undefined ? { envs: { ...opts.envs } } : {}),
    };
    return this.codeApi()
      .createCodeContext(this.id, req, this.ctx.caller)
      .catch((e: unknown) => {
        throw this.mapGone(e);
      });
  }

  async listCodeContexts(): Promise<CodeContextRef[]> {
    this.assertAlive();
    return this.codeApi()
      .listCodeContexts(this.id, this.ctx.caller)
      .catch((e: unknown) => {
        throw this.mapGone(e);
      });
  }

  async closeCodeContext(ctx: CodeContextRef | string): Promise<void> {
    this.assertAlive();
    const id = typeof ctx === 'string' ? ctx : ctx.id;
    return this.codeApi()
      .closeCodeContext(this.id, id, this.ctx.caller)
      .catch((e: unknown) => {
        throw this.mapGone(e);
      });
  }

  private codeApi(): Required<
    Pick<SandboxApi, 'runCode' | 'createCodeContext' | 'listCodeContexts' | 'closeCodeContext'>
  > {
    const a = this.ctx.api;
    if (!a.runCode || !a.createCodeContext || !a.listCodeContexts || !a.closeCodeContext) {
      throw new AirlockError('BACKEND_UNAVAILABLE', 'this server does not run code (runCode)');
    }
    return a as Required<
      Pick<SandboxApi, 'runCode' | 'createCodeContext' | 'listCodeContexts' | 'closeCodeContext'>
    >;
  }

  /** Events, with `lost`/`gone` answers mapped like every other call. */
  private async *guard(events: AsyncIterable<ExecEvent>): AsyncGenerator<ExecEvent> {
    try {
      yield* events;
    } catch (e) {
      throw this.mapGone(e);
    }
  }

  /**
   * Subscribe to the sandbox's egress events; returns the unsubscribe function. Unlike the library's
   * (from now on), the server's stream starts with the attempts made so far, then each new one until
   * the sandbox dies. A listener that throws is ignored, as in the library.
   */
  onEgress(listener: (e: EgressEvent) => void): () => void {
    const ac = new AbortController();
    const stop = (): void => ac.abort();
    this.egressStops.add(stop);
    void (async () => {
      try {
        for await (const e of this.ctx.api.egressEvents(this.id, this.ctx.caller, ac.signal)) {
          try {
            listener(e);
          } catch {
            /* a listener's bug never breaks the stream */
          }
        }
      } catch {
        /* unsubscribed, or the sandbox is gone: the stream ends either way */
      } finally {
        this.egressStops.delete(stop);
      }
    })();
    return stop;
  }

  /**
   * Egress events as an async iterator (the attempts so far, then each new one) until the sandbox
   * dies or `signal` aborts, as the library's `for await (const e of sbx.watchEgress())`.
   */
  async *watchEgress(signal?: AbortSignal): AsyncGenerator<EgressEvent> {
    this.assertAlive();
    try {
      yield* this.ctx.api.egressEvents(this.id, this.ctx.caller, signal);
    } catch (e) {
      if (signal?.aborted) return;
      throw this.mapGone(e);
    }
  }

  /**
   * Replace the sandbox's network policy now (PUT /v1/sandboxes/:id/network), as the library's
   * sbx.setNetworkPolicy; `spec.network` is not kept here: the answer is the policy in force.
   */
  async setNetworkPolicy(policy: NetworkPolicyInput): Promise<NetworkPolicyView> {
    this.assertAlive();
    const api = this.ctx.api;
    if (!api.setNetworkPolicy)
      throw new AirlockError('BACKEND_UNAVAILABLE', 'this API cannot change network policies');
    try {
      return await api.setNetworkPolicy(this.id, policy, this.ctx.caller);
    } catch (e) {
      throw this.mapGone(e);
    }
  }

  async pause(): Promise<void> {
    this.assertAlive();
    try {
      this.adopt(await this.ctx.api.pause(this.id, this.ctx.caller));
      this.pausedState = true;
    } catch (e) {
      throw this.mapGone(e);
    }
  }

  async resume(): Promise<void> {
    this.assertAlive();
    try {
      this.adopt(await this.ctx.api.resume(this.id, this.ctx.caller));
      this.pausedState = false;
    } catch (e) {
      throw this.mapGone(e);
    }
  }

  /** Capture the sandbox's filesystem state on the server; `fork()` the snapshot for new sandboxes. */
  async snapshot(): Promise<RemoteSnapshot> {
    this.assertAlive();
    try {
      return new RemoteSnapshot(await this.ctx.api.snapshot(this.id, this.ctx.caller), this.ctx.fork);
    } catch (e) {
      throw this.mapGone(e);
    }
  }

  /** Kill it on the server (every process, every host resource there). Idempotent. */
  kill(): Promise<void> {
    this.killing ??= (async () => {
      const wasGone = this.gone;
      this.markGone('killed');
      try {
        if (wasGone === undefined) {
          await this.ctx.api.kill(this.id, this.ctx.caller).catch((e: unknown) => {
            // Already gone there (TTL, its supervisor died): nothing left to kill.
            if (!AirlockError.is(e, 'SANDBOX_NOT_FOUND') && !AirlockError.is(e, 'SANDBOX_GONE')) throw e;
          });
        }
      } finally {
        for (const stop of this.egressStops) stop();
        // Background commands end with it: their streams report the kill.
        await Promise.all([...this.running].map((r) => r.settle()));
      }
    })();
    return this.killing;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.kill();
  }

  private adopt(view: SandboxView): void {
    this.view = view;
    this.expiresAtMs = view.expiresAt === null ? Infinity : Date.parse(view.expiresAt);
    if (view.state === 'killed') this.markGone('killed');
    else if (view.state === 'expired') this.markGone('ttl');
    else if (view.state === 'lost') this.markGone('lost');
  }

  private markGone(why: 'killed' | 'ttl' | 'lost'): void {
    if (this.gone !== undefined) return;
    this.gone = why;
    this.ctx.onGone(this.id);
  }

  /** A sandbox this handle knew that the server no longer has is gone (SANDBOX_GONE), not unknown. */
  private mapGone(e: unknown): unknown {
    if (AirlockError.is(e, 'SANDBOX_PAUSED')) this.pausedState = true;
    if (!AirlockError.is(e, 'SANDBOX_NOT_FOUND') || e.field === 'path') return e;
    if (this.gone === undefined) this.markGone(Date.now() >= this.expiresAtMs ? 'ttl' : 'lost');
    return this.goneError();
  }

  private goneError(): AirlockError {
    const why =
      this.gone === 'ttl'
        ? 'its TTL expired'
        : this.gone === 'killed'
          ? 'it was killed'
          : `the server no longer has it${this.view.reason ? ` (${this.view.reason})` : ''}`;
    return new AirlockError('SANDBOX_GONE', `sandbox ${this.id} is gone (${why}); create a new one`);
  }

  /**
   * Whether a paused sandbox refuses a command is the server's answer (SANDBOX_PAUSED), not this
   * handle's: another client may have paused or resumed it since.
   */
  private assertRunnable(): void {
    this.assertAlive();
  }

  private assertAlive(): void {
    if (!this.alive) throw this.goneError();
  }
}

/** stdin up to this many bytes (as JSON text, at most 4 bytes each) goes with the exec request. */
const MAX_INLINE_STDIN = 256 * 1024;

/** stdin that can travel as the exec request's text field, or undefined (bytes that are not UTF-8, streams). */
function stdinText(stdin: ExecOptions['stdin']): string | undefined {
  // A large input is streamed to a process instead (request bodies are size-capped).
  if (typeof stdin === 'string') return stdin.length <= MAX_INLINE_STDIN / 4 ? stdin : undefined;
  if (stdin instanceof Uint8Array && stdin.length <= MAX_INLINE_STDIN / 4) {
    const t = Buffer.from(stdin).toString('utf8');
    return Buffer.from(t, 'utf8').equals(stdin) ? t : undefined;
  }
  return undefined;
}
