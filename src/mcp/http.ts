// SECURITY-CRITICAL: the gateway's Streamable HTTP endpoint. Checked in this order, before any MCP
// processing: the path (/mcp), the Host header (DNS-rebinding protection: a page on evil.example
// that resolves to 127.0.0.1 sends Host: evil.example), the Origin header when present, the bearer
// token (one per tenant, compared in constant time), then the body through the canonical parser.
// A session id belongs to the tenant that created it; another tenant's token gets "not found".
// Each session's requests then go to its NodeStreamableTransport (streamable.ts: the Streamable HTTP
// rules themselves) and its McpSession (policy, guard, audit).
import * as crypto from 'node:crypto';
import { randomUUID, timingSafeEqual } from 'node:crypto';
import {
  createServer,
  type IncomingMessage,
  type Server as HttpServer,
  type ServerResponse,
} from 'node:http';
import type { AddressInfo } from 'node:net';
import type { EventStore } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { isInitializeRequest, type JSONRPCMessage } from '@modelcontextprotocol/sdk/types.js';
import { mcpEvent } from './audit.js';
import { FRAME_LIMITS, jsonRpcErrorFor, parseMessage } from './frame.js';
import type { GatewayCore } from './gateway.js';
import type { McpSession } from './session.js';
import { NodeStreamableTransport } from './streamable.js';

/** Options of `HttpFront`. */
export interface HttpFrontOptions {
  readonly host: string;
  readonly port: number;
  /** Tenants and their bearer tokens (at least one, unless `authenticate` is given). */
  readonly tenants?: ReadonlyArray<{ readonly name: string; readonly token: string }>;
  /**
   * The tenant a request acts for, or undefined (401), instead of `tenants`' tokens: e.g. `airlock
   * serve`, whose API keys (checked per request, so a revoked key stops at once) name the tenant.
   */
  readonly authenticate?: (req: IncomingMessage) => string | undefined;
  /** The 401 message (default: send the bearer token from the gateway config). */
  readonly unauthorizedMessage?: string;
  /** Host header values accepted (host:port, lower case). Default: the listen address and localhost forms. */
  readonly allowedHosts?: readonly string[];
  /**
   * Origin header values accepted when a request has one, besides the gateway's own origins
   * (http://<each allowed host>). Requests without Origin (non-browser clients) are not affected.
   */
  readonly extraOrigins?: readonly string[];
  readonly maxBodyBytes?: number;
  /** Sessions idle longer than this are closed (their per-session sandboxes killed). Default 30 min. */
  readonly sessionIdleMs?: number;
  /** Per session: bytes waiting for the client to read them before the session is closed (default 32 MiB). */
  readonly maxBufferedBytes?: number;
}

interface Live {
  readonly transport: NodeStreamableTransport;
  readonly session: McpSession;
  readonly tenant: string;
  lastUsed: number;
}

/**
 * SHA-256 of a token (compared in constant time). crypto.hash (Node >= 20.12, one call, no Hash
 * object: a third of createHash's cost on every request) where @types/node does not declare it yet.
 */
const oneShot = (crypto as unknown as { hash?: (alg: string, data: string, enc: 'buffer') => Buffer }).hash;
const digest = (s: string): Buffer =>
  oneShot ? oneShot('sha256', s, 'buffer') : crypto.createHash('sha256').update(s).digest();

/** The Streamable HTTP front of the gateway: tenants, Host/Origin checks, sessions. */
export class HttpFront {
  private readonly http: HttpServer;
  private readonly live = new Map<string, Live>();
  private readonly tokens: Array<{ name: string; hash: Buffer }>;
  private allowedHosts: Set<string>;
  private allowedOrigins: Set<string>;
  private sweeper: NodeJS.Timeout | undefined;

  constructor(
    private readonly core: GatewayCore,
    private readonly opts: HttpFrontOptions,
  ) {
    if (!opts.tenants?.length && !opts.authenticate)
      throw new Error('the HTTP gateway needs at least one tenant with a token');
    this.tokens = (opts.tenants ?? []).map((t) => ({ name: t.name, hash: digest(t.token) }));
    this.allowedHosts = new Set();
    this.allowedOrigins = new Set();
    this.http = createServer((req, res) => void this.handle(req, res));
  }

  async listen(): Promise<{ host: string; port: number; url: string }> {
    await new Promise<void>((resolve, reject) => {
      this.http.once('error', reject);
      this.http.listen(this.opts.port, this.opts.host, () => resolve());
    });
    const port = (this.http.address() as AddressInfo).port;
    return this.attach(port);
  }

  /**
   * Serve on another server instead of listening: that server hands /mcp requests to
   * handleRequest(). `port` is the one it listens on (the default Host and Origin checks use it).
   */
  attach(port: number): { host: string; port: number; url: string } {
    const hostPart = this.opts.host.includes(':') ? `[${this.opts.host}]` : this.opts.host;
    const defaults = [`${hostPart}:${port}`, `localhost:${port}`, `127.0.0.1:${port}`, `[::1]:${port}`];
    this.allowedHosts = new Set((this.opts.allowedHosts ?? defaults).map((h) => h.toLowerCase()));
    this.allowedOrigins = new Set(
      [...[...this.allowedHosts].map((h) => `http://${h}`), ...(this.opts.extraOrigins ?? [])].map((o) =>
        o.toLowerCase(),
      ),
    );
    const idle = this.opts.sessionIdleMs ?? 30 * 60_000;
    if (this.sweeper) clearInterval(this.sweeper);
    this.sweeper = setInterval(() => this.sweep(idle), Math.min(idle, 60_000));
    this.sweeper.unref();
    return { host: this.opts.host, port, url: `http://${hostPart}:${port}/mcp` };
  }

  /** One request of an attached front (every check of a listening one applies). */
  handleRequest(req: IncomingMessage, res: ServerResponse): Promise<void> {
    return this.handle(req, res);
  }

  get sessionCount(): number {
    return this.live.size;
  }

  async close(): Promise<void> {
    if (this.sweeper) clearInterval(this.sweeper);
    await Promise.allSettled([...this.live.values()].map((l) => l.transport.close()));
    this.live.clear();
    if (!this.http.listening) return; // attached to another server: it closes its own
    this.http.closeAllConnections?.();
    await new Promise<void>((r) => this.http.close(() => r()));
  }

  private sweep(idleMs: number): void {
    const now = Date.now();
    for (const [id, l] of this.live) {
      if (now - l.lastUsed > idleMs) {
        this.live.delete(id);
        void l.transport.close();
      }
    }
  }

  private tenantOf(req: IncomingMessage): string | undefined {
    if (this.opts.authenticate) return this.opts.authenticate(req);
    const m = /^Bearer\s+(\S+)\s*$/i.exec(req.headers.authorization ?? '');
    if (!m) return undefined;
    const h = digest(m[1]!);
    let found: string | undefined;
    // Compare against every tenant (no early exit) so timing says nothing about which one matched.
    for (const t of this.tokens) if (timingSafeEqual(h, t.hash)) found ??= t.name;
    return found;
  }

  private reject(
    res: ServerResponse,
    status: number,
    message: string,
    headers: Record<string, string> = {},
  ): void {
    rejectJsonRpc(res, status, message, headers);
  }

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    try {
      if (req.url !== '/mcp' && new URL(req.url ?? '/', 'http://gateway').pathname !== '/mcp')
        return this.reject(res, 404, 'not found: the MCP endpoint is /mcp');
      const host = (req.headers.host ?? '').toLowerCase();
      if (!this.allowedHosts.has(host)) {
        this.auditHttp(
          'host_rejected',
          `request with Host "${host.slice(0, 80)}" refused (DNS-rebinding protection)`,
        );
        return this.reject(res, 403, 'forbidden: Host header not allowed');
      }
      const origin = req.headers.origin;
      if (origin !== undefined && !this.allowedOrigins.has(origin.toLowerCase())) {
        this.auditHttp('origin_rejected', `request with Origin "${origin.slice(0, 80)}" refused`);
        return this.reject(res, 403, 'forbidden: Origin not allowed');
      }
      const tenant = this.tenantOf(req);
      if (!tenant) {
        this.auditHttp('unauthorized', 'request without a valid bearer token refused');
        return this.reject(
          res,
          401,
          this.opts.unauthorizedMessage ??
            'unauthorized: send Authorization: Bearer <token> from the gateway config',
          {
            'www-authenticate': 'Bearer realm="airlock"',
          },
        );
      }
      const sid = req.headers['mcp-session-id'];
      const sessionId = Array.isArray(sid) ? sid[0] : sid;

      let body: JSONRPCMessage | undefined;
      if (req.method === 'POST') {
        const raw = await readBody(req, this.opts.maxBodyBytes ?? FRAME_LIMITS.maxFrameBytes);
        if (raw === undefined) {
          this.auditHttp('frame_oversized', 'dropped a request body over the size limit', tenant);
          return this.reject(res, 413, 'request body too large');
        }
        const parsed = parseMessage(raw);
        if (!parsed.ok) {
          this.auditHttp(
            `frame_${parsed.code}`,
            `dropped a broken frame from a client: ${parsed.reason}`,
            tenant,
          );
          // A broken answer (to sampling, elicitation, roots) fails the session's pending request with
          // that id now; only the caller's own session is touched.
          const own = sessionId === undefined ? undefined : this.live.get(sessionId);
          if (parsed.responseId !== undefined && own?.tenant === tenant) {
            const { error } = jsonRpcErrorFor({ ok: false, code: parsed.code, reason: parsed.reason });
            own.transport.receiveLocal({
              jsonrpc: '2.0',
              id: parsed.responseId,
              error: { code: error.code, message: `Airlock dropped the client's answer: ${error.message}` },
            });
          }
          // The error names the request id when the frame carried one (recoverIds), else null.
          res.writeHead(400, { 'content-type': 'application/json' });
          res.end(JSON.stringify(jsonRpcErrorFor(parsed)));
          return;
        }
        body = parsed.message as JSONRPCMessage;
      }

      if (sessionId !== undefined) {
        const l = this.live.get(sessionId);
        // Unknown, expired, or another tenant's session: the same answer, so ids cannot be probed.
        if (!l || l.tenant !== tenant)
          return this.reject(res, 404, 'session not found; initialize a new session');
        l.lastUsed = Date.now();
        // The transport refuses a request whose id is still in flight in this session (it would take
        // over the first one's answer).
        await l.transport.handleRequest(req, res, body);
        return;
      }
      // Only a valid initialize opens a session: the SDK refuses any other, and nothing would close it.
      if (req.method !== 'POST' || !body || !isInitializeRequest(body)) {
        return this.reject(res, 400, 'bad request: no mcp-session-id; start with an initialize request');
      }
      const transport: NodeStreamableTransport = new NodeStreamableTransport({
        sessionIdGenerator: () => randomUUID(),
        eventStore: new MemoryEventStore(),
        // A client whose SSE stream ends before the answer reconnects (Last-Event-ID) after 1 s.
        retryIntervalMs: 1000,
        onsessioninitialized: (id) => {
          this.live.set(id, { transport, session, tenant, lastUsed: Date.now() });
        },
        onsessionclosed: (id) => {
          this.live.delete(id);
        },
        ...(this.opts.maxBufferedBytes !== undefined ? { maxBufferedBytes: this.opts.maxBufferedBytes } : {}),
        onoverflow: (info) =>
          this.core.audit(
            mcpEvent({
              sandboxId: '',
              server: '*',
              method: 'transport',
              session: session.sessionId,
              tenant,
              decision: 'error',
              code: 'client_overflow',
              reason: `the client is not reading: ${info.bufferedBytes} bytes wait for it (cap ${info.maxBufferedBytes}); session closed`,
            }),
          ),
      });
      const session = this.core.openSession(randomUUID(), tenant);
      transport.onclose = () => {
        if (transport.sessionId) this.live.delete(transport.sessionId);
        void session.close();
      };
      await session.connect(transport);
      await transport.handleRequest(req, res, body);
    } catch (e) {
      this.reject(res, 500, `internal error: ${(e as Error).message}`);
    }
  }

  private auditHttp(code: string, reason: string, tenant?: string): void {
    this.core.audit(
      mcpEvent({
        sandboxId: '',
        server: '*',
        method: 'http',
        decision: 'deny',
        code,
        reason,
        ...(tenant ? { tenant } : {}),
      }),
    );
  }
}

/** An HTTP refusal as a JSON-RPC error with no id (unless the response has begun). */
export function rejectJsonRpc(
  res: ServerResponse,
  status: number,
  message: string,
  headers: Record<string, string> = {},
): void {
  if (res.headersSent) return;
  res.writeHead(status, { 'content-type': 'application/json', ...headers });
  res.end(JSON.stringify({ jsonrpc: '2.0', id: null, error: { code: -32000, message } }));
}

/** A request body up to `max` bytes; undefined (the rest drained unread) when it is longer. */
export function readBody(req: IncomingMessage, max: number): Promise<Buffer | undefined> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let n = 0;
    const onData = (c: Buffer): void => {
      n += c.length;
      if (n > max) {
        // Over the limit: stop holding it, drain the rest unread.
        req.off('data', onData);
        req.resume();
        resolve(undefined);
        return;
      }
      chunks.push(c);
    };
    req.on('data', onData);
    req.once('end', () => resolve(chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks)));
    req.once('error', reject);
  });
}

/**
 * Events kept per session for SSE resumption (a client reconnecting with Last-Event-ID gets what it
 * missed). Bounded: the oldest events go first.
 */
class MemoryEventStore implements EventStore {
  private readonly events: Array<{ id: string; streamId: string; message: JSONRPCMessage; bytes: number }> =
    [];
  private n = 0;
  private bytes = 0;
  private static readonly MAX = 1000;
  /** Bounded in bytes too: 1,000 large events would otherwise be gigabytes per session. */
  private static readonly MAX_BYTES = 8 * 1024 * 1024;

  async storeEvent(streamId: string, message: JSONRPCMessage): Promise<string> {
    const id = `${streamId}_${++this.n}`;
    const bytes = JSON.stringify(message).length;
    this.events.push({ id, streamId, message, bytes });
    this.bytes += bytes;
    while (
      this.events.length > MemoryEventStore.MAX ||
      (this.bytes > MemoryEventStore.MAX_BYTES && this.events.length > 1)
    )
      this.bytes -= this.events.shift()!.bytes;
    return id;
  }

  async getStreamIdForEventId(eventId: string): Promise<string | undefined> {
    return this.events.find((e) => e.id === eventId)?.streamId;
  }

  async replayEventsAfter(
    lastEventId: string,
    { send }: { send: (eventId: string, message: JSONRPCMessage) => Promise<void> },
  ): Promise<string> {
    const i = this.events.findIndex((e) => e.id === lastEventId);
    if (i < 0) return '';
    const streamId = this.events[i]!.streamId;
    for (const e of this.events.slice(i + 1)) if (e.streamId === streamId) await send(e.id, e.message);
    return streamId;
  }
}
