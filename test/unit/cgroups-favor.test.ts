// The kernel's cgroup favordynmods mode (fast cgroup.procs writes): favorDynmods() sees it already on
// from mountinfo without mounting anything, and turns it on by mounting the controller-less named
// hierarchy (checked for real on this host: root, Linux ≥ 6.1). The namespaces probe reports it.
import { mkdtempSync, readFileSync, rmdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { favorDynmods } from '../../src/backends/host/cgroups.privileged.js';
import { libc } from '../../src/core/libc.privileged.js';
import { Airlock } from '../../src/index.js';
import { canRunNamespaces, TEST_STATE_DIR, TEST_UID_RANGE } from '../helpers.js';

const MNT_DETACH = 2;
const mountinfoLine = (target: string): string | undefined =>
  readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .find((l) => l.split(' ')[4] === target);

describe('cgroup favordynmods', () => {
  it('is recognised as on from a cgroup mount that has it, with nothing mounted', () => {
    const target = join(tmpdir(), 'airlock-favor-never-made');
    const r = favorDynmods(
      '40 24 0:40 / /somewhere rw,relatime - cgroup cgroup rw,favordynmods,name=other\n',
      target,
    );
    expect(r).toMatchObject({ on: true });
    expect(r.detail).toContain('/somewhere');
    expect(mountinfoLine(target)).toBeUndefined();
  });

  it.skipIf(!canRunNamespaces)('turns it on by mounting a named hierarchy with the option', () => {
    const target = mkdtempSync(join(tmpdir(), 'airlock-favor-'));
    try {
      // A mountinfo without the option: favorDynmods must mount (it shares the hierarchy if it exists).
      const r = favorDynmods('', target);
      expect(r).toMatchObject({ on: true });
      const line = mountinfoLine(target);
      expect(line).toBeDefined();
      expect(line!.split(' - ')[1]).toMatch(/^cgroup cgroup .*\bfavordynmods\b/);
      expect(line!.split(' - ')[1]).toContain('name=airlock-favordynmods');
    } finally {
      libc().umount2(target, MNT_DETACH);
      rmdirSync(target);
    }
  });

  it.skipIf(!canRunNamespaces)('the namespaces probe reports it (and leaves it on)', async () => {
    const airlock = new Airlock({ stateDir: TEST_STATE_DIR, uidRange: TEST_UID_RANGE, warmPool: 0 });
    try {
      const p = await airlock.probe('namespaces');
      const c = p.checks.find((x) => x.name === 'cgroup-migration');
      expect(c).toMatchObject({ ok: true, optional: true });
      expect(c!.detail).toMatch(/favordynmods on/);
      expect(readFileSync('/proc/self/mountinfo', 'utf8')).toMatch(/ - cgroup2? \S+ \S*favordynmods/);
    } finally {
      await airlock.close();
    }
  });
});
