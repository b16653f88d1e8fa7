import { PORT_ROUTE, portRouteFallback } from './port-route.js';
// nativeRoutes(api): any SandboxApi served as the native REST API (route-table.ts lists the routes).
// Every input is validated with zod (400 naming the field); every error goes through errorResponse
// (AirlockError → httpStatusFor, anything else a bare 500 INTERNAL); bodies and uploads are counted as
// they stream and cut at their caps (413); a stream stops, and what feeds it is killed or closed, when
// the client goes away.
import { Hono, type Context } from 'hono';
import { AirlockError } from '../core/errors.js';
import { silentLogger, type Logger } from '../core/backend.js';
import { parseOrThrow } from '../core/validate.js';
import {
  CreateRequestSchema,
  ExecRequestSchema,
  startAndFollow,
  type Caller,
  type CreateRequest,
  type SandboxApi,
  type TemplateBuildRequest,
} from './contract.js';
import { openApiDocument } from './openapi.js';
import { NetworkPolicyRequestSchema } from './network-wire.js';
import type { NetworkPolicy } from '../core/network-spec.js';
import { TemplateBuildBodySchema } from './templates.js';
import { PathQuerySchema, TimeoutRequestSchema } from './route-table.js';
import { errorResponse, tooLarge } from './http-errors.js';
import { cappedStream, ndjsonResponse, readBodyCapped } from './streams.js';
import {
  CreateCodeContextRequestSchema,
  RunCodeRequestSchema,
  type CreateCodeContextRequest,
  type RunCodeRequest,
} from './code-wire.js';

export interface NativeRoutesOptions {
  /** Who is asking (default: tenant "default"; the front server derives it from the API key). */
  readonly caller?: (c: Context) => Caller;
  /** Cap of a JSON body or a stdin write (default 1 MiB). */
  readonly maxBodyBytes?: number;
  /** Cap of one file upload (default 1 GiB). */
  readonly maxUploadBytes?: number;
  /** Whether a create may carry network.allowPrivate (the operator's choice; default false). */
  readonly allowPrivateNetwork?: boolean;
  /** Where unexpected (non-Airlock) errors are logged; their details never reach the client. */
  readonly logger?: Logger;
  /** Cap of a template definition (POST /v1/templates; default 4 MiB: files travel inside it). */
  readonly maxTemplateBytes?: number;
  /** How long a foreground exec's start line waits for the next event (default EXEC_START_HOLD_MS). */
  readonly execStartHoldMs?: number;
  /** Serve GET /openapi.json (default true; a server that documents more routes serves its own). */
  readonly openapi?: boolean;
}

const MiB = 1024 * 1024;
/**
 * How long a foreground exec's `start` line waits for the next event (streams.ts holdFirstMs): a short
 * command then answers in one write per hop (start and exit together). Output is never held, and
 * nothing waits on the start line of a foreground exec (the caller waits for its exit).
 */
export const EXEC_START_HOLD_MS = 200;

/** What the operator allows beyond the request schema. */
function checkCreatePolicy(req: CreateRequest, allowPrivate: boolean): void {
  const ap = req.network?.allowPrivate;
  if (!allowPrivate && ap !== undefined && !(Array.isArray(ap) && ap.length === 0)) {
    throw new AirlockError(
      'PERMISSION_DENIED',
      'network.allowPrivate is not allowed on this server (the operator has not enabled it); remove it',
      { field: 'network.allowPrivate' },
    );
  }
}

/** metadata.KEY=VALUE query parameters → a filter. */
function metadataFilter(c: Context): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [k, v] of new URL(c.req.url).searchParams) {
    if (k.startsWith('metadata.') && k.length > 'metadata.'.length) out[k.slice('metadata.'.length)] = v;
  }
  return out;
}

export function nativeRoutes(api: SandboxApi, opts: NativeRoutesOptions = {}): Hono {
  const app = new Hono();
  const callerOf = opts.caller ?? ((): Caller => ({ tenant: 'default' }));
  const maxBody = opts.maxBodyBytes ?? MiB;
  const maxUpload = opts.maxUploadBytes ?? 1024 * MiB;
  const maxTemplate = opts.maxTemplateBytes ?? 4 * MiB;
  const logger = opts.logger ?? silentLogger;
  // A run's code may be up to 4 MiB (as the library's), JSON-escaped.
  const maxCodeBody = Math.max(maxBody, 9 * MiB);

  /** The request's JSON body, capped, parsed, validated. */
  const body = async <T>(
    c: Context,
    schema: { safeParse(v: unknown): unknown } & Parameters<typeof parseOrThrow>[0],
    code: 'INVALID_SPEC' | 'INVALID_ARGUMENT',
    max = maxBody,
  ): Promise<T> => {
    const bytes = await readBodyCapped(c, max, () => tooLarge('request body', max));
    let json: unknown;
    try {
      json = bytes.length === 0 ? {} : JSON.parse(new TextDecoder('utf-8', { fatal: true }).decode(bytes));
    } catch {
      throw new AirlockError('INVALID_ARGUMENT', 'the request body is not valid JSON; send one JSON object', {
        field: 'body',
      });
    }
    if (typeof json !== 'object' || json === null || Array.isArray(json)) {
      throw new AirlockError('INVALID_ARGUMENT', 'the request body must be one JSON object', {
        field: 'body',
      });
    }
    return parseOrThrow(schema, json, 'request body', code) as T;
  };
  const pathOf = (c: Context): string =>
    parseOrThrow(PathQuerySchema, { path: c.req.query('path') ?? '' }, 'query', 'INVALID_ARGUMENT').path;

  /** A handler with the caller, the client-gone signal and the one error mapping. */
  type Handler = (c: Context, caller: Caller, signal: AbortSignal) => Promise<Response>;
  const h =
    (fn: Handler) =>
    async (c: Context): Promise<Response> => {
      try {
        return await fn(c, callerOf(c), c.req.raw.signal);
      } catch (e) {
        return errorResponse(e, logger);
      }
    };
  const ok = (c: Context, v: unknown, status: 200 | 201 = 200): Response => c.json(v as object, status);
  const none = (): Response => new Response(null, { status: 204 });

  app.post(
    '/v1/sandboxes',
    h(async (c, caller) => {
      const req = await body<CreateRequest>(c, CreateRequestSchema, 'INVALID_SPEC');
      checkCreatePolicy(req, opts.allowPrivateNetwork === true);
      return ok(c, await api.create(req, caller), 201);
    }),
  );
  app.get(PORT_ROUTE, portRouteFallback);
  app.get(
    '/v1/sandboxes',
    h(async (c, caller) => ok(c, await api.list({ metadata: metadataFilter(c) }, caller))),
  );
  app.get(
    '/v1/sandboxes/:id',
    h(async (c, caller) => ok(c, await api.get(c.req.param('id')!, caller))),
  );
  app.delete(
    '/v1/sandboxes/:id',
    h(async (c, caller) => {
      await api.kill(c.req.param('id')!, caller);
      return none();
    }),
  );
  app.post(
    '/v1/sandboxes/:id/timeout',
    h(async (c, caller) => {
      const { ttlMs } = await body<{ ttlMs: number }>(c, TimeoutRequestSchema, 'INVALID_ARGUMENT');
      return ok(c, await api.setTimeout(c.req.param('id')!, ttlMs, caller));
    }),
  );
  app.post(
    '/v1/sandboxes/:id/pause',
    h(async (c, caller) => ok(c, await api.pause(c.req.param('id')!, caller))),
  );
  app.post(
    '/v1/sandboxes/:id/resume',
    h(async (c, caller) => ok(c, await api.resume(c.req.param('id')!, caller))),
  );

  // ---- processes ----
  app.post(
    '/v1/sandboxes/:id/exec',
    h(async (c, caller, signal) => {
      const req = await body<Parameters<SandboxApi['exec']>[1]>(c, ExecRequestSchema, 'INVALID_ARGUMENT');
      const ctl = linked(signal);
      return ndjsonResponse(api.exec(c.req.param('id')!, req, caller, ctl.signal), ctl, 'exec', {
        firstBeforeHeaders: true,
        holdFirstMs: opts.execStartHoldMs ?? EXEC_START_HOLD_MS,
      });
    }),
  );
  app.post(
    '/v1/sandboxes/:id/processes',
    h(async (c, caller) => {
      const req = await body<Parameters<SandboxApi['exec']>[1]>(c, ExecRequestSchema, 'INVALID_ARGUMENT');
      return ok(c, await api.startProcess(c.req.param('id')!, req, caller), 201);
    }),
  );
  app.post(
    '/v1/sandboxes/:id/processes/stream',
    h(async (c, caller, signal) => {
      const req = await body<Parameters<SandboxApi['exec']>[1]>(c, ExecRequestSchema, 'INVALID_ARGUMENT');
      const id = c.req.param('id')!;
      const ctl = linked(signal);
      // Closing the connection stops following only (ctl reaches connectProcess, not the process).
      const events = startAndFollow(api, id, req, caller, ctl.signal);
      return ndjsonResponse(events, ctl, 'exec', { firstBeforeHeaders: true });
    }),
  );
  app.get(
    '/v1/sandboxes/:id/processes',
    h(async (c, caller) => ok(c, await api.listProcesses(c.req.param('id')!, caller))),
  );
  app.get(
    '/v1/sandboxes/:id/processes/:pid/stream',
    h(async (c, caller, signal) => {
      const ctl = linked(signal);
      const events = api.connectProcess(c.req.param('id')!, c.req.param('pid')!, caller, ctl.signal);
      return ndjsonResponse(events, ctl, 'exec', { firstBeforeHeaders: true });
    }),
  );
  app.post(
    '/v1/sandboxes/:id/processes/:pid/stdin',
    h(async (c, caller) => {
      const data = await readBodyCapped(c, maxBody, () => tooLarge('stdin data', maxBody));
      await api.sendStdin(c.req.param('id')!, c.req.param('pid')!, data, caller);
      return none();
    }),
  );
  app.delete(
    '/v1/sandboxes/:id/processes/:pid/stdin',
    h(async (c, caller) => {
      await api.closeStdin(c.req.param('id')!, c.req.param('pid')!, caller);
      return none();
    }),
  );
  app.delete(
    '/v1/sandboxes/:id/processes/:pid',
    h(async (c, caller) => {
      await api.killProcess(c.req.param('id')!, c.req.param('pid')!, caller);
      return none();
    }),
  );

  // ---- files ----
  app.get(
    '/v1/sandboxes/:id/files',
    h(async (c, caller, signal) => {
      const stream = await api.readFile(c.req.param('id')!, pathOf(c), caller, signal);
      return new Response(stream, { headers: { 'content-type': 'application/octet-stream' } });
    }),
  );
  app.put(
    '/v1/sandboxes/:id/files',
    h(async (c, caller) => {
      const path = pathOf(c);
      const declared = Number(c.req.header('content-length') ?? NaN);
      if (declared > maxUpload) throw tooLarge('upload', maxUpload);
      const src = c.req.raw.body ?? new ReadableStream<Uint8Array>({ start: (ctl) => ctl.close() });
      return ok(
        c,
        await api.writeFile(c.req.param('id')!, path, cappedStream(src, maxUpload, 'upload'), caller),
      );
    }),
  );
  app.delete(
    '/v1/sandboxes/:id/files',
    h(async (c, caller) => {
      await api.remove(c.req.param('id')!, pathOf(c), caller);
      return none();
    }),
  );
  app.get(
    '/v1/sandboxes/:id/files/list',
    h(async (c, caller) => ok(c, await api.listDir(c.req.param('id')!, pathOf(c), caller))),
  );
  app.get(
    '/v1/sandboxes/:id/files/stat',
    h(async (c, caller) => ok(c, await api.stat(c.req.param('id')!, pathOf(c), caller))),
  );
  app.post(
    '/v1/sandboxes/:id/files/mkdir',
    h(async (c, caller) => ok(c, await api.makeDir(c.req.param('id')!, pathOf(c), caller))),
  );
  app.get(
    '/v1/sandboxes/:id/files/watch',
    h(async (c, caller, signal) => {
      const path = pathOf(c);
      const ctl = linked(signal);
      const events = api.watch(c.req.param('id')!, path, caller, ctl.signal);
      // Headers go once the watch is established (a change after that is reported), or its error does.
      const ready = events.ready;
      try {
        if (ready) await ready;
        else await api.get(c.req.param('id')!, caller);
      } catch (e) {
        ctl.abort();
        throw e;
      }
      return ndjsonResponse(events, ctl, 'plain');
    }),
  );

  // ---- snapshots, egress ----
  app.post(
    '/v1/sandboxes/:id/snapshot',
    h(async (c, caller) => ok(c, await api.snapshot(c.req.param('id')!, caller), 201)),
  );
  app.get(
    '/v1/snapshots',
    h(async (c, caller) => ok(c, await api.listSnapshots(caller))),
  );
  app.delete(
    '/v1/snapshots/:id',
    h(async (c, caller) => {
      await api.removeSnapshot(c.req.param('id')!, caller);
      return none();
    }),
  );
  app.get(
    '/v1/sandboxes/:id/egress',
    h(async (c, caller, signal) => {
      await api.get(c.req.param('id')!, caller); // an unknown id is a 404, not an empty stream
      const ctl = linked(signal);
      return ndjsonResponse(api.egressEvents(c.req.param('id')!, caller, ctl.signal), ctl, 'plain');
    }),
  );
  // ---- templates (server/templates.ts scopes them per tenant) ----
  const templates = (): Required<
    Pick<SandboxApi, 'buildTemplate' | 'listTemplates' | 'getTemplate' | 'removeTemplate'>
  > => {
    if (!api.buildTemplate || !api.listTemplates || !api.getTemplate || !api.removeTemplate)
      throw new AirlockError('BACKEND_UNAVAILABLE', 'this server does not build templates');
    return api as Required<
      Pick<SandboxApi, 'buildTemplate' | 'listTemplates' | 'getTemplate' | 'removeTemplate'>
    >;
  };
  app.post(
    '/v1/templates',
    h(async (c, caller, signal) => {
      const t = templates();
      const req = await body<TemplateBuildRequest>(c, TemplateBuildBodySchema, 'INVALID_SPEC', maxTemplate);
      const ctl = linked(signal);
      // The first event is awaited before the headers: a refusal (quota, bad base) is a plain status.
      return ndjsonResponse(t.buildTemplate(req, caller, ctl.signal), ctl, 'exec', {
        firstBeforeHeaders: true,
      });
    }),
  );
  app.get(
    '/v1/templates',
    h(async (c, caller) => ok(c, await templates().listTemplates(caller))),
  );
  app.get(
    '/v1/templates/:name',
    h(async (c, caller) => ok(c, await templates().getTemplate(c.req.param('name')!, caller))),
  );
  app.delete(
    '/v1/templates/:name',
    h(async (c, caller) => {
      await templates().removeTemplate(c.req.param('name')!, caller);
      return none();
    }),
  );
  // runCode and code contexts (server/code-wire.ts).
  type CodeApi = Required<
    Pick<SandboxApi, 'runCode' | 'createCodeContext' | 'listCodeContexts' | 'closeCodeContext'>
  >;
  const code = (): CodeApi => {
    if (!api.runCode || !api.createCodeContext || !api.listCodeContexts || !api.closeCodeContext)
      throw new AirlockError('BACKEND_UNAVAILABLE', 'this server does not run code (runCode)');
    return api as CodeApi;
  };
  app.post(
    '/v1/sandboxes/:id/code',
    h(async (c, caller, signal) => {
      const a = code();
      const req = await body<RunCodeRequest>(c, RunCodeRequestSchema, 'INVALID_ARGUMENT', maxCodeBody);
      const ctl = linked(signal);
      // The first event is awaited before the headers: a denial (422 CODE_DENIED with its findings),
      // an unknown context or sandbox is a plain error status.
      return ndjsonResponse(a.runCode(c.req.param('id')!, req, caller, ctl.signal), ctl, 'exec', {
        firstBeforeHeaders: true,
      });
    }),
  );
  app.post(
    '/v1/sandboxes/:id/code/contexts',
    h(async (c, caller) => {
      const a = code();
      const req = await body<CreateCodeContextRequest>(c, CreateCodeContextRequestSchema, 'INVALID_ARGUMENT');
      return ok(c, await a.createCodeContext(c.req.param('id')!, req, caller), 201);
    }),
  );
  app.get(
    '/v1/sandboxes/:id/code/contexts',
    h(async (c, caller) => ok(c, await code().listCodeContexts(c.req.param('id')!, caller))),
  );
  app.delete(
    '/v1/sandboxes/:id/code/contexts/:ctx',
    h(async (c, caller) => {
      await code().closeCodeContext(c.req.param('id')!, c.req.param('ctx')!, caller);
      return none();
    }),
  );
  // A live sandbox's network policy (server/network-wire.ts).
  app.put(
    '/v1/sandboxes/:id/network',
    h(async (c, caller) => {
      if (!api.setNetworkPolicy)
        throw new AirlockError('BACKEND_UNAVAILABLE', 'this server cannot change network policies');
      const policy = await body<NetworkPolicy>(c, NetworkPolicyRequestSchema, 'INVALID_ARGUMENT');
      return ok(c, await api.setNetworkPolicy(c.req.param('id')!, policy, caller));
    }),
  );
  if (opts.openapi !== false) app.get('/openapi.json', (c) => c.json(openApiDocument()));
  return app;
}

/** An AbortController that also aborts with `parent` (the client's connection). */
function linked(parent: AbortSignal): AbortController {
  const ctl = new AbortController();
  if (parent.aborted) ctl.abort();
  else parent.addEventListener('abort', () => ctl.abort(), { once: true });
  return ctl;
}
