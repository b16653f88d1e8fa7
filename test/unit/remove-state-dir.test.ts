// removeStateDir (the build's throwaway state dir for the CLI code cache, issue 31): the state dir's
// own host mounts (runtime tmpfs, /dev tree) are detached and the dir removed; anything else still
// mounted under it stops the removal, so a recursive delete never crosses into a mount.
import {
  existsSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { AirlockError } from '../../src/core/errors.js';
import { mountTmpfs, unmount } from '../../src/backends/host/mount.privileged.js';
import { removeStateDir, StateDirs } from '../../src/backends/host/state.js';
import { canRunNamespaces, SKIP_REASON } from '../helpers.js';

const mountsUnder = (root: string): string[] =>
  readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .map((l) => l.split(' ')[4])
    .filter((at): at is string => at !== undefined && (at === root || at.startsWith(`${root}/`)));

/** A state dir with its host mounts made as a runtime makes them (uid leases inside it too). */
function stateDirWithMounts(): string {
  const root = mkdtempSync(join('/var/tmp', 'airlock-rmstate-'));
  const dirs = new StateDirs(root, join(root, 'leases'));
  dirs.ensure();
  expect(dirs.ensureDev()).toEqual({ ok: true });
  return root;
}

describe.skipIf(!canRunNamespaces)(`removeStateDir (${SKIP_REASON})`, () => {
  it("detaches the state dir's own mounts and removes it", () => {
    const root = stateDirWithMounts();
    try {
      expect(mountsUnder(root).length).toBeGreaterThan(0); // at least the /dev tree
      removeStateDir(root);
      expect(mountsUnder(root)).toEqual([]);
      expect(existsSync(root)).toBe(false);
    } finally {
      for (const at of mountsUnder(root).reverse()) unmount(at);
      rmSync(root, { recursive: true, force: true });
    }
  });

  it('refuses, removing nothing, while something else is mounted under it', () => {
    const root = stateDirWithMounts();
    const other = join(root, 'other');
    try {
      mkdirSync(other);
      mountTmpfs(other, 1 << 20, 0);
      writeFileSync(join(other, 'keep'), 'x');
      let error: unknown;
      try {
        removeStateDir(root);
      } catch (e) {
        error = e;
      }
      expect(AirlockError.is(error, 'INTERNAL')).toBe(true);
      expect((error as Error).message).toContain(other);
      expect(readFileSync(join(other, 'keep'), 'utf8')).toBe('x');
    } finally {
      for (const at of mountsUnder(root).reverse()) unmount(at);
      rmSync(root, { recursive: true, force: true });
    }
  });

  it.each([
    [
      'through a symlink to it',
      (root: string): string => {
        const link = `${root}-link`;
        symlinkSync(root, link);
        return link;
      },
    ],
    ['whose path holds a blank (mountinfo spells it \\040)', (root: string): string => root],
  ])('refuses a dir named %s while something else is mounted under it', (what, nameOf) => {
    const root = what.startsWith('whose')
      ? mkdtempSync(join('/var/tmp', 'airlock rmstate '))
      : stateDirWithMounts();
    if (what.startsWith('whose')) {
      const dirs = new StateDirs(root, join(root, 'leases'));
      dirs.ensure();
    }
    const other = join(root, 'other');
    const name = nameOf(root);
    try {
      mkdirSync(other);
      mountTmpfs(other, 1 << 20, 0);
      writeFileSync(join(other, 'keep'), 'x');
      expect(() => removeStateDir(name)).toThrow(/still has mounts/);
      expect(readFileSync(join(other, 'keep'), 'utf8')).toBe('x');
    } finally {
      unmount(other);
      for (const at of mountsUnder(root).reverse()) unmount(at);
      rmSync(`${root}-link`, { force: true });
      rmSync(root, { recursive: true, force: true });
    }
  });
});
