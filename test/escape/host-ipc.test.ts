// Escape suite: reaching host processes and host sockets from inside (signals, abstract unix
// sockets, loopback TCP), and leaving the sandbox's network namespace.
// Network safety: the host only ever listens on loopback / an abstract socket and connects to its own
// listeners; the sandbox's connection attempts to public or link-local addresses cannot leave its
// netns (it has only `lo` and no route), which is exactly what is asserted. Every test runs on each
// tier (gVisor without a network policy: the sentry's own network stack, loopback only).
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { createServer, type AddressInfo, type Server } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Sandbox } from '../../src/index.js';
import { canRunNamespaces, testAirlock } from '../helpers.js';
import {
  canRunTier,
  cgroupProcs,
  expectNoResidue,
  fixture,
  hostProcsOfUid,
  sentryProcs,
  TIERS,
} from './util.js';

const ECONNREFUSED = 111;
const ENETUNREACH = 101;
/** gVisor's netstack answers a connect with no route this way (the host kernel: ENETUNREACH). */
const EHOSTUNREACH = 113;

const airlock = testAirlock();

afterAll(async () => {
  if (canRunNamespaces) await expectNoResidue(airlock);
});

/** Start a server that counts the connections it accepts. */
async function countingServer(listen: (s: Server, ready: () => void) => void): Promise<{
  server: Server;
  connections: () => number;
}> {
  let n = 0;
  const server = createServer((c) => {
    n++;
    c.on('error', () => {});
    c.resume();
    c.end();
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    listen(server, resolve);
  });
  return { server, connections: () => n };
}

function close(server: Server): Promise<void> {
  return new Promise((r) => server.close(() => r()));
}

/** Run test/fixtures/connect.pl in the sandbox; it prints "connected" or "errno=<n> <message>". */
async function connectInside(
  sbx: Sandbox,
  ...args: string[]
): Promise<{ exitCode: number | null; line: string }> {
  const r = await sbx.exec(['perl', '-', ...args], { stdin: fixture('connect.pl'), timeoutMs: 15_000 });
  expect(r.stderr).toBe('');
  return { exitCode: r.exitCode, line: r.stdout.trim() };
}

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

function alive(child: ChildProcess): boolean {
  if (child.exitCode !== null || child.signalCode !== null) return false;
  try {
    process.kill(child.pid!, 0);
    return true;
  } catch {
    return false;
  }
}

for (const backend of TIERS) {
  const canRun = canRunTier(backend);
  let sbx: Sandbox;

  beforeAll(async () => {
    if (canRun) sbx = await airlock.create({ backend });
  });

  describe(`host processes [${backend}]`, () => {
    it.skipIf(!canRun)('cannot signal a host process, not even one running as its own host uid', async () => {
      const uid = sbx.info.hostUid;
      const victims = [
        spawn('sleep', ['60'], { stdio: 'ignore' }), // root's
        spawn('sleep', ['60'], { stdio: 'ignore', uid, gid: uid }), // the sandbox's host uid: DAC would allow it
      ];
      try {
        await sleep(100);
        for (const v of victims) expect(alive(v)).toBe(true);
        const script =
          victims.map((v) => `kill -9 ${v.pid} 2>&1; echo "rc=$?"`).join('\n') +
          '\nkill -9 -1 2>&1; echo "rc=$?"';
        const r = await sbx.exec(script);
        const lines = r.stdout.split('\n').filter(Boolean); // dash adds an empty line after its error
        expect(lines).toHaveLength(6);
        for (let i = 0; i < 6; i += 2) {
          expect(lines[i]).toMatch(/No such process/);
          expect(lines[i + 1]).toBe('rc=1');
        }
        await sleep(200);
        for (const v of victims) expect(alive(v)).toBe(true);
      } finally {
        for (const v of victims) v.kill('SIGKILL');
        await Promise.all(
          victims.map((v) =>
            v.exitCode !== null || v.signalCode !== null ? undefined : new Promise((r) => v.once('exit', r)),
          ),
        );
      }
    });

    it.skipIf(!canRun)("cannot signal another sandbox's processes", async () => {
      const other = await airlock.create({ backend });
      const h = await other.exec('sleep 30', { background: true });
      try {
        const r = await sbx.exec('kill -9 -1 2>&1; pkill -9 sleep; echo "rc=$?"');
        expect(r.stdout).toMatch(/No such process/);
        expect(r.stdout).toMatch(/rc=1$/m); // pkill found nothing to kill
        // Host side: the other sandbox's sleep is still there; its exec ends only when we kill it.
        await sleep(100);
        if (backend === 'gvisor') {
          // Its sleep lives in its own sentry (no host process): the sentry still reports it, its
          // sentry is still in its cgroup, and the exec has not ended.
          expect((await sentryProcs(other.id)).map((p) => p.cmd)).toContain('sleep');
          expect(cgroupProcs(other.id).map((p) => p.argv[0])).toContain('runsc-sandbox');
          const ended = await Promise.race([h.wait().then(() => true), sleep(200).then(() => false)]);
          expect(ended).toBe(false);
        } else {
          expect(hostProcsOfUid(other.info.hostUid).map((p) => p.argv[0])).toContain('sleep');
        }
        await h.kill();
        const res = await h.wait();
        expect(res.killedBy).toBe('killed');
      } finally {
        await other.kill();
      }
    });
  });

  describe(`host sockets [${backend}]`, () => {
    it.skipIf(!canRun)('cannot connect to a host abstract unix socket', async () => {
      const name = `airlock-escape-${randomBytes(8).toString('hex')}`;
      const { server, connections } = await countingServer((s, ready) =>
        s.listen({ path: `\0${name}` }, ready),
      );
      try {
        // Positive control: the same fixture, run on the host, does reach it.
        const host = spawnSync('perl', ['-', 'unix-abstract', name], {
          input: fixture('connect.pl'),
          encoding: 'utf8',
        });
        expect(host.stdout.trim()).toBe('connected');
        await sleep(50);
        expect(connections()).toBe(1);

        const inside = await connectInside(sbx, 'unix-abstract', name);
        expect(inside.exitCode).toBe(1);
        expect(inside.line).toMatch(new RegExp(`^errno=${ECONNREFUSED} `));
        await sleep(100);
        expect(connections()).toBe(1);
      } finally {
        await close(server);
      }
    });

    it.skipIf(!canRun)('cannot connect to a host loopback TCP listener', async () => {
      const { server, connections } = await countingServer((s, ready) => s.listen(0, '127.0.0.1', ready));
      const { port } = server.address() as AddressInfo;
      try {
        // Positive control: the same fixture, run on the host (loopback only), does reach it.
        const host = spawnSync('perl', ['-', 'tcp', '127.0.0.1', String(port)], {
          input: fixture('connect.pl'),
          encoding: 'utf8',
        });
        expect(host.stdout.trim()).toBe('connected');
        await sleep(50);
        expect(connections()).toBe(1);

        const inside = await connectInside(sbx, 'tcp', '127.0.0.1', String(port));
        expect(inside.exitCode).toBe(1);
        expect(inside.line).toMatch(new RegExp(`^errno=${ECONNREFUSED} `));
        await sleep(100);
        expect(connections()).toBe(1);
      } finally {
        await close(server);
      }
    });
  });

  describe(`network namespace [${backend}]`, () => {
    it.skipIf(!canRun)('has only lo and no route', async () => {
      const route = await sbx.exec('cat /proc/net/route');
      expect(route.exitCode).toBe(0);
      expect(route.stdout.trim().split('\n')).toHaveLength(1); // the header only
      const dev = await sbx.exec("tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '");
      expect(dev.stdout.trim().split('\n')).toEqual(['lo']);
      // `ip route` either shows nothing or cannot even open a netlink socket (seccomp denies AF_NETLINK).
      const ip = await sbx.exec(
        'ip route 2>&1; ip -6 route 2>&1 | grep -v "^::1 \\|^fe80\\|^local\\|^multicast"',
      );
      // The same seccomp policy on both tiers: no AF_NETLINK socket at all.
      expect(ip.stdout.replace(/Cannot open netlink socket: Operation not permitted\n/g, '')).toBe('');
    });

    it.skipIf(!canRun)(
      `connections out of the sandbox fail with ${backend === 'gvisor' ? 'EHOSTUNREACH' : 'ENETUNREACH'}`,
      async () => {
        for (const [host, port] of [
          ['1.1.1.1', '80'],
          ['169.254.169.254', '80'],
          ['10.0.0.1', '443'],
          ['2606:4700:4700::1111', '443'],
        ] as const) {
          const r = await connectInside(sbx, 'tcp', host, port);
          expect(r.exitCode, host).toBe(1);
          const errno = backend === 'gvisor' ? EHOSTUNREACH : ENETUNREACH;
          expect(r.line, host).toMatch(new RegExp(`^errno=${errno} `));
        }
      },
    );
  });
}
