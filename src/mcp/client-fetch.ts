// A `fetch` for MCP clients of Airlock's gateway (or of any Streamable HTTP server), to pass to the
// MCP SDK's client transport:
//
//   new StreamableHTTPClientTransport(url, { fetch: gatewayFetch(), requestInit: { headers } })
//
// Why: Node's global fetch (undici) spends about 0.3 ms of CPU per tools/call on its WHATWG stream
// machinery, more than Airlock's gateway spends on the call (measured: SDK client with the global
// fetch 2,700-3,300 calls/s and 0.29-0.35 ms of client CPU per call; with this one 4,800-5,800 calls/s
// and 0.13-0.16 ms). This one sends the request with node:http(s) over a keep-alive agent and builds
// the Response from the whole body, except for an event stream (text/event-stream), whose body is
// streamed as it arrives.
//
// Scope, everything else goes to the global fetch unchanged: http: and https: URLs (not a Request
// object), a body that is absent, a string, or bytes. It honours the AbortSignal (before and after
// the response head; an aborted event stream errors). Redirects are returned, never followed (as
// `redirect: 'manual'`, but not opaque: the SDK follows same-origin ones itself); `redirect: 'error'`
// rejects on one. No cookies, cache or credentials modes, and no content decoding (it sends no
// Accept-Encoding, so a server answers uncompressed): none applies to an MCP endpoint.
import { Agent as HttpAgent, request as httpRequest, type IncomingMessage } from 'node:http';
import { Agent as HttpsAgent, request as httpsRequest } from 'node:https';
import { Readable } from 'node:stream';

/** Options of `gatewayFetch`. */
export interface GatewayFetchOptions {
  /** Sockets kept open per origin (default 256: a client with many calls in flight). */
  readonly maxSockets?: number;
  /** Trusted CA certificates (PEM) for https: URLs, instead of Node's default ones. */
  readonly ca?: string | readonly string[];
}

/** A fetch function (see the header), and close(), which ends its idle keep-alive connections. */
export type GatewayFetch = typeof fetch & { close(): void };

/** Statuses whose response has no body (the Response constructor refuses one). */
const NULL_BODY = new Set([204, 205, 304]);

/** A `fetch` for MCP clients of the gateway: node:http with keep-alive (less CPU per call than the global fetch). */
export function gatewayFetch(opts: GatewayFetchOptions = {}): GatewayFetch {
  const agentOpts = { keepAlive: true, maxSockets: opts.maxSockets ?? 256 };
  const http = new HttpAgent(agentOpts);
  const https = new HttpsAgent({ ...agentOpts, ...(opts.ca ? { ca: [opts.ca].flat() } : {}) });

  const f = (input: string | URL | Request, init: RequestInit = {}): Promise<Response> => {
    const body = init.body;
    const plainBody =
      body === undefined || body === null || typeof body === 'string' || body instanceof Uint8Array;
    // (A Request carries its own body and options.)
    if (!(typeof input === 'string' || input instanceof URL) || !plainBody) return fetch(input, init);
    // Not an absolute http(s) URL: the global fetch rejects it (or serves it) as fetch does.
    const url = URL.canParse(String(input)) ? new URL(input) : undefined;
    if (url?.protocol !== 'http:' && url?.protocol !== 'https:') return fetch(input, init);
    const signal = init.signal ?? undefined;
    if (signal?.aborted) return Promise.reject(abortReason(signal));

    const headers: Record<string, string> = {};
    new Headers(init.headers).forEach((v, k) => (headers[k] = v));
    if (body !== undefined && body !== null) headers['content-length'] = String(Buffer.byteLength(body));
    const method = (init.method ?? 'GET').toUpperCase();
    const secure = url.protocol === 'https:';

    return new Promise<Response>((resolve, reject) => {
      let settled = false;
      let res: IncomingMessage | undefined;
      const onAbort = (): void => {
        const reason = abortReason(signal!);
        req.destroy(reason as Error);
        res?.destroy(reason as Error);
        if (!settled) {
          settled = true;
          reject(reason);
        }
      };
      /** The signal matters until the body is read (a streamed body: until the stream ends). */
      const done = signal ? whenAborted(signal, onAbort) : (): void => {};
      const fail = (e: Error): void => {
        done();
        if (settled) return;
        settled = true;
        reject(signal?.aborted ? abortReason(signal) : new TypeError('fetch failed', { cause: e }));
      };
      const req = (secure ? httpsRequest : httpRequest)(
        {
          agent: secure ? https : http,
          protocol: url.protocol,
          hostname: url.hostname.replace(/^\[(.*)\]$/, '$1'), // an IPv6 literal without its brackets
          port: url.port,
          path: url.pathname + url.search,
          method,
          headers,
          ...(url.username || url.password
            ? { auth: `${decodeURIComponent(url.username)}:${decodeURIComponent(url.password)}` }
            : {}),
        },
        (r) => {
          res = r;
          const status = r.statusCode ?? 0;
          if (status >= 300 && status < 400 && init.redirect === 'error') {
            r.destroy();
            return fail(new Error(`redirect (${status}) with redirect: 'error'`));
          }
          if (status < 200 || status > 599) {
            r.destroy();
            return fail(new Error(`unexpected HTTP status ${status}`));
          }
          const h = new Headers();
          for (let i = 0; i < r.rawHeaders.length; i += 2) h.append(r.rawHeaders[i]!, r.rawHeaders[i + 1]!);
          const meta = { status, statusText: r.statusMessage ?? '', headers: h };
          const respond = (b: Buffer | ReadableStream<Uint8Array> | null): void => {
            if (settled) return;
            settled = true;
            resolve(new Response(b, meta));
          };
          if (method === 'HEAD' || NULL_BODY.has(status)) {
            r.resume();
            done();
            return respond(null);
          }
          if (/^text\/event-stream\b/i.test(r.headers['content-type'] ?? '')) {
            r.once('close', done);
            return respond(Readable.toWeb(r) as ReadableStream<Uint8Array>);
          }
          const chunks: Buffer[] = [];
          r.on('data', (c: Buffer) => chunks.push(c));
          r.on('error', fail);
          r.on('end', () => {
            done();
            respond(Buffer.concat(chunks));
          });
          // The connection ended before the whole body came.
          r.on('close', () => r.complete || fail(new Error('the response ended early')));
        },
      );
      req.on('error', fail);
      req.end(body ?? undefined);
    });
  };
  return Object.assign(f as typeof fetch, {
    close(): void {
      http.destroy();
      https.destroy();
    },
  });
}

/**
 * The requests in flight on each signal, and the one 'abort' listener that reaches them all: the SDK
 * gives every request of a transport the same signal, and a listener per request would trip Node's
 * MaxListenersExceededWarning from the 11th call in flight.
 */
const inFlight = new WeakMap<AbortSignal, { readonly calls: Set<() => void>; readonly fire: () => void }>();

/** Call `f` if `signal` aborts, until the returned function is called (idempotent). */
function whenAborted(signal: AbortSignal, f: () => void): () => void {
  let entry = inFlight.get(signal);
  if (!entry) {
    const calls = new Set<() => void>();
    const fire = (): void => {
      inFlight.delete(signal);
      for (const g of calls) g();
    };
    entry = { calls, fire };
    inFlight.set(signal, entry);
    signal.addEventListener('abort', fire, { once: true });
  }
  const { calls, fire } = entry;
  calls.add(f);
  return () => {
    if (!calls.delete(f) || calls.size) return;
    signal.removeEventListener('abort', fire);
    if (inFlight.get(signal)?.calls === calls) inFlight.delete(signal);
  };
}

function abortReason(signal: AbortSignal): unknown {
  return signal.reason ?? new DOMException('This operation was aborted', 'AbortError');
}
