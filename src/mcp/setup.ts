// From configuration (a gateway config entry, or `airlock mcp` flags) to what the gateway runs: the
// server's launch (command + sandbox spec), its compiled tool rules, budgets, scan policy, output
// limits and pinned definitions. Pure except for reading the lockfile.
import { compileToolRules } from '../policy/mcp.js';
import type { SandboxSpecInput } from '../core/spec.js';
import type { Budgets } from './budget.js';
import {
  effectiveBoundary,
  effectiveBudgets,
  type GatewayConfig,
  type GatewayTransport,
  type McpServerConfig,
} from './config.js';
import type { ServerSetup } from './server-setup.js';
import { readLockfile, type Lockfile } from './pin.js';

/** Default cap on the text of one tool result the client sees (the rest goes to the audit spill). */
export const DEFAULT_MAX_TEXT_BYTES = 64_000;

/** The sandbox spec of a server (its mounts come from command resolution, at start). */
export function serverSandboxSpec(server: McpServerConfig): Omit<SandboxSpecInput, 'mounts'> {
  const a = server.airlock;
  return {
    ...(a.backend ? { backend: a.backend } : {}),
    ...(a.image !== undefined ? { image: a.image } : {}),
    ...(a.ttlMs ? { ttlMs: a.ttlMs } : {}),
    ...(a.limits ? { limits: a.limits } : {}),
    ...(a.workspace ? { workspace: a.workspace } : {}),
    ...(a.network ? { network: a.network } : {}),
    ...(a.secrets.length ? { secrets: a.secrets } : {}),
    env: server.env,
  };
}

/** How the gateway starts one configured server. */
export function serverSetup(
  server: McpServerConfig,
  opts: {
    transport: GatewayTransport;
    defaults?: Pick<GatewayConfig['airlock'], 'budgets' | 'defaultBoundary'>;
    lock?: Lockfile;
    hostEnv?: Readonly<Record<string, string | undefined>>;
  },
): ServerSetup {
  const a = server.airlock;
  const budgets: Budgets = opts.defaults ? effectiveBudgets(server, opts.defaults) : (a.budgets ?? {});
  const pinned = opts.lock?.servers[server.name]?.pin;
  return {
    name: server.name,
    namespace: a.namespace ?? server.name,
    launch: {
      name: server.name,
      command: [server.command, ...server.args],
      cwd: server.cwd ?? process.cwd(),
      sandbox: serverSandboxSpec(server),
      ...(opts.hostEnv ? { hostEnv: opts.hostEnv } : {}),
    },
    boundary: effectiveBoundary(server, opts.transport, opts.defaults),
    rules: compileToolRules(a.tools, { server: server.name, cwd: '/workspace' }),
    budgets,
    scan: a.scan,
    output: { maxTextBytes: a.output.maxTextBytes ?? DEFAULT_MAX_TEXT_BYTES },
    ...(pinned ? { pinned } : {}),
  };
}

/** Every enabled server of a gateway config, with the lockfile (if present) applied. */
export function gatewaySetups(config: GatewayConfig, transport: GatewayTransport): ServerSetup[] {
  const lock = readLockfile(config.airlock.lockfile);
  return Object.values(config.mcpServers).map((s) =>
    serverSetup(s, { transport, defaults: config.airlock, ...(lock ? { lock } : {}) }),
  );
}
