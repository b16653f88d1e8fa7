// SECURITY-CRITICAL: `airlock mcp-server --http`: the Streamable HTTP endpoint of Airlock's own MCP
// server. Checked in this order before any MCP processing, as the gateway's HTTP front does
// (src/mcp/http.ts): the path (/mcp), the Host header (DNS-rebinding protection: a page on
// evil.example resolving to 127.0.0.1 sends Host: evil.example), the Origin header when present, the
// bearer token (compared in constant time), then the body through the canonical JSON-RPC parser.
// Each initialize opens a session of its own (its own sandboxes: session.ts); a session id is
// useless without the token, and a closed, expired or made-up id gets the same 404.
import { createHash, randomUUID, timingSafeEqual } from 'node:crypto';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { isInitializeRequest } from '@modelcontextprotocol/sdk/types.js';
import { AirlockError } from '../../core/errors.js';
import { FRAME_LIMITS, parseMessage } from '../../mcp/frame.js';
import { readBody, rejectJsonRpc } from '../../mcp/http.js';
import { AirlockMcpSession, type AirlockMcpServerOptions } from './session.js';

/** Options of `McpHttpServer`. */
export interface McpHttpServerOptions extends AirlockMcpServerOptions {
  /** A loopback address (127.0.0.1, ::1 or localhost). */
  readonly host: string;
  /** 0 for any free port. */
  readonly port: number;
  /** The bearer token every request must carry. */
  readonly token: string;
  /** Sessions at once (default 16); an initialize past it is refused with 503. */
  readonly maxSessions?: number;
  /** A session idle this long is closed and its sandboxes killed (default 30 min). */
  readonly sessionIdleMs?: number;
}

interface Live {
  readonly transport: StreamableHTTPServerTransport;
  readonly session: AirlockMcpSession;
  lastUsed: number;
}

const sha256 = (s: string): Buffer => createHash('sha256').update(s).digest();

/** True for the loopback names and addresses this server may bind. */
export function isLoopbackHost(host: string): boolean {
  return host === 'localhost' || host === '::1' || /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(host);
}

/** Airlock's MCP server over Streamable HTTP on a loopback address. */
export class McpHttpServer {
  private readonly http: Server;
  private readonly live = new Map<string, Live>();
  private readonly tokenHash: Buffer;
  private allowedHosts = new Set<string>();
  private allowedOrigins = new Set<string>();
  private sweeper: NodeJS.Timeout | undefined;
  private closing = false;

  constructor(private readonly opts: McpHttpServerOptions) {
    if (!isLoopbackHost(opts.host)) {
      throw new AirlockError(
        'INVALID_ARGUMENT',
        `--http: ${opts.host} is not a loopback address; the MCP server listens on 127.0.0.1, ::1 or localhost only`,
        { field: '--http' },
      );
    }
    if (opts.token.length < 16) {
      throw new AirlockError('INVALID_ARGUMENT', 'the bearer token must be at least 16 characters', {
        field: 'token',
      });
    }
    this.tokenHash = sha256(opts.token);
    this.http = createServer((req, res) => void this.handle(req, res));
  }

  /** Start listening; resolves with the endpoint URL. */
  async listen(): Promise<{ url: string; port: number }> {
    await new Promise<void>((resolve, reject) => {
      this.http.once('error', reject);
      this.http.listen(this.opts.port, this.opts.host, () => resolve());
    });
    const port = (this.http.address() as AddressInfo).port;
    const hostPart = this.opts.host.includes(':') ? `[${this.opts.host}]` : this.opts.host;
    this.allowedHosts = new Set([
      `${hostPart}:${port}`,
      `localhost:${port}`,
      `127.0.0.1:${port}`,
      `[::1]:${port}`,
    ]);
    this.allowedOrigins = new Set([...this.allowedHosts].map((h) => `http://${h}`));
    const idle = this.opts.sessionIdleMs ?? 30 * 60_000;
    this.sweeper = setInterval(() => this.sweep(idle), Math.min(idle, 60_000));
    this.sweeper.unref();
    return { url: `http://${hostPart}:${port}/mcp`, port };
  }

  get sessionCount(): number {
    return this.live.size;
  }

  /** Stop: close every session (killing its sandboxes) and the listener. */
  async close(): Promise<void> {
    this.closing = true;
    if (this.sweeper) clearInterval(this.sweeper);
    const all = [...this.live.values()];
    this.live.clear();
    await Promise.allSettled(all.map((l) => this.end(l)));
    this.http.closeAllConnections?.();
    await new Promise<void>((r) => this.http.close(() => r()));
  }

  private async end(l: Live): Promise<void> {
    await l.transport.close().catch(() => {});
    await l.session.close();
  }

  private sweep(idleMs: number): void {
    const now = Date.now();
    for (const [id, l] of this.live) {
      if (now - l.lastUsed > idleMs) {
        this.live.delete(id);
        void this.end(l);
      }
    }
  }

  private reject(
    res: ServerResponse,
    status: number,
    message: string,
    headers: Record<string, string> = {},
  ): void {
    rejectJsonRpc(res, status, message, headers);
  }

  private authorized(req: IncomingMessage): boolean {
    const m = /^Bearer\s+(\S+)\s*$/i.exec(req.headers.authorization ?? '');
    // Hashes of equal length, compared in constant time: timing says nothing about the token.
    return m !== null && timingSafeEqual(sha256(m[1]!), this.tokenHash);
  }

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    try {
      if (new URL(req.url ?? '/', 'http://mcp.invalid').pathname !== '/mcp')
        return this.reject(res, 404, 'not found: the MCP endpoint is /mcp');
      if (!this.allowedHosts.has((req.headers.host ?? '').toLowerCase()))
        return this.reject(res, 403, 'forbidden: Host header not allowed');
      const origin = req.headers.origin;
      if (origin !== undefined && !this.allowedOrigins.has(origin.toLowerCase()))
        return this.reject(res, 403, 'forbidden: Origin not allowed');
      if (!this.authorized(req)) {
        return this.reject(res, 401, 'unauthorized: send Authorization: Bearer <token>', {
          'www-authenticate': 'Bearer realm="airlock-mcp"',
        });
      }
      let body: unknown;
      if (req.method === 'POST') {
        const raw = await readBody(req, FRAME_LIMITS.maxFrameBytes);
        if (raw === undefined) return this.reject(res, 413, 'request body too large');
        const parsed = parseMessage(raw);
        if (!parsed.ok) return this.reject(res, 400, `bad request: ${parsed.reason}`);
        body = parsed.message;
      }
      const sid = req.headers['mcp-session-id'];
      const sessionId = Array.isArray(sid) ? sid[0] : sid;
      if (sessionId !== undefined) {
        const l = this.live.get(sessionId);
        if (!l) return this.reject(res, 404, 'session not found; initialize a new session');
        l.lastUsed = Date.now();
        await l.transport.handleRequest(req, res, body);
        return;
      }
      if (req.method !== 'POST' || body === undefined || !isInitializeRequest(body))
        return this.reject(res, 400, 'bad request: no mcp-session-id; start with an initialize request');
      if (this.closing) return this.reject(res, 503, 'the server is stopping');
      if (this.live.size >= (this.opts.maxSessions ?? 16))
        return this.reject(res, 503, 'too many sessions; close one (DELETE /mcp) and retry');
      const session = new AirlockMcpSession(this.opts);
      const transport: StreamableHTTPServerTransport = new StreamableHTTPServerTransport({
        sessionIdGenerator: () => randomUUID(),
        onsessioninitialized: (id) => {
          this.live.set(id, { transport, session, lastUsed: Date.now() });
        },
      });
      // DELETE /mcp, a sweep or the server's close: the session's sandboxes go with it.
      transport.onclose = () => {
        if (transport.sessionId) this.live.delete(transport.sessionId);
        void session.close();
      };
      await session.server.connect(transport);
      await transport.handleRequest(req, res, body);
    } catch (e) {
      this.reject(res, 500, `internal error: ${(e as Error).message}`);
    }
  }
}
