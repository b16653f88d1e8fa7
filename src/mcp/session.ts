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
  ReadResourceRequestSchema,
  SetLevelRequestSchema,
  SubscribeRequestSchema,
  UnsubscribeRequestSchema,
  type CallToolResult,
  type JSONRPCRequest,
  type Notification,
  type Prompt,
  type Result,
  type ServerNotification,
  type ServerRequest,
  type Tool,
} from '@modelcontextprotocol/sdk/types.js';
import { AirlockError } from '../core/errors.js';
import { decideCall, decideTool } from '../policy/mcp.js';
import { guardToolResult, redactText } from '../guard/output.js';
import { mcpEvent } from './audit.js';
import { SessionBudget } from './budget.js';
import { DefinitionGate, type GateResult } from './definitions.js';
import type { GatewayCore, ServerEntry } from './gateway.js';
import type { Lease } from './pool.js';

/** JSON-RPC error codes of Airlock's own refusals (data.airlock carries the stable string code). */
export const AIRLOCK_RPC_ERRORS = { denied: -32010, budget: -32011, serverFailed: -32012 } as const;

type Extra = RequestHandlerExtra<ServerRequest, ServerNotification>;

interface PerServer {
  readonly entry: ServerEntry;
  readonly gate: DefinitionGate;
  readonly budget: SessionBudget;
  last?: GateResult;
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
  /** Requests of this session currently running on some server, newest last (routing of server→client requests). */
  private readonly inflight: Array<{ server: string; extra: Extra }> = [];
  private closed = false;
  private relistTimer: NodeJS.Timeout | undefined;

  constructor(
    private readonly core: GatewayCore,
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
          const defs = await lease.upstream.listDefinitions({ timeout: this.core.callTimeoutMs });
          const result = ps.gate.check(defs);
          ps.last = result;
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
          listed.push({ entry: ps.entry, tools: result.tools });
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
    s.setRequestHandler(ListToolsRequestSchema, async () => ({ tools: await this.refreshTools() }));
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
    s.setRequestHandler(ListResourcesRequestSchema, async (req, extra) => {
      const resources: unknown[] = [];
      const map = new Map<string, string>();
      for (const ps of this.perServer.values()) {
        if (!(await this.hasCapability(ps, 'resources'))) continue;
        const r = (await this.forward(ps.entry.setup.name, 'resources/list', req.params, extra)) as {
          resources?: Array<{ uri: string }>;
          nextCursor?: string;
        };
        for (const res of r.resources ?? []) {
          map.set(res.uri, ps.entry.setup.name);
          resources.push(res);
        }
        if (this.perServer.size === 1 && r.nextCursor)
          return { resources, nextCursor: r.nextCursor } as Result;
      }
      this.resources = map;
      return { resources } as Result;
    });
    s.setRequestHandler(ListResourceTemplatesRequestSchema, async (req, extra) => {
      const resourceTemplates: unknown[] = [];
      for (const ps of this.perServer.values()) {
        if (!(await this.hasCapability(ps, 'resources'))) continue;
        const r = (await this.forward(
          ps.entry.setup.name,
          'resources/templates/list',
          req.params,
          extra,
        )) as { resourceTemplates?: unknown[] };
        resourceTemplates.push(...(r.resourceTemplates ?? []));
      }
      return { resourceTemplates } as Result;
    });
    s.setRequestHandler(ReadResourceRequestSchema, async (req, extra) => {
      const server = this.resourceServer(req.params.uri);
      return this.forwardGuarded(server, 'resources/read', req.params, extra);
    });
    if (!this.core.capabilities().resources?.subscribe) return;
    s.setRequestHandler(SubscribeRequestSchema, async (req, extra) => {
      await this.forward(this.resourceServer(req.params.uri), 'resources/subscribe', req.params, extra);
      return {};
    });
    s.setRequestHandler(UnsubscribeRequestSchema, async (req, extra) => {
      await this.forward(this.resourceServer(req.params.uri), 'resources/unsubscribe', req.params, extra);
      return {};
    });
  }

  private installCompletions(): void {
    const s = this.server;
    s.setRequestHandler(CompleteRequestSchema, async (req, extra) => {
      const ref = req.params.ref as { type: string; name?: string; uri?: string };
      let server: string | undefined;
      let params: Record<string, unknown> = req.params;
      if (ref.type === 'ref/prompt' && ref.name !== undefined) {
        const t = this.prompts.get(ref.name);
        server = t?.server ?? this.single()?.setup.name;
        if (t) params = { ...req.params, ref: { ...ref, name: t.prompt } };
      } else if (ref.uri !== undefined) server = this.resourceServer(ref.uri);
      if (!server) return { completion: { values: [], hasMore: false } };
      const ps = this.perServer.get(server)!;
      if (!(await this.hasCapability(ps, 'completions')))
        return { completion: { values: [], hasMore: false } };
      return this.forward(server, 'completion/complete', params, extra);
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
        const name = this.exposedName(ps.entry, p.name);
        map.set(name, { server: ps.entry.setup.name, prompt: p.name });
        prompts.push({ ...p, name });
      }
    }
    this.prompts = map;
    return prompts;
  }

  private async hasCapability(
    ps: PerServer,
    cap: 'resources' | 'prompts' | 'completions' | 'logging',
  ): Promise<boolean> {
    const lease = await ps.entry.pool.acquire(this.ctx('other'));
    try {
      return lease.upstream.capabilities[cap] !== undefined;
    } finally {
      await lease.release();
    }
  }

  private resourceServer(uri: string): string {
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
    if (!this.exposed.has(name) && !this.collisions.has(name) && !this.policyHidden.has(name))
      await this.refreshTools();
    const audit = (fields: Parameters<typeof mcpEvent>[0]): void =>
      this.core.audit(mcpEvent({ session: this.sessionId, tenant: this.tenant, ...fields }));
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
      throw new McpError(-32602, `unknown tool ${name}; call tools/list to see the available tools`);
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
    let settled = false;
    const entry = { server: setup.name, extra };
    this.inflight.push(entry);
    try {
      lease = await ps.entry.pool.acquire(this.ctx('call'));
      const up = lease.upstream;
      const token = extra._meta?.progressToken;
      const bytesUp = JSON.stringify(args ?? {}).length;
      let raw: CallToolResult;
      try {
        raw = await up.callTool(
          target.tool,
          args,
          { signal: deadline.signal, timeout: this.core.callTimeoutMs, resetTimeoutOnProgress: true },
          token === undefined
            ? undefined
            : (p) =>
                void extra
                  .sendNotification({
                    method: 'notifications/progress',
                    params: { ...p, progressToken: token },
                  })
                  .catch(() => {}),
        );
      } catch (e) {
        const durationMs = performance.now() - started;
        ps.budget.afterCall({ text: '', bytes: 0, durationMs }, reservation);
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
      ps.budget.afterCall({ text, bytes: bytesDown, durationMs }, reservation);
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
      this.inflight.splice(this.inflight.indexOf(entry), 1);
      await lease?.release();
    }
  }

  private async forward(
    server: string,
    method: string,
    params: Record<string, unknown> | undefined,
    extra: Extra,
  ): Promise<Result> {
    const ps = this.perServer.get(server);
    if (!ps) throw new McpError(-32602, `unknown server ${server}`);
    const lease = await ps.entry.pool.acquire(this.ctx('other'));
    const entry = { server, extra };
    this.inflight.push(entry);
    try {
      return await lease.upstream.forward(method, params, {
        signal: extra.signal,
        timeout: this.core.callTimeoutMs,
      });
    } finally {
      this.inflight.splice(this.inflight.indexOf(entry), 1);
      await lease.release();
    }
  }

  /** Forward, then redact every string of the result (prompt texts, resource contents). */
  private async forwardGuarded(
    server: string,
    method: string,
    params: Record<string, unknown>,
    extra: Extra,
  ): Promise<Result> {
    const ps = this.perServer.get(server)!;
    const lease = await ps.entry.pool.acquire(this.ctx('other'));
    try {
      const r = await this.forward(server, method, params, extra);
      const opts = this.core.guardOptions(lease.upstream.sandbox.id, ps.entry.setup, method);
      return redactStrings(r, (t) => redactText(t, opts).text) as Result;
    } finally {
      await lease.release();
    }
  }

  /** True while a request of this session runs on `server`. */
  hasInflight(server: string): boolean {
    return this.inflight.some((i) => i.server === server);
  }

  // ---- from the servers -------------------------------------------------------------------------

  /** A server asks the client something (sampling, elicitation, roots): on the stream of the call that caused it. */
  async fromServerRequest(server: string, req: JSONRPCRequest, signal: AbortSignal): Promise<Result> {
    const via = [...this.inflight].reverse().find((i) => i.server === server)?.extra;
    const schema =
      req.method === 'sampling/createMessage'
        ? CreateMessageResultSchema
        : req.method === 'elicitation/create'
          ? ElicitResultSchema
          : ListRootsResultSchema;
    const request = { method: req.method, ...(req.params ? { params: req.params } : {}) } as ServerRequest;
    if (via) return via.sendRequest(request, schema, { signal });
    return this.server.request(request, schema, { signal });
  }

  /** A server notification (logging, list changes, resource updates). */
  async fromServerNotification(server: string, n: Notification): Promise<void> {
    if (this.closed) return;
    if (n.method.endsWith('/list_changed')) {
      if (n.method === 'notifications/tools/list_changed') await this.relistAndNotify();
      else await this.server.notification({ method: n.method } as ServerNotification).catch(() => {});
      return;
    }
    if (n.method === 'notifications/message' || n.method === 'notifications/resources/updated') {
      const via = [...this.inflight].reverse().find((i) => i.server === server)?.extra;
      const note = { method: n.method, ...(n.params ? { params: n.params } : {}) } as ServerNotification;
      if (via) await via.sendNotification(note).catch(() => {});
      else await this.server.notification(note).catch(() => {});
    }
  }
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

/** Apply `f` to every string value of a JSON tree (not keys), returning a new tree. */
function redactStrings(v: unknown, f: (s: string) => string, depth = 0): unknown {
  if (typeof v === 'string') return f(v);
  if (depth > 64 || v === null || typeof v !== 'object') return v;
  if (Array.isArray(v)) return v.map((x) => redactStrings(x, f, depth + 1));
  const out: Record<string, unknown> = {};
  for (const [k, x] of Object.entries(v)) out[k] = k === 'blob' ? x : redactStrings(x, f, depth + 1);
  return out;
}
