// E2B's control REST API (the SDK's E2B_API_URL) over a SandboxApi: create, connect, list, info,
// timeout, kill, pause/resume, snapshots. Authenticated by X-API-Key through opts.caller.
import type { Context, Hono } from 'hono';
import type { z } from 'zod';
import { AirlockError, httpStatusFor } from '../../core/errors.js';
import type { Caller, CreateRequest, SandboxApi, SandboxView } from '../contract.js';
import { EnvdError, readCapped } from './connect.js';
import { ENVD_VERSION } from './envd.js';
import {
  ConnectBodySchema,
  NewSandboxSchema,
  PauseBodySchema,
  RefreshBodySchema,
  SnapshotBodySchema,
  TimeoutBodySchema,
  type NewSandbox,
} from './schemas.js';
import { envdToken, type KeyedCaller } from './token.js';

export interface ControlOpts {
  readonly caller: (c: Context) => KeyedCaller | undefined;
  /** The preview domain handed to the SDK (getHost(port) → `<port>-<id>.<domain>`). */
  readonly domain: string | (() => string);
  readonly secret: Uint8Array;
  /** Sandbox timeout when the SDK gives none, in ms (E2B's is 300 s). */
  readonly defaultTimeoutMs: number;
}

/** A control-API error: HTTP status and E2B's `{code, message}` body. */
class ApiError extends Error {
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
  }
}

function fail(c: Context, e: unknown): Response {
  if (e instanceof ApiError) return c.json({ code: e.status, message: e.message }, e.status as 400);
  if (!AirlockError.isInstance(e))
    return c.json({ code: 500, message: 'internal error in the Airlock server' }, 500);
  // A sandbox that is gone is, to E2B clients, not found.
  const status = e.code === 'SANDBOX_GONE' ? 404 : httpStatusFor(e);
  // A refusal for quota (QuotaError) says when to retry.
  const retry = (e as { retryAfterSeconds?: unknown }).retryAfterSeconds;
  if (typeof retry === 'number') c.header('Retry-After', String(Math.max(1, Math.ceil(retry))));
  return c.json({ code: status, message: e.field ? `${e.field}: ${e.message}` : e.message }, status as 400);
}

/** Control API bodies are small JSON objects. */
const MAX_BODY = 256 * 1024;

async function body<S extends z.ZodType>(c: Context, schema: S): Promise<z.infer<S>> {
  let raw: unknown = {};
  const bytes = await readCapped(c, MAX_BODY).catch((e: unknown) => {
    throw e instanceof EnvdError ? new ApiError(e.httpStatus, e.message) : e;
  });
  const text = new TextDecoder().decode(bytes);
  if (text.trim() !== '') {
    try {
      raw = JSON.parse(text) as unknown;
    } catch {
      throw new ApiError(400, 'the request body is not valid JSON');
    }
  }
  const r = schema.safeParse(raw);
  if (r.success) return r.data;
  const issue = r.error.issues[0]!;
  throw new ApiError(400, `${issue.path.map(String).join('.') || 'body'}: ${issue.message}`);
}

/** NewSandboxV2 → CreateRequest; each E2B option Airlock cannot honour is refused by name. */
function createRequest(b: NewSandbox, defaultTimeoutMs: number): CreateRequest {
  const refuse = (what: string): never => {
    throw new ApiError(501, `${what} is not supported by Airlock (see docs/e2b.md)`);
  };
  if (b.mcp != null) refuse('mcp (the MCP gateway in the sandbox)');
  if (b.volumeMounts != null && b.volumeMounts.length > 0) refuse('volumeMounts');
  if (b.network != null) refuse('network (use the native API network policy)');
  if (b.iam != null) refuse('iam');
  if (b.autoPause === true) refuse('onTimeout: pause (autoPause)');
  if (b.autoResume?.enabled === true) refuse('autoResume');
  if (b.allow_internet_access === true) {
    refuse('allowInternetAccess: true (Airlock sandboxes have no network unless a policy allows hosts');
  }
  const ttlMs = b.timeout === undefined ? defaultTimeoutMs : b.timeout * 1000;
  if (ttlMs < 1000) throw new ApiError(400, 'timeout: must be at least 1 second');
  return {
    ...(b.templateID === 'base' ? {} : { template: b.templateID }),
    ttlMs,
    ...(b.envVars ? { env: b.envVars } : {}),
    ...(b.metadata ? { metadata: b.metadata } : {}),
  };
}

/** The :id path parameter. */
function sid(c: Context): string {
  return c.req.param('id') ?? '';
}

/** E2B lists only running and paused sandboxes; the rest are, to it, not found. */
function live(v: SandboxView): v is SandboxView & { state: 'running' | 'paused' } {
  return v.state === 'running' || v.state === 'paused';
}

export function mountControl(app: Hono, api: SandboxApi, o: ControlOpts): void {
  const who = (c: Context): KeyedCaller => {
    const caller = o.caller(c);
    if (!caller) throw new ApiError(401, 'missing or invalid API key (X-API-Key)');
    return caller;
  };
  const visible = async (
    id: string,
    caller: Caller,
  ): Promise<SandboxView & { state: 'running' | 'paused' }> => {
    const v = await api.get(id, caller);
    if (!live(v)) throw new ApiError(404, `sandbox ${id} not found (it is ${v.state})`);
    return v;
  };
  const sandbox = (v: SandboxView, caller: KeyedCaller): Record<string, unknown> => ({
    sandboxID: v.id,
    templateID: v.template ?? 'base',
    clientID: 'airlock',
    envdVersion: ENVD_VERSION,
    envdAccessToken: envdToken(o.secret, caller, v.id),
    trafficAccessToken: (v as { trafficToken?: string }).trafficToken ?? null,
    domain: typeof o.domain === 'string' ? o.domain : o.domain(),
  });
  const listed = (v: SandboxView & { state: 'running' | 'paused' }): Record<string, unknown> => ({
    sandboxID: v.id,
    templateID: v.template ?? 'base',
    clientID: 'airlock',
    cpuCount: 1,
    memoryMB: 0,
    diskSizeMB: 0,
    envdVersion: ENVD_VERSION,
    metadata: v.metadata,
    startedAt: v.createdAt,
    endAt: v.expiresAt ?? new Date(8.64e15).toISOString(),
    state: v.state,
  });
  const route =
    (h: (c: Context, caller: KeyedCaller) => Promise<Response>) =>
    async (c: Context): Promise<Response> => {
      try {
        return await h(c, who(c));
      } catch (e) {
        return fail(c, e);
      }
    };
  /** Extend (never shorten) the deadline to now + seconds. */
  const extend = async (v: SandboxView, seconds: number, caller: Caller): Promise<void> => {
    const want = Date.now() + seconds * 1000;
    if (v.expiresAt !== null && Date.parse(v.expiresAt) < want)
      await api.setTimeout(v.id, seconds * 1000, caller);
  };

  const create = route(async (c, caller) => {
    const req = createRequest(await body(c, NewSandboxSchema), o.defaultTimeoutMs);
    let v: SandboxView;
    try {
      v = await api.create(req, caller);
    } catch (e) {
      // A templateID that names one of the caller's snapshots forks it (what createSnapshot hands out).
      if (!AirlockError.is(e, 'TEMPLATE_NOT_FOUND') || req.template === undefined) throw e;
      const snaps = await api.listSnapshots(caller);
      if (!snaps.some((s) => s.id === req.template)) throw e;
      const { template, ...rest } = req;
      v = await api.create({ ...rest, snapshot: template }, caller);
    }
    return c.json(sandbox(v, caller), 201);
  });
  app.post('/v2/sandboxes', create);
  app.post('/sandboxes', create);

  const list = (paged: boolean) =>
    route(async (c, caller) => {
      const url = new URL(c.req.url);
      const metadata: Record<string, string> = {};
      // The SDK sends metadata=<URLSearchParams of encodeURIComponent'd pairs>.
      for (const [k, val] of new URLSearchParams(url.searchParams.get('metadata') ?? '')) {
        try {
          metadata[decodeURIComponent(k)] = decodeURIComponent(val);
        } catch {
          throw new ApiError(400, 'metadata: a key or value is not valid percent-encoding');
        }
      }
      const states = (url.searchParams.get('state') ?? 'running,paused')
        .split(',')
        .flatMap((s) => s.split(' '));
      const all = (await api.list(Object.keys(metadata).length ? { metadata } : {}, caller))
        .filter(live)
        .filter((v) => states.includes(v.state))
        .sort((a, b) =>
          a.createdAt < b.createdAt ? -1 : a.createdAt > b.createdAt ? 1 : a.id < b.id ? -1 : 1,
        );
      if (!paged) return c.json(all.map(listed));
      const limit = Math.min(Math.max(Number(url.searchParams.get('limit') ?? '100') || 100, 1), 1000);
      const token = url.searchParams.get('nextToken');
      const from = token && /^[0-9]{1,9}$/.test(token) ? Number(token) : 0;
      const page = all.slice(from, from + limit);
      if (from + limit < all.length) c.header('x-next-token', String(from + limit));
      return c.json(page.map(listed));
    });
  app.get('/v2/sandboxes', list(true));
  app.get('/sandboxes', list(false));

  app.get(
    '/sandboxes/:id',
    route(async (c, caller) => {
      const v = await visible(sid(c), caller);
      return c.json({
        ...listed(v),
        envdAccessToken: envdToken(o.secret, caller, v.id),
        domain: typeof o.domain === 'string' ? o.domain : o.domain(),
      });
    }),
  );

  app.delete(
    '/sandboxes/:id',
    route(async (c, caller) => {
      // One supervisor request: the kill checks ownership and state in the server's store itself
      // (an ended sandbox is, to E2B, not found), with no live lookup first.
      await api.kill(sid(c), caller).catch((e: unknown) => {
        if (AirlockError.is(e, 'SANDBOX_GONE'))
          throw new ApiError(404, `sandbox ${sid(c)} not found (${e.message})`);
        throw e;
      });
      return c.body(null, 204);
    }),
  );

  app.post(
    '/sandboxes/:id/timeout',
    route(async (c, caller) => {
      const { timeout } = await body(c, TimeoutBodySchema);
      if (timeout < 1) throw new ApiError(400, 'timeout: must be at least 1 second');
      await visible(sid(c), caller);
      await api.setTimeout(sid(c), timeout * 1000, caller);
      return c.body(null, 204);
    }),
  );

  app.post(
    '/sandboxes/:id/refreshes',
    route(async (c, caller) => {
      const { duration } = await body(c, RefreshBodySchema);
      await extend(await visible(sid(c), caller), duration ?? 60, caller);
      return c.body(null, 204);
    }),
  );

  app.post(
    '/sandboxes/:id/pause',
    route(async (c, caller) => {
      const { memory } = await body(c, PauseBodySchema);
      if (memory === false)
        throw new ApiError(501, 'pause with keepMemory: false is not supported by Airlock');
      const v = await visible(sid(c), caller);
      if (v.state === 'paused') throw new ApiError(409, `sandbox ${v.id} is already paused`);
      await api.pause(v.id, caller);
      return c.body(null, 204);
    }),
  );

  app.post(
    '/sandboxes/:id/resume',
    route(async (c, caller) => {
      const { timeout } = await body(c, ConnectBodySchema);
      const v = await visible(sid(c), caller);
      if (v.state !== 'paused') throw new ApiError(409, `sandbox ${v.id} is not paused`);
      const r = await api.resume(v.id, caller);
      if (timeout !== undefined) await extend(r, timeout, caller);
      return c.json(sandbox(r, caller), 201);
    }),
  );

  app.post(
    '/v2/sandboxes/:id/connect',
    route(async (c, caller) => {
      const { timeout, memory } = await body(c, ConnectBodySchema);
      if (memory === false) throw new ApiError(501, 'onResume: reboot is not supported by Airlock');
      let v: SandboxView = await visible(sid(c), caller);
      const resumed = v.state === 'paused';
      if (resumed) v = await api.resume(v.id, caller);
      if (timeout !== undefined) await extend(v, timeout, caller);
      return c.json(sandbox(v, caller), resumed ? 201 : 200);
    }),
  );

  app.post(
    '/sandboxes/:id/snapshots',
    route(async (c, caller) => {
      const { name } = await body(c, SnapshotBodySchema);
      if (name !== undefined)
        throw new ApiError(501, 'named snapshots are not supported by Airlock: omit name');
      await visible(sid(c), caller);
      const s = await api.snapshot(sid(c), caller);
      return c.json({ snapshotID: s.id, names: [] }, 201);
    }),
  );

  app.get(
    '/snapshots',
    route(async (c, caller) => {
      if (c.req.query('sandboxID') !== undefined || c.req.query('name') !== undefined) {
        throw new ApiError(
          501,
          'listing snapshots by sandbox or name is not supported by Airlock: list them all',
        );
      }
      return c.json((await api.listSnapshots(caller)).map((s) => ({ snapshotID: s.id, names: [] })));
    }),
  );

  app.delete(
    '/templates/:id',
    route(async (c, caller) => {
      const id = sid(c);
      if (!(await api.listSnapshots(caller)).some((s) => s.id === id)) {
        throw new ApiError(501, 'deleting templates is not supported by Airlock (only snapshots)');
      }
      await api.removeSnapshot(id, caller);
      return c.body(null, 204);
    }),
  );

  const unsupported = (what: string) =>
    route(() => Promise.reject(new ApiError(501, `${what} is not supported by Airlock (see docs/e2b.md)`)));
  app.get('/sandboxes/:id/metrics', unsupported('sandbox metrics'));
  app.get('/sandboxes/metrics', unsupported('sandbox metrics'));
  app.put('/sandboxes/:id/network', unsupported('updating the network'));
  app.post('/sandboxes/:id/fork', unsupported('fork (use createSnapshot, then create from it)'));
  app.get('/sandboxes/:id/logs', unsupported('sandbox logs'));
  // E2B's Template.build (image-based: fromImage, COPY of uploaded tar files) has no Airlock
  // counterpart; Airlock templates are built with POST /v1/templates and used here by name.
  const templateBuild = unsupported(
    "building E2B templates (Template.build) — build an Airlock template with POST /v1/templates, then Sandbox.create('<its name>')",
  );
  app.post('/v3/templates', templateBuild);
  app.post('/v2/templates/:id/builds/:build', templateBuild);
  app.get('/templates/:id/builds/:build/status', templateBuild);
  app.get('/templates/:id/files/:hash', templateBuild);
}
