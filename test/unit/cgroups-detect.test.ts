// detectCgroups decides v1 vs v2 from /proc/self/mountinfo; both layouts must be recognised (this
// host is v1, so v2 is checked here on a recorded mountinfo of a unified-only host).
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { detectCgroups } from '../../src/backends/host/cgroups.privileged.js';

const made: string[] = [];
const scratch = (): string => {
  const d = mkdtempSync(join(tmpdir(), 'cg2-'));
  made.push(d);
  return d;
};
afterAll(() => {
  for (const d of made) rmSync(d, { recursive: true, force: true });
});

const V1 = [
  '24 23 0:21 / /sys/fs/cgroup rw,nosuid - tmpfs tmpfs rw,mode=755',
  '25 24 0:22 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu',
  '26 24 0:23 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory',
  '27 24 0:24 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids',
  '28 24 0:25 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer',
  '29 24 0:26 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw',
].join('\n');

describe('detectCgroups', () => {
  it('prefers complete v1 hierarchies (hybrid host: v2 mounted without controllers)', () => {
    const l = detectCgroups(V1);
    expect(l.version).toBe(1);
    if (l.version === 1) {
      expect(l.mounts).toMatchObject({
        cpu: '/sys/fs/cgroup/cpu',
        memory: '/sys/fs/cgroup/memory',
        pids: '/sys/fs/cgroup/pids',
        freezer: '/sys/fs/cgroup/freezer',
      });
    }
  });

  it('recognises co-mounted v1 controllers (cpu,cpuacct)', () => {
    const info = V1.replace(
      '/sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu',
      '/sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct',
    );
    const l = detectCgroups(info);
    expect(l.version === 1 && l.mounts.cpu).toBe('/sys/fs/cgroup/cpu,cpuacct');
  });

  it('uses unified v2 when it has memory, pids and cpu', () => {
    const root = scratch();
    writeFileSync(join(root, 'cgroup.controllers'), 'cpuset cpu io memory hugetlb pids rdma misc\n');
    const l = detectCgroups(`30 23 0:26 / ${root} rw,nosuid - cgroup2 cgroup2 rw,nsdelegate`);
    expect(l).toEqual({ version: 2, root });
  });

  it('fails closed with a reason when no layout has the controllers', () => {
    const root = scratch();
    writeFileSync(join(root, 'cgroup.controllers'), 'hugetlb\n');
    const l = detectCgroups(`30 23 0:26 / ${root} rw - cgroup2 cgroup2 rw`);
    expect(l.version).toBe(0);
    expect(l.version === 0 && l.reason).toMatch(/lacks controller\(s\) memory, pids, cpu/);
    expect(detectCgroups('').version).toBe(0);
  });
});
