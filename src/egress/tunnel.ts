// SECURITY-CRITICAL: tunnels. A CONNECT or SOCKS5 target (or a transparent connection, transparent.ts)
// is vetted and dialled; then what the client sends first decides the path (sniff.ts): plain HTTP goes
// to the pinned HTTP path (forward.ts, never a raw relay), TLS must ask for the vetted host by SNI,
// a host with a bound secret has its TLS terminated (intercept), anything else is relayed — by the fd
// relay's worker when nothing needs to see the bytes, else through Node with every byte scanned.
import type { IncomingMessage } from 'node:http';
import type { Socket } from 'node:net';
import { TLSSocket } from 'node:tls';
import { canonicalHost } from '../core/address.js';
import { StreamScanner, tunnelReason } from '../secrets/exfil.js';
import {
  ALLOWED_REASON,
  HEADERS_TIMEOUT_MS,
  IDLE_TIMEOUT_MS,
  MAX_SOCKETS_PER_SANDBOX,
  type EgressContext,
  type Vetted,
} from './context.js';
import type { EgressProtocol } from './events.js';
import { firstHost, forbidden, parseAuthority, rawHeaderPairs } from './http-util.js';
import { parseResponseHead } from './http-head.js';
import { pinRequest, sameHost } from './pin.js';
import { flushed, RELAY_FDS, type FdRelay } from './relay.privileged.js';
import { sniffTunnel } from './sniff.js';
import type { ClientHelloResult } from './sni.js';
import {
  HOST_UNREACHABLE,
  METHOD_NO_ACCEPTABLE,
  NOT_ALLOWED,
  SUCCEEDED,
  selectSocks5Method,
  socks5Greeting,
  socks5MethodReply,
  socks5Reply,
  socks5Request,
} from './socks.js';

// ---- proxy: HTTP CONNECT ------------------------------------------------------------------------

export async function onConnect(
  cx: EgressContext,
  req: IncomingMessage,
  sock: Socket,
  head: Buffer,
): Promise<void> {
  const started = Date.now();
  const target = parseAuthority(req.url ?? '');
  if (!target) return void sock.end(forbidden('Airlock egress: CONNECT needs host:port'));
  const res = await cx.vet(target.host, target.port);
  if (!res.ok) {
    cx.denyEvent('connect', res, target.port, started);
    return void sock.end(forbidden(res.verdict.reason));
  }
  sock.write('HTTP/1.1 200 Connection Established\r\n\r\n');
  await tunnel(cx, 'connect', sock, res, target.port, started, head);
}

// ---- proxy: SOCKS5 ------------------------------------------------------------------------------

export async function onSocks(cx: EgressContext, sock: Socket, first: Buffer): Promise<void> {
  const started = Date.now();
  let buf = first;
  const more = (): Promise<Buffer> =>
    new Promise((resolve, reject) => {
      const onData = (d: Buffer): void => {
        sock.off('close', onClose);
        resolve(d);
      };
      const onClose = (): void => {
        sock.off('data', onData);
        reject(new Error('closed'));
      };
      sock.once('data', onData);
      sock.once('close', onClose);
    });
  // The whole handshake must complete in time, however slowly bytes trickle in.
  const deadline = setTimeout(() => sock.destroy(), HEADERS_TIMEOUT_MS);
  try {
    let g = socks5Greeting(buf);
    while (g.kind === 'incomplete') g = socks5Greeting((buf = Buffer.concat([buf, await more()])));
    if (g.kind === 'invalid') return void sock.destroy();
    const method = selectSocks5Method(g.methods);
    sock.write(socks5MethodReply(method));
    if (method === METHOD_NO_ACCEPTABLE) return void sock.end();
    buf = buf.subarray(g.consumed);
    let r = socks5Request(buf);
    while (r.kind === 'incomplete') r = socks5Request((buf = Buffer.concat([buf, await more()])));
    if (r.kind === 'invalid') return void sock.end(socks5Reply(r.reply));
    clearTimeout(deadline);
    // Keep anything the client sends before our reply: paused until the tunnel pipes it.
    sock.pause();
    const res = await cx.vet(r.host, r.port);
    if (!res.ok) {
      cx.denyEvent('socks5', res, r.port, started);
      const unreachable = res.verdict.code === 'resolve_failed' || res.verdict.code === 'connect_failed';
      return void sock.end(socks5Reply(unreachable ? HOST_UNREACHABLE : NOT_ALLOWED));
    }
    sock.write(socks5Reply(SUCCEEDED, { address: '0.0.0.0', port: 0 }));
    await tunnel(cx, 'socks5', sock, res, r.port, started, buf.subarray(r.consumed));
  } catch {
    sock.destroy();
  } finally {
    clearTimeout(deadline);
  }
}

// ---- a vetted tunnel: what it carries decides its path --------------------------------------------

/**
 * A vetted tunnel (CONNECT, SOCKS5, or a transparent connection decided by its address): what the
 * client sends first decides its path. Plain HTTP goes to the HTTP path with every request pinned to
 * r.host:port (never a raw relay); TLS must ask for r.host by SNI; anything else is relayed.
 */
export async function tunnel(
  cx: EgressContext,
  protocol: EgressProtocol,
  client: Socket,
  r: Vetted,
  port: number,
  started: number,
  early?: Buffer,
): Promise<void> {
  // The upstream is open while the first bytes are awaited: it counts against the sandbox's fds
  // (and Airlock's fd budget) from now on, not only once the tunnel is relayed.
  cx.hold(r.socket);
  const s = await sniffTunnel(client, r.socket, early ?? Buffer.alloc(0), HEADERS_TIMEOUT_MS);
  if (s.from === 'none') {
    r.socket.destroy();
    client.destroy();
    return cx.emitAllowed(protocol, r.host, port, r.address, { bytesUp: 0, bytesDown: 0 }, started);
  }
  if (s.from === 'client' && s.kind === 'http') {
    r.socket.destroy(); // each request dials its own vetted connection
    const http = protocol === 'transparent-tcp' ? 'transparent-http' : protocol;
    return cx.httpOver(client, s.bytes, { host: r.host, port, protocol: http });
  }
  if (s.from === 'client' && s.kind === 'tls') {
    const why = sniProblem(s.hello, r.host);
    if (why) {
      r.socket.destroy();
      client.destroy();
      return cx.denied(protocol, r.host, port, why, 'mismatch', started, { address: r.address });
    }
  }
  const early2 = s.from === 'client' ? s.bytes : undefined;
  if (cx.o.secrets?.boundHosts().has(r.host)) return intercept(cx, protocol, client, r, port, early2);
  relayTunnel(cx, protocol, client, r, port, started, early2);
}

/**
 * Why a TLS tunnel decided for `host` must not go on, or undefined: its ClientHello must be readable
 * and name `host` (or no name at all), so a shared TLS front end cannot route it to another virtual host.
 */
export function sniProblem(hello: ClientHelloResult, host: string): string | undefined {
  const base = 'blocked by Airlock egress policy: ';
  if (hello.kind !== 'tls')
    return `${base}the TLS ClientHello to ${host} could not be read (${hello.kind === 'invalid' ? hello.reason : hello.kind})`;
  if (hello.ech)
    return `${base}the client offered Encrypted Client Hello to ${host}, which hides the name it asks for; turn ECH off`;
  if (hello.serverName !== undefined && !sameHost(hello.serverName, host))
    return `${base}the tunnel to ${host} asks for ${hello.serverName} by TLS SNI; the name must match the tunnel's host`;
  return undefined;
}

/**
 * Terminate the client's TLS with a leaf cert for res.host (hosts with a bound secret). Each request
 * inside is then forwarded over its own freshly vetted, certificate-verified TLS connection.
 */
export function intercept(
  cx: EgressContext,
  protocol: EgressProtocol,
  client: Socket,
  res: Vetted,
  port: number,
  head?: Buffer,
): void {
  res.socket.destroy(); // the decision is made; requests dial their own upstream
  if (head && head.length) client.unshift(head);
  const ca = cx.opts.ca();
  const tlsClient = new TLSSocket(client, { isServer: true, secureContext: ca.secureContextFor(res.host) });
  tlsClient.on('error', () => client.destroy());
  tlsClient.on('secure', () => {
    // The name the client asked for inside the tunnel must be the one that was decided on.
    const sni = tlsClient.servername;
    if (typeof sni === 'string' && sni.toLowerCase() !== res.host) tlsClient.destroy();
  });
  cx.serveIntercepted(tlsClient, { host: res.host, port, protocol });
}

// ---- relaying ---------------------------------------------------------------------------------------

/**
 * Relay client <-> upstream, then report one event with the byte counts. With no secrets and no
 * canaries nothing needs to see the bytes, so the fd relay's worker moves them; otherwise they
 * go through Node and what the sandbox sends is inspected.
 */
export function relayTunnel(
  cx: EgressContext,
  protocol: EgressProtocol,
  client: Socket,
  r: Vetted,
  port: number,
  started: number,
  early?: Buffer,
): void {
  cx.hold(r.socket);
  const relay = cx.o.secrets ? undefined : cx.relay;
  if (relay) return cx.guard(fdRelay(cx, relay, protocol, client, r, port, started, early), client);
  streamRelay(cx, protocol, client, r, port, started, early);
}

async function fdRelay(
  cx: EgressContext,
  relay: FdRelay,
  protocol: EgressProtocol,
  client: Socket,
  r: Vetted,
  port: number,
  started: number,
  early?: Buffer,
): Promise<void> {
  const up = r.socket;
  // What Node still has to write (the CONNECT / SOCKS reply) must reach the kernel first.
  await Promise.all([flushed(client), flushed(up)]);
  // A relayed tunnel holds RELAY_FDS instead of its two sockets: only if the sandbox's fd budget allows.
  const fits = cx.fds() + RELAY_FDS - 2 <= MAX_SOCKETS_PER_SANDBOX;
  const t =
    !cx.closed && fits ? relay.take(client, up, { upPrefix: early, idleMs: IDLE_TIMEOUT_MS }) : undefined;
  if (!t) return streamRelay(cx, protocol, client, r, port, started, early);
  // take() destroyed both sockets; the tunnel counts for them now.
  const release = cx.trackRelayed(t, [client, up]);
  const res = await t.done;
  release();
  cx.emitAllowed(protocol, r.host, port, r.address, res, started);
}

/** The relay through Node streams (the only one when bytes must be inspected). */
function streamRelay(
  cx: EgressContext,
  protocol: EgressProtocol,
  client: Socket,
  r: Vetted,
  port: number,
  started: number,
  early?: Buffer,
): void {
  const up = r.socket;
  let bytesUp = 0;
  let bytesDown = 0;
  let blocked: { reason: string; alert: 'sentinel' | 'canary' } | undefined;
  // What the sandbox sends is checked (with an overlap across chunks) for sentinels of secrets not
  // bound to this host and for canaries before it is forwarded. Inside TLS this finds nothing,
  // by design: only plain protocols are visible here.
  const lease = cx.o.secrets;
  const scanner = lease ? new StreamScanner(lease, r.host) : undefined;
  const forward = (d: Buffer): void => {
    bytesUp += d.length;
    const found = scanner?.push(d);
    if (found) {
      blocked = tunnelReason(found, r.host);
      return done();
    }
    if (!up.write(d)) {
      client.pause();
      up.once('drain', () => client.resume());
    }
  };
  up.on('data', (d: Buffer) => (bytesDown += d.length));
  up.pipe(client);
  let reported = false;
  const done = (): void => {
    if (reported) return;
    reported = true;
    client.destroy();
    up.destroy();
    cx.emit({
      protocol,
      host: r.host,
      port,
      address: r.address,
      decision: blocked ? 'deny' : 'allow',
      reason: blocked?.reason ?? ALLOWED_REASON,
      ...(blocked ? { code: blocked.alert, alert: blocked.alert } : {}),
      bytesUp,
      bytesDown,
      durationMs: Date.now() - started,
    });
  };
  if (early && early.length) forward(early);
  if (lease) {
    client.on('data', forward);
    client.on('end', () => up.end());
    client.resume();
  } else {
    // Nothing to look for: let streams move the bytes (with their own backpressure).
    client.on('data', (d: Buffer) => (bytesUp += d.length));
    client.pipe(up);
  }
  up.on('error', done);
  client.on('error', done);
  up.on('close', done);
  client.on('close', done);
  if (client.destroyed || up.destroyed) done(); // closed while the tunnel was being set up
}

// ---- protocol upgrades on a decided plain-HTTP connection --------------------------------------------

/**
 * An Upgrade request (ws://) on a decided plain-HTTP connection: pinned like any request, then sent
 * on its own vetted connection; only a 101 answer turns the connection into a relayed tunnel (any
 * other answer is passed on and both connections close, so no later request goes unvetted). A
 * sandbox with secrets or canaries is refused: nothing would inspect the upgraded stream's head.
 */
export async function onPinnedUpgrade(
  cx: EgressContext,
  req: IncomingMessage,
  sock: Socket,
  head: Buffer,
): Promise<void> {
  const started = Date.now();
  const t = cx.pinnedOf(req);
  if (!t) return void sock.destroy();
  const host = (t.host ??= firstHost(req) ?? t.fallback!);
  const pin = pinRequest(
    { url: req.url ?? '/', rawHeaders: req.rawHeaders },
    { host: host, port: t.port, scheme: 'http' },
  );
  if (!pin.ok) {
    cx.denied(t.protocol, host, t.port, pin.reason, 'mismatch', started);
    return void sock.end(forbidden(pin.reason));
  }
  if (cx.o.secrets) {
    const reason =
      'Airlock egress: protocol upgrades (ws://) over plain HTTP are not relayed for a sandbox with secrets; use TLS (wss://)';
    cx.denied(t.protocol, host, t.port, reason, 'upgrade', started);
    return void sock.end(forbidden(reason));
  }
  const vetted = await cx.vet(host, t.port);
  if (!vetted.ok) {
    cx.denyEvent(t.protocol, vetted, t.port, started);
    return void sock.end(forbidden(vetted.verdict.reason));
  }
  const up = vetted.socket;
  cx.hold(up);
  const c = canonicalHost(host);
  const hostHeader = `${c.kind === 'ip' && c.family === 6 ? `[${host}]` : host}${t.port === 80 ? '' : `:${t.port}`}`;
  const lines = [`${req.method ?? 'GET'} ${pin.path} HTTP/1.1`, `Host: ${hostHeader}`];
  for (const [k, v] of rawHeaderPairs(req))
    if (!/^(host|proxy-connection|proxy-authorization)$/i.test(k)) lines.push(`${k}: ${v}`);
  up.write(`${lines.join('\r\n')}\r\n\r\n`, 'latin1');
  if (head.length) up.write(head);
  // The answer's head decides: 101 → a tunnel; anything else → passed on, then both close.
  let buf = Buffer.alloc(0);
  let decided = false;
  const onData = (d: Buffer): void => {
    buf = Buffer.concat([buf, d]);
    const h = parseResponseHead(buf, req.method ?? 'GET');
    if (h.kind === 'incomplete') return;
    decided = true;
    up.off('data', onData);
    up.pause();
    sock.write(buf);
    if (h.kind === 'response' && h.status === 101)
      return relayTunnel(cx, t.protocol, sock, vetted, t.port, started);
    up.pipe(sock);
    up.once('close', () => sock.destroy());
    sock.once('close', () => up.destroy());
    cx.emitAllowed(t.protocol, host, t.port, vetted.address, { bytesUp: 0, bytesDown: buf.length }, started);
  };
  up.on('data', onData);
  up.once('close', () => decided || sock.destroy());
}
