// unmountAsync under load: many sandboxes torn down at once (e.g. 1,000 killed together) must each
// unmount their disk. koffi refuses more than 256 queued async calls per process; unmountAsync waits
// for a slot instead (and would unmount synchronously if an async call failed), so none is left.
import { mkdirSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { mountTmpfs, unmountAsync } from '../../src/backends/host/mount.privileged.js';
import { canRunNamespaces } from '../helpers.js';

const mountedUnder = (dir: string): number =>
  readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .filter((l) => (l.split(' ')[4] ?? '').startsWith(dir + '/')).length;

describe('unmountAsync', () => {
  it.skipIf(!canRunNamespaces)('600 unmounts at once all succeed (more than koffi queues)', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'airlock-umount-'));
    const targets = Array.from({ length: 600 }, (_, i) => join(dir, `m${i}`));
    try {
      for (const t of targets) {
        mkdirSync(t);
        mountTmpfs(t, 1024 * 1024, 0);
      }
      expect(mountedUnder(dir)).toBe(600);
      const results = await Promise.all(targets.map((t) => unmountAsync(t)));
      expect(results.every((r) => r === true)).toBe(true);
      expect(mountedUnder(dir)).toBe(0);
    } finally {
      await Promise.all(targets.map((t) => unmountAsync(t).catch(() => false)));
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
