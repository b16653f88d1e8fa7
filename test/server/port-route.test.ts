// The port route (GET /v1/sandboxes/:id/ports/:port, Upgrade: airlock-tcp) and its client, served
// beside a real Hono app on a real node:http server, over a unix socket and over TCP, into a real
// sandbox's Python server. Attacks: bad port segments, unknown ids, a closed port, a missing key,
// the wrong Upgrade, bytes sent before the 101, clients that go away (nothing stays open).
import { mkdtempSync, rmSync } from 'node:fs';
import type { Server } from 'node:http';
import { connect, type AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Duplex } from 'node:stream';
import { createAdaptorServer } from '@hono/node-server';
import { Hono } from 'hono';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AirlockError } from '../../src/core/errors.js';
import type { Airlock } from '../../src/sandbox/airlock.js';
import type { Sandbox } from '../../src/sandbox/index.js';
import { connectPortVia } from '../../src/server/port-client.js';
import { PORT_ROUTE, attachPortRoute, portRouteFallback } from '../../src/server/port-route.js';
import { NO_RESIDUE, SKIP_REASON, canRunNamespaces, settledResidue, testAirlock } from '../helpers.js';
import { LibraryPorts, startHttpServer } from './preview-support.js';

/** One HTTP/1.0 exchange over a raw duplex (the server closes after its answer). */
function http10(s: Duplex, path: string): Promise<string> {
  return new Promise((resolve, reject) => {
    let got = '';
    s.on('data', (d: Buffer) => (got += d.toString('latin1')));
    s.on('end', () => resolve(got));
    s.on('error', reject);
    s.write(`GET ${path} HTTP/1.0\r\nHost: x\r\n\r\n`);
  });
}

/** Send raw bytes to a TCP server and read everything until it closes. */
function raw(port: number, bytes: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const c = connect(port, '127.0.0.1');
    let got = '';
    c.on('data', (d: Buffer) => (got += d.toString('latin1')));
    c.on('end', () => resolve(got));
    c.on('error', reject);
    c.end(bytes);
  });
}

const failure = async (p: Promise<unknown>): Promise<AirlockError> => {
  try {
    await p;
  } catch (e) {
    if (AirlockError.isInstance(e)) return e;
    throw e;
  }
  throw new Error('expected a typed failure');
};

describe.skipIf(!canRunNamespaces)('the port route', () => {
  const dir = mkdtempSync(join(tmpdir(), 'airlock-ports-'));
  const sock = join(dir, 'api.sock');
  let airlock: Airlock;
  let lib: LibraryPorts;
  let sbx: Sandbox;
  let unix: Server;
  let tcp: Server;
  let tcpPort: number;
  const KEY = 'k-123';

  beforeAll(async () => {
    airlock = testAirlock();
    lib = new LibraryPorts(airlock);
    sbx = await airlock.create({ ttlMs: 300_000 });
    await startHttpServer(sbx, 8000);
    const app = new Hono();
    app.get(PORT_ROUTE, portRouteFallback);
    app.get('/v1/ping', (c) => c.json({ pong: true }));
    // The supervisor's way: its one client is trusted.
    unix = createAdaptorServer({ fetch: app.fetch }) as Server;
    attachPortRoute(unix, { api: lib, caller: () => ({ tenant: 'supervisor' }) });
    await new Promise<void>((r) => unix.listen(sock, r));
    // A front server's way: the caller comes from the API key.
    tcp = createAdaptorServer({ fetch: app.fetch }) as Server;
    attachPortRoute(tcp, {
      api: lib,
      caller: (req) => {
        if (req.headers.authorization !== `Bearer ${KEY}`)
          throw new AirlockError('UNAUTHORIZED', 'send your API key as Authorization: Bearer <key>');
        return { tenant: 't1' };
      },
    });
    await new Promise<void>((r) => tcp.listen(0, '127.0.0.1', r));
    tcpPort = (tcp.address() as AddressInfo).port;
  }, 60_000);

  afterAll(async () => {
    unix?.close();
    tcp?.close();
    await airlock?.killAll();
    await airlock?.close();
    rmSync(dir, { recursive: true, force: true });
    expect(await settledResidue()).toEqual(NO_RESIDUE);
  }, 60_000);

  it('over the unix socket: a raw connection to the server in the sandbox', async () => {
    const s = await connectPortVia({ socketPath: sock }, sbx.id, 8000);
    expect(await http10(s, '/hello')).toContain('hello from the sandbox');
  });

  it('over TCP with the API key; without it UNAUTHORIZED and no connection made', async () => {
    const url = `http://127.0.0.1:${tcpPort}`;
    const s = await connectPortVia({ url, apiKey: KEY }, sbx.id, 8000);
    expect(await http10(s, '/hello')).toContain('hello from the sandbox');
    const before = lib.connects;
    expect((await failure(connectPortVia({ url }, sbx.id, 8000))).code).toBe('UNAUTHORIZED');
    const wrong = { url, headers: { authorization: 'Bearer nope' } };
    expect((await failure(connectPortVia(wrong, sbx.id, 8000))).code).toBe('UNAUTHORIZED');
    expect(lib.connects).toBe(before);
  });

  it('a closed port is PORT_UNREACHABLE with the message from the supervisor', async () => {
    const e = await failure(connectPortVia({ socketPath: sock }, sbx.id, 8999));
    expect(e.code).toBe('PORT_UNREACHABLE');
    expect(e.message).toContain('nothing listens on port 8999');
  });

  it('an unknown sandbox is SANDBOX_NOT_FOUND', async () => {
    const e = await failure(connectPortVia({ socketPath: sock }, 'sbx-0000000000000000', 8000));
    expect(e.code).toBe('SANDBOX_NOT_FOUND');
  });

  it.each(['0', '080', '65536', '-1', '1e3', '8000.0', 'abc', '%38000', '99999999999'])(
    'port segment %j: 400 INVALID_ARGUMENT, nothing dialled',
    async (seg) => {
      const before = lib.connects;
      const r = await raw(
        tcpPort,
        `GET /v1/sandboxes/${sbx.id}/ports/${seg} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${KEY}\r\n` +
          'connection: Upgrade\r\nupgrade: airlock-tcp\r\n\r\n',
      );
      expect(r).toMatch(/^HTTP\/1\.1 400 /);
      expect(JSON.parse(r.slice(r.indexOf('\r\n\r\n') + 4)).error.code).toBe('INVALID_ARGUMENT');
      expect(lib.connects).toBe(before);
    },
  );

  it('without the upgrade: 426 from the app that says what to send; the rest of the app still answers', async () => {
    const r = await raw(
      tcpPort,
      `GET /v1/sandboxes/${sbx.id}/ports/8000 HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n`,
    );
    expect(r).toMatch(/^HTTP\/1\.1 426 /);
    expect(r).toContain('airlock-tcp');
    expect(await raw(tcpPort, 'GET /v1/ping HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n')).toContain(
      '"pong":true',
    );
  });

  it('another upgrade (websocket) on the route is refused, not left hanging', async () => {
    const r = await raw(
      tcpPort,
      `GET /v1/sandboxes/${sbx.id}/ports/8000 HTTP/1.1\r\nhost: x\r\nconnection: Upgrade\r\nupgrade: websocket\r\n` +
        'sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\nsec-websocket-version: 13\r\n\r\n',
    );
    expect(r).toMatch(/^HTTP\/1\.1 400 /);
  });

  it('bytes sent right behind the request reach the sandbox after the 101', async () => {
    const r = await raw(
      tcpPort,
      `GET /v1/sandboxes/${sbx.id}/ports/8000 HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${KEY}\r\n` +
        'connection: Upgrade\r\nupgrade: airlock-tcp\r\n\r\nGET /hello HTTP/1.0\r\n\r\n',
    );
    expect(r).toMatch(/^HTTP\/1\.1 101 /);
    expect(r).toContain('hello from the sandbox');
  });

  it('an aborted connect is ABORTED; a client that goes away leaves nothing open', async () => {
    const ac = new AbortController();
    ac.abort();
    expect((await failure(connectPortVia({ socketPath: sock }, sbx.id, 8000, ac.signal))).code).toBe(
      'ABORTED',
    );
    const conns = await Promise.all(
      Array.from({ length: 5 }, () => connectPortVia({ socketPath: sock }, sbx.id, 8000)),
    );
    expect(lib.open.size).toBeGreaterThanOrEqual(5);
    for (const c of conns) c.destroy();
    await lib.allClosed();
    expect(lib.open.size).toBe(0);
  });

  it('killing the sandbox ends a connection through the route', async () => {
    const other = await airlock.create({ ttlMs: 60_000 });
    await startHttpServer(other, 8000);
    const c = await connectPortVia({ socketPath: sock }, other.id, 8000);
    const closed = new Promise<void>((r) => c.once('close', () => r()));
    c.on('error', () => {});
    c.resume();
    await other.kill();
    await closed;
  }, 60_000);
});

if (!canRunNamespaces) describe.skip(SKIP_REASON, () => {});
