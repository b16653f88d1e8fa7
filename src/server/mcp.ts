// The MCP gateway mounted at /mcp on `airlock serve` (issue 36). It is the gateway of `airlock
// gateway` (mcp/: GatewayCore, and HttpFront with every check it makes: Host and Origin against DNS
// rebinding, frame limits, session ownership), attached to the front server instead of listening on
// its own, with three differences:
//   - authentication is the server's: `Authorization: Bearer <API key>`, checked on every request
//     (a revoked key stops at once); the key's tenant is the gateway tenant, so a session of tenant A
//     is "not found" for tenant B, exactly as the gateway answers an unknown session id;
//   - the MCP servers run in sandboxes of the supervisor (mcp-provider.ts), under the tenants' quotas;
//   - every tools/call is counted in airlock_mcp_calls_total{tenant, server, outcome}.
// The config is the gateway's own mcpServers file (`airlock serve --mcp-config FILE`, or mcpConfig in
// the server config); its airlock.tenants, airlock.listen and airlock.allowNonLoopback belong to the
// stand-alone gateway and are refused here, with what to do instead.
import { AsyncLocalStorage } from 'node:async_hooks';
import { Agent, type IncomingMessage, type Server } from 'node:http';
import { Gauge } from 'prom-client';
import { z } from 'zod';
import { readConfigData } from '../core/config-file.js';
import { AirlockError } from '../core/errors.js';
import type { AuditEvent, AuditSink } from '../mcp/audit.js';
import { loadGatewayConfig, type GatewayConfig } from '../mcp/config.js';
import { GatewayCore } from '../mcp/gateway.js';
import { HttpFront } from '../mcp/http.js';
import { gatewaySetups } from '../mcp/setup.js';
import type { ListenAddress } from './auth.js';
import { RemoteSandboxApi } from './client.js';
import type { ServerMetrics } from './metrics.js';
import { SupervisorMcpProvider } from './mcp-provider.js';
import type { Quotas } from './quotas.js';
import type { RouteDoc } from './route-table.js';
import type { Store } from './store.js';
import { claimRequests } from './upgrade.js';

export const MCP_PATH = '/mcp';

/** A JSON-RPC 2.0 message (the gateway's canonical parser checks it; this only documents it). */
const JsonRpcMessageDoc = z
  .object({
    jsonrpc: z.literal('2.0'),
    id: z.union([z.string(), z.number()]).optional(),
    method: z.string().optional(),
    params: z.record(z.string(), z.unknown()).optional(),
    result: z.record(z.string(), z.unknown()).optional(),
    error: z.object({ code: z.number(), message: z.string() }).loose().optional(),
  })
  .loose();

/** /mcp in the OpenAPI document (served when the server has an MCP config). */
export const MCP_ROUTES: readonly RouteDoc[] = [
  {
    method: 'post',
    path: MCP_PATH,
    summary:
      'MCP Streamable HTTP: one JSON-RPC message (initialize opens a session, whose id comes back in ' +
      'Mcp-Session-Id and goes with every later request). Bearer API key; the Host and Origin are checked',
    body: { kind: 'json', schema: JsonRpcMessageDoc },
    response: { status: 200, kind: 'mcp' },
  },
  {
    method: 'get',
    path: MCP_PATH,
    summary: "The session's stream of server messages (text/event-stream; Mcp-Session-Id)",
    response: { status: 200, kind: 'mcp' },
  },
  {
    method: 'delete',
    path: MCP_PATH,
    summary: 'End the session (Mcp-Session-Id): its per-session server sandboxes are killed',
    response: { status: 200, kind: 'mcp' },
  },
];

/** A gateway config checked for `airlock serve`. */
export interface ServeMcpConfig {
  readonly gateway: GatewayConfig;
  /** airlock.allowedHosts when the file gives it (else the front server's listen address decides). */
  readonly allowedHosts?: readonly string[];
}

/**
 * Read the gateway config for /mcp: the gateway's own validation (MCP_INVALID_CONFIG naming the field),
 * then what only the stand-alone gateway may say is refused.
 */
export function loadServeMcpConfig(path: string): ServeMcpConfig {
  const raw = readConfigData(path, {
    what: 'gateway config',
    code: 'MCP_INVALID_CONFIG',
    maxBytes: 1024 ** 2,
  });
  const gateway = loadGatewayConfig(path);
  const block = (
    typeof raw === 'object' && raw !== null ? (raw as Record<string, unknown>).airlock : undefined
  ) as Record<string, unknown> | undefined;
  const given = (k: string): boolean => block !== undefined && block[k] !== undefined;
  if (gateway.airlock.tenants.length > 0) {
    throw new AirlockError(
      'MCP_INVALID_CONFIG',
      `${path}: airlock.tenants conflicts with airlock serve, where /mcp takes the server's API keys (Authorization: Bearer <key>; the key's tenant is the MCP tenant). Remove airlock.tenants and give each tenant a key with "airlock keys create --tenant NAME"`,
      { field: 'airlock.tenants' },
    );
  }
  for (const k of ['listen', 'allowNonLoopback']) {
    if (given(k)) {
      throw new AirlockError(
        'MCP_INVALID_CONFIG',
        `${path}: airlock.${k} is for the stand-alone gateway; airlock serve serves /mcp on its own address (--listen, --tls-cert, --insecure-listen). Remove airlock.${k}`,
        { field: `airlock.${k}` },
      );
    }
  }
  return { gateway, ...(given('allowedHosts') ? { allowedHosts: gateway.airlock.allowedHosts } : {}) };
}

export interface McpMountOptions {
  readonly config: ServeMcpConfig;
  readonly stateDir: string;
  /** The supervisor's socket. */
  readonly socketPath: string;
  readonly quotas: Quotas;
  readonly queueTimeoutMs: number;
  readonly store: Store;
  readonly metrics: ServerMetrics;
  /** Where the front server listens (its real port) and whether with TLS (for the Origin check). */
  readonly listen: ListenAddress;
  readonly tls: boolean;
  /** Every audit event of the gateway (calls, verdicts, quarantines, refused requests). */
  readonly audit?: AuditSink;
}

export interface McpMount {
  readonly core: GatewayCore;
  readonly provider: SupervisorMcpProvider;
  readonly sessionCount: number;
  close(): Promise<void>;
}

const outcomeOf = (d: 'allow' | 'deny' | 'quarantine' | 'warn' | 'error'): string =>
  d === 'allow' || d === 'warn' ? 'allowed' : d === 'error' ? 'error' : 'denied';

/** Start the gateway's servers and serve it at /mcp on `server` (the front server, listening). */
export async function mountMcp(server: Server, o: McpMountOptions): Promise<McpMount> {
  const gw = o.config.gateway;
  const setups = gatewaySetups(gw, 'http');
  const known = new Set(setups.map((s) => s.name));
  // The tenant of the /mcp request being served: a box per request, filled in once its key checks out,
  // read when a request of that tenant starts a server instance (quota) deep inside the gateway.
  const scope = new AsyncLocalStorage<{ tenant?: string }>();
  // A client of the supervisor of its own: every server instance holds two streams open for its
  // life (its process's output, its egress events), which must never use up the sockets the
  // front server's API calls share (their agent is bounded). Instances are bounded by the config,
  // the tenants' quotas and the sessions' lives.
  const api = new RemoteSandboxApi({
    socketPath: o.socketPath,
    agent: new Agent({ keepAlive: true, maxSockets: Infinity }),
  });
  const provider = new SupervisorMcpProvider({
    stateDir: o.stateDir,
    socketPath: o.socketPath,
    api,
    quotas: o.quotas,
    queueTimeoutMs: o.queueTimeoutMs,
    tenant: () => scope.getStore()?.tenant,
    shared: new Set(setups.filter((s) => s.boundary === 'per-server').map((s) => s.name)),
  });
  // MCP servers' sandboxes are not in the store (airlock_live_sandboxes counts API sandboxes).
  new Gauge({
    name: 'airlock_mcp_sandboxes',
    help: "Live sandboxes of the /mcp gateway's servers (all tenants and shared instances)",
    registers: [o.metrics.registry],
    collect() {
      this.set(provider.sandboxes().length);
    },
  });
  const audit = (e: AuditEvent): void => {
    // Tool names come from the wire and stay out of the labels; server names are the config's.
    if (e.kind === 'mcp' && e.method === 'tools/call') {
      o.metrics.mcpCalls.inc({
        tenant: e.tenant ?? '',
        server: known.has(e.server) ? e.server : '*',
        outcome: outcomeOf(e.decision),
      });
    }
    o.audit?.(e);
  };
  const core = new GatewayCore({
    airlock: provider,
    mode: 'multi',
    servers: setups,
    audit,
    relistIntervalMs: gw.airlock.relistIntervalMs,
    onServerStderr: () => {},
  });
  try {
    await core.start();
  } catch (e) {
    await core.close();
    await provider.close();
    api.close();
    throw e;
  }
  const scheme = o.tls ? 'https' : 'http';
  const front = new HttpFront(core, {
    host: o.listen.host,
    port: o.listen.port,
    authenticate: (req: IncomingMessage) => {
      const m = /^Bearer\s+(\S+)\s*$/i.exec(req.headers.authorization ?? '');
      const tenant = m ? o.store.verifyKey(m[1]!)?.tenant : undefined;
      const box = scope.getStore();
      if (box && tenant !== undefined) box.tenant = tenant;
      return tenant;
    },
    unauthorizedMessage:
      'unauthorized: missing, unknown or revoked API key: send "Authorization: Bearer <key>" (create one with airlock keys create --tenant NAME)',
    ...(o.config.allowedHosts ? { allowedHosts: o.config.allowedHosts } : {}),
    extraOrigins: [
      ...gw.airlock.allowedOrigins,
      // Over TLS, the server's own pages have https:// origins.
      ...(o.tls ? (o.config.allowedHosts ?? defaultHosts(o.listen)).map((h) => `${scheme}://${h}`) : []),
    ],
  });
  front.attach(o.listen.port);
  claimRequests(server, {
    request: (req) => {
      const path = (req.url ?? '').split('?')[0];
      if (path !== MCP_PATH) return undefined;
      return (r, res) => scope.run({}, () => void front.handleRequest(r, res));
    },
  });
  let closing: Promise<void> | undefined;
  return {
    core,
    provider,
    get sessionCount() {
      return front.sessionCount;
    },
    close: () =>
      (closing ??= (async () => {
        await front.close();
        await core.close();
        await provider.close();
        api.close();
      })()),
  };
}

function defaultHosts(l: ListenAddress): string[] {
  const host = l.host.includes(':') ? `[${l.host}]` : l.host;
  return [`${host}:${l.port}`, `localhost:${l.port}`, `127.0.0.1:${l.port}`, `[::1]:${l.port}`];
}
