// `airlock mcp -- <server>`: run one stdio MCP server in a sandbox and speak MCP on stdio, mediated.
// `airlock mcp scan|pin|diff -- <server>`: inspect, pin or compare its definitions.
// `airlock gateway --config FILE`: many servers behind one Streamable HTTP (or stdio) endpoint.
// stdout belongs to the MCP protocol in `mcp` and `gateway --stdio`: every human line goes to stderr.
import { basename, resolve } from 'node:path';
import { AirlockError, ERROR_CODES } from '../core/errors.js';
import { jsonlAuditSink, teeAudit, type AuditEvent } from '../mcp/audit.js';
import {
  McpServerAirlockSchema,
  loadGatewayConfig,
  requireTenants,
  resolveTenants,
  type McpServerConfig,
} from '../mcp/config.js';
import { GatewayCore } from '../mcp/gateway.js';
import { HttpFront } from '../mcp/http.js';
import {
  LOCKFILE_NAME,
  comparePins,
  formatDiff,
  isCleanDiff,
  pinDefinitions,
  readLockfile,
  setServerPin,
  writeLockfile,
} from '../mcp/pin.js';
import { highestSeverity, scanDefinitions } from '../guard/scan.js';
import { gatewaySetups, serverSetup } from '../mcp/setup.js';
import { serveStdio } from '../mcp/stdio.js';
import { Upstream } from '../mcp/upstream.js';
import { readConfigData } from '../core/config-file.js';
import { parseOrThrow } from '../core/validate.js';
import { checkSecretSources, parseSecretFlag, planEgress } from './egress-flags.js';
import { decideHost, NetworkPolicySchema } from '../policy/network.js';
import { checkWorkspaceDir, parseBackend, parseEnvPairs, parseWorkspace } from './flags.js';
import { parseBytes, parseDurationMs } from '../core/units.js';
import { cliAirlock, trapSignals } from './lifecycle.js';
import type { Io } from './run.js';

export interface McpFlags {
  backend?: string;
  image?: string;
  memory?: string;
  cpus?: string;
  pids?: string;
  disk?: string;
  ttl?: string;
  workspace?: string;
  env: string[];
  allow?: string[];
  deny?: string[];
  secret?: string[];
  policy?: string;
  lockfile?: string;
  name?: string;
  auditLog?: string;
  json?: boolean;
}

/** The server name a command is pinned under: --name, else the npm package or script name. */
export function defaultServerName(cmd: readonly string[]): string {
  const launcher = new Set([
    'npx',
    'npm',
    'pnpm',
    'yarn',
    'exec',
    'x',
    'dlx',
    'node',
    'tsx',
    'python',
    'python3',
  ]);
  const arg = cmd.find((a, i) => i > 0 && !a.startsWith('-') && !launcher.has(a)) ?? cmd[0] ?? 'server';
  const base = basename(arg.replace(/@[^@/]*$/, '').replace(/^@[^/]+\//, '')).replace(
    /\.[cm]?[jt]s$|\.py$/,
    '',
  );
  return base.replace(/[^A-Za-z0-9_-]/g, '-').slice(0, 64) || 'server';
}

const MAX_POLICY_FILE_BYTES = 1024 * 1024;

function readPolicy(path: string, cwd: string): Record<string, unknown> {
  const full = resolve(cwd, path);
  let data: unknown;
  try {
    data = readConfigData(full, {
      what: 'policy file',
      code: 'MCP_INVALID_CONFIG',
      maxBytes: MAX_POLICY_FILE_BYTES,
    });
  } catch (e) {
    if (!AirlockError.isInstance(e)) throw e;
    // A file that cannot be read is a bad flag value; one that does not parse is a bad config.
    const code = e.code === 'MCP_INVALID_CONFIG' ? e.code : 'INVALID_ARGUMENT';
    throw new AirlockError(code, `--policy: ${e.message}`, { field: '--policy', cause: e });
  }
  if (data === null || data === undefined) return {};
  if (typeof data !== 'object' || Array.isArray(data)) {
    throw new AirlockError(
      'MCP_INVALID_CONFIG',
      `--policy: ${full} must be a mapping (network, secrets, tools, budgets, scan, ...)`,
      {
        field: '--policy',
      },
    );
  }
  return data as Record<string, unknown>;
}

/** One server's config from `airlock mcp` flags (+ --policy file), validated like a gateway entry. */
export function serverFromFlags(cmd: readonly string[], f: McpFlags, cwd: string): McpServerConfig {
  if (!cmd.length) {
    throw new AirlockError(
      'INVALID_ARGUMENT',
      'no server command given; use: airlock mcp [flags] -- CMD [ARGS...]',
      {
        field: 'CMD',
      },
    );
  }
  const base = f.policy ? readPolicy(f.policy, cwd) : {};
  const egress = planEgress(
    { ...(f.allow ? { allow: f.allow } : {}), ...(f.deny ? { deny: f.deny } : {}) },
    cwd,
  );
  // Each --secret is parsed on its own (its hosts are checked against the merged network below, not
  // against a placeholder policy: that check refused every --secret whatever --allow said).
  const flagSecrets = (f.secret ?? []).map(parseSecretFlag);
  for (const [i, s] of flagSecrets.entries()) {
    if (flagSecrets.findIndex((x) => x.name === s.name) !== i)
      throw new AirlockError('INVALID_ARGUMENT', `--secret: ${s.name} is given twice`, { field: '--secret' });
  }
  const baseNet = (base.network ?? undefined) as { allow?: string[]; deny?: string[] } | undefined;
  const network =
    baseNet || egress.network
      ? {
          ...(baseNet ?? {}),
          allow: [...(baseNet?.allow ?? []), ...((egress.network?.allow as string[] | undefined) ?? [])],
          deny: [...(baseNet?.deny ?? []), ...((egress.network?.deny as string[] | undefined) ?? [])],
        }
      : undefined;
  const baseSecrets = (Array.isArray(base.secrets) ? base.secrets : []) as Array<{ name?: string }>;
  const secrets = [...baseSecrets.filter((s) => !flagSecrets.some((x) => x.name === s.name)), ...flagSecrets];
  checkFlagSecrets(flagSecrets, network);
  const limits: Record<string, number> = { ...((base.limits as Record<string, number> | undefined) ?? {}) };
  if (f.memory !== undefined) limits.memoryBytes = parseBytes(f.memory, '--memory');
  if (f.cpus !== undefined) limits.cpus = Number(f.cpus);
  if (f.pids !== undefined) limits.pids = Number(f.pids);
  if (f.disk !== undefined) limits.diskBytes = parseBytes(f.disk, '--disk');
  const workspace = f.workspace !== undefined ? parseWorkspace(f.workspace, cwd) : base.workspace;
  if (
    workspace &&
    typeof workspace === 'object' &&
    'hostDir' in workspace &&
    typeof workspace.hostDir === 'string'
  )
    checkWorkspaceDir(workspace.hostDir);
  const raw = {
    ...base,
    ...(f.backend !== undefined ? { backend: parseBackend(f.backend) } : {}),
    ...(f.image !== undefined ? { image: f.image } : {}),
    ...(f.ttl !== undefined ? { ttlMs: parseDurationMs(f.ttl, '--ttl') } : {}),
    ...(Object.keys(limits).length ? { limits } : {}),
    ...(workspace !== undefined ? { workspace } : {}),
    ...(network ? { network } : {}),
    secrets,
    namespace: false as const, // one server, fronted under its own tool names
  };
  const airlock = parseOrThrow(
    McpServerAirlockSchema,
    raw,
    f.policy ? `MCP policy ${f.policy}` : 'MCP flags',
    'MCP_INVALID_CONFIG',
  );
  const name = f.name ?? defaultServerName(cmd);
  return { name, command: cmd[0]!, args: cmd.slice(1), env: parseEnvPairs(f.env), cwd, airlock };
}

/**
 * A --secret is only ever swapped in at egress to its hosts: each host must be reachable under the merged
 * network (--allow and the --policy file), and an env: source must be set. Errors name --secret (exit 2)
 * and never repeat the source (a cmd: argument may itself be a credential).
 */
function checkFlagSecrets(
  secrets: ReadonlyArray<ReturnType<typeof parseSecretFlag>>,
  network: { allow?: string[]; deny?: string[] } | undefined,
): void {
  if (!secrets.length) return;
  const parsed = NetworkPolicySchema.safeParse(network ?? { allow: [] });
  if (!parsed.success) return; // reported (naming its field) when the whole config is parsed
  for (const s of secrets) {
    for (const host of s.hosts) {
      if (![443, 80].some((port) => decideHost(parsed.data, host, port).action === 'allow')) {
        throw new AirlockError(
          'INVALID_ARGUMENT',
          `--secret: ${s.name} is bound to ${host}, which the network policy does not allow; add --allow ${host}`,
          { field: '--secret' },
        );
      }
    }
  }
  checkSecretSources({
    secrets: [...secrets],
    secretOrigin: new Map(secrets.map((s) => [s.name, '--secret'])),
  });
}

function stderrLogger(io: Io, name: string): (server: string, line: string) => void {
  return (_server, line) => io.err(`[${name}] ${line}\n`);
}

function auditSink(f: { auditLog?: string }, io: Io, verbose: boolean): (e: AuditEvent) => void {
  return teeAudit(
    f.auditLog ? jsonlAuditSink(resolve(f.auditLog)) : undefined,
    verbose
      ? (e) => {
          if (e.kind === 'mcp' && (e.decision === 'deny' || e.decision === 'quarantine'))
            io.err(`[airlock] ${e.decision} ${e.server}${e.tool ? ` ${e.tool}` : ''}: ${e.reason}\n`);
          if (e.kind === 'egress' && e.decision === 'deny')
            io.err(`[airlock] egress denied ${e.host}:${e.port}: ${e.reason}\n`);
        }
      : undefined,
  );
}

/** `airlock mcp -- CMD`: serve one sandboxed server on this process's stdin/stdout. */
export async function mcpServeCommand(cmd: string[], f: McpFlags, io: Io): Promise<number> {
  const cwd = process.cwd();
  const server = serverFromFlags(cmd, f, cwd);
  const lockPath = resolve(cwd, f.lockfile ?? LOCKFILE_NAME);
  const lock = readLockfile(lockPath);
  const airlock = cliAirlock({ oneSandbox: true });
  const trap = trapSignals(airlock, (l) => io.err(`${l}\n`));
  let overflowed = false;
  const core = new GatewayCore({
    airlock,
    mode: 'single',
    servers: [serverSetup(server, { transport: 'stdio', ...(lock ? { lock } : {}) })],
    audit: auditSink(f, io, true),
    onServerStderr: stderrLogger(io, server.name),
  });
  try {
    await core.start();
    if (trap.exitCode !== undefined) return trap.exitCode;
    await serveStdio(core, process.stdin, process.stdout, {
      onFrameError: (reason) => io.err(`[airlock] dropped a broken frame from the client: ${reason}\n`),
      onOverflow: (reason) => {
        overflowed = true;
        io.err(`[airlock] ${reason}\n`);
      },
    });
    return trap.exitCode ?? (overflowed ? ERROR_CODES.CAPACITY_EXHAUSTED.exit : 0);
  } finally {
    await core.close();
    await airlock.killAll();
    trap.dispose();
    if (overflowed) exitWhenDone(ERROR_CODES.CAPACITY_EXHAUSTED.exit);
  }
}

/**
 * Exit soon after the cleanup is done: stdout's unread bytes (a client that stopped reading) keep a
 * write pending that no one will ever take, which would hold the process open.
 */
function exitWhenDone(code: number): void {
  setTimeout(() => process.exit(code), 100).unref();
}

async function withServer<T>(
  cmd: string[],
  f: McpFlags,
  io: Io,
  fn: (up: Upstream, server: McpServerConfig) => Promise<T>,
): Promise<T> {
  const server = serverFromFlags(cmd, f, process.cwd());
  const setup = serverSetup(server, { transport: 'stdio' });
  const airlock = cliAirlock({ oneSandbox: true });
  const trap = trapSignals(airlock, (l) => io.err(`${l}\n`));
  try {
    const up = await Upstream.start(setup.launch, airlock, {
      onStderr: (l) => io.err(`[${server.name}] ${l}\n`),
    });
    try {
      return await fn(up, server);
    } finally {
      await up.close();
    }
  } finally {
    await airlock.killAll();
    trap.dispose();
  }
}

/** `airlock mcp scan -- CMD`: start the server, list everything, print the scanner's findings. Exit 1 on high. */
export async function mcpScanCommand(cmd: string[], f: McpFlags, io: Io): Promise<number> {
  return withServer(cmd, f, io, async (up, server) => {
    // Lenient: a definition the MCP SDK would reject is reported as a finding, not a failed listing.
    const defs = await up.listDefinitions({}, { lenient: true });
    const findings = scanDefinitions({ ...defs, resources: defs.resources as never });
    const worst = highestSeverity(findings);
    if (f.json) {
      io.out(
        `${JSON.stringify({ server: server.name, tools: defs.tools.length, prompts: defs.prompts.length, findings }, null, 2)}\n`,
      );
    } else {
      io.out(
        `${server.name}: ${defs.tools.length} tools, ${defs.prompts.length} prompts, ${defs.resourceTemplates.length} resource templates\n`,
      );
      if (!findings.length) io.out('no findings\n');
      for (const x of findings)
        io.out(
          `${x.severity.toUpperCase().padEnd(6)} ${x.ruleId.padEnd(22)} ${x.location}\n       ${x.message}\n       "${x.excerpt}"\n`,
        );
    }
    return worst === 'high' ? 1 : 0;
  });
}

/** `airlock mcp pin -- CMD`: write the server's current definitions to the lockfile. */
export async function mcpPinCommand(cmd: string[], f: McpFlags, io: Io): Promise<number> {
  const lockPath = resolve(process.cwd(), f.lockfile ?? LOCKFILE_NAME);
  return withServer(cmd, f, io, async (up, server) => {
    const defs = await up.listDefinitions({}, { lenient: true }); // pinned as served (see session.ts)
    const lock = setServerPin(readLockfile(lockPath), server.name, pinDefinitions(defs), {
      pinnedAt: new Date().toISOString(),
      command: [server.command, ...server.args],
    });
    writeLockfile(lockPath, lock);
    io.err(
      `pinned ${defs.tools.length} tools, ${defs.prompts.length} prompts of ${server.name} in ${lockPath}\n`,
    );
    return 0;
  });
}

/** `airlock mcp diff -- CMD`: compare the server's current definitions with the lockfile. Exit 1 if they differ. */
export async function mcpDiffCommand(cmd: string[], f: McpFlags, io: Io): Promise<number> {
  const lockPath = resolve(process.cwd(), f.lockfile ?? LOCKFILE_NAME);
  const name = f.name ?? defaultServerName(cmd);
  const pinned = readLockfile(lockPath)?.servers[name]?.pin;
  if (!pinned) {
    throw new AirlockError(
      'MCP_INVALID_CONFIG',
      `${lockPath} has no pin for server ${name}; run airlock mcp pin first (or pass --name)`,
      {
        field: '--lockfile',
      },
    );
  }
  return withServer(cmd, { ...f, name }, io, async (up) => {
    const diff = comparePins(pinned, await up.listDefinitions({}, { lenient: true }));
    io.out(formatDiff(name, diff));
    return isCleanDiff(diff) ? 0 : 1;
  });
}

export interface GatewayFlags {
  config: string;
  listen?: string;
  stdio?: boolean;
  auditLog?: string;
}

/** `airlock gateway --config FILE`: serve until SIGINT/SIGTERM (HTTP) or until the client leaves (stdio). */
export async function gatewayCommand(f: GatewayFlags, io: Io): Promise<number> {
  const config = loadGatewayConfig(resolve(f.config));
  const transport = f.stdio ? 'stdio' : 'http';
  if (transport === 'http') requireTenants(config);
  const tenants = transport === 'http' ? resolveTenants(config) : [];
  const airlock = cliAirlock();
  const trap = trapSignals(airlock, (l) => io.err(`${l}\n`));
  let overflowed = false;
  const core = new GatewayCore({
    airlock,
    mode: 'multi',
    servers: gatewaySetups(config, transport),
    audit: auditSink(f, io, true),
    relistIntervalMs: config.airlock.relistIntervalMs,
    onServerStderr: (server, line) => io.err(`[${server}] ${line}\n`),
  });
  try {
    await core.start();
    if (transport === 'stdio') {
      await serveStdio(core, process.stdin, process.stdout, {
        onOverflow: (reason) => {
          overflowed = true;
          io.err(`[airlock] ${reason}\n`);
        },
      });
      return trap.exitCode ?? (overflowed ? ERROR_CODES.CAPACITY_EXHAUSTED.exit : 0);
    }
    const listen = f.listen ?? config.airlock.listen;
    const m = /^(?:\[(.+)\]|([^:]+)):(\d+)$/.exec(
      typeof listen === 'string' ? listen : `${listen.host}:${listen.port}`,
    );
    if (!m)
      throw new AirlockError('INVALID_ARGUMENT', `--listen: "${String(listen)}" is not HOST:PORT`, {
        field: '--listen',
      });
    const host = m[1] ?? m[2]!;
    if (f.listen && !/^(127\.|localhost$|::1$)/.test(host) && !config.airlock.allowNonLoopback) {
      throw new AirlockError(
        'INVALID_ARGUMENT',
        `--listen: ${host} is not loopback; set "allowNonLoopback": true in the config to bind it`,
        {
          field: '--listen',
        },
      );
    }
    const front = new HttpFront(core, {
      host,
      port: Number(m[3]),
      tenants,
      ...(config.airlock.allowedHosts && !f.listen ? { allowedHosts: config.airlock.allowedHosts } : {}),
      ...(config.airlock.allowedOrigins.length ? { extraOrigins: config.airlock.allowedOrigins } : {}),
    });
    const where = await front.listen();
    io.err(
      `airlock gateway: ${core.entries().length} server(s) at ${where.url} (tenants: ${tenants.map((t) => t.name).join(', ')})\n`,
    );
    await new Promise<void>((r) => trap.signal.addEventListener('abort', () => r(), { once: true }));
    await front.close();
    return trap.exitCode ?? 0;
  } finally {
    await core.close();
    await airlock.killAll();
    trap.dispose();
    if (overflowed) exitWhenDone(ERROR_CODES.CAPACITY_EXHAUSTED.exit);
  }
}
