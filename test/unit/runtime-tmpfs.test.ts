// The sandboxes dir of a state dir goes on a tmpfs (ensureRuntimeTmpfs): once, never stacked, and
// never over what an earlier run left in it.
import { mkdirSync, mkdtempSync, readFileSync, rmdirSync, rmSync, statfsSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import {
  ensureRuntimeTmpfs,
  mkdirUnderRuntimeLock,
  unmount,
} from '../../src/backends/host/mount.privileged.js';
import { canRunNamespaces, SKIP_REASON } from '../helpers.js';

const TMPFS_MAGIC = 0x01021994;
const mountsAt = (dir: string): string[] =>
  readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .filter((l) => l.split(' ')[4] === dir);

// Needs a dir that is not on a tmpfs already (a host whose /var/tmp is one has nothing to mount).
const onDisk = statfsSync('/var/tmp').type !== TMPFS_MAGIC;

/** Run `f` on a fresh state dir (its empty `sandboxes/` and lock file path); unmount and remove it after. */
function onStateDir(f: (dir: string, lock: string) => void): void {
  const root = mkdtempSync(join('/var/tmp', 'airlock-runtmpfs-'));
  const dir = join(root, 'sandboxes');
  mkdirSync(dir, { mode: 0o711 });
  try {
    f(dir, join(root, '.lock'));
  } finally {
    while (mountsAt(dir).length) unmount(dir);
    rmSync(root, { recursive: true, force: true });
  }
}

describe.skipIf(!canRunNamespaces || !onDisk)(
  `ensureRuntimeTmpfs (${SKIP_REASON}, and /var/tmp not on a tmpfs)`,
  () => {
    it('mounts one tmpfs on an empty dir, and reuses it', () => {
      onStateDir((dir, lock) => {
        expect(ensureRuntimeTmpfs(dir, lock)).toEqual({ tmpfs: true });
        expect(statfsSync(dir).type).toBe(TMPFS_MAGIC);
        const [line] = mountsAt(dir);
        expect(line).toMatch(/ rw,nosuid,nodev[, ]/);
        expect(line).toMatch(/ - tmpfs airlock-run .*mode=711/);
        // A second runtime on the same state dir finds it and mounts nothing more.
        writeFileSync(join(dir, 'sbx-1'), '');
        expect(ensureRuntimeTmpfs(dir, lock)).toEqual({ tmpfs: true });
        expect(mountsAt(dir)).toHaveLength(1);
      });
    });

    it('a sandbox dir made while on disk keeps the tmpfs off until it is gone', () => {
      onStateDir((dir, lock) => {
        expect(mkdirUnderRuntimeLock(join(dir, 'sbx-a'), lock, 0o711)).toBe(false); // made on disk
        expect(ensureRuntimeTmpfs(dir, lock)).toMatchObject({ tmpfs: false });
        expect(mountsAt(dir)).toHaveLength(0);
        rmdirSync(join(dir, 'sbx-a'));
        expect(ensureRuntimeTmpfs(dir, lock)).toEqual({ tmpfs: true });
        expect(mkdirUnderRuntimeLock(join(dir, 'sbx-b'), lock, 0o711)).toBe(true); // made on the tmpfs
        expect(statfsSync(join(dir, 'sbx-b')).type).toBe(TMPFS_MAGIC);
      });
    });

    it('leaves a dir that still holds entries on disk, and says why', () => {
      onStateDir((dir, lock) => {
        mkdirSync(join(dir, 'sbx-earlier'));
        expect(ensureRuntimeTmpfs(dir, lock)).toEqual({
          tmpfs: false,
          reason: expect.stringContaining('1 sandbox dir(s) of an earlier run'),
        });
        expect(mountsAt(dir)).toHaveLength(0);
      });
    });
  },
);
