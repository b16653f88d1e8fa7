// The front server, `airlock serve` (issue 36): Hono on @hono/node-server. It holds no sandbox: the
// supervisor (supervisor.ts) does, and this process reaches it over its unix socket with
// RemoteSandboxApi. What lives here is what may be restarted at will: API keys, tenants, quotas, the
// SQLite store, metrics, and the native REST API for remote clients (tenant scoped by TenantScopedApi).
// Killing this process (SIGTERM or kill -9) loses no sandbox; restarting it re-reads the store.
import type { Server as HttpServer } from 'node:http';
import { createServer as createHttpsServer } from 'node:https';
import type { AddressInfo } from 'node:net';
import { randomBytes } from 'node:crypto';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { createAdaptorServer } from '@hono/node-server';
import { Hono } from 'hono';
import { z } from 'zod';
import { AirlockError } from '../core/errors.js';
import type { Caller, SandboxApi } from './contract.js';
import { bearerAuth, checkListen, type FrontEnv, type ListenAddress } from './auth.js';
import { RemoteSandboxApi } from './client.js';
import { serverMetrics, type ServerMetrics } from './metrics.js';
import { Quotas } from './quotas.js';
import { e2bRoutes } from './e2b/index.js';
import { attachPreview, checkPreviewDomain } from './preview.js';
// ./mcp.js (the gateway and the MCP SDK) is imported only when /mcp is served: start-up cost.
import type { McpMount, ServeMcpConfig } from './mcp.js';
import { openApiDocument } from './openapi.js';
import type { AuditSink } from '../mcp/audit.js';
import { nativeRoutes } from './routes.js';
import { LIVE_STATES, Store, TENANT_NAME_RE, type Quota } from './store.js';
import {
  ensureSupervisor,
  supervisorInfo,
  supervisorPaths,
  type SupervisorInfo,
} from './supervisor-client.js';
import { TenantScopedApi } from './tenants.js';

const QuotaSchema = z
  .object({
    maxSandboxes: z.number().int().min(0),
    maxMemoryBytes: z.number().int().min(0),
    maxCpus: z.number().min(0),
    createsPerMinute: z.number().int().min(0),
  })
  .strict();

/** `airlock serve --config FILE` (YAML or JSON). Every field is optional. */
export const ServerConfigSchema = z
  .object({
    listen: z.string().optional(),
    stateDir: z.string().optional(),
    tls: z.object({ cert: z.string(), key: z.string() }).strict().optional(),
    insecureListen: z.boolean().optional(),
    /** Let clients ask for network.allowPrivate (default false). */
    allowPrivateNetwork: z.boolean().default(false),
    defaultQueueTimeoutMs: z.number().int().min(0).max(60_000).default(5000),
    /** Creates that may wait for quota at once, all tenants together. */
    maxQueue: z.number().int().min(0).max(10_000).default(64),
    /** Largest JSON request body. */
    maxBodyBytes: z
      .number()
      .int()
      .positive()
      .default(1024 ** 2),
    /** Largest file upload. */
    maxUploadBytes: z
      .number()
      .int()
      .positive()
      .default(256 * 1024 ** 2),
    defaultQuota: QuotaSchema.partial().default({}),
    /** Per-tenant quotas; each key must be a valid tenant name (store.ts checkTenantName). */
    tenants: z
      .record(z.string(), QuotaSchema.partial())
      .superRefine((t, ctx) => {
        for (const name of Object.keys(t)) {
          if (TENANT_NAME_RE.test(name)) continue;
          ctx.addIssue({
            code: 'custom',
            path: [name],
            message: `tenant name ${JSON.stringify(name.slice(0, 80))} is not allowed: use 1-63 lowercase ASCII letters, digits, ".", "_" or "-", starting with a letter or digit`,
          });
        }
      })
      .default({}),
    /**
     * Preview URLs are `<port>-<id>.<previewDomain>` (a wildcard DNS name pointing at this server;
     * the default, localhost, needs none: *.localhost is loopback, and the server's port is added).
     */
    previewDomain: z.string().default('localhost'),
    /** A gateway config (mcpServers, as `airlock gateway --config`) served at /mcp; relative to this file. */
    mcpConfig: z.string().min(1).optional(),
    /**
     * Images clients may run (`image` in a create): only from these registries (`host[:port]`).
     * None by default: a create naming an image is refused.
     */
    images: z
      .object({ registries: z.array(z.string().min(1).max(255)).max(64).default([]) })
      .strict()
      .default({ registries: [] }),
    /** How often the supervisor is checked (boot id, liveness). */
    supervisorCheckMs: z.number().int().min(100).max(60_000).default(2000),
  })
  .strict();
export type ServerConfig = z.output<typeof ServerConfigSchema>;

export const DEFAULT_QUOTA: Quota = {
  maxSandboxes: 20,
  maxMemoryBytes: 16 * 1024 ** 3,
  maxCpus: 16,
  createsPerMinute: 120,
};

export interface FrontOptions {
  readonly stateDir: string;
  readonly listen: ListenAddress;
  readonly config: ServerConfig;
  /** PEM text of the TLS certificate and key (both or neither). */
  readonly tls?: { cert: string; key: string };
  readonly insecureListen?: boolean;
  /** The airlock CLI argv: when given, a dead or missing supervisor is (re)started with it. */
  readonly supervisorCommand?: readonly string[];
  /**
   * More routes on the front server (the E2B API, preview URLs, /mcp), mounted before the native API
   * and its bearer check, so they can route on Host or use their own header (e.g. X-API-Key through
   * ctx.callerForKey). Every sandbox call must go through ctx.api: it scopes tenants and quotas.
   */
  readonly mount?: (app: Hono<FrontEnv>, ctx: FrontContext) => void;
  /** The MCP gateway served at /mcp (server/mcp.ts), and where its audit events go. */
  readonly mcp?: ServeMcpConfig;
  readonly mcpAudit?: AuditSink;
}

/** What mounted routes get from the front server. */
export interface FrontContext {
  /** The tenant-scoped API (ownership, quotas, TTL mirror, lost sandboxes). */
  readonly api: SandboxApi;
  /** The caller an API key acts for; undefined for a missing, unknown or revoked key. */
  callerForKey(key: string | undefined): Caller | undefined;
  readonly metrics: ServerMetrics;
}

export interface RunningFront {
  readonly url: string;
  readonly store: Store;
  readonly metrics: ServerMetrics;
  /** The /mcp gateway, when configured. */
  readonly mcp?: McpMount;
  /** Check the supervisor now (and reconcile a new boot); the current info or undefined. */
  checkSupervisor(): Promise<SupervisorInfo | undefined>;
  /** Stop serving (the supervisor and its sandboxes keep running). */
  close(): Promise<void>;
}

export async function startFront(o: FrontOptions): Promise<RunningFront> {
  checkListen(o.listen, { tls: o.tls !== undefined, insecureListen: o.insecureListen === true });
  const cfg = o.config;
  const previewDomain = checkPreviewDomain(cfg.previewDomain);
  const { socket } = supervisorPaths(o.stateDir);
  const store = new Store(join(o.stateDir, 'server.db'));
  let boot: SupervisorInfo | undefined;
  let up = false;
  const inner = new RemoteSandboxApi({ socketPath: socket });
  const supervisorCaller = { tenant: 'supervisor' };

  /**
   * A boot other than the stored sandboxes': they died with their supervisor. At start-up, also
   * what changed while no front server watched: stored sandboxes the supervisor no longer has (TTL,
   * ...) end, and sandboxes it has that the store does not know (a create whose front server died
   * before recording it: no tenant can ever reach them) are killed.
   */
  const reconcile = async (info: SupervisorInfo, startup: boolean): Promise<void> => {
    const lost = store.markLostExcept(
      info.bootId,
      `its supervisor died or restarted (now boot ${info.bootId}, pid ${info.pid}): the sandbox was killed and reaped with it`,
    );
    boot = info;
    if (lost.length) quotas.wakeAll();
    if (!startup) return;
    const alive = new Set((await inner.list({}, supervisorCaller)).map((v) => v.id));
    for (const r of store.sandboxes({ states: LIVE_STATES })) {
      if (alive.has(r.id)) continue;
      const expired = r.deadline !== null && r.deadline <= Date.now();
      if (
        store.endSandbox(
          r.id,
          expired ? 'expired' : 'killed',
          expired ? 'its TTL ran out' : 'gone from the supervisor',
        )
      )
        quotas.wakeAll();
    }
    for (const id of alive) {
      const r = store.getSandbox(id);
      if (r && LIVE_STATES.includes(r.state)) continue;
      await inner.kill(id, supervisorCaller).catch(() => {});
      store.event('sandbox.unrecorded_killed', null, id, { reason: 'its create was never recorded' });
    }
  };

  let checking: Promise<SupervisorInfo | undefined> | undefined;
  let started = false;
  const checkSupervisor = (): Promise<SupervisorInfo | undefined> =>
    (checking ??= (async () => {
      try {
        let info = await supervisorInfo(socket);
        if (!info && o.supervisorCommand) {
          info = await ensureSupervisor(o.stateDir, { command: o.supervisorCommand }).catch(() => undefined);
        }
        up = info !== undefined;
        if (info) await reconcile(info, !started);
        if (info) started = true;
        return info;
      } finally {
        checking = undefined;
      }
    })());

  const quotas = new Quotas(
    {
      quota: (t) => ({
        ...DEFAULT_QUOTA,
        ...cfg.defaultQuota,
        ...cfg.tenants[t],
        ...store.quotaOverrides(t),
      }),
      usage: (t) => store.liveUsage(t),
    },
    cfg.maxQueue,
  );
  const metrics = serverMetrics({
    liveSandboxes: () => store.sandboxes({ states: LIVE_STATES }).length,
    queuedCreates: () => quotas.queued,
    supervisorUp: () => up,
  });
  const api = new TenantScopedApi(
    inner,
    store,
    quotas,
    {
      allowPrivateNetwork: cfg.allowPrivateNetwork,
      defaultQueueTimeoutMs: cfg.defaultQueueTimeoutMs,
      imageRegistries: cfg.images.registries,
    },
    {
      bootId: () => {
        if (!boot)
          throw new AirlockError(
            'BACKEND_UNAVAILABLE',
            'the airlock supervisor is not reachable; retry shortly',
          );
        return boot.bootId;
      },
      refreshBoot: () => checkSupervisor(),
      onCreate: (outcome) => metrics.creates.inc({ outcome }),
      onExecDone: (s) => metrics.execSeconds.observe(s),
      onEgress: (e) => metrics.egress(e),
    },
  );

  const first = await checkSupervisor();
  if (!first) {
    store.close();
    throw new AirlockError(
      'BACKEND_UNAVAILABLE',
      `no airlock supervisor answers on ${socket}: start one with "airlock supervisor --state-dir ${o.stateDir}" (airlock serve starts it itself)`,
    );
  }
  api.armStoredDeadlines();

  const app = new Hono<FrontEnv>();
  const callerForKey = (key: string | undefined): Caller | undefined => {
    const who = key === undefined ? undefined : store.verifyKey(key);
    return who ? { tenant: who.tenant } : undefined;
  };
  o.mount?.(app, { api, callerForKey, metrics });
  // A create refused for quota answers 429 with Retry-After: the QuotaError carries it, and each error
  // mapping (http-errors.ts, e2b/control.ts) sends it. (No AsyncLocalStorage per request: on Node 20
  // it turns on promise hooks, which slow every await of the process.)
  // The E2B-compatible API (docs/e2b.md): E2B_API_URL=<url>/e2b, E2B_SANDBOX_URL=<url>/e2b/envd; its
  // X-API-Key is an Airlock API key. Every call goes through the tenant-scoped api.
  app.route(
    '/e2b',
    e2bRoutes(api, {
      caller: (c) => {
        const key = c.req.header('x-api-key');
        const who = key === undefined ? undefined : store.verifyKey(key);
        return who ? { tenant: who.tenant, keyId: who.id } : undefined;
      },
      // Every envd request: the key that obtained the token must still be valid (docs/e2b.md).
      keyActive: (keyId, tenant) => store.keyActive(keyId, tenant),
      // Asked once the server listens (the SDK gets it from create): *.localhost needs its port.
      domain: () =>
        previewDomain === 'localhost' ? `localhost:${(server.address() as AddressInfo).port}` : previewDomain,
      tokenSecret: e2bTokenSecret(o.stateDir),
    }),
  );
  app.get('/healthz', (c) => c.json({ ok: true }));
  app.get('/readyz', async (c) => {
    const info = await checkSupervisor();
    return info
      ? c.json({ ok: true, supervisor: { bootId: info.bootId, pid: info.pid } })
      : c.json(
          { ok: false, error: { code: 'BACKEND_UNAVAILABLE', message: 'the supervisor is not reachable' } },
          503,
        );
  });
  app.get('/metrics', async (c) =>
    c.body(await metrics.registry.metrics(), 200, { 'content-type': metrics.registry.contentType }),
  );
  // /openapi.json (no key needed: it is outside /v1): nativeRoutes', or with /mcp when it is served.
  const mcpModule = o.mcp ? await import('./mcp.js') : undefined;
  if (mcpModule) {
    const extra = mcpModule.MCP_ROUTES;
    app.get('/openapi.json', (c) => c.json(openApiDocument({ extra })));
  }
  app.use('/v1/*', bearerAuth(store));
  app.route(
    '/',
    nativeRoutes(api, {
      caller: (c) => ({ tenant: (c as unknown as { get(k: 'tenant'): string }).get('tenant') }),
      maxBodyBytes: cfg.maxBodyBytes,
      maxUploadBytes: cfg.maxUploadBytes,
      allowPrivateNetwork: cfg.allowPrivateNetwork,
      ...(o.mcp ? { openapi: false } : {}),
    }),
  );

  const server = (
    o.tls
      ? createAdaptorServer({
          fetch: app.fetch,
          createServer: createHttpsServer,
          serverOptions: { cert: o.tls.cert, key: o.tls.key },
        })
      : createAdaptorServer({ fetch: app.fetch })
  ) as HttpServer;
  try {
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(o.listen.port, o.listen.host, () => resolve());
    });
  } catch (e) {
    api.close();
    quotas.close();
    store.close();
    throw new AirlockError(
      'INVALID_ARGUMENT',
      `cannot listen on ${o.listen.host}:${o.listen.port}: ${(e as Error).message}`,
      {
        field: 'listen',
        cause: e,
      },
    );
  }
  // Preview hosts (`<port>-<id>.<domain>`): the traffic token decides, so the unscoped supervisor API.
  attachPreview(server, {
    domain: previewDomain,
    api: inner,
    caller: supervisorCaller,
    secure: o.tls !== undefined,
  });
  let mcp: McpMount | undefined;
  if (o.mcp && mcpModule) {
    try {
      mcp = await mcpModule.mountMcp(server, {
        config: o.mcp,
        stateDir: o.stateDir,
        socketPath: socket,
        quotas,
        queueTimeoutMs: cfg.defaultQueueTimeoutMs,
        store,
        metrics,
        listen: { host: o.listen.host, port: (server.address() as AddressInfo).port },
        tls: o.tls !== undefined,
        ...(o.mcpAudit ? { audit: o.mcpAudit } : {}),
      });
    } catch (e) {
      server.close();
      api.close();
      quotas.close();
      store.close();
      throw e;
    }
  }
  const timer = setInterval(() => void checkSupervisor().catch(() => {}), cfg.supervisorCheckMs);
  timer.unref();
  const addr = server.address() as AddressInfo;
  const host = addr.family === 'IPv6' ? `[${addr.address}]` : addr.address;
  let closing: Promise<void> | undefined;
  return {
    url: `${o.tls ? 'https' : 'http'}://${host}:${addr.port}`,
    store,
    metrics,
    ...(mcp ? { mcp } : {}),
    checkSupervisor,
    close: () =>
      (closing ??= (async () => {
        clearInterval(timer);
        await mcp?.close();
        await new Promise<void>((r) => {
          server.close(() => r());
          server.closeAllConnections();
        });
        api.close();
        quotas.close();
        await checking?.catch(() => {});
        store.close();
      })()),
  };
}

/**
 * The key of the E2B envd access tokens, kept with the server's state (0600) so that SDK clients
 * keep working across a restart of the front server.
 */
function e2bTokenSecret(stateDir: string): Uint8Array {
  const path = join(stateDir, 'e2b-token.key');
  try {
    writeFileSync(path, randomBytes(32), { mode: 0o600, flag: 'wx' });
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== 'EEXIST') throw e;
  }
  const key = readFileSync(path);
  if (key.length !== 32) throw new AirlockError('INTERNAL', `${path} is not a 32-byte key: remove it`);
  return key;
}
