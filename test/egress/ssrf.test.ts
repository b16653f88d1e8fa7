// The SSRF guard through the proxy, with the bytes a hostile client would send: raw absolute-form
// requests and CONNECT lines written by python inside the sandbox (curl would normalise the spellings
// first). Every block is proven by the guarded dialer's log (no dial), never by connecting. Blocked
// ranges in every spelling and names resolving to private addresses are in the egress-protocol suite
// (protocol.contract.ts), for every path; this file keeps the proxy's own cases.
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

describe.skipIf(!canRunNamespaces)('ports and tunnels', () => {
  it('the proxy itself (127.0.0.1:3128) is not a destination', async () => {
    const seen = await observe(async () => {
      const c = await rawRequest(sbx, 'CONNECT 127.0.0.1:3128 HTTP/1.1\r\nHost: 127.0.0.1:3128\r\n\r\n');
      expect(statusOf(c.steps[0]!)).toBe(403);
    });
    expect(seen.dials).toEqual([]);
  });

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
