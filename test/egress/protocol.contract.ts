// The egress-protocol suite (STYLE.md habit 13): the same security cases run against every egress
// path — the HTTP proxy (absolute-form), CONNECT, SOCKS5 and transparent interception — as the backend
// contract (test/contract/sandbox.contract.ts) runs against every tier. Each case is written once as
// an attempt (host, port, request, TLS or not); `jobFor` says how a path carries it. A python client
// inside a real sandbox writes the bytes itself (no HTTP library normalises a hostile spelling first).
// Every refusal is proven by the guarded dialer's log (no dial) or the test servers' log (the request
// never arrived), and by the event's stable code. A path that cannot carry a case declares the skip
// with its reason.
import { describe, expect, it } from 'vitest';
import type { EgressEvent } from '../../src/egress/events.js';
import type { Sandbox } from '../../src/index.js';
import { canRunNamespaces } from '../helpers.js';
import type { EgressWorld } from './harness.js';
import { ALLOWED, DENIED, SECOND, SECRET_HOST } from './net.js';

export type EgressPath = 'proxy' | 'connect' | 'socks5' | 'transparent';
export const EGRESS_PATHS: readonly EgressPath[] = ['proxy', 'connect', 'socks5', 'transparent'];

/** The secret the suite's sandbox holds (bound to SECRET_HOST) and its real value (world's env). */
export const SUITE_SECRET = { name: 'PROTO_TOKEN', value: 'proto-real-value-5150' } as const;

/** allowed.test and its subdomains, names that resolve to blocked addresses, SECOND denied. */
export const SUITE_SPEC = {
  network: {
    allow: [ALLOWED.name, `*.${ALLOWED.name}`, SECRET_HOST.name, 'metadata.test', 'loop.test', 'mixed.test'],
    deny: [SECOND.name],
  },
  secrets: [{ name: SUITE_SECRET.name, value: { fromEnv: SUITE_SECRET.name }, hosts: [SECRET_HOST.name] }],
};

/** Host spellings that all mean a blocked address (metadata, loopback, private, special ranges). */
export const BLOCKED_SPELLINGS = [
  '169.254.169.254',
  '2852039166', // decimal 169.254.169.254
  '0xa9fea9fe', // hex
  '0251.0376.0251.0376', // octal
  '169.254.43518', // short form: last part fills two bytes
  '127.1',
  '0x7f.1',
  '0',
  '0.0.0.0',
  '[::1]',
  '[::ffff:127.0.0.1]',
  '[::ffff:a9fe:a9fe]', // IPv4-mapped metadata address
  '[64:ff9b::a9fe:a9fe]', // NAT64
  '[2002:a9fe:a9fe::]', // 6to4
  '10.0.0.1',
  '172.16.0.1',
  '192.168.1.1',
  '100.64.0.1',
  '198.18.0.1',
  '224.0.0.1',
  '255.255.255.255',
  '[fe80::1]',
  '[fc00::1]',
  '127.0.0.1.', // trailing dot
  '0XA9FEA9FE', // upper-case hex
  '[::FFFF:A9FE:A9FE]', // upper-case IPv6
] as const;

/** Names the test resolver maps to blocked addresses; the policy allows the names themselves. */
export const PRIVATE_NAMES = [
  { name: 'metadata.test', address: '169.254.169.254' },
  { name: 'loop.test', address: '127.0.0.1' },
  { name: 'mixed.test', address: '10.0.0.1' }, // answers a public test address AND 10.0.0.1
] as const;

/** One attempt: reach host:port with a request (origin-form path + extra header lines). */
interface Attempt {
  readonly host: string;
  readonly port: number;
  readonly path?: string;
  /** Extra header lines, each ending in \r\n; {{TOKEN}} becomes the sandbox's sentinel. */
  readonly headers?: string;
  readonly tls?: boolean;
  /** Transparent: the address to connect to when `host` is not one the sandbox can resolve. */
  readonly via?: string;
}

interface Job {
  readonly mode: 'raw' | 'connect' | 'socks5';
  readonly connect: readonly [string, number];
  readonly target?: readonly [string, number];
  readonly tls?: string;
  readonly send: string;
}

interface Outcome {
  /** The CONNECT reply head or SOCKS5 reply code, when the path has one. */
  readonly handshake: string | number | null;
  readonly reply: string;
  readonly error: string | null;
}

const bare = (h: string): string => h.replace(/^\[|\]$/g, '');

/** How `path` carries an attempt. */
function jobFor(path: EgressPath, a: Attempt): Job {
  const p = a.path ?? '/';
  const origin = `GET ${p} HTTP/1.1\r\nHost: ${a.host}\r\n${a.headers ?? ''}Connection: close\r\n\r\n`;
  const tls = a.tls ? bare(a.host) : undefined;
  switch (path) {
    case 'proxy':
      return {
        mode: 'raw',
        connect: ['127.0.0.1', 3128],
        send: `GET http://${a.host}:${a.port}${p} HTTP/1.1\r\nHost: ${a.host}\r\n${a.headers ?? ''}Connection: close\r\n\r\n`,
      };
    case 'connect':
      return { mode: 'connect', connect: ['127.0.0.1', 3128], target: [a.host, a.port], send: origin, tls };
    case 'socks5':
      return {
        mode: 'socks5',
        connect: ['127.0.0.1', 3128],
        target: [bare(a.host), a.port],
        send: origin,
        tls,
      };
    case 'transparent':
      return { mode: 'raw', connect: [a.via ?? bare(a.host), a.port], send: origin, tls };
  }
}

const CLIENT_PY = String.raw`
import json, os, socket, ssl, struct, sys
jobs = json.load(sys.stdin)
token = os.environ.get('PROTO_TOKEN', '')
def read_all(s):
    buf = b''
    s.settimeout(6)
    try:
        while True:
            d = s.recv(65536)
            if not d:
                break
            buf += d
    except (socket.timeout, ConnectionResetError, ssl.SSLError, OSError):
        pass
    return buf
def read_until(s, marker=None, n=None):
    buf = b''
    while (marker not in buf) if n is None else (len(buf) < n):
        d = s.recv(1)
        if not d:
            break
        buf += d
    return buf
def do(job):
    r = {'handshake': None, 'reply': '', 'error': None}
    try:
        s = socket.create_connection(tuple(job['connect']), timeout=10)
        if job['mode'] == 'connect':
            h, p = job['target']
            s.sendall(('CONNECT %s:%d HTTP/1.1\r\nHost: %s:%d\r\n\r\n' % (h, p, h, p)).encode('latin1'))
            head = read_until(s, b'\r\n\r\n').decode('latin1')
            r['handshake'] = head
            if ' 200 ' not in head.split('\r\n')[0]:
                r['reply'] = head + read_all(s).decode('latin1')
                return r
        if job['mode'] == 'socks5':
            s.sendall(b'\x05\x01\x00')
            read_until(s, n=2)
            h, p = job['target']
            name = h.encode('latin1')
            s.sendall(b'\x05\x01\x00\x03' + bytes([len(name)]) + name + struct.pack('>H', p))
            rep = read_until(s, n=10)
            r['handshake'] = rep[1] if len(rep) > 1 else -1
            if r['handshake'] != 0:
                return r
        if job.get('tls'):
            s = ssl.create_default_context().wrap_socket(s, server_hostname=job['tls'])
        s.sendall(job['send'].replace('{{TOKEN}}', token).encode('latin1'))
        r['reply'] = read_all(s).decode('latin1')
        s.close()
    except Exception as e:
        r['error'] = repr(e)
    return r
print(json.dumps([do(j) for j in jobs]))
`;

export interface SuiteContext {
  readonly world: EgressWorld;
  readonly sandbox: Sandbox;
}

/** Run the attempts through `path`; what each got, the dials and events they caused. */
async function attempt(
  cx: SuiteContext,
  path: EgressPath,
  attempts: readonly Attempt[],
): Promise<{ outcomes: Outcome[]; dials: string[]; events: EgressEvent[]; from: number }> {
  const d = cx.world.dialer.dials.length;
  const from = cx.world.servers.seen.length;
  const r = await cx.sandbox.exec(['python3', '-c', CLIENT_PY], {
    stdin: JSON.stringify(attempts.map((a) => jobFor(path, a))),
    env: { NO_PROXY: '*', no_proxy: '*' },
    timeoutMs: 120_000,
  });
  if (r.exitCode !== 0) throw new Error(`client failed (${r.exitCode}): ${r.stderr}`);
  return {
    outcomes: JSON.parse(r.stdout) as Outcome[],
    dials: cx.world.dialer.dials.slice(d),
    events: [...(r.egress ?? [])],
    from,
  };
}

const statusOf = (reply: string): number | null => {
  const m = /^HTTP\/1\.[01] (\d{3})/.exec(reply);
  return m ? Number(m[1]) : null;
};

/**
 * A refusal as the sandbox sees it: a 403 with the reason, or SOCKS5's "not allowed" (0x02). `inTunnel`:
 * the tunnel itself was allowed and the request inside it is refused.
 */
function expectRefused(
  path: EgressPath,
  o: Outcome,
  reason: RegExp | string,
  what: string,
  inTunnel = false,
): void {
  expect(o.error, what).toBeNull();
  if (inTunnel && path === 'socks5') expect(o.handshake, what).toBe(0);
  if (inTunnel && path === 'connect') expect(o.handshake, what).toMatch(/^HTTP\/1\.1 200 /);
  if (!inTunnel && path === 'socks5') return void expect(o.handshake, what).toBe(2);
  expect(statusOf(o.reply), `${what}: ${o.reply.slice(0, 200)}`).toBe(403);
  if (typeof reason === 'string') expect(o.reply, what).toContain(reason);
  else expect(o.reply, what).toMatch(reason);
}

const BLOCKED_REASON =
  /blocked by Airlock egress policy: .* is in a blocked range \(.+\); private, loopback and metadata addresses are never reachable/;

/** The protocol field of a path's events for plain HTTP (the tunnel ones report the tunnel). */
const PLAIN_PROTOCOL: Record<EgressPath, EgressEvent['protocol']> = {
  proxy: 'http',
  connect: 'connect',
  socks5: 'socks5',
  transparent: 'transparent-http',
};

/**
 * The suite for one path. `cx()` gives the world and a sandbox made from SUITE_SPEC (its
 * PROTO_TOKEN secret resolving to SUITE_SECRET.value).
 */
export function egressProtocolSuite(path: EgressPath, cx: () => SuiteContext): void {
  describe.skipIf(!canRunNamespaces)(`egress protocol suite: ${path}`, () => {
    it('every blocked range and numeric spelling (decimal, octal, hex, short, IPv4-mapped, NAT64, 6to4, trailing dot) is refused before any dial', async () => {
      // Transparent: the connection goes to an allowed public address and names the spelling in Host
      // (a connection is to an address; the name it asks for is what the spelling can hide in).
      const attempts = BLOCKED_SPELLINGS.map((host): Attempt => ({
        host,
        port: path === 'connect' || path === 'socks5' ? 443 : 80,
        via: ALLOWED.address,
      }));
      const { outcomes, dials, events } = await attempt(cx(), path, attempts);
      outcomes.forEach((o, i) => {
        const what = `${path} ${BLOCKED_SPELLINGS[i]}`;
        expectRefused(path, o, BLOCKED_REASON, what);
      });
      expect(dials).toEqual([]);
      expect(events.map((e) => [e.protocol, e.decision, e.code])).toEqual(
        BLOCKED_SPELLINGS.map(() => [PLAIN_PROTOCOL[path], 'deny', 'blocked_address']),
      );
    });

    it('an allowed name that resolves to a blocked address (the injectable resolver) is refused after resolution, before any dial', async () => {
      const world = cx().world;
      const calls = world.resolver.calls.length;
      const { outcomes, dials, events } = await attempt(
        cx(),
        path,
        PRIVATE_NAMES.map(({ name }) => ({ host: name, port: 80 })),
      );
      outcomes.forEach((o, i) => {
        const { name, address } = PRIVATE_NAMES[i]!;
        // SOCKS5 has no room for a reason: its reply code says it (the event has the reason).
        expectRefused(path, o, `host ${name} resolved to ${address}, which is in a blocked range`, name);
      });
      // Airlock resolved each name itself (once), and dialled nothing.
      expect(world.resolver.calls.slice(calls)).toEqual(PRIVATE_NAMES.map((p) => p.name));
      expect(dials).toEqual([]);
      expect(events.map((e) => [e.decision, e.code, e.address])).toEqual(
        PRIVATE_NAMES.map((p) => ['deny', 'blocked_address', p.address]),
      );
    });

    it('network.deny wins over a matching allow wildcard, a host not in allow is refused, and case and a trailing dot change nothing', async () => {
      const attempts: Attempt[] = [
        { host: SECOND.name, port: 80, via: SECOND.address },
        { host: 'API.Allowed.TEST.', port: 80, via: SECOND.address },
        { host: DENIED.name, port: 80, via: DENIED.address },
      ];
      const { outcomes, dials, events } = await attempt(cx(), path, attempts);
      expectRefused(
        path,
        outcomes[0]!,
        `host ${SECOND.name} is denied by network.deny entry "${SECOND.name}"`,
        SECOND.name,
      );
      expectRefused(
        path,
        outcomes[1]!,
        `host ${SECOND.name} is denied by network.deny entry "${SECOND.name}"`,
        'upper case',
      );
      expectRefused(path, outcomes[2]!, `host ${DENIED.name} is not in network.allow`, DENIED.name);
      expect(dials).toEqual([]);
      expect(events.map((e) => [e.decision, e.code, e.host])).toEqual([
        ['deny', 'denied', SECOND.name],
        ['deny', 'denied', SECOND.name],
        ['deny', 'not_allowed', DENIED.name],
      ]);
    });

    it('userinfo naming an allowed host in front of a blocked address reaches nothing', async () => {
      const host = `${ALLOWED.name}@10.0.0.1`;
      const { outcomes, dials, events, from } = await attempt(cx(), path, [
        { host, port: path === 'connect' || path === 'socks5' ? 443 : 80, via: ALLOWED.address },
      ]);
      // The proxy and the transparent path read the host from the URL / Host header and refuse a
      // target that does not name it plainly; CONNECT and SOCKS5 get the whole string as the host.
      const code = path === 'proxy' || path === 'transparent' ? 'mismatch' : 'invalid_host';
      expectRefused(path, outcomes[0]!, /blocked by Airlock egress policy: /, host);
      expect(dials).toEqual([]);
      expect(cx().world.servers.seen.slice(from)).toEqual([]);
      expect(events.map((e) => [e.decision, e.code])).toEqual([['deny', code]]);
    });

    const bearer = 'Authorization: Bearer {{TOKEN}}\r\n';
    it.skipIf(path === 'proxy')(
      // (skipped on the proxy: absolute-form carries http:// only; https:// goes through CONNECT)
      'a secret is swapped in only for its bound host over TLS, and what the host reflects is scrubbed',
      async () => {
        const { outcomes, events, from } = await attempt(cx(), path, [
          { host: SECRET_HOST.name, port: 443, tls: true, path: '/swap', headers: bearer },
        ]);
        const o = outcomes[0]!;
        expect(o.error).toBeNull();
        expect(statusOf(o.reply), o.reply.slice(0, 300)).toBe(200);
        // The server echoes the Authorization it got: the sandbox reads its sentinel back, not the value.
        expect(o.reply).not.toContain(SUITE_SECRET.value);
        expect(o.reply).toMatch(/"authorization":"Bearer [^"]+"/);
        const seen = cx().world.servers.seen.slice(from);
        expect(seen.map((q) => [q.host, q.url, q.headers.authorization])).toEqual([
          [SECRET_HOST.name, '/swap', `Bearer ${SUITE_SECRET.value}`],
        ]);
        expect(events.find((e) => e.decision === 'allow')).toMatchObject({
          secretsSwapped: [SUITE_SECRET.name],
        });
      },
    );

    it('a sentinel in plain HTTP is refused: to its bound host as cleartext, to another host as exfiltration', async () => {
      const { outcomes, events, from } = await attempt(cx(), path, [
        { host: SECRET_HOST.name, port: 80, path: '/clear', headers: bearer },
        { host: ALLOWED.name, port: 80, path: '/exfil', headers: bearer },
      ]);
      // Through a tunnel the request is refused inside it (the tunnel itself was allowed).
      expectRefused(path, outcomes[0]!, `is sent to ${SECRET_HOST.name} only over TLS`, 'cleartext', true);
      expectRefused(path, outcomes[1]!, 'may only be sent to its bound host(s)', 'exfiltration', true);
      expect(cx().world.servers.seen.slice(from)).toEqual([]);
      const denies = events.filter((e) => e.decision === 'deny');
      expect(denies.map((e) => [e.protocol, e.code, e.host])).toEqual([
        [PLAIN_PROTOCOL[path], 'cleartext_secret', SECRET_HOST.name],
        [PLAIN_PROTOCOL[path], 'sentinel', ALLOWED.name],
      ]);
      expect(denies[1]).toMatchObject({ alert: 'sentinel' });
    });
  });
}
