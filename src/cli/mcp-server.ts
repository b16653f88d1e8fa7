// `airlock mcp-server`: Airlock itself as an MCP server (src/adapters/mcp-server/), on stdio (one
// session: this process's stdin/stdout, the protocol only) or Streamable HTTP on loopback with a
// bearer token (AIRLOCK_MCP_TOKEN, or a fresh one printed on stderr). Every session's sandboxes are
// killed when it ends, and all of them when this process stops.
import { randomBytes } from 'node:crypto';
import { AirlockError } from '../core/errors.js';
import { BACKEND_NAMES, type BackendName } from '../core/spec.js';
import { parseDurationMs } from '../core/units.js';
import type { AirlockMcpServerOptions } from '../adapters/mcp-server/session.js';
import { McpHttpServer } from '../adapters/mcp-server/http.js';
import { serveMcpStdio } from '../adapters/mcp-server/stdio.js';
import type { Io } from './defaults.js';
import { cliAirlock, trapSignals } from './lifecycle.js';

/** Flags of `airlock mcp-server`. */
export interface McpServerFlags {
  http?: string;
  backend?: string;
  ttl?: string;
  maxSandboxes?: string;
}

function serverOptions(
  f: McpServerFlags,
  runtime: AirlockMcpServerOptions['runtime'],
): AirlockMcpServerOptions {
  if (f.backend !== undefined && !(BACKEND_NAMES as readonly string[]).includes(f.backend)) {
    throw new AirlockError('INVALID_ARGUMENT', `--backend: one of ${BACKEND_NAMES.join(', ')}`, {
      field: '--backend',
    });
  }
  const max = f.maxSandboxes === undefined ? undefined : Number(f.maxSandboxes);
  if (max !== undefined && (!Number.isInteger(max) || max < 1 || max > 64)) {
    throw new AirlockError('INVALID_ARGUMENT', '--max-sandboxes: an integer from 1 to 64', {
      field: '--max-sandboxes',
    });
  }
  return {
    runtime,
    ...(f.backend !== undefined ? { backend: f.backend as BackendName } : {}),
    ...(f.ttl !== undefined ? { ttlMs: parseDurationMs(f.ttl, '--ttl') } : {}),
    ...(max !== undefined ? { maxSandboxes: max } : {}),
  };
}

/** HOST:PORT of --http (IPv6 in brackets). */
function hostPort(text: string): { host: string; port: number } {
  const m = /^(?:\[(.+)\]|([^:]+)):(\d{1,5})$/.exec(text);
  const port = m ? Number(m[3]) : NaN;
  if (!m || port > 65535) {
    throw new AirlockError('INVALID_ARGUMENT', `--http: "${text}" is not HOST:PORT, e.g. 127.0.0.1:8765`, {
      field: '--http',
    });
  }
  return { host: m[1] ?? m[2]!, port };
}

export async function mcpServerCommand(f: McpServerFlags, io: Io): Promise<number> {
  const listen = f.http === undefined ? undefined : hostPort(f.http);
  const envToken = process.env.AIRLOCK_MCP_TOKEN;
  if (listen && envToken !== undefined && envToken.length < 16) {
    throw new AirlockError('INVALID_ARGUMENT', 'AIRLOCK_MCP_TOKEN must be at least 16 characters', {
      field: 'AIRLOCK_MCP_TOKEN',
    });
  }
  const airlock = cliAirlock();
  const opts = serverOptions(f, airlock);
  const trap = trapSignals(airlock, (l) => io.err(`${l}\n`));
  try {
    if (!listen) {
      await serveMcpStdio(opts, process.stdin, process.stdout, trap.signal);
      return trap.exitCode ?? 0;
    }
    const token = envToken ?? randomBytes(24).toString('base64url');
    const server = new McpHttpServer({ ...opts, ...listen, token });
    const where = await server.listen();
    io.err(`airlock mcp-server: ${where.url}\n`);
    if (envToken === undefined)
      io.err(`airlock mcp-server: token ${token} (send Authorization: Bearer <token>)\n`);
    await new Promise<void>((r) => trap.signal.addEventListener('abort', () => r(), { once: true }));
    await server.close();
    return trap.exitCode ?? 0;
  } finally {
    await airlock.killAll();
    trap.dispose();
  }
}
