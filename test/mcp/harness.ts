// MCP test harness: a gateway in this process (GatewayCore + HttpFront on a test runtime) or the real
// `airlock mcp` CLI as a child process, spoken to with the official SDK client. Servers are real:
// the npm MCP servers and the in-repo fixtures, each in its own sandbox.
import { randomBytes } from 'node:crypto';
import { request as httpRequest, createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import type { AuditEvent } from '../../src/mcp/audit.js';
import { parseGatewayConfig } from '../../src/mcp/config.js';
import { GatewayCore } from '../../src/mcp/gateway.js';
import { HttpFront } from '../../src/mcp/http.js';
import { gatewaySetups } from '../../src/mcp/setup.js';
import type { Airlock } from '../../src/sandbox/airlock.js';
import { TEST_STATE_DIR, TEST_UID_RANGE } from '../helpers.js';

export const ROOT = new URL('../..', import.meta.url).pathname.replace(/\/$/, '');
export const FIXTURE = (name: string): string[] => [
  'node',
  '--import',
  'tsx',
  `${ROOT}/test/fixtures/mcp/${name}`,
];

export const newToken = (): string => randomBytes(32).toString('hex');

export interface TestGateway {
  readonly core: GatewayCore;
  readonly front: HttpFront;
  readonly url: string;
  readonly port: number;
  readonly events: AuditEvent[];
  readonly tokens: Record<string, string>;
  client(tenant: string, opts?: { capabilities?: Record<string, unknown> }): Promise<Client>;
  close(): Promise<void>;
}

/** A gateway over HTTP on 127.0.0.1:<free port>, from an mcpServers config object. */
export async function startGateway(
  airlock: Airlock,
  mcpServers: Record<string, unknown>,
  opts: { tenants?: string[]; relistIntervalMs?: number; budgets?: Record<string, unknown> } = {},
): Promise<TestGateway> {
  const tenants = (opts.tenants ?? ['alice', 'bob']).map((name) => ({ name, token: newToken() }));
  const config = parseGatewayConfig({
    mcpServers,
    airlock: {
      tenants,
      lockfile: `/nonexistent-${randomBytes(4).toString('hex')}/airlock.lock.json`,
      ...(opts.relistIntervalMs ? { relistIntervalMs: opts.relistIntervalMs } : {}),
      ...(opts.budgets ? { budgets: opts.budgets } : {}),
    },
  });
  const events: AuditEvent[] = [];
  const core = new GatewayCore({
    airlock,
    mode: 'multi',
    servers: gatewaySetups(config, 'http'),
    audit: (e) => events.push(e),
    relistIntervalMs: config.airlock.relistIntervalMs,
    onServerStderr: () => {},
  });
  await core.start();
  const front = new HttpFront(core, { host: '127.0.0.1', port: 0, tenants });
  const where = await front.listen();
  const tokens = Object.fromEntries(tenants.map((t) => [t.name, t.token]));
  const clients: Client[] = [];
  return {
    core,
    front,
    url: where.url,
    port: where.port,
    events,
    tokens,
    async client(tenant, o = {}) {
      const c = new Client({ name: 'test', version: '1' }, { capabilities: o.capabilities ?? {} });
      const t = new StreamableHTTPClientTransport(new URL(where.url), {
        requestInit: { headers: { authorization: `Bearer ${tokens[tenant]}` } },
      });
      await c.connect(t);
      clients.push(c);
      return c;
    },
    async close() {
      await Promise.allSettled(clients.map((c) => c.close()));
      await front.close();
      await core.close();
    },
  };
}

/** `airlock mcp [flags] -- CMD` as a child process, with an SDK client on its stdio. */
export async function startCli(
  args: string[],
  opts: { env?: Record<string, string>; capabilities?: Record<string, unknown> } = {},
): Promise<{ client: Client; stderr: () => string; close(): Promise<void> }> {
  const transport = new StdioClientTransport({
    command: process.execPath,
    args: ['--import', 'tsx', `${ROOT}/src/cli/main.ts`, 'mcp', ...args],
    cwd: ROOT,
    env: {
      PATH: process.env.PATH ?? '/usr/bin:/bin',
      HOME: process.env.HOME ?? '/root',
      AIRLOCK_STATE_DIR: TEST_STATE_DIR,
      AIRLOCK_UID_RANGE: `${TEST_UID_RANGE.first}:${TEST_UID_RANGE.count}`,
      ...opts.env,
    },
    stderr: 'pipe',
  });
  let err = '';
  transport.stderr?.on('data', (b: Buffer) => (err += b.toString()));
  const client = new Client({ name: 'test', version: '1' }, { capabilities: opts.capabilities ?? {} });
  await client.connect(transport);
  return {
    client,
    stderr: () => err,
    async close() {
      await client.close();
    },
  };
}

/**
 * A reverse proxy that adds the bearer token (the conformance runner cannot send headers of its own)
 * and maps its own address to the gateway's in Host and Origin, as a real reverse proxy in front of
 * the gateway would; any other Host or Origin (e.g. evil.example.com) goes through unchanged.
 */
export async function authProxy(
  targetPort: number,
  token: string,
): Promise<{ url: string; close(): Promise<void> }> {
  let own = -1;
  const mapPort = (v: string | undefined): string | undefined =>
    v?.replace(new RegExp(`^((?:http://)?(?:127\\.0\\.0\\.1|localhost)):${own}$`), `$1:${targetPort}`);
  const server: Server = createServer((req, res) => {
    const headers = { ...req.headers, authorization: `Bearer ${token}` };
    if (headers.host) headers.host = mapPort(headers.host);
    if (headers.origin) headers.origin = mapPort(headers.origin);
    const up = httpRequest(
      {
        host: '127.0.0.1',
        port: targetPort,
        method: req.method,
        path: req.url,
        headers,
      },
      (r) => {
        res.writeHead(r.statusCode ?? 502, r.headers);
        r.pipe(res);
      },
    );
    up.on('error', () => res.destroy());
    req.pipe(up);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  const port = (server.address() as AddressInfo).port;
  own = port;
  return {
    url: `http://127.0.0.1:${port}/mcp`,
    close: () =>
      new Promise<void>((r) => {
        server.closeAllConnections();
        server.close(() => r());
      }),
  };
}
