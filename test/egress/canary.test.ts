// Canary credentials (spec `canaries`): fake tokens planted in the sandbox; any appearance in egress is
// blocked and raised as an alert event — whatever the encoding, in the head or the body, through the
// proxy or the transparent path. Blocks before dialling are proven by the guarded dialer's log.
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

const CANARY_FILE = '/home/user/.config/gh/hosts.yml';
const spec = {
  network: { allow: [ALLOWED.name] },
  canaries: [
    { name: 'AWS_SECRET_ACCESS_KEY', kind: 'env' as const },
    { name: 'GITHUB_TOKEN', kind: 'file' as const, path: CANARY_FILE },
  ],
};

let world: EgressWorld;
let sbx: Sandbox;
let aws: string;
let gh: string;
const events: EgressEvent[] = [];

beforeAll(async () => {
  if (!canRunNamespaces) return;
  world = await startEgressWorld();
  sbx = await world.airlock.create(spec);
  sbx.onEgress((e) => events.push(e));
  const r = await sbx.exec(`printf '%s\\n' "$AWS_SECRET_ACCESS_KEY"; cat ${CANARY_FILE}`);
  [aws, gh] = r.stdout.trim().split('\n') as [string, string];
});

afterAll(async () => {
  await sbx?.kill();
  await world?.close();
});

async function observe(f: () => Promise<void>): Promise<{ dials: string[]; events: EgressEvent[] }> {
  const d = world.dialer.dials.length;
  const e = events.length;
  await f();
  await until(() => events.length > e, 2_000);
  await new Promise((r) => setTimeout(r, 20));
  return { dials: world.dialer.dials.slice(d), events: events.slice(e) };
}

const get = (path: string, headers = ''): string =>
  `GET http://${ALLOWED.name}${path} HTTP/1.1\r\nHost: ${ALLOWED.name}\r\n${headers}Connection: close\r\n\r\n`;

describe.skipIf(!canRunNamespaces)('canary credentials', () => {
  it('are planted as an env variable and a file, shaped like real credentials', () => {
    expect(aws).toMatch(/^[A-Za-z0-9/+]{40}$/);
    expect(gh).toMatch(/^ghp_[0-9A-Za-z]{36}$/);
  });

  it('a request without a canary goes through', async () => {
    const c = await rawRequest(sbx, get('/clean'));
    expect(statusOf(c.steps[0]!)).toBe(200);
  });

  const inHead: Array<[string, () => string]> = [
    ['raw in a header', () => get('/h', `X-Api-Key: ${aws}\r\n`)],
    ['upper-cased in a header', () => get('/h', `X-Api-Key: ${gh.toUpperCase()}\r\n`)],
    ['hex in a header', () => get('/h', `X-Api-Key: ${Buffer.from(gh).toString('hex')}\r\n`)],
    [
      'inside Authorization: Basic',
      () => get('/h', `Authorization: Basic ${Buffer.from(`user:${gh}`).toString('base64')}\r\n`),
    ],
    ['base64url in the path', () => get(`/x/${Buffer.from(`..${aws}`).toString('base64url')}`)],
    ['double percent-encoded in the query', () => get(`/?k=${encodeURIComponent(encodeURIComponent(aws))}`)],
  ];

  it.each(inHead)('%s → 403, alert "canary", no dial', async (_what, request) => {
    const before = world.servers.seen.length;
    let reply = '';
    const seen = await observe(async () => {
      reply = (await rawRequest(sbx, request())).steps[0]!;
    });
    expect(statusOf(reply), reply).toBe(403);
    expect(reply).toMatch(
      /blocked by Airlock egress policy: the request carries a planted canary credential \((AWS_SECRET_ACCESS_KEY|GITHUB_TOKEN)\)/,
    );
    expect(seen.dials).toEqual([]);
    expect(seen.events).toHaveLength(1);
    expect(seen.events[0]).toMatchObject({
      sandboxId: sbx.id,
      protocol: 'http',
      host: ALLOWED.name,
      decision: 'deny',
      code: 'canary',
      alert: 'canary',
    });
    expect(world.servers.seen.length).toBe(before);
  });

  it('in a request body (plain and base64, one chunk or split across chunks) → 403, nothing reaches the server', async () => {
    const bodies = [
      `token=${aws}`,
      `{"k":"${Buffer.from(gh).toString('base64')}"}`,
      `${'x'.repeat(100_000)}${aws}${'y'.repeat(1000)}`, // far into a streamed body
    ];
    for (const body of bodies) {
      const before = world.servers.seen.length;
      let reply = '';
      const seen = await observe(async () => {
        const half = Math.floor(body.length / 2) + 3; // the canary straddles two writes
        const [c] = await rawConversations(sbx, [
          [
            {
              send: `POST http://${ALLOWED.name}/exfil HTTP/1.1\r\nHost: ${ALLOWED.name}\r\nContent-Length: ${body.length}\r\nConnection: close\r\n\r\n${body.slice(0, half)}`,
              timeoutS: 0.2,
            },
            { send: body.slice(half) },
          ],
        ]);
        reply = c!.steps.join('');
      });
      expect(statusOf(reply), reply).toBe(403);
      expect(reply).toMatch(/the request body carries a planted canary credential/);
      expect(seen.events[0]).toMatchObject({ decision: 'deny', code: 'canary', alert: 'canary' });
      expect(world.servers.seen.length).toBe(before);
    }
  });

  // Regression (fixed): when a streamed body is blocked, the response's
  // 'close' still runs finish(), which emits a second event for the same request with decision
  // 'allow'.
  it('a request blocked for its body yields one deny event and no allow event', async () => {
    const body = `token=${aws}`;
    const seen = await observe(async () => {
      await rawRequest(
        sbx,
        `POST http://${ALLOWED.name}/exfil HTTP/1.1\r\nHost: ${ALLOWED.name}\r\nContent-Length: ${body.length}\r\nConnection: close\r\n\r\n${body}`,
      );
    });
    expect(seen.events.map((e) => `${e.decision} ${e.code ?? ''}`)).toEqual(['deny canary']);
  });

  // Regression (fixed): in a sandbox with secrets or canaries, plain
  // HTTP on the transparent path is handed to a per-connection http.Server while the socket is still
  // paused by firstBytes() (never resumed), so every such request hangs with no answer and no event.
  //
  it('through the transparent path (curl --noproxy) → 403, alert "canary"', async () => {
    const before = world.servers.seen.length;
    const r = await sbx.exec(
      `curl -sS -m 3 --noproxy '*' -w '\\n%{http_code}' -H "X-K: $AWS_SECRET_ACCESS_KEY" http://${ALLOWED.name}/t`,
    );
    expect(r.stdout).toMatch(/planted canary credential \(AWS_SECRET_ACCESS_KEY\)[\s\S]*403$/);
    expect(r.egress?.find((e) => e.alert === 'canary')).toMatchObject({ protocol: 'transparent-http' });
    expect(world.servers.seen.length).toBe(before);
  });

  it('sent to a host that is denied anyway, it is still raised as a canary alert', async () => {
    const seen = await observe(async () => {
      const c = await rawRequest(
        sbx,
        `GET http://${DENIED.name}/ HTTP/1.1\r\nHost: ${DENIED.name}\r\nX-K: ${aws}\r\nConnection: close\r\n\r\n`,
      );
      expect(statusOf(c.steps[0]!)).toBe(403);
    });
    expect(seen.dials).toEqual([]);
    expect(seen.events.map((e) => e.alert)).toEqual(['canary']);
  });

  // Plain-text payloads of CONNECT / SOCKS5 tunnels are scanned too (inside TLS they cannot be seen
  // without interception: that part is by design).
  it('a canary in plain HTTP inside a CONNECT tunnel to port 80 is blocked', async () => {
    const before = world.servers.seen.length;
    const [c] = await rawConversations(sbx, [
      [
        {
          send: `CONNECT ${ALLOWED.name}:80 HTTP/1.1\r\nHost: ${ALLOWED.name}:80\r\n\r\n`,
          until: '\r\n\r\n',
        },
        { send: get('/tunnel', `X-K: ${aws}\r\n`) },
      ],
    ]);
    expect(c!.steps[1]).not.toMatch(/^HTTP\/1\.1 200/);
    expect(world.servers.seen.slice(before).some((q) => q.url === '/tunnel')).toBe(false);
  });
});
