// Bearer-key authentication and the listen-address rule of the front server (issue 36).
import { isIP } from 'node:net';
import type { MiddlewareHandler } from 'hono';
import { AirlockError, httpStatusFor } from '../core/errors.js';
import type { Store } from './store.js';

/** Hono context variables the front server sets. */
export interface FrontEnv {
  Variables: { tenant: string; keyId: string };
}

/** The JSON error body every route answers with (same shape as nativeRoutes'). */
export function errorResponse(e: AirlockError, headers: Record<string, string> = {}): Response {
  return new Response(JSON.stringify({ error: e.toJSON() }), {
    status: httpStatusFor(e),
    headers: { 'content-type': 'application/json', ...headers },
  });
}

/**
 * `Authorization: Bearer <key>` → the key's tenant in c.var.tenant; anything else (missing, malformed,
 * unknown, revoked) is the same 401, so the answer says nothing about which keys exist.
 */
export function bearerAuth(store: Store): MiddlewareHandler<FrontEnv> {
  return async (c, next) => {
    const h = c.req.header('authorization') ?? '';
    const m = /^Bearer\s+(\S+)\s*$/i.exec(h);
    const who = m ? store.verifyKey(m[1]!) : undefined;
    if (!who) {
      return errorResponse(
        new AirlockError(
          'UNAUTHORIZED',
          'missing, unknown or revoked API key: send "Authorization: Bearer <key>" (create one with airlock keys create --tenant NAME)',
        ),
        { 'www-authenticate': 'Bearer' },
      );
    }
    c.set('tenant', who.tenant);
    c.set('keyId', who.id);
    await next();
  };
}

export interface ListenAddress {
  readonly host: string;
  readonly port: number;
}

/** "HOST:PORT", "[V6]:PORT" or ":PORT"/"PORT" (loopback). */
export function parseListen(s: string): ListenAddress {
  const m = /^(?:\[([0-9A-Fa-f:.]+)\]|([A-Za-z0-9.-]*)):(\d{1,5})$/.exec(s) ?? /^()()(\d{1,5})$/.exec(s);
  const port = m ? Number(m[3]) : NaN;
  if (!m || !(port >= 0 && port <= 65535)) {
    throw new AirlockError('INVALID_ARGUMENT', `--listen "${s}" is not HOST:PORT (e.g. 127.0.0.1:7070)`, {
      field: 'listen',
    });
  }
  return { host: m[1] || m[2] || '127.0.0.1', port };
}

/** True for an address only this host can reach. */
export function isLoopback(host: string): boolean {
  if (host === 'localhost') return true;
  if (isIP(host) === 4) return host.startsWith('127.');
  if (isIP(host) === 6) return host === '::1' || /^::ffff:127\./i.test(host);
  return false;
}

/**
 * A non-loopback listen needs TLS (the API key travels in every request) or an explicit
 * --insecure-listen (e.g. behind a TLS-terminating proxy on a private network).
 */
export function checkListen(addr: ListenAddress, o: { tls: boolean; insecureListen: boolean }): void {
  if (isLoopback(addr.host) || o.tls || o.insecureListen) return;
  throw new AirlockError(
    'INVALID_ARGUMENT',
    `refusing to listen on ${addr.host}, which is not loopback, without TLS: give --tls-cert and --tls-key, or --insecure-listen if a TLS proxy fronts this server`,
    { field: 'listen' },
  );
}
