// SECURITY-CRITICAL: transparent interception. Every outbound TCP connection of a sandbox that does
// not use the proxy is redirected (nftables) to 10.255.255.254:15001; its original destination and
// the DNS name its synthetic address was handed out for (dns.ts) say where it meant to go, and what
// the client sends first (Host, TLS SNI) must agree. The connection is then vetted like any other
// and goes down the same paths as a tunnel (tunnel.ts) or the pinned HTTP path (forward.ts).
import type { Socket } from 'node:net';
import { HEADERS_TIMEOUT_MS, type EgressContext } from './context.js';
import type { EgressProtocol } from './events.js';
import { canonicalName, forbidden } from './http-util.js';
import { sniffTunnel } from './sniff.js';
import { intercept, relayTunnel, sniProblem, tunnel } from './tunnel.js';

/** Wait this long for the client's first bytes (SNI / Host) before deciding without them. */
const FIRST_BYTES_TIMEOUT_MS = 300;

export interface TransparentTarget {
  /** Where the connection was going (the redirect's original destination). */
  readonly address: string;
  readonly port: number;
  /** The DNS name the sandbox's DNS handed this address out for, if it is a synthetic one. */
  readonly synthetic: string | undefined;
}

export async function onTransparent(cx: EgressContext, sock: Socket, dst: TransparentTarget): Promise<void> {
  const started = Date.now();
  const { synthetic } = dst;
  const first = await firstBytes(sock, FIRST_BYTES_TIMEOUT_MS);
  if (first.length === 0) {
    // The client waits for the server (or is slow): decided by the address's name; what the client
    // sends later is still looked at (tunnel()), so waiting cannot buy a raw relay for HTTP.
    const res = await cx.vet(synthetic ?? dst.address, dst.port);
    if (!res.ok) {
      cx.denyEvent('transparent-tcp', res, dst.port, started);
      return void sock.destroy();
    }
    return tunnel(cx, 'transparent-tcp', sock, res, dst.port, started);
  }
  const s = await sniffTunnel(sock, undefined, first, HEADERS_TIMEOUT_MS);
  if (s.from !== 'client') return void sock.destroy();
  if (s.kind === 'http') {
    // Every request on the connection is vetted, pinned to the decided host and checked for
    // sentinels (forwardPinned): the DNS name of its address, else the first request's Host.
    return cx.httpOver(
      sock,
      s.bytes,
      synthetic
        ? { host: synthetic, port: dst.port, protocol: 'transparent-http' }
        : { fallback: dst.address, port: dst.port, protocol: 'transparent-http' },
    );
  }
  const protocol: EgressProtocol = s.kind === 'tls' ? 'transparent-tls' : 'transparent-tcp';
  const named = s.kind === 'tls' && s.hello.kind === 'tls' ? s.hello.serverName : undefined;
  // The name a connection means: the DNS name its synthetic address was handed out for, else what
  // the client says (SNI), else the literal address. A mismatch is refused (no fronting).
  const host = synthetic ?? named ?? dst.address;
  if (synthetic && named && canonicalName(named) !== canonicalName(synthetic)) {
    const reason = `blocked by Airlock egress policy: connection to ${synthetic} names ${named}; the name must match the address it was resolved for`;
    cx.denied(protocol, synthetic, dst.port, reason, 'mismatch', started);
    return void denyTransparent(sock, protocol, reason);
  }
  const res = await cx.vet(host, dst.port);
  if (!res.ok) {
    cx.denyEvent(protocol, res, dst.port, started);
    return void denyTransparent(sock, protocol, res.verdict.reason);
  }
  if (s.kind === 'tls') {
    const why = sniProblem(s.hello, res.host);
    if (why) {
      res.socket.destroy();
      cx.denied(protocol, res.host, dst.port, why, 'mismatch', started, { address: res.address });
      return void sock.destroy();
    }
    if (cx.o.secrets?.boundHosts().has(res.host))
      return intercept(cx, 'transparent-tls', sock, res, dst.port, s.bytes);
  }
  relayTunnel(cx, protocol, sock, res, dst.port, started, s.bytes);
}

/** Denials on intercepted connections: HTTP gets a 403 with the reason; others are closed. */
function denyTransparent(sock: Socket, protocol: EgressProtocol, reason: string): void {
  if (protocol === 'transparent-http') sock.end(forbidden(reason));
  else sock.destroy();
}

/** The bytes a client sends first, or nothing if it waits for the server (SSH, SMTP, ...). */
function firstBytes(sock: Socket, timeoutMs: number): Promise<Buffer> {
  return new Promise((resolve) => {
    const t = setTimeout(() => {
      sock.removeListener('data', onData);
      sock.pause();
      resolve(Buffer.alloc(0));
    }, timeoutMs);
    const onData = (d: Buffer): void => {
      clearTimeout(t);
      sock.pause();
      resolve(d);
    };
    sock.once('data', onData);
  });
}
