// SECURITY-CRITICAL: plain-request forwarding. One HTTP request — proxy absolute-form, or a request on
// a decided connection (transparent HTTP, plain HTTP inside a CONNECT / SOCKS5 tunnel, or inside
// intercepted TLS) — is forwarded over its own vetted upstream connection, in named steps:
//   pin (the target names the decided host) → head (Host set to the decided host) → exfiltration
//   scan and secret swap (secrets/exfil.ts) → vet and dial (vet.ts; TLS verified when intercepting) →
//   body (buffered for a body swap, else streamed and scanned) → response (scrubbed of what went in).
// A sandbox with no secrets sends plain HTTP through plain-http.ts (nothing in the response to scrub).
import { request as httpRequest, type IncomingMessage, type ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import { connect as tlsConnect } from 'node:tls';
import { canonicalHost } from '../core/address.js';
import {
  bodySecretsFor,
  identityRequest,
  scanBufferedBody,
  scanRequestHead,
  StreamScanner,
  streamedBodyReason,
  type BodySecrets,
} from '../secrets/exfil.js';
import type { ScrubValue } from '../secrets/scrub.js';
import type { SecretLease } from '../secrets/sentinels.js';
import {
  IDLE_TIMEOUT_MS,
  MAX_SOCKETS_PER_SANDBOX,
  type EgressContext,
  type PinnedConnection,
} from './context.js';
import type { EgressProtocol } from './events.js';
import {
  canonicalName,
  firstHost,
  hostHeaderFor,
  rawHeaderPairs,
  readBounded,
  sendText,
} from './http-util.js';
import { pinRequest } from './pin.js';
import { relayResponse, type Exchange } from './response.js';
import { forwardPlain } from './plain-http.js';
import { RELAY_FDS } from './relay.privileged.js';

const MAX_SWAPPED_BODY_BYTES = 1024 * 1024;
const MAX_BUFFERED_BYTES_PER_SANDBOX = 16 * 1024 * 1024;
/** Request headers a proxy never passes on (hop-by-hop, or replaced: Host names the decided host). */
const NOT_FORWARDED = /^(host|proxy-connection|proxy-authorization|keep-alive|connection)$/i;

/** The proxy's absolute-form request (http://host/path). */
export async function onProxyRequest(
  cx: EgressContext,
  req: IncomingMessage,
  res: ServerResponse,
): Promise<void> {
  if (req.httpVersionMajor !== 1) {
    return void sendText(res, 400, 'Airlock egress proxy: only HTTP/1.0 and HTTP/1.1 requests are proxied');
  }
  let url: URL;
  try {
    url = new URL(req.url ?? '');
  } catch {
    return void sendText(res, 400, 'Airlock egress proxy: send absolute-form requests (http://host/path)');
  }
  if (url.protocol !== 'http:') {
    return void sendText(res, 400, `Airlock egress proxy: ${url.protocol} URLs go through CONNECT`);
  }
  const port = url.port ? Number(url.port) : 80;
  const host = url.hostname.replace(/^\[|\]$/g, '');
  if (canonicalHost(host).kind !== 'invalid') {
    // The raw target must name the URL's host as Node's URL parser read it, without userinfo
    // (pin.ts). Host headers are ignored and replaced by forward(), as RFC 9112 §3.2.2 asks of a proxy.
    const pin = pinRequest(
      { url: req.url ?? '', rawHeaders: [] },
      { host: canonicalName(host), port, scheme: 'http' },
    );
    if (!pin.ok) {
      cx.denied('http', canonicalName(host), port, pin.reason, 'mismatch', Date.now());
      return void sendText(res, 403, pin.reason);
    }
  }
  await forward(cx, 'http', req, res, host, port, `${url.pathname}${url.search}`);
}

/**
 * One request on a decided connection: its target and Host must name the connection's host:port
 * (absolute-form is rewritten to origin-form), or it is refused before anything is dialled.
 */
export async function forwardPinned(
  cx: EgressContext,
  t: PinnedConnection,
  req: IncomingMessage,
  res: ServerResponse,
  tls: boolean,
): Promise<void> {
  // Transparent HTTP to a literal address: the first request's Host names the host (else the address).
  t.host ??= firstHost(req) ?? t.fallback!;
  const pin = pinRequest(
    { url: req.url ?? '/', rawHeaders: req.rawHeaders },
    { host: t.host, port: t.port, scheme: tls ? 'https' : 'http' },
  );
  if (!pin.ok) {
    cx.denied(t.protocol, t.host, t.port, pin.reason, 'mismatch', Date.now());
    return void sendText(res, 403, pin.reason);
  }
  await forward(cx, t.protocol, req, res, t.host, t.port, pin.path, tls);
}

/** Forward one HTTP request to host:port over a vetted connection (plain, or TLS when `tls`). */
async function forward(
  cx: EgressContext,
  protocol: EgressProtocol,
  req: IncomingMessage,
  res: ServerResponse,
  host: string,
  port: number,
  path: string,
  tls = false,
): Promise<void> {
  const started = Date.now();
  const hostKey = canonicalName(host);
  const x: Exchange = {
    cx,
    protocol,
    req,
    res,
    hostKey,
    port,
    started,
    address: '',
    bytesUp: 0,
    bytesDown: 0,
    blocked: false,
  };
  // Host always names the host that was decided on and dialled: a request cannot be routed to
  // another virtual host (or a denied one) behind an allowed address.
  const headers: Array<[string, string]> = [
    ['Host', hostHeaderFor(host, port, tls ? 443 : 80)],
    ...rawHeaderPairs(req).filter(([k]) => !NOT_FORWARDED.test(k)),
  ];
  // Secrets: swap sentinels for this host's bound secrets; any other sentinel or a canary is exfiltration.
  // Real values go only into TLS connections, unless a secret opts into plain HTTP (insecureHttp).
  const lease = cx.o.secrets;
  const transport = tls ? 'tls' : 'plain';
  let outHeaders = headers;
  let swapped: string[] = [];
  let scrub: ScrubValue[] = [];
  if (lease) {
    const head = scanRequestHead(lease, hostKey, path, headers, transport);
    if (!head.ok) {
      cx.denied(
        protocol,
        hostKey,
        port,
        head.reason,
        head.code,
        started,
        head.alert ? { alert: head.alert } : {},
      );
      return void sendText(res, 403, head.reason);
    }
    ({ headers: outHeaders, swapped, scrub } = head);
  }
  const socket = await dial(x, host, tls);
  if (!socket) return;
  if (!lease && !tls) {
    // Nothing to inspect in the response: its body skips Node's HTTP machinery (plain-http.ts).
    return forwardPlain({
      req,
      res,
      upstream: socket,
      method: req.method ?? 'GET',
      path,
      headers: outHeaders,
      hostKey,
      idleMs: IDLE_TIMEOUT_MS,
      relay: () =>
        cx.relay && !cx.closed && cx.fds() + RELAY_FDS <= MAX_SOCKETS_PER_SANDBOX ? cx.relay : undefined,
      track: (t) => cx.trackRelayed(t, [], socket),
      fail: sendText,
      report: (bytesUp, bytesDown) =>
        cx.emitAllowed(protocol, hostKey, port, x.address, { bytesUp, bytesDown }, started),
    });
  }
  // Secrets configured with `body: true` are swapped in the body too: buffered (bounded) for that.
  const bodySecrets = lease ? bodySecretsFor(lease, hostKey, transport, cx.o.bodySwap) : undefined;
  let body: Buffer | undefined;
  if (
    lease &&
    bodySecrets?.bound.length &&
    (req.headers['content-length'] !== undefined || req.headers['transfer-encoding'] !== undefined)
  ) {
    const swappedBody = await swapBody(x, lease, bodySecrets, socket);
    if (!swappedBody) return;
    body = swappedBody.body;
    if (swappedBody.swapped) outHeaders = identityRequest(outHeaders);
    outHeaders = [
      ...outHeaders.filter(([k]) => !/^(content-length|transfer-encoding)$/i.test(k)),
      ['content-length', String(body.length)],
    ];
  }
  const upstream = httpRequest({
    createConnection: () => socket,
    method: req.method,
    path,
    headers: [...outHeaders.flat(), 'connection', 'close'] as unknown as Record<string, string>,
    setHost: false,
  });
  upstream.on('response', (up) => relayResponse(x, upstream, up, scrub));
  res.on('close', () => {
    if (x.blocked) return; // the deny was reported when the body was cut
    cx.emitAllowed(
      protocol,
      hostKey,
      port,
      x.address,
      { bytesUp: x.bytesUp, bytesDown: x.bytesDown },
      started,
      swapped.length ? { secretsSwapped: swapped } : {},
    );
  });
  upstream.on('error', (e) => {
    if (x.blocked) return; // we cut it on purpose and answered 403
    if (!res.headersSent) sendText(res, 502, `Airlock egress: upstream ${hostKey} failed: ${e.message}`);
    else res.destroy();
  });
  if (body) return void upstream.end(body);
  streamBody(x, upstream, lease);
}

/**
 * Vet host:port (policy, SSRF guard, Airlock's own resolution) and dial it; with `tls`, TLS to the real
 * host with its certificate verified. Undefined: refused (reported and answered).
 */
async function dial(x: Exchange, host: string, tls: boolean): Promise<Socket | undefined> {
  const { cx, protocol, hostKey, port, started, res } = x;
  const vetted = await cx.vet(host, port);
  if (!vetted.ok) {
    cx.denyEvent(protocol, vetted, port, started);
    const unreachable = vetted.verdict.code === 'connect_failed' || vetted.verdict.code === 'resolve_failed';
    return void sendText(res, unreachable ? 502 : 403, vetted.verdict.reason);
  }
  x.address = vetted.address;
  cx.hold(vetted.socket);
  let socket: Socket = vetted.socket;
  if (tls) {
    try {
      socket = await upstreamTls(cx, vetted.socket, hostKey);
    } catch (e) {
      vetted.socket.destroy();
      const reason = `Airlock egress: could not verify ${hostKey}'s TLS certificate: ${(e as Error).message}`;
      cx.denied(protocol, hostKey, port, reason, 'upstream_tls', started, { address: vetted.address });
      return void sendText(res, 502, reason);
    }
  }
  // The upstream connection lives exactly as long as this request.
  res.on('close', () => socket.destroy());
  socket.setTimeout(IDLE_TIMEOUT_MS, () => socket.destroy());
  return socket;
}

/** TLS to the real host, its certificate verified against the system store (or upstreamCa). */
function upstreamTls(cx: EgressContext, raw: Socket, host: string): Promise<Socket> {
  return new Promise((resolve, reject) => {
    const t = tlsConnect({
      socket: raw,
      servername: host,
      ...(cx.opts.upstreamCa ? { ca: [...cx.opts.upstreamCa] } : {}),
    });
    t.once('secureConnect', () => {
      t.removeListener('error', reject);
      cx.hold(t);
      resolve(t);
    });
    t.once('error', reject);
  });
}

/**
 * Buffer (bounded) a request body to a host with body secrets, then swap them in or refuse it.
 * Undefined: refused (reported and answered, the upstream closed).
 */
async function swapBody(
  x: Exchange,
  lease: SecretLease,
  secrets: BodySecrets,
  socket: Socket,
): Promise<{ body: Buffer; swapped: boolean } | undefined> {
  const { cx, protocol, hostKey, port, started, res } = x;
  if (cx.bufferedBytes + MAX_SWAPPED_BODY_BYTES > MAX_BUFFERED_BYTES_PER_SANDBOX) {
    socket.destroy();
    return void sendText(res, 503, 'Airlock egress: too many request bodies with secrets in flight; retry');
  }
  cx.bufferedBytes += MAX_SWAPPED_BODY_BYTES;
  let body: Buffer | undefined;
  try {
    body = await readBounded(x.req, MAX_SWAPPED_BODY_BYTES);
  } finally {
    cx.bufferedBytes -= MAX_SWAPPED_BODY_BYTES;
  }
  if (body === undefined) {
    socket.destroy();
    const reason = `Airlock egress: request bodies carrying secrets are limited to ${MAX_SWAPPED_BODY_BYTES} bytes`;
    cx.denied(protocol, hostKey, port, reason, 'body_too_large', started);
    return void sendText(res, 413, reason);
  }
  x.bytesUp = body.length;
  const scan = scanBufferedBody(lease, hostKey, body, secrets);
  if (!scan.ok) {
    socket.destroy();
    cx.denied(protocol, hostKey, port, scan.reason, scan.code, started, {
      address: x.address,
      ...(scan.alert ? { alert: scan.alert } : {}),
    });
    return void sendText(res, 403, scan.reason);
  }
  return { body: scan.body, swapped: scan.swapped };
}

/**
 * Streamed request body: forwarded chunk by chunk, each checked (with an overlap) for sentinels of
 * secrets not bound to this host and for canaries before it leaves.
 */
function streamBody(
  x: Exchange,
  upstream: ReturnType<typeof httpRequest>,
  lease: SecretLease | undefined,
): void {
  const { cx, protocol, hostKey, port, started, req, res } = x;
  const scanner = lease ? new StreamScanner(lease, hostKey) : undefined;
  req.on('data', (d: Buffer) => {
    if (x.blocked) return; // drained, never forwarded
    x.bytesUp += d.length;
    const found = scanner?.push(d);
    if (found) {
      x.blocked = true;
      upstream.destroy();
      const { reason, alert } = streamedBodyReason(found);
      cx.denied(protocol, hostKey, port, reason, alert, started, {
        address: x.address,
        alert,
        bytesUp: x.bytesUp,
        bytesDown: x.bytesDown,
      });
      sendText(res, 403, reason);
      return;
    }
    if (!upstream.write(d)) {
      req.pause();
      upstream.once('drain', () => req.resume());
    }
  });
  req.on('end', () => {
    if (!x.blocked) upstream.end();
  });
}
