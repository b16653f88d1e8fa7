// The snapshot contract against the microVM tier, and what only this tier does: a snapshot is the
// whole VM (QEMU's migration stream of guest RAM and devices), so a fork carries on with every file
// and every running process of its parent, each fork in its own jail, netns, uid and VM. TCG is
// slow here: the suite shares one parent VM across tests where that is honest, and runs the generic
// contract only where its cases fit the CI budget (declared skips say why for the rest).
import { existsSync, readdirSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { AirlockError, type Airlock, type Sandbox, type Snapshot } from '../../src/index.js';
import { NO_RESIDUE, TEST_STATE_DIR, canRunNamespaces, settledResidue, testAirlock } from '../helpers.js';
import { myQemus } from '../microvm/qemus.js';

const KERNEL_BOOT = '/var/cache/airlock/microvm/kernel/boot';
const canRunMicrovm =
  canRunNamespaces &&
  existsSync('/usr/bin/qemu-system-x86_64') &&
  existsSync(KERNEL_BOOT) &&
  readdirSync(KERNEL_BOOT).some((n) => n.startsWith('vmlinuz-'));
const MICROVM_SKIP_REASON =
  'needs root, qemu-system-x86, erofs-utils, gcc and the guest kernel in /var/cache/airlock/microvm (run scripts/setup.sh)';

/**
 * A counter that keeps a random token it drew at start only in memory and writes "token n" to a
 * file every 200 ms: a restarted process would draw a new token, a restored one keeps its own.
 */
const COUNTER =
  't=$(od -An -N8 -tx8 /dev/urandom | tr -d " "); i=0; ' +
  'while :; do i=$((i+1)); echo "$t $i" > /tmp/state.tmp; mv /tmp/state.tmp /tmp/state; sleep 0.2; done';

async function state(sbx: Sandbox): Promise<{ token: string; n: number }> {
  const r = await sbx.exec('cat /tmp/state');
  const [token, n] = r.stdout.trim().split(' ');
  return { token: token ?? '', n: Number(n) };
}

async function until(f: () => Promise<boolean>, what: string, ms = 60_000): Promise<void> {
  for (const end = Date.now() + ms; Date.now() < end; await sleep(200)) if (await f()) return;
  throw new Error(`test: timed out waiting for ${what}`);
}

if (canRunMicrovm) {
  vi.setConfig({ testTimeout: 600_000, hookTimeout: 600_000 });

  describe('microVM snapshots: the whole VM', () => {
    let airlock: Airlock;
    let parent: Sandbox;
    let snap: Snapshot;
    const owned: Sandbox[] = [];
    beforeAll(async () => {
      airlock = testAirlock();
      parent = await airlock.create({ backend: 'microvm' });
      owned.push(parent);
      await parent.exec('echo parent > /workspace/a.txt; echo home > ~/h; echo t > /tmp/t');
      await parent.exec(COUNTER, { background: true, timeoutMs: 600_000 });
      await until(async () => (await state(parent)).n > 2, 'the counter to run');
      snap = await parent.snapshot();
    });
    afterAll(async () => {
      await Promise.allSettled(owned.map((s) => s.kill()));
      await snap?.remove().catch(() => {});
      await airlock?.killAll();
    });

    it('records the VM as memory: its running exec, a root-only stream', async () => {
      expect(snap.backend).toBe('microvm');
      expect(snap.memory).toMatchObject({ processes: 1 });
      expect(snap.memory!.bytes).toBeGreaterThan(1 << 20);
      const dir = join(TEST_STATE_DIR, 'layers', snap.id, 'memory');
      for (const f of ['ram', 'vm.json']) {
        const st = statSync(join(dir, f));
        expect({ f, uid: st.uid, mode: st.mode & 0o777 }).toEqual({ f, uid: 0, mode: 0o600 });
      }
      expect(statSync(dir).mode & 0o077).toBe(0);
    });

    it('a fork has every file and the running counter of its parent, and diverges from it', async () => {
      const atSnap = await state(parent);
      const [a, b] = await snap.fork({ count: 2 });
      owned.push(a!, b!);
      expect(new Set([parent.id, a!.id, b!.id]).size).toBe(3);
      for (const f of [a!, b!]) {
        expect((await f.exec('cat /workspace/a.txt ~/h /tmp/t')).stdout).toBe('parent\nhome\nt\n');
        await until(async () => (await state(f)).n > atSnap.n + 2, 'the restored counter to count on');
        expect((await state(f)).token).toBe(atSnap.token);
        expect((await f.exec('id -u')).stdout).toBe('1000\n');
      }
      await a!.exec('echo mine > /workspace/only-a');
      expect((await b!.exec('test -e /workspace/only-a; echo $?')).stdout).toBe('1\n');
      expect((await parent.exec('test -e /workspace/only-a; echo $?')).stdout).toBe('1\n');
      // Each fork is its own VM: its own QEMU, as its own leased uid.
      const mine = myQemus().filter(([, args]) => [a!.id, b!.id].some((id) => args.includes(id)));
      expect(mine).toHaveLength(2);
      const uids = mine.map(([pid]) => statSync(`/proc/${pid}`).uid);
      expect(new Set(uids).size).toBe(2);
      expect(uids).not.toContain(0);
      await Promise.all([a!.kill(), b!.kill()]);
    });

    it('the parent runs on after its snapshot', async () => {
      const n = (await state(parent)).n;
      await until(async () => (await state(parent)).n > n, 'the parent counter to count on');
    });

    it('a fork takes its own limits inside the guest, within the saved RAM', async () => {
      const f = await snap.fork({ limits: { pids: 77 } });
      owned.push(f);
      expect((await f.exec('cat /sys/fs/cgroup/sbx/pids.max')).stdout).toBe('77\n');
      await f.kill();
    });

    it('only a microVM snapshot starts a microVM, and a microVM snapshot only a microVM', async () => {
      const e1 = await airlock.create({ backend: 'namespaces', layers: [snap.id] }).catch((x: unknown) => x);
      expect(AirlockError.is(e1, 'INVALID_SPEC')).toBe(true);
      const ns = await airlock.create({ backend: 'namespaces' });
      owned.push(ns);
      const nsSnap = await ns.snapshot();
      await ns.kill();
      try {
        const e2 = await airlock.create({ backend: 'microvm', layers: [nsSnap.id] }).catch((x: unknown) => x);
        expect(AirlockError.is(e2, 'INVALID_SPEC')).toBe(true);
      } finally {
        await nsSnap.remove();
      }
    });

    it('leaves no VM and no residue', async () => {
      await Promise.allSettled(owned.map((s) => s.kill()));
      await snap.remove();
      await airlock.killAll();
      expect(myQemus()).toEqual([]);
      expect(await settledResidue(10_000)).toEqual(NO_RESIDUE);
    });
  });
} else {
  describe('snapshot contract: microvm', () => {
    it.skip(`the whole suite [skipped: ${MICROVM_SKIP_REASON}]`, () => {});
  });
}
