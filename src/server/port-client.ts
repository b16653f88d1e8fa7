// The client side of the port route (server/port-route.ts): RemoteSandboxApi.connectPort is this,
// over the unix socket (front server → supervisor) or a server URL (remote SDK → server). It sends
// GET /v1/sandboxes/:id/ports/:port with `Upgrade: airlock-tcp` and hands back the raw duplex after
// 101; any other answer becomes the AirlockError its JSON body names.
import { request as httpRequest, type ClientRequest, type IncomingMessage } from 'node:http';
import { request as httpsRequest } from 'node:https';
import type { Socket } from 'node:net';
import type { Duplex } from 'node:stream';
import { z } from 'zod';
import { AirlockError, ERROR_CODES, type AirlockErrorCode } from '../core/errors.js';
import { ErrorBodySchema } from './contract.js';
import { PORT_UPGRADE } from './port-route.js';

/** Where the server is: its unix socket (used when given), else its base URL (http: or https:). */
export interface PortTransport {
  readonly socketPath?: string | undefined;
  readonly url?: string | undefined;
  /** Sent as `Authorization: Bearer <apiKey>`. */
  readonly apiKey?: string | undefined;
  readonly headers?: Record<string, string>;
}

/** The most of an error body read (a server's error is small; anything larger is cut off). */
const MAX_ERROR_BODY = 64 * 1024;

/** A raw connection to `port` inside sandbox `id`, through the server at `t`. */
export function connectPortVia(
  t: PortTransport,
  id: string,
  port: number,
  signal?: AbortSignal,
): Promise<Duplex> {
  if (signal?.aborted)
    return Promise.reject(new AirlockError('ABORTED', 'connect aborted before it started'));
  const path = `/v1/sandboxes/${encodeURIComponent(id)}/ports/${encodeURIComponent(String(port))}`;
  const headers: Record<string, string> = { ...t.headers, connection: 'Upgrade', upgrade: PORT_UPGRADE };
  if (t.apiKey !== undefined) headers.authorization = `Bearer ${t.apiKey}`;
  let req: ClientRequest;
  if (t.socketPath !== undefined) {
    req = httpRequest({ socketPath: t.socketPath, path, method: 'GET', headers });
  } else if (t.url === undefined) {
    return Promise.reject(
      new AirlockError('INVALID_ARGUMENT', 'give the server as socketPath or url', { field: 'url' }),
    );
  } else {
    const base = new URL(t.url);
    const o = { method: 'GET', headers, path: base.pathname.replace(/\/$/, '') + path };
    const target = { host: base.hostname.replace(/^\[|\]$/g, ''), port: base.port || undefined };
    req = base.protocol === 'https:' ? httpsRequest({ ...o, ...target }) : httpRequest({ ...o, ...target });
  }
  return new Promise<Duplex>((resolve, reject) => {
    const onAbort = (): void => {
      req.destroy();
      reject(new AirlockError('ABORTED', `connect to port ${port} aborted`));
    };
    signal?.addEventListener('abort', onAbort, { once: true });
    const done = (): void => signal?.removeEventListener('abort', onAbort);
    req.on('upgrade', (_res: IncomingMessage, socket: Socket, head: Buffer) => {
      done();
      if (signal?.aborted) {
        socket.destroy();
        return;
      }
      if (head.length) socket.unshift(head);
      resolve(socket);
    });
    req.on('response', (res: IncomingMessage) => {
      done();
      readError(res, port).then(reject, reject);
    });
    req.on('error', (e) => {
      done();
      reject(
        AirlockError.isInstance(e)
          ? e
          : new AirlockError(
              'BACKEND_UNAVAILABLE',
              `the server did not answer the port route: ${e.message}`,
              {
                cause: e,
              },
            ),
      );
    });
    req.end();
  });
}

/** The typed error of a non-101 answer (its JSON body; the status alone when it has none). */
async function readError(res: IncomingMessage, port: number): Promise<never> {
  const parts: Buffer[] = [];
  let n = 0;
  for await (const chunk of res as AsyncIterable<Buffer>) {
    n += chunk.length;
    if (n > MAX_ERROR_BODY) break;
    parts.push(chunk);
  }
  res.destroy();
  let body: z.infer<typeof ErrorBodySchema> | undefined;
  try {
    const parsed = ErrorBodySchema.safeParse(JSON.parse(Buffer.concat(parts).toString('utf8')));
    if (parsed.success) body = parsed.data;
  } catch {
    /* not JSON: the status says it */
  }
  const code: AirlockErrorCode =
    body && body.error.code in ERROR_CODES ? (body.error.code as AirlockErrorCode) : 'INTERNAL';
  throw new AirlockError(
    code,
    body?.error.message ?? `the server answered ${res.statusCode} to the port route for port ${port}`,
    body?.error.field !== undefined ? { field: body.error.field } : {},
  );
}
