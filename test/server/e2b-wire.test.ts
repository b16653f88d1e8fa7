// The E2B routes at the wire: credentials and tenants, malformed Connect calls, clients that leave
// mid-stream, size caps, and the envd access tokens themselves (test/server/e2b-harness.ts).
import { AuthenticationError, Sandbox } from 'e2b';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { callerFromToken, envdToken } from '../../src/server/e2b/token.js';
import { canRunNamespaces, NO_RESIDUE, settledResidue, SKIP_REASON } from '../helpers.js';
import { accessToken, KEY, KEY2, SECRET, startE2bHarness, type E2bHarness } from './e2b-harness.js';

let h: E2bHarness;
let base = '';

beforeAll(async () => {
  if (!canRunNamespaces) return;
  h = await startE2bHarness();
  base = h.base;
});

afterAll(async () => {
  if (canRunNamespaces) await h.close();
});

describe.skipIf(!canRunNamespaces)(
  `E2B routes at the wire${canRunNamespaces ? '' : ` [skipped: ${SKIP_REASON}]`}`,
  () => {
    let sbx: Sandbox;

    beforeAll(async () => {
      sbx = await Sandbox.create({ timeoutMs: 600_000 });
    }, 60_000);

    it('bad credentials: wrong API key, and an envd token for another sandbox', async () => {
      await expect(Sandbox.list({ apiKey: 'wrong' }).nextItems()).rejects.toBeInstanceOf(AuthenticationError);
      await expect(Sandbox.create({ apiKey: 'wrong' })).rejects.toBeInstanceOf(AuthenticationError);
      const other = await Sandbox.create({ timeoutMs: 60_000 });
      try {
        const token = accessToken(sbx);
        const r = await fetch(`${base}/e2b/envd/files?path=/etc/hostname`, {
          headers: { 'E2b-Sandbox-Id': other.sandboxId, 'X-Access-Token': token },
        });
        expect(r.status).toBe(401);
        const none = await fetch(`${base}/e2b/envd/files?path=/etc/hostname`, {
          headers: { 'E2b-Sandbox-Id': other.sandboxId },
        });
        expect(none.status).toBe(401);
        // The right token works (the check above is not failing for some other reason).
        const own = accessToken(other);
        const ok = await fetch(`${base}/e2b/envd/files?path=/etc/hostname`, {
          headers: { 'E2b-Sandbox-Id': other.sandboxId, 'X-Access-Token': own },
        });
        expect(ok.status).toBe(200);
        await ok.arrayBuffer();
      } finally {
        await other.kill();
      }
    }, 60_000);

    it("the control API acts as the key's tenant, the envd API as the token's", async () => {
      h.callers.length = 0;
      await Sandbox.list({ apiKey: KEY2 }).nextItems();
      expect(h.callers).toEqual(['list:t2']);
      h.callers.length = 0;
      // Another tenant's client gets a token of its own tenant: its envd calls run as t2 (whose
      // scoping, in the front server, then finds no such sandbox), never as the sandbox's creator.
      const viaOtherKey = await Sandbox.connect(sbx.sandboxId, { apiKey: KEY2 });
      expect(h.callers).toContain('get:t2');
      h.callers.length = 0;
      await viaOtherKey.files.exists('nothing-here');
      expect(h.callers).toEqual(['stat:t2']);
      h.callers.length = 0;
      await sbx.files.exists('nothing-here');
      expect(h.callers).toEqual(['stat:t1']);
    });

    it('the Connect endpoints refuse malformed calls with Connect errors', async () => {
      const token = accessToken(sbx);
      const h = {
        'E2b-Sandbox-Id': sbx.sandboxId,
        'X-Access-Token': token,
        'Connect-Protocol-Version': '1',
      };
      const post = (path: string, body: string | Uint8Array, type: string): Promise<Response> =>
        fetch(`${base}/e2b/envd/${path}`, {
          method: 'POST',
          headers: { ...h, 'content-type': type },
          body,
        });
      const bad = await post('filesystem.Filesystem/Stat', '{"path":', 'application/json');
      expect(bad.status).toBe(400);
      expect(await bad.json()).toMatchObject({ code: 'invalid_argument' });
      const wrongType = await post(
        'filesystem.Filesystem/Stat',
        JSON.stringify({ path: 7 }),
        'application/json',
      );
      expect(await wrongType.json()).toMatchObject({
        code: 'invalid_argument',
        message: expect.stringMatching(/^path/),
      });
      const proto = await post('filesystem.Filesystem/Stat', new Uint8Array([1, 2]), 'application/proto');
      expect(proto.status).toBe(501);
      // A stream call whose envelope lies about its length ends with an error frame, HTTP 200.
      const lie = new Uint8Array([0, 0, 0, 0, 99, 0x7b, 0x7d]);
      const s = await post('filesystem.Filesystem/WatchDir', lie, 'application/connect+json');
      expect(s.status).toBe(200);
      const buf = new Uint8Array(await s.arrayBuffer());
      expect(buf[0]).toBe(2);
      expect(JSON.parse(new TextDecoder().decode(buf.subarray(5)))).toMatchObject({
        error: { code: 'invalid_argument' },
      });
      const unknown = await post('filesystem.Filesystem/Nope', '{}', 'application/json');
      expect(unknown.status).toBe(501);
    });

    it('a client that disconnects from a command stream leaves it bounded by its timeout', async () => {
      const token = accessToken(sbx);
      const msg = Buffer.from(
        JSON.stringify({ process: { cmd: '/bin/sh', args: ['-c', 'echo up; sleep 300'] } }),
      );
      const env = Buffer.concat([Buffer.from([0, 0, 0, 0, 0]), msg]);
      env.writeUInt32BE(msg.length, 1);
      const ac = new AbortController();
      const r = await fetch(`${base}/e2b/envd/process.Process/Start`, {
        method: 'POST',
        headers: {
          'E2b-Sandbox-Id': sbx.sandboxId,
          'X-Access-Token': token,
          'content-type': 'application/connect+json',
          'Connect-Timeout-Ms': '3000',
        },
        body: env,
        signal: ac.signal,
      });
      const reader = r.body!.getReader();
      const first = await reader.read();
      const pid = (
        JSON.parse(Buffer.from(first.value!.subarray(5)).toString()) as {
          event: { start: { pid: number } };
        }
      ).event.start.pid;
      const followed = h.streamSignals.at(-1)!;
      expect(followed.aborted).toBe(false);
      ac.abort();
      // The server stops following the command for the departed client...
      await vi.waitFor(() => expect(followed.aborted).toBe(true), { timeout: 10_000, interval: 50 });
      // ...and, E2B semantics, the command outlives its client until its deadline kills it.
      await vi.waitFor(async () => expect((await sbx.commands.list()).map((p) => p.pid)).not.toContain(pid), {
        timeout: 30_000,
        interval: 250,
      });
    }, 40_000);

    it('a client that leaves a watchDir stream closes the watcher', async () => {
      const token = accessToken(sbx);
      const msg = Buffer.from(JSON.stringify({ path: '/home/user' }));
      const env = Buffer.concat([Buffer.from([0, 0, 0, 0, msg.length]), msg]);
      const ac = new AbortController();
      const r = await fetch(`${base}/e2b/envd/filesystem.Filesystem/WatchDir`, {
        method: 'POST',
        headers: {
          'E2b-Sandbox-Id': sbx.sandboxId,
          'X-Access-Token': token,
          'content-type': 'application/connect+json',
        },
        body: env,
        signal: ac.signal,
      });
      const first = await r.body!.getReader().read();
      expect(JSON.parse(Buffer.from(first.value!.subarray(5)).toString())).toEqual({ start: {} });
      const watching = h.streamSignals.at(-1)!;
      expect(watching.aborted).toBe(false);
      ac.abort();
      await vi.waitFor(() => expect(watching.aborted).toBe(true), { timeout: 10_000, interval: 50 });
    });

    it('uploads and bodies over the caps answer 413', async () => {
      const small = await Sandbox.connect(sbx.sandboxId, {
        apiUrl: `${base}/small`,
        sandboxUrl: `${base}/small/envd`,
      });
      await small.files.write('fits.txt', 'x'.repeat(1000));
      await expect(small.files.write('big.txt', 'x'.repeat(10_000))).rejects.toThrow(/413|over 4096 bytes/);
      const big = new ReadableStream<Uint8Array>({
        start(c) {
          for (let i = 0; i < 10; i++) c.enqueue(new Uint8Array(1000));
          c.close();
        },
      });
      await expect(small.files.write('big.bin', big)).rejects.toThrow(/413|over 4096 bytes/);
      // gzip is capped after decompression: 1 MB of zeros compresses to about 1 KB.
      await expect(
        small.files.write('bomb.bin', new Uint8Array(1_000_000).buffer, { gzip: true }),
      ).rejects.toThrow(/413|over 4096 bytes/);
      const r = await fetch(`${base}/e2b/v2/sandboxes`, {
        method: 'POST',
        headers: { 'X-API-Key': KEY, 'content-type': 'application/json' },
        body: JSON.stringify({ templateID: 'base', metadata: { pad: 'p'.repeat(300 * 1024) } }),
      });
      expect(r.status).toBe(413);
      expect(await r.json()).toMatchObject({ code: 413 });
    });

    it('every request went to the test server on 127.0.0.1, and nothing leaked', async () => {
      expect(await sbx.kill()).toBe(true);
      expect([...h.origins]).toEqual([base]);
      await h.airlock.close();
      expect(await settledResidue(5000)).toEqual(NO_RESIDUE);
    }, 60_000);
  },
);

describe('envd access tokens', () => {
  const A = { tenant: 'alice', keyId: '0123456789abcdef' };
  it('are bound to the sandbox, the tenant, the key and the secret', () => {
    const tok = envdToken(SECRET, A, 'sbx1');
    expect(callerFromToken(SECRET, tok, 'sbx1')).toEqual(A);
    expect(callerFromToken(SECRET, tok, 'sbx2')).toBeUndefined();
    expect(callerFromToken(new Uint8Array(32).fill(8), tok, 'sbx1')).toBeUndefined();
    const [t, k, m] = tok.split('.') as [string, string, string];
    // Another tenant's name, or another key id, with alice's MAC does not pass.
    expect(
      callerFromToken(SECRET, `${Buffer.from('bob').toString('base64url')}.${k}.${m}`, 'sbx1'),
    ).toBeUndefined();
    expect(callerFromToken(SECRET, `${t}.fedcba9876543210.${m}`, 'sbx1')).toBeUndefined();
    for (const bad of ['', '.', '..', 'x', `${tok}x`, `${tok}.`, tok.slice(0, -2), 'a'.repeat(5000)]) {
      expect(callerFromToken(SECRET, bad, 'sbx1')).toBeUndefined();
    }
  });
});
