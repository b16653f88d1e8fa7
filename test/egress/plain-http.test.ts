// Plain-HTTP forwarding of a sandbox without secrets (src/egress/plain-http.ts): the response head is
// parsed by the gateway, the body moved without Node's HTTP machinery (Content-Length bodies by the
// fd relay). Most cases drive the gateway directly, its proxy and transparent listeners bound in
// this test's private network namespace and the clients in this process, so bytes, closes, file
// descriptors and the relay are observable. The upstream is a raw TCP server, so framing (chunked,
// close-delimited, interim responses, a death mid-body) is exactly what each case says. The last cases
// run real sandboxes: curl on both paths, and the sentinel swap of a sandbox with secrets.
import { createHash } from 'node:crypto';
import { readdirSync, readlinkSync } from 'node:fs';
import {
  Agent,
  createServer as createHttpServer,
  request,
  type IncomingMessage,
  type Server as HttpServer,
} from 'node:http';
import { connect, createServer, type Server, type Socket } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type EgressPlumbing } from '../../src/core/backend.js';
import type { EgressEvent } from '../../src/egress/events.js';
import { EgressGateway, type SandboxEgress } from '../../src/egress/gateway.js';
import { ChunkedDecoder, parseResponseHead } from '../../src/egress/http-head.js';
import { NetworkPolicySchema } from '../../src/policy/network.js';
import { canRunNamespaces } from '../helpers.js';
import { startEgressWorld, until, type EgressWorld } from './harness.js';
import { ALLOWED, assertPrivateNetns, listenClosable, listenFd, testGateway, SECRET_HOST } from './net.js';

assertPrivateNetns();

const PORT = 7200;
/** A Node http server that answers with the hash of the request body it received. */
const SINK_PORT = 7201;
const MiB = 1024 * 1024;
const AUTHORITY = `${ALLOWED.name}:${PORT}`;
/**
 * Open sockets, pipes and epoll/event fds of this process: what a tunnel or the relay worker uses. Files
 * and namespace fds are left out: sandboxes of other tests in this process open and close those (their
 * cgroup.procs files, their netns) on their own schedule, e.g. when a deferred teardown finishes.
 */
const fdCount = (): number =>
  readdirSync('/proc/self/fd').filter((fd) => {
    try {
      return /^(socket|pipe|anon_inode):/.test(readlinkSync(`/proc/self/fd/${fd}`));
    } catch {
      return false; // closed meanwhile (or the readdir's own fd)
    }
  }).length;
const sha = (b: Buffer): string => createHash('sha256').update(b).digest('hex');

/** Deterministic content: byte i of every body is BIG[i]. */
const BIG = Buffer.alloc(64 * MiB);
for (let i = 0; i < BIG.length; i += 4)
  BIG.writeUInt32LE(((Math.imul(i, 2654435761) >>> 0) ^ (i >>> 7)) >>> 0, i);

// ---- the upstream: a raw HTTP/1.1 server on 203.0.113.10:7200 ------------------------------------------

interface UpstreamConn {
  readonly path: string;
  readonly method: string;
  readonly head: string;
  open: boolean;
}

/**
 * One request per connection (the gateway sends Connection: close). By path:
 *   /len/N        Content-Length N (BIG[0..N])          /chunked/N   chunked, uneven chunk sizes, a trailer
 *   /close/N      no length: N bytes, then close         /204, /304   no body (304 with a Content-Length)
 *   /die/N        Content-Length 2N, N bytes, then a reset    /chunkdie/N  the same in a chunk of 2N
 *   /endless/N    Content-Length N, sent only as fast as the client reads (for aborts)
 *   /interim      "100 Continue" and "103 Early Hints" before a 200 "ok"
 *   /bad          Content-Length and Transfer-Encoding together
 */
function startUpstream(): Promise<{ conns: UpstreamConn[]; close(): Promise<void> }> {
  const conns: UpstreamConn[] = [];
  const sockets = new Set<Socket>();
  const server: Server = createServer((sock) => {
    sockets.add(sock);
    sock.on('error', () => {});
    sock.on('close', () => sockets.delete(sock));
    let buf = Buffer.alloc(0);
    const onData = (d: Buffer): void => {
      buf = Buffer.concat([buf, d]);
      const end = buf.indexOf('\r\n\r\n');
      if (end < 0) return;
      sock.off('data', onData);
      sock.resume(); // whatever else comes is ignored
      const head = buf.subarray(0, end).toString('latin1');
      const [method = '', path = ''] = head.split(' ');
      const c: UpstreamConn = { path, method, head, open: true };
      conns.push(c);
      sock.on('close', () => (c.open = false));
      serve(sock, method, path);
    };
    sock.on('data', onData);
  });
  return listenClosable(server, sockets, PORT, ALLOWED.address, { conns });
}

function serve(sock: Socket, method: string, path: string): void {
  const [, kind = '', n = '0'] = path.split('/');
  const size = Number(n);
  const body = method === 'HEAD' ? Buffer.alloc(0) : BIG.subarray(0, size);
  const h = (lines: string[]): string => `HTTP/1.1 ${lines.join('\r\n')}\r\n\r\n`;
  switch (kind) {
    case 'len':
      sock.write(h(['200 OK', `Content-Length: ${size}`, 'X-Test: len']));
      return void sock.end(body);
    case 'chunked': {
      sock.write(h(['200 OK', 'Transfer-Encoding: chunked']));
      const sizes = [1, 4095, 65536, 1, MiB, 3 * MiB + 17];
      let at = 0;
      for (let i = 0; at < body.length; i++) {
        const part = body.subarray(at, at + sizes[i % sizes.length]!);
        at += part.length;
        sock.write(`${part.length.toString(16)}${i % 2 ? ';ext=1' : ''}\r\n`);
        sock.write(part);
        sock.write('\r\n');
      }
      return void sock.end('0\r\nX-Trailer: yes\r\n\r\n');
    }
    case 'close':
      sock.write(h(['200 OK', 'Connection: close']));
      return void sock.end(body);
    case '204':
      return void sock.end(h(['204 No Content']));
    case '304':
      return void sock.end(h(['304 Not Modified', 'Content-Length: 1234', 'ETag: "x"']));
    case 'die':
      sock.write(h(['200 OK', `Content-Length: ${2 * size}`]));
      return void sock.write(body, () => setTimeout(() => sock.resetAndDestroy(), 50));
    case 'chunkdie':
      sock.write(h(['200 OK', 'Transfer-Encoding: chunked']) + `${(2 * size).toString(16)}\r\n`);
      return void sock.write(body, () => setTimeout(() => sock.resetAndDestroy(), 50));
    case 'endless': {
      sock.write(h(['200 OK', `Content-Length: ${size}`]));
      let at = 0;
      const pump = (): void => {
        while (at < size) {
          const part = BIG.subarray(at % BIG.length, Math.min(BIG.length, (at % BIG.length) + MiB));
          at += part.length;
          if (!sock.write(part)) return void sock.once('drain', pump);
        }
        sock.end();
      };
      return pump();
    }
    case 'interim':
      sock.write('HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n');
      return void sock.end(h(['200 OK', 'Content-Length: 2']) + 'ok');
    case 'bad':
      return void sock.end(h(['200 OK', 'Content-Length: 2', 'Transfer-Encoding: chunked']) + 'ok');
    default:
      return void sock.end(h(['404 Not Found', 'Content-Length: 0']));
  }
}

// ---- a gateway whose "sandbox" listeners are plain sockets in this namespace ---------------------

let nextPort = 25000;

interface Attached {
  readonly gw: EgressGateway;
  readonly egress: SandboxEgress;
  readonly events: EgressEvent[];
  /** The proxy (absolute-form requests). */
  readonly proxyPort: number;
  /** The transparent listener: every connection to it "was" to allowed.test:7200. */
  readonly transparentPort: number;
  close(): Promise<void>;
}

function attach(fdRelay = true, port = PORT): Attached {
  const gw = testGateway(fdRelay);
  const proxyPort = nextPort++;
  const transparentPort = nextPort++;
  const dnsPort = nextPort++;
  const plumbing: EgressPlumbing = {
    listen: (kind, _address, p) =>
      listenFd(kind, p === 53 ? dnsPort : p === 3128 ? proxyPort : transparentPort),
    interceptTcp: () => {},
    bindReadOnlyFiles: () => {},
    originalDestination: () => ({ address: ALLOWED.address, port }),
  };
  const events: EgressEvent[] = [];
  const egress = gw.attach({
    sandboxId: `plain-http-test-${proxyPort}`,
    plumbing,
    policy: NetworkPolicySchema.parse({
      allow: [AUTHORITY, `${ALLOWED.name}:${SINK_PORT}`],
      transparent: true,
    }),
    onEvent: (e) => events.push(e),
  });
  return {
    gw,
    egress,
    events,
    proxyPort,
    transparentPort,
    close: async () => {
      await egress.close();
      await gw.close();
    },
  };
}

// ---- the client: Node's http client, one keep-alive connection per agent ------------------------------

type Path = 'proxy' | 'transparent';

interface Got {
  readonly status: number;
  readonly headers: IncomingMessage['headers'];
  readonly rawHeaders: string[];
  readonly bytes: number;
  readonly sha: string;
  /** The whole message arrived (its length or last chunk), as opposed to the connection closing early. */
  readonly complete: boolean;
  readonly reusedSocket: boolean;
  readonly localPort: number | undefined;
  /** The start of the body (for messages). */
  readonly text: string;
}

function get(
  a: Attached,
  path: Path,
  url: string,
  o: {
    agent?: Agent;
    method?: string;
    onResponse?: (res: IncomingMessage) => void;
    port?: number;
    /** A request body, sent in these pieces (chunked unless `length`). */
    body?: Buffer[];
    length?: boolean;
  } = {},
): Promise<Got> {
  const authority = `${ALLOWED.name}:${o.port ?? PORT}`;
  return new Promise((resolve, reject) => {
    const total = (o.body ?? []).reduce((n, b) => n + b.length, 0);
    const req = request({
      host: '127.0.0.1',
      port: path === 'proxy' ? a.proxyPort : a.transparentPort,
      method: o.method ?? 'GET',
      path: path === 'proxy' ? `http://${authority}${url}` : url,
      headers: {
        host: authority,
        ...(o.body ? (o.length ? { 'content-length': total } : { 'transfer-encoding': 'chunked' }) : {}),
      },
      agent: o.agent ?? false,
    });
    req.on('error', reject);
    req.on('response', (res) => {
      const h = createHash('sha256');
      let bytes = 0;
      let text = '';
      const localPort = res.socket.localPort;
      res.on('data', (d: Buffer) => {
        bytes += d.length;
        h.update(d);
        if (text.length < 500) text += d.toString('latin1').slice(0, 500);
      });
      const done = (): void =>
        resolve({
          status: res.statusCode ?? 0,
          headers: res.headers,
          rawHeaders: res.rawHeaders,
          bytes,
          sha: h.digest('hex'),
          complete: res.complete,
          reusedSocket: req.reusedSocket,
          localPort,
          text,
        });
      res.on('error', () => {}); // "aborted": reported as complete: false
      res.on('close', done);
      o.onResponse?.(res);
    });
    for (const b of o.body ?? []) req.write(b);
    req.end();
  });
}

/** Send `text` on a new connection and read until the gateway closes it. */
function rawExchange(port: number, text: string): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const s = connect({ host: '127.0.0.1', port }, () => s.write(text, 'latin1'));
    const parts: Buffer[] = [];
    s.on('data', (d: Buffer) => parts.push(d));
    s.on('error', reject);
    s.on('close', () => resolve(Buffer.concat(parts)));
  });
}

// ---- the cases -----------------------------------------------------------------------------------------

let upstream: Awaited<ReturnType<typeof startUpstream>>;
let sink: HttpServer;

beforeAll(async () => {
  upstream = await startUpstream();
  sink = createHttpServer((req, res) => {
    const h = createHash('sha256');
    let bytes = 0;
    req.on('data', (d: Buffer) => {
      bytes += d.length;
      h.update(d);
    });
    req.on('end', () => {
      const body = JSON.stringify({
        sha: h.digest('hex'),
        bytes,
        te: req.headers['transfer-encoding'] ?? null,
        cl: req.headers['content-length'] ?? null,
      });
      res.end(body);
    });
  });
  await new Promise<void>((r) => sink.listen(SINK_PORT, ALLOWED.address, r));
});

afterAll(async () => {
  await upstream?.close();
  sink?.closeAllConnections();
  await new Promise((r) => sink?.close(r));
});

describe.each<Path>(['proxy', 'transparent'])('plain HTTP without secrets, %s path', (path) => {
  const protocol = path === 'proxy' ? 'http' : 'transparent-http';

  it.each([
    ['fd relay', true],
    ['Node streams (fdRelay: false)', false],
  ])(
    '%s: a 48 MiB Content-Length body arrives intact, then a second request reuses the connection',
    async (_what, fdRelay) => {
      const a = attach(fdRelay);
      const agent = new Agent({ keepAlive: true, maxSockets: 1 });
      try {
        const size = 48 * MiB + 5;
        const first = await get(a, path, `/len/${size}`, { agent });
        expect(first.status, first.text).toBe(200);
        expect(first).toMatchObject({ status: 200, bytes: size, complete: true, reusedSocket: false });
        expect(first.sha).toBe(sha(BIG.subarray(0, size)));
        expect(first.headers['x-test']).toBe('len');
        const second = await get(a, path, '/len/1000', { agent });
        expect(second).toMatchObject({ status: 200, bytes: 1000, complete: true, reusedSocket: true });
        expect(second.localPort).toBe(first.localPort);
        expect(second.sha).toBe(sha(BIG.subarray(0, 1000)));
        // The upstream got Connection: close, and the Host that was decided on.
        expect(upstream.conns.at(-1)!.head).toMatch(/\r\nConnection: close(\r\n|$)/);
        expect(upstream.conns.at(-1)!.head).toMatch(new RegExp(`\r\nHost: ${AUTHORITY}\r\n`));
        await until(() => a.events.length >= 2);
        expect(a.events.map((e) => [e.protocol, e.decision, e.address, e.bytesUp, e.bytesDown])).toEqual([
          [protocol, 'allow', ALLOWED.address, 0, size],
          [protocol, 'allow', ALLOWED.address, 0, 1000],
        ]);
        expect(a.gw.relay?.size ?? 0).toBe(0);
      } finally {
        agent.destroy();
        await a.close();
      }
    },
    60_000,
  );

  it('chunked (uneven chunks, extensions, a trailer), close-delimited, 204, 304 and HEAD, all on one connection', async () => {
    const a = attach();
    const agent = new Agent({ keepAlive: true, maxSockets: 1 });
    try {
      const size = 9 * MiB + 3;
      const chunked = await get(a, path, `/chunked/${size}`, { agent });
      expect(chunked).toMatchObject({ status: 200, bytes: size, complete: true });
      expect(chunked.sha).toBe(sha(BIG.subarray(0, size)));
      const noContent = await get(a, path, '/204', { agent });
      expect(noContent).toMatchObject({ status: 204, bytes: 0, complete: true, reusedSocket: true });
      const notModified = await get(a, path, '/304', { agent });
      expect(notModified).toMatchObject({ status: 304, bytes: 0, complete: true, reusedSocket: true });
      expect(notModified.headers.etag).toBe('"x"');
      const head = await get(a, path, `/len/${4 * MiB}`, { agent, method: 'HEAD' });
      expect(head).toMatchObject({ status: 200, bytes: 0, complete: true, reusedSocket: true });
      expect(head.headers['content-length']).toBe(String(4 * MiB));
      const interim = await get(a, path, '/interim', { agent });
      expect(interim).toMatchObject({ status: 200, bytes: 2, complete: true, reusedSocket: true });
      // Close-delimited upstream body: the client gets all of it, framed (chunked) for keep-alive.
      const closeDelimited = await get(a, path, `/close/${2 * MiB}`, { agent });
      expect(closeDelimited).toMatchObject({
        status: 200,
        bytes: 2 * MiB,
        complete: true,
        reusedSocket: true,
      });
      expect(closeDelimited.sha).toBe(sha(BIG.subarray(0, 2 * MiB)));
      const after = await get(a, path, '/len/10', { agent });
      expect(after).toMatchObject({ status: 200, bytes: 10, complete: true, reusedSocket: true });
      await until(() => a.events.length >= 7);
      expect(a.events.map((e) => e.bytesDown)).toEqual([size, 0, 0, 0, 2, 2 * MiB, 10]);
    } finally {
      agent.destroy();
      await a.close();
    }
  });

  it('request bodies (Content-Length and chunked, 8 MiB each) reach the upstream intact, on one connection', async () => {
    const a = attach(true, SINK_PORT);
    const agent = new Agent({ keepAlive: true, maxSockets: 1 });
    try {
      const body = BIG.subarray(5 * MiB, 13 * MiB);
      const pieces = [body.subarray(0, 1), body.subarray(1, 3 * MiB), body.subarray(3 * MiB)];
      const results = [];
      for (const length of [true, false]) {
        const r = await get(a, path, '/upload', {
          agent,
          method: 'POST',
          body: pieces,
          length,
          port: SINK_PORT,
        });
        expect(r.status, r.text).toBe(200);
        results.push({ ...JSON.parse(r.text), reused: r.reusedSocket });
      }
      expect(results).toEqual([
        { sha: sha(body), bytes: body.length, te: null, cl: String(body.length), reused: false },
        { sha: sha(body), bytes: body.length, te: 'chunked', cl: null, reused: true },
      ]);
      await until(() => a.events.length >= 2);
      expect(a.events.map((e) => e.bytesUp)).toEqual([body.length, body.length]);
    } finally {
      agent.destroy();
      await a.close();
    }
  });

  it('an HTTP/1.0 client gets a chunked upstream body unchunked, ended by the close', async () => {
    const a = attach();
    try {
      const size = 300_000;
      const target = path === 'proxy' ? `http://${AUTHORITY}/chunked/${size}` : `/chunked/${size}`;
      const port = path === 'proxy' ? a.proxyPort : a.transparentPort;
      const reply = await rawExchange(port, `GET ${target} HTTP/1.0\r\nHost: ${AUTHORITY}\r\n\r\n`);
      const end = reply.indexOf('\r\n\r\n');
      const head = reply.subarray(0, end).toString('latin1');
      expect(head).toMatch(/^HTTP\/1\.[01] 200 /);
      expect(head).not.toMatch(/transfer-encoding/i);
      const body = reply.subarray(end + 4);
      expect(body.length).toBe(size);
      expect(sha(body)).toBe(sha(BIG.subarray(0, size)));
    } finally {
      await a.close();
    }
  });

  it.each([
    ['fd relay', true],
    ['Node streams (fdRelay: false)', false],
  ])(
    '%s: pipelined requests (large, small, large) are answered in order, each body intact',
    async (_w, fdRelay) => {
      const a = attach(fdRelay);
      try {
        const sizes = [3 * MiB + 1, 1000, 2 * MiB];
        const port = path === 'proxy' ? a.proxyPort : a.transparentPort;
        const text = sizes
          .map((n, i) => {
            const target = path === 'proxy' ? `http://${AUTHORITY}/len/${n}` : `/len/${n}`;
            const last = i === sizes.length - 1 ? 'Connection: close\r\n' : '';
            return `GET ${target} HTTP/1.1\r\nHost: ${AUTHORITY}\r\n${last}\r\n`;
          })
          .join('');
        let reply = await rawExchange(port, text);
        for (const n of sizes) {
          const end = reply.indexOf('\r\n\r\n');
          const head = reply.subarray(0, end).toString('latin1');
          expect(head).toMatch(/^HTTP\/1\.1 200 /);
          expect(head).toMatch(new RegExp(`\r\ncontent-length: ${n}(\r\n|$)`, 'i'));
          expect(sha(reply.subarray(end + 4, end + 4 + n))).toBe(sha(BIG.subarray(0, n)));
          reply = reply.subarray(end + 4 + n);
        }
        expect(reply.length).toBe(0);
        await until(() => a.events.length >= 3);
        expect(a.events.map((e) => e.bytesDown)).toEqual(sizes);
      } finally {
        await a.close();
      }
    },
  );

  it('an upstream head with Content-Length and Transfer-Encoding is refused (502), not guessed at', async () => {
    const a = attach();
    try {
      const r = await get(a, path, '/bad');
      expect(r.status).toBe(502);
    } finally {
      await a.close();
    }
  });

  it.each([
    ['Content-Length, fd relay', 'die', true],
    ['Content-Length, Node streams', 'die', false],
    ['chunked', 'chunkdie', true],
  ])(
    'the upstream dying mid-body (%s): the client sees a truncated response and a closed connection, no hang',
    async (_w, kind, fdRelay) => {
      const a = attach(fdRelay);
      try {
        const size = 8 * MiB; // 16 MiB announced (or a chunk of 16 MiB), 8 MiB sent, then a reset
        const r = await get(a, path, `/${kind}/${size}`);
        expect(r.status).toBe(200);
        expect(r.complete).toBe(false);
        expect(r.bytes).toBeLessThanOrEqual(size);
        expect(a.gw.relay?.size ?? 0).toBe(0);
        await until(() => a.events.length > 0);
        expect(a.events[0]).toMatchObject({ protocol, decision: 'allow' });
        expect(a.events[0]!.bytesDown).toBe(r.bytes);
      } finally {
        await a.close();
      }
    },
  );

  it('the client aborting mid-body: the upstream connection is closed and no file descriptor is left', async () => {
    const a = attach();
    try {
      // The relay worker (its thread starts its own event loop asynchronously) has carried a body and
      // the listeners are up before the fd baseline.
      expect(await get(a, path, `/len/${2 * MiB}`)).toMatchObject({ bytes: 2 * MiB, complete: true });
      await until(() => a.events.length > 0);
      const before = fdCount();
      const conns = upstream.conns.length;
      let res: IncomingMessage | undefined;
      const got = get(a, path, `/endless/${1024 * MiB}`, {
        onResponse: (r) => {
          res = r;
          r.pause(); // stop reading: the copy cannot finish, the relay holds it
        },
      });
      await until(() => res !== undefined && upstream.conns.length > conns);
      await until(() => a.gw.relay?.size === 1);
      expect(a.gw.relay?.size).toBe(1); // the body is in the fd relay
      const conn = upstream.conns.at(-1)!;
      expect(conn.open).toBe(true);
      res!.socket.destroy(); // the client goes away
      const r = await got;
      expect(r.complete).toBe(false);
      await until(() => !conn.open && a.gw.relay?.size === 0 && a.events.length > 1);
      expect(conn.open).toBe(false);
      expect(a.gw.relay?.size).toBe(0);
      expect(a.events[1]).toMatchObject({ protocol, decision: 'allow' });
      await until(() => fdCount() <= before);
      expect(fdCount()).toBeLessThanOrEqual(before);
    } finally {
      await a.close();
    }
  });

  it('closing the attachment (lease end) during a body in the fd relay closes the client and the upstream', async () => {
    const a = attach();
    try {
      let res: IncomingMessage | undefined;
      const got = get(a, path, `/endless/${1024 * MiB}`, {
        onResponse: (r) => {
          res = r;
          r.pause();
        },
      });
      await until(() => res !== undefined && a.gw.relay?.size === 1);
      expect(a.gw.relay?.size).toBe(1);
      const conn = upstream.conns.at(-1)!;
      await a.egress.close();
      expect(a.gw.relay?.size).toBe(0);
      res!.resume();
      const r = await got;
      expect(r.complete).toBe(false);
      await until(() => !conn.open);
      expect(conn.open).toBe(false);
    } finally {
      await a.close();
    }
  });
});

describe('response-head parser and chunked decoder', () => {
  it('frames by status, method and headers; refuses ambiguous heads', () => {
    const p = (s: string, m = 'GET') => parseResponseHead(Buffer.from(s, 'latin1'), m);
    expect(p('HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello')).toMatchObject({
      status: 200,
      body: { kind: 'length', bytes: 5 },
      headEnd: 38,
    });
    expect(p('HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n', 'HEAD')).toMatchObject({
      body: { kind: 'none' },
    });
    expect(p('HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\n')).toMatchObject({
      body: { kind: 'none' },
    });
    expect(p('HTTP/1.1 204 \r\n\r\n')).toMatchObject({ body: { kind: 'none' }, reason: '' });
    expect(p('HTTP/1.0 200 OK\r\n\r\n')).toMatchObject({ body: { kind: 'close' } });
    expect(p('HTTP/1.1 200 OK\nTransfer-Encoding: gzip, chunked\n\n')).toMatchObject({
      body: { kind: 'chunked' },
    });
    expect(p('HTTP/1.1 200 OK\r\nContent-Length: 5\r\n')).toEqual({ kind: 'incomplete' });
    for (const bad of [
      'HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n',
      'HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n',
      'HTTP/1.1 200 OK\r\nContent-Length: +5\r\n\r\n',
      'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\n',
      'HTTP/1.1 200 OK\r\nX: a\r\n folded\r\n\r\n',
      'HTTP/1.1 200 OK\r\nX: a\rb\r\n\r\n',
      'HTTP/1.1 200 OK\r\nX : a\r\n\r\n',
      'HTTP/2 200\r\n\r\n',
      'HTTP/1.1 20 OK\r\n\r\n',
      'HTTP/1.1 200 OK\r\nX: \x00\r\n\r\n',
    ]) {
      expect(p(bad).kind, JSON.stringify(bad)).toBe('invalid');
    }
    expect(p(`HTTP/1.1 200 OK\r\nX: ${'a'.repeat(20_000)}`).kind).toBe('invalid'); // too large
  });

  it('decodes chunks split anywhere, stops at the end, refuses bad framing', () => {
    const wire = Buffer.from('5;a=b\r\nhello\r\n1\r\n \r\n6\r\nworld!\r\n0\r\nT: 1\r\n\r\nNEXT', 'latin1');
    for (let step = 1; step <= wire.length; step++) {
      const d = new ChunkedDecoder();
      const out: Buffer[] = [];
      let done = false;
      let rest = '';
      for (let i = 0; i < wire.length && !done; i += step) {
        const r = d.push(wire.subarray(i, i + step));
        if ('error' in r) throw new Error(r.error);
        out.push(...r.data);
        done = r.done;
        if (r.done) rest = (r.rest?.toString() ?? '') + wire.subarray(i + step).toString();
      }
      expect(Buffer.concat(out).toString()).toBe('hello world!');
      expect(done).toBe(true);
      expect(rest).toBe('NEXT');
    }
    for (const bad of ['5\r\nhello!\r\n', 'x\r\n', '5\r\nhel\rlo\r\n', '-1\r\n', `${'f'.repeat(13)}\r\n`]) {
      expect('error' in new ChunkedDecoder().push(Buffer.from(bad)), bad).toBe(true);
    }
  });
});

// ---- real sandboxes ------------------------------------------------------------------------------------

describe.skipIf(!canRunNamespaces)('plain HTTP in real sandboxes', () => {
  let world: EgressWorld;
  const TOKEN = 'plain-http-real-token-7f3a';

  beforeAll(async () => {
    world = await startEgressWorld({ secretEnv: { PLAIN_TOKEN_SRC: TOKEN } });
  });

  afterAll(async () => {
    await world?.close();
  });

  it('curl without secrets: a 32 MiB body is intact through the proxy and on the transparent path', async () => {
    const size = 32 * MiB;
    const want = sha(BIG.subarray(0, size));
    await world.withSandbox({ network: { allow: [AUTHORITY] } }, async (s) => {
      for (const flags of ['', "--noproxy '*'"]) {
        const r = await s.exec([
          'bash',
          '-c',
          `set -o pipefail; curl -sS -m 60 ${flags} http://${AUTHORITY}/len/${size} | sha256sum`,
        ]);
        expect(r.exitCode, r.stderr).toBe(0);
        expect(r.stdout.split(' ')[0]).toBe(want);
      }
      await until(() => s.egressEvents.filter((e) => e.bytesDown === size).length >= 2);
      expect(
        s.egressEvents
          .filter((e) => e.bytesDown === size)
          .map((e) => e.protocol)
          .sort(),
      ).toEqual(['http', 'transparent-http']);
    });
  });

  it('a sandbox with secrets still gets the sentinel swap (and the scrub) on plain HTTP', async () => {
    await world.withSandbox(
      {
        network: { allow: [ALLOWED.name, SECRET_HOST.name] },
        // Plain HTTP gets real values only when the secret opts in (test/egress/reflection.test.ts
        // proves the default refusal).
        secrets: [
          {
            name: 'PLAIN_TOKEN',
            value: { fromEnv: 'PLAIN_TOKEN_SRC' },
            hosts: [SECRET_HOST.name],
            insecureHttp: true,
          },
        ],
      },
      async (s) => {
        const r = await s.exec(
          `curl -sS -m 10 -H "Authorization: Bearer $PLAIN_TOKEN" http://${SECRET_HOST.name}/plain-swap`,
        );
        expect(r.exitCode, r.stderr).toBe(0);
        const seen = world.servers.seen.findLast((q) => q.url === '/plain-swap');
        expect(seen?.host).toBe(SECRET_HOST.name);
        expect(seen?.headers.authorization).toBe(`Bearer ${TOKEN}`);
        // The server echoes the header; the sandbox reads the sentinel back, never the value.
        expect(JSON.parse(r.stdout).authorization).toMatch(/^Bearer airlock_sentinel_/);
        expect(r.stdout).not.toContain(TOKEN);
        // The same sentinel to a host it is not bound to is refused before anything is sent.
        const leak = await s.exec(
          `curl -sS -m 10 -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $PLAIN_TOKEN" http://${ALLOWED.name}/plain-leak`,
        );
        expect(leak.stdout).toBe('403');
        expect(world.servers.seen.some((q) => q.url === '/plain-leak')).toBe(false);
        await until(() => s.egressEvents.some((e) => e.secretsSwapped?.includes('PLAIN_TOKEN')));
        expect(s.egressEvents.some((e) => e.secretsSwapped?.includes('PLAIN_TOKEN'))).toBe(true);
      },
    );
  });
});
