// The native route to a sandbox's port: GET /v1/sandboxes/:id/ports/:port with
// `Connection: Upgrade` and `Upgrade: airlock-tcp`. After `101 Switching Protocols` the connection
// is a raw duplex to 127.0.0.1:<port> inside the sandbox (SandboxApi.connectPort); before it, an
// error is the usual JSON body with httpStatusFor's status (e.g. 502 PORT_UNREACHABLE, 404
// SANDBOX_NOT_FOUND). The front server reaches the supervisor's sandboxes through it (over the
// unix socket, server/port-client.ts), and a remote client its own sandboxes (with its API key).
// Hono cannot hand a route an upgrade's raw socket, so this hooks the node:http server
// (server/upgrade.ts); portRouteFallback() answers the same path without the upgrade (426).
import type { IncomingMessage, Server } from 'node:http';
import type { Duplex } from 'node:stream';
import type { Context } from 'hono';
import { AirlockError } from '../core/errors.js';
import type { Caller, SandboxApi } from './contract.js';
import { claimRequests, errorBody, rejectRaw, type Claimer } from './upgrade.js';

/** The Upgrade token of the port route. */
export const PORT_UPGRADE = 'airlock-tcp';
/** The route's path pattern (Hono syntax), for routes.ts and the OpenAPI document. */
export const PORT_ROUTE = '/v1/sandboxes/:id/ports/:port';

const PATH = /^\/v1\/sandboxes\/([^/?#]{1,200})\/ports\/([^/?#]{1,10})$/;

export interface PortRouteOptions {
  readonly api: Pick<SandboxApi, 'connectPort'>;
  /**
   * Who is asking (the front server: from the API key, throwing UNAUTHORIZED; the supervisor: its
   * one trusted client).
   */
  readonly caller: (req: IncomingMessage) => Caller | Promise<Caller>;
}

/** Serve the port route's upgrades on `server` (one line beside serving nativeRoutes). */
export function attachPortRoute(server: Server, opts: PortRouteOptions): void {
  claimRequests(server, portClaimer(opts));
}

/** The claimer behind attachPortRoute. */
export function portClaimer(opts: PortRouteOptions): Claimer {
  return {
    upgrade: (req) => {
      if ((req.headers.upgrade ?? '').toLowerCase() !== PORT_UPGRADE) return undefined;
      const m = PATH.exec(req.url ?? '');
      if (!m) return undefined;
      return (r, socket, head) => void serve(opts, r, socket, head, m[1]!, m[2]!);
    },
  };
}

/** Parse the :port segment: decimal 1-65535, no sign, no leading zero. */
export function parsePortSegment(s: string): number {
  const n = /^[1-9][0-9]{0,4}$/.test(s) ? Number(s) : NaN;
  if (!(n <= 65535)) {
    throw new AirlockError('INVALID_ARGUMENT', `port must be a number from 1 to 65535, not "${s}"`, {
      field: 'port',
    });
  }
  return n;
}

async function serve(
  opts: PortRouteOptions,
  req: IncomingMessage,
  socket: Duplex,
  head: Buffer,
  rawId: string,
  rawPort: string,
): Promise<void> {
  const gone = new AbortController();
  socket.on('error', () => {});
  socket.on('close', () => gone.abort());
  let conn: Duplex;
  try {
    if (req.method !== 'GET') throw new AirlockError('INVALID_ARGUMENT', 'the port route takes GET only');
    const port = parsePortSegment(rawPort);
    let id: string;
    try {
      id = decodeURIComponent(rawId);
    } catch {
      throw new AirlockError('SANDBOX_NOT_FOUND', 'no such sandbox');
    }
    const caller = await opts.caller(req);
    if (!opts.api.connectPort) {
      throw new AirlockError('BACKEND_UNAVAILABLE', 'this server cannot connect to sandbox ports');
    }
    conn = await opts.api.connectPort(id, port, caller, gone.signal);
  } catch (e) {
    rejectRaw(socket, e);
    return;
  }
  if (gone.signal.aborted) {
    conn.destroy();
    return;
  }
  socket.write(`HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: ${PORT_UPGRADE}\r\n\r\n`);
  const close = (): void => {
    conn.destroy();
    socket.destroy();
  };
  conn.on('error', close);
  conn.on('close', close);
  socket.on('close', close);
  if (head.length) conn.write(head); // bytes the client sent right behind its request
  socket.pipe(conn);
  conn.pipe(socket);
}

/**
 * The same path reached without the upgrade (Hono route handler for routes.ts): 426 with a body
 * that says what to send.
 */
export function portRouteFallback(c: Context): Response {
  return c.json(
    errorBody(
      new AirlockError(
        'INVALID_ARGUMENT',
        `this route needs "Connection: Upgrade" and "Upgrade: ${PORT_UPGRADE}"; the connection is then a raw TCP stream to the port`,
      ),
    ),
    426,
    { upgrade: PORT_UPGRADE },
  );
}
