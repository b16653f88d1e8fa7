// Escape suite: writing outside the sandbox's own dirs, leaking files between sandboxes, and writing
// through a shared host workspace (copy-on-write and read-only modes). Every test runs on each tier.
import { randomBytes } from 'node:crypto';
import {
  chmodSync,
  existsSync,
  lstatSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  rmSync,
  statSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { devTreeProblem } from '../../src/backends/host/mount.privileged.js';
import type { Sandbox } from '../../src/index.js';
import { canRunNamespaces, SANDBOX_DEV_ENTRIES, testAirlock, TEST_STATE_DIR } from '../helpers.js';
import { canRunTier, expectNoResidue, sandboxRootEntries, TIERS } from './util.js';

const airlock = testAirlock();
const hostDirs: string[] = [];

afterAll(async () => {
  if (canRunNamespaces) await expectNoResidue(airlock);
  for (const d of hostDirs) rmSync(d, { recursive: true, force: true });
});

/** A host directory to share as a workspace: a.txt (0644), w.txt (0666), sub/b.txt, all root's. */
function makeHostDir(): string {
  const d = mkdtempSync(join(tmpdir(), 'airlock-escape-')); // root's, 0700
  hostDirs.push(d);
  writeFileSync(join(d, 'a.txt'), 'original a\n', { mode: 0o644 });
  writeFileSync(join(d, 'w.txt'), 'original w\n');
  chmodSync(join(d, 'w.txt'), 0o666);
  mkdirSync(join(d, 'sub'), { mode: 0o755 });
  writeFileSync(join(d, 'sub', 'b.txt'), 'original b\n');
  return d;
}

/** Every entry under `dir` with its type, mode and content: equal snapshots mean nothing changed. */
function snapshot(dir: string, rel = ''): Record<string, string> {
  const out: Record<string, string> = {};
  for (const name of readdirSync(join(dir, rel)).sort()) {
    const p = join(rel, name);
    const st = statSync(join(dir, p));
    const mode = (st.mode & 0o7777).toString(8);
    if (st.isDirectory()) {
      out[p] = `dir ${mode} ${st.uid}`;
      Object.assign(out, snapshot(dir, p));
    } else {
      out[p] = `file ${mode} ${st.uid} ${readFileSync(join(dir, p), 'utf8')}`;
    }
  }
  return out;
}

/** Each entry of a dir, not followed: a symlink by its target, anything else by mode, size and mtime. */
function snapshotLinks(dir: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const name of readdirSync(dir).sort()) {
    const st = lstatSync(join(dir, name));
    out[name] = st.isSymbolicLink()
      ? `link ${readlinkSync(join(dir, name))}`
      : `${st.mode} ${st.size} ${st.mtimeMs}`;
  }
  return out;
}

/** Try to create `<dir>/<name>`; one line per dir: "<dir> ok" or "<dir> fail: <message>". */
function tryCreate(dirs: readonly string[], name: string): string {
  return dirs
    .map(
      (d) =>
        `if touch "${d.replace(/\/$/, '')}/${name}" 2>/tmp/err; then echo "${d} ok"; else echo "${d} fail: $(cat /tmp/err)"; fi`,
    )
    .join('\n');
}

function results(stdout: string): Map<string, string> {
  return new Map(
    stdout
      .trim()
      .split('\n')
      .map((l) => {
        const i = l.indexOf(' ');
        return [l.slice(0, i), l.slice(i + 1)] as [string, string];
      }),
  );
}

for (const backend of TIERS) {
  const canRun = canRunTier(backend);

  describe(`writes outside the sandbox dirs [${backend}]`, () => {
    it.skipIf(!canRun)('/usr, /etc, /bin and host binaries are read-only', async () => {
      const sbx = await airlock.create({ backend });
      const name = `escape-${randomBytes(6).toString('hex')}`;
      const r = await sbx.exec(
        tryCreate(['/usr', '/etc', '/bin', '/usr/bin', '/usr/lib'], name) +
          '\nif echo x >> /etc/passwd 2>/dev/null; then echo "/etc/passwd ok"; else echo "/etc/passwd fail"; fi' +
          '\nif cp /bin/true /usr/bin/ls 2>/dev/null; then echo "/usr/bin/ls ok"; else echo "/usr/bin/ls fail"; fi',
      );
      expect(r.exitCode).toBe(0);
      const res = results(r.stdout);
      expect(res.size).toBe(7);
      for (const [dir, what] of res) {
        expect(what, dir).toMatch(/^fail/);
        if (what !== 'fail') expect(what, dir).toMatch(/Read-only file system|Permission denied/);
      }
      // Host side: nothing appeared in the host's /usr or in the shared generated /etc.
      expect(existsSync(join('/usr', name))).toBe(false);
      expect(existsSync(join('/usr/bin', name))).toBe(false);
      for (const etc of readdirSync(TEST_STATE_DIR).filter((n) => n.startsWith('etc-'))) {
        expect(existsSync(join(TEST_STATE_DIR, etc, name))).toBe(false);
        expect(readFileSync(join(TEST_STATE_DIR, etc, 'passwd'), 'utf8')).not.toMatch(/^x$/m);
      }
      await sbx.kill();
    });

    it.skipIf(!canRun)('the root directory is read-only', async () => {
      const sbx = await airlock.create({ backend });
      const r = await sbx.exec(
        tryCreate(['/'], 'escape-root') +
          '\nif mkdir /root 2>/dev/null; then echo "/root ok"; else echo "/root fail"; fi',
      );
      const res = results(r.stdout);
      expect(res.get('/')).toMatch(/^fail: .*(Read-only file system|Permission denied)/);
      expect(res.get('/root')).toBe('fail');
      await sbx.kill();
    });

    it.skipIf(!canRun)('/dev: its device nodes work, nothing can be created in it', async () => {
      const sbx = await airlock.create({ backend });
      const r = await sbx.exec(
        tryCreate(['/dev'], 'escape-dev') +
          '\necho "null $(echo x > /dev/null && echo ok)"' +
          '\necho "urandom $(head -c 4 /dev/urandom | wc -c)"' +
          '\necho "zero $(head -c 3 /dev/zero | tr "\\0" z)"' +
          '\necho "entries $(ls -A /dev | sort | tr "\\n" " ")"',
      );
      expect(r.exitCode).toBe(0);
      const res = results(r.stdout);
      expect(res.get('/dev')).toMatch(/^fail: .*(Read-only file system|Permission denied)/);
      expect(res.get('null')).toBe('ok');
      expect(res.get('urandom')).toBe('4');
      expect(res.get('zero')).toBe('zzz');
      if (backend === 'namespaces') {
        // The shared read-only tree (ensureDevTree): exactly bwrap's --dev set, and it is unchanged.
        expect(res.get('entries')!.trim().split(' ')).toEqual(SANDBOX_DEV_ENTRIES);
        expect(devTreeProblem(join(TEST_STATE_DIR, 'dev'))).toBeUndefined();
      }
      await sbx.kill();
    });

    it.skipIf(!canRun)('/tmp, /workspace and /home/user are writable', async () => {
      const sbx = await airlock.create({ backend });
      const r = await sbx.exec(tryCreate(['/tmp', '/workspace', '/home/user'], 'f'));
      expect([...results(r.stdout).values()]).toEqual(['ok', 'ok', 'ok']);
      await sbx.kill();
    });
  });

  describe(`sandboxes share nothing [${backend}]`, () => {
    it.skipIf(!canRun)(
      "a file written in sandbox A is absent from sandbox B (live or after A's death)",
      async () => {
        const marker = `marker-${randomBytes(8).toString('hex')}`;
        const dirs = ['/workspace', '/tmp', '/home/user'];
        const a = await airlock.create({ backend });
        const w = await a.exec(dirs.map((d) => `echo ${marker} > ${d}/${marker}`).join(' && '));
        expect(w.exitCode).toBe(0);
        const check = (s: Sandbox): Promise<{ stdout: string }> =>
          s.exec(
            `for d in ${dirs.join(' ')}; do test -e "$d/${marker}" && echo "$d"; done; grep -rl ${marker} ${dirs.join(' ')} 2>/dev/null; true`,
          );
        // Positive control: A's own later exec sees all three.
        expect((await check(a)).stdout).toContain('/home/user\n');
        expect((await a.files.read(`/tmp/${marker}`)).trim()).toBe(marker);

        const b = await airlock.create({ backend });
        expect((await check(b)).stdout).toBe('');
        await a.kill();
        const c = await airlock.create({ backend });
        expect((await check(c)).stdout).toBe('');
        await Promise.all([b.kill(), c.kill()]);
      },
    );
  });

  describe(`shared host workspace [${backend}]`, () => {
    it.skipIf(!canRun)("mode 'cow': changes inside never reach the host dir", async () => {
      const host = makeHostDir();
      const before = snapshot(host);
      const sbx = await airlock.create({ backend, workspace: { hostDir: host, mode: 'cow' } });
      const r = await sbx.exec(
        [
          'cat a.txt',
          'echo changed >> w.txt',
          'echo new > n.txt',
          'mkdir d && echo deep > d/x',
          'mv sub/b.txt sub/c.txt',
          'rm a.txt',
          'ln -s /etc/passwd link',
          'chmod 777 sub',
          'ls -A',
        ].join(' && '),
      );
      expect(r.stderr).toBe('');
      expect(r.exitCode).toBe(0);
      expect(r.stdout).toBe('original a\nd\nlink\nn.txt\nsub\nw.txt\n');
      expect(await sbx.files.read('w.txt')).toBe('original w\nchanged\n');
      // Host side, while the sandbox lives and after it is gone: byte-for-byte unchanged.
      expect(snapshot(host)).toEqual(before);
      await sbx.kill();
      expect(snapshot(host)).toEqual(before);
    });

    it.skipIf(!canRun)(
      'symlinks in the shared dir resolve inside the sandbox, never to host paths',
      async () => {
        const host = makeHostDir();
        symlinkSync('/etc/shadow', join(host, 'shadow'));
        symlinkSync('/root', join(host, 'root'));
        symlinkSync('..', join(host, 'up'));
        const before = snapshotLinks(host);
        for (const mode of ['cow', 'ro'] as const) {
          const sbx = await airlock.create({ backend, workspace: { hostDir: host, mode } });
          const r = await sbx.exec(
            [
              'cat shadow >/dev/null 2>&1; echo "shadow=$?"',
              'ls root/ >/dev/null 2>&1; echo "root=$?"',
              'ls -A up/ | tr "\\n" " "; echo',
              'echo x > shadow 2>/dev/null; echo "write-shadow=$?"',
            ].join('\n'),
          );
          const lines = r.stdout.trim().split('\n');
          expect(lines[0], mode).toBe('shadow=1');
          expect(lines[1], mode).not.toBe('root=0');
          // ".." of /workspace is the sandbox root, not the host's tmpdir.
          expect(lines[2]!.trim().split(' ').sort(), mode).toEqual(sandboxRootEntries(backend));
          expect(lines[3], mode).not.toBe('write-shadow=0');
          await sbx.kill();
        }
        expect(snapshotLinks(host)).toEqual(before);
        expect(readFileSync('/etc/shadow', 'utf8')).not.toMatch(/^x$/m);
      },
    );

    it.skipIf(!canRun)("mode 'ro': every write to /workspace fails; reads work", async () => {
      const host = makeHostDir();
      const before = snapshot(host);
      const sbx = await airlock.create({ backend, workspace: { hostDir: host, mode: 'ro' } });
      const r = await sbx.exec(
        [
          'cat a.txt',
          'for op in "echo x >> w.txt" "echo x > n.txt" "mkdir d" "rm a.txt" "mv sub/b.txt sub/c.txt" "chmod 777 sub"; do',
          '  if sh -c "$op" 2>/tmp/err; then echo "ok: $op"; else echo "fail: $(cat /tmp/err)"; fi',
          'done',
        ].join('\n'),
      );
      const lines = r.stdout.trim().split('\n');
      expect(lines[0]).toBe('original a');
      expect(lines.slice(1)).toHaveLength(6);
      for (const l of lines.slice(1)) expect(l).toMatch(/^fail: .*Read-only file system/);
      expect(snapshot(host)).toEqual(before);
      await sbx.kill();
      expect(snapshot(host)).toEqual(before);
    });
  });
}
