// The supervisor (issue 36): one detached process per state dir that owns an Airlock, and so every
// live sandbox with its egress proxy and secrets, and serves the native REST API on a unix socket in
// the state dir. It is the containerd-shim half of `airlock serve`: the front server (API keys,
// tenants, quotas) can be restarted or killed without touching a sandbox, because sandboxes are
// children of this process, not of the front server.
//
// Fail closed: sandboxes die with the supervisor (bwrap --die-with-parent, runsc's pdeathsig), and a
// new supervisor reaps what is left (Airlock.reapOrphans) before it answers. Its boot id changes
// with every start, so a client can tell that every sandbox of the old one is gone.
//
// The socket trusts its client completely (the Caller it is given): it is mode 0600 and owned by
// root, inside the state dir. Only one supervisor serves a state dir: it holds an abstract unix
// socket named after the state dir as a lock, which the kernel releases when the process dies (no
// stale lock file to guess about). See docs/server.md and docs/threat-model.md.
import { randomUUID, createHash } from 'node:crypto';
import { chmodSync, mkdirSync, rmSync } from 'node:fs';
import { createServer, type Server } from 'node:net';
import type { Server as HttpServer } from 'node:http';
import { createAdaptorServer } from '@hono/node-server';
import { attachPortRoute } from './port-route.js';
import type { Caller } from './contract.js';
import { Hono } from 'hono';
import type { Logger } from '../core/backend.js';
import { AirlockError } from '../core/errors.js';
import { Airlock, type AirlockOptions } from '../sandbox/airlock.js';
import { LocalSandboxApi } from './local.js';
import { mcpSupervisorRoutes } from './mcp-supervisor.js';
import { nativeRoutes } from './routes.js';
import { supervisorPaths, type SupervisorInfo } from './supervisor-client.js';

export interface SupervisorOptions {
  readonly stateDir: string;
  readonly uidRange?: AirlockOptions['uidRange'];
  readonly logger?: Logger;
  /** Largest request body or upload the socket accepts (default 1 GiB: the front server caps first). */
  readonly maxBodyBytes?: number;
}

export interface RunningSupervisor {
  readonly info: SupervisorInfo;
  readonly socketPath: string;
  readonly airlock: Airlock;
  /** Stop serving, kill every sandbox, release the socket and the lock. */
  close(): Promise<void>;
}

/** Take the state dir's lock; throws if another live supervisor holds it. */
function lock(stateDir: string): Promise<Server> {
  // An abstract socket (leading NUL): no file, released by the kernel when this process dies.
  const name = `\0airlock-supervisor-${createHash('sha256').update(stateDir).digest('hex').slice(0, 32)}`;
  return new Promise((resolve, reject) => {
    const srv = createServer((c) => c.destroy());
    srv.once('error', (e: NodeJS.ErrnoException) =>
      reject(
        e.code === 'EADDRINUSE'
          ? new AirlockError(
              'INVALID_ARGUMENT',
              `another airlock supervisor already serves ${stateDir}; stop it first (its pid: GET /v1/supervisor on ${supervisorPaths(stateDir).socket})`,
            )
          : e,
      ),
    );
    srv.listen(name, () => resolve(srv));
  });
}

/** Start a supervisor in this process: lock, reap orphans, then serve on <stateDir>/supervisor.sock. */
export async function startSupervisor(o: SupervisorOptions): Promise<RunningSupervisor> {
  mkdirSync(o.stateDir, { recursive: true, mode: 0o700 });
  const held = await lock(o.stateDir);
  const { socket } = supervisorPaths(o.stateDir);
  let airlock: Airlock | undefined;
  try {
    airlock = new Airlock({
      stateDir: o.stateDir,
      ...(o.uidRange ? { uidRange: o.uidRange } : {}),
      ...(o.logger ? { logger: o.logger } : {}),
    });
    // Whatever a dead supervisor left (its sandboxes died with it) goes before we answer anyone.
    await airlock.reapOrphans();
    const info: SupervisorInfo = {
      bootId: randomUUID(),
      pid: process.pid,
      startedAt: new Date().toISOString(),
    };
    const app = new Hono();
    app.get('/v1/supervisor', (c) => c.json(info));
    const local = new LocalSandboxApi(airlock);
    // The socket's only client is the front server (root), which scopes tenants itself.
    const trusted = (): Caller => ({ tenant: 'supervisor' });
    // The sandboxes of the front server's /mcp gateway (their servers' files bound read-only).
    app.route('/', mcpSupervisorRoutes(airlock));
    app.route(
      '/',
      nativeRoutes(local, {
        caller: trusted,
        maxBodyBytes: o.maxBodyBytes ?? 1024 ** 3,
        maxUploadBytes: o.maxBodyBytes ?? 1024 ** 3,
        // The front server applies the operator's policy before a request gets here.
        allowPrivateNetwork: true,
      }),
    );
    // We hold the lock, so a socket file here is a dead supervisor's.
    rmSync(socket, { force: true });
    const server = await listenPrivate(app, socket);
    // Raw TCP into a sandbox's port (preview URLs): the front server asks after checking the token.
    attachPortRoute(server, { api: local, caller: trusted });
    let closing: Promise<void> | undefined;
    const rt = airlock;
    return {
      info,
      socketPath: socket,
      airlock: rt,
      close: () =>
        (closing ??= (async () => {
          await new Promise<void>((r) => {
            server.close(() => r());
            server.closeAllConnections();
          });
          await rt.close().catch(() => {});
          rmSync(socket, { force: true });
          await new Promise<void>((r) => held.close(() => r()));
        })()),
    };
  } catch (e) {
    await airlock?.close().catch(() => {});
    held.close();
    throw e;
  }
}

/** Serve `app` on a unix socket created mode 0600 (the umask is set around the bind: no window). */
function listenPrivate(app: Hono, path: string): Promise<HttpServer> {
  return new Promise((resolve, reject) => {
    const server = createAdaptorServer({ fetch: app.fetch }) as HttpServer;
    server.once('error', reject);
    const old = process.umask(0o177);
    try {
      server.listen(path, () => {
        chmodSync(path, 0o600); // belt and braces: the umask already made it so
        resolve(server);
      });
    } finally {
      process.umask(old);
    }
  });
}
