// Executable allowlists over the host root: the built root is started with bubblewrap as the ONLY
// filesystem (no host /usr), as an unprivileged sandbox uid. What is listed runs; what is not listed
// is absent (exec fails ENOENT), even the shell.
import { existsSync, lstatSync, readFileSync, readdirSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AirlockError } from '../../src/core/errors.js';
import { buildExecutableRoot, CLOSURE_MANIFEST } from '../../src/images/closure.js';
import { ClosureManifestSchema, readClosureManifest } from '../../src/images/closure-manifest.js';
import { canRunNamespaces, SKIP_REASON } from '../helpers.js';
import { cleanup, failure, runInRoot, scratchDir, strays, writeFile } from './fixtures.js';

const hasGit = existsSync('/usr/bin/git');

describe.skipIf(!canRunNamespaces)(`executable roots over the host root (${SKIP_REASON})`, () => {
  let dir: string;
  let py: string;
  beforeAll(async () => {
    dir = scratchDir();
    py = join(dir, 'py');
    await buildExecutableRoot({ sourceLayers: ['/'], executables: ['python3'], destDir: py });
  });
  afterAll(() => cleanup(dir));

  it('python3 runs from the built root alone, as the sandbox uid, with its stdlib', () => {
    const r = runInRoot(py, [
      'python3',
      '-c',
      'import json,os,sys,hashlib,decimal;print(json.dumps([1, os.getuid() == os.geteuid() != 0, sys.prefix]))',
    ]);
    expect(r.stderr).toBe('');
    expect(JSON.parse(r.stdout)).toEqual([1, true, '/usr']);
  });

  it('nothing unlisted exists: sh and curl fail to exec with ENOENT, and no host file leaks in', () => {
    for (const name of ['sh', 'curl', 'ls', 'env']) {
      const r = runInRoot(py, [name, '--version']);
      expect(r.status, name).not.toBe(0);
      expect(r.stderr, name).toMatch(/execvp .*: No such file or directory/);
    }
    // from inside: only the closure, the mount points and the manifest are at the top
    const r = runInRoot(py, ['python3', '-c', 'import os;print(sorted(os.listdir("/")))']);
    const top = JSON.parse(r.stdout.replace(/'/g, '"')) as string[];
    expect(top).toEqual(expect.arrayContaining(['.airlock-closure.json', 'dev', 'proc', 'tmp', 'usr']));
    for (const absent of ['root', 'home', 'var', 'sbin', 'opt', 'srv']) expect(top).not.toContain(absent);
    expect(readdirSync(py).sort()).toEqual([...top].sort());
    expect(existsSync(join(py, 'usr/bin/sh'))).toBe(false);
    expect(existsSync(join(py, 'etc/passwd'))).toBe(false);
    expect(existsSync(join(py, 'usr/lib/python3.11/test'))).toBe(false);
  });

  it('keeps every link on the way: /usr/bin/python3 -> python3.11 and the loader path /lib64', () => {
    expect(lstatSync(join(py, 'usr/bin/python3')).isSymbolicLink()).toBe(true);
    const m = readClosureManifest(py)!; // the schema a reader uses accepts what the builder wrote
    const at = (p: string) => m.entries.find((e) => e.path === p);
    expect(at('/usr/bin/python3')).toMatchObject({ type: 'symlink', target: 'python3.11' });
    expect(at('/usr/bin/python3.11')?.why).toContain('executable');
    const loader = m.entries.find((e) => e.why.includes('interpreter of /usr/bin/python3.11'));
    expect(loader?.path).toMatch(/ld-linux-x86-64\.so\.2$/);
    expect(m.entries.find((e) => /\/libc\.so\.6$/.test(e.path))).toBeDefined();
    expect(m.runtimes).toEqual(['python3.11']);
    // the manifest says why: libexpat is needed by python itself
    expect(
      m.entries.some((e) => e.why.includes('needed by /usr/bin/python3.11') && /libexpat/.test(e.path)),
    ).toBe(true);
  });

  it.skipIf(!hasGit)(
    'git listed: git --version works; bash listed alone: no python, no git (skipped without /usr/bin/git)',
    async () => {
      const g = join(dir, 'git');
      await buildExecutableRoot({ sourceLayers: ['/'], executables: ['python3', 'git'], destDir: g });
      expect(runInRoot(g, ['git', '--version']).stdout).toMatch(/^git version \d/);
      expect(runInRoot(g, ['python3', '-c', 'print(2)']).stdout).toBe('2\n');
      const b = join(dir, 'bash');
      await buildExecutableRoot({ sourceLayers: ['/'], executables: ['bash'], destDir: b });
      const r = runInRoot(b, ['bash', '-c', 'echo "$BASH_VERSION"; git --version; python3 -c 1; ls /']);
      expect(r.stdout).toMatch(/^\d+\.\d+/);
      expect(r.stderr).toMatch(/git: command not found/);
      expect(r.stderr).toMatch(/python3: command not found/);
      expect(r.stderr).toMatch(/ls: command not found/);
    },
  );

  it('a #!/usr/bin/env python3 script pulls in env and python3 (and runs); env -S too', async () => {
    const src = join(dir, 'src');
    writeFile(src, 'hello.py', '#!/usr/bin/env python3\nimport sys\nprint("hello", sys.argv[1])\n', 0o755);
    writeFile(
      src,
      'split.py',
      '#!/usr/bin/env -S python3 -I\nimport sys\nprint(sys.flags.isolated)\n',
      0o755,
    );
    const d = join(dir, 'script');
    const { manifest } = await buildExecutableRoot({
      sourceLayers: ['/'],
      executables: [join(src, 'hello.py'), join(src, 'split.py')],
      destDir: d,
    });
    const why = (p: string) => manifest.entries.find((e) => e.path === p)?.why ?? [];
    expect(why('/usr/bin/env')).toContain(`interpreter of ${join(src, 'hello.py')}`);
    expect(why('/usr/bin/python3')).toContain('link on the way to /usr/bin/python3.11');
    expect(why('/usr/bin/python3.11')).toContain(`run by env for ${join(src, 'hello.py')}`);
    expect(runInRoot(d, [join(src, 'hello.py'), 'world']).stdout).toBe('hello world\n');
    expect(runInRoot(d, [join(src, 'split.py')]).stdout).toBe('1\n');
    // env is there, but nothing else it could run
    expect(runInRoot(d, ['env', 'sh', '-c', 'true']).stderr).toMatch(/No such file or directory/);
  });

  it('an executable not on PATH: EXECUTABLE_NOT_FOUND naming it and the PATH searched; nothing left', async () => {
    const d = join(dir, 'missing');
    const err = await buildExecutableRoot({
      sourceLayers: ['/'],
      executables: ['python3', 'no-such-program-x9'],
      destDir: d,
      searchPath: '/usr/bin:/bin',
    }).catch((e: unknown) => e);
    expect(AirlockError.is(err, 'EXECUTABLE_NOT_FOUND')).toBe(true);
    expect((err as Error).message).toContain('no-such-program-x9');
    expect((err as Error).message).toContain('/usr/bin:/bin');
    expect(existsSync(d)).toBe(false);
    expect(strays(dir).filter((n) => n.includes('missing'))).toEqual([]);
  });

  it('a listed file that is neither ELF nor #! script: EXECUTABLE_INVALID; a bad #! interpreter: NOT_FOUND', async () => {
    const src = join(dir, 'bad');
    writeFile(src, 'data.bin', 'just text\n', 0o755);
    writeFile(src, 'relative.sh', '#!bin/sh\n', 0o755);
    writeFile(src, 'gone.sh', '#!/usr/bin/no-such-interp-x9\n', 0o755);
    writeFile(src, 'noexec.sh', '#!/bin/sh\n', 0o644);
    const build = (exe: string) =>
      failure(buildExecutableRoot({ sourceLayers: ['/'], executables: [exe], destDir: join(dir, 'b') }));
    expect((await build(join(src, 'data.bin'))).code).toBe('EXECUTABLE_INVALID');
    expect((await build(join(src, 'relative.sh'))).code).toBe('EXECUTABLE_INVALID');
    expect((await build(join(src, 'noexec.sh'))).message).toMatch(/not executable/);
    const gone = await build(join(src, 'gone.sh'));
    expect(gone.code).toBe('EXECUTABLE_NOT_FOUND');
    expect(gone.message).toContain('/usr/bin/no-such-interp-x9');
    expect(existsSync(join(dir, 'b'))).toBe(false);
  });

  it('bad options are INVALID_ARGUMENT; an aborted build is ABORTED and leaves nothing', async () => {
    const bad = (o: Partial<Parameters<typeof buildExecutableRoot>[0]>) =>
      failure(
        buildExecutableRoot({ sourceLayers: ['/'], executables: ['python3'], destDir: join(dir, 'x'), ...o }),
      );
    expect((await bad({ executables: [] })).code).toBe('INVALID_ARGUMENT');
    expect((await bad({ destDir: 'relative' })).code).toBe('INVALID_ARGUMENT');
    expect((await bad({ destDir: py })).field).toBe('destDir'); // exists already
    expect((await bad({ sourceLayers: ['/', dir] })).code).toBe('INVALID_ARGUMENT');
    expect((await bad({ extraPaths: ['rel/path'] })).code).toBe('INVALID_ARGUMENT');
    const e = await bad({ extraPaths: ['/no/such/extra-x9'] });
    expect(e.code).toBe('FILE_NOT_FOUND');
    const ac = new AbortController();
    ac.abort();
    expect((await bad({ signal: ac.signal })).code).toBe('ABORTED');
    expect(existsSync(join(dir, 'x'))).toBe(false);
    expect(strays(dir).filter((n) => n.startsWith('.'))).toEqual([]);
  });

  it('an abort while files are being written removes the half-written root', async () => {
    const ac = new AbortController();
    const d = join(dir, 'aborted');
    const p = buildExecutableRoot({
      sourceLayers: ['/'],
      executables: ['python3'],
      destDir: d,
      signal: ac.signal,
    });
    // planning is synchronous; the writer yields to the loop every few hundred entries: abort there
    setImmediate(() => ac.abort());
    expect((await failure(p)).code).toBe('ABORTED');
    expect(existsSync(d)).toBe(false);
    expect(strays(dir).filter((n) => n.startsWith('.'))).toEqual([]);
  });

  it('two builds racing for one destDir: one wins whole, the other is a typed error, nothing stray', async () => {
    const d = join(dir, 'race');
    const [a, b] = await Promise.allSettled([
      buildExecutableRoot({ sourceLayers: ['/'], executables: ['bash'], destDir: d }),
      buildExecutableRoot({ sourceLayers: ['/'], executables: ['python3'], destDir: d }),
    ]);
    const won = [a, b].filter((x) => x.status === 'fulfilled');
    const lost = [a, b].filter((x): x is PromiseRejectedResult => x.status === 'rejected');
    expect(won).toHaveLength(1);
    expect(lost).toHaveLength(1);
    expect(AirlockError.is(lost[0]!.reason, 'INVALID_ARGUMENT')).toBe(true);
    // the winner's root is complete: its manifest matches its files
    const m = readClosureManifest(d)!;
    for (const e of m.entries) expect(existsSync(join(d, e.path)) || e.type === 'symlink', e.path).toBe(true);
    expect(strays(dir).filter((n) => n.startsWith('.'))).toEqual([]);
  });

  it('the manifest is deterministic: two builds of the same input are byte-identical', async () => {
    const build = async (name: string, o: { hash?: boolean; link?: 'copy' | 'hardlink' }, exes: string[]) => {
      await buildExecutableRoot({ sourceLayers: ['/'], executables: exes, destDir: join(dir, name), ...o });
      return readFileSync(join(dir, name, CLOSURE_MANIFEST));
    };
    const pa = await build('det-a', {}, ['python3', 'bash']);
    const pb = await build('det-b', { link: 'copy' }, ['python3', 'bash']);
    expect(pa.equals(pb)).toBe(true);
    // with content hashes too (hashing is slow, so over the small closure only)
    const ha = await build('det-c', { hash: true }, ['bash']);
    const hb = await build('det-d', { hash: true, link: 'copy' }, ['bash']);
    expect(ha.equals(hb)).toBe(true);
    const m = ClosureManifestSchema.parse(JSON.parse(ha.toString()));
    const paths = m.entries.map((e) => e.path);
    expect(paths).toEqual([...paths].sort());
    expect(m.entries.find((e) => e.path === '/usr/bin/bash')?.sha256).toMatch(/^[0-9a-f]{64}$/);
    // the copy shares no inode with the host; the default hardlinks a file that needs no change
    expect(statSync(join(dir, 'det-d/usr/bin/bash')).ino).not.toBe(statSync('/usr/bin/bash').ino);
    expect(statSync(join(dir, 'det-c/usr/bin/bash')).ino).toBe(statSync('/usr/bin/bash').ino);
  });
});
