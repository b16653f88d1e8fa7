// sbx.connectPort(port): a TCP connection to a port on the sandbox's own loopback, made without any
// thread of this process entering the sandbox's netns. Real sandboxes, a real Python server inside;
// the attacks: ports out of range, the host's own loopback (must NOT be reachable), Airlock's egress
// proxy port, a paused or killed sandbox, gVisor's own network stack, leaks.
import { readdirSync, readlinkSync } from 'node:fs';
import { createServer, type AddressInfo, type Server } from 'node:net';
import type { Duplex } from 'node:stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { MAX_PORT_CONNECTIONS } from '../../src/backends/host/port-dial.privileged.js';
import { AirlockError } from '../../src/core/errors.js';
import type { Airlock } from '../../src/sandbox/airlock.js';
import type { Sandbox } from '../../src/sandbox/index.js';
import {
  GVISOR_SKIP_REASON,
  NO_RESIDUE,
  SKIP_REASON,
  canRunGvisor,
  canRunNamespaces,
  settledResidue,
  testAirlock,
} from '../helpers.js';
import { startHttpServer } from '../server/preview-support.js';

/** Send one HTTP/1.0 request over `s` and return the whole response (the server closes). */
function http10(s: Duplex, path: string): Promise<string> {
  return new Promise((resolve, reject) => {
    let got = '';
    s.on('data', (d: Buffer) => (got += d.toString('latin1')));
    s.on('end', () => resolve(got));
    s.on('error', reject);
    s.write(`GET ${path} HTTP/1.0\r\nHost: x\r\n\r\n`);
  });
}

const code = async (p: Promise<unknown>): Promise<string> => {
  try {
    await p;
    return 'resolved';
  } catch (e) {
    return AirlockError.isInstance(e) ? e.code : `not typed: ${(e as Error).message}`;
  }
};

const netnsOf = (proc: string): string => readlinkSync(`/proc/${proc}/ns/net`);

describe.skipIf(!canRunNamespaces)('sbx.connectPort (namespaces)', () => {
  let airlock: Airlock;
  let sbx: Sandbox;
  let hostServer: Server;
  let hostPort: number;

  beforeAll(async () => {
    airlock = testAirlock();
    sbx = await airlock.create({ ttlMs: 120_000 });
    await startHttpServer(sbx, 8000);
    // A server on the HOST's loopback: a sandbox port must never reach it.
    hostServer = createServer((c) => c.end('HOST SERVER\n'));
    await new Promise<void>((r) => hostServer.listen(0, '127.0.0.1', r));
    hostPort = (hostServer.address() as AddressInfo).port;
  }, 60_000);

  afterAll(async () => {
    await sbx?.kill();
    await airlock?.close();
    hostServer?.close();
    expect(await settledResidue()).toEqual(NO_RESIDUE);
  }, 60_000);

  it('reaches a server on the sandbox loopback', async () => {
    const s = await sbx.connectPort(8000);
    const res = await http10(s, '/hello');
    expect(res).toMatch(/^HTTP\/1\.[01] 200/);
    expect(res).toContain('hello from the sandbox');
  });

  it('leaves every thread of this process in the host netns', async () => {
    const host = netnsOf('self');
    await Promise.all([1, 2, 3].map(async () => (await sbx.connectPort(8000)).destroy()));
    const tasks = readdirSync('/proc/self/task');
    expect(tasks.length).toBeGreaterThan(1);
    for (const t of tasks) expect(netnsOf(`self/task/${t}`)).toBe(host);
  });

  it('does not reach the host loopback: the same port number inside is a different place', async () => {
    // Nothing listens on hostPort inside the sandbox, so this must fail, not reach the host server.
    expect(await code(sbx.connectPort(hostPort))).toBe('PORT_UNREACHABLE');
  });

  it('says PORT_UNREACHABLE, with the port, when nothing listens', async () => {
    const e = await sbx.connectPort(8001).catch((x: unknown) => x);
    expect(AirlockError.is(e, 'PORT_UNREACHABLE')).toBe(true);
    expect((e as Error).message).toContain('nothing listens on port 8001');
  });

  it.each([0, -1, 65536, 1.5, Number.NaN, Infinity, '80' as unknown as number])(
    'refuses port %s (INVALID_ARGUMENT)',
    async (p) => {
      expect(await code(sbx.connectPort(p))).toBe('INVALID_ARGUMENT');
    },
  );

  it('many concurrent connections each get their own answer', async () => {
    const answers = await Promise.all(
      Array.from({ length: 20 }, async () => http10(await sbx.connectPort(8000), '/hello')),
    );
    for (const a of answers) expect(a).toContain('hello from the sandbox');
  });

  it(`at most ${MAX_PORT_CONNECTIONS} open connections per sandbox (CAPACITY_EXHAUSTED), then room again`, async () => {
    const held: Duplex[] = [];
    try {
      for (let i = 0; i < MAX_PORT_CONNECTIONS; i++) held.push(await sbx.connectPort(8000));
      expect(await code(sbx.connectPort(8000))).toBe('CAPACITY_EXHAUSTED');
      const first = held.shift()!;
      const closed = new Promise((r) => first.once('close', r));
      first.destroy();
      await closed;
      held.push(await sbx.connectPort(8000));
    } finally {
      await Promise.all(held.map((s) => new Promise((r) => (s.once('close', r), s.destroy()))));
    }
  }, 60_000);

  it('an aborted connect is ABORTED', async () => {
    const ac = new AbortController();
    ac.abort();
    expect(await code(sbx.connectPort(8000, { signal: ac.signal }))).toBe('ABORTED');
  });

  it('refuses a paused sandbox and works again once resumed', async () => {
    await sbx.pause();
    try {
      expect(await code(sbx.connectPort(8000))).toBe('SANDBOX_PAUSED');
    } finally {
      await sbx.resume();
    }
    (await sbx.connectPort(8000)).destroy();
  });

  it('kill closes open connections and refuses new ones', async () => {
    const other = await airlock.create({ ttlMs: 60_000 });
    await startHttpServer(other, 9000);
    const s = await other.connectPort(9000);
    const closed = new Promise<void>((r) => s.once('close', () => r()));
    s.on('error', () => {});
    await other.kill();
    await closed;
    expect(await code(other.connectPort(9000))).toBe('SANDBOX_GONE');
  }, 60_000);

  it("refuses Airlock's own egress proxy port in a sandbox with a network policy", async () => {
    const net = await airlock.create({ ttlMs: 60_000, network: { allow: ['example.com'] } });
    try {
      const e = await net.connectPort(3128).catch((x: unknown) => x);
      expect(AirlockError.is(e, 'PERMISSION_DENIED')).toBe(true);
      // Its own servers are reachable as in any sandbox.
      await startHttpServer(net, 8000);
      expect(await http10(await net.connectPort(8000), '/hello')).toContain('hello from the sandbox');
    } finally {
      await net.kill();
    }
  }, 60_000);
});

describe.skipIf(!canRunGvisor)('sbx.connectPort (gVisor)', () => {
  let airlock: Airlock;
  beforeAll(() => {
    airlock = testAirlock();
  });
  afterAll(async () => {
    await airlock?.close();
    expect(await settledResidue()).toEqual(NO_RESIDUE);
  }, 60_000);

  it('without a network policy: BACKEND_UNAVAILABLE that says what to do', async () => {
    const sbx = await airlock.create({ backend: 'gvisor', ttlMs: 60_000 });
    try {
      const e = await sbx.connectPort(8000).catch((x: unknown) => x);
      expect(AirlockError.is(e, 'BACKEND_UNAVAILABLE')).toBe(true);
      expect((e as Error).message).toContain('network policy');
    } finally {
      await sbx.kill();
    }
  }, 120_000);

  it('with a network policy: reaches the server in the sandbox', async () => {
    const sbx = await airlock.create({
      backend: 'gvisor',
      ttlMs: 60_000,
      network: { allow: ['example.com'] },
    });
    try {
      await startHttpServer(sbx, 8000);
      expect(await http10(await sbx.connectPort(8000), '/hello')).toContain('hello from the sandbox');
    } finally {
      await sbx.kill();
    }
  }, 120_000);
});

if (!canRunNamespaces) describe.skip(SKIP_REASON, () => {});
if (!canRunGvisor) describe.skip(GVISOR_SKIP_REASON, () => {});
