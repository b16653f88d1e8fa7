// Which sandboxed server instance serves a request, by boundary:
//   per-server   one instance for everyone (state is shared across sessions and tenants)
//   per-tenant   one instance per authenticated tenant
//   per-session  one instance per client session, killed when the session ends (no state leaks)
//   per-call     every request but a listing (tools/call, resources/read, prompts/get, completion...)
//                gets a fresh instance, killed right after; listings use a separate long-lived
//                instance that never runs anything else. A spare instance is started ahead (it
//                has already started and answered initialize: the server's "ready state"), so a
//                call pays for the sandbox and server start only when calls come faster than spares.
import type { ClientCapabilities } from '@modelcontextprotocol/sdk/types.js';
import type { Logger } from '../core/backend.js';
import type { McpSandboxProvider } from './sandbox-provider.js';
import type { Boundary } from './config.js';
import { Upstream, type ServerLaunch, type UpstreamHooks } from './upstream.js';

export interface Lease {
  readonly upstream: Upstream;
  /** Done with it (per-call: kills the instance). */
  release(): Promise<void>;
}

export interface AcquireContext {
  readonly sessionId: string;
  readonly tenant: string;
  readonly purpose: 'list' | 'call' | 'other';
  readonly clientCapabilities?: ClientCapabilities;
}

export class ServerPool {
  private readonly shared = new Map<string, Promise<Upstream>>();
  private spare: Promise<Upstream> | undefined;
  private readonly perCall = new Set<Promise<Upstream>>();
  private closed = false;

  constructor(
    readonly launch: ServerLaunch,
    readonly boundary: Boundary,
    private readonly airlock: McpSandboxProvider,
    /** Hooks for an instance, given the key it serves (session id, tenant, '*' or 'call'). */
    private readonly hooksFor: (key: string) => UpstreamHooks,
    private readonly logger?: Logger,
  ) {}

  private keyFor(ctx: AcquireContext): string {
    switch (this.boundary) {
      case 'per-server':
        return '*';
      case 'per-tenant':
        return `tenant:${ctx.tenant}`;
      case 'per-session':
        return `session:${ctx.sessionId}`;
      case 'per-call':
        return '*list';
    }
  }

  private start(key: string, caps?: ClientCapabilities): Promise<Upstream> {
    return Upstream.start(this.launch, this.airlock, this.hooksFor(key), {
      ...(caps ? { clientCapabilities: caps } : {}),
      ...(this.logger ? { logger: this.logger } : {}),
    });
  }

  async acquire(ctx: AcquireContext): Promise<Lease> {
    if (this.closed) throw new Error('server pool closed');
    // Per-call: every request that is not a listing (tools/call, resources/read, prompts/get,
    // completion, subscriptions, ...) gets a fresh instance, never the shared lister.
    if (this.boundary === 'per-call' && ctx.purpose !== 'list') {
      const p = this.spare ?? this.start('call', ctx.clientCapabilities);
      this.spare = undefined;
      this.perCall.add(p);
      this.refillSpare(ctx.clientCapabilities);
      const upstream = await p;
      return {
        upstream,
        release: async () => {
          this.perCall.delete(p);
          await upstream.close();
        },
      };
    }
    const key = this.keyFor(ctx);
    let p = this.shared.get(key);
    if (p) {
      const up = await p.catch(() => undefined);
      if (!up || up.exited) {
        // The instance died (crash, OOM, TTL): start a new one for this key.
        if (this.shared.get(key) === p) this.shared.delete(key);
        p = undefined;
      }
    }
    if (!p) {
      p = this.start(key, ctx.clientCapabilities);
      this.shared.set(key, p);
      p.catch(() => {
        if (this.shared.get(key) === p) this.shared.delete(key);
      });
    }
    return { upstream: await p, release: async () => {} };
  }

  private refillSpare(caps?: ClientCapabilities): void {
    if (this.closed || this.spare) return;
    const p = this.start('call', caps);
    p.catch((e: Error) => {
      this.logger?.warn({ server: this.launch.name, err: e.message }, 'per-call spare failed to start');
      if (this.spare === p) this.spare = undefined;
    });
    this.spare = p;
  }

  /** Start the instances that exist regardless of clients (per-server, per-call's lister and spare). */
  async warm(caps?: ClientCapabilities): Promise<void> {
    if (this.boundary === 'per-server' || this.boundary === 'per-call') {
      await (
        await this.acquire({
          sessionId: '',
          tenant: '',
          purpose: 'list',
          ...(caps ? { clientCapabilities: caps } : {}),
        })
      ).release();
    }
    if (this.boundary === 'per-call') this.refillSpare(caps);
  }

  /** A client session ended: its per-session instance goes. */
  async endSession(sessionId: string): Promise<void> {
    if (this.boundary !== 'per-session') return;
    const key = `session:${sessionId}`;
    const p = this.shared.get(key);
    this.shared.delete(key);
    await (await p?.catch(() => undefined))?.close();
  }

  /** Live instances (for tests and status). */
  async instances(): Promise<Upstream[]> {
    const all = [...this.shared.values(), ...this.perCall, ...(this.spare ? [this.spare] : [])];
    const ups = await Promise.all(all.map((p) => p.catch(() => undefined)));
    return ups.filter((u): u is Upstream => u !== undefined && !u.exited);
  }

  async close(): Promise<void> {
    this.closed = true;
    const all = [...this.shared.values(), ...this.perCall, ...(this.spare ? [this.spare] : [])];
    this.shared.clear();
    this.perCall.clear();
    this.spare = undefined;
    await Promise.allSettled(all.map(async (p) => (await p).close()));
  }
}
