// The seam of the sandbox server (issue 36). One interface, SandboxApi, is what every part of the
// server speaks:
//   - LocalSandboxApi (server/local.ts) implements it over the library (an Airlock in this process):
//     the supervisor serves it;
//   - nativeRoutes(api) (server/routes.ts) serves any SandboxApi as the native REST API (/v1/...),
//     described by the zod schemas below (and /openapi.json, generated from them);
//   - RemoteSandboxApi (server/client.ts) implements it over that REST API: the front server uses it
//     to reach the supervisor (HTTP over its unix socket), and the remote SDK to reach a server;
//   - the E2B routes (server/e2b/) and the front server's tenant scoping wrap a SandboxApi.
// Byte streams are Web streams (ReadableStream<Uint8Array>), so Hono and fetch pass them through.
import type { NetworkPolicyInput } from '../core/network-spec.js';
import type { NetworkPolicyView } from './network-wire.js';
import type { Duplex } from 'node:stream';
import { z } from 'zod';
import { CodePolicySchema } from '../core/code.js';
import { ExecutablesSchema } from '../core/spec.js';
import type { EgressEvent } from '../egress/events.js';
import type { CodeContextRef } from '../core/code.js';
import type { CodeEvent, CreateCodeContextRequest, RunCodeRequest } from './code-wire.js';

// ---- requests -------------------------------------------------------------------------------------

/**
 * What a remote client may ask for when it creates a sandbox: a strict subset of SandboxSpecInput.
 * Never host paths (mounts, a host workspace dir), never internal fields (layers), and secrets only
 * as literal values the client sends (never env:/file:/cmd: sources, which would read the server's
 * own environment, files or run its programs). The front server caps the rest by the tenant's quota
 * and the operator's policy (e.g. no allowPrivate unless the operator allows it).
 */
export const CreateRequestSchema = z
  .object({
    backend: z.enum(['namespaces', 'gvisor']).optional(),
    /** A template name or digest visible to the caller. */
    template: z.string().min(1).max(200).optional(),
    /**
     * Run on this image (a reference naming its registry). Refused unless the operator allows that
     * registry (`images.registries` in the server config; none by default). Not with template/snapshot.
     */
    image: z.string().min(1).max(1024).optional(),
    /**
     * Only these programs (and their closure) exist in the root, as SandboxSpec.executables, but by
     * name only: an absolute path would copy any host file into the client's sandbox.
     */
    executables: ExecutablesSchema.refine(
      (l) => l.every((e) => !e.startsWith('/')),
      'over a server, executables are program names (looked up on PATH), not host paths',
    ).optional(),
    /** Fork this snapshot instead of starting fresh (not with template). */
    snapshot: z.string().min(1).max(200).optional(),
    ttlMs: z.number().int().min(1000).max(86_400_000).optional(),
    limits: z
      .object({
        memoryBytes: z.number().int().positive().optional(),
        cpus: z.number().positive().optional(),
        pids: z.number().int().positive().optional(),
        diskBytes: z.number().int().positive().optional(),
      })
      .strict()
      .optional(),
    env: z.record(z.string(), z.string()).optional(),
    metadata: z.record(z.string(), z.string()).optional(),
    /** Same shape as SandboxSpec.network (NetworkPolicySchema); validated there. */
    network: z.record(z.string(), z.unknown()).optional(),
    /** Literal secrets only: { name, value, hosts }. */
    secrets: z
      .array(
        z
          .object({
            name: z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/),
            value: z.string().min(1),
            hosts: z.array(z.string().min(1)).min(1),
          })
          .strict(),
      )
      .optional(),
    /** Preview URLs without the traffic token (see PreviewSchema). */
    publicPorts: z.boolean().optional(),
    /** How long a create may wait in the queue when a quota or the host is full (default 5 s). */
    queueTimeoutMs: z.number().int().min(0).max(60_000).optional(),
    /** The static analysis policy of its runCode (SandboxSpec.codePolicy). */
    codePolicy: CodePolicySchema.optional(),
  })
  .strict();
export type CreateRequest = z.infer<typeof CreateRequestSchema>;

export const ExecRequestSchema = z
  .object({
    /** argv array, or one string run with /bin/sh -c. */
    cmd: z.union([z.string().min(1), z.array(z.string()).min(1)]),
    cwd: z.string().optional(),
    env: z.record(z.string(), z.string()).optional(),
    timeoutMs: z.number().int().positive().optional(),
    /** Text given as stdin (the whole of it); for interactive stdin start a process instead. */
    stdin: z.string().optional(),
    maxOutputBytes: z.number().int().positive().optional(),
  })
  .strict();
export type ExecRequest = z.infer<typeof ExecRequestSchema>;

// ---- views (responses) ----------------------------------------------------------------------------

export const SandboxStateSchema = z.enum(['running', 'paused', 'killed', 'expired', 'lost']);

export const SandboxViewSchema = z.object({
  id: z.string(),
  state: SandboxStateSchema,
  backend: z.string(),
  template: z.string().optional(),
  createdAt: z.string(),
  /** null: no TTL (persistent). */
  expiresAt: z.string().nullable(),
  metadata: z.record(z.string(), z.string()),
  /** Why a sandbox is `lost` (its supervisor died: it was killed and reaped). */
  reason: z.string().optional(),
  /** Its preview URLs need no traffic token (created with publicPorts: true). */
  publicPorts: z.boolean().optional(),
  /**
   * The token its preview URLs need (header X-Airlock-Traffic-Token or e2b-traffic-access-token),
   * shown to its creator when its ports are not public (server/preview.ts).
   */
  trafficToken: z.string().optional(),
});
export type SandboxView = z.infer<typeof SandboxViewSchema>;

/** One line of an exec or process stream (NDJSON on the wire). `data` is base64. */
export const ExecEventSchema = z.discriminatedUnion('type', [
  z.object({ type: z.literal('start'), pid: z.string() }),
  z.object({ type: z.literal('stdout'), data: z.string() }),
  z.object({ type: z.literal('stderr'), data: z.string() }),
  z.object({
    type: z.literal('exit'),
    exitCode: z.number().nullable(),
    signal: z.string().nullable(),
    killedBy: z.string().optional(),
    durationMs: z.number(),
    /** Processes of the sandbox the OOM killer killed while the command ran (ExecResult.oomKills). */
    oomKills: z.number().int().min(0).optional(),
  }),
  z.object({ type: z.literal('error'), code: z.string(), message: z.string() }),
]);
export type ExecEvent = z.infer<typeof ExecEventSchema>;

export const ProcessViewSchema = z.object({
  pid: z.string(),
  cmd: z.array(z.string()),
  running: z.boolean(),
  exitCode: z.number().nullable(),
});
export type ProcessView = z.infer<typeof ProcessViewSchema>;

export const FileEntrySchema = z.object({
  name: z.string(),
  path: z.string(),
  type: z.enum(['file', 'dir', 'symlink', 'other']),
  size: z.number(),
  mode: z.number(),
  mtimeMs: z.number(),
});
export type FileEntryView = z.infer<typeof FileEntrySchema>;

export const FsEventSchema = z.object({
  type: z.enum(['create', 'write', 'remove', 'rename', 'chmod']),
  path: z.string(),
});
export type FsEvent = z.infer<typeof FsEventSchema>;

export const SnapshotViewSchema = z.object({
  id: z.string(),
  backend: z.string(),
  createdAt: z.string(),
  sizeBytes: z.number(),
  parent: z.string().nullable(),
});
export type SnapshotView = z.infer<typeof SnapshotViewSchema>;

export const TemplateViewSchema = z.object({
  name: z.string(),
  digest: z.string(),
  createdAt: z.string(),
  sizeBytes: z.number(),
});
export type TemplateView = z.infer<typeof TemplateViewSchema>;

/**
 * A template a remote client may build (POST /v1/templates): the library's template file
 * (core/template.ts TemplateFileSchema, which validates it fully) minus anything that reads the
 * server's host. Files travel as their contents (no host COPY paths), there are no mounts and no
 * secrets (a step's network policy is the only thing that reaches out). Names are the tenant's own:
 * the front server keeps them apart per tenant (server/templates.ts), and allows at most 40 characters.
 */
export const TemplateBuildRequestSchema = z
  .object({
    name: z
      .string()
      .regex(
        /^[a-z0-9][a-z0-9._-]{0,62}$/,
        'a template name is lowercase letters, digits, ".", "_" or "-", starting with a letter or digit',
      ),
    /** "host" (default), one of the caller's templates by name, or one of its snapshots/templates by digest. */
    base: z.string().min(1).max(200).optional(),
    files: z.array(z.object({ path: z.string().min(1).max(4096), content: z.string() }).strict()).optional(),
    steps: z
      .array(
        z
          .object({
            run: z.union([z.string(), z.array(z.string())]),
            /** Same shape as SandboxSpec.network; validated by the template schema. */
            network: z.record(z.string(), z.unknown()).optional(),
            env: z.record(z.string(), z.string()).optional(),
            timeoutMs: z.number().int().optional(),
            workdir: z.string().optional(),
          })
          .strict(),
      )
      .optional(),
    limits: CreateRequestSchema.shape.limits,
    backend: z.enum(['namespaces', 'gvisor']).optional(),
    /** How long the build may wait in the queue when the tenant's quota is full (as a create's). */
    queueTimeoutMs: z.number().int().min(0).max(60_000).optional(),
  })
  .strict();
export type TemplateBuildRequest = z.infer<typeof TemplateBuildRequestSchema>;

/**
 * One line of a template build's NDJSON stream, in order: start; files; for each step step-started,
 * step-output (base64, at most TEMPLATE_OUTPUT_BYTES per step, then `truncated` on step-finished),
 * step-finished; layer (each captured layer); then done with the template, or error.
 */
export const TemplateEventSchema = z.discriminatedUnion('type', [
  z.object({ type: z.literal('start'), name: z.string(), steps: z.number().int() }),
  z.object({ type: z.literal('files'), count: z.number().int() }),
  z.object({
    type: z.literal('step-started'),
    index: z.number().int(),
    steps: z.number().int(),
    command: z.string(),
  }),
  z.object({
    type: z.literal('step-output'),
    index: z.number().int(),
    stream: z.enum(['stdout', 'stderr']),
    data: z.string(),
  }),
  z.object({
    type: z.literal('step-finished'),
    index: z.number().int(),
    durationMs: z.number(),
    exitCode: z.number().nullable(),
    /** Output past the per-step bound was not sent. */
    truncated: z.boolean(),
  }),
  z.object({ type: z.literal('layer'), digest: z.string(), bytes: z.number() }),
  z.object({ type: z.literal('done'), template: TemplateViewSchema }),
  z.object({
    type: z.literal('error'),
    code: z.string(),
    message: z.string(),
    field: z.string().optional(),
  }),
]);
export type TemplateEvent = z.infer<typeof TemplateEventSchema>;

/** Output bytes of one build step sent in step-output events (the rest is counted, not sent). */
export const TEMPLATE_OUTPUT_BYTES = 64 * 1024;

/** Every error body: { error: { code, message, field? } } with the status httpStatusFor(code). */
export const ErrorBodySchema = z.object({
  error: z.object({ code: z.string(), message: z.string(), field: z.string().optional() }),
});

// ---- the interface --------------------------------------------------------------------------------

/**
 * Start a background process and follow it (`start` with its pid, its events, exit): through
 * `api.startAndFollow` (one round trip to a remote server) where the api has it, else startProcess
 * then connectProcess. Aborting `signal` only stops following; the process runs on.
 */
export async function* startAndFollow(
  api: SandboxApi,
  id: string,
  req: ExecRequest,
  caller: Caller,
  signal?: AbortSignal,
): AsyncGenerator<ExecEvent> {
  if (api.startAndFollow) {
    yield* api.startAndFollow(id, req, caller, signal);
    return;
  }
  const view = await api.startProcess(id, req, caller);
  // connectProcess begins with the process's own `start` event.
  yield* api.connectProcess(id, view.pid, caller, signal);
}

/** Who is asking (the front server sets it; the supervisor trusts its only client). */
export interface Caller {
  readonly tenant: string;
}

export interface SandboxApi {
  create(req: CreateRequest, caller: Caller): Promise<SandboxView>;
  get(id: string, caller: Caller): Promise<SandboxView>;
  list(filter: { metadata?: Record<string, string> }, caller: Caller): Promise<SandboxView[]>;
  setTimeout(id: string, ttlMs: number, caller: Caller): Promise<SandboxView>;
  pause(id: string, caller: Caller): Promise<SandboxView>;
  resume(id: string, caller: Caller): Promise<SandboxView>;
  kill(id: string, caller: Caller): Promise<void>;

  /** Foreground exec: events until (and including) `exit`; aborting `signal` kills the command. */
  exec(id: string, req: ExecRequest, caller: Caller, signal?: AbortSignal): AsyncIterable<ExecEvent>;
  /** A background process; its output is kept (bounded) for connect(). */
  startProcess(id: string, req: ExecRequest, caller: Caller): Promise<ProcessView>;
  listProcesses(id: string, caller: Caller): Promise<ProcessView[]>;
  /**
   * startProcess and connectProcess in one call (one round trip to a remote server): `start` (with the
   * pid), then the process's events until exit. Aborting `signal` only stops following, as with
   * connectProcess: the process runs on. Optional: without it, callers make the two calls.
   */
  startAndFollow?(
    id: string,
    req: ExecRequest,
    caller: Caller,
    signal?: AbortSignal,
  ): AsyncIterable<ExecEvent>;
  /** Output so far, then live, until exit. */
  connectProcess(id: string, pid: string, caller: Caller, signal?: AbortSignal): AsyncIterable<ExecEvent>;
  sendStdin(id: string, pid: string, data: Uint8Array, caller: Caller): Promise<void>;
  closeStdin(id: string, pid: string, caller: Caller): Promise<void>;
  killProcess(id: string, pid: string, caller: Caller): Promise<void>;

  /** The file's bytes; aborting `signal` (before or while they stream) stops the reader. */
  readFile(
    id: string,
    path: string,
    caller: Caller,
    signal?: AbortSignal,
  ): Promise<ReadableStream<Uint8Array>>;
  writeFile(
    id: string,
    path: string,
    body: ReadableStream<Uint8Array>,
    caller: Caller,
  ): Promise<FileEntryView>;
  listDir(id: string, path: string, caller: Caller): Promise<FileEntryView[]>;
  stat(id: string, path: string, caller: Caller): Promise<FileEntryView>;
  remove(id: string, path: string, caller: Caller): Promise<void>;
  makeDir(id: string, path: string, caller: Caller): Promise<FileEntryView>;
  /**
   * Changes in a directory. `ready`, when present, settles once the watch is established (changes
   * after it are reported) or failed; the route sends its response headers only then.
   */
  watch(
    id: string,
    path: string,
    caller: Caller,
    signal?: AbortSignal,
  ): AsyncIterable<FsEvent> & { readonly ready?: Promise<void> };

  snapshot(id: string, caller: Caller): Promise<SnapshotView>;
  listSnapshots(caller: Caller): Promise<SnapshotView[]>;
  removeSnapshot(snapshotId: string, caller: Caller): Promise<void>;

  egressEvents(id: string, caller: Caller, signal?: AbortSignal): AsyncIterable<EgressEvent>;

  /**
   * A raw TCP connection to `port` on the sandbox's own loopback (preview URLs; sbx.connectPort).
   * Route: GET /v1/sandboxes/:id/ports/:port with `Upgrade: airlock-tcp`, the raw duplex after 101
   * (server/port-route.ts, server/port-client.ts). Optional so that an implementation without it
   * still type-checks; callers answer BACKEND_UNAVAILABLE when it is absent.
   */
  connectPort?(id: string, port: number, caller: Caller, signal?: AbortSignal): Promise<Duplex>;

  /**
   * Templates (routes /v1/templates; server/local-templates.ts, server/templates.ts). Optional like
   * connectPort: the routes answer BACKEND_UNAVAILABLE where they are absent. buildTemplate's events
   * end with `done` (or it throws); aborting `signal` cancels the build, which then leaves nothing.
   */
  buildTemplate?(
    req: TemplateBuildRequest,
    caller: Caller,
    signal?: AbortSignal,
  ): AsyncIterable<TemplateEvent>;
  listTemplates?(caller: Caller): Promise<TemplateView[]>;
  getTemplate?(name: string, caller: Caller): Promise<TemplateView>;
  removeTemplate?(name: string, caller: Caller): Promise<void>;

  /**
   * runCode and code contexts (routes /v1/sandboxes/:id/code…; server/code-wire.ts). Optional like
   * connectPort: the routes answer BACKEND_UNAVAILABLE where they are absent. runCode's events end
   * with `end`; a denial by the analysis throws CODE_DENIED before the first; aborting `signal` kills
   * the run.
   */
  runCode?(id: string, req: RunCodeRequest, caller: Caller, signal?: AbortSignal): AsyncIterable<CodeEvent>;
  createCodeContext?(id: string, req: CreateCodeContextRequest, caller: Caller): Promise<CodeContextRef>;
  listCodeContexts?(id: string, caller: Caller): Promise<CodeContextRef[]>;
  closeCodeContext?(id: string, contextId: string, caller: Caller): Promise<void>;

  /**
   * Replace a live sandbox's network policy (route PUT /v1/sandboxes/:id/network;
   * server/network-wire.ts); answers with the policy in force. Optional like connectPort.
   */
  setNetworkPolicy?(id: string, policy: NetworkPolicyInput, caller: Caller): Promise<NetworkPolicyView>;
}
