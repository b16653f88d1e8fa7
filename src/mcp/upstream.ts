// One running instance of an untrusted stdio MCP server: a sandbox, the server process in it, and an
// MCP client (the official SDK) speaking to it over the process's pipes through the canonical
// parser. The server sees only read-only /usr, its own package files (read-only), its sandbox's
// private dirs, and the network its policy allows (none by default).
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import type { RequestOptions } from '@modelcontextprotocol/sdk/shared/protocol.js';
import {
  CallToolResultSchema,
  CompleteResultSchema,
  EmptyResultSchema,
  GetPromptResultSchema,
  ListPromptsResultSchema,
  ListResourcesResultSchema,
  ListResourceTemplatesResultSchema,
  ListToolsResultSchema,
  ReadResourceResultSchema,
  ResultSchema,
  type CallToolResult,
  type ClientCapabilities,
  type JSONRPCRequest,
  type Notification,
  type Prompt,
  type ResourceTemplate,
  type Result,
  type ServerCapabilities,
  type Tool,
} from '@modelcontextprotocol/sdk/types.js';
import type { Logger } from '../core/backend.js';
import { AirlockError } from '../core/errors.js';
import type { SandboxSpecInput } from '../core/spec.js';
import type { McpSandbox, McpSandboxProvider, McpServerProcess } from './sandbox-provider.js';
import { imageServerCommand, resolveServerCommand, type ResolvedCommand } from './command.js';
import type { ServerDefinitions } from './pin.js';
import { StreamTransport, type FrameErrorInfo } from './transport.js';

const DAY_MS = 24 * 3_600_000;
/** How long a server may take to start and answer initialize. */
const DEFAULT_START_TIMEOUT_MS = 60_000;
/** Largest message a server may send (one line on its stdout); larger ones are dropped and reported. */
const MAX_SERVER_FRAME_BYTES = 64 * 1024 * 1024;
/** Pages of a paginated list read before giving up (a server cannot make the gateway loop forever). */
const MAX_LIST_PAGES = 100;
/** Methods a server may send to the client (through the gateway). Everything else: method not found. */
/** Server notifications relayed to the client (progress is mapped per call instead). */
const FORWARDED_NOTIFICATIONS = new Set([
  'notifications/message',
  'notifications/resources/updated',
  'notifications/tools/list_changed',
  'notifications/prompts/list_changed',
  'notifications/resources/list_changed',
]);
export const SERVER_TO_CLIENT_METHODS = new Set([
  'sampling/createMessage',
  'elicitation/create',
  'roots/list',
]);

export interface ServerLaunch {
  /** The server's name (config key), used in logs, audit events and sandbox metadata. */
  readonly name: string;
  /** The command as the user wrote it, e.g. ['npx', '-y', '@modelcontextprotocol/server-memory']. */
  readonly command: readonly string[];
  /** Host directory the command is resolved against. */
  readonly cwd: string;
  /** Sandbox spec for the server (limits, network, secrets, workspace, env); mounts are added. */
  readonly sandbox: Omit<SandboxSpecInput, 'mounts'>;
  /** Host env the command resolution reads (HOME, npm_config_cache). */
  readonly hostEnv?: Readonly<Record<string, string | undefined>>;
  readonly startTimeoutMs?: number;
}

export interface UpstreamHooks {
  /** The server's sandbox exists (before the server starts): e.g. subscribe to its egress events. */
  onSandbox?(sandbox: McpSandbox): void;
  /** A line the server wrote to stderr (already split; no trailing newline). */
  onStderr?(line: string): void;
  /** A frame from the server that the canonical parser rejected (dropped). */
  onFrameError?(info: FrameErrorInfo): void;
  /** A request from the server to the client (sampling, elicitation, roots); `up`: the instance. */
  onServerRequest?(req: JSONRPCRequest, signal: AbortSignal, up: Upstream): Promise<Result>;
  /** A notification from the server (logging, progress handled elsewhere, list changes, updates). */
  onNotification?(n: Notification, up: Upstream): void;
  /** The server process exited (or the sandbox died). */
  onExit?(info: { exitCode: number | null; signal: string | null; killedBy?: string }): void;
}

export class Upstream {
  readonly client: Client;
  private exitedFlag = false;
  /** Our progress tokens on this server → where its progress goes (see callTool). */
  private readonly progress = new Map<
    string,
    (p: { progress: number; total?: number; message?: string }) => void
  >();
  private progressSeq = 0;
  /** When the sandbox's TTL was last restarted by a call (performance.now()). */
  private ttlResetAt = -Infinity;
  private onNotification: ((n: Notification) => void) | undefined;
  /** The signals of the requests in flight, every one aborted by frameLost. */
  private readonly inFlight = new Set<AbortController>();
  /**
   * Client sessions with a request in flight on this instance (session id → how many): the only
   * sessions a notification or server→client request of this instance can belong to (see asCaller).
   */
  private readonly callers = new Map<string, number>();

  private constructor(
    readonly launch: ServerLaunch,
    readonly sandbox: McpSandbox,
    readonly process: McpServerProcess,
    readonly resolved: ResolvedCommand,
    readonly transport: StreamTransport,
    client: Client,
  ) {
    this.client = client;
    void process.exited.then(() => (this.exitedFlag = true));
    // Progress is routed here, not by the SDK client: the client drops a progress notification that
    // arrives in the same read as the result it belongs to (its handler is gone by then).
    transport.intercept = (m) => {
      if (!('method' in m) || 'id' in m) return false;
      if (m.method !== 'notifications/progress') {
        // Logging, resource updates and list changes are handed on here, in arrival order, while the
        // call they belong to is still in flight (the SDK would deliver them a turn later).
        if (!FORWARDED_NOTIFICATIONS.has(m.method)) return false;
        this.onNotification?.(m as Notification);
        return true;
      }
      const p = (m.params ?? {}) as {
        progressToken?: unknown;
        progress?: unknown;
        total?: unknown;
        message?: unknown;
      };
      const cb = typeof p.progressToken === 'string' ? this.progress.get(p.progressToken) : undefined;
      if (cb && typeof p.progress === 'number') {
        cb({
          progress: p.progress,
          ...(typeof p.total === 'number' ? { total: p.total } : {}),
          ...(typeof p.message === 'string' ? { message: p.message } : {}),
        });
      }
      return true; // progress for no call of ours is dropped
    };
  }

  /** Resolve the command, create the sandbox, start the server in it and initialize MCP. */
  static async start(
    launch: ServerLaunch,
    airlock: McpSandboxProvider,
    hooks: UpstreamHooks = {},
    opts: { clientCapabilities?: ClientCapabilities; logger?: Logger } = {},
  ): Promise<Upstream> {
    // On an image the command runs with the image's programs; on the host root it is resolved to
    // the host files it needs (command.ts), bound read-only.
    const resolved =
      launch.sandbox.image !== undefined
        ? imageServerCommand(launch.command, launch.sandbox.image)
        : resolveServerCommand([...launch.command], {
            cwd: launch.cwd,
            env: { ...(launch.hostEnv ?? process.env) },
          });
    const sandbox = await airlock.create({
      ttlMs: DAY_MS,
      ...launch.sandbox,
      metadata: { ...(launch.sandbox.metadata ?? {}), mcpServer: launch.name },
      mounts: resolved.mounts,
    });
    let proc: McpServerProcess | undefined;
    let up: Upstream | undefined;
    try {
      hooks.onSandbox?.(sandbox);
      proc = await sandbox.spawn(
        resolved.argv,
        launch.sandbox.image !== undefined ? {} : { cwd: '/workspace' },
      );
      pipeLines(proc.stderr, (l) => hooks.onStderr?.(l));
      // Results may be large (the output guard cuts them for the client); bounded all the same.
      const transport = new StreamTransport(proc.stdout, proc.stdin, {
        maxFrameBytes: MAX_SERVER_FRAME_BYTES,
        maxStringBytes: MAX_SERVER_FRAME_BYTES,
      });
      transport.onframeerror = (info) => {
        hooks.onFrameError?.(info);
        up?.frameLost(info);
      };
      const client = new Client(
        { name: 'airlock-gateway', version: '0.1.0' },
        {
          capabilities: opts.clientCapabilities ?? {
            sampling: {},
            elicitation: {},
            roots: { listChanged: true },
          },
        },
      );
      client.fallbackRequestHandler = async (req, extra) => {
        if (!SERVER_TO_CLIENT_METHODS.has(req.method) || !hooks.onServerRequest) {
          throw new AirlockError('MCP_CALL_DENIED', `method ${req.method} is not forwarded to the client`);
        }
        return hooks.onServerRequest(req, extra.signal, up!);
      };
      up = new Upstream(launch, sandbox, proc, resolved, transport, client);
      const self = up;
      up.onNotification = (n) => hooks.onNotification?.(n, self);
      void proc.exited.then((e) => hooks.onExit?.(e));
      const timeoutMs = launch.startTimeoutMs ?? DEFAULT_START_TIMEOUT_MS;
      await Promise.race([
        client.connect(transport, { timeout: timeoutMs }),
        proc.exited.then((e) => {
          throw new AirlockError(
            'MCP_SERVER_FAILED',
            `MCP server ${launch.name} exited during startup (exit ${e.exitCode ?? e.signal}${e.killedBy ? `, ${e.killedBy}` : ''}); its stderr above says why`,
          );
        }),
      ]);
      return up;
    } catch (e) {
      await sandbox.kill().catch(() => {});
      if (AirlockError.isInstance(e)) throw e;
      throw new AirlockError(
        'MCP_SERVER_FAILED',
        `MCP server ${launch.name} failed to start: ${(e as Error).message}`,
        {
          cause: e,
        },
      );
    }
  }

  /**
   * A message from the server was dropped because it was too large or too deep to read: it may
   * have been the answer to a pending request, which would then wait for its timeout. Fail every
   * pending request now, saying why (well-formed junk lines do not count: they carry no answer).
   */
  frameLost(info: FrameErrorInfo): void {
    if (!['oversized', 'string_too_long', 'too_deep', 'too_many_keys'].includes(info.code)) return;
    // A readable id says what it was: a request (answered by the transport) or the answer to one
    // request (which the transport already failed): the other pending requests are not affected.
    if (info.id !== undefined || info.responseId !== undefined) return;
    const reason = new AirlockError(
      'MCP_SERVER_FAILED',
      `MCP server ${this.launch.name} sent a message Airlock cannot read (${info.reason}); pending requests failed`,
    );
    for (const c of [...this.inFlight]) c.abort(reason);
  }

  /**
   * Runs one request with a signal of its own, aborted by the caller's signal or by frameLost. The SDK
   * adds an 'abort' listener to the signal it is given and never removes it, so that signal must be the
   * request's own: a long-lived one would keep every request (and its result) in memory for as long as
   * the server runs. A set of controllers rather than a listener per request on one shared signal: 64
   * calls in flight would otherwise trip Node's MaxListenersExceededWarning (a false leak report).
   */
  private async withLost<T>(opts: RequestOptions, run: (o: RequestOptions) => Promise<T>): Promise<T> {
    const own = new AbortController();
    const caller = opts.signal;
    const onAbort = (): void => own.abort(caller!.reason);
    if (caller?.aborted) own.abort(caller.reason);
    else caller?.addEventListener('abort', onAbort, { once: true });
    this.inFlight.add(own);
    try {
      return await run({ ...opts, signal: own.signal });
    } finally {
      this.inFlight.delete(own);
      caller?.removeEventListener('abort', onAbort);
    }
  }

  /**
   * Run `run` as a request of client session `sessionId`: while it runs, messages this instance sends
   * may be routed to that session. stdio carries no link from a server's message to the request that
   * caused it, so the gateway routes only when exactly one session has requests in flight here.
   */
  async asCaller<T>(sessionId: string, run: () => Promise<T>): Promise<T> {
    this.callers.set(sessionId, (this.callers.get(sessionId) ?? 0) + 1);
    try {
      return await run();
    } finally {
      const n = (this.callers.get(sessionId) ?? 1) - 1;
      if (n > 0) this.callers.set(sessionId, n);
      else this.callers.delete(sessionId);
    }
  }

  /** The sessions with a request in flight on this instance. */
  callerSessions(): string[] {
    return [...this.callers.keys()];
  }

  get exited(): boolean {
    return this.exitedFlag || !this.sandbox.alive;
  }

  get capabilities(): ServerCapabilities {
    return this.client.getServerCapabilities() ?? {};
  }

  get instructions(): string | undefined {
    return this.client.getInstructions();
  }

  /**
   * Everything pinned and scanned: tools, prompts, resource templates (all pages), instructions.
   * `lenient`: take the lists as the server sent them, without the MCP SDK's schema check, so that
   * `airlock mcp scan` can report a definition the SDK would reject (the scanner checks each one).
   */
  async listDefinitions(
    opts: RequestOptions = {},
    how: { lenient?: boolean } = {},
  ): Promise<ServerDefinitions & { resources: unknown[] }> {
    const caps = this.capabilities;
    const lenient = how.lenient === true;
    const tools = caps.tools ? await this.paged<Tool>('tools/list', 'tools', opts, lenient) : [];
    const prompts = caps.prompts ? await this.paged<Prompt>('prompts/list', 'prompts', opts, lenient) : [];
    const resourceTemplates = caps.resources
      ? await this.paged<ResourceTemplate>('resources/templates/list', 'resourceTemplates', opts).catch(
          () => [],
        )
      : [];
    const resources = caps.resources
      ? await this.paged<unknown>('resources/list', 'resources', opts).catch(() => [])
      : [];
    const instructions = this.instructions;
    return {
      tools,
      prompts,
      resourceTemplates,
      resources,
      ...(instructions !== undefined ? { instructions } : {}),
    };
  }

  private async paged<T>(method: string, key: string, opts: RequestOptions, lenient = false): Promise<T[]> {
    const schema = lenient
      ? ResultSchema
      : {
          'tools/list': ListToolsResultSchema,
          'prompts/list': ListPromptsResultSchema,
          'resources/list': ListResourcesResultSchema,
          'resources/templates/list': ListResourceTemplatesResultSchema,
        }[method]!;
    const out: T[] = [];
    let cursor: string | undefined;
    for (let page = 0; page < MAX_LIST_PAGES; page++) {
      const r = (await this.withLost(opts, (o) =>
        this.client.request({ method, params: cursor ? { cursor } : {} } as never, schema, o),
      )) as Record<string, unknown>;
      const items = r[key];
      out.push(...((Array.isArray(items) ? items : []) as T[]));
      cursor = typeof r.nextCursor === 'string' ? r.nextCursor : undefined;
      if (!cursor) return out;
    }
    throw new AirlockError(
      'MCP_SERVER_FAILED',
      `MCP server ${this.launch.name} returned more than ${MAX_LIST_PAGES} pages for ${method}`,
    );
  }

  async callTool(
    name: string,
    args: Record<string, unknown> | undefined,
    opts: RequestOptions,
    onProgress?: (p: { progress: number; total?: number; message?: string }) => void,
  ): Promise<CallToolResult> {
    // An active server stays alive: its TTL restarts (at most once a minute, not on every call).
    const now = performance.now();
    if (now - this.ttlResetAt > 60_000) {
      this.ttlResetAt = now;
      this.sandbox.setTimeout(DAY_MS);
    }
    const token = onProgress ? `airlock-${++this.progressSeq}` : undefined;
    if (token) this.progress.set(token, onProgress!);
    try {
      return (await this.withLost(opts, (o) =>
        this.client.request(
          {
            method: 'tools/call',
            params: {
              name,
              ...(args !== undefined ? { arguments: args } : {}),
              ...(token ? { _meta: { progressToken: token } } : {}),
            },
          },
          CallToolResultSchema,
          o,
        ),
      )) as CallToolResult;
    } finally {
      if (token) this.progress.delete(token);
    }
  }

  /** Forward a request whose result needs no mediation beyond schema validation. */
  forward(
    method: string,
    params: Record<string, unknown> | undefined,
    opts: RequestOptions,
  ): Promise<Result> {
    const schema =
      {
        'prompts/get': GetPromptResultSchema,
        'resources/read': ReadResourceResultSchema,
        'completion/complete': CompleteResultSchema,
        'prompts/list': ListPromptsResultSchema,
        'resources/list': ListResourcesResultSchema,
        'resources/templates/list': ListResourceTemplatesResultSchema,
      }[method] ?? EmptyResultSchema;
    return this.withLost(opts, (o) =>
      this.client.request({ method, ...(params ? { params } : {}) } as never, schema, o),
    ) as Promise<Result>;
  }

  async close(): Promise<void> {
    await this.client.close().catch(() => {});
    await this.sandbox.kill();
  }
}

/** Split a byte stream into lines (bounded: a line longer than 8 KiB is cut) and hand each over. */
function pipeLines(stream: NodeJS.ReadableStream, onLine: (line: string) => void): void {
  let buf = '';
  stream.setEncoding('utf8');
  stream.on('data', (chunk: string) => {
    buf += chunk;
    let i: number;
    while ((i = buf.indexOf('\n')) >= 0) {
      onLine(buf.slice(0, i).replace(/\r$/, ''));
      buf = buf.slice(i + 1);
    }
    if (buf.length > 8192) {
      onLine(buf.slice(0, 8192) + ' …[line cut]');
      buf = '';
    }
  });
  stream.on('end', () => {
    if (buf) onLine(buf);
  });
}
