// The gateway config file (`airlock gateway --config FILE`), validated with zod at the trust boundary
// (STYLE.md habit 3). A Claude Desktop / Cursor `mcpServers` JSON is accepted as-is: keys those clients
// use that mean nothing here (autoApprove, alwaysAllow, timeout, …) pass through and are ignored,
// `disabled: true` skips a server, `cwd` is the host directory the command is resolved in. Each server
// may carry an `airlock` block (sandbox, boundary, tool rules, budgets, scan policy, output shaping), and
// the top-level `airlock` block configures the gateway itself (tenants, listen address, Host/Origin
// checks, relisting, lockfile, default budgets). Remote servers (url / http / sse) are refused: Airlock
// sandboxes the stdio servers it starts itself and does not proxy remote ones.
//
// Every failure is MCP_INVALID_CONFIG naming the file and the field, e.g. `mcpServers.fs.airlock.boundary`.
// The only I/O: loadGatewayConfig reads the file it is given, resolveTenants reads tokenFile paths.
import { readFileSync, statSync } from 'node:fs';
import { isIP } from 'node:net';
import { dirname, isAbsolute, resolve } from 'node:path';
import { z } from 'zod';
import { readConfigData, type ConfigFileOptions } from '../core/config-file.js';
import { AirlockError } from '../core/errors.js';
import { BACKEND_NAMES, EnvSchema, LimitsSchema, MountSchema, WorkspaceSchema } from '../core/spec.js';
import { parseOrThrow } from '../core/validate.js';
import { ScanPolicySchema, ToolRulesSchema } from '../policy/mcp.js';
import { decideHost, NetworkPolicySchema, SecretsSchema } from '../policy/network.js';
import { BudgetsSchema, type Budgets } from './budget.js';

const MiB = 1024 * 1024;
const DAY_MS = 24 * 3_600_000;
const MAX_CONFIG_FILE_BYTES = MiB;
const MAX_TOKEN_FILE_BYTES = 4096;
const MIN_TOKEN_CHARS = 32;
const MIN_TOKEN_DISTINCT_CHARS = 8;
const TOKEN_ADVICE = 'generate one with `openssl rand -hex 32`';

export const BOUNDARIES = ['per-server', 'per-session', 'per-tenant', 'per-call'] as const;
/** Which sandboxed server instance serves a request: per-server, per-tenant, per-session or per-call. */
export type Boundary = (typeof BOUNDARIES)[number];
export const BoundarySchema = z
  .enum(BOUNDARIES)
  .describe(
    'Which server instance serves a request: one for everyone (per-server), one per authenticated tenant ' +
      '(per-tenant), one per client session (per-session) or a fresh one for every tools/call (per-call).',
  );

export type GatewayTransport = 'stdio' | 'http';

const NAME_RE = /^[A-Za-z0-9_-]{1,64}$/;
const NAME_RULE = '1-64 letters, digits, _ or -';
const nameSchema = (what: string) => z.string().regex(NAME_RE, `${what} must be ${NAME_RULE}`);
const noNul = (s: string): boolean => !s.includes('\0');
const hostAbsPath = (what: string) =>
  z
    .string()
    .refine((p) => isAbsolute(p), `${what} must be an absolute host path`)
    .refine(noNul, `${what} must not contain NUL`);
const envName = z
  .string()
  .regex(/^[A-Za-z_][A-Za-z0-9_]*$/, 'must be an environment variable name (letters, digits and _)');

// ---- per-server sandbox options -----------------------------------------------------------------

/** The sandbox-related fields of a server's `airlock` block (also built from `airlock mcp` flags). */
const sandboxShape = {
  backend: z.enum(BACKEND_NAMES).optional(),
  ttlMs: z.number().int().min(1000, 'ttlMs must be at least 1000').max(DAY_MS).optional(),
  limits: LimitsSchema.optional(),
  workspace: WorkspaceSchema.optional(),
  mounts: z.array(MountSchema).max(16, 'at most 16 mounts').optional(),
  /** Egress policy. Absent: no network at all. */
  network: NetworkPolicySchema.optional(),
  secrets: SecretsSchema.default([]),
  /**
   * Run the server on this image's root (a reference, as in a sandbox spec): the command runs as
   * given with the image's programs (its uvx, npx, python), and no host files are bound for it.
   */
  image: z
    .string()
    .min(1, 'image is an image reference, e.g. "registry.example.com/team/mcp:1"')
    .max(1024)
    .refine((r) => !/[\s\0]/.test(r), 'image references hold no whitespace or NUL')
    .optional(),
};

/** Secrets are swapped in at egress, so they need a network policy that reaches their hosts (as in spec.ts). */
function checkSecretsReachable(
  o: { network?: z.output<typeof NetworkPolicySchema>; secrets: z.output<typeof SecretsSchema> },
  ctx: z.RefinementCtx,
): void {
  // Also runs when a sibling field already failed: then there is nothing sound to check against.
  if (!Array.isArray(o.secrets) || o.secrets.length === 0) return;
  if (o.network === undefined) {
    ctx.addIssue({
      code: 'custom',
      path: ['secrets'],
      message: 'secrets need a network policy whose network.allow names their hosts',
    });
    return;
  }
  for (const [i, secret] of o.secrets.entries()) {
    for (const [j, host] of secret.hosts.entries()) {
      let reachable: boolean;
      try {
        reachable = [443, 80].some((port) => decideHost(o.network!, host, port).action === 'allow');
      } catch {
        return; // an invalid network policy, reported on network itself
      }
      if (!reachable) {
        ctx.addIssue({
          code: 'custom',
          path: ['secrets', i, 'hosts', j],
          message: `${host} is not reachable under network.allow (ports 443/80); add it there or the secret can never be used`,
        });
      }
    }
  }
}

export const McpSandboxOptionsSchema = z.object(sandboxShape).strict().superRefine(checkSecretsReachable);
export type McpSandboxOptionsInput = z.input<typeof McpSandboxOptionsSchema>;
/** Per-server sandbox options: the same object whether it comes from a config file or `airlock mcp` flags. */
export type McpSandboxOptions = z.output<typeof McpSandboxOptionsSchema>;

export const OutputOptionsSchema = z
  .object({
    maxTextBytes: z
      .number()
      .int()
      .min(64, 'output.maxTextBytes must be at least 64')
      .max(256 * MiB)
      .optional()
      .describe('Tool result text longer than this is cut (with a marker) before the model sees it.'),
  })
  .strict();

export const McpServerAirlockSchema = z
  .object({
    ...sandboxShape,
    boundary: BoundarySchema.optional(),
    namespace: z
      .union(
        [
          z.string().regex(NAME_RE, `namespace must be ${NAME_RULE}, or false for no prefix`),
          z.literal(false),
        ],
        {
          error: `namespace must be ${NAME_RULE}, or false for no prefix`,
        },
      )
      .optional()
      .describe("Prefix of this server's tool names at the gateway. Default: the server name; false: none."),
    tools: ToolRulesSchema.optional(),
    budgets: BudgetsSchema.optional(),
    scan: ScanPolicySchema.default(() => ScanPolicySchema.parse({})),
    output: OutputOptionsSchema.default({}),
  })
  .strict()
  .superRefine(checkSecretsReachable);
export type McpServerAirlock = z.output<typeof McpServerAirlockSchema>;

// ---- server entries -----------------------------------------------------------------------------

const REMOTE_TYPES = new Set([
  'http',
  'sse',
  'streamable-http',
  'streamablehttp',
  'streamable_http',
  'ws',
  'websocket',
]);
const REMOTE_URL_KEYS = ['url', 'serverUrl', 'httpUrl'] as const;

/** Claude Desktop / Cursor / Cline shapes Airlock cannot honour, caught before the stdio schema runs. */
function guardEntry(v: unknown, ctx: z.RefinementCtx): void {
  if (typeof v !== 'object' || v === null || Array.isArray(v)) return; // the object schema says so
  const e = v as Record<string, unknown>;
  const remote = (key: string, what: string) =>
    ctx.addIssue({
      code: 'custom',
      path: [key],
      message:
        `this is a remote MCP server (${what}); Airlock sandboxes the local stdio servers it starts itself ` +
        'and does not run or proxy remote servers. Remove the entry or set "disabled": true',
    });
  const urlKey = REMOTE_URL_KEYS.find((k) => e[k] !== undefined);
  if (urlKey !== undefined) return remote(urlKey, urlKey);
  for (const key of ['type', 'transportType'] as const) {
    const t = e[key];
    if (typeof t === 'string' && REMOTE_TYPES.has(t.toLowerCase())) return remote(key, `${key} "${t}"`);
  }
  if (e['envFile'] !== undefined) {
    ctx.addIssue({
      code: 'custom',
      path: ['envFile'],
      message:
        'envFile is not supported: list the variables in env (credentials belong in airlock.secrets, which keeps them out of the sandbox)',
    });
  }
}

const StdioEntrySchema = z
  .object({
    command: z
      .string()
      .min(1, 'command is empty')
      .refine(noNul, 'command must not contain NUL')
      .describe('The program to start (inside the sandbox), e.g. "npx".'),
    args: z.array(z.string().refine(noNul, 'arguments must not contain NUL')).default([]),
    env: EnvSchema.default({}),
    cwd: hostAbsPath('cwd').optional().describe('Host directory the command is resolved in.'),
    type: z.literal('stdio', { error: 'type must be "stdio" (Airlock runs local stdio servers)' }).optional(),
    airlock: McpServerAirlockSchema.default(() => McpServerAirlockSchema.parse({})),
  })
  .loose(); // autoApprove, alwaysAllow, timeout, disabled: false, … are accepted and ignored

const ServerEntrySchema = z.unknown().superRefine(guardEntry).pipe(StdioEntrySchema);

/** One validated server entry of a gateway config. */
export interface McpServerConfig {
  name: string;
  command: string;
  args: string[];
  env: Record<string, string>;
  cwd?: string;
  airlock: McpServerAirlock;
}

const isDisabled = (v: unknown): boolean =>
  typeof v === 'object' && v !== null && (v as Record<string, unknown>)['disabled'] === true;

/** Drop `disabled: true` entries before validation: they are skipped, whatever else they say. */
function enabledOnly(v: unknown): unknown {
  if (typeof v !== 'object' || v === null || Array.isArray(v)) return v;
  return Object.fromEntries(Object.entries(v).filter(([, entry]) => !isDisabled(entry)));
}

// ---- gateway options ----------------------------------------------------------------------------

function tokenProblem(token: string): string | undefined {
  if (token.length < MIN_TOKEN_CHARS)
    return `tenant tokens must be at least ${MIN_TOKEN_CHARS} characters; ${TOKEN_ADVICE}`;
  if (/[\s\p{Cc}]/u.test(token)) return `tenant tokens cannot contain whitespace or control characters`;
  if (new Set(token).size < MIN_TOKEN_DISTINCT_CHARS)
    return `this tenant token looks like a placeholder (fewer than ${MIN_TOKEN_DISTINCT_CHARS} distinct characters); ${TOKEN_ADVICE}`;
  return undefined;
}

export const TenantSchema = z
  .object({
    name: nameSchema('tenant name'),
    token: z
      .string()
      .superRefine((t, ctx) => {
        const problem = tokenProblem(t);
        if (problem !== undefined) ctx.addIssue({ code: 'custom', message: problem });
      })
      .optional(),
    tokenEnv: envName.optional(),
    tokenFile: hostAbsPath('tokenFile').optional(),
  })
  .strict()
  .superRefine((t, ctx) => {
    const given = [t.token, t.tokenEnv, t.tokenFile].filter((x) => x !== undefined).length;
    if (given !== 1) {
      ctx.addIssue({
        code: 'custom',
        message: `a tenant needs exactly one of token, tokenEnv or tokenFile (got ${given}); ${TOKEN_ADVICE}`,
      });
    }
  });
export type Tenant = z.output<typeof TenantSchema>;

export interface ListenAddress {
  host: string;
  port: number;
}

function parseListen(s: string): ListenAddress | { error: string } {
  const m = /^\[([^\]]+)\]:([0-9]{1,5})$/.exec(s) ?? /^([^:[\]]+):([0-9]{1,5})$/.exec(s);
  if (!m) return { error: `"${s}" is not host:port (e.g. 127.0.0.1:8787 or [::1]:8787)` };
  const host = m[1]!.toLowerCase();
  const port = Number(m[2]);
  if (port < 1 || port > 65_535) return { error: `port ${port} is not a TCP port (1-65535)` };
  const bracketed = s.startsWith('[');
  if (bracketed && isIP(host) !== 6) return { error: `"${host}" in brackets must be an IPv6 address` };
  if (!bracketed && isIP(host) === 0 && !/^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$/.test(host))
    return { error: `"${host}" is not a host name or IP address` };
  return { host, port };
}

export function isLoopbackHost(host: string): boolean {
  const h = host.toLowerCase();
  if (h === 'localhost' || h === '::1') return true;
  return isIP(h) === 4 && h.startsWith('127.');
}

const hostHeader = (host: string, port: number): string => `${isIP(host) === 6 ? `[${host}]` : host}:${port}`;

/** The Host header values accepted by default: the listen address, localhost and 127.0.0.1 on its port. */
export function defaultAllowedHosts(listen: ListenAddress): string[] {
  const hosts = [
    hostHeader(listen.host, listen.port),
    `localhost:${listen.port}`,
    `127.0.0.1:${listen.port}`,
  ];
  if (listen.host === '::1') hosts.push(`[::1]:${listen.port}`);
  return [...new Set(hosts)];
}

const allowedHost = z.string().transform((s, ctx) => {
  const h = s.toLowerCase();
  const withPort = /^\[[0-9a-f:.]+\]:[0-9]{1,5}$|^[a-z0-9.-]+:[0-9]{1,5}$/.test(h);
  const bare = /^\[[0-9a-f:.]+\]$|^[a-z0-9.-]+$/.test(h);
  if (!withPort && !bare) {
    ctx.addIssue({
      code: 'custom',
      message: `"${s}" is not a Host header value (host or host:port, IPv6 in brackets); wildcards are not supported`,
    });
    return z.NEVER;
  }
  return h;
});

const allowedOrigin = z.string().transform((s, ctx) => {
  const fail = (message: string) => {
    ctx.addIssue({ code: 'custom', message: `"${s}": ${message}` });
    return z.NEVER;
  };
  if (s === '*' || s === 'null')
    return fail('list exact origins; a wildcard or "null" would let any web page drive the gateway');
  let url: URL;
  try {
    url = new URL(s);
  } catch {
    return fail('is not an origin like https://app.example.com');
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') return fail('origins are http:// or https://');
  if (url.origin !== s.toLowerCase().replace(/\/$/, ''))
    return fail(`an origin is scheme://host[:port] only; did you mean ${url.origin}?`);
  return url.origin;
});

export const GatewayOptionsSchema = z
  .object({
    tenants: z
      .array(TenantSchema)
      .default([])
      .describe('Who may use the HTTP gateway: one bearer token per tenant. Required for HTTP.'),
    listen: z
      .string()
      .default('127.0.0.1:8787')
      .describe('host:port the HTTP gateway binds. Non-loopback hosts need allowNonLoopback: true.'),
    allowNonLoopback: z.boolean().default(false),
    allowedHosts: z
      .array(allowedHost)
      .optional()
      .describe('Host header values accepted (DNS-rebinding protection). Default: derived from listen.'),
    allowedOrigins: z
      .array(allowedOrigin)
      .default([])
      .describe(
        'Browser origins accepted; requests without an Origin header are not affected. Default: none.',
      ),
    relistIntervalMs: z
      .number()
      .int()
      .min(1000, 'relistIntervalMs must be at least 1000')
      .max(DAY_MS)
      .default(30_000)
      .describe('How often the gateway re-lists each server to catch changed definitions.'),
    lockfile: z
      .string()
      .min(1)
      .refine(noNul, 'lockfile must not contain NUL')
      .default('airlock.lock.json')
      .describe('Pinned definitions; a relative path is relative to the config file.'),
    budgets: BudgetsSchema.default({}).describe('Default per-session budgets for servers without their own.'),
    defaultBoundary: BoundarySchema.optional(),
  })
  .strict()
  .transform((o, ctx) => {
    const listen = parseListen(o.listen);
    if ('error' in listen) {
      ctx.addIssue({ code: 'custom', path: ['listen'], message: listen.error });
      return z.NEVER;
    }
    if (!isLoopbackHost(listen.host) && !o.allowNonLoopback) {
      ctx.addIssue({
        code: 'custom',
        path: ['listen'],
        message: `${o.listen} is not a loopback address; the gateway binds to loopback unless the config also says "allowNonLoopback": true`,
      });
      return z.NEVER;
    }
    const names = new Map<string, number>();
    const tokens = new Map<string, number>();
    for (const [i, t] of o.tenants.entries()) {
      const sameName = names.get(t.name);
      if (sameName !== undefined) {
        ctx.addIssue({
          code: 'custom',
          path: ['tenants', i, 'name'],
          message: `duplicate tenant name "${t.name}" (already used by tenants.${sameName})`,
        });
      } else names.set(t.name, i);
      if (t.token === undefined) continue;
      const sameToken = tokens.get(t.token);
      if (sameToken !== undefined) {
        ctx.addIssue({
          code: 'custom',
          path: ['tenants', i, 'token'],
          message: `this token is already used by tenants.${sameToken}; every tenant needs its own (${TOKEN_ADVICE})`,
        });
      } else tokens.set(t.token, i);
    }
    return { ...o, listen, allowedHosts: o.allowedHosts ?? defaultAllowedHosts(listen) };
  });
export type GatewayOptions = z.output<typeof GatewayOptionsSchema>;

// ---- the whole file -----------------------------------------------------------------------------

export const GatewayConfigSchema = z
  .object({
    mcpServers: z.preprocess(enabledOnly, z.record(nameSchema('server name'), ServerEntrySchema)),
    airlock: GatewayOptionsSchema.default(() => GatewayOptionsSchema.parse({})),
  })
  .loose() // the rest of a Claude Desktop config (globalShortcut, preferences, …) is not ours
  .superRefine((c, ctx) => {
    if (Object.keys(c.mcpServers).length === 0) {
      ctx.addIssue({ code: 'custom', path: ['mcpServers'], message: 'there is no enabled server to run' });
    }
    const seen = new Map<string, string>();
    for (const [name, entry] of Object.entries(c.mcpServers)) {
      // Refinements also run when a sibling entry already failed: read defensively.
      const ns = (entry as Partial<typeof entry> | undefined)?.airlock?.namespace ?? name;
      if (ns === false) continue;
      const other = seen.get(ns.toLowerCase());
      if (other !== undefined) {
        ctx.addIssue({
          code: 'custom',
          path: ['mcpServers', name, 'airlock', 'namespace'],
          message: `namespace "${ns}" is already used by server ${other}; give each server its own`,
        });
      } else seen.set(ns.toLowerCase(), name);
    }
  })
  .transform((c) => ({
    mcpServers: Object.fromEntries(
      Object.entries(c.mcpServers).map(([name, e]): [string, McpServerConfig] => [
        name,
        {
          name,
          command: e.command,
          args: e.args,
          env: e.env,
          ...(e.cwd !== undefined ? { cwd: e.cwd } : {}),
          airlock: { ...e.airlock, namespace: e.airlock.namespace ?? name },
        },
      ]),
    ),
    airlock: c.airlock,
  }));

/** A validated gateway config file (`mcpServers` plus the `airlock` block). */
export interface GatewayConfig {
  /** Enabled servers by name; `airlock.namespace` is resolved (the server name unless set). */
  mcpServers: Record<string, McpServerConfig>;
  /** Names of `disabled: true` entries (skipped, not validated). */
  disabledServers: string[];
  airlock: GatewayOptions;
  /** Where the config came from (file path), when loaded from a file. */
  source?: string;
}

function mcpConfigError(e: unknown): never {
  if (AirlockError.is(e, 'INVALID_SPEC') || AirlockError.is(e, 'INVALID_ARGUMENT')) {
    throw new AirlockError('MCP_INVALID_CONFIG', e.message, { field: e.field, cause: e });
  }
  throw e;
}

export interface ParseGatewayConfigOptions {
  /** Names the input in errors (the file path). */
  source?: string;
  /** A relative `airlock.lockfile` is resolved against this directory (the config file's). */
  baseDir?: string;
}

/** Validate a parsed config object. Errors are MCP_INVALID_CONFIG naming the field. */
export function parseGatewayConfig(input: unknown, opts: ParseGatewayConfigOptions = {}): GatewayConfig {
  const what = opts.source === undefined ? 'gateway config' : `gateway config ${opts.source}`;
  let parsed: z.output<typeof GatewayConfigSchema>;
  try {
    parsed = parseOrThrow(GatewayConfigSchema, input, what);
  } catch (e) {
    mcpConfigError(e);
  }
  const raw = (input as { mcpServers?: unknown }).mcpServers;
  const disabledServers =
    typeof raw === 'object' && raw !== null
      ? Object.entries(raw)
          .filter(([, v]) => isDisabled(v))
          .map(([k]) => k)
      : [];
  const lockfile =
    opts.baseDir !== undefined ? resolve(opts.baseDir, parsed.airlock.lockfile) : parsed.airlock.lockfile;
  return {
    mcpServers: parsed.mcpServers,
    disabledServers,
    airlock: { ...parsed.airlock, lockfile },
    ...(opts.source !== undefined ? { source: opts.source } : {}),
  };
}

/** Validate sandbox options built from `airlock mcp` flags. */
export function parseMcpSandboxOptions(input: unknown, what = 'MCP sandbox options'): McpSandboxOptions {
  try {
    return parseOrThrow(McpSandboxOptionsSchema, input ?? {}, what);
  } catch (e) {
    mcpConfigError(e);
  }
}

const EXPECTED_SHAPE =
  'Airlock expects a top-level "mcpServers" object (the Claude Desktop / Cursor format) mapping each ' +
  'server name to { "command", "args", "env" }, e.g. {"mcpServers": {"fs": {"command": "npx", "args": ["-y", "<package>"]}}}';

/** What to write instead when a config has no "mcpServers": a hint for files written for other clients. */
function missingServersHint(data: Record<string, unknown>): string {
  if (Object.hasOwn(data, 'servers')) {
    return (
      'it has a "servers" key (the VS Code .vscode/mcp.json format); rename "servers" to "mcpServers". ' +
      'Each entry keeps "command", "args" and "env"; VS Code\'s "type" and "inputs" are not used, and ' +
      '"${input:…}" variables are not substituted (give real values or use airlock secrets). ' +
      EXPECTED_SHAPE
    );
  }
  const mcp = data['mcp'];
  if (typeof mcp === 'object' && mcp !== null && Object.hasOwn(mcp, 'servers')) {
    return (
      'it has "mcp.servers" (the VS Code settings.json format); move that object to a top-level "mcpServers". ' +
      EXPECTED_SHAPE
    );
  }
  return `it has no "mcpServers" key. ${EXPECTED_SHAPE}`;
}

const CONFIG_FILE = {
  what: 'gateway config',
  code: 'MCP_INVALID_CONFIG',
  maxBytes: MAX_CONFIG_FILE_BYTES,
} as const satisfies ConfigFileOptions;

/**
 * Read and validate a gateway config: YAML for .yaml / .yml, JSON for .json (other names: by content).
 * A file without "mcpServers" gets a hint naming the format it looks like (VS Code's "servers").
 */
export function loadGatewayConfig(path: string): GatewayConfig {
  const data = readConfigData(path, CONFIG_FILE);
  if (typeof data !== 'object' || data === null || Array.isArray(data)) {
    throw new AirlockError(
      'MCP_INVALID_CONFIG',
      `invalid gateway config ${path}: expected an object with "mcpServers". ${EXPECTED_SHAPE}`,
    );
  }
  if (!Object.hasOwn(data, 'mcpServers')) {
    throw new AirlockError(
      'MCP_INVALID_CONFIG',
      `invalid gateway config ${path} at mcpServers: ${missingServersHint(data as Record<string, unknown>)}`,
      { field: 'mcpServers' },
    );
  }
  return parseGatewayConfig(data, { source: path, baseDir: dirname(resolve(path)) });
}

function readError(e: unknown, what: string): AirlockError {
  if (AirlockError.isInstance(e)) return e;
  const code = (e as NodeJS.ErrnoException).code;
  if (code === 'ENOENT') return new AirlockError('FILE_NOT_FOUND', `${what} not found`, { cause: e });
  if (code === 'EACCES' || code === 'EPERM')
    return new AirlockError('PERMISSION_DENIED', `cannot read ${what}: permission denied`, { cause: e });
  return new AirlockError('MCP_INVALID_CONFIG', `cannot read ${what}: ${(e as Error).message}`, { cause: e });
}

// ---- helpers for the gateway --------------------------------------------------------------------

/** A server's boundary: its own, else the gateway default, else per-session over HTTP and per-server over stdio. */
export function effectiveBoundary(
  server: Pick<McpServerConfig, 'airlock'>,
  transport: GatewayTransport,
  gateway?: Pick<GatewayOptions, 'defaultBoundary'>,
): Boundary {
  return (
    server.airlock.boundary ??
    gateway?.defaultBoundary ??
    (transport === 'http' ? 'per-session' : 'per-server')
  );
}

/** A server's budgets: the gateway defaults, overridden field by field by the server's own. */
export function effectiveBudgets(
  server: Pick<McpServerConfig, 'airlock'>,
  gateway: Pick<GatewayOptions, 'budgets'>,
): Budgets {
  const own = Object.fromEntries(
    Object.entries(server.airlock.budgets ?? {}).filter(([, v]) => v !== undefined),
  );
  return { ...gateway.budgets, ...own };
}

/** The HTTP gateway authenticates every request: refuse to start without a tenant. */
export function requireTenants(config: Pick<GatewayConfig, 'airlock'> & { source?: string }): void {
  if (config.airlock.tenants.length > 0) return;
  const where = config.source === undefined ? 'the gateway config' : config.source;
  throw new AirlockError(
    'MCP_INVALID_CONFIG',
    `the HTTP gateway needs at least one tenant: add "airlock": { "tenants": [{ "name": "me", "tokenEnv": "AIRLOCK_TOKEN" }] } to ${where} (tokens are at least ${MIN_TOKEN_CHARS} characters; ${TOKEN_ADVICE})`,
    { field: 'airlock.tenants' },
  );
}

export interface ResolvedTenant {
  name: string;
  token: string;
}

/**
 * Each tenant's bearer token: inline, from the environment (`tokenEnv`) or from a file (`tokenFile`,
 * trimmed; refused when other users can read or write it). Resolved tokens get the same checks as inline
 * ones, and no two tenants may share one.
 */
export function resolveTenants(
  config: Pick<GatewayConfig, 'airlock'>,
  env: Readonly<Record<string, string | undefined>> = process.env,
): ResolvedTenant[] {
  const out: ResolvedTenant[] = [];
  const byToken = new Map<string, string>();
  for (const [i, t] of config.airlock.tenants.entries()) {
    let field = `airlock.tenants.${i}.token`;
    let token: string;
    if (t.token !== undefined) token = t.token;
    else if (t.tokenEnv !== undefined) {
      field = `airlock.tenants.${i}.tokenEnv`;
      const v = env[t.tokenEnv];
      if (v === undefined || v === '') {
        throw new AirlockError(
          'MCP_INVALID_CONFIG',
          `tenant ${t.name}: environment variable ${t.tokenEnv} is not set (${TOKEN_ADVICE})`,
          { field },
        );
      }
      token = v.trim();
    } else {
      field = `airlock.tenants.${i}.tokenFile`;
      token = readTokenFile(t.tokenFile!, t.name, field);
    }
    const problem = tokenProblem(token);
    if (problem !== undefined)
      throw new AirlockError('MCP_INVALID_CONFIG', `tenant ${t.name}: ${problem}`, { field });
    const other = byToken.get(token);
    if (other !== undefined) {
      throw new AirlockError(
        'MCP_INVALID_CONFIG',
        `tenant ${t.name} has the same token as tenant ${other}; every tenant needs its own (${TOKEN_ADVICE})`,
        { field },
      );
    }
    byToken.set(token, t.name);
    out.push({ name: t.name, token });
  }
  return out;
}

function readTokenFile(path: string, tenant: string, field: string): string {
  let text: string;
  try {
    const st = statSync(path);
    if (!st.isFile())
      throw new AirlockError('MCP_INVALID_CONFIG', `tenant ${tenant}: tokenFile ${path} is not a file`, {
        field,
      });
    if ((st.mode & 0o007) !== 0) {
      throw new AirlockError(
        'MCP_INVALID_CONFIG',
        `tenant ${tenant}: tokenFile ${path} is accessible by other users; chmod 600 ${path}`,
        { field },
      );
    }
    if (st.size > MAX_TOKEN_FILE_BYTES)
      throw new AirlockError('MCP_INVALID_CONFIG', `tenant ${tenant}: tokenFile ${path} is too large`, {
        field,
      });
    text = readFileSync(path, 'utf8');
  } catch (e) {
    throw readError(e, `tokenFile ${path} of tenant ${tenant}`);
  }
  return text.trim();
}
