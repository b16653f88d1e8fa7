// The cgroup freezer behind pause()/resume() and snapshots: v1 `freezer.state`, v2 `cgroup.freeze`,
// and a clear BACKEND_UNAVAILABLE when the host has neither (checked on fake cgroup dirs: the
// handles only read and write files there).
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { AirlockError } from '../../src/index.js';
import { attachCgroup } from '../../src/backends/host/cgroups.privileged.js';

const dirs: string[] = [];
const fakeDir = (): string => {
  const d = mkdtempSync(join(tmpdir(), 'airlock-cg-'));
  dirs.push(d);
  return d;
};
afterEach(() => {
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

describe('cgroup freezer', () => {
  it('v1: writes FROZEN, waits for the state, thaws with THAWED', async () => {
    const root = fakeDir();
    const freezer = join(root, 'freezer');
    mkdirSync(join(freezer, 'airlock', 'x'), { recursive: true });
    const dir = join(freezer, 'airlock', 'x');
    writeFileSync(join(dir, 'freezer.state'), 'THAWED\n');
    const h = attachCgroup({ version: 1, mounts: { freezer, memory: '/m', pids: '/p', cpu: '/c' } }, [dir]);
    expect(h.canFreeze).toBe(true);
    await h.freeze();
    expect(readFileSync(join(dir, 'freezer.state'), 'utf8')).toBe('FROZEN');
    await h.thaw();
    expect(readFileSync(join(dir, 'freezer.state'), 'utf8')).toBe('THAWED');
  });

  it('v2: writes cgroup.freeze and waits for "frozen 1" in cgroup.events', async () => {
    const dir = fakeDir();
    writeFileSync(join(dir, 'cgroup.freeze'), '0\n');
    writeFileSync(join(dir, 'cgroup.events'), 'populated 1\nfrozen 0\n');
    const h = attachCgroup({ version: 2, root: '/sys/fs/cgroup' }, [dir]);
    expect(h.canFreeze).toBe(true);
    let done = false;
    const frozen = h.freeze().then(() => (done = true));
    await new Promise((r) => setTimeout(r, 50));
    expect(done).toBe(false); // not before the kernel says so
    expect(readFileSync(join(dir, 'cgroup.freeze'), 'utf8')).toBe('1');
    writeFileSync(join(dir, 'cgroup.events'), 'populated 1\nfrozen 1\n');
    await frozen;
    await h.thaw();
    expect(readFileSync(join(dir, 'cgroup.freeze'), 'utf8')).toBe('0');
  });

  it('without a freezer, freeze and thaw fail closed with BACKEND_UNAVAILABLE', async () => {
    const v1 = attachCgroup({ version: 1, mounts: { memory: '/m', pids: '/p', cpu: '/c' } }, [
      '/m/airlock/x',
    ]);
    const v2 = attachCgroup({ version: 2, root: '/sys/fs/cgroup' }, [fakeDir()]);
    for (const h of [v1, v2]) {
      expect(h.canFreeze).toBe(false);
      for (const op of [() => h.freeze(), () => h.thaw()]) {
        const e = await op().catch((x: unknown) => x);
        expect(AirlockError.is(e, 'BACKEND_UNAVAILABLE')).toBe(true);
        expect((e as Error).message).toMatch(/freezer/);
      }
    }
  });
});
