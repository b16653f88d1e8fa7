// `airlock mcp-server`: Airlock itself as an MCP server. One McpServer (the MCP SDK's) per MCP session,
// with its own sandboxes: an id is looked up only among the sandboxes this session created, so another
// session's id (or a made-up one) gets the same "not found" and cannot be probed. Closing the session
// kills every sandbox it made, including one whose creation was still under way. Every tool result is
// bounded (tools.ts clips output; lists are capped by the per-session sandbox cap).
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import type { CallToolResult } from '@modelcontextprotocol/sdk/types.js';
import { z } from 'zod';
import { AirlockError } from '../../core/errors.js';
import { BACKEND_NAMES, type BackendName, type SandboxSpecInput } from '../../core/spec.js';
import type { PortableSandbox } from '../../sandbox/portable.js';
import type { Execution } from '../../core/code.js';
import { withFigures } from './images.js';
import {
  DEFAULT_MAX_OUTPUT_CHARS,
  ExecInputSchema,
  ListFilesInputSchema,
  ReadFileInputSchema,
  RunCodeInputSchema,
  TOOL_DESCRIPTIONS,
  WriteFileInputSchema,
  asToolResult,
  toolExecutors,
} from '../tools.js';

/** What creates the sandboxes: the library's Airlock (or a RemoteAirlock). */
export interface McpSandboxRuntime {
  create(spec?: SandboxSpecInput): Promise<PortableSandbox>;
}

/** Options every session of one `airlock mcp-server` shares. */
export interface AirlockMcpServerOptions {
  readonly runtime: McpSandboxRuntime;
  /** Backend of a sandbox whose create does not name one (default namespaces). */
  readonly backend?: BackendName;
  /** TTL of a sandbox whose create does not give one (default 10 min). */
  readonly ttlMs?: number;
  /** The longest TTL a create may ask for (default 1 h). */
  readonly maxTtlMs?: number;
  /** Live sandboxes per session (default 4). */
  readonly maxSandboxes?: number;
  /** Characters kept of each output field (default 16000). */
  readonly maxOutputChars?: number;
  /** The server's version, as reported to clients. */
  readonly version?: string;
}

const sandboxId = z
  .string()
  .min(1)
  .max(128)
  .describe('A sandbox from sandbox_create (default: this session’s own)');

/** sandbox_create: the subset of a spec an MCP client may set. */
export const SandboxCreateInputSchema = z
  .object({
    backend: z.enum(BACKEND_NAMES).optional().describe('Isolation tier'),
    template: z.string().min(1).max(256).optional().describe('A built template, by name or digest'),
    image: z.string().min(1).max(512).optional().describe('An OCI image reference for the root filesystem'),
    network: z
      .enum(['none', 'allowlist'])
      .optional()
      .describe('none (default): no network; allowlist: only the hosts in `allow`, through the egress proxy'),
    allow: z.array(z.string().min(1).max(260)).max(64).optional().describe('Hosts for network: allowlist'),
    ttlMs: z.number().int().min(1000).optional().describe('Lifetime in milliseconds'),
  })
  .strict();

const inSandbox = { sandbox_id: sandboxId.optional() };
const ExecMcpSchema = ExecInputSchema.extend(inSandbox).strict();
const RunCodeMcpSchema = RunCodeInputSchema.extend(inSandbox).strict();
const ReadFileMcpSchema = ReadFileInputSchema.extend(inSandbox).strict();
const WriteFileMcpSchema = WriteFileInputSchema.extend(inSandbox).strict();
const ListFilesMcpSchema = ListFilesInputSchema.extend(inSandbox).strict();

/** The tools one session offers, by name. */
export const MCP_TOOL_NAMES = [
  'sandbox_create',
  'sandbox_list',
  'sandbox_kill',
  'exec',
  'run_code',
  'read_file',
  'write_file',
  'list_files',
] as const;

/** One MCP session: its McpServer and the sandboxes it created. */
export class AirlockMcpSession {
  readonly server: McpServer;
  private readonly sandboxes = new Map<string, PortableSandbox>();
  /** Creates in flight (counted against the cap; killed if the session closes first). */
  private pending = 0;
  private defaultSandbox: Promise<PortableSandbox> | undefined;
  private closed = false;
  private readonly max: number;

  constructor(private readonly opts: AirlockMcpServerOptions) {
    this.max = opts.maxSandboxes ?? 4;
    this.server = new McpServer(
      { name: 'airlock', version: opts.version ?? '0.0.0' },
      {
        instructions:
          'Run commands and code in isolated Airlock sandboxes. Tools without sandbox_id use this session’s own sandbox (created on first use). Sandboxes are killed when the session ends.',
      },
    );
    this.register();
  }

  /** Ids of this session's live sandboxes. */
  get sandboxIds(): string[] {
    return [...this.sandboxes.keys()];
  }

  /** End the session: kill every sandbox it made (idempotent). */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    const all = [...this.sandboxes.values()];
    this.sandboxes.clear();
    await Promise.allSettled(all.map((s) => s.kill()));
    await this.server.close().catch(() => {});
  }

  private register(): void {
    const max = this.opts.maxOutputChars ?? DEFAULT_MAX_OUTPUT_CHARS;
    const s = this.server;
    s.registerTool(
      'sandbox_create',
      {
        description: 'Create a new isolated sandbox for this session and return its id.',
        inputSchema: SandboxCreateInputSchema,
      },
      async (input) => result(await asToolResult(async () => this.create(input))),
    );
    s.registerTool(
      'sandbox_list',
      { description: "List this session's sandboxes.", inputSchema: z.object({}).strict() },
      async () =>
        result({
          sandboxes: [...this.sandboxes.values()].map((x) => ({
            id: x.id,
            backend: x.info.backend,
            alive: x.alive,
            expiresAt: x.info.expiresAt?.toISOString() ?? null,
          })),
        }),
    );
    s.registerTool(
      'sandbox_kill',
      {
        description: 'Kill one of this session’s sandboxes.',
        inputSchema: z.object({ sandbox_id: sandboxId }).strict(),
      },
      async (input) =>
        result(
          await asToolResult(async () => {
            const sbx = this.own(input.sandbox_id);
            this.sandboxes.delete(sbx.id);
            await sbx.kill();
            return { killed: sbx.id };
          }),
        ),
    );
    const onSandbox =
      <I extends { sandbox_id?: string | undefined }>(
        f: (x: ReturnType<typeof toolExecutors>, input: I, signal: AbortSignal) => Promise<unknown>,
      ) =>
      async (input: I, extra: { signal: AbortSignal }): Promise<CallToolResult> =>
        result(
          await asToolResult(async () => {
            const sbx = await this.sandboxFor(input.sandbox_id);
            return f(toolExecutors(sbx, max), input, extra.signal);
          }),
        );
    s.registerTool(
      'exec',
      { description: TOOL_DESCRIPTIONS.exec, inputSchema: ExecMcpSchema },
      onSandbox((x, { sandbox_id: _, ...i }, signal) => x.exec(i, signal)),
    );
    s.registerTool(
      'run_code',
      { description: TOOL_DESCRIPTIONS.runCode, inputSchema: RunCodeMcpSchema },
      async ({ sandbox_id, ...i }, extra): Promise<CallToolResult> => {
        let raw: Execution | undefined;
        const out = await asToolResult(async () => {
          const sbx = await this.sandboxFor(sandbox_id);
          return toolExecutors(sbx, max, { onExecution: (x) => (raw = x) }).runCode(i, extra.signal);
        });
        // PNG figures as image content, SVG as text, bounded (images.ts).
        return withFigures(result(out), raw, max);
      },
    );
    s.registerTool(
      'read_file',
      { description: TOOL_DESCRIPTIONS.readFile, inputSchema: ReadFileMcpSchema },
      onSandbox((x, { sandbox_id: _, ...i }) => x.readFile(i)),
    );
    s.registerTool(
      'write_file',
      { description: TOOL_DESCRIPTIONS.writeFile, inputSchema: WriteFileMcpSchema },
      onSandbox((x, { sandbox_id: _, ...i }) => x.writeFile(i)),
    );
    s.registerTool(
      'list_files',
      { description: TOOL_DESCRIPTIONS.listFiles, inputSchema: ListFilesMcpSchema },
      onSandbox((x, { sandbox_id: _, ...i }) => x.listFiles(i)),
    );
  }

  private async create(input: z.infer<typeof SandboxCreateInputSchema>): Promise<{ sandbox_id: string }> {
    const sbx = await this.make(input);
    return { sandbox_id: sbx.id };
  }

  /** A new sandbox of this session, within its cap; killed at once if the session closed meanwhile. */
  private async make(input: z.infer<typeof SandboxCreateInputSchema>): Promise<PortableSandbox> {
    if (this.closed) throw new AirlockError('SANDBOX_GONE', 'this MCP session has ended');
    const live = [...this.sandboxes.values()].filter((x) => x.alive);
    if (live.length + this.pending >= this.max) {
      throw new AirlockError(
        'CAPACITY_EXHAUSTED',
        `this session already has ${this.max} sandboxes; kill one with sandbox_kill first`,
      );
    }
    const maxTtl = this.opts.maxTtlMs ?? 3_600_000;
    if (input.ttlMs !== undefined && input.ttlMs > maxTtl) {
      throw new AirlockError('INVALID_ARGUMENT', `ttlMs is at most ${maxTtl} on this server`, {
        field: 'ttlMs',
      });
    }
    if ((input.network === 'allowlist') !== (input.allow !== undefined && input.allow.length > 0)) {
      throw new AirlockError(
        'INVALID_ARGUMENT',
        'network "allowlist" needs a non-empty `allow` list of hosts, and `allow` needs network "allowlist"',
        { field: 'allow' },
      );
    }
    const spec: SandboxSpecInput = {
      backend: input.backend ?? this.opts.backend ?? 'namespaces',
      ttlMs: input.ttlMs ?? this.opts.ttlMs ?? 600_000,
      ...(input.template !== undefined ? { template: input.template } : {}),
      ...(input.image !== undefined ? { image: input.image } : {}),
      ...(input.network === 'allowlist' ? { network: { allow: input.allow! } } : {}),
      metadata: { creator: 'airlock-mcp-server' },
    };
    this.pending++;
    let sbx: PortableSandbox;
    try {
      sbx = await this.opts.runtime.create(spec);
    } finally {
      this.pending--;
    }
    if (this.closed) {
      await sbx.kill();
      throw new AirlockError('SANDBOX_GONE', 'this MCP session has ended');
    }
    this.sandboxes.set(sbx.id, sbx);
    return sbx;
  }

  /** One of this session's sandboxes (only its own: any other id is "not found"). */
  private own(id: string): PortableSandbox {
    const sbx = this.sandboxes.get(id);
    if (!sbx || !sbx.alive) {
      if (sbx) this.sandboxes.delete(id);
      throw new AirlockError(
        'SANDBOX_NOT_FOUND',
        `no sandbox "${id.slice(0, 128)}" in this session; sandbox_list names this session's sandboxes`,
        { field: 'sandbox_id' },
      );
    }
    return sbx;
  }

  /** The named sandbox, or the session's own one (made on first use, remade once if it died). */
  private async sandboxFor(id: string | undefined, retry = true): Promise<PortableSandbox> {
    if (id !== undefined) return this.own(id);
    // Set synchronously, so concurrent first calls share one create.
    const p = (this.defaultSandbox ??= this.make({}));
    let sbx: PortableSandbox;
    try {
      sbx = await p;
    } catch (e) {
      if (this.defaultSandbox === p) this.defaultSandbox = undefined;
      throw e;
    }
    if (sbx.alive && this.sandboxes.has(sbx.id)) return sbx;
    if (this.defaultSandbox === p) this.defaultSandbox = undefined; // killed or expired: a new one
    if (!retry) throw new AirlockError('SANDBOX_GONE', "this session's sandbox is gone; call again");
    return this.sandboxFor(undefined, false);
  }
}

/** A tool result for MCP: the JSON of `value`, marked as an error when it is Airlock's refusal. */
function result(value: unknown): CallToolResult {
  // A ToolError ({ error: { code, message } }). An Execution also has an `error` field: null, or the
  // code's own exception ({ name, value, traceback }), and the tool itself worked.
  const err = typeof value === 'object' && value !== null ? (value as { error?: unknown }).error : undefined;
  const isError = typeof err === 'object' && err !== null && 'code' in err;
  return { content: [{ type: 'text', text: JSON.stringify(value) }], ...(isError ? { isError: true } : {}) };
}
