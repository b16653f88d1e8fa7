// SECURITY-CRITICAL: one client session of the MCP gateway. It is the MCP server the client talks
// to (the official SDK's Server), and the only path from that client to the sandboxed servers:
// listings are gated (scan + pins), every tools/call is checked (tool rules, argument rules, budgets)
// before it reaches a server and guarded (truncation, redaction, flagging, provenance) before the
// client sees its result. Methods not handled here do not reach any server (method not found).
import { Server } from '@modelcontextprotocol/sdk/server/index.js';
import type { RequestHandlerExtra } from '@modelcontextprotocol/sdk/shared/protocol.js';
import type { Transport } from '@modelcontextprotocol/sdk/shared/transport.js';
import {
  CallToolRequestSchema,
  CompleteRequestSchema,
  CreateMessageResultSchema,
  ElicitResultSchema,
  GetPromptRequestSchema,
  ListPromptsRequestSchema,
  ListResourcesRequestSchema,
  ListResourceTemplatesRequestSchema,
  ListRootsResultSchema,
  ListToolsRequestSchema,
  McpError,
  PromptSchema,
  ReadResourceRequestSchema,
  SetLevelRequestSchema,
  SubscribeRequestSchema,
  UnsubscribeRequestSchema,
  ToolSchema,
  type CallToolResult,
  type JSONRPCRequest,
  type Notification,
  type Prompt,
  type Result,
  type ServerNotification,
  type ServerRequest,
  type Implementation,
  type ServerCapabilities,
  type Tool,
} from '@modelcontextprotocol/sdk/types.js';
import { AirlockError } from '../core/errors.js';
import { decideCall, decideTool } from '../policy/mcp.js';
import { guardMessage } from '../guard/message.js';
import { guardToolResult, redactText, type GuardOptions, type GuardReport } from '../guard/output.js';
import { mcpEvent, type AuditEvent } from './audit.js';
import { SessionBudget } from './budget.js';
import { DefinitionGate, type GateResult } from './definitions.js';
import type { ServerEntry, ServerSetup } from './server-setup.js';
import type { Lease } from './pool.js';
import type { Upstream } from './upstream.js';

/** JSON-RPC error codes of Airlock's own refusals (data.airlock carries the stable string code). */
export const AIRLOCK_RPC_ERRORS = { denied: -32010, budget: -32011, serverFailed: -32012 } as const;

/**
 * What a session needs from the gateway that owns it (`GatewayCore` implements it). Declared here so
 * the session does not import the gateway that creates it (no import cycle).
 */
export interface SessionHost {
  readonly relistIntervalMs: number;
  readonly callTimeoutMs: number;
  readonly callHardCapMs: number;
  serverInfo(): Implementation;
  capabilities(): ServerCapabilities;
  instructions(): string | undefined;
  entries(): ServerEntry[];
  audit(e: AuditEvent): void;
  guardOptions(sandboxId: string, setup: ServerSetup, tool: string): GuardOptions;
  sessionClosed(s: McpSession): Promise<void>;
}

type Extra = RequestHandlerExtra<ServerRequest, ServerNotification>;

interface InFlight {
  readonly server: string;
  readonly extra: Extra;
  readonly up: Upstream;
  /** Guarded bytes and text of the notifications this request received (counted with its result). */
  notedBytes: number;
  notedText: string;
}

interface PerServer {
  readonly entry: ServerEntry;
  readonly gate: DefinitionGate;
  readonly budget: SessionBudget;
  last?: GateResult;
  /** The sandbox the latest listing came from (whose secrets a listing is redacted for). */
  listedBy?: string;
}

export class McpSession {
  readonly server: Server;
  private readonly perServer = new Map<string, PerServer>();
  /** Exposed tool name → server and the server's own tool name (from the latest listing). */
  private exposed = new Map<string, { server: string; tool: string }>();
  /** Exposed names two servers both claimed: refused until the collision is resolved. */
  private collisions = new Map<string, string>();
  /** Tools the tool rules deny: never listed, but a call by name gets the policy's reason. */
  private policyHidden = new Map<string, { server: string; tool: string }>();
  /** Exposed prompt name → server and prompt name. */
  private prompts = new Map<string, { server: string; prompt: string }>();
  /** Resource URI → server (from the latest resources/list). */
  private resources = new Map<string, string>();
  /** Resource URIs hidden by the gate (scanner finding or pin change) → why. */
  private hiddenResources = new Map<string, string>();
  /** `server\0uri` of the resources this session subscribed to (routing of resources/updated). */
  private readonly subscriptions = new Set<string>();
  /**
   * Requests of this session currently running on some server instance, newest last: where that
   * instance's notifications and server→client requests go (the stream of the request).
   */
  private readonly inflight: InFlight[] = [];
  private closed = false;
  private relistTimer: NodeJS.Timeout | undefined;

  constructor(
    private readonly core: SessionHost,
    readonly sessionId: string,
    readonly tenant: string,
  ) {
    this.server = new Server(core.serverInfo(), {
      capabilities: core.capabilities(),
      ...(core.instructions() !== undefined ? { instructions: core.instructions() } : {}),
    });
    for (const entry of core.entries()) {
      this.perServer.set(entry.setup.name, {
        entry,
        gate: new DefinitionGate(entry.setup.name, {
          ...(entry.setup.pinned ? { pinned: entry.setup.pinned } : {}),
          scan: entry.setup.scan,
          otherToolNames: () => this.otherToolNames(entry.setup.name),
        }),
        // The session holds every call to its reservation (output cut, call cancelled at its cap), so
        // the budget can reserve at admission: concurrent calls cannot overrun it.
        budget: new SessionBudget(entry.setup.budgets, {
          perCall: { maxOutputBytes: entry.setup.output.maxTextBytes, maxWallTimeMs: core.callHardCapMs },
        }),
      });
    }
    this.install();
    this.server.oninitialized = () => {
      // Re-list at session start (pins checked before the first call) and then on a timer,
      // whether or not the server advertises listChanged.
      void this.refreshTools().catch(() => {});
      if (core.relistIntervalMs > 0) {
        this.relistTimer = setInterval(() => void this.relistAndNotify(), core.relistIntervalMs);
        this.relistTimer.unref();
      }
    };
    this.server.onclose = () => void this.close();
    // Valid messages the SDK drops unanswered (JSON-RPC forbids an answer): a response to an id this
    // session never sent, a notification nothing handles. Logged, like a broken frame.
    this.server.onerror = (e) => this.dropped('protocol_error', e.message);
    this.server.fallbackNotificationHandler = async (n) =>
      this.dropped('unhandled_notification', `dropped notification ${n.method}: nothing handles it`);
  }

  private dropped(code: string, reason: string): void {
    this.core.audit(
      mcpEvent({
        sandboxId: '',
        server: '*',
        method: 'protocol',
        session: this.sessionId,
        tenant: this.tenant,
        decision: 'error',
        code,
        // Printable ASCII, clipped: the SDK's messages quote the peer's message.
        reason: reason.replace(/[^\x20-\x7e]/g, '?').slice(0, 300),
      }),
    );
  }

  connect(transport: Transport): Promise<void> {
    return this.server.connect(transport);
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    if (this.relistTimer) clearInterval(this.relistTimer);
    await this.core.sessionClosed(this);
    await this.server.close().catch(() => {});
  }

  private ctx(purpose: 'list' | 'call' | 'other') {
    const caps = this.server.getClientCapabilities();
    return {
      sessionId: this.sessionId,
      tenant: this.tenant,
      purpose,
      ...(caps ? { clientCapabilities: caps } : {}),
    };
  }

  private otherToolNames(except: string): string[] {
    const out: string[] = [];
    for (const [name, ps] of this.perServer)
      if (name !== except) for (const t of ps.last?.tools ?? []) out.push(t.name);
    return out;
  }

  private exposedName(entry: ServerEntry, name: string): string {
    return entry.setup.namespace === false ? name : `${entry.setup.namespace}__${name}`;
  }

  // ---- definitions ------------------------------------------------------------------------------

  /** List every server (through its gate) and rebuild the exposed tool map. */
  private async refreshTools(): Promise<Tool[]> {
    const listed: Array<{ entry: ServerEntry; tools: Tool[] }> = [];
    await Promise.all(
      [...this.perServer.values()].map(async (ps) => {
        const lease = await ps.entry.pool.acquire(this.ctx('list'));
        try {
          const started = performance.now();
          // Listed as served (no SDK schema check here): a definition the SDK would reject is scanned,
          // reported (invalid-definition) and quarantined by the gate, never a failed listing or a
          // validator dump; the rest of the server's tools stay usable.
          const defs = await lease.upstream.listDefinitions(
            { timeout: this.core.callTimeoutMs },
            { lenient: true },
          );
          const result = ps.gate.check(defs);
          ps.last = result;
          ps.listedBy = lease.upstream.sandbox.id;
          for (const f of result.findings) {
            this.core.audit(
              mcpEvent({
                sandboxId: lease.upstream.sandbox.id,
                server: ps.entry.setup.name,
                method: 'tools/list',
                session: this.sessionId,
                tenant: this.tenant,
                decision: f.decision,
                reason: f.message,
                code: f.ruleId,
                findings: [f],
                durationMs: performance.now() - started,
              }),
            );
          }
          // Belt and braces: only what an MCP client accepts is ever exposed (e.g. a tool with no name,
          // which no quarantine entry can name).
          listed.push({
            entry: ps.entry,
            tools: result.tools.filter((t) => ToolSchema.safeParse(t).success),
          });
        } finally {
          await lease.release();
        }
      }),
    );
    const exposed = new Map<string, { server: string; tool: string }>();
    const collisions = new Map<string, string>();
    const policyHidden = new Map<string, { server: string; tool: string }>();
    const tools: Tool[] = [];
    for (const { entry, tools: list } of listed.sort((a, b) =>
      a.entry.setup.name.localeCompare(b.entry.setup.name),
    )) {
      for (const t of list) {
        const name = this.exposedName(entry, t.name);
        // Least privilege: a tool the rules deny by name is not shown (nor can it take a name from
        // an allowed tool of another server); calling it anyway gets decideCall()'s reason.
        if (decideTool(entry.setup.rules, t.name).action === 'deny') {
          policyHidden.set(name, { server: entry.setup.name, tool: t.name });
          continue;
        }
        const prior = exposed.get(name);
        if (prior || collisions.has(name)) {
          // Never merge: both lose the name until the operator namespaces them apart.
          const servers = collisions.get(name) ?? prior!.server;
          collisions.set(name, `${servers}, ${entry.setup.name}`);
          exposed.delete(name);
          continue;
        }
        exposed.set(name, { server: entry.setup.name, tool: t.name });
        tools.push({ ...t, name });
      }
    }
    for (const [name, servers] of collisions) {
      this.core.audit(
        mcpEvent({
          sandboxId: '',
          server: servers,
          method: 'tools/list',
          tool: name,
          session: this.sessionId,
          tenant: this.tenant,
          decision: 'quarantine',
          code: 'name_collision',
          reason: `tool name ${name} is offered by several servers (${servers}); it is hidden until they are namespaced apart`,
        }),
      );
    }
    this.exposed = exposed;
    this.collisions = collisions;
    for (const name of [...exposed.keys(), ...collisions.keys()]) policyHidden.delete(name);
    this.policyHidden = policyHidden;
    return tools.filter((t) => exposed.has(t.name));
  }

  private async relistAndNotify(): Promise<void> {
    if (this.closed) return;
    const before = [...this.exposed.keys()].sort().join('\n');
    const beforeQ = [...this.perServer.values()]
      .map((p) => [...(p.last?.quarantined.keys() ?? [])].sort().join(','))
      .join(';');
    await this.refreshTools().catch(() => {});
    const after = [...this.exposed.keys()].sort().join('\n');
    const afterQ = [...this.perServer.values()]
      .map((p) => [...(p.last?.quarantined.keys() ?? [])].sort().join(','))
      .join(';');
    if (before !== after || beforeQ !== afterQ) await this.server.sendToolListChanged().catch(() => {});
  }

  // ---- handlers ---------------------------------------------------------------------------------

  private install(): void {
    const s = this.server;
    // The SDK refuses handlers for capabilities the server did not declare (single mode mirrors the
    // upstream's): install only what is declared; the rest is "method not found".
    const caps = this.core.capabilities();
    s.setRequestHandler(ListToolsRequestSchema, async () => ({
      tools: (await this.refreshTools()).map((t) => this.redactListing(this.exposed.get(t.name)?.server, t)),
    }));
    s.setRequestHandler(CallToolRequestSchema, (req, extra) =>
      this.callTool(req.params.name, req.params.arguments, extra),
    );

    if (caps.prompts) this.installPrompts();
    if (caps.resources) this.installResources();
    if (caps.completions) this.installCompletions();
    if (caps.logging) this.installLogging();
  }

  private installPrompts(): void {
    const s = this.server;
    s.setRequestHandler(ListPromptsRequestSchema, async () => ({ prompts: await this.listPrompts() }));
    s.setRequestHandler(GetPromptRequestSchema, async (req, extra) => {
      if (!this.prompts.has(req.params.name)) await this.listPrompts();
      const target = this.prompts.get(req.params.name);
      if (!target)
        throw new McpError(-32602, `unknown or quarantined prompt ${req.params.name}; list prompts first`);
      return this.forwardGuarded(target.server, 'prompts/get', { ...req.params, name: target.prompt }, extra);
    });
  }

  private installResources(): void {
    const s = this.server;
    // Listings come from the gate (scanned and pinned like tools), never straight from a server.
    s.setRequestHandler(ListResourcesRequestSchema, async () => ({ resources: await this.listResources() }));
    s.setRequestHandler(ListResourceTemplatesRequestSchema, async () => {
      await this.refreshTools();
      const resourceTemplates: unknown[] = [];
      for (const ps of this.perServer.values())
        for (const t of ps.last?.resourceTemplates ?? [])
          resourceTemplates.push(this.redactListing(ps.entry.setup.name, t));
      return { resourceTemplates } as Result;
    });
    s.setRequestHandler(ReadResourceRequestSchema, async (req, extra) => {
      const server = await this.resourceServer(req.params.uri);
      return this.forwardGuarded(server, 'resources/read', req.params, extra);
    });
    if (!this.core.capabilities().resources?.subscribe) return;
    s.setRequestHandler(SubscribeRequestSchema, async (req, extra) => {
      const server = await this.resourceServer(req.params.uri);
      await this.forward(server, 'resources/subscribe', req.params, extra);
      this.subscriptions.add(`${server}\0${req.params.uri}`);
      return {};
    });
    s.setRequestHandler(UnsubscribeRequestSchema, async (req, extra) => {
      const server = await this.resourceServer(req.params.uri);
      this.subscriptions.delete(`${server}\0${req.params.uri}`);
      await this.forward(server, 'resources/unsubscribe', req.params, extra);
      return {};
    });
  }

  /** Resources that passed the gate (a listing refreshes the gate first). */
  private async listResources(): Promise<unknown[]> {
    await this.refreshTools();
    const resources: Array<{ uri: string }> = [];
    const map = new Map<string, string>();
    const hidden = new Map<string, string>();
    for (const ps of this.perServer.values()) {
      for (const r of ps.last?.resources ?? []) {
        const prior = map.get(r.uri);
        if (prior !== undefined) {
          // Never route by listing order: a URI two servers both list is nobody's until renamed.
          hidden.set(
            r.uri,
            `resource ${r.uri} is offered by several servers (${prior}, ${ps.entry.setup.name}); ask the operator to keep one`,
          );
          continue;
        }
        map.set(r.uri, ps.entry.setup.name);
        resources.push({ ...this.redactListing(ps.entry.setup.name, r), uri: r.uri });
      }
      for (const [uri, why] of ps.last?.hiddenResources ?? []) hidden.set(uri, why);
    }
    for (const uri of hidden.keys()) map.delete(uri);
    this.resources = map;
    this.hiddenResources = hidden;
    return resources.filter((r) => !hidden.has(r.uri));
  }

  private installCompletions(): void {
    const s = this.server;
    s.setRequestHandler(CompleteRequestSchema, async (req, extra) => {
      const ref = req.params.ref as { type: string; name?: string; uri?: string };
      let server: string | undefined;
      let params: Record<string, unknown> = req.params;
      if (ref.type === 'ref/prompt' && ref.name !== undefined) {
        if (!this.prompts.has(ref.name)) await this.listPrompts();
        const t = this.prompts.get(ref.name);
        server = t?.server ?? this.single()?.setup.name;
        if (t) params = { ...req.params, ref: { ...ref, name: t.prompt } };
      } else if (ref.uri !== undefined) server = await this.resourceServer(ref.uri);
      if (!server) return { completion: { values: [], hasMore: false } };
      const ps = this.perServer.get(server)!;
      if (!(await this.hasCapability(ps, 'completions')))
        return { completion: { values: [], hasMore: false } };
      return this.forwardGuarded(server, 'completion/complete', params, extra);
    });
  }

  private installLogging(): void {
    const s = this.server;
    s.setRequestHandler(SetLevelRequestSchema, async (req, extra) => {
      for (const ps of this.perServer.values()) {
        if (await this.hasCapability(ps, 'logging'))
          await this.forward(ps.entry.setup.name, 'logging/setLevel', req.params, extra);
      }
      return {};
    });
  }

  /**
   * A listed definition as the client sees it: every string and key redacted (known values of the
   * server's sandbox, credential shapes), after the gate scanned and pinned the server's own text.
   */
  private redactListing<T>(server: string | undefined, item: T): T {
    const ps = server === undefined ? undefined : this.perServer.get(server);
    if (!ps) return item;
    const opts = {
      ...this.core.guardOptions(ps.listedBy ?? '', ps.entry.setup, 'list'),
      flagInstructions: false,
    };
    let redactions = 0;
    const walk = (v: unknown, depth: number): unknown => {
      const red = (t: string): string => {
        const r = redactText(t, opts);
        redactions += r.redactions.reduce((n, x) => n + x.count, 0);
        return r.text;
      };
      if (typeof v === 'string') return red(v);
      if (v === null || typeof v !== 'object' || depth > 64) return v;
      if (Array.isArray(v)) return v.map((x) => walk(x, depth + 1));
      return Object.fromEntries(Object.entries(v).map(([k, x]) => [red(k), walk(x, depth + 1)]));
    };
    const out = walk(item, 0) as T;
    if (redactions > 0)
      this.core.audit(
        mcpEvent({
          sandboxId: ps.listedBy ?? '',
          server: ps.entry.setup.name,
          method: 'list',
          session: this.sessionId,
          tenant: this.tenant,
          decision: 'allow',
          reason: 'listing passed with redactions',
          redactions,
        }),
      );
    return out;
  }

  private single(): ServerEntry | undefined {
    return this.perServer.size === 1 ? [...this.perServer.values()][0]!.entry : undefined;
  }

  /** Prompts that passed the gate (a listing refreshes the gate first). */
  private async listPrompts(): Promise<Prompt[]> {
    await this.refreshTools();
    const prompts: Prompt[] = [];
    const map = new Map<string, { server: string; prompt: string }>();
    for (const ps of this.perServer.values()) {
      for (const p of ps.last?.prompts ?? []) {
        if (!PromptSchema.safeParse(p).success) continue; // a prompt MCP clients would reject
        const name = this.exposedName(ps.entry, p.name);
        map.set(name, { server: ps.entry.setup.name, prompt: p.name });
        prompts.push({ ...this.redactListing(ps.entry.setup.name, p), name });
      }
    }
    this.prompts = map;
    return prompts;
  }

  private async hasCapability(
    ps: PerServer,
    cap: 'resources' | 'prompts' | 'completions' | 'logging',
  ): Promise<boolean> {
    // The lister's (per-call) or the session's own instance: capabilities are the same on every one.
    const lease = await ps.entry.pool.acquire(this.ctx('list'));
    try {
      return lease.upstream.capabilities[cap] !== undefined;
    } finally {
      await lease.release();
    }
  }

  private async resourceServer(uri: string): Promise<string> {
    if (!this.resources.has(uri) && !this.hiddenResources.has(uri)) await this.listResources();
    const hidden = this.hiddenResources.get(uri);
    if (hidden !== undefined) {
      this.core.audit(
        mcpEvent({
          sandboxId: '',
          server: '*',
          method: 'resources/read',
          tool: uri.slice(0, 300),
          session: this.sessionId,
          tenant: this.tenant,
          decision: 'deny',
          code: 'quarantined',
          reason: hidden,
        }),
      );
      throw this.deny('quarantined', `blocked by Airlock: ${hidden}`);
    }
    const known = this.resources.get(uri);
    if (known) return known;
    const single = this.single();
    if (single) return single.setup.name;
    // Templated URIs: the server whose namespace prefixes the scheme-less path, else refuse.
    throw new McpError(-32602, `unknown resource ${uri}; list resources first`);
  }

  // ---- calls ------------------------------------------------------------------------------------

  private deny(code: string, reason: string, rpc: number = AIRLOCK_RPC_ERRORS.denied): McpError {
    return new McpError(rpc, reason, { airlock: { code } });
  }

  private async callTool(
    name: string,
    args: Record<string, unknown> | undefined,
    extra: Extra,
  ): Promise<CallToolResult> {
    const audit = (fields: Parameters<typeof mcpEvent>[0]): void =>
      this.core.audit(mcpEvent({ session: this.sessionId, tenant: this.tenant, ...fields }));
    if (!this.exposed.has(name) && !this.collisions.has(name) && !this.policyHidden.has(name)) {
      try {
        await this.refreshTools();
      } catch (e) {
        // The tools could not be listed (an instance could not start, e.g. refused by a quota).
        audit({
          sandboxId: '',
          server: '',
          method: 'tools/call',
          tool: name,
          decision: 'error',
          code: 'server_unavailable',
          reason: (e as Error).message,
        });
        throw e;
      }
    }
    const collision = this.collisions.get(name);
    if (collision) {
      const reason = `blocked by Airlock MCP policy: tool name ${name} is offered by several servers (${collision}); ask the operator to namespace them`;
      audit({
        sandboxId: '',
        server: collision,
        method: 'tools/call',
        tool: name,
        decision: 'deny',
        code: 'name_collision',
        reason,
      });
      throw this.deny('name_collision', reason);
    }
    const target = this.exposed.get(name) ?? this.policyHidden.get(name);
    if (!target) {
      const quarantinedIn = [...this.perServer.values()].find((p) =>
        [...(p.last?.quarantined.keys() ?? [])].some((t) => this.exposedName(p.entry, t) === name),
      );
      if (quarantinedIn) {
        const tool = [...quarantinedIn.last!.quarantined.keys()].find(
          (t) => this.exposedName(quarantinedIn.entry, t) === name,
        )!;
        const reason = `blocked by Airlock: ${quarantinedIn.last!.quarantined.get(tool)}`;
        audit({
          sandboxId: '',
          server: quarantinedIn.entry.setup.name,
          method: 'tools/call',
          tool,
          decision: 'deny',
          code: 'quarantined',
          reason,
        });
        throw this.deny('quarantined', reason);
      }
      const reason = `unknown tool ${name}; call tools/list to see the available tools`;
      audit({
        sandboxId: '',
        server: '',
        method: 'tools/call',
        tool: name,
        decision: 'deny',
        code: 'unknown_tool',
        reason,
      });
      throw new McpError(-32602, reason);
    }
    const ps = this.perServer.get(target.server)!;
    const setup = ps.entry.setup;
    /** Audit a refusal of this call and return the error that carries it to the client. */
    const refuse = (code: string, reason: string, rpc?: number): McpError => {
      audit({
        sandboxId: '',
        server: setup.name,
        method: 'tools/call',
        tool: target.tool,
        decision: 'deny',
        code,
        reason,
      });
      return this.deny(code, reason, rpc);
    };
    const verdict = decideCall(setup.rules, target.tool, args ?? {});
    if (verdict.action === 'deny') throw refuse(verdict.code, verdict.reason);
    const budget = ps.budget.beforeCall();
    if (budget.action === 'deny') throw refuse(budget.code, budget.reason, AIRLOCK_RPC_ERRORS.budget);
    const reservation = budget.reservation;

    const started = performance.now();
    // The call's hard wall-time cap: its wall-time reservation (never more than budgets.maxCallMs or
    // the gateway's cap). A timer of its own, so progress (which may reset the per-request timeout)
    // cannot extend it; at the cap the call is cancelled on the server.
    const capMs =
      reservation?.wallTimeMs ?? Math.min(this.core.callHardCapMs, setup.budgets.maxCallMs ?? Infinity);
    const capWhy =
      setup.budgets.maxCallMs !== undefined && capMs >= setup.budgets.maxCallMs
        ? `budgets.maxCallMs ${setup.budgets.maxCallMs} ms`
        : capMs < this.core.callHardCapMs
          ? `the ${capMs} ms left of maxWallTimeMs ${setup.budgets.maxWallTimeMs ?? ''} for this session`
          : `the gateway's per-call cap of ${this.core.callHardCapMs} ms`;
    const deadline = new AbortController();
    let capped = false;
    const capTimer = setTimeout(() => {
      capped = true;
      deadline.abort(new AirlockError('MCP_BUDGET_EXHAUSTED', `call cancelled at its wall-time cap`));
    }, capMs);
    const onClientAbort = (): void => deadline.abort(extra.signal.reason);
    if (extra.signal.aborted) onClientAbort();
    else extra.signal.addEventListener('abort', onClientAbort, { once: true });
    let lease: Lease | undefined;
    let entry: InFlight | undefined;
    let settled = false;
    try {
      try {
        lease = await ps.entry.pool.acquire(this.ctx('call'));
      } catch (e) {
        // No instance to call (it could not start, or a quota refused its sandbox): audited too.
        audit({
          sandboxId: '',
          server: setup.name,
          method: 'tools/call',
          tool: target.tool,
          decision: 'error',
          code: 'server_unavailable',
          reason: (e as Error).message,
        });
        throw e;
      }
      const up = lease.upstream;
      const own = (entry = this.enter(setup.name, extra, up));
      const token = extra._meta?.progressToken;
      const bytesUp = JSON.stringify(args ?? {}).length;
      let raw: CallToolResult;
      try {
        raw = await up.asCaller(this.sessionId, () =>
          up.callTool(
            target.tool,
            args,
            { signal: deadline.signal, timeout: this.core.callTimeoutMs, resetTimeoutOnProgress: true },
            token === undefined
              ? undefined
              : (p) => {
                  // Progress passes the guard like every message (its `message` is server text).
                  const note = this.guardNote(ps, up, own, 'notifications/progress', p);
                  void extra
                    .sendNotification({
                      method: 'notifications/progress',
                      params: { ...(note as typeof p), progressToken: token },
                    })
                    .catch(() => {});
                },
          ),
        );
      } catch (e) {
        const durationMs = performance.now() - started;
        ps.budget.afterCall({ text: own.notedText, bytes: own.notedBytes, durationMs }, reservation);
        settled = true;
        if (capped) {
          const reason = `Airlock stopped ${target.tool} of server ${setup.name} at its wall-time cap (${capWhy}); progress does not extend it. Ask for less work per call or ask the operator to raise the cap`;
          audit({
            sandboxId: up.sandbox.id,
            server: setup.name,
            method: 'tools/call',
            tool: target.tool,
            decision: 'error',
            code: 'call_time_cap',
            reason,
            bytesUp,
            durationMs,
          });
          throw this.deny('call_time_cap', reason, AIRLOCK_RPC_ERRORS.budget);
        }
        if (e instanceof McpError && e.code !== -32000 && e.code !== -32001) {
          // The server answered with a JSON-RPC error: pass its code on, with the message guarded.
          const msg = redactText(e.message, this.core.guardOptions(up.sandbox.id, setup, target.tool)).text;
          audit({
            sandboxId: up.sandbox.id,
            server: setup.name,
            method: 'tools/call',
            tool: target.tool,
            decision: 'error',
            code: 'server_error',
            reason: msg,
            bytesUp,
            durationMs,
          });
          throw new McpError(e.code, msg);
        }
        const reason = `MCP server ${setup.name} failed during ${target.tool}: ${(e as Error).message}`;
        audit({
          sandboxId: up.sandbox.id,
          server: setup.name,
          method: 'tools/call',
          tool: target.tool,
          decision: 'error',
          code: 'server_failed',
          reason,
          bytesUp,
          durationMs,
        });
        throw this.deny('server_failed', reason, AIRLOCK_RPC_ERRORS.serverFailed);
      }
      // The output is cut to the call's output reservation (tokens are never more than bytes).
      const guardOpts = this.core.guardOptions(up.sandbox.id, setup, target.tool);
      const maxTextBytes = Math.min(
        guardOpts.maxTextBytes ?? Infinity,
        reservation?.outputBytes ?? Infinity,
        reservation?.outputTokens ?? Infinity,
      );
      const guarded = guardToolResult(
        raw,
        maxTextBytes === Infinity ? guardOpts : { ...guardOpts, maxTextBytes },
      );
      const text = textOf(guarded.result);
      const bytesDown = guarded.report.originalTextBytes;
      const durationMs = performance.now() - started;
      ps.budget.afterCall(
        { text: text + own.notedText, bytes: bytesDown + own.notedBytes, durationMs },
        reservation,
      );
      settled = true;
      const redactions = guarded.report.redactions.reduce((n, r) => n + r.count, 0);
      audit({
        sandboxId: up.sandbox.id,
        server: setup.name,
        method: 'tools/call',
        tool: target.tool,
        decision: 'allow',
        reason: guarded.report.findings.length
          ? `allowed with ${guarded.report.findings.length} output finding(s)`
          : 'allowed',
        bytesUp,
        bytesDown,
        durationMs,
        truncated: guarded.report.truncated,
        redactions,
        ...(guarded.report.findings.length ? { findings: guarded.report.findings } : {}),
        ...(guarded.report.spillRef ? { spillRef: guarded.report.spillRef } : {}),
      });
      return guarded.result;
    } finally {
      // A call that never reached the server (no instance) still gives its reservation back.
      if (!settled)
        ps.budget.afterCall({ text: '', bytes: 0, durationMs: performance.now() - started }, reservation);
      clearTimeout(capTimer);
      extra.signal.removeEventListener('abort', onClientAbort);
      if (entry) this.leave(entry);
      await lease?.release();
    }
  }

  private enter(server: string, extra: Extra, up: Upstream): InFlight {
    const e: InFlight = { server, extra, up, notedBytes: 0, notedText: '' };
    this.inflight.push(e);
    return e;
  }

  private leave(e: InFlight): void {
    const i = this.inflight.indexOf(e);
    if (i >= 0) this.inflight.splice(i, 1);
  }

  /** Forward a request whose answer carries no server text (setLevel, subscriptions). */
  private async forward(
    server: string,
    method: string,
    params: Record<string, unknown> | undefined,
    extra: Extra,
  ): Promise<Result> {
    const ps = this.perServer.get(server);
    if (!ps) throw new McpError(-32602, `unknown server ${server}`);
    const lease = await ps.entry.pool.acquire(this.ctx('other'));
    const up = lease.upstream;
    const entry = this.enter(server, extra, up);
    try {
      return await up.asCaller(this.sessionId, () =>
        up.forward(method, params, { signal: extra.signal, timeout: this.core.callTimeoutMs }),
      );
    } finally {
      this.leave(entry);
      await lease.release();
    }
  }

  /**
   * resources/read, prompts/get, completion/complete: treated like a tools/call. The session budget
   * admits it, it runs on the instance the boundary gives (per-call: a fresh one), and its result
   * passes the output guard (redaction, blobs, truncation, flags, provenance) and is audited.
   */
  private async forwardGuarded(
    server: string,
    method: string,
    params: Record<string, unknown>,
    extra: Extra,
  ): Promise<Result> {
    const ps = this.perServer.get(server);
    if (!ps) throw new McpError(-32602, `unknown server ${server}`);
    const setup = ps.entry.setup;
    const ref = params.ref as { name?: unknown; uri?: unknown } | undefined;
    const what = [params.uri, params.name, ref?.name, ref?.uri].find((x) => typeof x === 'string');
    const audit = (fields: Omit<Parameters<typeof mcpEvent>[0], 'server' | 'method'>): void =>
      this.core.audit(
        mcpEvent({
          session: this.sessionId,
          tenant: this.tenant,
          server: setup.name,
          method,
          ...(typeof what === 'string' ? { tool: what.slice(0, 300) } : {}),
          ...fields,
        }),
      );
    const budget = ps.budget.beforeCall();
    if (budget.action === 'deny') {
      audit({ sandboxId: '', decision: 'deny', code: budget.code, reason: budget.reason });
      throw this.deny(budget.code, budget.reason, AIRLOCK_RPC_ERRORS.budget);
    }
    const reservation = budget.reservation;
    const started = performance.now();
    let settled = false;
    const settle = (text: string, bytes: number): number => {
      const durationMs = performance.now() - started;
      if (!settled) ps.budget.afterCall({ text, bytes, durationMs }, reservation);
      settled = true;
      return durationMs;
    };
    let lease: Lease | undefined;
    let entry: InFlight | undefined;
    try {
      lease = await ps.entry.pool.acquire(this.ctx('other'));
      const up = lease.upstream;
      const own = (entry = this.enter(server, extra, up));
      // As for tools/call: the answer is cut to the output reservation, and the request is
      // cancelled at its wall-time reservation (or the gateway's per-call cap).
      const guardOpts = this.core.guardOptions(up.sandbox.id, setup, method);
      const maxTextBytes = Math.min(
        guardOpts.maxTextBytes ?? Infinity,
        reservation?.outputBytes ?? Infinity,
        reservation?.outputTokens ?? Infinity,
      );
      const opts = maxTextBytes === Infinity ? guardOpts : { ...guardOpts, maxTextBytes };
      const capMs = reservation?.wallTimeMs ?? this.core.callHardCapMs;
      let raw: Result;
      try {
        raw = await up.asCaller(this.sessionId, () =>
          up.forward(method, params, {
            signal: AbortSignal.any([extra.signal, AbortSignal.timeout(capMs)]),
            timeout: this.core.callTimeoutMs,
          }),
        );
      } catch (e) {
        const durationMs = settle(own.notedText, own.notedBytes);
        const msg = redactText((e as Error).message, opts).text;
        audit({ sandboxId: up.sandbox.id, decision: 'error', code: 'server_error', reason: msg, durationMs });
        if (e instanceof McpError && e.code !== -32000 && e.code !== -32001) throw new McpError(e.code, msg);
        throw this.deny(
          'server_failed',
          `MCP server ${setup.name} failed during ${method}: ${msg}`,
          AIRLOCK_RPC_ERRORS.serverFailed,
        );
      }
      const g = guardMessage(raw, { ...opts, provenanceMeta: true }, 'result');
      const durationMs = settle(
        capped(JSON.stringify(g.value) + own.notedText),
        g.report.originalTextBytes + own.notedBytes,
      );
      audit({
        sandboxId: up.sandbox.id,
        decision: 'allow',
        reason: g.report.findings.length
          ? `allowed with ${g.report.findings.length} output finding(s)`
          : 'allowed',
        bytesDown: g.report.originalTextBytes,
        durationMs,
        ...reportFields(g.report),
      });
      return g.value as Result;
    } finally {
      settle('', 0);
      if (entry) this.leave(entry);
      await lease?.release();
    }
  }

  /**
   * Guard the params of a notification or server→client request of instance `up`, audit it, and count
   * it with the request it arrived during (`entry`), as part of that request's output.
   */
  private guardNote(
    ps: PerServer,
    up: Upstream,
    entry: InFlight | undefined,
    method: string,
    params: unknown,
  ): unknown {
    const g = guardMessage(
      params ?? {},
      this.core.guardOptions(up.sandbox.id, ps.entry.setup, method),
      'params',
    );
    if (entry) {
      entry.notedBytes += g.report.originalTextBytes;
      entry.notedText = capped(entry.notedText + JSON.stringify(g.value));
    }
    this.core.audit(
      mcpEvent({
        sandboxId: up.sandbox.id,
        server: ps.entry.setup.name,
        method,
        session: this.sessionId,
        tenant: this.tenant,
        decision: 'allow',
        reason: g.report.findings.length
          ? `passed with ${g.report.findings.length} output finding(s)`
          : 'passed',
        bytesDown: g.report.originalTextBytes,
        ...reportFields(g.report),
      }),
    );
    return g.value;
  }

  /** Whether this session subscribed to `uri` of `server` (resources/updated goes only to subscribers). */
  isSubscribed(server: string, uri: string): boolean {
    return this.subscriptions.has(`${server}\0${uri}`);
  }

  // ---- from the servers -------------------------------------------------------------------------

  /**
   * A server asks the client something (sampling, elicitation, roots): guarded, then sent on the stream
   * of this session's request in flight on that instance (the gateway routed it here).
   */
  async fromServerRequest(
    server: string,
    req: JSONRPCRequest,
    signal: AbortSignal,
    up: Upstream,
  ): Promise<Result> {
    const ps = this.perServer.get(server);
    if (!ps || this.closed) throw new McpError(-32603, `no client session for ${req.method}`);
    const entry = [...this.inflight].reverse().find((i) => i.up === up);
    const schema =
      req.method === 'sampling/createMessage'
        ? CreateMessageResultSchema
        : req.method === 'elicitation/create'
          ? ElicitResultSchema
          : ListRootsResultSchema;
    const params =
      req.params === undefined ? undefined : this.guardNote(ps, up, entry, req.method, req.params);
    const request = { method: req.method, ...(params ? { params } : {}) } as ServerRequest;
    if (entry) return entry.extra.sendRequest(request, schema, { signal });
    return this.server.request(request, schema, { signal });
  }

  /** A server notification (logging, list changes, resource updates), routed here by the gateway. */
  async fromServerNotification(server: string, n: Notification, up: Upstream): Promise<void> {
    if (this.closed) return;
    const ps = this.perServer.get(server);
    if (!ps) return;
    if (n.method.endsWith('/list_changed')) {
      // Carries nothing but the method: the client lists again, through the gate.
      if (n.method === 'notifications/tools/list_changed') await this.relistAndNotify();
      else await this.server.notification({ method: n.method } as ServerNotification).catch(() => {});
      return;
    }
    if (n.method === 'notifications/message' || n.method === 'notifications/resources/updated') {
      const entry = [...this.inflight].reverse().find((i) => i.up === up);
      const params = this.guardNote(ps, up, entry, n.method, n.params);
      const note = { method: n.method, params } as ServerNotification;
      if (entry) await entry.extra.sendNotification(note).catch(() => {});
      else await this.server.notification(note).catch(() => {});
    }
  }
}

/** Text counted for a budget's tokens, bounded (bytes are counted in full separately). */
const MAX_COUNTED_CHARS = 1 << 20;
const capped = (s: string): string => (s.length > MAX_COUNTED_CHARS ? s.slice(0, MAX_COUNTED_CHARS) : s);

/** The audit fields of a guard report. */
function reportFields(r: GuardReport): {
  truncated: boolean;
  redactions: number;
  findings?: GuardReport['findings'];
  spillRef?: string;
} {
  return {
    truncated: r.truncated,
    redactions: r.redactions.reduce((n, x) => n + x.count, 0),
    ...(r.findings.length ? { findings: r.findings } : {}),
    ...(r.spillRef ? { spillRef: r.spillRef } : {}),
  };
}

function textOf(r: CallToolResult): string {
  const parts: string[] = [];
  for (const c of r.content ?? []) {
    if (c.type === 'text') parts.push(c.text);
    else if (c.type === 'resource' && 'text' in c.resource) parts.push(String(c.resource.text));
  }
  if (r.structuredContent !== undefined) parts.push(JSON.stringify(r.structuredContent));
  return parts.join('\n');
}
