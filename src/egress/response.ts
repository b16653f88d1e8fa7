// The upstream's answer to a forwarded request (forward.ts), passed on to the sandbox: its status line,
// headers and body scrubbed of every real value that went into the request (secrets/scrub.ts), the body
// decoded first if compressed, and refused when it cannot be decoded.
import type { IncomingMessage, ServerResponse, request as httpRequest } from 'node:http';
import { Scrubber, type ScrubValue } from '../secrets/scrub.js';
import { responseBodyDecoding } from './content-coding.js';
import type { EgressContext } from './context.js';
import type { EgressProtocol } from './events.js';
import { rawHeaderPairs, sendText } from './http-util.js';

/** One request's exchange: where it goes, and what it has moved so far. */
export interface Exchange {
  readonly cx: EgressContext;
  readonly protocol: EgressProtocol;
  readonly req: IncomingMessage;
  readonly res: ServerResponse;
  /** Canonical host (the decided one); the Host header and the secrets are keyed on it. */
  readonly hostKey: string;
  readonly port: number;
  readonly started: number;
  address: string;
  bytesUp: number;
  bytesDown: number;
  /** Set when the exchange was refused midway (the deny is already reported and answered). */
  blocked: boolean;
}

/**
 * The upstream's response, passed on: whatever it reflects, the sandbox never reads a real value back
 * (secrets/scrub.ts): not in the status line, a header (name or value) or the body, decoded first if
 * compressed.
 */
export function relayResponse(
  x: Exchange,
  upstream: ReturnType<typeof httpRequest>,
  up: IncomingMessage,
  scrubValues: ScrubValue[],
): void {
  const { cx, protocol, hostKey, port, started, req, res } = x;
  const status = up.statusCode ?? 0;
  if (status < 100 || status > 599) {
    upstream.destroy();
    return void sendText(res, 502, `Airlock egress: ${hostKey} answered with an invalid status ${status}`);
  }
  const scrubber = new Scrubber(scrubValues);
  const scrubbing = !scrubber.empty;
  const hasBody = req.method !== 'HEAD' && status !== 204 && status !== 304 && status >= 200;
  const decoding =
    scrubbing && hasBody
      ? responseBodyDecoding(up.headers['content-encoding'], up.headers['transfer-encoding'])
      : { ok: true as const, decoders: [] };
  if (!decoding.ok) {
    x.blocked = true;
    upstream.destroy();
    const reason = `Airlock egress: ${hostKey} answered with the coding "${decoding.coding}", which Airlock cannot decode to remove credentials from it; the response was refused (Airlock asks for identity, gzip, deflate or br)`;
    cx.denied(protocol, hostKey, port, reason, 'content_encoding', started, {
      address: x.address,
      bytesUp: x.bytesUp,
    });
    return void sendText(res, 502, reason);
  }
  const decoded = decoding.decoders.length > 0;
  try {
    res.writeHead(
      status,
      scrubber.scrubText(up.statusMessage ?? ''),
      rawHeaderPairs(up)
        // A scrubbed body may change length: let Node frame it (chunked) instead.
        .filter(([k]) => !scrubbing || !/^(content-length|transfer-encoding)$/i.test(k))
        // The body is passed on decoded.
        .filter(([k]) => !decoded || !/^content-encoding$/i.test(k))
        // Hop-by-hop: each upstream connection serves one request; the client's may live on.
        .filter(([k]) => !/^(connection|keep-alive|proxy-connection)$/i.test(k))
        .map(([k, v]) => [scrubber.scrubText(k), scrubber.scrubText(v)])
        .flat() as unknown as Record<string, string>,
    );
  } catch (e) {
    upstream.destroy();
    return void sendText(
      res,
      502,
      `Airlock egress: ${hostKey} sent an invalid response head: ${(e as Error).message}`,
    );
  }
  up.on('data', (d: Buffer) => (x.bytesDown += d.length));
  if (!scrubbing) return void up.pipe(res);
  // Streamed scrub: the scrubber holds back a tail that could still start a match.
  let body: NodeJS.ReadableStream = up;
  for (const d of decoding.decoders) {
    d.on('error', () => {
      upstream.destroy();
      res.destroy(); // a body that does not decode is cut, never passed on unread
    });
    body = body.pipe(d);
  }
  const stream = scrubber.stream();
  body.on('data', (d: Buffer) => {
    if (!res.write(stream.push(d))) {
      body.pause();
      res.once('drain', () => body.resume());
    }
  });
  body.on('end', () => res.end(stream.end()));
}
