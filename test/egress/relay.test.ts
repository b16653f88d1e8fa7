// The fd tunnel relay (src/egress/relay.privileged.ts): CONNECT and SOCKS5 tunnels of a sandbox
// without secrets or canaries are moved by the fd relay's worker thread. Most cases drive the
// gateway directly (its listeners bound in this test's private network namespace, clients in this
// process), so every byte, every close and every file descriptor is observable: large transfers both
// ways with hashes, half-close in each direction, byte counts in the audit event, closing the
// attachment (lease end) while a tunnel is live, resets, idle tunnels, and /proc/self/fd before/after.
// The last case kills a real sandbox that holds a tunnel open.
import { createHash, randomBytes } from 'node:crypto';
import { readdirSync, readlinkSync } from 'node:fs';
import { connect, createServer, type Server, type Socket } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { silentLogger, type EgressPlumbing } from '../../src/core/backend.js';
import type { EgressEvent } from '../../src/egress/events.js';
import { EgressGateway, type SandboxEgress } from '../../src/egress/gateway.js';
import { FdRelay } from '../../src/egress/relay.privileged.js';
import { NetworkPolicySchema } from '../../src/policy/network.js';
import { canRunNamespaces } from '../helpers.js';
import { startEgressWorld, until, type EgressWorld } from './harness.js';
import { ALLOWED, assertPrivateNetns, listenClosable, listenFd, testGateway } from './net.js';

assertPrivateNetns();

const TARGET_PORT = 7100;
const BANNER_PORT = 7101;
const MiB = 1024 * 1024;
/**
 * Open sockets, pipes and epoll/event fds of this process: what a tunnel or the relay worker uses. Files
 * and namespace fds are left out: sandboxes of other tests in this process open and close those (their
 * cgroup.procs files, their netns) on their own schedule, e.g. when a deferred teardown finishes.
 */
/** The sockets, pipes and epoll/event fds of this process: fd → what it points at. */
const fdMap = (): Map<string, string> => {
  const m = new Map<string, string>();
  for (const fd of readdirSync('/proc/self/fd')) {
    try {
      const link = readlinkSync(`/proc/self/fd/${fd}`);
      if (/^(socket|pipe|anon_inode):/.test(link)) m.set(fd, link);
    } catch {
      /* closed meanwhile (or the readdir's own fd) */
    }
  }
  return m;
};
/** The fds open now that were not in `then`, as "fd → link" (empty: none), for failure messages. */
const newFds = (then: Map<string, string>): string =>
  [...fdMap()]
    .filter(([fd, link]) => then.get(fd) !== link)
    .map(([fd, link]) => `${fd} → ${link}`)
    .join(', ');
const sha = (b: Buffer): string => createHash('sha256').update(b).digest('hex');
const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

// ---- the host behind the tunnel: 203.0.113.10:7100, speaking a one-line protocol ------------------

/**
 * First line "MODE N\n", then:
 *   both N  send N random bytes while reading N; end when both are done
 *   down N  read until the client's EOF, then send N random bytes and end (client half-closed first)
 *   up      end at once (FIN), then read until the client's EOF (host half-closed first)
 *   echo    echo everything; end on EOF
 *   reset   reset the connection
 */
interface TargetConn {
  readonly mode: string;
  bytesIn: number;
  shaIn?: string;
  shaOut?: string;
  open: boolean;
}

function startTarget(): Promise<{ conns: TargetConn[]; close(): Promise<void> }> {
  const conns: TargetConn[] = [];
  const sockets = new Set<Socket>();
  const server: Server = createServer({ allowHalfOpen: true }, (sock) => {
    sockets.add(sock);
    sock.on('error', () => {});
    let head = Buffer.alloc(0);
    const onHead = (d: Buffer): void => {
      head = Buffer.concat([head, d]);
      const nl = head.indexOf(10);
      if (nl < 0) return;
      sock.off('data', onHead);
      const [mode = '', n = '0'] = head.subarray(0, nl).toString().split(' ');
      const size = Number(n);
      const c: TargetConn = { mode, bytesIn: 0, open: true };
      conns.push(c);
      sock.on('close', () => {
        c.open = false;
        sockets.delete(sock);
      });
      const hash = createHash('sha256');
      const take = (b: Buffer): void => {
        c.bytesIn += b.length;
        hash.update(b);
      };
      const rest = head.subarray(nl + 1);
      if (mode === 'reset') return void sock.resetAndDestroy();
      if (mode === 'echo') {
        take(rest);
        if (rest.length) sock.write(rest);
        sock.on('data', (b: Buffer) => (take(b), sock.write(b)));
        sock.on('end', () => sock.end());
        return;
      }
      if (mode === 'up') sock.end();
      take(rest);
      sock.on('data', take);
      if (mode === 'both') {
        const out = randomBytes(size);
        c.shaOut = sha(out);
        let sent = false;
        const maybeEnd = (): void => {
          if (!sent || c.bytesIn < size || c.shaIn) return;
          c.shaIn = hash.digest('hex');
          sock.end();
        };
        sock.on('data', maybeEnd);
        sock.on('end', () => c.shaIn ?? sock.destroy()); // the client gave up early
        sock.write(out, () => ((sent = true), maybeEnd()));
        maybeEnd();
        return;
      }
      sock.on('end', () => {
        c.shaIn = hash.digest('hex');
        if (mode === 'down') {
          const out = randomBytes(size);
          c.shaOut = sha(out);
          sock.end(out);
        }
      });
    };
    sock.on('data', onHead);
  });
  return listenClosable(server, sockets, TARGET_PORT, ALLOWED.address, { conns });
}

// ---- a gateway whose "sandbox" listeners are plain sockets in this namespace -----------------------

let nextPort = 24000;

interface Attached {
  readonly egress: SandboxEgress;
  readonly events: EgressEvent[];
  /** Where this attachment's proxy (CONNECT and SOCKS5) listens. */
  readonly port: number;
  /** The listener fds the gateway took from its plumbing (closed when the attachment closes). */
  readonly fds: number[];
}

function newGateway(fdRelay = true): EgressGateway {
  return testGateway(fdRelay);
}

function attach(gw: EgressGateway, allow: string[] = [`${ALLOWED.name}:${TARGET_PORT}`]): Attached {
  const port = nextPort++;
  const dnsPort = nextPort++;
  const fds: number[] = [];
  const plumbing: EgressPlumbing = {
    listen: (kind, _address, p) => {
      const fd = listenFd(kind, p === 53 ? dnsPort : port);
      fds.push(fd);
      return fd;
    },
    interceptTcp: () => {
      throw new Error('transparent mode is off in these tests');
    },
    bindReadOnlyFiles: () => {},
    originalDestination: () => undefined,
  };
  const events: EgressEvent[] = [];
  const egress = gw.attach({
    sandboxId: `relay-test-${port}`,
    plumbing,
    policy: NetworkPolicySchema.parse({ allow, transparent: false }),
    onEvent: (e) => events.push(e),
  });
  return { egress, events, port, fds };
}

// ---- clients -----------------------------------------------------------------------------------------

/** Read from `sock` until `end(buf)` gives the length of a complete head; the rest stays unread. */
function readHead(sock: Socket, end: (b: Buffer) => number | undefined): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    let buf = Buffer.alloc(0);
    const onData = (d: Buffer): void => {
      buf = Buffer.concat([buf, d]);
      const n = end(buf);
      if (n === undefined) return;
      sock.off('data', onData).off('close', onClose);
      sock.pause();
      if (n < buf.length) sock.unshift(buf.subarray(n));
      resolve(buf.subarray(0, n));
    };
    const onClose = (): void =>
      reject(new Error(`closed during the handshake (got ${buf.toString('latin1')})`));
    sock.on('data', onData).once('close', onClose);
    sock.resume(); // a previous readHead paused it
  });
}

function dial(port: number): Promise<Socket> {
  return new Promise((resolve, reject) => {
    const s = connect({ host: '127.0.0.1', port, allowHalfOpen: true });
    s.once('connect', () => resolve(s)).once('error', reject);
  });
}

/** A CONNECT tunnel to allowed.test:7100 through the proxy on `port`. */
async function connectTunnel(port: number): Promise<Socket> {
  const s = await dial(port);
  const target = `${ALLOWED.name}:${TARGET_PORT}`;
  s.write(`CONNECT ${target} HTTP/1.1\r\nHost: ${target}\r\n\r\n`);
  const head = await readHead(s, (b) => {
    const i = b.indexOf('\r\n\r\n');
    return i < 0 ? undefined : i + 4;
  });
  expect(head.toString('latin1')).toMatch(/^HTTP\/1\.1 200 /);
  return s;
}

/** A SOCKS5 tunnel to allowed.test:7100 (domain address type) through the proxy on `port`. */
async function socksTunnel(port: number): Promise<Socket> {
  const s = await dial(port);
  s.write(Buffer.from([5, 1, 0]));
  expect([...(await readHead(s, (b) => (b.length >= 2 ? 2 : undefined)))]).toEqual([5, 0]);
  const name = Buffer.from(ALLOWED.name);
  const portBytes = Buffer.alloc(2);
  portBytes.writeUInt16BE(TARGET_PORT);
  s.write(Buffer.concat([Buffer.from([5, 1, 0, 3, name.length]), name, portBytes]));
  const reply = await readHead(s, (b) => (b.length >= 10 ? 10 : undefined));
  expect(reply[1]).toBe(0); // succeeded
  return s;
}

/** Everything `sock` delivers until EOF: its hash and length. */
function drain(sock: Socket): Promise<{ sha: string; bytes: number }> {
  return new Promise((resolve, reject) => {
    const h = createHash('sha256');
    let bytes = 0;
    sock.on('data', (d: Buffer) => {
      bytes += d.length;
      h.update(d);
    });
    sock.once('end', () => resolve({ sha: h.digest('hex'), bytes }));
    sock.once('error', reject);
    sock.resume();
  });
}

const closed = (s: Socket): Promise<void> =>
  new Promise((r) => (s.destroyed && s.closed ? r() : s.once('close', () => r())));

/** Resolves when the far side has closed `s` (EOF or reset); what it still sends is discarded. */
const ended = (s: Socket): Promise<void> =>
  new Promise((r) => {
    if (s.readableEnded || s.destroyed) return r();
    s.once('end', () => r()).once('close', () => r());
    s.resume();
  });

// ---- the cases ----------------------------------------------------------------------------------------

let target: Awaited<ReturnType<typeof startTarget>>;

beforeAll(async () => {
  target = await startTarget();
});

afterAll(async () => {
  await target?.close();
});

describe('fd tunnel relay (gateway level)', () => {
  it.each([
    ['fd relay', true],
    ['Node streams (fdRelay: false)', false],
  ])(
    'CONNECT, %s: 64 MiB each way at once arrive intact; the event counts exactly the bytes sent',
    async (_what, fdRelay) => {
      const gw = newGateway(fdRelay);
      const a = attach(gw);
      try {
        const size = 64 * MiB;
        const s = await connectTunnel(a.port);
        const header = Buffer.from(`both ${size}\n`);
        const up = randomBytes(size);
        const got = drain(s);
        s.write(Buffer.concat([header, up]));
        await until(() => target.conns.length > 0 && target.conns.at(-1)!.bytesIn > 0, 10_000);
        // With fdRelay the relay's worker carries it (and Node streams do not).
        expect(gw.relay?.size).toBe(fdRelay ? 1 : undefined);
        const down = await got;
        s.end();
        await closed(s);
        const conn = target.conns.at(-1)!;
        expect(conn.mode).toBe('both');
        expect(down).toEqual({ sha: conn.shaOut, bytes: size });
        expect(conn.shaIn).toBe(sha(up));
        await until(() => a.events.length > 0);
        expect(a.events).toHaveLength(1);
        expect(a.events[0]).toMatchObject({
          protocol: 'connect',
          host: ALLOWED.name,
          port: TARGET_PORT,
          address: ALLOWED.address,
          decision: 'allow',
          bytesUp: header.length + size,
          bytesDown: size,
        });
        expect(a.events[0]!.durationMs).toBeGreaterThanOrEqual(0);
      } finally {
        await a.egress.close();
        await gw.close();
      }
    },
    60_000,
  );

  it('SOCKS5: 16 MiB each way arrive intact; the event says socks5 with the exact counts', async () => {
    const gw = newGateway();
    const a = attach(gw);
    try {
      const size = 16 * MiB;
      const s = await socksTunnel(a.port);
      const header = Buffer.from(`both ${size}\n`);
      const up = randomBytes(size);
      const got = drain(s);
      s.write(Buffer.concat([header, up]));
      const down = await got;
      s.end();
      const conn = target.conns.at(-1)!;
      expect(down).toEqual({ sha: conn.shaOut, bytes: size });
      await until(() => a.events.length > 0);
      expect(conn.shaIn).toBe(sha(up));
      expect(a.events[0]).toMatchObject({
        protocol: 'socks5',
        decision: 'allow',
        bytesUp: header.length + size,
        bytesDown: size,
      });
    } finally {
      await a.egress.close();
      await gw.close();
    }
  });

  it('half-close, client first: its EOF reaches the host, which still sends 8 MiB after it', async () => {
    const gw = newGateway();
    const a = attach(gw);
    try {
      const s = await connectTunnel(a.port);
      const body = randomBytes(3 * MiB);
      const got = drain(s);
      s.end(Buffer.concat([Buffer.from(`down ${8 * MiB}\n`), body])); // write, then FIN
      const down = await got;
      const conn = target.conns.at(-1)!;
      expect(conn.shaIn).toBe(sha(body)); // the host saw everything, then the EOF
      expect(down).toEqual({ sha: conn.shaOut, bytes: 8 * MiB }); // and answered after it
      await until(() => a.events.length > 0);
      expect(a.events[0]).toMatchObject({
        bytesUp: `down ${8 * MiB}\n`.length + body.length,
        bytesDown: 8 * MiB,
      });
    } finally {
      await a.egress.close();
      await gw.close();
    }
  });

  it('half-close, host first: its EOF reaches the client, which still sends 8 MiB after it', async () => {
    const gw = newGateway();
    const a = attach(gw);
    try {
      const s = await connectTunnel(a.port);
      const got = drain(s);
      s.write('up\n');
      expect((await got).bytes).toBe(0); // the host's FIN arrived...
      expect(s.destroyed).toBe(false); // ...and the client's side is still open
      const body = randomBytes(8 * MiB);
      s.end(body);
      await closed(s);
      await until(() => target.conns.at(-1)?.shaIn !== undefined);
      expect(target.conns.at(-1)!.shaIn).toBe(sha(body));
      await until(() => a.events.length > 0);
      expect(a.events[0]).toMatchObject({ bytesUp: 3 + body.length, bytesDown: 0 });
    } finally {
      await a.egress.close();
      await gw.close();
    }
  });

  it('bytes sent with the CONNECT request, before the tunnel is up, go first and in order', async () => {
    const gw = newGateway();
    const a = attach(gw);
    try {
      const s = await dial(a.port);
      const target = `${ALLOWED.name}:${TARGET_PORT}`;
      // One write: the request and the tunnel's first bytes (Node reads them as the CONNECT "head").
      s.write(`CONNECT ${target} HTTP/1.1\r\nHost: ${target}\r\n\r\necho\nfirst-`);
      const head = await readHead(s, (b) => {
        const i = b.indexOf('\r\n\r\n');
        return i < 0 ? undefined : i + 4;
      });
      expect(head.toString('latin1')).toMatch(/^HTTP\/1\.1 200 /);
      s.write('second');
      const echoed = await readHead(s, (b) => (b.length >= 12 ? 12 : undefined));
      expect(echoed.toString()).toBe('first-second');
      s.end();
      await until(() => a.events.length > 0);
      expect(a.events[0]).toMatchObject({ bytesUp: 'echo\nfirst-second'.length, bytesDown: 12 });
    } finally {
      await a.egress.close();
      await gw.close();
    }
  });

  it('a host that speaks first (a banner, like SSH): its bytes reach the client first and in order', async () => {
    const gw = newGateway();
    const a = attach(gw, [`${ALLOWED.name}:${BANNER_PORT}`]);
    const banner = 'SSH-2.0-airlock-test\r\n';
    const server = createServer({ allowHalfOpen: true }, (c) => {
      c.on('error', () => {});
      c.write(banner);
      c.pipe(c);
    });
    await new Promise<void>((r) => server.listen(BANNER_PORT, ALLOWED.address, r));
    try {
      const s = await dial(a.port);
      const socks = Buffer.alloc(2);
      socks.writeUInt16BE(BANNER_PORT);
      const name = Buffer.from(ALLOWED.name);
      // SOCKS5 greeting and request at once; then wait for the banner behind the reply.
      s.write(Buffer.concat([Buffer.from([5, 1, 0, 5, 1, 0, 3, name.length]), name, socks]));
      const got = await readHead(s, (b) => (b.length >= 12 + banner.length ? 12 + banner.length : undefined));
      expect([...got.subarray(0, 3)]).toEqual([5, 0, 5]);
      expect(got.subarray(12).toString()).toBe(banner);
      s.write('hello');
      expect((await readHead(s, (b) => (b.length >= 5 ? 5 : undefined))).toString()).toBe('hello');
      s.end();
      await until(() => a.events.length > 0);
      expect(a.events[0]).toMatchObject({ protocol: 'socks5', bytesUp: 5, bytesDown: banner.length + 5 });
    } finally {
      await a.egress.close();
      await gw.close();
      await new Promise((r) => server.close(r));
    }
  });

  it('closing the attachment (lease end) ends a live tunnel: both connections close, then close() returns', async () => {
    const gw = newGateway();
    const a = attach(gw);
    try {
      const s = await connectTunnel(a.port);
      s.write('echo\nping');
      const echoed = await readHead(s, (b) => (b.length >= 4 ? 4 : undefined));
      expect(echoed.toString()).toBe('ping');
      const conn = target.conns.at(-1)!;
      expect(conn.open).toBe(true);
      expect(gw.relay?.size).toBe(1);
      const clientClosed = ended(s);
      await a.egress.close();
      // close() has returned: the relay holds nothing, and both ends see their connection closed.
      expect(gw.relay?.size).toBe(0);
      await clientClosed;
      await until(() => !conn.open, 5_000);
      expect(conn.open).toBe(false);
      expect(a.events).toHaveLength(1);
      expect(a.events[0]).toMatchObject({ protocol: 'connect', decision: 'allow', bytesUp: 9, bytesDown: 4 });
      s.destroy();
    } finally {
      await a.egress.close();
      await gw.close();
    }
  });

  it('a reset on either side ends the tunnel with an event; the gateway keeps relaying', async () => {
    const gw = newGateway();
    const a = attach(gw);
    try {
      // The host resets.
      const s1 = await connectTunnel(a.port);
      s1.on('error', () => {});
      s1.write('reset\n');
      await ended(s1);
      s1.destroy();
      // The client resets in the middle of a download.
      const s2 = await connectTunnel(a.port);
      s2.on('error', () => {});
      s2.write(`both ${32 * MiB}\n`);
      await readHead(s2, (b) => (b.length >= MiB ? MiB : undefined));
      s2.resetAndDestroy();
      await until(() => a.events.length === 2, 5_000);
      expect(a.events.map((e) => e.decision)).toEqual(['allow', 'allow']);
      // Still relaying.
      const s3 = await connectTunnel(a.port);
      s3.write('echo\nstill');
      expect((await readHead(s3, (b) => (b.length >= 5 ? 5 : undefined))).toString()).toBe('still');
      s3.end();
      await until(() => a.events.length === 3, 5_000);
      expect(gw.relay?.size).toBe(0);
    } finally {
      await a.egress.close();
      await gw.close();
    }
  });

  it('no file descriptor leaks: 60 tunnels ending every way leave /proc/self/fd as it was', async () => {
    const before = fdMap();
    const gw = newGateway();
    const a = attach(gw);
    const b = attach(gw);
    const withB = fdMap();
    // Fds that appeared meanwhile and are not the attachments' listeners: threads this process starts
    // on its own schedule (seen: a libuv loop's epoll, eventfd and pipe pair). Never a socket.
    const foreign = [...withB].filter(
      ([fd, link]) => before.get(fd) !== link && ![...a.fds, ...b.fds].includes(Number(fd)),
    );
    expect(foreign.filter(([, link]) => link.startsWith('socket:'))).toEqual([]);
    const bOpen = (): number[] => b.fds.filter((fd) => fdMap().get(String(fd)) === withB.get(String(fd)));
    // Warm up: the relay's worker runs from here on.
    const w = await connectTunnel(a.port);
    w.write('echo\nx');
    await readHead(w, (x) => (x.length >= 1 ? 1 : undefined));
    w.end();
    await until(() => a.events.length === 1);
    const running = fdMap();
    const runs: Promise<unknown>[] = [];
    const live: Socket[] = [];
    for (let i = 0; i < 15; i++) {
      // completed transfers
      runs.push(
        connectTunnel(a.port).then(async (s) => {
          const got = drain(s);
          s.write(`both ${MiB}\n`);
          s.write(randomBytes(MiB));
          await got;
          s.end();
          await closed(s);
        }),
      );
      // the host resets
      runs.push(
        connectTunnel(a.port).then(async (s) => {
          s.on('error', () => {});
          s.write('reset\n');
          await ended(s);
          s.destroy();
        }),
      );
      // the client resets mid-transfer
      runs.push(
        socksTunnel(a.port).then(async (s) => {
          s.on('error', () => {});
          s.write(`both ${8 * MiB}\n`);
          await readHead(s, (x) => (x.length >= 1024 ? 1024 : undefined));
          s.resetAndDestroy();
        }),
      );
      // live on attachment b when b closes
      runs.push(
        connectTunnel(b.port).then(async (s) => {
          s.write('echo\nlive');
          await readHead(s, (x) => (x.length >= 4 ? 4 : undefined));
          live.push(s);
        }),
      );
    }
    await Promise.all(runs);
    const liveEnded = Promise.all(live.map(ended));
    await b.egress.close();
    await liveEnded; // every live tunnel of b was closed by b.close()
    for (const s of live) s.destroy();
    await until(() => a.events.length === 1 + 45, 10_000);
    expect(a.events).toHaveLength(46);
    expect(b.events).toHaveLength(15);
    expect(gw.relay?.size).toBe(0);
    // Closing propagates through the worker and the test servers; under load that takes a while.
    await until(() => newFds(running) === '' && bOpen().length === 0, 20_000);
    expect(newFds(running)).toBe(''); // while the relay runs: nothing opened since it started remains
    expect(bOpen()).toEqual([]); // and b's listeners are closed
    await a.egress.close();
    await gw.close();
    // With it stopped, nothing of the gateway at all: only what was open before, and the foreign fds.
    const allowed = new Map([...before, ...foreign]);
    await until(() => newFds(allowed) === '', 20_000);
    expect(newFds(allowed)).toBe('');
  }, 90_000);

  /** A relay of its own, and a loopback server that keeps every connection it accepts. */
  const relayAndServer = async (): Promise<{
    relay: FdRelay;
    accepted: Socket[];
    port: number;
    server: Server;
  }> => {
    const relay = FdRelay.create(silentLogger)!;
    expect(relay).toBeDefined();
    const accepted: Socket[] = [];
    const server = createServer({ allowHalfOpen: true }, (s) => accepted.push(s.on('error', () => {})));
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    return { relay, accepted, port: (server.address() as { port: number }).port, server };
  };

  it('a tunnel idle for idleMs is closed by the relay (both connections)', async () => {
    const { relay, accepted, port, server } = await relayAndServer();
    try {
      const client = await dial(port);
      const upstream = await dial(port);
      await until(() => accepted.length === 2);
      // accepted[0] plays the sandbox's connection, `upstream` the dialled one.
      const t = relay.take(accepted[0]!, upstream, { idleMs: 300 });
      expect(t).toBeDefined();
      const started = Date.now();
      expect(await t!.done).toEqual({ bytesUp: 0, bytesDown: 0, error: 'idle' });
      expect(Date.now() - started).toBeLessThan(3_000);
      await Promise.all([ended(client), ended(accepted[1]!)]);
      client.destroy();
      for (const x of accepted) x.destroy();
    } finally {
      await relay.close();
      await new Promise((r) => server.close(r));
    }
  });

  it('a receiver that stops reading: the relay stops reading too, keeps what it could not write, and delivers every byte in order later', async () => {
    const { relay, accepted, port, server } = await relayAndServer();
    try {
      const client = await dial(port);
      client.pause(); // the sandbox's side reads nothing for now
      await until(() => accepted.length === 1);
      const upstream = await dial(port);
      await until(() => accepted.length === 2);
      const [sandboxSide, host] = accepted as [Socket, Socket];
      const t = relay.take(sandboxSide, upstream, { idleMs: 60_000 })!;
      expect(t).toBeDefined();
      // More than the kernel buffers on the way (client receive + relay send + relay receive) hold.
      const body = randomBytes(48 * MiB);
      host.end(body);
      // Backpressure reaches the host: with the client not reading, the relay takes no more, so the
      // host's own send buffer stays full (a relay that kept reading would have taken everything).
      await until(() => host.writableLength > 0, 10_000);
      await new Promise((r) => setTimeout(r, 300));
      expect(host.writableLength).toBeGreaterThan(0);
      expect(host.writableFinished).toBe(false);
      const got = drain(client); // reads again
      expect(await got).toEqual({ sha: sha(body), bytes: body.length });
      client.end();
      expect(await t.done).toEqual({ bytesUp: 0, bytesDown: body.length });
      client.destroy();
    } finally {
      await relay.close();
      for (const x of accepted) x.destroy();
      await new Promise((r) => server.close(r));
    }
  }, 60_000);
});

// ---- a real sandbox -----------------------------------------------------------------------------------

/** Holds a CONNECT tunnel to allowed.test:7100 open (echo mode) until it is killed. */
const HOLD_PY = String.raw`
import socket, sys, time
s = socket.create_connection(('127.0.0.1', 3128), timeout=10)
s.sendall(b'CONNECT allowed.test:7100 HTTP/1.1\r\nHost: allowed.test:7100\r\n\r\n')
head = b''
while b'\r\n\r\n' not in head:
    head += s.recv(1)
s.sendall(b'echo\nping')
got = b''
while len(got) < 4:
    got += s.recv(4 - len(got))
print(got.decode(), flush=True)
time.sleep(600)
`;

describe.skipIf(!canRunNamespaces)('fd tunnel relay (a real sandbox)', () => {
  let world: EgressWorld;
  beforeAll(async () => {
    world = await startEgressWorld();
  });
  afterAll(async () => {
    await world?.close();
  });

  it('killing the sandbox ends its live tunnel; the event has the exact counts', async () => {
    const s = await world.airlock.create({ network: { allow: [`${ALLOWED.name}:${TARGET_PORT}`] } });
    const events: EgressEvent[] = [];
    s.onEgress((e) => events.push(e));
    let out = '';
    await s.exec(['python3', '-c', HOLD_PY], { background: true, onStdout: (t) => (out += t) });
    await until(() => out.includes('ping'), 10_000);
    const conn = target.conns.at(-1)!;
    expect(conn).toMatchObject({ mode: 'echo', open: true });
    await sleep(50);
    expect(conn.open).toBe(true);
    await s.kill();
    await until(() => !conn.open, 5_000);
    expect(conn.open).toBe(false);
    await until(() => events.some((e) => e.protocol === 'connect'), 5_000);
    expect(events.find((e) => e.protocol === 'connect')).toMatchObject({
      host: ALLOWED.name,
      port: TARGET_PORT,
      decision: 'allow',
      bytesUp: 9,
      bytesDown: 4,
    });
  });
});
