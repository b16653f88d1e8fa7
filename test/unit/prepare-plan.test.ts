// The warm-slot pool follows an explicit prepare plan (backends/host/slots.ts): once given, what the
// warm slots make ahead no longer follows the last create. A bad plan is a typed error.
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { Airlock, AirlockError } from '../../src/index.js';
import {
  canRunNamespaces,
  settledResidue,
  NO_RESIDUE,
  SKIP_REASON,
  TEST_STATE_DIR,
  TEST_UID_RANGE,
} from '../helpers.js';

const hostDir = mkdtempSync(join('/var/tmp', 'airlock-plan-'));
writeFileSync(join(hostDir, 'hello.txt'), 'from the host\n');
afterAll(() => rmSync(hostDir, { recursive: true, force: true }));

/** Sandbox dirs (other than `except`) whose workspace overlay is mounted. */
function wsMounted(except: string): string[] {
  const root = `${TEST_STATE_DIR}/sandboxes/`;
  return readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .map((l) => l.split(' ')[4] ?? '')
    .filter((m) => m.startsWith(root) && m.endsWith('/ws') && !m.includes(except));
}

describe.skipIf(!canRunNamespaces)(`prepare plan (${SKIP_REASON})`, () => {
  it('refuses a plan it cannot follow, with a typed error', () => {
    const airlock = new Airlock({ stateDir: TEST_STATE_DIR, uidRange: TEST_UID_RANGE });
    const bad = (): void => airlock.prepare({ network: 'wifi' as 'none', snapshotForks: false });
    expect(bad).toThrow(AirlockError);
    expect(bad).toThrow(/network must be "none", "proxy" or "transparent"/);
    // A workspace the plan names is checked as a create's would be (the state dir is never one).
    expect(() =>
      airlock.prepare({
        network: 'none',
        snapshotForks: false,
        workspace: { hostDir: TEST_STATE_DIR, mode: 'ro' },
      }),
    ).toThrow(expect.objectContaining({ code: 'INVALID_SPEC' }));
    expect(() =>
      airlock.prepare({
        network: 'none',
        snapshotForks: false,
        workspace: { hostDir: join(hostDir, 'nope'), mode: 'ro' },
      }),
    ).toThrow(/does not exist/);
  });

  it('refuses a bad plan at once for a tier whose module is not loaded yet', async () => {
    // A fresh runtime has loaded only the namespaces tier: the others load on first use.
    const airlock = new Airlock({ stateDir: TEST_STATE_DIR, uidRange: TEST_UID_RANGE });
    try {
      expect(() =>
        airlock.prepare({ backend: 'gvisor', network: 'wifi' as 'none', snapshotForks: false }),
      ).toThrow(/network must be "none", "proxy" or "transparent"/);
      expect(() =>
        airlock.prepare({
          backend: 'gvisor',
          network: 'none',
          snapshotForks: false,
          workspace: { hostDir: TEST_STATE_DIR, mode: 'ro' },
        }),
      ).toThrow(expect.objectContaining({ code: 'INVALID_SPEC' }));
      expect(() => airlock.prepare({ backend: 'microvm', network: 'none', snapshotForks: false })).toThrow(
        expect.objectContaining({ code: 'BACKEND_UNAVAILABLE' }),
      );
    } finally {
      await airlock.close();
    }
  });

  it('the tiers Airlock.prepare knows to have warm slots are exactly those whose backend has prepare()', async () => {
    const { TIERS_WITH_WARM_SLOTS, HOST_SLOT_TIERS } = await import('../../src/sandbox/airlock.js');
    const { BACKEND_NAMES } = await import('../../src/core/backend-names.js');
    const { GvisorBackend } = await import('../../src/backends/gvisor/index.js');
    const { MicrovmBackend } = await import('../../src/backends/microvm/index.js');
    const { WasmBackend } = await import('../../src/backends/wasm/index.js');
    const { NamespacesBackend } = await import('../../src/backends/namespaces/index.js');
    const classes = {
      namespaces: NamespacesBackend,
      gvisor: GvisorBackend,
      microvm: MicrovmBackend,
      wasm: WasmBackend,
    };
    expect(Object.keys(classes).sort()).toEqual([...BACKEND_NAMES].sort());
    const withPrepare = BACKEND_NAMES.filter(
      (n) => typeof (classes[n].prototype as { prepare?: unknown }).prepare === 'function',
    );
    expect([...TIERS_WITH_WARM_SLOTS].sort()).toEqual(withPrepare.sort());
    for (const n of HOST_SLOT_TIERS) expect(TIERS_WITH_WARM_SLOTS).toContain(n);
  });

  it('mounts the planned workspace ahead whatever the last create asked for', async () => {
    const airlock = new Airlock({ stateDir: TEST_STATE_DIR, uidRange: TEST_UID_RANGE, warmPool: 1 });
    try {
      airlock.prepare({ network: 'none', snapshotForks: false, workspace: { hostDir, mode: 'ro' } });
      // An empty-workspace create: learned from, the next slot would mount nothing ahead.
      const plain = await airlock.create({});
      expect((await plain.exec(['true'])).exitCode).toBe(0);
      let ahead: string[] = [];
      for (let i = 0; i < 500 && ahead.length === 0; i++) {
        ahead = wsMounted(plain.id);
        if (!ahead.length) await new Promise((r) => setTimeout(r, 10));
      }
      expect(ahead).toHaveLength(1);
      // The create that asks for it takes that slot, and sees the host dir.
      const sbx = await airlock.create({ workspace: { hostDir, mode: 'ro' } });
      expect(ahead[0]).toContain(sbx.id);
      const r = await sbx.exec(['cat', '/workspace/hello.txt']);
      expect(r.stdout).toBe('from the host\n');
      await sbx.kill();
      await plain.kill();
    } finally {
      await airlock.close();
    }
    expect(await settledResidue()).toEqual(NO_RESIDUE);
  });
});
