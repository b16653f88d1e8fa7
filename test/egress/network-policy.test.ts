// Changing a live sandbox's network policy (sbx.setNetworkPolicy; the gateway's SandboxEgress.setPolicy):
// the swap is atomic, new connections and DNS answers follow it at once, a DNS answer given under the
// old policy is no way around it, open connections the new policy denies are closed (through Node's
// streams and through the fd relay), secrets bound to a now-denied host are no longer swapped in,
// every change is an audit record, and on the server another tenant cannot change it.
import { once } from 'node:events';
import { connect, type Socket } from 'node:net';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AirlockError, NetworkPolicySchema, type Sandbox } from '../../src/index.js';
import type { EgressPlumbing } from '../../src/core/backend.js';
import { silentLogger } from '../../src/core/backend.js';
import { EgressGateway, type SandboxEgress } from '../../src/egress/gateway.js';
import type { AuditEvent } from '../../src/mcp/audit.js';
import { Store } from '../../src/server/store.js';
import {
  canRunGvisor,
  canRunNamespaces,
  GVISOR_SKIP_REASON,
  NO_RESIDUE,
  settledResidue,
  SKIP_REASON,
  TEST_STATE_DIR,
} from '../helpers.js';
import { errorOf } from '../server/serve-api.js';
import { call, newKey, startServe, stopServe, stopSupervisor, type Served } from '../server/serve-helpers.js';
import { startEgressWorld, type EgressWorld } from './harness.js';
import {
  ALLOWED,
  assertPrivateNetns,
  DENIED,
  guardedDialer,
  listenFd,
  OTHER,
  SECRET_HOST,
  startTestServers,
  testResolver,
  type TestServers,
} from './net.js';

assertPrivateNetns();

// ---- the gateway alone (no sandbox): deterministic races ------------------------------------------

const policy = (allow: string[], deny: string[] = []) =>
  NetworkPolicySchema.parse({ allow, deny, transparent: false });
let nextPort = 24_100 + (process.pid % 500) * 4;

function attach(gw: EgressGateway, allow: string[]): { egress: SandboxEgress; port: number } {
  const port = nextPort++;
  const dnsPort = nextPort++;
  const plumbing: EgressPlumbing = {
    listen: (kind, _address, p) => listenFd(kind, p === 53 ? dnsPort : port),
    interceptTcp: () => {
      throw new Error('transparent mode is off in these tests');
    },
    bindReadOnlyFiles: () => {},
    originalDestination: () => undefined,
  };
  const egress = gw.attach({ sandboxId: `swap-${port}`, plumbing, policy: policy(allow), onEvent: () => {} });
  return { egress, port };
}

/** A CONNECT tunnel through the gateway's proxy port to ALLOWED's echo server (:5432). */
async function tunnel(port: number): Promise<Socket> {
  const s = connect({ host: '127.0.0.1', port });
  await once(s, 'connect');
  s.write(`CONNECT ${ALLOWED.name}:5432 HTTP/1.1\r\nHost: ${ALLOWED.name}:5432\r\n\r\n`);
  let head = '';
  while (!head.includes('\r\n\r\n')) head += String((await once(s, 'data'))[0]);
  expect(head).toMatch(/^HTTP\/1\.1 200/);
  return s;
}

/** Send `text` and read it back (raw bytes, not HTTP); 'closed' when the tunnel ends instead. */
async function echo(s: Socket, text: string): Promise<string> {
  if (s.destroyed) return 'closed';
  return new Promise((resolve) => {
    const done = (v: string) => {
      s.off('data', onData);
      s.off('close', onClose);
      resolve(v);
    };
    const onData = (d: Buffer) => done(d.subarray(1).toString());
    const onClose = () => done('closed');
    s.on('data', onData);
    s.once('close', onClose);
    s.on('error', () => {});
    s.write(`\0${text}`); // a first byte no sniffer takes for HTTP or TLS: a raw tunnel
  });
}

describe('the gateway swaps a policy atomically', () => {
  let servers: TestServers;
  beforeAll(async () => {
    servers = await startTestServers();
  });
  afterAll(async () => {
    await servers?.close();
  });

  it('a dial begun under the old policy and finished after the swap is refused, its socket closed', async () => {
    let release!: () => void;
    const gate = new Promise<void>((r) => (release = r));
    const dial = guardedDialer();
    const opened = new Map<string, Socket>();
    const gw = new EgressGateway({
      resolver: testResolver(),
      dialer: async (a, p) => {
        await gate;
        const s = await dial(a, p);
        opened.set(a, s);
        return s;
      },
      ca: () => {
        throw new Error('no interception');
      },
      fdRelay: false,
      logger: silentLogger,
    });
    const { egress } = attach(gw, [ALLOWED.name, OTHER.name]);
    try {
      const pending = egress.vet(ALLOWED.name, 80);
      const stillOk = egress.vet(OTHER.name, 80);
      egress.setPolicy(policy([OTHER.name]));
      release();
      const r = await pending;
      expect(r.ok).toBe(false);
      if (!r.ok) expect(r.verdict.reason).toMatch(ALLOWED.name);
      const ok = await stillOk; // the new policy allows this one: no collateral
      expect(ok.ok).toBe(true);
      if (ok.ok) ok.socket.destroy();
      expect(opened.size).toBe(2);
      expect(opened.get(ALLOWED.address)?.destroyed).toBe(true);
    } finally {
      await egress.close();
      await gw.close();
    }
  });

  it('concurrent decisions during swaps: each follows the policy in force when it ends, never a hole', async () => {
    const gw = new EgressGateway({
      resolver: testResolver(),
      dialer: guardedDialer(),
      ca: () => {
        throw new Error('no interception');
      },
      fdRelay: false,
      logger: silentLogger,
    });
    // DENIED is in neither policy's allow list (and in P1's deny list): it is never reachable.
    const P1 = policy([ALLOWED.name], [DENIED.name]);
    const P2 = policy([OTHER.name]);
    const { egress } = attach(gw, [ALLOWED.name]);
    egress.setPolicy(P1);
    try {
      const checks: Array<Promise<void>> = [];
      const violations: string[] = [];
      let allowed = 0;
      for (let i = 0; i < 150; i++) {
        const host = [ALLOWED, OTHER, DENIED][i % 3]!;
        checks.push(
          egress.vet(host.name, 80).then((r) => {
            if (!r.ok) return;
            allowed++;
            // Synchronously after vet: no swap can have come in between.
            const inForce = egress.policy;
            const ok = inForce.allow.includes(host.name) && !inForce.deny.includes(host.name);
            if (!ok || host === DENIED) violations.push(`${host.name} under ${inForce.allow.join(',')}`);
            r.socket.destroy();
          }),
        );
        if (i % 7 === 0) {
          await new Promise((r) => setImmediate(r));
          egress.setPolicy(egress.policy === P1 ? P2 : P1);
        }
      }
      await Promise.all(checks);
      expect(violations).toEqual([]);
      expect(allowed).toBeGreaterThan(0);
    } finally {
      await egress.close();
      await gw.close();
    }
  });

  for (const fdRelay of [true, false]) {
    it(`an open tunnel to a host the new policy denies is closed (${fdRelay ? 'fd relay' : 'Node streams'}); one it allows stays`, async () => {
      const gw = new EgressGateway({
        resolver: testResolver(),
        dialer: guardedDialer(),
        ca: () => {
          throw new Error('no interception');
        },
        fdRelay,
        logger: silentLogger,
      });
      const { egress, port } = attach(gw, [`${ALLOWED.name}:5432`]);
      try {
        const t = await tunnel(port);
        expect(await echo(t, 'one')).toBe('one');
        // Still allowed (another list, same verdict for this tunnel): it stays open.
        egress.setPolicy(policy([`${ALLOWED.name}:5432`, OTHER.name]));
        expect(await echo(t, 'two')).toBe('two');
        egress.setPolicy(policy([OTHER.name]));
        expect(await echo(t, 'three')).toBe('closed');
        // A new tunnel is refused outright.
        const s = connect({ host: '127.0.0.1', port });
        await once(s, 'connect');
        s.write(`CONNECT ${ALLOWED.name}:5432 HTTP/1.1\r\nHost: x\r\n\r\n`);
        expect(String((await once(s, 'data'))[0])).toMatch(/^HTTP\/1\.1 403/);
        s.destroy();
      } finally {
        await egress.close();
        await gw.close();
      }
    });
  }

  it('refuses a change of `transparent`, and any change once closed', async () => {
    const gw = new EgressGateway({
      resolver: testResolver(),
      dialer: guardedDialer(),
      ca: () => {
        throw new Error('no interception');
      },
      fdRelay: false,
      logger: silentLogger,
    });
    const { egress } = attach(gw, [ALLOWED.name]);
    const e = (() => {
      try {
        egress.setPolicy(NetworkPolicySchema.parse({ allow: [OTHER.name], transparent: true }));
      } catch (err) {
        return err;
      }
    })();
    expect(AirlockError.is(e, 'INVALID_ARGUMENT')).toBe(true);
    expect(egress.policy.allow).toEqual([ALLOWED.name]); // unchanged
    await egress.close();
    expect(() => egress.setPolicy(policy([]))).toThrow(/gone/);
    await gw.close();
  });
});

// ---- a real sandbox --------------------------------------------------------------------------------

/** In-sandbox client driven line by line on stdin: keeps ONE connection open across the swap. */
const KEEP_PY = String.raw`
import socket, sys
mode = sys.argv[1]
def out(x):
    sys.stdout.write(x + '\n'); sys.stdout.flush()
if mode == 'tunnel':
    s = socket.create_connection(('127.0.0.1', 3128), timeout=10)
    s.sendall(b'CONNECT allowed.test:5432 HTTP/1.1\r\nHost: allowed.test:5432\r\n\r\n')
    head = b''
    while b'\r\n\r\n' not in head:
        head += s.recv(1)
    out('ready ' + head.split(b'\r\n')[0].decode())
elif mode == 'direct':
    s = socket.create_connection(('allowed.test', 5432), timeout=10)
    out('ready ' + s.getpeername()[0])
else:
    s = socket.create_connection(('127.0.0.1', 3128), timeout=10)
    out('ready')
for line in sys.stdin:
    path = line.strip()
    try:
        if mode == 'http':
            s.sendall(('GET http://allowed.test/%s HTTP/1.1\r\nHost: allowed.test\r\n\r\n' % path).encode())
            data = s.recv(65536)
            out('status ' + (data.split(b' ')[1].decode() if data else 'closed'))
        else:
            s.sendall(b'\0' + path.encode())
            data = s.recv(65536)
            out('echo ' + (data[1:].decode() if data else 'closed'))
    except OSError as e:
        out('echo closed')
`;

/** A client in the sandbox; `send(line)` resolves to its next output line. */
async function keepOpen(s: Sandbox, mode: 'tunnel' | 'direct' | 'http') {
  const p = await s.spawn(['python3', '-c', KEEP_PY, mode]);
  const lines: string[] = [];
  const waiters: Array<(l: string) => void> = [];
  let buf = '';
  p.stdout.on('data', (d: Buffer) => {
    buf += d.toString();
    let i: number;
    while ((i = buf.indexOf('\n')) >= 0) {
      const l = buf.slice(0, i);
      buf = buf.slice(i + 1);
      const w = waiters.shift();
      if (w) w(l);
      else lines.push(l);
    }
  });
  const next = () =>
    new Promise<string>((r) => {
      const l = lines.shift();
      if (l !== undefined) r(l);
      else waiters.push(r);
    });
  return {
    ready: await next(),
    send: (line: string) => {
      p.stdin.write(`${line}\n`);
      return next();
    },
    close: async () => {
      p.stdin.end();
      await p.exited;
    },
  };
}

const curl = async (s: Sandbox, url: string, direct = false): Promise<string> =>
  (
    await s.exec(
      `curl -s -m 10 ${direct ? "--noproxy '*'" : ''} -o /dev/null -w '%{http_code}' ${url} || true`,
    )
  ).stdout.trim();

describe.skipIf(!canRunNamespaces)(`a live sandbox's network policy (${SKIP_REASON})`, () => {
  let world: EgressWorld;
  let sbx: Sandbox;
  const audit: AuditEvent[] = [];
  beforeAll(async () => {
    world = await startEgressWorld({ secretEnv: { SWAP_TOKEN_SRC: 'swap-secret-value-1234' } });
    sbx = await world.airlock.create({ network: { allow: [ALLOWED.name, `${ALLOWED.name}:5432`] } });
    sbx.onNetworkPolicy((e) => audit.push(e));
  }, 120_000);
  afterAll(async () => {
    await world?.close();
    expect(await settledResidue(5000)).toEqual(NO_RESIDUE);
  }, 120_000);

  it('allow → deny and deny → allow take effect at once, through the proxy and transparently', async () => {
    expect(await curl(sbx, `http://${ALLOWED.name}/a1`)).toBe('200');
    expect(await curl(sbx, `http://${OTHER.name}/o1`)).toBe('403');
    const now = await sbx.setNetworkPolicy({ allow: [OTHER.name] });
    expect(now).toEqual({ allow: [OTHER.name], deny: [], transparent: true, allowPrivate: [] });
    expect(sbx.spec.network).toEqual(now);
    expect(await curl(sbx, `http://${ALLOWED.name}/a2`)).toBe('403');
    expect(await curl(sbx, `http://${OTHER.name}/o2`)).toBe('200');
    expect(await curl(sbx, `http://${ALLOWED.name}/a3`, true)).toBe('000'); // NXDOMAIN now
    expect(await curl(sbx, `http://${OTHER.name}/o3`, true)).toBe('200');
    await sbx.setNetworkPolicy({ allow: [ALLOWED.name, `${ALLOWED.name}:5432`] });
    expect(await curl(sbx, `http://${ALLOWED.name}/a4`, true)).toBe('200');
    expect(await curl(sbx, `http://${OTHER.name}/o4`)).toBe('403');
    const urls = world.servers.seen.map((r) => `${r.host}${r.url}`);
    expect(urls).toEqual(
      expect.arrayContaining([`${ALLOWED.name}/a1`, `${OTHER.name}/o2`, `${ALLOWED.name}/a4`]),
    );
    for (const never of [`${OTHER.name}/o1`, `${ALLOWED.name}/a2`, `${ALLOWED.name}/a3`, `${OTHER.name}/o4`])
      expect(urls).not.toContain(never);
    // Each change is an audit record with the old and the new policy.
    expect(audit.length).toBe(2);
    expect(audit[0]).toMatchObject({ kind: 'network', sandboxId: sbx.id, decision: 'allow' });
    expect((audit[0] as { previous: { allow: string[] } }).previous.allow).toContain(ALLOWED.name);
    expect((audit[0] as { policy: { allow: string[] } }).policy.allow).toEqual([OTHER.name]);
  });

  it('connections kept open across the swap cannot reach the now-denied host', async () => {
    const t = await keepOpen(sbx, 'tunnel');
    const d = await keepOpen(sbx, 'direct');
    const h = await keepOpen(sbx, 'http');
    try {
      expect(t.ready).toMatch(/^ready HTTP\/1\.1 200/);
      expect(d.ready).toMatch(/^ready 198\.1[89]\./); // a synthetic address, through interception
      expect(await t.send('t1')).toBe('echo t1');
      expect(await d.send('d1')).toBe('echo d1');
      expect(await h.send('keep1')).toBe('status 200');
      await sbx.setNetworkPolicy({ allow: [OTHER.name] });
      expect(await t.send('t2')).toBe('echo closed');
      expect(await d.send('d2')).toBe('echo closed');
      expect(['status 403', 'status closed', 'echo closed']).toContain(await h.send('keep2'));
      expect(world.servers.seen.map((r) => r.url)).toContain('/keep1');
      expect(world.servers.seen.map((r) => r.url)).not.toContain('/keep2');
    } finally {
      await Promise.all([t.close(), d.close(), h.close()]);
      await sbx.setNetworkPolicy({ allow: [ALLOWED.name, `${ALLOWED.name}:5432`] });
    }
  });

  it('a DNS answer given under the old policy is not reused, and new answers follow the new one', async () => {
    const resolve = String.raw`
import socket, sys
try:
    print(socket.gethostbyname(sys.argv[1]))
except OSError:
    print('NXDOMAIN')
`;
    const addr = (await sbx.exec(['python3', '-c', resolve, ALLOWED.name])).stdout.trim();
    expect(addr).toMatch(/^198\.1[89]\./);
    await sbx.setNetworkPolicy({ allow: [OTHER.name] });
    try {
      expect((await sbx.exec(['python3', '-c', resolve, ALLOWED.name])).stdout.trim()).toBe('NXDOMAIN');
      expect((await sbx.exec(['python3', '-c', resolve, OTHER.name])).stdout.trim()).toMatch(/^198\.1[89]\./);
      // The address handed out before the swap, as a cache would keep it: refused, never reached.
      const code = await curl(
        sbx,
        `--resolve ${ALLOWED.name}:80:${addr} http://${ALLOWED.name}/cached`,
        true,
      );
      expect(code).not.toBe('200');
      expect(world.servers.seen.map((r) => r.url)).not.toContain('/cached');
    } finally {
      await sbx.setNetworkPolicy({ allow: [ALLOWED.name, `${ALLOWED.name}:5432`] });
    }
    // deny → allow: the same name resolves again (to the same synthetic address).
    expect((await sbx.exec(['python3', '-c', resolve, ALLOWED.name])).stdout.trim()).toBe(addr);
  });

  it('secrets bound to a host the new policy denies are no longer swapped in', async () => {
    await world.withSandbox(
      {
        network: { allow: [ALLOWED.name, SECRET_HOST.name] },
        secrets: [{ name: 'SWAP_TOKEN', value: { fromEnv: 'SWAP_TOKEN_SRC' }, hosts: [SECRET_HOST.name] }],
      },
      async (s) => {
        const send = (path: string) =>
          s.exec(
            `curl -s -m 10 -o /dev/null -w '%{http_code}/%{http_connect}' -H "Authorization: Bearer $SWAP_TOKEN" https://${SECRET_HOST.name}/${path} || true`,
          );
        expect((await send('before')).stdout).toBe('200/200');
        const auth = (path: string) =>
          world.servers.seen.filter((r) => r.url === `/${path}`).map((r) => r.headers.authorization);
        expect(auth('before')).toEqual(['Bearer swap-secret-value-1234']);
        await s.setNetworkPolicy({ allow: [ALLOWED.name] });
        expect((await send('after')).stdout).toBe('000/403'); // the CONNECT is refused
        expect(auth('after')).toEqual([]);
        // Allowed again: swapped in again (the lease was never revoked, only out of reach).
        await s.setNetworkPolicy({ allow: [ALLOWED.name, SECRET_HOST.name] });
        expect((await send('again')).stdout).toBe('200/200');
        expect(auth('again')).toEqual(['Bearer swap-secret-value-1234']);
      },
    );
  });

  it('refuses what it cannot honour with typed errors, changing nothing', async () => {
    const before = sbx.spec.network;
    const bad = await sbx.setNetworkPolicy({ allow: ['*'] }).catch((e: unknown) => e);
    expect(AirlockError.is(bad, 'INVALID_ARGUMENT')).toBe(true);
    const t = await sbx.setNetworkPolicy({ allow: [], transparent: false }).catch((e: unknown) => e);
    expect(AirlockError.is(t, 'INVALID_ARGUMENT')).toBe(true);
    expect((t as AirlockError).field).toBe('network.transparent');
    expect(sbx.spec.network).toBe(before);
    await world.withSandbox({}, async (none) => {
      const e = await none.setNetworkPolicy({ allow: [ALLOWED.name] }).catch((x: unknown) => x);
      expect(AirlockError.is(e, 'INVALID_ARGUMENT')).toBe(true);
      expect((e as AirlockError).field).toBe('network');
      expect((e as Error).message).toMatch(/created with no network.*create it with a network policy/);
    });
  });
});

describe.skipIf(!canRunGvisor)(`a live gVisor sandbox's network policy (${GVISOR_SKIP_REASON})`, () => {
  it('the same gateway swap holds on the gVisor tier: allow → deny, an open tunnel closed, deny → allow', async () => {
    const world = await startEgressWorld();
    try {
      await world.withSandbox(
        { backend: 'gvisor', network: { allow: [ALLOWED.name, `${ALLOWED.name}:5432`] } },
        async (g) => {
          expect(await curl(g, `http://${ALLOWED.name}/g1`)).toBe('200');
          const t = await keepOpen(g, 'tunnel');
          try {
            expect(await t.send('g-t1')).toBe('echo g-t1');
            await g.setNetworkPolicy({ allow: [OTHER.name] });
            expect(await t.send('g-t2')).toBe('echo closed');
          } finally {
            await t.close();
          }
          expect(await curl(g, `http://${ALLOWED.name}/g2`)).toBe('403');
          expect(await curl(g, `http://${OTHER.name}/g3`)).toBe('200');
          await g.setNetworkPolicy({ allow: [ALLOWED.name] });
          expect(await curl(g, `http://${ALLOWED.name}/g4`)).toBe('200');
          expect(world.servers.seen.map((r) => r.url)).not.toContain('/g2');
        },
      );
    } finally {
      await world.close();
    }
  }, 120_000);
});

// ---- the server: PUT /v1/sandboxes/:id/network -----------------------------------------------------

describe.skipIf(!canRunNamespaces)(`PUT /v1/sandboxes/:id/network (${SKIP_REASON})`, () => {
  let s: Served;
  let keyA: string;
  let keyB: string;
  beforeAll(async () => {
    await stopSupervisor();
    s = await startServe({});
    keyA = newKey('net-a').key;
    keyB = newKey('net-b').key;
  }, 120_000);
  afterAll(async () => {
    if (s) expect(await stopServe(s)).toBe(0);
    await stopSupervisor();
  }, 120_000);

  it("changes the owner's sandbox; another tenant's id is 404; bad bodies are 400; each change is an event", async () => {
    const made = await call(s.url, keyA, 'POST', '/v1/sandboxes', { network: { allow: [ALLOWED.name] } });
    expect(made.status).toBe(201);
    const { id } = (await made.json()) as { id: string };
    const other = await call(s.url, keyB, 'PUT', `/v1/sandboxes/${id}/network`, { allow: [OTHER.name] });
    expect(other.status).toBe(404);
    expect((await errorOf(other)).code).toBe('SANDBOX_NOT_FOUND');
    const bad = await call(s.url, keyA, 'PUT', `/v1/sandboxes/${id}/network`, { allow: ['*'] });
    expect(bad.status).toBe(400);
    const extra = await call(s.url, keyA, 'PUT', `/v1/sandboxes/${id}/network`, { allow: [], nope: 1 });
    expect(extra.status).toBe(400);
    const ok = await call(s.url, keyA, 'PUT', `/v1/sandboxes/${id}/network`, { allow: [OTHER.name] });
    expect(ok.status).toBe(200);
    expect(await ok.json()).toEqual({ allow: [OTHER.name], deny: [], transparent: true, allowPrivate: [] });
    const store = new Store(join(TEST_STATE_DIR, 'server.db'));
    try {
      expect(store.events({ sandboxId: id }).filter((e) => e.type === 'network.changed').length).toBe(1);
    } finally {
      store.close();
    }
    const none = await call(s.url, keyA, 'POST', '/v1/sandboxes', {});
    const noneId = ((await none.json()) as { id: string }).id;
    const refused = await call(s.url, keyA, 'PUT', `/v1/sandboxes/${noneId}/network`, { allow: [] });
    expect(refused.status).toBe(400);
    expect((await errorOf(refused)).message).toMatch(/created with no network/);
    for (const x of [id, noneId]) await call(s.url, keyA, 'DELETE', `/v1/sandboxes/${x}`);
  });
});
