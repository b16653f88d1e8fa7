// The snapshot contract against the microVM tier, and what only this tier does: a snapshot is the
// whole VM (QEMU's migration stream of guest RAM and devices), so a fork carries on with every file
// and every running process of its parent, each fork in its own jail, netns, uid and VM. TCG is
// slow here: the suite shares one parent VM across tests where that is honest, and runs the generic
// contract only where its cases fit the CI budget (declared skips say why for the rest).
import { statSync } from 'node:fs';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { AirlockError, type Airlock, type Sandbox, type Snapshot } from '../../src/index.js';
import { NO_RESIDUE, TEST_STATE_DIR, settledResidue, testAirlock } from '../helpers.js';
import { MICROVM_SKIP_REASON, canRunMicrovm, myQemus } from '../microvm/qemus.js';
import { expectError } from './support.js';
import { snapshotContract } from './snapshot.contract.js';

/** Why most generic cases are not run here: each boots its own VMs, which TCG makes slow. */
const CI_TIME =
  'each case boots one to five TCG-emulated VMs (tens of seconds each on two shared cores) and CI has ' +
  "~60 s for this tier's snapshots: the same behaviour (files, forks, counts, independence, listing, " +
  'removal) is checked on one shared parent VM in "microVM snapshots: the whole VM" below';
const WHOLE_VM =
  'a microVM snapshot is the whole VM (guest RAM holds every file the sandbox wrote, /tmp too, and ' +
  'its running processes); its layer holds no file tree, so file counts, sizes and content digests do not apply';
const NO_HOST_DIRS = 'host dirs are not shared into the guest: a workspace over a host dir is refused';

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

  snapshotContract('microvm', {
    skip: {
      'a snapshot captures the workspace and home, not /tmp': WHOLE_VM,
      'the same content gives the same digest':
        "a VM's memory differs at every instant, so two snapshots of it never share a digest",
      'types, modes, links and ownership survive a fork': CI_TIME,
      'the sandbox keeps running through a snapshot': CI_TIME,
      'a fork changes nothing in its parent, its siblings or the snapshot': CI_TIME,
      'deletions over a host workspace are deletions in the fork': NO_HOST_DIRS,
      'deletions in a fork are deletions in its own snapshot': CI_TIME,
      'forks of forks stack layers': CI_TIME,
      'fork({ count }) starts that many independent sandboxes': CI_TIME,
      'a fork takes the spec of its snapshot, with fork options on top': CI_TIME,
      'a read-only workspace forks read-only, with the home it had': NO_HOST_DIRS,
      "a fork runs on its snapshot's tier and kernel, also when the other tier has the same content": CI_TIME,
      'snapshots of unchanged sandboxes on the two tiers are two snapshots, each forking on its tier':
        WHOLE_VM,
      'snapshots are listed, inspected and removed': WHOLE_VM,
      'a snapshot used by a live fork cannot be removed until the forks are gone': WHOLE_VM,
      'a snapshot another snapshot builds on cannot be removed before it': CI_TIME,
      'a persistent sandbox is exempt from the TTL until killed': CI_TIME,
      'pause stops a running counter and resume continues it': CI_TIME,
      'snapshot and fork errors are typed': `${CI_TIME} (and the errors of this tier's own cases there)`,
      'a paused sandbox can be snapshotted and killed':
        'a paused VM is frozen whole, its QEMU too, so nothing can save it: the snapshot fails with ' +
        'INVALID_ARGUMENT saying to resume first (tested below)',
      '100 snapshot/fork/kill cycles leave nothing behind': CI_TIME,
    },
  });

  describe('microVM snapshots: the whole VM', () => {
    let airlock: Airlock;
    let parent: Sandbox;
    let snap: Snapshot;
    /** When the snapshot was taken: its guest's clock stopped then. */
    let snappedAt = 0;
    const owned: Sandbox[] = [];
    beforeAll(async () => {
      airlock = testAirlock();
      parent = await airlock.create({ backend: 'microvm' });
      owned.push(parent);
      await parent.exec('echo parent > /workspace/a.txt; echo home > ~/h; echo t > /tmp/t');
      await parent.exec(COUNTER, { background: true, timeoutMs: 600_000 });
      await until(async () => (await state(parent)).n > 2, 'the counter to run');
      snap = await parent.snapshot();
      snappedAt = Date.now();
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
      // The saved guests' clocks stopped at the snapshot: restore them at least CLOCK_GAP later, so
      // a fork that kept the saved clock would be that far behind the host.
      const CLOCK_GAP_MS = 8_000;
      await sleep(Math.max(0, snappedAt + CLOCK_GAP_MS - Date.now()));
      // Fork options on top: the fork's own limits are set inside the restored guest.
      const [a, b] = await snap.fork({ count: 2, limits: { pids: 77 } });
      owned.push(a!, b!);
      for (const f of [a!, b!]) {
        const guest = Number((await f.exec('date +%s')).stdout.trim());
        expect(Math.abs(guest - Date.now() / 1000)).toBeLessThan(3);
      }
      expect(new Set([parent.id, a!.id, b!.id]).size).toBe(3);
      for (const f of [a!, b!]) {
        expect((await f.exec('cat /workspace/a.txt ~/h /tmp/t')).stdout).toBe('parent\nhome\nt\n');
        await until(async () => (await state(f)).n > atSnap.n + 2, 'the restored counter to count on');
        expect((await state(f)).token).toBe(atSnap.token);
        expect((await f.exec('id -u; cat /sys/fs/cgroup/sbx/pids.max')).stdout).toBe('1000\n77\n');
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
      await expectError(a!.snapshot(), 'SANDBOX_GONE');
    });

    it('the parent runs on after its snapshot', async () => {
      const n = (await state(parent)).n;
      await until(async () => (await state(parent)).n > n, 'the parent counter to count on');
    });

    it('a paused VM is not saved (resume first), an aborted snapshot saves nothing', async () => {
      await parent.pause();
      const e = await expectError(parent.snapshot(), 'INVALID_ARGUMENT');
      expect(e.message).toMatch(/resume it/);
      await parent.resume();
      const aborted = new AbortController();
      aborted.abort();
      await expectError(parent.snapshot({ signal: aborted.signal }), 'ABORTED');
      const mine = (await airlock.snapshots.list()).filter((x) => x.source === parent.id);
      expect(mine.map((x) => x.id)).toEqual([snap.id]);
      expect((await parent.exec('echo alive')).stdout).toBe('alive\n');
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
