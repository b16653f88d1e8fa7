// RemoteSandboxApi keeps one connection across calls: an exec whose consumer stops at its `exit` event
// (as the remote SDK's exec does) hands its connection back to the pool instead of closing it, while a
// consumer that stops before the exit, or a server that keeps sending after it, still gets the
// connection closed. Real REST server (nativeRoutes over a real Airlock), real sandboxes.
import http from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { createAdaptorServer } from '@hono/node-server';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RemoteSandboxApi } from '../../src/server/client.js';
import type { ExecEvent } from '../../src/server/contract.js';
import { LocalSandboxApi } from '../../src/server/local.js';
import { nativeRoutes } from '../../src/server/routes.js';
import { NO_RESIDUE, SKIP_REASON, canRunNamespaces, settledResidue, testAirlock } from '../helpers.js';
import { CALLER } from './native-support.js';

const airlock = testAirlock();

/** Read an exec's events up to and including `exit` (or `stopAt`), then stop, as shapeExec does. */
async function upTo(
  events: AsyncIterable<ExecEvent>,
  stopAt: ExecEvent['type'] = 'exit',
): Promise<ExecEvent[]> {
  const seen: ExecEvent[] = [];
  for await (const e of events) {
    seen.push(e);
    if (e.type === stopAt) break;
  }
  return seen;
}

async function until(cond: () => boolean, what: string): Promise<void> {
  for (let waited = 0; !cond(); waited += 20) {
    if (waited > 10_000) throw new Error(`gave up waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

describe.skipIf(!canRunNamespaces)(`RemoteSandboxApi connection reuse (${SKIP_REASON})`, () => {
  let server: http.Server;
  const sockets = new Set<Socket>();
  let url: string;
  beforeAll(async () => {
    server = createAdaptorServer({ fetch: nativeRoutes(new LocalSandboxApi(airlock)).fetch }) as http.Server;
    server.on('connection', (s: Socket) => sockets.add(s));
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  afterAll(async () => {
    server.closeAllConnections();
    await new Promise<void>((r) => server.close(() => r()));
    await airlock.close();
    expect(await settledResidue()).toEqual(NO_RESIDUE);
  });

  it('create, five execs read to their exit, and kill close no connection', async () => {
    sockets.clear();
    const api = new RemoteSandboxApi({ baseUrl: url });
    try {
      const { id } = await api.create({ ttlMs: 120_000 }, CALLER);
      for (let i = 0; i < 5; i++) {
        const events = await upTo(api.exec(id, { cmd: ['sh', '-c', `echo run-${i}`] }, CALLER));
        const out = events.flatMap((e) => (e.type === 'stdout' ? [Buffer.from(e.data, 'base64')] : []));
        expect(Buffer.concat(out).toString()).toBe(`run-${i}\n`);
        expect(events.at(-1)).toMatchObject({ type: 'exit', exitCode: 0 });
      }
      await api.kill(id, CALLER);
      // No call closed its connection (before, each exec's stop at `exit` tore one down, and the
      // next call opened a new one); a call that starts while the last one's end is still arriving
      // may take a second pooled connection.
      expect([...sockets].filter((s) => s.destroyed)).toEqual([]);
      expect(sockets.size).toBeLessThanOrEqual(2);
    } finally {
      api.close();
    }
  });

  it('a consumer that stops before the exit still closes the connection, and the command is killed', async () => {
    sockets.clear();
    const api = new RemoteSandboxApi({ baseUrl: url });
    try {
      const { id } = await api.create({ ttlMs: 120_000 }, CALLER);
      const events = await upTo(api.exec(id, { cmd: ['sleep', '30'] }, CALLER), 'start');
      expect(events.map((e) => e.type)).toEqual(['start']);
      await until(() => [...sockets].some((s) => s.destroyed), 'the server to see the client leave');
      // The sleep is gone: a later exec sees no sleep process in the sandbox.
      const ps = await upTo(
        api.exec(id, { cmd: ['sh', '-c', 'ps -o comm= 2>/dev/null || ls /proc'] }, CALLER),
      );
      const text = Buffer.concat(
        ps.flatMap((e) => (e.type === 'stdout' ? [Buffer.from(e.data, 'base64')] : [])),
      ).toString();
      expect(text).not.toMatch(/\bsleep\b/);
      await api.kill(id, CALLER);
    } finally {
      api.close();
    }
  });
});

describe('RemoteSandboxApi against a server that keeps sending after the exit', () => {
  it('closes the connection instead of draining without end', async () => {
    // A hostile peer (the real server never does this): exit, then an endless chunked body.
    const open = new Set<Socket>();
    let timer: NodeJS.Timeout | undefined;
    const hostile = http.createServer((_req, res) => {
      res.writeHead(200, { 'content-type': 'application/x-ndjson' });
      res.write(
        '{"type":"start","pid":"p1"}\n{"type":"exit","exitCode":0,"signal":null,"durationMs":1,"oomKills":0}\n',
      );
      const junk = Buffer.alloc(16 * 1024, 0x20);
      timer = setInterval(() => res.write(junk), 5);
    });
    hostile.on('connection', (s: Socket) => {
      open.add(s);
      s.on('close', () => open.delete(s));
    });
    await new Promise<void>((r) => hostile.listen(0, '127.0.0.1', r));
    const api = new RemoteSandboxApi({
      baseUrl: `http://127.0.0.1:${(hostile.address() as AddressInfo).port}`,
    });
    try {
      const events = await upTo(api.exec('sbx', { cmd: ['true'] }, CALLER));
      expect(events.at(-1)).toMatchObject({ type: 'exit', exitCode: 0 });
      await until(() => open.size === 0, 'the client to close the endless response');
    } finally {
      clearInterval(timer);
      api.close();
      hostile.closeAllConnections();
      await new Promise<void>((r) => hostile.close(() => r()));
    }
  });
});
