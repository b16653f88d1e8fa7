// The sandbox runtime of the /mcp gateway on `airlock serve`: MCP servers run in sandboxes of the
// supervisor, like every sandbox of the server, never in the front server (which holds none). A
// sandbox is created through the supervisor's MCP route (server/mcp-supervisor.ts: the server's own
// files bound read-only), and its server process is a background process of the native API: stdout
// and stderr followed as an NDJSON stream, stdin written chunk by chunk, EOF as DELETE .../stdin.
//
// Quotas: an instance that serves one tenant (boundary per-session, per-tenant, per-call) takes a
// reservation from that tenant's quota (live sandboxes, memory, CPU, creates per minute) for as long
// as it lives, through the same Quotas as API creates; it waits in the same bounded queue and fails
// with QUOTA_EXCEEDED when no room frees up. A per-server instance serves every tenant: it is the
// operator's, counted against nobody. These sandboxes are not in the store: no tenant sees them in
// its sandbox list or can exec in them, and a restarted front server kills them as unrecorded.
import { PassThrough, Writable } from 'node:stream';
import { AirlockError } from '../core/errors.js';
import type { SecretValue } from '../core/network-spec.js';
import type { SandboxSpecInput } from '../core/spec.js';
import type { EgressEvent } from '../egress/events.js';
import type {
  McpRedactionSet,
  McpSandbox,
  McpSandboxProvider,
  McpServerProcess,
} from '../mcp/sandbox-provider.js';
import { resolveSecretValue } from '../secrets/resolve.js';
import type { Caller, SandboxApi } from './contract.js';
import { createMcpSandbox, type McpSandboxRequest } from './mcp-supervisor.js';
import { usageOf, type Quotas } from './quotas.js';

const SUPERVISOR: Caller = { tenant: 'supervisor' };
const EMPTY: McpRedactionSet = { secrets: [], sentinels: [], canaries: [] };

export interface SupervisorMcpProviderOptions {
  /** Where the gateway keeps its spill files (the front server's state dir). */
  readonly stateDir: string;
  readonly socketPath: string;
  /** The supervisor's own (unscoped) API. */
  readonly api: SandboxApi;
  readonly quotas: Quotas;
  readonly queueTimeoutMs: number;
  /** The tenant whose /mcp request is being served, if any. */
  tenant(): string | undefined;
  /** Servers whose one instance serves every tenant (boundary per-server). */
  readonly shared: ReadonlySet<string>;
  /** The environment the config's secret sources (fromEnv, command) are resolved in. */
  readonly env?: NodeJS.ProcessEnv;
}

/** McpSandboxProvider over the supervisor. */
export class SupervisorMcpProvider implements McpSandboxProvider {
  readonly stateDir: string;
  private readonly redactions = new Map<string, McpRedactionSet>();
  private readonly live = new Set<RemoteMcpSandbox>();
  private closed = false;

  constructor(private readonly o: SupervisorMcpProviderOptions) {
    this.stateDir = o.stateDir;
  }

  /** Sandboxes alive now, with the tenant each counts against (tests, status). */
  sandboxes(): Array<{ id: string; tenant: string | undefined }> {
    return [...this.live].map((s) => ({ id: s.id, tenant: s.tenant }));
  }

  async create(spec: SandboxSpecInput): Promise<McpSandbox> {
    if (this.closed) throw new AirlockError('BACKEND_UNAVAILABLE', 'the MCP gateway is closing');
    const server = spec.metadata?.mcpServer;
    const tenant = server !== undefined && !this.o.shared.has(server) ? this.o.tenant() : undefined;
    const want = usageOf(spec.limits);
    const release =
      tenant === undefined ? () => {} : await this.o.quotas.reserve(tenant, want, this.o.queueTimeoutMs);
    try {
      const created = await createMcpSandbox(this.o.socketPath, await this.request(spec, tenant));
      const id = created.sandbox.id;
      this.redactions.set(id, created.redaction);
      const sbx: RemoteMcpSandbox = new RemoteMcpSandbox(id, tenant, this.o.api, () => {
        this.live.delete(sbx);
        this.redactions.delete(id);
        release();
      });
      this.live.add(sbx);
      if (this.closed) {
        // close() ran while this sandbox was being made: it did not see it, so kill it here.
        await sbx.kill();
        throw new AirlockError('BACKEND_UNAVAILABLE', 'the MCP gateway is closing');
      }
      return sbx;
    } catch (e) {
      release();
      throw e;
    }
  }

  redactionSetFor(sandboxId: string): McpRedactionSet {
    return this.redactions.get(sandboxId) ?? EMPTY;
  }

  /** Kill every sandbox still alive (the gateway closes its instances first; this is the backstop). */
  async close(): Promise<void> {
    this.closed = true;
    await Promise.allSettled([...this.live].map((s) => s.kill()));
  }

  /** The spec as the supervisor route takes it: the config's secret sources resolved here. */
  private async request(spec: SandboxSpecInput, tenant: string | undefined): Promise<McpSandboxRequest> {
    const secrets = await Promise.all(
      (spec.secrets ?? []).map(async (s) => ({
        name: s.name,
        value: {
          literal: await resolveSecretValue(s.value as SecretValue, {
            name: s.name,
            env: this.o.env ?? process.env,
          }),
        },
        hosts: s.hosts,
        ...(s.body !== undefined ? { body: s.body } : {}),
        ...(s.insecureHttp !== undefined ? { insecureHttp: s.insecureHttp } : {}),
      })),
    );
    return {
      ...(spec.backend !== undefined ? { backend: spec.backend as 'namespaces' | 'gvisor' } : {}),
      ...(spec.ttlMs !== undefined ? { ttlMs: spec.ttlMs } : {}),
      ...(spec.limits !== undefined ? { limits: spec.limits as Record<string, number> } : {}),
      ...(spec.workspace !== undefined ? { workspace: spec.workspace as Record<string, string> } : {}),
      ...(spec.network !== undefined ? { network: spec.network as Record<string, unknown> } : {}),
      ...(spec.env !== undefined ? { env: spec.env } : {}),
      metadata: { ...spec.metadata, ...(tenant !== undefined ? { 'airlock.mcpTenant': tenant } : {}) },
      ...(spec.mounts !== undefined
        ? { mounts: spec.mounts.map((m) => ({ hostPath: m.hostPath, path: m.path ?? m.hostPath })) }
        : {}),
      ...(secrets.length ? { secrets } : {}),
    };
  }
}

/** One MCP server's sandbox in the supervisor. */
class RemoteMcpSandbox implements McpSandbox {
  private gone = false;
  private killing: Promise<void> | undefined;

  constructor(
    readonly id: string,
    readonly tenant: string | undefined,
    private readonly api: SandboxApi,
    private readonly onGone: () => void,
  ) {}

  get alive(): boolean {
    return !this.gone;
  }

  setTimeout(ttlMs: number): void {
    void this.api.setTimeout(this.id, ttlMs, SUPERVISOR).catch(() => {});
  }

  async spawn(argv: string[], opts: { cwd?: string }): Promise<McpServerProcess> {
    const { pid } = await this.api.startProcess(
      this.id,
      { cmd: argv, ...(opts.cwd !== undefined ? { cwd: opts.cwd } : {}) },
      SUPERVISOR,
    );
    const stdout = new PassThrough();
    const stderr = new PassThrough();
    const exited = (async () => {
      let exit: { exitCode: number | null; signal: string | null; killedBy?: string } = {
        exitCode: null,
        signal: null,
        killedBy: 'lost',
      };
      try {
        for await (const e of this.api.connectProcess(this.id, pid, SUPERVISOR)) {
          if (e.type === 'stdout') stdout.write(Buffer.from(e.data, 'base64'));
          else if (e.type === 'stderr') stderr.write(Buffer.from(e.data, 'base64'));
          else if (e.type === 'exit') {
            exit = {
              exitCode: e.exitCode,
              signal: e.signal,
              ...(e.killedBy !== undefined ? { killedBy: e.killedBy } : {}),
            };
          }
        }
      } catch {
        // The stream broke (the sandbox or its supervisor is gone): the server is gone with it.
      }
      stdout.end();
      stderr.end();
      // The server process is the sandbox's reason to be: once it is gone, so is the sandbox.
      await this.kill();
      return exit;
    })();
    const stdin = new Writable({
      write: (chunk: Buffer, _enc, cb) => {
        this.api.sendStdin(this.id, pid, new Uint8Array(chunk), SUPERVISOR).then(
          () => cb(),
          (e: unknown) => cb(e as Error),
        );
      },
      final: (cb) => {
        this.api.closeStdin(this.id, pid, SUPERVISOR).then(
          () => cb(),
          () => cb(),
        );
      },
    });
    // A write after the server died fails; the exit is reported through `exited`.
    stdin.on('error', () => {});
    return { stdin, stdout, stderr, exited };
  }

  async exec(cmd: string): Promise<{ exitCode: number | null; stdout: string; stderr: string }> {
    let stdout = '';
    let stderr = '';
    let exitCode: number | null = null;
    for await (const e of this.api.exec(this.id, { cmd }, SUPERVISOR)) {
      if (e.type === 'stdout') stdout += Buffer.from(e.data, 'base64').toString('utf8');
      else if (e.type === 'stderr') stderr += Buffer.from(e.data, 'base64').toString('utf8');
      else if (e.type === 'exit') exitCode = e.exitCode;
    }
    return { exitCode, stdout, stderr };
  }

  onEgress(listener: (e: EgressEvent) => void): () => void {
    const stop = new AbortController();
    void (async () => {
      try {
        for await (const e of this.api.egressEvents(this.id, SUPERVISOR, stop.signal)) listener(e);
      } catch {
        /* the sandbox is gone, or we stopped listening */
      }
    })();
    return () => stop.abort();
  }

  kill(): Promise<void> {
    return (this.killing ??= (async () => {
      await this.api.kill(this.id, SUPERVISOR).catch(() => {}); // already gone: the same end
      this.gone = true;
      this.onGone();
    })());
  }
}
