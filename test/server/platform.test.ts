// The whole platform as a user meets it: one real `airlock serve` (front server + supervisor), driven
// by the three clients the issue names: the official `e2b` SDK (E2B_API_URL=<url>/e2b), the remote
// TypeScript SDK (RemoteAirlock) and a preview URL (HTTP into a server inside the sandbox). Two
// tenants, so every client is also checked against the other tenant's sandbox.
// NETWORK SAFETY: everything goes to 127.0.0.1; the SDK's own domain is an unresolvable .invalid name.
import { request } from 'node:http';
import { Sandbox as E2bSandbox } from 'e2b';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RemoteAirlock } from '../../src/server/remote/airlock.js';
import { canRunNamespaces, NO_RESIDUE, settledResidue, SKIP_REASON } from '../helpers.js';
import { startHttpServer } from './preview-support.js';
import { newKey, startServe, stopServe, stopSupervisor, type Served } from './serve-helpers.js';

/** GET `path` from the server with a Host header; [status, body]. */
function get(url: string, host: string, headers: Record<string, string> = {}): Promise<[number, string]> {
  const u = new URL(url);
  return new Promise((resolve, reject) => {
    const rq = request(
      { host: u.hostname, port: u.port, path: '/hello', headers: { host, ...headers }, setHost: false },
      (r) => {
        let b = '';
        r.setEncoding('utf8').on('data', (d: string) => (b += d));
        r.on('end', () => resolve([r.statusCode ?? 0, b]));
      },
    );
    rq.on('error', reject);
    rq.end();
  });
}

describe.skipIf(!canRunNamespaces)(`one airlock serve, three clients (${SKIP_REASON})`, () => {
  let served: Served;
  let a: { id: string; key: string };
  let b: { id: string; key: string };

  beforeAll(async () => {
    served = await startServe();
    a = newKey('platform-a');
    b = newKey('platform-b');
    process.env.E2B_API_URL = `${served.url}/e2b`;
    process.env.E2B_SANDBOX_URL = `${served.url}/e2b/envd`;
    process.env.E2B_DOMAIN = 'airlock-platform.invalid';
  }, 90_000);

  afterAll(async () => {
    for (const k of ['E2B_API_URL', 'E2B_SANDBOX_URL', 'E2B_DOMAIN']) delete process.env[k];
    if (served) await stopServe(served);
    await stopSupervisor();
    expect(await settledResidue()).toEqual(NO_RESIDUE);
  }, 90_000);

  it('the e2b SDK: create, run, files, getHost, list; the other tenant cannot connect', async () => {
    const sbx = await E2bSandbox.create({ apiKey: a.key, timeoutMs: 60_000, metadata: { app: 'platform' } });
    try {
      const r = await sbx.commands.run('echo hello from e2b; echo err >&2; exit 3').catch((e: unknown) => e);
      expect(r).toMatchObject({ exitCode: 3, stdout: 'hello from e2b\n', stderr: 'err\n' });
      await sbx.files.write('/workspace/x.bin', new Uint8Array([0, 1, 2, 255]).buffer);
      expect([...(await sbx.files.read('/workspace/x.bin', { format: 'bytes' }))]).toEqual([0, 1, 2, 255]);
      // getHost: the preview host of this server (the front server's port, on *.localhost).
      expect(sbx.getHost(8000)).toBe(`8000-${sbx.sandboxId}.localhost:${new URL(served.url).port}`);
      const listed = await E2bSandbox.list({ apiKey: a.key, query: { metadata: { app: 'platform' } } })
        .nextItems()
        .then((items) => items.map((i) => i.sandboxId));
      expect(listed).toContain(sbx.sandboxId);
      const other = await E2bSandbox.list({ apiKey: b.key }).nextItems();
      expect(other.map((i) => i.sandboxId)).not.toContain(sbx.sandboxId);
      await expect(E2bSandbox.connect(sbx.sandboxId, { apiKey: b.key })).rejects.toThrow(/not found/i);
    } finally {
      await sbx.kill();
    }
  }, 120_000);

  it('the remote TypeScript SDK: the library surface against the server, tenant-scoped', async () => {
    const airlock = new RemoteAirlock({ apiUrl: served.url, apiKey: a.key });
    const sbx = await airlock.create({ metadata: { via: 'remote-sdk' } });
    try {
      const r = await sbx.exec(['/bin/sh', '-c', 'printf "%s" "$0"', 'arg']);
      expect(r).toMatchObject({ exitCode: 0, stdout: 'arg' });
      await sbx.files.write('/workspace/t.txt', 'text\n');
      expect(await sbx.files.read('/workspace/t.txt')).toBe('text\n');
      const theirs = new RemoteAirlock({ apiUrl: served.url, apiKey: b.key });
      await expect(theirs.connect(sbx.id)).rejects.toMatchObject({ code: 'SANDBOX_NOT_FOUND' });
      const wrong = new RemoteAirlock({ apiUrl: served.url, apiKey: 'not-a-key' });
      await expect(wrong.query()).rejects.toMatchObject({ code: 'UNAUTHORIZED' });
    } finally {
      await sbx.kill();
    }
  }, 120_000);

  it("another tenant's snapshot cannot be a starting point, by snapshot or by template digest", async () => {
    const mine = new RemoteAirlock({ apiUrl: served.url, apiKey: a.key });
    const sbx = await mine.create({});
    try {
      await sbx.files.write('/workspace/secret.txt', 'tenant a only\n');
      const snap = await fetch(`${served.url}/v1/sandboxes/${sbx.id}/snapshot`, {
        method: 'POST',
        headers: { authorization: `Bearer ${a.key}` },
      });
      expect(snap.status).toBe(201);
      const { id } = (await snap.json()) as { id: string };
      for (const body of [{ snapshot: id }, { template: id }]) {
        const r = await fetch(`${served.url}/v1/sandboxes`, {
          method: 'POST',
          headers: { authorization: `Bearer ${b.key}`, 'content-type': 'application/json' },
          body: JSON.stringify(body),
        });
        expect(r.status, JSON.stringify(body)).toBe(404);
      }
      // Its owner can start from it either way.
      const fork = await mine.create({ template: id });
      expect(await fork.files.read('/workspace/secret.txt')).toBe('tenant a only\n');
      await fork.kill();
    } finally {
      await sbx.kill();
    }
  }, 120_000);

  it('a preview URL reaches a server inside the sandbox with its traffic token, and only with it', async () => {
    const res = await fetch(`${served.url}/v1/sandboxes`, {
      method: 'POST',
      headers: { authorization: `Bearer ${a.key}`, 'content-type': 'application/json' },
      body: JSON.stringify({ ttlMs: 60_000 }),
    });
    expect(res.status).toBe(201);
    const view = (await res.json()) as { id: string; trafficToken?: string };
    expect(view.trafficToken).toMatch(/^[A-Za-z0-9_-]{43}$/);
    const airlock = new RemoteAirlock({ apiUrl: served.url, apiKey: a.key });
    const sbx = await airlock.connect(view.id);
    try {
      await startHttpServer(sbx as unknown as Parameters<typeof startHttpServer>[0], 8000);
      const host = `8000-${view.id}.localhost:${new URL(served.url).port}`;
      expect(await get(served.url, host, { 'x-airlock-traffic-token': view.trafficToken! })).toEqual([
        200,
        'hello from the sandbox',
      ]);
      expect((await get(served.url, host))[0]).toBe(401);
      expect((await get(served.url, host, { 'x-airlock-traffic-token': 'x'.repeat(43) }))[0]).toBe(403);
    } finally {
      await sbx.kill();
    }
  }, 120_000);
});
