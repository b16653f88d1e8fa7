// HTTP upgrades (and the plain requests of preview hosts) taken off a node:http server before its
// Hono app sees them. Hono cannot hand a route the raw socket of an upgrade, so the raw pieces
// (preview WebSockets, the airlock-tcp port route) hook the server itself: one dispatcher per server
// asks each claimer in turn; a request nobody claims goes on as before (Hono's own WebSocket
// listener, if any), and an upgrade that no listener at all would take is answered 400, never left
// hanging with its socket open.
import type { IncomingMessage, Server, ServerResponse } from 'node:http';
import { STATUS_CODES } from 'node:http';
import type { Duplex } from 'node:stream';
import { AirlockError, httpStatusFor } from '../core/errors.js';

/** Takes over an upgrade (it owns `socket` from then on). */
export type UpgradeHandler = (req: IncomingMessage, socket: Duplex, head: Buffer) => void;
/** Takes over a plain request. */
export type RequestHandler = (req: IncomingMessage, res: ServerResponse) => void;

/** Decides, synchronously, whether a request is its own: a handler, or undefined (not mine). */
export interface Claimer {
  upgrade?(req: IncomingMessage): UpgradeHandler | undefined;
  request?(req: IncomingMessage): RequestHandler | undefined;
}

const dispatchers = new WeakMap<Server, Claimer[]>();

/**
 * Add `claimer` to `server` (the first call per server installs the dispatcher: the server's
 * existing 'request' listeners, e.g. the Hono app, then only see what no claimer takes).
 */
export function claimRequests(server: Server, claimer: Claimer): void {
  const known = dispatchers.get(server);
  if (known) {
    known.push(claimer);
    return;
  }
  const claimers = [claimer];
  dispatchers.set(server, claimers);
  const others = server.listeners('request') as RequestHandler[];
  server.removeAllListeners('request');
  server.on('request', (req: IncomingMessage, res: ServerResponse) => {
    for (const c of claimers) {
      const h = c.request?.(req);
      if (h) return h(req, res);
    }
    for (const l of others) l.call(server, req, res);
  });
  const onUpgrade = (req: IncomingMessage, socket: Duplex, head: Buffer): void => {
    for (const c of claimers) {
      const h = c.upgrade?.(req);
      if (h) return h(req, socket, head);
    }
    // Nobody here wants it: another listener may (Hono's WebSockets); with none, refuse it now.
    if (server.listenerCount('upgrade') === 1) {
      rejectRaw(socket, new AirlockError('INVALID_ARGUMENT', 'this server takes no such upgrade'));
    }
  };
  server.on('upgrade', onUpgrade);
}

/** The error body every route answers: { error: { code, message, field? } }. */
export function errorBody(e: unknown): { error: { code: string; message: string; field?: string } } {
  if (AirlockError.isInstance(e)) return { error: e.toJSON() };
  return { error: { code: 'INTERNAL', message: 'internal error' } };
}

/** Answer `e` on a plain request (if nothing was sent yet; else cut the response off). */
export function sendError(res: ServerResponse, e: unknown): void {
  if (res.headersSent) {
    res.destroy();
    return;
  }
  const body = JSON.stringify(errorBody(e));
  res.writeHead(httpStatusFor(e), {
    'content-type': 'application/json',
    'content-length': Buffer.byteLength(body),
  });
  res.end(body);
}

/** Answer `e` as a raw HTTP/1.1 response on an upgrade's socket, then close it. */
export function rejectRaw(socket: Duplex, e: unknown, extra: Record<string, string> = {}): void {
  if (socket.destroyed) return;
  const status = httpStatusFor(e);
  const body = JSON.stringify(errorBody(e));
  const head = [
    `HTTP/1.1 ${status} ${STATUS_CODES[status] ?? ''}`,
    'connection: close',
    'content-type: application/json',
    `content-length: ${Buffer.byteLength(body)}`,
    ...Object.entries(extra).map(([k, v]) => `${k}: ${v}`),
  ];
  socket.on('error', () => {});
  socket.end(`${head.join('\r\n')}\r\n\r\n${body}`);
}
