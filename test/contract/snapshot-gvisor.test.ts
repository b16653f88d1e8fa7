// The snapshot contract against the gVisor tier, and what only this tier does: a snapshot also
// checkpoints the memory of running execs, and a fork restores them — they carry on with their
// in-memory state, each fork on its own.
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { AirlockError, Sandbox, type Airlock, type Snapshot } from '../../src/index.js';
import { canRunGvisor, GVISOR_SKIP_REASON, settledResidue, NO_RESIDUE, testAirlock } from '../helpers.js';
import { snapshotContract } from './snapshot.contract.js';

/**
 * A counter that keeps a random token it drew at start only in memory, and writes "token n" to a
 * file every 50 ms: a restarted process would draw a new token, a restored one keeps its own.
 */
const COUNTER =
  't=$(od -An -N8 -tx8 /dev/urandom | tr -d " "); i=0; ' +
  'while :; do i=$((i+1)); echo "$t $i" > /workspace/state.tmp; mv /workspace/state.tmp /workspace/state; sleep 0.05; done';

async function state(sbx: Sandbox): Promise<{ token: string; n: number }> {
  const r = await sbx.exec('cat /workspace/state');
  const [token, n] = r.stdout.trim().split(' ');
  return { token: token ?? '', n: Number(n) };
}

async function until(f: () => Promise<boolean>, what: string, ms = 10_000): Promise<void> {
  for (const end = Date.now() + ms; Date.now() < end; await sleep(100)) if (await f()) return;
  throw new Error(`test: timed out waiting for ${what}`);
}

if (canRunGvisor) {
  snapshotContract('gvisor', { skip: {} });

  describe('memory snapshots on the gVisor tier', () => {
    let airlock: Airlock;
    const owned: Sandbox[] = [];
    const snaps: Snapshot[] = [];
    beforeAll(() => {
      airlock = testAirlock();
    });
    afterEach(async () => {
      await Promise.allSettled(owned.splice(0).map((s) => s.kill()));
      for (const s of snaps.splice(0).reverse()) await s.remove().catch(() => {});
    });
    afterAll(async () => {
      await airlock?.killAll();
    });
    const create = async (spec: Parameters<Airlock['create']>[0] = {}): Promise<Sandbox> => {
      const s = await airlock.create({ backend: 'gvisor', ...spec });
      owned.push(s);
      return s;
    };

    it('a fork of a running counter keeps its in-memory state and diverges from the parent', async () => {
      const sbx = await create();
      const counter = await sbx.exec(COUNTER, { background: true, timeoutMs: 120_000 });
      await until(async () => (await state(sbx)).n > 5, 'the counter to run');
      const snap = await sbx.snapshot();
      snaps.push(snap);
      expect(snap.memory).toMatchObject({ processes: 1 });
      expect(snap.memory!.bytes).toBeGreaterThan(0);
      const atSnap = await state(sbx);

      const [a, b] = await snap.fork({ count: 2 });
      owned.push(a!, b!);
      // Each fork's counter continues: the same token (drawn before the snapshot, never restarted),
      // counting on from where the snapshot was taken.
      for (const f of [a!, b!]) {
        await until(async () => (await state(f)).n > atSnap.n + 5, 'the restored counter to count on');
        const s = await state(f);
        expect(s.token).toBe(atSnap.token);
      }
      // Independent: stopping the parent's counter stops neither fork's, and a fork's writes stay its own.
      await counter.kill();
      const parentStopped = await state(sbx);
      await sleep(300);
      expect((await state(sbx)).n).toBe(parentStopped.n);
      const a1 = await state(a!);
      await sleep(300);
      expect((await state(a!)).n).toBeGreaterThan(a1.n);
      await a!.exec('echo mine > /workspace/only-a');
      expect((await b!.exec('test -e /workspace/only-a; echo $?')).stdout).toBe('1\n');
      expect((await sbx.exec('test -e /workspace/only-a; echo $?')).stdout).toBe('1\n');
    }, 120_000);

    it('a fork of a fork restores the processes again', async () => {
      const sbx = await create();
      await sbx.exec(COUNTER, { background: true, timeoutMs: 120_000 });
      await until(async () => (await state(sbx)).n > 3, 'the counter to run');
      const s1 = await sbx.snapshot();
      snaps.push(s1);
      const token = (await state(sbx)).token;
      const f1 = await s1.fork();
      owned.push(f1);
      await until(async () => (await state(f1)).n > 0, 'the first fork to count');
      const s2 = await f1.snapshot();
      snaps.push(s2);
      expect(s2.memory?.processes).toBe(1);
      const f2 = await s2.fork();
      owned.push(f2);
      const before = (await state(f2)).n;
      await until(async () => (await state(f2)).n > before + 3, 'the second fork to count on');
      expect((await state(f2)).token).toBe(token);
    }, 120_000);

    it('a snapshot with nothing running holds no memory; a paused one says why it holds none', async () => {
      const idle = await create();
      await idle.exec('echo x > /workspace/x');
      const s = await idle.snapshot();
      snaps.push(s);
      expect(s.memory).toBeUndefined();

      const sbx = await create();
      await sbx.exec(COUNTER, { background: true, timeoutMs: 120_000 });
      await until(async () => (await state(sbx)).n > 2, 'the counter to run');
      await sbx.pause();
      const p = await sbx.snapshot();
      snaps.push(p);
      expect(p.memory).toMatchObject({ processes: 0 });
      expect(p.memory!.skipped).toMatch(/paused/);
      const f = await p.fork();
      owned.push(f);
      const n = (await state(f)).n;
      await sleep(300);
      expect((await state(f)).n).toBe(n); // files only: nothing was restored
    }, 60_000);

    it('a sandbox with a network policy snapshots its files and says why not its memory', async () => {
      const sbx = await create({ network: { allow: ['example.com'] } });
      await sbx.exec(COUNTER, { background: true, timeoutMs: 120_000 });
      await until(async () => (await state(sbx)).n > 2, 'the counter to run');
      const s = await sbx.snapshot();
      snaps.push(s);
      expect(s.memory).toMatchObject({ processes: 0 });
      expect(s.memory!.skipped).toMatch(/network/);
    }, 60_000);

    it('a memory snapshot cannot be forked on the namespaces tier', async () => {
      const sbx = await create();
      await sbx.exec(COUNTER, { background: true, timeoutMs: 120_000 });
      await until(async () => (await state(sbx)).n > 2, 'the counter to run');
      const s = await sbx.snapshot();
      snaps.push(s);
      const e = await airlock
        .create({ backend: 'namespaces', layers: [s.id] })
        .then(() => undefined)
        .catch((x: unknown) => x);
      expect(AirlockError.is(e, 'INVALID_SPEC')).toBe(true);
      expect((e as AirlockError).message).toMatch(/gvisor process memory/);
    }, 60_000);

    it('leaves no residue on the host', async () => {
      await Promise.allSettled(owned.splice(0).map((s) => s.kill()));
      await airlock.killAll();
      expect(await settledResidue(5000)).toEqual(NO_RESIDUE);
    });
  });
} else {
  describe('snapshot contract: gvisor', () => {
    it.skip(`the whole suite [skipped: ${GVISOR_SKIP_REASON}]`, () => {});
  });
}
