// The Sandbox facade: the E2B/PandaStack-shaped API over any backend. It owns everything above
// "run this argv": output shaping, timeouts, the TTL, cancellation, result classification, files.
import { randomBytes } from 'node:crypto';
import { join } from 'node:path';
import { Readable, type Duplex, type Writable } from 'node:stream';
import type { BackendProcess, BackendSandbox, LimitCounters, SpawnRequest } from '../core/backend.js';
import { AirlockError } from '../core/errors.js';
import { monotonicMs } from '../core/units.js';
import type { SnapshotRecord } from '../core/snapshot.js';
import {
  ExecOptionsSchema,
  parseCommand,
  parseOrThrow,
  type ExecCommand,
  type SandboxSpec,
} from '../core/spec.js';
import { defaultEnv } from '../core/env.js';
import { PROXY_PORT } from '../core/sandbox-sockets.js';
import type { EgressEvent } from '../egress/events.js';
import { OutputCapture, collectBytes } from './output.js';
import { SandboxFiles } from './files.js';
import { SandboxWorkspace } from './workspace.js';
import { checkedArgv } from './exec-check.js';
import { imageCheckedArgv, imageHelperArgv } from './image-tools.js';
import type { SnapshotBase } from './snapshot.js';
import type { CodeContextRef, CreateCodeContextOptions, Execution, RunCodeOptions } from '../core/code.js';
import type { AuditSink, CodeAuditEvent, NetworkAuditEvent } from '../mcp/audit.js';
import type { NetworkPolicy, NetworkPolicyInput } from '../core/network-spec.js';
import { changeNetworkPolicy, type SetEgressPolicy } from './network.js';
import type { CodeRunner } from './code/runner.js';

/** What ended a command early: timeout, TTL, OOM, pids limit, or a kill. */
export type KilledBy = 'timeout' | 'ttl' | 'oom' | 'pids' | 'killed';

/** What a finished command returned: exit code, output (bounded), what killed it. */
export interface ExecResult {
  readonly exitCode: number | null;
  readonly signal: NodeJS.Signals | null;
  readonly stdout: string;
  readonly stderr: string;
  readonly truncated: { readonly stdout: boolean; readonly stderr: boolean };
  /** Full output of the first truncated stream (stdout if both were). */
  readonly spillPath?: string;
  readonly spillPaths?: { readonly stdout?: string; readonly stderr?: string };
  readonly durationMs: number;
  readonly killedBy?: KilledBy;
  /**
   * Processes of the sandbox the kernel's OOM killer killed while this exec ran (its memory limit),
   * also when the exec's own top process survived (e.g. a child was killed and the parent went on).
   * Counted on the sandbox's cgroup: an exec running beside others in the same sandbox also counts
   * theirs. On the gVisor tier an OOM kill takes the whole exec (gVisor's kernel is the process
   * the host kills).
   */
  readonly oomKills: number;
  /** Egress attempts made while this exec ran (only for sandboxes with a network policy). */
  readonly egress?: readonly EgressEvent[];
}

/** Options of `sbx.exec()`: timeout, output cap, stdin, cwd, env, signal, background. */
export interface ExecOptions {
  /** Kill the whole process tree after this long (default 60 s; background: the sandbox TTL). */
  timeoutMs?: number;
  /** Bytes of stdout and of stderr kept in the result (head + tail); the rest is spilled to a file. */
  maxOutputBytes?: number;
  stdin?: string | Uint8Array | Readable;
  /** Absolute path inside the sandbox (default /workspace). */
  cwd?: string;
  /** Added to (and overriding) the sandbox env for this exec only. */
  env?: Record<string, string>;
  signal?: AbortSignal;
  onStdout?: (text: string) => void;
  onStderr?: (text: string) => void;
  background?: boolean;
}

/** A command started with `background: true`: wait for it or kill it. */
export interface ExecHandle {
  readonly id: string;
  /** Resolves with the result once the process tree has exited. */
  wait(): Promise<ExecResult>;
  /** SIGKILL the process tree; resolves once it is gone. */
  kill(): Promise<void>;
}

/** A long-running process with raw pipes (e.g. a stdio MCP server); see SandboxBase.spawn. */
export interface SandboxProcess {
  readonly id: string;
  readonly stdin: Writable;
  readonly stdout: Readable;
  readonly stderr: Readable;
  /** Resolves once the process tree is gone (never rejects). */
  readonly exited: Promise<{
    exitCode: number | null;
    signal: NodeJS.Signals | null;
    killedBy?: KilledBy;
    /**
     * Processes of the sandbox the OOM killer killed while it ran (as ExecResult.oomKills); the
     * library always counts them.
     */
    oomKills?: number;
  }>;
  /** SIGKILL the process tree; resolves once it is gone. */
  kill(): Promise<void>;
}

export interface SpawnOptions {
  cwd?: string;
  env?: Record<string, string>;
  signal?: AbortSignal;
}

/** A sandbox's public facts: id, backend, times, uid, template. */
export interface SandboxInfo {
  readonly id: string;
  readonly backend: SandboxSpec['backend'];
  readonly createdAt: Date;
  /** When the TTL ends it; null for a persistent sandbox (it lives until killed). */
  readonly expiresAt: Date | null;
  readonly persistent: boolean;
  /** True between pause() and resume(). */
  readonly paused: boolean;
  readonly metadata: Readonly<Record<string, string>>;
  readonly hostUid: number;
  /** The snapshot layers it started from, top first (empty for a fresh sandbox). */
  readonly layers: readonly string[];
  /** The template it started from: the digest that ran (and the name it was asked by, if any). */
  readonly template?: { readonly name?: string; readonly digest: string };
  /** The image its root is: the reference it was asked by and the digest that ran. */
  readonly image?: { readonly ref: string; readonly digest: string };
}

export interface SandboxHooks {
  readonly spillDir: string;
  readonly maxSpillBytes: number;
  readonly onGone: (id: string) => void;
  /** Environment the runtime adds (proxy variables, secret sentinels, CA paths); spec.env wins. */
  readonly env?: Readonly<Record<string, string>>;
  /** Runs when the sandbox dies, before its host resources go (e.g. egress listeners, secret lease). */
  readonly onKill?: () => Promise<void>;
  /** Whether the egress gateway saw nothing since a mark (then an exec need not wait for late events). */
  readonly egressQuiet?: { mark(): number; since(mark: number): boolean };
  /** Wraps a new snapshot's record into the Snapshot its runtime can fork. */
  readonly snapshot?: (record: SnapshotRecord) => SnapshotBase<SandboxBase>;
  /** Swaps the egress gateway's policy (absent: the sandbox has no network). */
  readonly setNetworkPolicy?: SetEgressPolicy;
  /** Where the code analysis's decisions go besides the sandbox's own code events (Airlock's `audit`). */
  readonly audit?: AuditSink;
}

/** Egress events kept per sandbox (the newest; the audit store keeps everything). */
const MAX_EGRESS_LOG = 10_000;

type KillReason = 'ttl' | 'killed';

export class SandboxBase {
  readonly id: string;
  /** Its spec; `network` is the policy in force (setNetworkPolicy replaces it). */
  get spec(): SandboxSpec {
    return this.specNow;
  }
  private specNow: SandboxSpec;
  private readonly networkListeners = new Set<(e: NetworkAuditEvent) => void>();
  readonly createdAt = new Date();
  readonly files: SandboxFiles;
  /** The workspace against its host dir: `diff()` gets a cow workspace's changes back. */
  readonly workspace: SandboxWorkspace;
  private readonly running = new Set<{ kill(reason: KilledBy): void }>();
  private readonly egressLog: EgressEvent[] = [];
  private readonly egressListeners = new Set<(e: EgressEvent) => void>();
  private readonly egressCollectors = new Set<EgressEvent[]>();
  /** Aborted when the sandbox starts dying (ends watchEgress iterators). */
  private readonly dead = new AbortController();
  private ttlTimer: NodeJS.Timeout | undefined;
  private pausedState = false;
  private killReason: KillReason | undefined;
  private killing: Promise<void> | undefined;
  private expiresAtMs: number;
  /** All spill files of this sandbox together stay under maxSpillBytes (the host disk is not its disk). */
  private readonly spillBudget: { left: number };
  private codeRunner: CodeRunner | undefined;
  private readonly codeListeners = new Set<(e: CodeAuditEvent) => void>();

  constructor(
    private readonly backend: BackendSandbox,
    spec: SandboxSpec,
    private readonly hooks: SandboxHooks,
  ) {
    this.id = backend.id;
    this.specNow = spec;
    this.spillBudget = { left: hooks.maxSpillBytes };
    if (spec.persistent) {
      this.expiresAtMs = Infinity; // exempt from the TTL: lives until kill() (or this process ends)
    } else {
      this.expiresAtMs = Date.now() + spec.ttlMs;
      // Reaped even if the caller forgets; unref'd so a forgotten sandbox does not keep Node alive.
      this.ttlTimer = setTimeout(() => void this.terminate('ttl'), spec.ttlMs);
      this.ttlTimer.unref();
    }
    this.files = new SandboxFiles((argv, o) => this.runRaw(argv, o));
    this.workspace = new SandboxWorkspace((argv, o) => this.runRaw(argv, o), spec.workspace.hostDir);
  }

  get info(): SandboxInfo {
    return {
      id: this.id,
      backend: this.spec.backend,
      createdAt: this.createdAt,
      expiresAt: Number.isFinite(this.expiresAtMs) ? new Date(this.expiresAtMs) : null,
      persistent: this.spec.persistent === true,
      paused: this.pausedState,
      metadata: this.spec.metadata,
      hostUid: this.backend.hostUid,
      layers: this.spec.layers ?? [],
      ...(this.spec.rootfs?.image ? { image: { ...this.spec.rootfs.image } } : {}),
      ...(typeof this.spec.template === 'object' ? { template: this.spec.template } : {}),
    };
  }

  /** True between pause() and resume(): its processes are frozen and exec/files are refused. */
  get paused(): boolean {
    return this.pausedState;
  }

  get alive(): boolean {
    return this.killing === undefined;
  }

  /** Extend (or shorten) the TTL from now. A persistent sandbox has no TTL (INVALID_ARGUMENT). */
  setTimeout(ttlMs: number): void {
    this.assertAlive();
    if (this.spec.persistent) {
      throw new AirlockError(
        'INVALID_ARGUMENT',
        `sandbox ${this.id} is persistent: it has no TTL and lives until kill()`,
        { field: 'ttlMs' },
      );
    }
    clearTimeout(this.ttlTimer);
    this.ttlTimer = setTimeout(() => void this.terminate('ttl'), ttlMs);
    this.ttlTimer.unref();
    this.expiresAtMs = Date.now() + ttlMs;
  }

  /**
   * Replace the sandbox's network policy while it runs (namespaces, gVisor and microVM tiers: the
   * egress gateway swaps it atomically). New connections, each new request on a kept-alive
   * connection and DNS answers follow the new policy at once; open connections it denies are
   * closed; secrets bound to hosts it denies are no longer swapped in. `spec.network` shows it, and
   * the change is an audit event (`{ kind: 'network' }`, onNetworkPolicy).
   * @throws AirlockError INVALID_ARGUMENT (a malformed policy; a sandbox created with no network;
   * a different `transparent`), SANDBOX_GONE.
   */
  async setNetworkPolicy(policy: NetworkPolicyInput): Promise<NetworkPolicy> {
    this.assertAlive();
    const now = changeNetworkPolicy(
      {
        sandboxId: this.id,
        current: this.specNow.network,
        setEgress: this.hooks.setNetworkPolicy,
        audit: this.hooks.audit,
        listeners: this.networkListeners,
      },
      policy,
    );
    this.specNow = { ...this.specNow, network: now };
    return now;
  }

  /** Subscribe to network policy changes; returns the unsubscribe function. */
  onNetworkPolicy(listener: (e: NetworkAuditEvent) => void): () => void {
    this.networkListeners.add(listener);
    return () => this.networkListeners.delete(listener);
  }

  exec(cmd: ExecCommand, opts: ExecOptions & { background: true }): Promise<ExecHandle>;
  exec(cmd: ExecCommand, opts?: ExecOptions & { background?: false }): Promise<ExecResult>;
  async exec(cmd: ExecCommand, opts: ExecOptions = {}): Promise<ExecResult | ExecHandle> {
    this.assertRunnable();
    const argv = parseCommand(cmd);
    const o = parseOrThrow(ExecOptionsSchema, opts, 'exec options', 'INVALID_ARGUMENT');
    if (opts.signal?.aborted) throw new AirlockError('ABORTED', 'exec aborted before it started');
    const timeoutMs = opts.background && opts.timeoutMs === undefined ? undefined : o.timeoutMs;
    const execId = randomBytes(6).toString('hex');
    const started = monotonicMs();
    const egressMark = this.hooks.egressQuiet?.mark();
    const env = this.envWith(o.env);
    const { before, proc } = await this.spawnCounted({
      argv: this.execArgv(cmd, argv, env),
      env,
      cwd: opts.cwd === undefined ? this.defaultCwd : o.cwd,
      stdin: opts.stdin !== undefined,
    });
    const run = this.supervise(proc, execId, {
      before,
      started,
      egressMark,
      timeoutMs,
      maxOutputBytes: o.maxOutputBytes,
      stdin: opts.stdin,
      signal: opts.signal,
      onStdout: opts.onStdout,
      onStderr: opts.onStderr,
    });
    if (!opts.background) return run.result;
    return {
      id: execId,
      wait: () => run.result,
      kill: async () => {
        run.kill('killed');
        await run.result.catch(() => {});
      },
    };
  }

  /**
   * The limit counters before a process, and the process. A backend that reads them with each
   * process (countsWithProcesses: the microVM's guest agent, in the guest) gives them with it.
   * Otherwise counters() takes its reading when called (core/backend.ts), so the spawn does not wait
   * for it; if the reading fails after the spawn, the process is killed and waited for, and the
   * reading's error is the answer, as when it failed before the spawn.
   */
  private async spawnCounted(req: SpawnRequest): Promise<{ before: LimitCounters; proc: BackendProcess }> {
    if (this.backend.countsWithProcesses) {
      const proc = await this.backend.spawn(req);
      if (proc.counters) return { before: proc.counters.atStart, proc };
      proc.kill();
      await proc.exited;
      throw new AirlockError('INTERNAL', 'the backend started a process without its limit counters');
    }
    const reading = this.backend.counters();
    reading.catch(() => {}); // surfaced below once the spawn succeeded (a failed spawn is the answer)
    const proc = await this.backend.spawn(req);
    try {
      return { before: await reading, proc };
    } catch (e) {
      proc.kill();
      await proc.exited;
      throw e;
    }
  }

  /** The limit counters once `proc` is gone: read with it if the backend did, else now. */
  private countersAfter(proc: BackendProcess, before: LimitCounters): Promise<LimitCounters> {
    return (proc.counters?.atExit ?? this.backend.counters()).catch(() => before);
  }

  /**
   * Start a process with raw stdin/stdout/stderr pipes and no output shaping, for protocols spoken
   * over stdio (an MCP server). The caller must read stdout and stderr (unread pipes stall the
   * process). It dies with the sandbox (kill, TTL) and with `signal`.
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
    const env = this.envWith(o.env);
    const { before, proc } = await this.spawnCounted({
      argv: this.execArgv(cmd, argv, env),
      env,
      cwd: opts.cwd === undefined ? this.defaultCwd : o.cwd,
      stdin: true,
    });
    let killedBy: KilledBy | undefined;
    const entry = {
      kill: (reason: KilledBy) => {
        killedBy ??= reason;
        proc.kill();
      },
    };
    this.running.add(entry);
    const onAbort = (): void => entry.kill('killed');
    opts.signal?.addEventListener('abort', onAbort, { once: true });
    if (this.killing) entry.kill(this.killReason === 'ttl' ? 'ttl' : 'killed');
    proc.stdin!.on('error', () => {}); // EPIPE once the process is gone: its exit says why
    const exited = proc.exited.then(async (exit) => {
      this.running.delete(entry);
      opts.signal?.removeEventListener('abort', onAbort);
      // Read after every exit, as exec does: a child can be OOM-killed under a parent that exits 0.
      const after = await this.countersAfter(proc, before);
      const oomKills = Math.max(0, after.oomKills - before.oomKills);
      if (killedBy === undefined && exit.exitCode !== 0) {
        if (oomKills > 0) killedBy = 'oom';
        else if (after.pidsLimitHits > before.pidsLimitHits) killedBy = 'pids';
      }
      return {
        exitCode: exit.exitCode,
        signal: exit.signal ?? (killedBy !== undefined ? ('SIGKILL' as const) : null),
        ...(killedBy ? { killedBy } : {}),
        oomKills,
      };
    });
    return {
      id: randomBytes(6).toString('hex'),
      stdin: proc.stdin!,
      stdout: proc.stdout,
      stderr: proc.stderr,
      exited,
      kill: async () => {
        entry.kill('killed');
        await exited;
      },
    };
  }

  private supervise(
    proc: BackendProcess,
    execId: string,
    o: {
      before: LimitCounters;
      started: number;
      egressMark: number | undefined;
      timeoutMs: number | undefined;
      maxOutputBytes: number;
      stdin: ExecOptions['stdin'];
      signal: AbortSignal | undefined;
      onStdout: ((t: string) => void) | undefined;
      onStderr: ((t: string) => void) | undefined;
    },
  ): { result: Promise<ExecResult>; kill: (r: KilledBy) => void } {
    let killedBy: KilledBy | undefined;
    const entry = {
      kill: (reason: KilledBy) => {
        killedBy ??= reason;
        proc.kill();
      },
    };
    this.running.add(entry);
    const timer =
      o.timeoutMs === undefined ? undefined : setTimeout(() => entry.kill('timeout'), o.timeoutMs);
    const onAbort = (): void => entry.kill('killed');
    o.signal?.addEventListener('abort', onAbort, { once: true });
    if (o.signal?.aborted) onAbort(); // aborted while the process was being spawned
    if (this.killing) entry.kill(this.killReason === 'ttl' ? 'ttl' : 'killed'); // killed meanwhile

    const capture = (src: Readable, name: 'stdout' | 'stderr', onText?: (t: string) => void): OutputCapture =>
      new OutputCapture(src, {
        maxBytes: o.maxOutputBytes,
        maxSpillBytes: this.hooks.maxSpillBytes,
        budget: this.spillBudget,
        spillPath: () => join(this.hooks.spillDir, `${this.id}-${execId}.${name}`),
        name,
        ...(onText ? { onText } : {}),
      });
    const out = capture(proc.stdout, 'stdout', o.onStdout);
    const err = capture(proc.stderr, 'stderr', o.onStderr);
    feedStdin(proc, o.stdin);

    const egress: EgressEvent[] = [];
    this.egressCollectors.add(egress);
    const result = (async (): Promise<ExecResult> => {
      const exit = await proc.exited;
      const [so, se] = await Promise.all([out.finish(), err.finish()]);
      // Connections of the exited tree close on the next turns of the event loop; count them in
      // (unless nothing reached the egress gateway since the exec started: then there are none).
      const quiet = o.egressMark !== undefined && this.hooks.egressQuiet?.since(o.egressMark) === true;
      if (this.spec.network && !quiet) await new Promise((r) => setTimeout(r, 5));
      this.egressCollectors.delete(egress);
      if (timer) clearTimeout(timer);
      o.signal?.removeEventListener('abort', onAbort);
      this.running.delete(entry);
      // Read after every exec, not only a failed one: a child can be OOM-killed under a parent
      // that carries on and exits 0.
      const after = await this.countersAfter(proc, o.before);
      const oomKills = Math.max(0, after.oomKills - o.before.oomKills);
      if (killedBy === undefined && exit.exitCode !== 0) {
        if (oomKills > 0) killedBy = 'oom';
        else if (after.pidsLimitHits > o.before.pidsLimitHits) killedBy = 'pids';
      } else if (killedBy === 'timeout' && exit.exitCode !== 0) {
        // A fork bomb is held at pids.max until the timeout: say which limit it ran into.
        if (after.pidsLimitHits > o.before.pidsLimitHits) killedBy = 'pids';
      }
      const spillPaths = {
        ...(so.spillPath ? { stdout: so.spillPath } : {}),
        ...(se.spillPath ? { stderr: se.spillPath } : {}),
      };
      const spillPath = so.spillPath ?? se.spillPath;
      return {
        exitCode: exit.exitCode,
        signal: exit.signal ?? (killedBy !== undefined || exit.exitCode === 137 ? 'SIGKILL' : null),
        stdout: so.text,
        stderr: se.text,
        truncated: { stdout: so.truncated, stderr: se.truncated },
        ...(spillPath ? { spillPath, spillPaths } : {}),
        durationMs: Math.round((monotonicMs() - o.started) * 1000) / 1000,
        ...(killedBy ? { killedBy } : {}),
        oomKills,
        ...(this.spec.network ? { egress } : {}),
      };
    })();
    return { result, kill: entry.kill };
  }

  /** Run argv and collect raw bytes (files API). Exceeding maxBytes → FILE_TOO_LARGE. */
  private async runRaw(
    argv: string[],
    o: { stdin?: Uint8Array | string; maxBytes: number; timeoutMs?: number },
  ): Promise<{ exitCode: number | null; stdout: Buffer; stderr: string }> {
    this.assertRunnable();
    const proc = await this.backend.spawn({
      // On an image root Airlock's helpers run on its static helper, not on the image's programs.
      argv: this.spec.rootfs ? imageHelperArgv(argv) : argv,
      env: this.envWith({}),
      cwd: '/',
      stdin: o.stdin !== undefined,
    });
    const entry = { kill: () => proc.kill() };
    this.running.add(entry);
    const timer = setTimeout(() => proc.kill(), o.timeoutMs ?? 60_000);
    feedStdin(proc, o.stdin);
    try {
      const [stdout, stderr] = await Promise.all([
        collectBytes(proc.stdout, o.maxBytes),
        collectBytes(proc.stderr, 64_000),
      ]);
      const exit = await proc.exited;
      if (stdout === undefined) {
        throw new AirlockError(
          'FILE_TOO_LARGE',
          `file is larger than maxBytes (${o.maxBytes}); raise maxBytes or read it with exec`,
        );
      }
      return { exitCode: exit.exitCode, stdout, stderr: (stderr ?? Buffer.alloc(0)).toString('utf8') };
    } finally {
      clearTimeout(timer);
      this.running.delete(entry);
    }
  }

  /** The complete environment of a process: defaults, runtime additions, spec.env, then `extra`. */
  private envWith(extra: Readonly<Record<string, string>>): Record<string, string> {
    return { ...defaultEnv(), ...this.imageEnv, ...this.hooks.env, ...this.spec.env, ...extra };
  }

  /** What a sandbox on an image starts with from its config (before Airlock's and the spec's env). */
  private get imageEnv(): Record<string, string> {
    const config = this.spec.rootfs?.config;
    if (!config) return {};
    const env: Record<string, string> = {};
    for (const kv of config.env) {
      const i = kv.indexOf('=');
      if (i > 0 && /^[A-Za-z_][A-Za-z0-9_]*$/.test(kv.slice(0, i))) env[kv.slice(0, i)] = kv.slice(i + 1);
    }
    // The image's user by name (host/image-root.privileged.ts names the sandbox user after it).
    const name = config.user.split(':')[0] ?? '';
    if (name !== '' && name !== 'root' && !/^\d+$/.test(name)) env.USER = name;
    return env;
  }

  /** Where a command runs when it names no cwd: the image's working dir, else /workspace. */
  private get defaultCwd(): string {
    return this.spec.rootfs?.config.workingDir || '/workspace';
  }

  /** The argv that runs a command: behind the exec check (a shell string too, on an image root). */
  private execArgv(cmd: ExecCommand, argv: string[], env: Readonly<Record<string, string>>): string[] {
    if (this.spec.rootfs) return imageCheckedArgv(argv, env);
    if (typeof cmd === 'string' || this.backend.checksCommands) return argv;
    return checkedArgv(argv, env);
  }

  /** Egress attempts so far (newest last; at most the latest 10,000). */
  get egressEvents(): readonly EgressEvent[] {
    return this.egressLog;
  }

  /** Subscribe to egress events; returns the unsubscribe function. */
  onEgress(listener: (e: EgressEvent) => void): () => void {
    this.egressListeners.add(listener);
    return () => this.egressListeners.delete(listener);
  }

  /**
   * Egress events as an async iterator, from now until the sandbox dies or `signal` aborts:
   * `for await (const e of sbx.watchEgress()) ...`.
   */
  async *watchEgress(signal?: AbortSignal): AsyncGenerator<EgressEvent> {
    const queue: EgressEvent[] = [];
    let wake: (() => void) | undefined;
    const off = this.onEgress((e) => {
      queue.push(e);
      wake?.();
    });
    const stop = (): void => wake?.();
    signal?.addEventListener('abort', stop);
    this.dead.signal.addEventListener('abort', stop);
    try {
      for (;;) {
        const e = queue.shift();
        if (e) {
          yield e;
          continue;
        }
        if (signal?.aborted || this.dead.signal.aborted) break;
        await new Promise<void>((r) => (wake = r));
        wake = undefined;
      }
    } finally {
      off();
      signal?.removeEventListener('abort', stop);
      this.dead.signal.removeEventListener('abort', stop);
    }
  }

  /** Called by the egress gateway for every attempt. */
  recordEgress(e: EgressEvent): void {
    this.egressLog.push(e);
    if (this.egressLog.length > MAX_EGRESS_LOG) this.egressLog.shift();
    for (const c of this.egressCollectors) c.push(e);
    for (const l of this.egressListeners) {
      try {
        l(e);
      } catch {
        /* a listener's bug never breaks egress */
      }
    }
  }

  /**
   * Capture the sandbox's filesystem state (what it changed in /workspace and /home/user; /tmp is
   * not captured) as a new immutable snapshot, which `fork()` starts independent sandboxes from.
   * The sandbox keeps running: its processes are frozen while the files are copied, then thawed (a
   * paused sandbox stays paused). The same content over the same parent gives the same snapshot id.
   */
  async snapshot(opts: { signal?: AbortSignal } = {}): Promise<SnapshotBase<this>> {
    this.assertAlive();
    if (!this.backend.snapshot || !this.hooks.snapshot) {
      throw new AirlockError('BACKEND_UNAVAILABLE', `backend "${this.spec.backend}" cannot take snapshots`);
    }
    if (opts.signal?.aborted) throw new AirlockError('ABORTED', 'snapshot aborted before it started');
    const record = await this.backend.snapshot(opts.signal);
    // The runtime's forks are of this sandbox's own class (Airlock makes every Sandbox).
    return this.hooks.snapshot(record) as SnapshotBase<this>;
  }

  /**
   * Freeze every process of the sandbox (cgroup freezer): nothing in it runs until resume(). While
   * paused, exec/spawn/files throw SANDBOX_PAUSED (nothing is queued); running commands stay frozen.
   * Their timeouts and the TTL (unless persistent) keep counting: kill() and the TTL kill a paused
   * sandbox at once; a command whose own timeout strikes while paused dies then on cgroup v2, and
   * when the sandbox is resumed (or killed) on cgroup v1, where frozen tasks hold a pending SIGKILL.
   * Idempotent.
   */
  async pause(): Promise<void> {
    this.assertAlive();
    if (!this.backend.pause) {
      throw new AirlockError('BACKEND_UNAVAILABLE', `backend "${this.spec.backend}" cannot pause sandboxes`);
    }
    this.pausedState = true; // refuse new commands from now on, not only once frozen
    try {
      await this.backend.pause();
    } catch (e) {
      this.pausedState = false;
      throw e;
    }
  }

  /** Thaw a paused sandbox. Idempotent. */
  async resume(): Promise<void> {
    this.assertAlive();
    if (!this.backend.resume) {
      throw new AirlockError('BACKEND_UNAVAILABLE', `backend "${this.spec.backend}" cannot pause sandboxes`);
    }
    await this.backend.resume();
    this.pausedState = false;
  }

  /**
   * A TCP connection to `port` on the sandbox's own loopback (127.0.0.1 inside its network
   * namespace; a server listening on 0.0.0.0 there is reached too), e.g. to proxy a preview URL.
   * Nothing outside the sandbox can be reached this way. PORT_UNREACHABLE when nothing listens;
   * the connection closes when the sandbox dies. With a network policy, port 3128 is Airlock's own
   * egress proxy and is refused.
   */
  async connectPort(port: number, opts: { signal?: AbortSignal } = {}): Promise<Duplex> {
    this.assertRunnable();
    if (typeof port !== 'number' || !Number.isInteger(port) || port < 1 || port > 65535) {
      throw new AirlockError(
        'INVALID_ARGUMENT',
        `port must be an integer from 1 to 65535, not ${String(port)}`,
        {
          field: 'port',
        },
      );
    }
    if (this.spec.network && port === PROXY_PORT) {
      throw new AirlockError(
        'PERMISSION_DENIED',
        `port ${PROXY_PORT} of sandbox ${this.id} is Airlock's egress proxy, not the sandbox's: serve on another port`,
        { field: 'port' },
      );
    }
    if (!this.backend.connectPort) {
      throw new AirlockError(
        'BACKEND_UNAVAILABLE',
        `backend "${this.spec.backend}" cannot connect to sandbox ports`,
      );
    }
    return this.backend.connectPort(port, opts.signal);
  }

  /**
   * Run code in the sandbox and get its output and rich results (issue 34). The static analysis
   * (`codePolicy` of the spec, or `opts.policy`) runs first: a denied run never starts and throws
   * CODE_DENIED (a CodeDeniedError with `findings`). Without `opts.context` the code runs in a fresh
   * one-shot context; in a context its state persists. A timeout or abort kills the context's kernel
   * (the Execution's error says so; the next run starts it empty). See docs/guides/code-execution.md.
   */
  runCode(code: string, opts: RunCodeOptions = {}): Promise<Execution> {
    return this.code().then((c) => c.run(code, opts));
  }

  /** A stateful code context: variables, imports and functions persist across its runs. */
  createCodeContext(opts: CreateCodeContextOptions = {}): Promise<CodeContextRef> {
    return this.code().then((c) => c.create(opts));
  }

  /** The sandbox's open code contexts. */
  async listCodeContexts(): Promise<CodeContextRef[]> {
    this.assertAlive();
    return (await this.code()).list();
  }

  /** Close a code context: its kernel is killed and its state is gone. CODE_CONTEXT_NOT_FOUND if unknown. */
  async closeCodeContext(ctx: CodeContextRef | string): Promise<void> {
    this.assertAlive();
    return (await this.code()).close(ctx);
  }

  /** Subscribe to the code analysis's decisions (one per runCode); returns the unsubscribe function. */
  onCode(listener: (e: CodeAuditEvent) => void): () => void {
    this.codeListeners.add(listener);
    return () => this.codeListeners.delete(listener);
  }

  /**
   * The code runner, made on first use. Its module (kernels, frame protocol, and through them the
   * static analysis) is loaded then too: a sandbox that never runs code, such as every one-shot
   * `airlock run`, never initialises it (issue 31).
   */
  private async code(): Promise<CodeRunner> {
    const { CodeRunner } = await import('./code/runner.js');
    this.assertAlive(); // killed while the module loaded: no runner for a dead sandbox
    this.codeRunner ??= new CodeRunner({
      sandboxId: this.id,
      spec: this.spec,
      backend: this.backend,
      spawn: (argv, o) => this.spawn(argv, o),
      assertRunnable: () => this.assertRunnable(),
      alive: () => this.alive,
      report: (e) => {
        for (const l of [...this.codeListeners, ...(this.hooks.audit ? [this.hooks.audit] : [])]) {
          try {
            l(e);
          } catch {
            /* a listener's bug never breaks a run */
          }
        }
      },
    });
    return this.codeRunner;
  }

  /** Kill every process and release every host resource. Idempotent. */
  kill(): Promise<void> {
    return this.terminate('killed');
  }

  private terminate(reason: KillReason): Promise<void> {
    this.killing ??= (async () => {
      this.killReason = reason;
      this.dead.abort(reason); // a reason of our own: no DOMException (and its stack) per sandbox
      clearTimeout(this.ttlTimer);
      for (const r of this.running) r.kill(reason === 'ttl' ? 'ttl' : 'killed');
      this.codeRunner?.dispose();
      try {
        // Egress first: its synchronous part revokes the secret lease and closes the listeners at
        // once; the wait for their handles to close then overlaps the backend's teardown.
        const egressClosed = this.hooks.onKill?.().catch(() => {});
        try {
          await this.backend.destroy();
        } finally {
          await egressClosed;
        }
      } finally {
        this.hooks.onGone(this.id);
      }
    })();
    return this.killing;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.kill();
  }

  private assertRunnable(): void {
    this.assertAlive();
    if (this.pausedState) {
      throw new AirlockError(
        'SANDBOX_PAUSED',
        `sandbox ${this.id} is paused: resume() it before running commands or using its files`,
      );
    }
  }

  private assertAlive(): void {
    if (this.killing) {
      throw new AirlockError(
        'SANDBOX_GONE',
        `sandbox ${this.id} is gone (${this.killReason === 'ttl' ? 'its TTL expired' : 'it was killed'}); create a new one`,
      );
    }
  }
}

function feedStdin(proc: BackendProcess, stdin: ExecOptions['stdin']): void {
  if (!proc.stdin) return;
  proc.stdin.on('error', () => {}); // the process may exit without reading its input
  if (stdin === undefined) proc.stdin.end();
  else if (typeof stdin === 'string' || stdin instanceof Uint8Array) proc.stdin.end(stdin);
  else stdin.pipe(proc.stdin);
}
