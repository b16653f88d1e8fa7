// Preview URLs end to end: a real HTTP server and a real WebSocket echo server INSIDE a sandbox,
// reached through the preview proxy (server/preview.ts) on a real front server on 127.0.0.1:0 with
// Host `<port>-<id>.localhost`, which reaches the sandbox through the port route
// (server/port-route.ts) of a real "supervisor" server on a unix socket (server/port-client.ts).
// The SandboxApi under them is a thin adapter over the real library (get + connectPort).
// Attacks: missing/wrong/other sandbox's token, malformed Host spellings, a closed port, clients
// that go away mid-stream (nothing may stay open), every WebSocket frame type the tests send.
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer, request, type IncomingHttpHeaders, type Server } from 'node:http';
import { connect, type AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { WebSocket } from 'ws';
import type { Airlock } from '../../src/sandbox/airlock.js';
import type { Sandbox } from '../../src/sandbox/index.js';
import { connectPortVia } from '../../src/server/port-client.js';
import { attachPortRoute } from '../../src/server/port-route.js';
import { attachPreview, newPreviewAccess } from '../../src/server/preview.js';
import { NO_RESIDUE, SKIP_REASON, canRunNamespaces, settledResidue, testAirlock } from '../helpers.js';
import { LibraryPorts, startHttpServer, startWsEcho, type PortApi } from './preview-support.js';

interface Reply {
  status: number;
  headers: IncomingHttpHeaders;
  body: string;
}

describe.skipIf(!canRunNamespaces)(`preview URLs (${SKIP_REASON})`, () => {
  const dir = mkdtempSync(join(tmpdir(), 'airlock-preview-'));
  const sock = join(dir, 'supervisor.sock');
  let airlock: Airlock;
  let lib: LibraryPorts;
  let priv: Sandbox; // private ports: 8000 HTTP, 8001 WebSocket echo
  let pub: Sandbox; // public ports: 8000 HTTP
  let supervisor: Server;
  let front: Server;
  let frontPort: number;
  let frontRequests = 0; // requests that reached the front's own (API) handler

  const host = (port: number | string, id: string, domain = 'localhost'): string =>
    `${port}-${id}.${domain}:${frontPort}`;
  const token = (s: Sandbox): string => lib.access.get(s.id)!.trafficToken!;

  function hit(
    hostHeader: string,
    path: string,
    o: { method?: string; headers?: Record<string, string>; body?: string } = {},
  ): Promise<Reply> {
    return new Promise((resolve, reject) => {
      const req = request(
        {
          host: '127.0.0.1',
          port: frontPort,
          path,
          method: o.method ?? 'GET',
          headers: { host: hostHeader, ...o.headers },
          setHost: false,
        },
        (res) => {
          let body = '';
          res.setEncoding('utf8');
          res.on('data', (d: string) => (body += d));
          res.on('end', () => resolve({ status: res.statusCode!, headers: res.headers, body }));
        },
      );
      req.on('error', reject);
      req.end(o.body);
    });
  }

  /** A request whose Host header is raw UTF-8 bytes (Node's client refuses to send those). */
  function rawHit(hostHeader: string, path: string): Promise<Reply> {
    return new Promise((resolve, reject) => {
      const c = connect(frontPort, '127.0.0.1');
      const parts: Buffer[] = [];
      c.on('data', (d: Buffer) => parts.push(d));
      c.on('error', reject);
      c.on('end', () => {
        const text = Buffer.concat(parts).toString('latin1');
        const status = Number(/^HTTP\/1\.1 (\d{3})/.exec(text)?.[1]);
        resolve({ status, headers: {}, body: text.slice(text.indexOf('\r\n\r\n') + 4) });
      });
      c.end(
        Buffer.concat([
          Buffer.from(`GET ${path} HTTP/1.1\r\nhost: `),
          Buffer.from(hostHeader, 'utf8'),
          Buffer.from('\r\nconnection: close\r\n\r\n'),
        ]),
      );
    });
  }

  beforeAll(async () => {
    airlock = testAirlock();
    lib = new LibraryPorts(airlock);
    [priv, pub] = await Promise.all([airlock.create({ ttlMs: 300_000 }), airlock.create({ ttlMs: 300_000 })]);
    lib.access.set(priv.id, newPreviewAccess(false));
    lib.access.set(pub.id, newPreviewAccess(true));
    await Promise.all([startHttpServer(priv, 8000), startWsEcho(priv, 8001), startHttpServer(pub, 8000)]);

    supervisor = createServer((_req, res) => res.writeHead(404).end());
    attachPortRoute(supervisor, { api: lib, caller: () => ({ tenant: 'supervisor' }) });
    await new Promise<void>((r) => supervisor.listen(sock, r));

    // The front server's view: get() as the supervisor answers it, connectPort over its socket.
    const remote: PortApi = {
      get: (id, c) => lib.get(id, c),
      connectPort: (id, port, _c, signal) => connectPortVia({ socketPath: sock }, id, port, signal),
    };
    front = createServer((_req, res) => {
      frontRequests++;
      res.writeHead(404, { 'content-type': 'application/json' }).end('{"api":"no such route"}');
    });
    attachPreview(front, { api: remote, caller: { tenant: '*' } });
    await new Promise<void>((r) => front.listen(0, '127.0.0.1', r));
    frontPort = (front.address() as AddressInfo).port;
  }, 90_000);

  afterAll(async () => {
    front?.close();
    supervisor?.close();
    await airlock?.killAll();
    await airlock?.close();
    rmSync(dir, { recursive: true, force: true });
    expect(await settledResidue()).toEqual(NO_RESIDUE);
  }, 60_000);

  it('GET with the token reaches the server in the sandbox; the token is not forwarded', async () => {
    const r = await hit(host(8000, priv.id), '/hello', {
      headers: { 'x-airlock-traffic-token': token(priv) },
    });
    expect(r.status).toBe(200);
    expect(r.body).toBe('hello from the sandbox');
    expect(r.headers['x-seen-host']).toBe(host(8000, priv.id)); // the visitor's Host, kept
    const h = await hit(host(8000, priv.id), '/headers', {
      headers: { 'x-airlock-traffic-token': token(priv), 'x-custom': 'kept' },
    });
    expect(h.body).toContain('x-custom: kept');
    expect(h.body).not.toContain(token(priv));
    expect(h.body).not.toContain('traffic-token');
  });

  it("E2B's header works too", async () => {
    const r = await hit(host(8000, priv.id), '/hello', {
      headers: { 'e2b-traffic-access-token': token(priv) },
    });
    expect(r.status).toBe(200);
  });

  it('POST body goes through whole (binary-safe sizes, 1 MiB)', async () => {
    const body = 'x'.repeat(1024 * 1024 - 3) + 'end';
    const r = await hit(host(8000, priv.id), '/echo', {
      method: 'POST',
      body,
      headers: { 'x-airlock-traffic-token': token(priv), 'content-type': 'text/plain' },
    });
    expect(r.status).toBe(200);
    expect(r.headers['x-body-length']).toBe(String(body.length));
    expect(r.body).toBe(body);
  });

  it('a streaming (chunked) response arrives chunk by chunk, each before the end', async () => {
    const chunks: string[] = [];
    const status = await new Promise<number>((resolve, reject) => {
      const req = request(
        {
          host: '127.0.0.1',
          port: frontPort,
          path: '/stream',
          headers: { host: host(8000, priv.id), 'x-airlock-traffic-token': token(priv) },
          setHost: false,
        },
        (res) => {
          res.setEncoding('utf8');
          res.on('data', (d: string) => chunks.push(d));
          res.on('end', () => resolve(res.statusCode!));
        },
      );
      req.on('error', reject);
      req.end();
    });
    expect(status).toBe(200);
    expect(chunks.join('')).toBe([0, 1, 2, 3, 4].map((i) => `chunk ${i}\n`).join(''));
    // The server waits between chunks: a proxy that buffered the body would deliver it in one piece.
    expect(chunks.length).toBeGreaterThan(1);
  });

  it('missing token: 401, wrong token: 403, and no connection into the sandbox', async () => {
    const before = lib.connects;
    const none = await hit(host(8000, priv.id), '/hello');
    expect(none.status).toBe(401);
    expect(JSON.parse(none.body).error.code).toBe('UNAUTHORIZED');
    expect(JSON.parse(none.body).error.message).toContain('X-Airlock-Traffic-Token');
    for (const bad of ['', 'x', token(priv).slice(0, -1), token(priv) + 'a', token(priv).toUpperCase()]) {
      const r = await hit(host(8000, priv.id), '/hello', { headers: { 'x-airlock-traffic-token': bad } });
      expect(r.status).toBe(403);
      expect(JSON.parse(r.body).error.code).toBe('PERMISSION_DENIED');
    }
    expect(lib.connects).toBe(before);
  });

  it("another sandbox's id with this token is refused", async () => {
    const other = await airlock.create({ ttlMs: 60_000 });
    lib.access.set(other.id, newPreviewAccess(false));
    try {
      await startHttpServer(other, 8000);
      const before = lib.connects;
      const r = await hit(host(8000, other.id), '/hello', {
        headers: { 'x-airlock-traffic-token': token(priv) },
      });
      expect(r.status).toBe(403);
      expect(lib.connects).toBe(before);
      // and its own token works
      const ok = await hit(host(8000, other.id), '/hello', {
        headers: { 'x-airlock-traffic-token': token(other) },
      });
      expect(ok.status).toBe(200);
    } finally {
      await other.kill();
    }
  }, 60_000);

  it('concurrent visitors with good and bad tokens each get their own answer', async () => {
    const before = lib.connects;
    const tries = Array.from({ length: 30 }, (_, i) => i % 3 !== 0);
    const replies = await Promise.all(
      tries.map((good, i) =>
        hit(host(8000, priv.id), i % 2 ? '/hello' : '/echo', {
          method: i % 2 ? 'GET' : 'POST',
          body: i % 2 ? undefined : `body ${i}`,
          headers: { 'x-airlock-traffic-token': good ? token(priv) : newPreviewAccess().trafficToken! },
        }),
      ),
    );
    replies.forEach((r, i) => {
      expect([i, r.status]).toEqual([i, tries[i] ? 200 : 403]);
      if (tries[i]) expect(r.body).toBe(i % 2 ? 'hello from the sandbox' : `body ${i}`);
    });
    expect(lib.connects - before).toBe(tries.filter(Boolean).length);
  });

  it('public ports need no token', async () => {
    const r = await hit(host(8000, pub.id), '/hello');
    expect(r.status).toBe(200);
    expect(r.body).toBe('hello from the sandbox');
  });

  it('an unknown sandbox id: 404 SANDBOX_NOT_FOUND', async () => {
    const r = await hit(host(8000, 'sbx-0000000000000000'), '/hello', {
      headers: { 'x-airlock-traffic-token': token(priv) },
    });
    expect(r.status).toBe(404);
    expect(JSON.parse(r.body).error.code).toBe('SANDBOX_NOT_FOUND');
  });

  it('a port nobody listens on: 502 with a clear message', async () => {
    const r = await hit(host(8999, priv.id), '/', { headers: { 'x-airlock-traffic-token': token(priv) } });
    expect(r.status).toBe(502);
    const e = JSON.parse(r.body).error;
    expect(e.code).toBe('PORT_UNREACHABLE');
    expect(e.message).toContain('nothing listens on port 8999');
  });

  it('a paused sandbox: 409, resumed: 200', async () => {
    await pub.pause();
    try {
      expect((await hit(host(8000, pub.id), '/hello')).status).toBe(409);
    } finally {
      await pub.resume();
    }
    expect((await hit(host(8000, pub.id), '/hello')).status).toBe(200);
  });

  it('malformed Host spellings are not routed: they reach the API, and no connection is made', async () => {
    const id = pub.id;
    const spellings = [
      `8000-${id.toUpperCase()}.localhost`, // uppercase id
      `8000-${id}.LOCALHOST`, // uppercase domain
      `8000-${id}.Localhost:${frontPort}`,
      `a.8000-${id}.localhost`, // extra label in front
      `8000-${id}.x.localhost`, // extra label between
      `8000-${id}.localhost.`, // trailing dot
      `08000-${id}.localhost`, // leading zero
      `0-${id}.localhost`, // port 0
      `65536-${id}.localhost`, // port out of range
      `99999999-${id}.localhost`,
      `-8000-${id}.localhost`,
      `8000--${id}.localhost`,
      `8000-${id}-.localhost`,
      `8000_${id}.localhost`,
      `+8000-${id}.localhost`,
      `８０００-${id}.localhost`, // fullwidth digits
      `8000-${id}.locälhost`, // unicode
      `8000-${id}.xn--localhost`,
      `8000-${id}.localhost:${frontPort}:1`,
      `8000-${id}.localhost.evil.example.com`,
      `8000-${id}`,
      `${id}.localhost`,
      `localhost:${frontPort}`,
      `127.0.0.1:${frontPort}`,
    ];
    const before = lib.connects;
    for (const h of spellings) {
      const apiBefore = frontRequests;
      // A Host Node's client cannot send as given (non-ASCII) is sent as raw bytes: see rawHit.
      const r = /^[\x20-\x7e]*$/.test(h) ? await hit(h, '/hello') : await rawHit(h, '/hello');
      expect([r.status, h]).toEqual([404, h]);
      expect([frontRequests, h]).toEqual([apiBefore + 1, h]);
    }
    expect(lib.connects).toBe(before);
  });

  it('the configured domain is the only one routed', async () => {
    const r = await hit(`8000-${pub.id}.preview.example.com`, '/hello');
    expect(r.status).toBe(404);
    expect(r.body).toContain('"api"');
  });

  it('WebSocket: text and binary frames echo back through the proxy', async () => {
    const ws = new WebSocket(`ws://127.0.0.1:${frontPort}/echo`, {
      headers: { host: host(8001, priv.id), 'x-airlock-traffic-token': token(priv) },
    });
    const messages: Array<{ data: Buffer; binary: boolean }> = [];
    const got = (n: number): Promise<void> =>
      new Promise((r) => {
        const check = (): void => {
          if (messages.length >= n) r();
          else ws.once('message', () => setImmediate(check));
        };
        check();
      });
    ws.on('message', (data: Buffer, binary: boolean) => messages.push({ data, binary }));
    await new Promise<void>((resolve, reject) => {
      ws.once('open', resolve);
      ws.once('error', reject);
    });
    ws.send('héllo wörld');
    const bin = Buffer.from([0, 1, 2, 255, 254, 13, 10, 0]);
    ws.send(bin);
    const big = Buffer.alloc(200_000, 7);
    ws.send(big);
    await got(3);
    expect(messages[0]).toEqual({ data: Buffer.from('héllo wörld'), binary: false });
    expect(messages[1]).toEqual({ data: bin, binary: true });
    expect(messages[2]!.binary).toBe(true);
    expect(messages[2]!.data.equals(big)).toBe(true);
    const pong = new Promise<Buffer>((r) => ws.once('pong', r));
    ws.ping(Buffer.from('p1'));
    expect((await pong).toString()).toBe('p1');
    const closed = new Promise<number>((r) => ws.once('close', (code) => r(code)));
    ws.close(1000);
    expect(await closed).toBe(1000);
  });

  it('WebSocket without the token: 401 before any connection', async () => {
    const before = lib.connects;
    const ws = new WebSocket(`ws://127.0.0.1:${frontPort}/echo`, { headers: { host: host(8001, priv.id) } });
    const status = await new Promise<number>((r) => {
      ws.once('unexpected-response', (_req, res) => r(res.statusCode!));
      ws.once('error', () => {});
    });
    expect(status).toBe(401);
    expect(lib.connects).toBe(before);
  });

  it('clients that go away mid-stream leave no connection open (HTTP and WebSocket)', async () => {
    // HTTP: take the first chunk of the stream, then drop the connection.
    await new Promise<void>((resolve, reject) => {
      const req = request(
        {
          host: '127.0.0.1',
          port: frontPort,
          path: '/stream',
          headers: { host: host(8000, priv.id), 'x-airlock-traffic-token': token(priv) },
          setHost: false,
        },
        (res) => res.once('data', () => (req.destroy(), resolve())),
      );
      req.on('error', () => {});
      req.once('error', reject);
      req.end();
    });
    // WebSocket: open, then cut the TCP connection without a close frame.
    const ws = new WebSocket(`ws://127.0.0.1:${frontPort}/echo`, {
      headers: { host: host(8001, priv.id), 'x-airlock-traffic-token': token(priv) },
    });
    await new Promise<void>((resolve, reject) => {
      ws.once('open', resolve);
      ws.once('error', reject);
    });
    ws.terminate();
    // Every connection into the sandbox closes (no poll on a timer: each one's 'close' event).
    await lib.allClosed();
    expect(lib.open.size).toBe(0);
  });
});

if (!canRunNamespaces) describe.skip(SKIP_REASON, () => {});
