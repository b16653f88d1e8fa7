// Restarts that lose nothing, and a supervisor death that fails closed, with real processes: the
// front server killed by SIGTERM and by kill -9 at random points during creates and execs, then
// restarted; the supervisor killed by kill -9. Then quotas: a full quota queues, then answers 429
// with Retry-After; 100 rapid creates are bounded by the queue.
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { supervisorInfo, supervisorPaths } from '../../src/server/supervisor-client.js';
import {
  canRunNamespaces,
  NO_RESIDUE,
  residue,
  settledResidue,
  SKIP_REASON,
  TEST_STATE_DIR,
} from '../helpers.js';
import { create, errorOf, exec, get, kill, readFile, writeFile, type View } from './serve-api.js';
import {
  call,
  newKey,
  startServe,
  stopServe,
  stopSupervisor,
  waitFor,
  type Served,
} from './serve-helpers.js';

const socket = supervisorPaths(TEST_STATE_DIR).socket;
let s: Served | undefined;

describe.skipIf(!canRunNamespaces)(`airlock serve: restarts and supervisor death (${SKIP_REASON})`, () => {
  let key: string;
  beforeAll(async () => {
    await stopSupervisor();
    key = newKey('restart-tenant').key;
  }, 60_000);
  afterEach(async () => {
    if (s) await stopServe(s, 'SIGKILL');
    s = undefined;
    await stopSupervisor();
    expect(await settledResidue(5000)).toEqual(NO_RESIDUE);
  }, 120_000);

  it('front server killed (SIGTERM and kill -9) at random points during creates and execs loses no sandbox', async () => {
    s = await startServe();
    const boot = (await supervisorInfo(socket))!.bootId;
    const kept = new Map<string, View>(); // created (201 seen) and not killed by us
    const clientKilled = new Set<string>();
    for (let round = 0; round < 4; round++) {
      const url = s.url;
      // A burst of work: creates (each writes a file), execs on what exists, and a client kill.
      const work: Array<Promise<unknown>> = [];
      // Failures are expected (the server dies under them): settle each at once, never unhandled.
      const track = (p: Promise<unknown>): void => void work.push(p.catch((e: unknown) => e));
      for (let i = 0; i < 3; i++) {
        track(
          create(url, key, { ttlMs: 600_000, metadata: { round: String(round) } }).then(async (v) => {
            kept.set(v.id, v);
            await writeFile(url, key, v.id, '/tmp/mark', v.id);
          }),
        );
      }
      for (const id of kept.keys()) track(exec(url, key, id, ['sh', '-c', 'echo $$; sleep 0.2']));
      const victim = [...kept.keys()][0];
      if (round === 2 && victim) {
        kept.delete(victim);
        clientKilled.add(victim);
        await kill(url, key, victim);
      }
      // Kill the front at a random point of that burst; alternate SIGTERM and SIGKILL.
      await new Promise((r) => setTimeout(r, Math.floor(Math.random() * 400)));
      await stopServe(s, round % 2 ? 'SIGKILL' : 'SIGTERM');
      await Promise.allSettled(work); // the in-flight requests fail or finish; either is fine
      s = await startServe();
      // Same supervisor: the front server's death touched no sandbox.
      expect((await supervisorInfo(socket))!.bootId).toBe(boot);
      for (const [id, before] of kept) {
        const v = await get(s.url, key, id);
        expect(v.state, id).toBe('running');
        expect(v.expiresAt).toBe(before.expiresAt); // the TTL counts from the stored deadline
        expect((await exec(s.url, key, id, 'echo alive')).stdout).toBe('alive\n');
        // The mark was written unless the front died between create and write.
        const mark = await readFile(s.url, key, id, '/tmp/mark').catch(() => undefined);
        if (mark !== undefined) expect(mark).toBe(id);
      }
      for (const id of clientKilled) expect((await get(s.url, key, id)).state).toBe('killed');
    }
    // The server's list is exactly what the client kept: any sandbox created by a front server that
    // died before recording it was killed at the next start (no unreachable sandbox runs on).
    const listed = (await (await call(s.url, key, 'GET', '/v1/sandboxes')).json()) as View[];
    expect(listed.map((v) => v.id).sort()).toEqual([...kept.keys()].sort());
    const sup = await fetchAllFromSupervisor();
    expect(sup.sort()).toEqual([...kept.keys()].sort());
    for (const id of kept.keys()) await kill(s.url, key, id);
  }, 300_000);

  it('a TTL keeps counting from the stored deadline across a kill -9 of the front server', async () => {
    s = await startServe();
    const v = await create(s.url, key, { ttlMs: 3000 });
    await stopServe(s, 'SIGKILL');
    s = await startServe();
    expect((await get(s.url, key, v.id)).expiresAt).toBe(v.expiresAt);
    const ended = await waitFor(async () => {
      const now = await get(s!.url, key, v.id);
      return now.state === 'running' ? undefined : now;
    }, 'the sandbox to expire');
    expect(ended.state).toBe('expired');
    expect(Date.now()).toBeGreaterThanOrEqual(Date.parse(v.expiresAt!));
    expect(await fetchAllFromSupervisor()).toEqual([]);
  }, 120_000);

  it('supervisor kill -9: its sandboxes are gone from the host and reported lost with the reason', async () => {
    s = await startServe();
    const before = (await supervisorInfo(socket))!;
    const a = await create(s.url, key);
    const b = await create(s.url, key);
    // A background process in each: something that must die with the supervisor.
    for (const id of [a.id, b.id]) {
      const r = await call(s.url, key, 'POST', `/v1/sandboxes/${id}/processes`, { cmd: ['sleep', '1000'] });
      expect(r.status).toBe(201);
    }
    expect(residue().processes.length).toBeGreaterThanOrEqual(2);
    process.kill(before.pid, 'SIGKILL');
    // The front server notices, starts a new supervisor (which reaps), and marks the old boot's lost.
    const lost = await waitFor(async () => {
      const v = await get(s!.url, key, a.id).catch(() => undefined);
      return v?.state === 'lost' ? v : undefined;
    }, 'the sandbox to be reported lost');
    expect(lost.reason).toMatch(/supervisor died or restarted.*killed and reaped/);
    expect((await get(s.url, key, b.id)).state).toBe('lost');
    const after = await waitFor(() => supervisorInfo(socket), 'a new supervisor');
    expect(after.bootId).not.toBe(before.bootId);
    // Nothing of them is left on the host: processes, mounts, cgroups, dirs, leases.
    expect(await settledResidue(10_000)).toEqual(NO_RESIDUE);
    // A lost sandbox answers 410 with the reason, and is not listed; new creates work.
    const r = await call(s.url, key, 'POST', `/v1/sandboxes/${a.id}/exec`, { cmd: 'true' });
    const err = await errorOf(r);
    expect([err.status, err.code]).toEqual([410, 'SANDBOX_GONE']);
    expect(err.message).toMatch(/lost: its supervisor died/);
    expect(await (await call(s.url, key, 'GET', '/v1/sandboxes')).json()).toEqual([]);
    const c = await create(s.url, key);
    expect((await exec(s.url, key, c.id, 'echo ok')).stdout).toBe('ok\n');
    await kill(s.url, key, c.id);
  }, 120_000);
});

describe.skipIf(!canRunNamespaces)(`airlock serve: quotas (${SKIP_REASON})`, () => {
  let key: string;
  beforeAll(async () => {
    await stopSupervisor();
    key = newKey('quota-tenant').key;
    s = await startServe({ tenants: { 'quota-tenant': { maxSandboxes: 1 } }, maxQueue: 4 });
  }, 60_000);
  afterAll(async () => {
    if (s) await stopServe(s);
    s = undefined;
    await stopSupervisor();
    expect(await settledResidue(5000)).toEqual(NO_RESIDUE);
  }, 120_000);

  it('a full quota queues the create until room frees, else 429 with Retry-After', async () => {
    const first = await create(s!.url, key);
    const refused = await call(s!.url, key, 'POST', '/v1/sandboxes', { queueTimeoutMs: 200 });
    const err = await errorOf(refused);
    expect([err.status, err.code]).toEqual([429, 'QUOTA_EXCEEDED']);
    expect(Number(refused.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
    expect(err.message).toMatch(/1 of 1 live sandboxes/);
    // The E2B API refuses the same way, Retry-After included (after its default queue wait).
    const e2bRefused = await fetch(`${s!.url}/e2b/sandboxes`, {
      method: 'POST',
      headers: { 'x-api-key': key, 'content-type': 'application/json' },
      body: JSON.stringify({ templateID: 'base' }),
    });
    expect(e2bRefused.status).toBe(429);
    expect(Number(e2bRefused.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
    // Queued: answered once the first is killed, well before its own deadline.
    const queued = create(s!.url, key, { queueTimeoutMs: 30_000 });
    await waitFor(async () => {
      const m = await (await call(s!.url, undefined, 'GET', '/metrics')).text();
      return /^airlock_queued_creates 1$/m.test(m) || undefined;
    }, 'the create to be queued');
    await kill(s!.url, key, first.id);
    const second = await queued;
    expect(second.state).toBe('running');
    await kill(s!.url, key, second.id);
  }, 60_000);

  it('100 rapid creates: at most the quota succeeds, the queue stays bounded, every request is answered', async () => {
    const results = await Promise.all(
      Array.from({ length: 100 }, () =>
        call(s!.url, key, 'POST', '/v1/sandboxes', { queueTimeoutMs: 10_000 }),
      ),
    );
    const ok = results.filter((r) => r.status === 201);
    const refused = results.filter((r) => r.status === 429);
    expect(ok.length).toBe(1);
    expect(refused.length).toBe(99);
    const messages = await Promise.all(refused.map(async (r) => (await errorOf(r)).message));
    // All but the ≤4 that could queue were refused at once for the full queue.
    expect(messages.filter((m) => /queue is full/.test(m)).length).toBeGreaterThanOrEqual(95);
    for (const r of refused) expect(Number(r.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
    const [made] = (await Promise.all(ok.map((r) => r.json()))) as View[];
    await kill(s!.url, key, made!.id);
  }, 120_000);
});

/** Sandbox ids the supervisor itself holds (its socket needs no key). */
async function fetchAllFromSupervisor(): Promise<string[]> {
  const { RemoteSandboxApi } = await import('../../src/server/client.js');
  const api = new RemoteSandboxApi({ socketPath: socket });
  try {
    return (await api.list({}, { tenant: 'test' })).map((v) => v.id);
  } finally {
    api.close();
  }
}
