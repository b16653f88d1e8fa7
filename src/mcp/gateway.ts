// The MCP gateway core: the configured servers (each a pool of sandboxed instances by boundary),
// the client sessions, and the wiring between them (server→client requests and notifications go to
// the session that caused them; stderr, frame errors, egress and exits become log lines and audit
// events). Transports (stdio for `airlock mcp`, Streamable HTTP for `airlock gateway`) sit on top.
import { mkdirSync, writeFileSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { join } from 'node:path';
import { McpError, type Implementation, type ServerCapabilities } from '@modelcontextprotocol/sdk/types.js';
import type { Logger } from '../core/backend.js';
import type { GuardOptions } from '../guard/output.js';
import type { McpSandboxProvider } from './sandbox-provider.js';
import type { AuditEvent, AuditSink } from './audit.js';
import { mcpEvent } from './audit.js';
import { ServerPool } from './pool.js';
import type { ServerEntry, ServerSetup } from './server-setup.js';
import { McpSession, type SessionHost } from './session.js';
import type { Upstream, UpstreamHooks } from './upstream.js';

export type { ServerEntry, ServerSetup };

/** Options of `GatewayCore` (exported as `McpGatewayOptions`). */
export interface GatewayOptions {
  readonly airlock: McpSandboxProvider;
  readonly servers: readonly ServerSetup[];
  /** 'single': one server, fronted transparently (its own capabilities and info); 'multi': a gateway. */
  readonly mode: 'single' | 'multi';
  readonly audit?: AuditSink;
  readonly logger?: Logger;
  /** A server's stderr line, e.g. written to Airlock's stderr with a prefix. */
  readonly onServerStderr?: (server: string, line: string) => void;
  /** Re-list interval per session (0: only at session start and on list_changed). Default 30 s. */
  readonly relistIntervalMs?: number;
  /** Per-request timeout towards a server (reset by progress). Default 120 s. */
  readonly callTimeoutMs?: number;
  /**
   * Hard wall-time cap of one tools/call, whatever progress it reports (a server's budgets.maxCallMs
   * can lower it). Default 10 min.
   */
  readonly callHardCapMs?: number;
  /** Where full outputs of truncated results are kept (default <stateDir>/spill/mcp). */
  readonly spillDir?: string;
}

/** The MCP gateway: sandboxed servers behind one policy-checked, guarded tool list. */
export class GatewayCore implements SessionHost {
  private readonly servers = new Map<string, ServerEntry>();
  private readonly sessions = new Set<McpSession>();
  readonly relistIntervalMs: number;
  readonly callTimeoutMs: number;
  readonly callHardCapMs: number;
  private readonly spillDir: string;
  private mirrored: { info?: Implementation; caps: ServerCapabilities; instructions?: string } | undefined;

  constructor(private readonly opts: GatewayOptions) {
    this.relistIntervalMs = opts.relistIntervalMs ?? 30_000;
    this.callTimeoutMs = opts.callTimeoutMs ?? 120_000;
    this.callHardCapMs = opts.callHardCapMs ?? 600_000;
    this.spillDir = opts.spillDir ?? join(opts.airlock.stateDir, 'spill', 'mcp');
    for (const setup of opts.servers) {
      const pool = new ServerPool(
        setup.launch,
        setup.boundary,
        opts.airlock,
        (key) => this.hooks(setup.name, key),
        opts.logger,
      );
      this.servers.set(setup.name, { setup, pool });
    }
  }

  entries(): ServerEntry[] {
    return [...this.servers.values()];
  }

  /** Start what runs regardless of clients. In single mode, mirror the server's capabilities. */
  async start(): Promise<void> {
    await Promise.all(this.entries().map((e) => e.pool.warm()));
    if (this.opts.mode === 'single') {
      const entry = this.entries()[0]!;
      const lease = await entry.pool.acquire({ sessionId: '', tenant: '', purpose: 'list' });
      const up = lease.upstream;
      await lease.release();
      const caps = up.capabilities;
      this.mirrored = {
        ...(up.client.getServerVersion() ? { info: up.client.getServerVersion()! } : {}),
        caps: {
          ...(caps.tools ? { tools: { listChanged: true } } : { tools: { listChanged: true } }),
          ...(caps.prompts ? { prompts: { listChanged: true } } : {}),
          ...(caps.resources
            ? { resources: { subscribe: caps.resources.subscribe === true, listChanged: true } }
            : {}),
          ...(caps.logging ? { logging: {} } : {}),
          ...(caps.completions ? { completions: {} } : {}),
        },
        ...(up.instructions !== undefined ? { instructions: up.instructions } : {}),
      };
    }
  }

  serverInfo(): Implementation {
    const m = this.mirrored?.info;
    return m
      ? { ...m, title: `${m.title ?? m.name} (via Airlock)` }
      : { name: 'airlock-gateway', version: '0.1.0' };
  }

  capabilities(): ServerCapabilities {
    return (
      this.mirrored?.caps ?? {
        tools: { listChanged: true },
        prompts: { listChanged: true },
        resources: { subscribe: true, listChanged: true },
        logging: {},
        completions: {},
      }
    );
  }

  /**
   * Instructions for the client. In single mode the server's own, unless the scanner quarantines
   * them; a gateway gives none (servers' instructions would speak for each other).
   */
  instructions(): string | undefined {
    return this.mirrored?.instructions;
  }

  /** Hide the mirrored instructions (the scanner or a pin said so). */
  dropInstructions(): void {
    if (this.mirrored) delete this.mirrored.instructions;
  }

  audit(e: AuditEvent): void {
    try {
      this.opts.audit?.(e);
    } catch {
      /* a failing sink never breaks a call */
    }
  }

  guardOptions(sandboxId: string, setup: ServerSetup, tool: string): GuardOptions {
    const r = this.opts.airlock.redactionSetFor(sandboxId);
    return {
      maxTextBytes: setup.output.maxTextBytes,
      secrets: r.secrets,
      sentinels: r.sentinels,
      canaries: r.canaries,
      redactCredentialPatterns: true,
      flagInstructions: true,
      provenance: { server: setup.name, tool, sandboxId },
      spill: (full) => {
        mkdirSync(this.spillDir, { recursive: true, mode: 0o700 });
        const path = join(this.spillDir, `${sandboxId}-${randomBytes(6).toString('hex')}.txt`);
        writeFileSync(path, full, { mode: 0o600 });
        return path;
      },
    };
  }

  openSession(sessionId: string, tenant: string): McpSession {
    const s = new McpSession(this, sessionId, tenant);
    this.sessions.add(s);
    return s;
  }

  async sessionClosed(s: McpSession): Promise<void> {
    this.sessions.delete(s);
    await Promise.allSettled(this.entries().map((e) => e.pool.endSession(s.sessionId)));
  }

  /** Live sandboxed instances of a server (tests, status). */
  instances(server: string): Promise<Upstream[]> {
    return this.servers.get(server)?.pool.instances() ?? Promise.resolve([]);
  }

  get sessionCount(): number {
    return this.sessions.size;
  }

  async close(): Promise<void> {
    await Promise.allSettled([...this.sessions].map((s) => s.close()));
    await Promise.allSettled(this.entries().map((e) => e.pool.close()));
  }

  /**
   * The sessions that share an instance (its own session, its tenant's sessions, or everyone for the
   * per-server instance and the per-call lister; a per-call instance is nobody's between calls).
   */
  private sessionsFor(key: string): McpSession[] {
    const all = [...this.sessions];
    if (key.startsWith('session:')) return all.filter((s) => `session:${s.sessionId}` === key);
    if (key.startsWith('tenant:')) return all.filter((s) => `tenant:${s.tenant}` === key);
    if (key === 'call') return [];
    return all;
  }

  /**
   * The one session a message of instance `up` belongs to: the session whose request is in flight on
   * that instance, when exactly one session has requests there (stdio says nothing more); a
   * per-session instance's own session otherwise. Never "any session" or "the last one": an
   * ambiguous message goes nowhere.
   */
  private ownerOf(key: string, up: Upstream): McpSession | undefined {
    const own = key.startsWith('session:') || key.startsWith('tenant:');
    const candidates = own ? this.sessionsFor(key) : [...this.sessions];
    const callers = up.callerSessions();
    if (callers.length === 1) return candidates.find((s) => s.sessionId === callers[0]);
    if (callers.length === 0 && key.startsWith('session:')) return candidates[0];
    return undefined;
  }

  private unrouted(server: string, key: string, up: Upstream, method: string): string {
    const n = up.callerSessions().length;
    const why =
      method === 'notifications/resources/updated'
        ? 'no session that shares the instance subscribed to that resource'
        : `${n === 0 ? 'no client request is in flight on it' : `requests of ${n} sessions are in flight on it`}, so Airlock cannot tell which session it belongs to`;
    const reason = `${method} from server instance (${key}) not delivered: ${why}`;
    this.audit(
      mcpEvent({
        sandboxId: up.sandbox.id,
        server,
        method,
        decision: 'deny',
        code: 'unrouted',
        reason,
      }),
    );
    return reason;
  }

  private hooks(server: string, key: string): UpstreamHooks {
    const log = this.opts.logger;
    return {
      onSandbox: (sbx) => sbx.onEgress((e) => this.audit({ ...e, kind: 'egress', server })),
      onStderr: (line) => {
        if (this.opts.onServerStderr) this.opts.onServerStderr(server, line);
        else log?.info({ server, stderr: line }, 'mcp server stderr');
      },
      onFrameError: (info) => {
        this.opts.onServerStderr?.(
          server,
          `[airlock] dropped a broken frame from the server: ${info.reason}`,
        );
        this.audit(
          mcpEvent({
            sandboxId: '',
            server,
            method: 'frame',
            decision: 'error',
            code: `frame_${info.code}`,
            reason: info.reason,
          }),
        );
      },
      onExit: (e) => {
        this.audit(
          mcpEvent({
            sandboxId: '',
            server,
            method: 'exit',
            decision: 'error',
            code: e.killedBy ?? 'exit',
            reason: `server instance (${key}) exited: ${e.exitCode ?? e.signal}${e.killedBy ? ` (${e.killedBy})` : ''}`,
          }),
        );
      },
      onServerRequest: async (req, signal, up) => {
        const s = this.ownerOf(key, up);
        if (!s) throw new McpError(-32603, this.unrouted(server, key, up, req.method));
        return s.fromServerRequest(server, req, signal, up);
      },
      onNotification: (n, up) => {
        if (n.method.endsWith('/list_changed')) {
          // No data, only "list again": every session that shares the instance re-lists.
          const owner = key === 'call' ? this.ownerOf(key, up) : undefined;
          for (const s of owner ? [owner] : this.sessionsFor(key))
            void s.fromServerNotification(server, n, up);
          return;
        }
        if (n.method === 'notifications/resources/updated') {
          // To the sessions sharing the instance that subscribed to that resource on it.
          const uri = (n.params as { uri?: unknown } | undefined)?.uri;
          const subscribed = this.sessionsFor(key).filter(
            (s) => typeof uri === 'string' && s.isSubscribed(server, uri),
          );
          if (subscribed.length === 0) this.unrouted(server, key, up, n.method);
          for (const s of subscribed) void s.fromServerNotification(server, n, up);
          return;
        }
        const s = this.ownerOf(key, up);
        if (s) void s.fromServerNotification(server, n, up);
        else this.unrouted(server, key, up, n.method);
      },
    };
  }
}
