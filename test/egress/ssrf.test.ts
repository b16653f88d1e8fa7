// The SSRF guard through the proxy, with the bytes a hostile client would send: raw absolute-form
// requests and CONNECT lines written by python inside the sandbox (curl would normalise the spellings
// first). Every block is proven by the guarded dialer's log (no dial), never by connecting.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Sandbox } from '../../src/index.js';
import type { EgressEvent } from '../../src/egress/events.js';
import { canRunNamespaces } from '../helpers.js';
import {
  rawConversations,
  rawRequest,
  startEgressWorld,
  statusOf,
  until,
  type EgressWorld,
} from './harness.js';
import { ALLOWED, assertPrivateNetns, DENIED } from './net.js';

assertPrivateNetns();

/** Host spellings that all mean a blocked address (metadata, loopback, private, special ranges). */
const BLOCKED_SPELLINGS = [
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
] as const;

/** Names the test resolver maps to blocked addresses; the policy allows the names themselves. */
const PRIVATE_NAMES = [
  { name: 'metadata.test', address: '169.254.169.254' },
  { name: 'loop.test', address: '127.0.0.1' },
  { name: 'mixed.test', address: '10.0.0.1' }, // answers a public test address AND 10.0.0.1
] as const;

const policy = {
  allow: [ALLOWED.name, 'metadata.test', 'loop.test', 'mixed.test', `${ALLOWED.name}:5432`],
};

let world: EgressWorld;
let sbx: Sandbox;
const events: EgressEvent[] = [];

beforeAll(async () => {
  if (!canRunNamespaces) return;
  world = await startEgressWorld();
  sbx = await world.airlock.create({ network: policy });
  sbx.onEgress((e) => events.push(e));
});

afterAll(async () => {
  await sbx?.kill();
  await world?.close();
});

/** Run `f`; return the dials and events it caused. */
async function observe(f: () => Promise<void>): Promise<{ dials: string[]; events: EgressEvent[] }> {
  const d = world.dialer.dials.length;
  const e = events.length;
  await f();
  await new Promise((r) => setTimeout(r, 20));
  return { dials: world.dialer.dials.slice(d), events: events.slice(e) };
}

const BLOCKED_REASON =
  /blocked by Airlock egress policy: .* is in a blocked range \(.+\); private, loopback and metadata addresses are never reachable/;

describe.skipIf(!canRunNamespaces)('every blocked range and spelling, as raw bytes through the proxy', () => {
  it.each(BLOCKED_SPELLINGS)('GET http://%s/ → 403 with a reason, no dial', async (host) => {
    let reply = '';
    const seen = await observe(async () => {
      const c = await rawRequest(
        sbx,
        `GET http://${host}/latest/meta-data/ HTTP/1.1\r\nHost: ${host}\r\nConnection: close\r\n\r\n`,
      );
      reply = c.steps[0]!;
    });
    expect(statusOf(reply), reply).toBe(403);
    expect(reply).toMatch(BLOCKED_REASON);
    expect(seen.dials).toEqual([]);
    expect(seen.events).toHaveLength(1);
    expect(seen.events[0]).toMatchObject({ protocol: 'http', decision: 'deny', code: 'blocked_address' });
  });

  it.each(BLOCKED_SPELLINGS)('CONNECT %s:443 → 403 with a reason, no dial', async (host) => {
    let reply = '';
    const seen = await observe(async () => {
      const c = await rawRequest(sbx, `CONNECT ${host}:443 HTTP/1.1\r\nHost: ${host}:443\r\n\r\n`);
      reply = c.steps[0]!;
    });
    expect(statusOf(reply), reply).toBe(403);
    expect(reply).toMatch(BLOCKED_REASON);
    expect(seen.dials).toEqual([]);
    expect(seen.events[0]).toMatchObject({ protocol: 'connect', decision: 'deny', code: 'blocked_address' });
  });

  it('the proxy itself (127.0.0.1:3128) is not a destination', async () => {
    const seen = await observe(async () => {
      const c = await rawRequest(sbx, 'CONNECT 127.0.0.1:3128 HTTP/1.1\r\nHost: 127.0.0.1:3128\r\n\r\n');
      expect(statusOf(c.steps[0]!)).toBe(403);
    });
    expect(seen.dials).toEqual([]);
  });

  it.each(PRIVATE_NAMES)(
    'an allowed name resolving to $address ($name) is refused after resolution, before any dial',
    async ({ name, address }) => {
      const calls = world.resolver.calls.length;
      const seen = await observe(async () => {
        const [get, connect] = await rawConversations(sbx, [
          [{ send: `GET http://${name}/ HTTP/1.1\r\nHost: ${name}\r\nConnection: close\r\n\r\n` }],
          [{ send: `CONNECT ${name}:443 HTTP/1.1\r\nHost: ${name}:443\r\n\r\n` }],
        ]);
        for (const c of [get!, connect!]) {
          expect(statusOf(c.steps[0]!), c.steps[0]).toBe(403);
          expect(c.steps[0]).toContain(`host ${name} resolved to ${address}, which is in a blocked range`);
        }
      });
      expect(world.resolver.calls.slice(calls)).toEqual([name, name]); // Airlock resolved it itself …
      expect(seen.dials).toEqual([]); // … and dialled nothing
      expect(seen.events.map((e) => [e.decision, e.code, e.address])).toEqual([
        ['deny', 'blocked_address', address],
        ['deny', 'blocked_address', address],
      ]);
    },
  );
});

describe.skipIf(!canRunNamespaces)('ports and tunnels', () => {
  it('CONNECT to an allowed host on a port the policy does not list → 403 "port … is not allowed"', async () => {
    const seen = await observe(async () => {
      const [connect, get] = await rawConversations(sbx, [
        [{ send: `CONNECT ${ALLOWED.name}:8443 HTTP/1.1\r\nHost: ${ALLOWED.name}:8443\r\n\r\n` }],
        [{ send: `GET http://${ALLOWED.name}:8080/ HTTP/1.1\r\nHost: ${ALLOWED.name}:8080\r\n\r\n` }],
      ]);
      expect(statusOf(connect!.steps[0]!)).toBe(403);
      expect(connect!.steps[0]).toContain(
        'blocked by Airlock egress policy: port 8443 is not allowed for allowed.test (allowed: 80, 443, 5432)',
      );
      expect(statusOf(get!.steps[0]!)).toBe(403);
      expect(get!.steps[0]).toContain('port 8080 is not allowed for allowed.test');
    });
    expect(seen.dials).toEqual([]);
    expect(seen.events.map((e) => e.code)).toEqual(['port_not_allowed', 'port_not_allowed']);
  });

  it('a CONNECT tunnel to an allowed host whose payload is another CONNECT/proxy request reaches only that host', async () => {
    const before = world.servers.seen.length;
    const seen = await observe(async () => {
      const [nested, proxied] = await rawConversations(sbx, [
        [
          {
            send: `CONNECT ${ALLOWED.name}:80 HTTP/1.1\r\nHost: ${ALLOWED.name}:80\r\n\r\n`,
            until: '\r\n\r\n',
          },
          { send: `CONNECT ${DENIED.name}:443 HTTP/1.1\r\nHost: ${DENIED.name}:443\r\n\r\n`, timeoutS: 3 },
        ],
        [
          {
            send: `CONNECT ${ALLOWED.name}:80 HTTP/1.1\r\nHost: ${ALLOWED.name}:80\r\n\r\n`,
            until: '\r\n\r\n',
          },
          {
            send: `GET http://${DENIED.name}/inner HTTP/1.1\r\nHost: ${DENIED.name}\r\nConnection: close\r\n\r\n`,
          },
        ],
      ]);
      expect(statusOf(nested!.steps[0]!)).toBe(200);
      expect(nested!.steps[1]).not.toMatch(/^HTTP\/1\.1 200 Connection Established/);
      // Plain HTTP inside the tunnel is vetted request by request (issue 30): the inner absolute-form
      // request names another host than the tunnel's, so it is refused, never relayed to allowed.test.
      expect(statusOf(proxied!.steps[1]!)).toBe(403);
      expect(proxied!.steps[1]).toContain('this connection may only carry requests for allowed.test:80');
    });
    expect(seen.dials).toEqual([`${ALLOWED.address}:80`, `${ALLOWED.address}:80`]);
    expect(world.servers.seen.slice(before).map((q) => q.host)).toEqual([]);
    expect(world.servers.seen.some((q) => q.host === DENIED.name)).toBe(false);
  });
});

describe.skipIf(!canRunNamespaces)('after all of the above', () => {
  it('never dialled a blocked or denied address, and still serves an allowed request', async () => {
    const c = await rawRequest(
      sbx,
      `GET http://${ALLOWED.name}/still HTTP/1.1\r\nHost: ${ALLOWED.name}\r\nConnection: close\r\n\r\n`,
    );
    expect(statusOf(c.steps[0]!)).toBe(200);
    await until(() => events.some((e) => e.decision === 'allow' && e.protocol === 'http'));
    expect(world.dialer.dials.filter((d) => !d.startsWith(`${ALLOWED.address}:`))).toEqual([]);
  });
});
