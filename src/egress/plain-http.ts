// Forwarding of one plain-HTTP request (proxy absolute-form, or transparent interception) for a sandbox
// with no secrets and no canaries: nothing in the response needs inspecting, so after the upstream's
// response head has been read and checked here, its body is moved without Node's HTTP machinery.
//
// The request side is unchanged in substance: the gateway has vetted the request (policy, SSRF guard:
// `upstream` is connected to the vetted address, Host pinned) before calling this; the head written
// upstream is built from the headers Node's server parsed, with `Connection: close` (one upstream
// connection per request, as before). The response head is parsed by parseResponseHead (strict:
// ambiguous framing → 502) and passed on through Node's ServerResponse, so the client connection's
// keep-alive bookkeeping stays Node's. The body then goes by its framing:
//   - Content-Length, large: the relay worker moves exactly that many bytes upstream → client on the
//     raw fds (FdRelay.copy); Node does not touch the client socket meanwhile, and ends the
//     response (writing nothing more) once the copy is complete. An upstream that closes early, a client
//     that goes away, or the sandbox's egress closing ends both connections (never a hang).
//   - Content-Length, small, or when the relay is unavailable: the same exact count in JS.
//   - chunked: decoded here (ChunkedDecoder, strict), re-framed by Node for the client.
//   - neither (ends when the upstream closes) and no body (HEAD, 1xx, 204, 304): as Node would.
import type { IncomingMessage, ServerResponse } from 'node:http';
import { validateHeaderName, validateHeaderValue } from 'node:http';
import type { Socket } from 'node:net';
import { ChunkedDecoder, parseResponseHead, type HttpResponseHead } from './http-head.js';
import { flushed, type RelayedTunnel, type FdRelay } from './relay.privileged.js';

/** Bodies with fewer bytes left than this after the head are copied in JS (a hand-off costs a round trip). */
const ZERO_COPY_MIN_BYTES = 256 * 1024;
/** What Node accepts in a request path (its http.request refuses anything else). */
const PATH = /^[\x21-\x7e\x80-\xff]+$/;
const HOP_BY_HOP = /^(connection|keep-alive|proxy-connection)$/i;

export interface PlainForward {
  readonly req: IncomingMessage;
  readonly res: ServerResponse;
  /** Connected to the vetted address; destroyed when this request ends. */
  readonly upstream: Socket;
  readonly method: string;
  readonly path: string;
  /** Request headers to send (Host first), without Connection. */
  readonly headers: ReadonlyArray<readonly [string, string]>;
  readonly hostKey: string;
  readonly idleMs: number;
  /** The relay, if a copy may be started now (relay available, fd budget, egress open). */
  readonly relay: () => FdRelay | undefined;
  /** Count a copy against the sandbox (closed with it); returns the release. */
  readonly track: (t: RelayedTunnel) => () => void;
  /** Called once, when the exchange is over: request body bytes sent, response body bytes delivered. */
  readonly report: (bytesUp: number, bytesDown: number) => void;
  readonly fail: (res: ServerResponse, status: number, text: string) => void;
}

export function forwardPlain(o: PlainForward): void {
  const { req, res, upstream: up } = o;
  if (!PATH.test(o.path)) {
    up.destroy();
    return o.fail(res, 400, 'Airlock egress: the request target has characters that cannot be forwarded');
  }
  for (const [k, v] of o.headers) {
    validateHeaderName(k); // throws (the gateway's guard answers 502): Node's parser let it in, though
    validateHeaderValue(k, v);
  }
  let bytesUp = 0;
  let bytesDown = 0;
  let reported = false;
  const report = (): void => {
    if (reported) return;
    reported = true;
    o.report(bytesUp, bytesDown);
  };
  let copying: RelayedTunnel | undefined;
  let requestSent = false;
  res.on('error', () => {});
  res.on('close', () => {
    up.destroy();
    // Answered before the request body was all here (an early 413, say): read the rest and drop it,
    // so Node's server reaches the next request on this connection.
    if (!requestSent) req.removeAllListeners('data').resume();
    if (copying)
      copying.close(); // its end reports
    else report();
  });

  // ---- request: head, then the body as Node's server decoded it (re-chunked if it came chunked) ----
  const chunked = req.headers['transfer-encoding'] !== undefined;
  up.setNoDelay(true);
  const head = [
    `${o.method} ${o.path} HTTP/1.1`,
    ...o.headers.map(([k, v]) => `${k}: ${v}`),
    'Connection: close',
  ];
  up.write(`${head.join('\r\n')}\r\n\r\n`, 'latin1');
  req.on('data', (d: Buffer) => {
    if (d.length === 0) return;
    bytesUp += d.length;
    let ok: boolean;
    if (chunked) {
      up.cork();
      up.write(`${d.length.toString(16)}\r\n`);
      up.write(d);
      ok = up.write('\r\n');
      up.uncork();
    } else ok = up.write(d);
    if (!ok) {
      req.pause();
      up.once('drain', () => req.resume());
    }
  });
  req.on('end', () => {
    if (chunked) up.write('0\r\n\r\n');
    requestSent = true;
  });

  // ---- response head ----
  const failHead = (why: string): void => {
    up.destroy();
    if (!res.headersSent) o.fail(res, 502, `Airlock egress: upstream ${o.hostKey} ${why}`);
    else res.destroy();
  };
  let buf: Buffer = Buffer.alloc(0);
  const onEarlyClose = (): void => failHead('closed the connection without a response');
  const onHead = (d: Buffer): void => {
    buf = buf.length ? Buffer.concat([buf, d]) : d;
    for (;;) {
      const h = parseResponseHead(buf, o.method);
      if (h.kind === 'incomplete') return;
      if (h.kind === 'invalid') return failHead(`sent an invalid response head: ${h.reason}`);
      if (h.status < 200) {
        // Interim responses (100 Continue, 103) are not passed on; Node's server answered Expect itself.
        if (h.status === 101) return failHead('switched protocols, which the proxy does not relay');
        buf = buf.subarray(h.headEnd);
        continue;
      }
      up.off('data', onHead).off('close', onEarlyClose);
      up.pause();
      return respond(h, buf.subarray(h.headEnd));
    }
  };
  up.on('data', onHead).once('close', onEarlyClose);

  const respond = (h: HttpResponseHead, rest: Buffer): void => {
    try {
      res.writeHead(
        h.status,
        h.reason,
        // Hop-by-hop: each upstream connection serves one request; the client's may live on.
        // A plain "chunked" is decoded here and framed again by Node, as the client's version allows.
        h.headers
          .filter(
            ([k, v]) => !HOP_BY_HOP.test(k) && !(/^transfer-encoding$/i.test(k) && /^chunked$/i.test(v)),
          )
          .flat() as unknown as Record<string, string>,
      );
    } catch (e) {
      return failHead(`sent an invalid response head: ${(e as Error).message}`);
    }
    let ended = false;
    const end = (): void => {
      ended = true;
      up.destroy();
      res.end();
    };
    let waiting = false;
    const send = (b: Buffer): void => {
      if (b.length === 0 || res.destroyed) return;
      bytesDown += b.length;
      if (!res.write(b) && !waiting) {
        waiting = true;
        up.pause();
        res.once('drain', () => {
          waiting = false;
          up.resume();
        });
      }
    };
    // The upstream going away before the body's end truncates the response: the client connection is
    // closed so the client sees it (a Content-Length not met, or no last chunk).
    const pump = (take: (d: Buffer) => void, onEnd?: () => void): void => {
      up.on('data', take);
      if (onEnd) up.once('end', onEnd);
      const onClose = (): void => void (ended || res.destroy());
      if (up.closed)
        process.nextTick(onClose); // it went while the hand-off was tried
      else up.once('close', onClose);
      up.resume();
    };
    const body = h.body;
    if (body.kind === 'none') return end();
    if (body.kind === 'close') {
      send(rest);
      return pump(send, end);
    }
    if (body.kind === 'chunked') {
      const dec = new ChunkedDecoder();
      const take = (d: Buffer): void => {
        if (ended) return;
        const r = dec.push(d);
        if ('error' in r) {
          up.destroy();
          return void res.destroy();
        }
        r.data.forEach(send);
        if (r.done) end();
      };
      take(rest);
      if (!ended) pump(take);
      return;
    }
    const total = body.bytes;
    let left = total;
    const take = (d: Buffer): void => {
      if (ended) return;
      const part = d.length > left ? d.subarray(0, left) : d;
      left -= part.length;
      send(part);
      if (left === 0) end();
    };
    const prefix = rest.subarray(0, total);
    if (total - prefix.length >= ZERO_COPY_MIN_BYTES && requestSent && up.writableLength === 0) {
      const relay = o.relay();
      if (relay) {
        const fallback = (): void => {
          take(prefix);
          if (!ended) pump(take);
        };
        return void fdRelay(relay, prefix, total, fallback).catch(() => {
          req.socket.destroy();
          res.destroy();
        });
      }
    }
    take(prefix);
    if (!ended) pump(take);
  };

  /** The body by the fd relay; `fallback` runs the JS copy when the hand-off is not possible. */
  const fdRelay = async (
    relay: FdRelay,
    prefix: Buffer,
    total: number,
    fallback: () => void,
  ): Promise<void> => {
    const client = req.socket;
    res.flushHeaders();
    await flushed(client);
    // Only when this response owns the client socket (not queued behind a pipelined one) and every
    // byte Node wrote for it has reached the kernel.
    if (res.destroyed || up.destroyed || res.socket !== client || client.writableLength > 0)
      return fallback();
    client.setTimeout(0); // Node sees no traffic while the worker writes; the worker keeps the idle limit
    const t = relay.copy(up, client, { prefix, bytes: total, idleMs: o.idleMs });
    if (!t) {
      client.setTimeout(o.idleMs);
      return fallback();
    }
    copying = t;
    const release = o.track(t);
    const r = await t.done;
    release();
    copying = undefined;
    bytesDown += r.bytesDown;
    if (r.error || res.destroyed) {
      // Truncated, the client gone, or the sandbox's egress closed: the connection cannot go on.
      client.destroy();
      res.destroy();
      return report();
    }
    client.setTimeout(o.idleMs);
    res.end(); // writes nothing: the Content-Length was met by the copy; keep-alive goes on
  };
}
