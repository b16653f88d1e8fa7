// Executable allowlists over layered sources (overlayfs format, bottom first) and over hostile
// sources: the merged view is resolved without mounting (top layer wins, whiteouts delete, opaque dirs
// hide lower copies), links are followed inside the source root only (an absolute target never
// reaches the host), and escaping links and loops are refused. The loader's search order is checked
// with synthetic ELF files: RPATH vs RUNPATH, $ORIGIN, $LIB, the source's own ld.so.cache.
import {
  chmodSync,
  chownSync,
  copyFileSync,
  existsSync,
  lstatSync,
  mkdirSync,
  readFileSync,
  statSync,
  symlinkSync,
} from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  buildExecutableRoot,
  CLOSURE_MANIFEST,
  type ClosureManifest,
  type ExecutableRootOptions,
} from '../../src/images/closure.js';
import { canRunNamespaces, SKIP_REASON } from '../helpers.js';
import {
  cleanup,
  failure,
  fakeElf,
  fakeLdCache,
  opaque,
  runInRoot,
  SANDBOX_UID,
  scratchDir,
  strays,
  whiteout,
  writeFile,
} from './fixtures.js';

const LIBDIR = '/usr/lib/x86_64-linux-gnu';
const LOADER = '/lib64/ld-linux-x86-64.so.2';

describe.skipIf(!canRunNamespaces)(
  `executable roots over layers and hostile sources (${SKIP_REASON})`,
  () => {
    let dir: string;
    /** A bottom layer: bash's closure from the host (a real, runnable root), plus test files. */
    let base: string;
    let n = 0;
    const dest = () => join(dir, `out-${++n}`);
    const layer = (name: string) => join(dir, name);
    const build = (o: Partial<ExecutableRootOptions>) =>
      buildExecutableRoot({ sourceLayers: [base], executables: ['bash'], destDir: dest(), ...o });
    const fails = (o: Partial<ExecutableRootOptions>) => failure(build(o));
    const manifestOf = (d: string) =>
      JSON.parse(readFileSync(join(d, CLOSURE_MANIFEST), 'utf8')) as ClosureManifest;

    beforeAll(async () => {
      dir = scratchDir();
      base = join(dir, 'base');
      await buildExecutableRoot({ sourceLayers: ['/'], executables: ['bash'], destDir: base, link: 'copy' });
      writeFile(base, 'usr/bin/tool', '#!/bin/bash\necho bottom\n', 0o755);
      writeFile(base, 'opt/data/a.txt', 'a-bottom');
      writeFile(base, 'opt/data/b.txt', 'b-bottom');
      writeFile(base, 'opt/gone/x.txt', 'x');
      writeFile(base, 'opt/m/a.txt', 'a');
    });
    afterAll(() => cleanup(dir));

    it('control: the bottom layer alone builds and runs', async () => {
      const d = dest();
      await build({ destDir: d, executables: ['bash', 'tool'] });
      expect(runInRoot(d, ['tool']).stdout).toBe('bottom\n');
    });

    it('the top layer wins: a file replaced on top is the one in the root', async () => {
      const top = layer('top-tool');
      writeFile(top, 'usr/bin/tool', '#!/bin/bash\necho top\n', 0o755);
      const d = dest();
      await build({ sourceLayers: [base, top], executables: ['tool'], destDir: d });
      expect(runInRoot(d, ['tool']).stdout).toBe('top\n');
      expect(manifestOf(d).entries.find((e) => e.path === '/usr/bin/bash')?.why).toContain(
        'interpreter of /usr/bin/tool',
      );
    });

    it('a whiteout on top deletes a library: LIBRARY_NOT_FOUND naming it and who needs it', async () => {
      const top = layer('top-wh-lib');
      whiteout(top, `${LIBDIR}/libtinfo.so.6`);
      const e = await fails({ sourceLayers: [base, top] });
      expect(e.code).toBe('LIBRARY_NOT_FOUND');
      expect(e.message).toContain('libtinfo.so.6');
      expect(e.message).toContain('/usr/bin/bash');
      expect(strays(dir).filter((x) => x.startsWith('.'))).toEqual([]);
    });

    it('a whiteout on top deletes a program: EXECUTABLE_NOT_FOUND, though the bottom layer has it', async () => {
      const top = layer('top-wh-bash');
      whiteout(top, 'usr/bin/bash');
      expect((await fails({ sourceLayers: [base, top] })).code).toBe('EXECUTABLE_NOT_FOUND');
      // and through a middle layer that does not touch /usr/bin at all
      const mid = layer('mid-empty');
      writeFile(mid, 'srv/unrelated', 'x');
      expect((await fails({ sourceLayers: [base, mid, top] })).code).toBe('EXECUTABLE_NOT_FOUND');
    });

    it('an opaque dir on top hides every lower copy; a middle layer without the dir does not cut the merge', async () => {
      const top = layer('top-opaque');
      opaque(top, 'opt/data');
      writeFile(top, 'opt/data/b.txt', 'b-top');
      writeFile(top, 'opt/m/b.txt', 'b');
      const mid = layer('mid-other');
      writeFile(mid, 'opt/other/c.txt', 'c');
      const d = dest();
      await build({ sourceLayers: [base, mid, top], extraPaths: ['/opt/data', '/opt/m'], destDir: d });
      expect(existsSync(join(d, 'opt/data/a.txt'))).toBe(false);
      expect(readFileSync(join(d, 'opt/data/b.txt'), 'utf8')).toBe('b-top');
      expect(readFileSync(join(d, 'opt/m/a.txt'), 'utf8')).toBe('a');
      expect(readFileSync(join(d, 'opt/m/b.txt'), 'utf8')).toBe('b');
      expect(existsSync(join(d, 'opt/other'))).toBe(false);
      // a whited-out dir is gone with everything under it
      const wh = layer('top-wh-dir');
      whiteout(wh, 'opt/gone');
      expect((await fails({ sourceLayers: [base, wh], extraPaths: ['/opt/gone/x.txt'] })).code).toBe(
        'FILE_NOT_FOUND',
      );
    });

    it('an absolute link is re-rooted at the source, never the host', async () => {
      const top = layer('top-abs');
      symlinkSync('/usr/bin/git', join(mkdirp(top, 'usr/bin'), 'hostgit')); // git is on the host, not in the layers
      symlinkSync('/usr/bin/bash', join(top, 'usr/bin/mybash'));
      const e = await fails({ sourceLayers: [base, top], executables: ['hostgit'] });
      expect(e.code).toBe('EXECUTABLE_NOT_FOUND');
      const d = dest();
      await build({ sourceLayers: [base, top], executables: ['mybash'], destDir: d });
      expect(lstatSync(join(d, 'usr/bin/mybash')).isSymbolicLink()).toBe(true);
      expect(runInRoot(d, ['mybash', '-c', 'echo ok']).stdout).toBe('ok\n');
    });

    it('links that climb out of the source root, or loop, are ROOT_LINK_UNSAFE', async () => {
      const top = layer('top-evil');
      const bin = mkdirp(top, 'usr/local/bin');
      symlinkSync('../../../../usr/bin/bash', join(bin, 'esc')); // /usr/local/bin + 4×.. is above /
      symlinkSync('loop2', join(bin, 'loop1'));
      symlinkSync('loop1', join(bin, 'loop2'));
      symlinkSync('/usr/local/bin/self/x', join(bin, 'self'));
      const data = mkdirp(top, 'opt/tree');
      writeFile(top, 'opt/tree/ok.txt', 'ok');
      symlinkSync('../../../../../etc/shadow', join(data, 'shadow'));
      for (const exe of ['esc', 'loop1', 'self']) {
        const e = await fails({ sourceLayers: [base, top], executables: [exe] });
        expect(e.code, exe).toBe('ROOT_LINK_UNSAFE');
      }
      const e = await fails({ sourceLayers: [base, top], extraPaths: ['/opt/tree'] });
      expect(e.code).toBe('ROOT_LINK_UNSAFE');
      expect(e.message).toContain('/opt/tree/shadow');
      expect(strays(dir).filter((x) => x.startsWith('.'))).toEqual([]);
    });

    it('setuid and setgid bits are stripped (by copying, the source keeps its mode); owners are kept', async () => {
      const top = layer('top-suid');
      const at = join(mkdirp(top, 'usr/bin'), 'suidbash');
      copyFileSync(join(base, 'usr/bin/bash'), at);
      chownSync(at, SANDBOX_UID + 1, SANDBOX_UID + 2);
      chmodSync(at, 0o6755);
      const d = dest();
      const { manifest } = await build({ sourceLayers: [base, top], executables: ['suidbash'], destDir: d });
      const st = statSync(join(d, 'usr/bin/suidbash'));
      expect(st.mode & 0o7777).toBe(0o755);
      expect([st.uid, st.gid]).toEqual([SANDBOX_UID + 1, SANDBOX_UID + 2]);
      expect(st.ino).not.toBe(statSync(at).ino);
      expect(statSync(at).mode & 0o7777).toBe(0o6755);
      expect(manifest.entries.find((x) => x.path === '/usr/bin/suidbash')).toMatchObject({ mode: '0755' });
      // as the sandbox uid, the stripped copy gives no privilege
      expect(runInRoot(d, ['suidbash', '-pc', 'echo $EUID']).stdout).toBe(`${SANDBOX_UID}\n`);
    });

    describe('the loader search, with synthetic ELF files', () => {
      const app = (name: string, o: Parameters<typeof fakeElf>[0]) => {
        const top = layer(name);
        writeFile(top, 'app/bin/tool', fakeElf({ type: 'exec', interpreter: LOADER, ...o }), 0o755);
        return top;
      };
      const lib = (top: string, path: string, o: Parameters<typeof fakeElf>[0] = {}) =>
        writeFile(top, path, fakeElf({ needed: ['libc.so.6'], ...o }), 0o755);
      const where = (m: ClosureManifest, name: string) =>
        m.entries.filter((e) => e.type === 'file' && e.path.endsWith(`/${name}`)).map((e) => e.path);

      it('RUNPATH $ORIGIN finds the direct need, but is not inherited: RPATH is (ld.so semantics)', async () => {
        const withRunpath = app('ld-runpath', {
          needed: ['libfoo.so.1', 'libc.so.6'],
          runpath: '$ORIGIN/../lib',
        });
        lib(withRunpath, 'app/lib/libfoo.so.1', { needed: ['libbar.so.2'] });
        lib(withRunpath, 'app/lib/libbar.so.2');
        const e = await fails({ sourceLayers: [base, withRunpath], executables: ['/app/bin/tool'] });
        expect(e.code).toBe('LIBRARY_NOT_FOUND');
        expect(e.message).toMatch(
          /libbar\.so\.2, needed by \/app\/lib\/libfoo\.so\.1 \(loaded for \/app\/bin\/tool\)/,
        );

        const withRpath = app('ld-rpath', { needed: ['libfoo.so.1', 'libc.so.6'], rpath: '$ORIGIN/../lib' });
        lib(withRpath, 'app/lib/libfoo.so.1', { needed: ['libbar.so.2'] });
        lib(withRpath, 'app/lib/libbar.so.2');
        const { manifest } = await build({ sourceLayers: [base, withRpath], executables: ['/app/bin/tool'] });
        expect(where(manifest, 'libbar.so.2')).toEqual(['/app/lib/libbar.so.2']);
        expect(manifest.entries.find((x) => x.path === '/app/lib/libbar.so.2')?.why).toEqual([
          'needed by /app/lib/libfoo.so.1',
        ]);
      });

      it('RPATH is ignored when RUNPATH is present; a wrong-class candidate is skipped', async () => {
        const top = app('ld-both', { needed: ['libfoo.so.1', 'libc.so.6'], rpath: '/r', runpath: '/u32:/u' });
        lib(top, 'r/libfoo.so.1');
        lib(top, 'u32/libfoo.so.1', { elf32: true });
        lib(top, 'u/libfoo.so.1');
        const { manifest } = await build({ sourceLayers: [base, top], executables: ['/app/bin/tool'] });
        expect(where(manifest, 'libfoo.so.1')).toEqual(['/u/libfoo.so.1']);
      });

      it("the source's own ld.so.cache is used (not the host's), then the default dirs; $LIB expands", async () => {
        const top = app('ld-cache', {
          needed: ['libcached.so.1', 'libdeflt.so.1', 'libml.so.1'],
          runpath: '/opt/$LIB',
        });
        writeFile(top, 'etc/ld.so.cache', fakeLdCache([['libcached.so.1', '/opt/weird/libcached.so.1']]));
        lib(top, 'opt/weird/libcached.so.1');
        lib(top, `${LIBDIR}/libdeflt.so.1`);
        lib(top, 'opt/lib/x86_64-linux-gnu/libml.so.1');
        const { manifest } = await build({ sourceLayers: [base, top], executables: ['/app/bin/tool'] });
        expect(where(manifest, 'libcached.so.1')).toEqual(['/opt/weird/libcached.so.1']);
        expect(where(manifest, 'libdeflt.so.1')).toEqual([`${LIBDIR}/libdeflt.so.1`]);
        expect(where(manifest, 'libml.so.1')).toEqual(['/opt/lib/x86_64-linux-gnu/libml.so.1']);
        // a cache entry whose file a higher layer deleted is not trusted: the search goes on, and fails
        const gone = layer('ld-cache-gone');
        whiteout(gone, 'opt/weird');
        const e = await fails({ sourceLayers: [base, top, gone], executables: ['/app/bin/tool'] });
        expect(e.code).toBe('LIBRARY_NOT_FOUND');
        expect(e.message).toContain('libcached.so.1');
      });

      it('a missing program interpreter is LIBRARY_NOT_FOUND; a foreign ELF listed is EXECUTABLE_INVALID', async () => {
        const top = layer('ld-interp');
        writeFile(
          top,
          'app/bin/a',
          fakeElf({ type: 'exec', interpreter: '/lib/ld-musl-x86_64.so.1' }),
          0o755,
        );
        writeFile(top, 'app/bin/b', fakeElf({ type: 'exec', machine: 183 }), 0o755);
        const a = await fails({ sourceLayers: [base, top], executables: ['/app/bin/a'] });
        expect(a.code).toBe('LIBRARY_NOT_FOUND');
        expect(a.message).toContain('/lib/ld-musl-x86_64.so.1');
        expect((await fails({ sourceLayers: [base, top], executables: ['/app/bin/b'] })).code).toBe(
          'EXECUTABLE_INVALID',
        );
      });
    });
  },
);

function mkdirp(root: string, path: string): string {
  const at = join(root, path);
  mkdirSync(at, { recursive: true, mode: 0o755 });
  return at;
}
