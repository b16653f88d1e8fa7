// SECURITY-CRITICAL: decides which path a tunnel's bytes take.
//
// A CONNECT or SOCKS5 tunnel, or an intercepted connection, has been vetted for one host:port. Before
// any byte goes upstream, this reads what the client sends first and says what the tunnel carries:
//   - plain HTTP: the gateway hands the connection to its HTTP path, where every request is vetted
//     and pinned to the tunnel's host (pin.ts); never a raw relay (a raw relay would forward requests
//     for other virtual hosts behind the same address, and pipelined ones, unseen);
//   - TLS: its ClientHello, read whole (bounded), so the gateway can check the name it asks for;
//   - something else, or a server that speaks first (SSH, SMTP...): the raw relay.
// There is no time limit on the client's FIRST byte (the server may speak first, and waiting costs the
// client nothing it could not get otherwise); once bytes have come, the decision is made by
// `deadlineMs` at the latest, on what has arrived, and a prefix that could still be HTTP counts as
// HTTP (pin.ts classifyFirstBytes with final=true): waiting cannot buy a raw relay.
import type { Socket } from 'node:net';
import { classifyFirstBytes } from './pin.js';
import { MAX_CLIENT_HELLO_BYTES, parseClientHello, type ClientHelloResult } from './sni.js';

export type Sniffed =
  /** The client spoke first. `bytes` were read from it (not yet forwarded anywhere). */
  | { from: 'client'; kind: 'http' | 'other'; bytes: Buffer }
  | { from: 'client'; kind: 'tls'; bytes: Buffer; hello: ClientHelloResult }
  /** The upstream spoke first: its bytes were put back (unshift), the client sent nothing yet. */
  | { from: 'upstream' }
  /** A side closed (or ended) before anything was decided. */
  | { from: 'none' };

/**
 * Wait for the first bytes of `client` (after `early`, bytes already read from it) or of `upstream`
 * (optional), whichever comes first, and classify them. Both sockets are left paused, with every
 * listener this added removed.
 */
export function sniffTunnel(
  client: Socket,
  upstream: Socket | undefined,
  early: Buffer,
  deadlineMs: number,
): Promise<Sniffed> {
  const decide = (buf: Buffer, final: boolean): Sniffed | undefined => {
    const kind = classifyFirstBytes(buf, final);
    if (kind === 'incomplete') return undefined;
    if (kind !== 'tls') return { from: 'client', kind, bytes: buf };
    const hello = parseClientHello(buf);
    if (hello.kind === 'incomplete' && !final && buf.length < MAX_CLIENT_HELLO_BYTES) return undefined;
    return { from: 'client', kind, bytes: buf, hello };
  };
  const now = early.length ? decide(early, false) : undefined;
  if (now) return Promise.resolve(now);
  return new Promise((resolve) => {
    let buf = early;
    let timer: NodeJS.Timeout | undefined;
    const finish = (s: Sniffed): void => {
      clearTimeout(timer);
      client.off('data', onClient).off('end', onGone).off('close', onGone);
      upstream?.off('data', onUpstream).off('end', onGone).off('close', onGone);
      client.pause();
      upstream?.pause();
      resolve(s);
    };
    const startTimer = (): void => {
      timer ??= setTimeout(() => finish(decide(buf, true) ?? { from: 'none' }), deadlineMs);
    };
    const onClient = (d: Buffer): void => {
      buf = buf.length ? Buffer.concat([buf, d]) : d;
      const s = decide(buf, false);
      if (s) finish(s);
      else startTimer();
    };
    const onUpstream = (d: Buffer): void => {
      upstream!.pause(); // before unshift: a flowing stream could hand the bytes straight back
      upstream!.unshift(d);
      // Bytes from the client that do not make a decision yet, then the server speaks: not HTTP.
      finish(buf.length ? (decide(buf, true) ?? { from: 'none' }) : { from: 'upstream' });
    };
    const onGone = (): void =>
      finish(buf.length ? (decide(buf, true) ?? { from: 'none' }) : { from: 'none' });
    if (buf.length) startTimer();
    client.on('data', onClient).once('end', onGone).once('close', onGone);
    upstream?.once('data', onUpstream).once('end', onGone).once('close', onGone);
    client.resume();
    upstream?.resume();
  });
}
