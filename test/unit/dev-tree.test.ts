// The shared /dev tree (ensureDevTree): read-only, exactly the nodes bwrap's --dev would bind, mounted
// once per state dir, and replaced when what is mounted there differs.
import {
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { devTreeProblem, ensureDevTree, unmount } from '../../src/backends/host/mount.privileged.js';
import { libc } from '../../src/core/libc.privileged.js';
import { canRunNamespaces, SANDBOX_DEV_ENTRIES, SKIP_REASON } from '../helpers.js';

const mountsAt = (dir: string): string[] =>
  readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .filter((l) => l.split(' ')[4] === dir);

/** Run `f` on a fresh state dir (its future dev dir and lock file); unmount and remove it after. */
function onStateDir(f: (dev: string, lock: string) => void): void {
  const root = mkdtempSync(join('/var/tmp', 'airlock-devtree-'));
  const dev = join(root, 'dev');
  try {
    f(dev, join(root, '.lock'));
  } finally {
    while (mountsAt(dev).length) unmount(dev);
    rmSync(root, { recursive: true, force: true });
  }
}

describe.skipIf(!canRunNamespaces)(`ensureDevTree (${SKIP_REASON})`, () => {
  it('mounts one read-only, nosuid, noexec tree holding exactly the device nodes, and reuses it', () => {
    onStateDir((dev, lock) => {
      expect(ensureDevTree(dev, lock)).toEqual({ ok: true });
      const [line] = mountsAt(dev);
      expect(line).toMatch(/ ro,nosuid,noexec[, ]/);
      expect(line).toMatch(/ - tmpfs airlock-dev ro,/);
      expect(readdirSync(dev).sort()).toEqual(SANDBOX_DEV_ENTRIES);
      const nul = statSync(join(dev, 'null'));
      expect(nul.isCharacterDevice()).toBe(true);
      expect(nul.rdev).toBe(0x103);
      expect(nul.mode & 0o7777).toBe(0o666);
      expect(statSync(join(dev, 'tty')).rdev).toBe(0x500);
      // Not even root writes to it.
      expect(() => writeFileSync(join(dev, 'x'), '')).toThrow(/EROFS/);
      expect(devTreeProblem(dev)).toBeUndefined();
      // A second runtime on the same state dir finds it and mounts nothing more.
      expect(ensureDevTree(dev, lock)).toEqual({ ok: true });
      expect(mountsAt(dev)).toHaveLength(1);
    });
  });

  it('replaces a tree that differs (another version, or tampered with)', () => {
    onStateDir((dev, lock) => {
      mkdirSync(dev);
      // An airlock-dev tmpfs that is writable and holds an extra node.
      expect(libc().mount('airlock-dev', dev, 'tmpfs', 0x2 /* MS_NOSUID */, 'mode=755')).toBe(0);
      writeFileSync(join(dev, 'sda'), '');
      expect(devTreeProblem(dev)).toMatch(/not mounted ro/);
      expect(ensureDevTree(dev, lock)).toEqual({ ok: true });
      expect(mountsAt(dev)).toHaveLength(1);
      expect(existsSync(join(dev, 'sda'))).toBe(false);
      expect(devTreeProblem(dev)).toBeUndefined();
    });
  });

  it('says what is wrong with a dir that is not such a tree', () => {
    onStateDir((dev) => {
      mkdirSync(dev);
      expect(devTreeProblem(dev)).toBe('not mounted');
    });
  });
});
