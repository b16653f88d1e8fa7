// Test network for the egress suite. Runs only inside the private network namespace that
// scripts/egress-test.sh creates (lo only, plus 203.0.113.x/32 addresses): `assertPrivateNetns`
// refuses to run anywhere else. Test servers listen on those addresses; the resolver maps test names
// to them; the dialer refuses every address that is not one of this namespace's own, and records
// every dial so tests can prove a block happened before any socket was opened.
import { readFileSync } from 'node:fs';
import { createServer as createHttpServer, type IncomingMessage, type Server as HttpServer } from 'node:http';
import { createServer as createHttpsServer } from 'node:https';
import { mkdtempSync, rmSync } from 'node:fs';
import { connect, createServer, type Server, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { libc } from '../../src/core/libc.privileged.js';
import { silentLogger } from '../../src/core/backend.js';
import { EgressGateway } from '../../src/egress/gateway.js';
import { MitmCa } from '../../src/egress/mitm.js';
import type { Dialer, Resolver } from '../../src/egress/vet.js';

export const ALLOWED = { name: 'allowed.test', address: '203.0.113.10' } as const;
export const SECOND = { name: 'api.allowed.test', address: '203.0.113.11' } as const;
export const SECRET_HOST = { name: 'secrets.test', address: '203.0.113.12' } as const;
export const DENIED = { name: 'denied.test', address: '203.0.113.20' } as const;
export const OTHER = { name: 'other.test', address: '203.0.113.30' } as const;
const OWN = new Set<string>([ALLOWED, SECOND, SECRET_HOST, DENIED, OTHER].map((h) => h.address));

/** Throws unless this process is in a network namespace whose only interface is lo. */
export function assertPrivateNetns(): void {
  // /proc/self/net/dev lists the interfaces of this process's network namespace (/sys may not).
  const ifaces = readFileSync('/proc/self/net/dev', 'utf8')
    .split('\n')
    .slice(2)
    .map((l) => l.split(':')[0]!.trim())
    .filter(Boolean);
  if (process.env.AIRLOCK_EGRESS_TEST_NETNS !== '1' || ifaces.length !== 1 || ifaces[0] !== 'lo') {
    throw new Error(
      `egress tests run only via scripts/egress-test.sh (interfaces here: ${ifaces.join(', ')})`,
    );
  }
}

/** name → addresses; `rebind.test` answers a public test address first, then 127.0.0.1. */
export function testResolver(): Resolver & { calls: string[] } {
  const calls: string[] = [];
  let rebinds = 0;
  const table: Record<string, string[]> = {
    [ALLOWED.name]: [ALLOWED.address],
    [SECOND.name]: [SECOND.address],
    [SECRET_HOST.name]: [SECRET_HOST.address],
    [DENIED.name]: [DENIED.address],
    [OTHER.name]: [OTHER.address],
    'mixed.test': [ALLOWED.address, '10.0.0.1'],
    'metadata.test': ['169.254.169.254'],
    'loop.test': ['127.0.0.1'],
  };
  const r = (async (name: string) => {
    calls.push(name);
    if (name === 'rebind.test') return rebinds++ === 0 ? [ALLOWED.address] : ['127.0.0.1'];
    const a = table[name];
    if (!a) throw new Error(`ENOTFOUND ${name}`);
    return a;
  }) as Resolver & { calls: string[] };
  r.calls = calls;
  return r;
}

/** Dials only this namespace's own test addresses; records every attempt (before any socket). */
export function guardedDialer(): Dialer & { dials: string[] } {
  const dials: string[] = [];
  const d = ((address: string, port: number) => {
    dials.push(`${address}:${port}`);
    if (!OWN.has(address)) return Promise.reject(new Error(`test dialer refuses ${address}`));
    return new Promise<Socket>((resolve, reject) => {
      const s = connect({ host: address, port });
      s.once('connect', () => resolve(s));
      s.once('error', reject);
    });
  }) as Dialer & { dials: string[] };
  d.dials = dials;
  return d;
}

export interface SeenRequest {
  readonly host: string;
  readonly method: string;
  readonly url: string;
  readonly headers: IncomingMessage['headers'];
  readonly at: number;
  readonly body: string;
}

export interface TestServers {
  readonly ca: MitmCa; // signs the test servers' certificates (the "public" PKI of this test world)
  readonly seen: SeenRequest[];
  close(): Promise<void>;
}

/** HTTP :80 and HTTPS :443 on every test address, and a TCP echo on :5432 of ALLOWED. */
export async function startTestServers(): Promise<TestServers> {
  const pki = mkdtempSync(join(tmpdir(), 'airlock-test-pki-'));
  const ca = MitmCa.loadOrCreate(join(pki, 'ca'));
  const seen: SeenRequest[] = [];
  const servers: Array<HttpServer | Server> = [];
  const handler = (host: string) => (req: IncomingMessage, res: import('node:http').ServerResponse) => {
    const chunks: Buffer[] = [];
    req.on('data', (d: Buffer) => chunks.push(d));
    req.on('end', () => {
      const received = Buffer.concat(chunks).toString('utf8');
      seen.push({
        host,
        method: req.method ?? '',
        url: req.url ?? '',
        headers: req.headers,
        at: Date.now(),
        body: received,
      });
      const body = JSON.stringify({
        host,
        url: req.url,
        authorization: req.headers.authorization ?? null,
        body: received,
      });
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) });
      res.end(body);
    });
  };
  const listen = (s: HttpServer | Server, address: string, port: number): Promise<void> =>
    new Promise((resolve, reject) => {
      s.once('error', reject);
      s.listen(port, address, () => resolve());
      servers.push(s);
    });
  for (const h of [ALLOWED, SECOND, SECRET_HOST, DENIED, OTHER]) {
    await listen(createHttpServer(handler(h.name)), h.address, 80);
    const leaf = ca.leafFor(h.name);
    await listen(createHttpsServer({ key: leaf.key, cert: leaf.cert }, handler(h.name)), h.address, 443);
  }
  await listen(
    createServer((s) => s.pipe(s)),
    ALLOWED.address,
    5432,
  );
  return {
    ca,
    seen,
    close: async () => {
      for (const s of servers) (s as HttpServer).closeAllConnections?.();
      await Promise.all(servers.map((s) => new Promise((r) => s.close(() => r(undefined)))));
      rmSync(pki, { recursive: true, force: true });
    },
  };
}

/** A listening (tcp) or bound (udp) socket on 127.0.0.1:port, as the backend's plumbing makes them. */
export function listenFd(kind: 'tcp' | 'udp', port: number): number {
  const c = libc();
  const fd = c.socket(2 /* AF_INET */, (kind === 'tcp' ? 1 : 2) | 0o4000 | 0o2000000, 0);
  if (fd < 0) throw new Error(`socket: errno ${c.errno()}`);
  const one = Buffer.alloc(4);
  one.writeInt32LE(1);
  c.setsockopt(fd, 1 /* SOL_SOCKET */, 2 /* SO_REUSEADDR */, one, 4);
  const sa = Buffer.alloc(16);
  sa.writeUInt16LE(2, 0);
  sa.writeUInt16BE(port, 2);
  sa.set([127, 0, 0, 1], 4);
  if (c.bind(fd, sa, 16) !== 0 || (kind === 'tcp' && c.listen(fd, 1024) !== 0)) {
    const e = c.errno();
    c.close(fd);
    throw new Error(`bind/listen 127.0.0.1:${port}: errno ${e}`);
  }
  return fd;
}

/** A gateway for gateway-level tests: the test resolver and guarded dialer, no TLS interception. */
export function testGateway(fdRelay = true): EgressGateway {
  return new EgressGateway({
    resolver: testResolver(),
    dialer: guardedDialer(),
    ca: () => {
      throw new Error('no interception in these tests');
    },
    fdRelay,
    logger: silentLogger,
  });
}

/** Listen on address:port; close() destroys the connections it has seen, then closes the server. */
export function listenClosable<T extends object>(
  server: Server,
  sockets: Set<Socket>,
  port: number,
  address: string,
  extra: T,
): Promise<T & { close(): Promise<void> }> {
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, address, () =>
      resolve({
        ...extra,
        close: async () => {
          for (const s of sockets) s.destroy();
          await new Promise((r) => server.close(r));
        },
      }),
    );
  });
}
