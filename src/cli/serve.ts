// `airlock serve` (the front server) and `airlock supervisor` (the hidden per-state-dir process that
// owns the sandboxes): see src/server/front.ts, src/server/supervisor.ts and docs/server.md.
import { readFileSync } from 'node:fs';
import { AirlockError } from '../core/errors.js';
import { loadConfigFile } from '../core/config-file.js';
import { DEFAULT_STATE_DIR } from '../sandbox/airlock.js';
import { dirname, resolve } from 'node:path';
import { parseListen } from '../server/auth.js';
import { ServerConfigSchema, startFront, type ServerConfig } from '../server/front.js';
import type { Store } from '../server/store.js';
import { startSupervisor } from '../server/supervisor.js';
import type { Io } from './defaults.js';
import { uidRangeFromEnv } from './flags.js';

export interface ServeFlags {
  listen?: string;
  config?: string;
  stateDir?: string;
  tlsCert?: string;
  tlsKey?: string;
  insecureListen?: boolean;
  /** A gateway config (mcpServers) served at /mcp (overrides the server config's mcpConfig). */
  mcpConfig?: string;
  /** Create a first API key (tenant "default") if the server has none, and print how to use it. */
  firstKey?: boolean;
}

export function stateDirOf(flag: string | undefined, config?: ServerConfig): string {
  return flag ?? config?.stateDir ?? process.env.AIRLOCK_STATE_DIR ?? DEFAULT_STATE_DIR;
}

/** The argv that runs this very CLI (node + its loader flags + the script), for the supervisor. */
function selfCommand(): string[] {
  return [process.execPath, ...process.execArgv, process.argv[1]!];
}

/** How long `airlock serve` may take to stop after SIGINT/SIGTERM before it exits regardless. */
const STOP_GRACE_MS = 10_000;

/** Resolves on the first SIGINT/SIGTERM with the status to exit with (130/143). */
function untilSignal(): Promise<number> {
  // process.on, not once: a handler must stay registered while the shutdown runs, or the library's
  // exit sweep (exit-release.privileged.ts) sees no application handler and re-raises the signal.
  return new Promise((resolve) => {
    process.on('SIGINT', () => resolve(130));
    process.on('SIGTERM', () => resolve(143));
  });
}

export async function serveCommand(flags: ServeFlags, io: Io): Promise<number> {
  const config = flags.config
    ? loadConfigFile(flags.config, ServerConfigSchema, {
        what: 'server config',
        code: 'INVALID_ARGUMENT',
        maxBytes: 1024 ** 2,
      })
    : ServerConfigSchema.parse({});
  const stateDir = stateDirOf(flags.stateDir, config);
  const listen = parseListen(flags.listen ?? config.listen ?? '127.0.0.1:7070');
  const certPath = flags.tlsCert ?? config.tls?.cert;
  const keyPath = flags.tlsKey ?? config.tls?.key;
  if ((certPath === undefined) !== (keyPath === undefined)) {
    throw new AirlockError('INVALID_ARGUMENT', 'give both --tls-cert and --tls-key, or neither', {
      field: 'tls',
    });
  }
  const tls =
    certPath && keyPath
      ? { cert: readFileSync(certPath, 'utf8'), key: readFileSync(keyPath, 'utf8') }
      : undefined;
  // A relative mcpConfig in the server config is relative to that file (as the gateway's lockfile).
  const mcpPath =
    flags.mcpConfig ??
    (config.mcpConfig !== undefined
      ? resolve(dirname(resolve(flags.config ?? '.')), config.mcpConfig)
      : undefined);
  // Loaded only when asked for: the gateway and the MCP SDK are not start-up cost otherwise.
  const mcp =
    mcpPath !== undefined ? (await import('../server/mcp.js')).loadServeMcpConfig(mcpPath) : undefined;
  const stop = untilSignal();
  const front = await startFront({
    stateDir,
    listen,
    config,
    ...(tls ? { tls } : {}),
    insecureListen: flags.insecureListen === true || config.insecureListen === true,
    supervisorCommand: selfCommand(),
    ...(mcp ? { mcp } : {}),
  });
  io.out(`airlock serve: listening on ${front.url} (state ${stateDir})\n`);
  if (mcp) {
    const n = Object.keys(mcp.gateway.mcpServers).length;
    io.out(`airlock serve: MCP gateway (${n} server${n === 1 ? '' : 's'}) at ${front.url}/mcp\n`);
  }
  if (flags.firstKey) io.out(firstKeyBanner(front.url, front.store));
  const status = await stop;
  // The stop is bounded: a request still waiting on the supervisor (a create under load) must not
  // keep the process alive after its listener closed. Sandboxes belong to the supervisor, so
  // exiting loses none; the timer is unref'd and fires only if something still holds the loop.
  const exitStatus = status === 143 ? 0 : status; // SIGTERM is how systemd stops a service: exit 0
  setTimeout(() => {
    io.err(`airlock serve: still busy ${STOP_GRACE_MS} ms after the stop signal; exiting now\n`);
    process.exit(exitStatus);
  }, STOP_GRACE_MS).unref();
  await front.close();
  return exitStatus;
}

export async function supervisorCommand(flags: { stateDir?: string }, io: Io): Promise<number> {
  if (process.getuid?.() !== 0) {
    throw new AirlockError('PERMISSION_DENIED', 'airlock supervisor runs sandboxes and must run as root');
  }
  const stateDir = stateDirOf(flags.stateDir);
  const uidRange = uidRangeFromEnv(process.env.AIRLOCK_UID_RANGE);
  const stop = untilSignal();
  const sup = await startSupervisor({ stateDir, ...(uidRange ? { uidRange } : {}) });
  io.out(
    `${new Date().toISOString()} airlock supervisor: boot ${sup.info.bootId} pid ${process.pid} serving ${sup.socketPath}\n`,
  );
  const status = await stop;
  // Stopping the supervisor ends every sandbox it owns (they cannot outlive it; see docs/server.md).
  await sup.close();
  io.out(`${new Date().toISOString()} airlock supervisor: stopped (boot ${sup.info.bootId})\n`);
  return status === 143 ? 0 : status;
}

/**
 * `airlock serve --first-key` (the README's main job): a first API key when the server has none
 * (shown once; keys are stored hashed), and how each client reaches the server.
 */
function firstKeyBanner(url: string, store: Store): string {
  if (store.listKeys().some((k) => k.revoked === null)) {
    return `API keys exist already (airlock keys list); make another with: airlock keys create --tenant NAME\n`;
  }
  const { key } = store.createKey('default');
  const env = `AIRLOCK_API_URL=${url} AIRLOCK_API_KEY=${key}`;
  return [
    '',
    `A first API key, for tenant "default" (shown only now; stored hashed): ${key}`,
    '',
    'Point a client at this server:',
    `  e2b SDK (unchanged):    export E2B_API_URL=${url}/e2b E2B_SANDBOX_URL=${url}/e2b/envd E2B_API_KEY=${key}`,
    `  TypeScript SDK and CLI: export ${env}   (RemoteAirlock; airlock ps|create|exec|kill)`,
    `  Python SDK:             pip install ./python, then the same two variables`,
    '',
    'Try it (another shell, in this checkout):',
    `  ${env} python3 -c "import sys; sys.path.insert(0, 'python'); from airlock_sandbox import Sandbox; s = Sandbox.create(); print(s.exec('uname -a').stdout, end=''); s.kill()"`,
    '',
    'Stop the server with Ctrl-C (its supervisor keeps the sandboxes; see docs/server.md).',
    '',
  ].join('\n');
}
