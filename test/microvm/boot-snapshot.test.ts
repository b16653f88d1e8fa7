// Creates restore a baked boot snapshot (src/backends/microvm/bake.ts) instead of booting. How the
// test tells a restore from a boot: the sandbox's QEMU was started with `-incoming` (it loaded a
// migration stream) or without (it booted the kernel). Two creates
// racing to bake make one snapshot; restored sandboxes share nothing (files, processes, RNG state);
// a snapshot QEMU refuses falls back to a cold boot and is baked again.
import { existsSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, describe, expect, it, vi } from 'vitest';
import { Airlock, type Sandbox } from '../../src/index.js';
import { NO_RESIDUE, TEST_STATE_DIR, TEST_UID_RANGE, settledResidue } from '../helpers.js';
import { MICROVM_SKIP_REASON, canRunMicrovm, myQemus } from './qemus.js';

const BOOTS = join(TEST_STATE_DIR, 'microvm-boot');
/** A machine shape no other suite uses, so this file bakes its own snapshot. */
const SHAPE = { backend: 'microvm' as const, limits: { diskBytes: 96 * 1024 * 1024 } };

/** Whether the sandbox's QEMU restored a migration stream (else it booted the guest kernel). */
const restored = (s: Sandbox): boolean => {
  const q = myQemus().filter(([, args]) => args.includes(`-name ${s.id} `));
  expect(q).toHaveLength(1);
  return q[0]![1].includes(' -incoming file:/dev/fdset/');
};

describe.skipIf(!canRunMicrovm)(
  `microvm: creates restore a baked boot snapshot (${MICROVM_SKIP_REASON})`,
  () => {
    vi.setConfig({ testTimeout: 600_000, hookTimeout: 600_000 });
    const airlock = new Airlock({ stateDir: TEST_STATE_DIR, uidRange: TEST_UID_RANGE });
    const owned: Sandbox[] = [];
    const create = async (pids?: number): Promise<Sandbox> => {
      const s = await airlock.create(pids ? { ...SHAPE, limits: { ...SHAPE.limits, pids } } : SHAPE);
      owned.push(s);
      return s;
    };
    const killAll = (): Promise<unknown> => Promise.allSettled(owned.splice(0).map((s) => s.kill()));
    /** The baked snapshots this file's shape made (the dir may hold other suites' shapes too). */
    const before = new Set(existsSync(BOOTS) ? readdirSync(BOOTS) : []);
    const mine = (): string[] => (existsSync(BOOTS) ? readdirSync(BOOTS) : []).filter((k) => !before.has(k));

    afterAll(async () => {
      await killAll();
      await airlock.killAll();
      for (const k of mine()) rmSync(join(BOOTS, k), { recursive: true, force: true });
      expect(myQemus()).toEqual([]);
      expect(await settledResidue(10_000)).toEqual(NO_RESIDUE);
    });

    it('two creates racing to bake boot cold and make one root-only snapshot', async () => {
      const [a, b] = await Promise.all([create(), create()]);
      expect([restored(a!), restored(b!)]).toEqual([false, false]); // two cold boots
      expect(mine()).toHaveLength(1);
      const dir = join(BOOTS, mine()[0]!);
      expect(statSync(dir).mode & 0o777).toBe(0o700);
      for (const f of ['ram', 'vm.json']) {
        const st = statSync(join(dir, f));
        expect({ f, uid: st.uid, mode: st.mode & 0o777 }).toEqual({ f, uid: 0, mode: 0o600 });
      }
      // The baked VM had no identity yet and ran no exec.
      expect(JSON.parse(readFileSync(join(dir, 'vm.json'), 'utf8'))).toMatchObject({
        nextId: 1,
        processes: 0,
      });
      await killAll();
      // The bakes' temp dirs (and the VMs' spill dirs) are gone.
      expect(readdirSync(join(TEST_STATE_DIR, 'layers')).filter((n) => n.startsWith('.tmp-'))).toEqual([]);
    });

    it('restored sandboxes share nothing: files, processes, RNG, clock and hostname are their own', async () => {
      const [c, d] = await Promise.all([create(77), create(77)]);
      expect([restored(c!), restored(d!)]).toEqual([true, true]);
      // The boot id is drawn on first read, after the reseed: not the same in two restored guests.
      const ids = await Promise.all([c!, d!].map((s) => s.exec('cat /proc/sys/kernel/random/boot_id')));
      expect(ids[0]!.stdout).not.toBe(ids[1]!.stdout);
      // RNG: the saved CRNG was reseeded from the host in each.
      const rng = await Promise.all(
        [c!, d!].map(async (s) => (await s.exec('head -c16 /dev/urandom | od -An -tx1')).stdout),
      );
      expect(rng[0]).not.toBe(rng[1]);
      // Files and processes of one are not the other's.
      await c!.exec('echo c > /workspace/only-c; echo t > /tmp/only-c');
      await c!.exec('sleep 300', { background: true, timeoutMs: 600_000 });
      const seen = await d!.exec('ls /workspace /tmp; ps -eo comm | grep -c "^sleep$"');
      expect(seen.stdout).not.toContain('only-c');
      expect(seen.stdout.trim().split('\n').pop()).toBe('0');
      // The clock is the host's (the baked VM's stopped when it was saved), the hostname is set, and
      // the sandbox's own limits replaced the baking sandbox's.
      for (const s of [c!, d!]) {
        const r = await s.exec(
          'date +%s; cat /proc/sys/kernel/hostname; cat /sys/fs/cgroup/sbx/pids.max; id -u',
        );
        const [secs, host, pids, uid] = r.stdout.trim().split('\n');
        expect(Math.abs(Number(secs) - Date.now() / 1000)).toBeLessThan(5);
        expect([host, pids, uid]).toEqual(['airlock', '77', '1000']);
      }
      await killAll();
    });

    it("a restore with the baked VM's own limits keeps them: IDENTITY skips writing what the cgroup holds", async () => {
      // The baked VM booted with this shape's limits on its command line; the agent remembers them,
      // so this create's IDENTITY writes neither (guest/boot.c put_limit). The kernel holds the
      // spec's values all the same (77 above was written: it changed).
      const e = await create();
      expect(restored(e)).toBe(true);
      const r = await e.exec('cat /sys/fs/cgroup/sbx/pids.max /sys/fs/cgroup/sbx/memory.max');
      expect(r.stdout.trim().split('\n')).toEqual([
        String(e.spec.limits.pids),
        String(e.spec.limits.memoryBytes),
      ]);
      await killAll();
    });

    it('a baked snapshot QEMU refuses falls back to a cold boot and is baked again', async () => {
      const [key] = mine();
      const ram = join(BOOTS, key!, 'ram');
      writeFileSync(ram, Buffer.alloc(4096, 0x5a), { mode: 0o600 });
      const e = await create();
      expect((await e.exec('echo up')).stdout).toBe('up\n');
      expect(restored(e)).toBe(false); // booted
      // Baked again from this boot: a real stream, not the garbage.
      expect(mine()).toEqual([key]);
      expect(statSync(ram).size).toBeGreaterThan(1 << 20);
      await killAll();
    });
  },
);
