// The native REST API's route table: every route with its request and response schemas. routes.ts
// serves exactly these (test/server/openapi.test.ts holds the two together) and openapi.ts documents
// them; the schemas are contract.ts's, so the wire, the server and the document cannot drift apart.
import { z } from 'zod';
import {
  CreateRequestSchema,
  ExecEventSchema,
  ExecRequestSchema,
  FileEntrySchema,
  FsEventSchema,
  ProcessViewSchema,
  SandboxViewSchema,
  SnapshotViewSchema,
  TemplateBuildRequestSchema,
  TemplateEventSchema,
  TemplateViewSchema,
} from './contract.js';
import { NetworkPolicyRequestSchema, NetworkPolicyViewSchema } from './network-wire.js';
import {
  CodeContextViewSchema,
  CodeEventSchema,
  CreateCodeContextRequestSchema,
  RunCodeRequestSchema,
} from './code-wire.js';

export const PathQuerySchema = z.object({ path: z.string().min(1, 'path is required').max(4096) }).strict();
export const TimeoutRequestSchema = z.object({ ttlMs: z.number().int().min(1000).max(86_400_000) }).strict();

/** One line of the egress stream (src/egress/events.ts EgressEvent; documented loosely). */
export const EgressEventDocSchema = z
  .object({
    sandboxId: z.string(),
    time: z.string(),
    protocol: z.string(),
    host: z.string(),
    port: z.number(),
    decision: z.enum(['allow', 'deny']),
    reason: z.string(),
  })
  .loose();

export type RouteBody = { kind: 'json'; schema: z.ZodType } | { kind: 'bytes' };
export type RouteResponse =
  | { status: 200 | 201; kind: 'json'; schema: z.ZodType }
  | { status: 200; kind: 'ndjson'; item: z.ZodType }
  | { status: 200; kind: 'bytes' }
  | { status: 204; kind: 'empty' }
  | { status: 101; kind: 'upgrade'; protocol: string }
  /** MCP Streamable HTTP (/mcp): a JSON-RPC answer as JSON, or an SSE stream of them. */
  | { status: 200 | 202; kind: 'mcp' };

export interface RouteDoc {
  readonly method: 'get' | 'post' | 'put' | 'delete';
  /** Hono syntax (`:id`). */
  readonly path: string;
  readonly summary: string;
  readonly query?: z.ZodObject;
  readonly body?: RouteBody;
  readonly response: RouteResponse;
}

const json = (schema: z.ZodType, status: 200 | 201 = 200): RouteResponse => ({
  status,
  kind: 'json',
  schema,
});
const ndjson = (item: z.ZodType): RouteResponse => ({ status: 200, kind: 'ndjson', item });
const empty: RouteResponse = { status: 204, kind: 'empty' };
const S = '/v1/sandboxes/:id';

export const NATIVE_ROUTES: readonly RouteDoc[] = [
  {
    method: 'post',
    path: '/v1/sandboxes',
    summary: 'Create a sandbox (fresh, from a template, or a fork of a snapshot)',
    body: { kind: 'json', schema: CreateRequestSchema },
    response: json(SandboxViewSchema, 201),
  },
  {
    method: 'get',
    path: '/v1/sandboxes',
    summary: 'List live sandboxes; filter with metadata.KEY=VALUE query parameters',
    response: json(z.array(SandboxViewSchema)),
  },
  { method: 'get', path: S, summary: 'Get one sandbox', response: json(SandboxViewSchema) },
  { method: 'delete', path: S, summary: 'Kill a sandbox', response: empty },
  {
    method: 'post',
    path: `${S}/timeout`,
    summary: "Set the sandbox's TTL from now",
    body: { kind: 'json', schema: TimeoutRequestSchema },
    response: json(SandboxViewSchema),
  },
  {
    method: 'put',
    path: `${S}/network`,
    summary:
      "Replace the sandbox's network policy now: new connections and DNS answers follow it, open " +
      'connections it denies are closed. Answers with the policy in force.',
    body: { kind: 'json', schema: NetworkPolicyRequestSchema },
    response: json(NetworkPolicyViewSchema),
  },
  { method: 'post', path: `${S}/pause`, summary: 'Freeze every process', response: json(SandboxViewSchema) },
  {
    method: 'post',
    path: `${S}/resume`,
    summary: 'Thaw a paused sandbox',
    response: json(SandboxViewSchema),
  },
  {
    method: 'post',
    path: `${S}/exec`,
    summary:
      'Run a command: NDJSON events start, stdout/stderr (base64), exit. An error after the start is a ' +
      'last line {type:"error",code,message}. Closing the connection kills the command.',
    body: { kind: 'json', schema: ExecRequestSchema },
    response: ndjson(ExecEventSchema),
  },
  {
    method: 'post',
    path: `${S}/processes`,
    summary: 'Start a background process (its output is kept, bounded, for connect)',
    body: { kind: 'json', schema: ExecRequestSchema },
    response: json(ProcessViewSchema, 201),
  },
  {
    method: 'post',
    path: `${S}/processes/stream`,
    summary:
      'Start a background process and follow it in one call: NDJSON start (with its pid), output, exit. ' +
      'Closing the connection only stops following; the process runs on.',
    body: { kind: 'json', schema: ExecRequestSchema },
    response: ndjson(ExecEventSchema),
  },
  {
    method: 'get',
    path: `${S}/processes`,
    summary: "List the sandbox's background processes",
    response: json(z.array(ProcessViewSchema)),
  },
  {
    method: 'get',
    path: `${S}/processes/:pid/stream`,
    summary: 'Connect to a process: NDJSON start, the output kept so far, then live output, then exit',
    response: ndjson(ExecEventSchema),
  },
  {
    method: 'post',
    path: `${S}/processes/:pid/stdin`,
    summary: "Write the raw body to the process's stdin",
    body: { kind: 'bytes' },
    response: empty,
  },
  {
    method: 'delete',
    path: `${S}/processes/:pid/stdin`,
    summary: "Close the process's stdin",
    response: empty,
  },
  { method: 'delete', path: `${S}/processes/:pid`, summary: 'Kill a background process', response: empty },
  {
    method: 'get',
    path: `${S}/ports/:port`,
    summary:
      "A raw TCP connection to a port on the sandbox's own loopback: send `Upgrade: airlock-tcp`; after 101 the connection carries the bytes (preview URLs use it)",
    response: { status: 101, kind: 'upgrade', protocol: 'airlock-tcp' },
  },
  {
    method: 'get',
    path: `${S}/files`,
    summary: "A file's bytes (streamed)",
    query: PathQuerySchema,
    response: { status: 200, kind: 'bytes' },
  },
  {
    method: 'put',
    path: `${S}/files`,
    summary: 'Write a file from the raw body (streamed; replaced whole once complete; 413 over the cap)',
    query: PathQuerySchema,
    body: { kind: 'bytes' },
    response: json(FileEntrySchema),
  },
  {
    method: 'delete',
    path: `${S}/files`,
    summary: 'Remove a file or a directory tree',
    query: PathQuerySchema,
    response: empty,
  },
  {
    method: 'get',
    path: `${S}/files/list`,
    summary: "A directory's entries",
    query: PathQuerySchema,
    response: json(z.array(FileEntrySchema)),
  },
  {
    method: 'get',
    path: `${S}/files/stat`,
    summary: 'One entry',
    query: PathQuerySchema,
    response: json(FileEntrySchema),
  },
  {
    method: 'post',
    path: `${S}/files/mkdir`,
    summary: 'Make a directory (and its parents)',
    query: PathQuerySchema,
    response: json(FileEntrySchema),
  },
  {
    method: 'get',
    path: `${S}/files/watch`,
    summary:
      'Changes in a directory (not recursive), as NDJSON; sent once the first listing is taken. An error ' +
      'is a last line {error:{code,message}}.',
    query: PathQuerySchema,
    response: ndjson(FsEventSchema),
  },
  {
    method: 'post',
    path: `${S}/snapshot`,
    summary: "Snapshot the sandbox's filesystem state",
    response: json(SnapshotViewSchema, 201),
  },
  {
    method: 'get',
    path: '/v1/snapshots',
    summary: 'List snapshots',
    response: json(z.array(SnapshotViewSchema)),
  },
  { method: 'delete', path: '/v1/snapshots/:id', summary: 'Remove a snapshot', response: empty },
  {
    method: 'get',
    path: `${S}/egress`,
    summary: "The sandbox's egress events so far, then live ones (NDJSON)",
    response: ndjson(EgressEventDocSchema),
  },
  {
    method: 'post',
    path: `${S}/code`,
    summary:
      'Run code (runCode): NDJSON stdout/stderr text and results as they come, then end with the ' +
      'Execution. 422 CODE_DENIED (with findings) when the static analysis denies it: nothing ran. ' +
      'Closing the connection aborts the run.',
    body: { kind: 'json', schema: RunCodeRequestSchema },
    response: ndjson(CodeEventSchema),
  },
  {
    method: 'post',
    path: `${S}/code/contexts`,
    summary: 'Create a stateful code context',
    body: { kind: 'json', schema: CreateCodeContextRequestSchema },
    response: json(CodeContextViewSchema, 201),
  },
  {
    method: 'get',
    path: `${S}/code/contexts`,
    summary: "The sandbox's code contexts",
    response: json(z.array(CodeContextViewSchema)),
  },
  {
    method: 'delete',
    path: `${S}/code/contexts/:ctx`,
    summary: 'Close a code context (its state is gone)',
    response: empty,
  },
  {
    method: 'post',
    path: '/v1/templates',
    summary:
      "Build a template (the caller's own name): NDJSON progress start, files, step-started, step-output " +
      '(base64, bounded per step), step-finished (durationMs), layer, then done with the template. A ' +
      'failure is a last line {type:"error",code,message,field}. Closing the connection cancels the build.',
    body: { kind: 'json', schema: TemplateBuildRequestSchema },
    response: ndjson(TemplateEventSchema),
  },
  {
    method: 'get',
    path: '/v1/templates',
    summary: "The caller's templates",
    response: json(z.array(TemplateViewSchema)),
  },
  { method: 'get', path: '/v1/templates/:name', summary: 'One template', response: json(TemplateViewSchema) },
  {
    method: 'delete',
    path: '/v1/templates/:name',
    summary: 'Delete a template (409 SNAPSHOT_IN_USE while a sandbox runs on it)',
    response: empty,
  },
];
