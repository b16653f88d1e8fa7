// Workspace changes back: sbx.workspace.diff() through the real library and `airlock diff` through the
// real CLI, on both tiers. The patch is checked with the real git: `git apply` on a copy of the host
// dir must reproduce the sandbox's tree (files, symlinks, exec bits; added, modified, deleted,
// renamed, binary). `--out DIR` must never write outside DIR, whatever links the sandbox plants.
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import {
  chmodSync,
  cpSync,
  existsSync,
  lstatSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  readdirSync,
  readlinkSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AirlockError } from '../../src/core/errors.js';
import type { Airlock } from '../../src/sandbox/airlock.js';
import type { Sandbox } from '../../src/sandbox/index.js';
import {
  GVISOR_SKIP_REASON,
  NO_RESIDUE,
  SKIP_REASON,
  canRunGvisor,
  canRunNamespaces,
  settledResidue,
  testAirlock,
} from '../helpers.js';
import { airlockCli } from './cli-support.js';

const scratch = mkdtempSync(join(tmpdir(), 'airlock-diff-'));
afterAll(() => rmSync(scratch, { recursive: true, force: true }));

/** A host dir with a bit of everything a project has. */
function hostDir(tag: string): string {
  const d = mkdtempSync(join(scratch, `${tag}-`));
  writeFileSync(join(d, 'same.txt'), 'unchanged\n');
  writeFileSync(join(d, 'mod.txt'), 'one\ntwo\nthree\n');
  writeFileSync(join(d, 'del.txt'), 'gone soon\n');
  writeFileSync(join(d, 'old name.txt'), 'renamed content\n');
  writeFileSync(join(d, 'bin.dat'), Buffer.from([0, 1, 2, 3, 0xff, 0xfe]));
  writeFileSync(join(d, 'latin1.txt'), Buffer.from([0x63, 0x61, 0x66, 0xe9, 0x0a])); // not UTF-8: binary
  mkdirSync(join(d, 'src'));
  writeFileSync(join(d, 'src', 'run.sh'), 'echo run\n');
  writeFileSync(join(d, 'src', 'becomes-link'), 'a file now\n');
  symlinkSync('same.txt', join(d, 'link-to-same'));
  mkdirSync(join(d, '.git'));
  writeFileSync(join(d, '.git', 'HEAD'), 'ref: refs/heads/main\n');
  return d;
}

/** What the sandbox does to its workspace: one of each kind of change. */
const CHANGES = [
  'cd /workspace',
  "printf 'one\\nTWO\\nthree\\nfour' > mod.txt", // modified, no final newline
  'rm del.txt',
  "mv 'old name.txt' 'new name.txt'", // a rename: deleted + added
  "printf 'new\\n' > added.txt",
  ': > empty.txt',
  "printf '\\0\\1\\2' >> bin.dat", // binary modified
  'head -c 5000 /dev/urandom > random.bin', // binary added
  'chmod +x src/run.sh', // mode change only
  'rm src/becomes-link && ln -s ../same.txt src/becomes-link', // file → symlink
  'ln -sf mod.txt link-to-same', // symlink retargeted
  "mkdir -p deep/er && printf 'x\\n' > deep/er/file.txt",
  "printf 'ü\\n' > 'ünï cödé.txt'",
  'echo ignored > .git/HEAD', // .git is left out
].join(' && ');

/** Files and symlinks under `dir` (not .git): path → "file <x|-> <sha-of-content>" or "link <target>". */
function treeOf(dir: string): Record<string, string> {
  const out: Record<string, string> = {};
  const walk = (rel: string): void => {
    for (const name of readdirSync(join(dir, rel))) {
      if (name === '.git') continue;
      const p = rel ? `${rel}/${name}` : name;
      const st = lstatSync(join(dir, p));
      if (st.isDirectory()) walk(p);
      else if (st.isSymbolicLink()) out[p] = `link ${readlinkSync(join(dir, p))}`;
      else out[p] = `file ${st.mode & 0o100 ? 'x' : '-'} ${readFileSync(join(dir, p)).toString('base64')}`;
    }
  };
  walk('');
  return out;
}

/** The same listing, taken inside the sandbox (the truth the patch must reproduce). */
async function sandboxTree(sbx: Sandbox): Promise<Record<string, string>> {
  const r = await sbx.exec(
    [
      '/bin/bash', // read -d "" is bash
      '-c',
      'cd /workspace && find . -name .git -prune -o \\( -type f -o -type l \\) -print0 | ' +
        'while IFS= read -r -d "" p; do p=${p#./}; if [ -L "$p" ]; then printf "%s\\0link %s\\0" "$p" "$(readlink "$p")"; ' +
        'else x=-; [ -x "$p" ] && x=x; printf "%s\\0file %s %s\\0" "$p" "$x" "$(base64 -w0 < "$p")"; fi; done',
    ],
    { maxOutputBytes: 8 * 1024 * 1024 },
  );
  expect(r.exitCode, r.stderr).toBe(0);
  const f = r.stdout.split('\0');
  const out: Record<string, string> = {};
  for (let i = 0; i + 1 < f.length; i += 2) out[f[i]!] = f[i + 1]!;
  return out;
}

function gitApply(dir: string, patch: string): void {
  const file = join(scratch, `p-${randomBytes(4).toString('hex')}.patch`);
  writeFileSync(file, patch);
  execFileSync('git', ['apply', '--check', file], { cwd: dir, stdio: 'pipe' });
  execFileSync('git', ['apply', file], { cwd: dir, stdio: 'pipe' });
}

async function rejection(p: Promise<unknown>): Promise<AirlockError> {
  const e = await p.then(
    () => undefined,
    (x: unknown) => x,
  );
  if (!AirlockError.isInstance(e)) expect.fail(`expected an AirlockError, got ${String(e)}`);
  return e;
}

const TIERS = [
  { backend: 'namespaces' as const, can: canRunNamespaces, why: SKIP_REASON },
  { backend: 'gvisor' as const, can: canRunGvisor, why: GVISOR_SKIP_REASON },
];

for (const tier of TIERS) {
  describe.skipIf(!tier.can)(`sbx.workspace.diff() on ${tier.backend} (${tier.why})`, () => {
    let airlock: Airlock;
    beforeAll(() => {
      airlock = testAirlock();
    });
    afterAll(async () => {
      await airlock.killAll();
      await airlock.close();
    });

    it('git apply of the patch on a copy of the host dir reproduces the sandbox tree', async () => {
      const host = hostDir('lib');
      const before = treeOf(host);
      const sbx = await airlock.create({ backend: tier.backend, workspace: { hostDir: host, mode: 'cow' } });
      const r = await sbx.exec(CHANGES);
      expect(r.exitCode, r.stderr).toBe(0);
      const out = join(scratch, `out-${randomBytes(4).toString('hex')}`);
      const d = await sbx.workspace.diff({ dir: out });
      const inside = await sandboxTree(sbx);
      await sbx.kill();
      expect(treeOf(host)).toEqual(before); // cow: the host dir was never written

      const kinds = Object.fromEntries(
        d.changes.map((c) => [c.path, `${c.kind}${c.binary ? ' binary' : ''} ${c.mode}`]),
      );
      expect(kinds).toEqual({
        'added.txt': 'added 100644',
        'bin.dat': 'modified binary 100644',
        'deep/er/file.txt': 'added 100644',
        'del.txt': 'deleted 100644',
        'empty.txt': 'added 100644',
        'link-to-same': 'modified 120000',
        'mod.txt': 'modified 100644',
        'new name.txt': 'added 100644',
        'old name.txt': 'deleted 100644',
        'random.bin': 'added binary 100644',
        'src/becomes-link': 'added 120000', // a type change: deleted as a file, added as a link
        'src/run.sh': 'modified 100755',
        'ünï cödé.txt': 'added 100644',
      });
      expect(d.patch).toContain('GIT binary patch');
      expect(d.patch).not.toContain('.git/');

      const copy = join(scratch, `copy-${randomBytes(4).toString('hex')}`);
      cpSync(host, copy, { recursive: true, verbatimSymlinks: true });
      gitApply(copy, d.patch);
      expect(treeOf(copy)).toEqual(inside);

      // { dir }: exactly the added and modified files (links as links), nothing for deletions.
      const written = treeOf(out);
      const expected = Object.fromEntries(
        Object.entries(inside).filter(([p]) => d.changes.some((c) => c.path === p && c.kind !== 'deleted')),
      );
      expect(written).toEqual(expected);
    }, 300_000);

    it('nothing changed: no changes, empty patch; an empty workspace diffs against nothing', async () => {
      const host = hostDir('same');
      const a = await airlock.create({ backend: tier.backend, workspace: { hostDir: host, mode: 'cow' } });
      expect(await a.workspace.diff()).toEqual({ changes: [], patch: '' });
      await a.kill();
      const b = await airlock.create({ backend: tier.backend });
      await b.exec("printf 'hi\\n' > /workspace/made.txt");
      const d = await b.workspace.diff();
      await b.kill();
      expect(d.changes).toEqual([
        { path: 'made.txt', kind: 'added', binary: false, type: 'file', mode: '100644' },
      ]);
      const empty = mkdtempSync(join(scratch, 'empty-'));
      execFileSync('git', ['init', '-q'], { cwd: empty });
      gitApply(empty, d.patch);
      expect(readFileSync(join(empty, 'made.txt'), 'utf8')).toBe('hi\n');
    }, 300_000);

    it('refuses explicitly: a special file, a non-UTF-8 name, a file over maxBytes, a non-empty dir', async () => {
      const host = hostDir('refuse');
      const sbx = await airlock.create({ backend: tier.backend, workspace: { hostDir: host, mode: 'cow' } });
      try {
        if (tier.backend === 'namespaces') {
          // (On gVisor a named pipe does not outlive the process that made it: nothing to refuse.)
          await sbx.exec('mkfifo /workspace/pipe');
          const fifo = await rejection(sbx.workspace.diff());
          expect(fifo.code).toBe('WORKSPACE_DIFF_UNSUPPORTED');
          expect(fifo.message).toContain('"pipe" is a special file');
        }
        await sbx.exec('rm -f /workspace/pipe && touch "/workspace/$(printf \'bad\\377name\')"');
        const name = await rejection(sbx.workspace.diff());
        expect(name.code).toBe('WORKSPACE_DIFF_UNSUPPORTED');
        expect(name.message).toContain('not UTF-8');
        await sbx.exec('rm /workspace/bad*name && head -c 5000 /dev/zero > /workspace/big.bin');
        const big = await rejection(sbx.workspace.diff({ maxBytes: 4096 }));
        expect(big.code).toBe('FILE_TOO_LARGE');
        expect(big.message).toContain('"big.bin"');
        const full = mkdtempSync(join(scratch, 'full-'));
        writeFileSync(join(full, 'x'), '');
        const notEmpty = await rejection(sbx.workspace.diff({ dir: full }));
        expect(notEmpty.code).toBe('INVALID_ARGUMENT');
        expect(readdirSync(full)).toEqual(['x']);
      } finally {
        await sbx.kill();
      }
    }, 300_000);
  });
}

describe.skipIf(!canRunNamespaces)(`airlock diff through the real CLI (${SKIP_REASON})`, () => {
  it('runs in the cwd by default: the patch on stdout, the command output on stderr, the host dir untouched', async () => {
    const host = hostDir('cli');
    const before = treeOf(host);
    const r = await airlockCli(['diff', '--', `echo to-stdout; echo to-stderr >&2; ${CHANGES}`], {
      cwd: host,
    });
    expect(r.code, r.stderr).toBe(0);
    expect(r.stderr).toContain('to-stdout\n');
    expect(r.stderr).toContain('to-stderr\n');
    expect(r.stdout).toMatch(/^diff --git /);
    expect(r.stdout).not.toContain('to-stdout');
    expect(treeOf(host)).toEqual(before);
    const copy = join(scratch, `clicopy-${randomBytes(4).toString('hex')}`);
    cpSync(host, copy, { recursive: true, verbatimSymlinks: true });
    gitApply(copy, r.stdout);
    expect(readFileSync(join(copy, 'mod.txt'), 'utf8')).toBe('one\nTWO\nthree\nfour');
    expect(existsSync(join(copy, 'del.txt'))).toBe(false);
    expect(readFileSync(join(copy, 'new name.txt'), 'utf8')).toBe('renamed content\n');
    expect(readlinkSync(join(copy, 'src', 'becomes-link'))).toBe('../same.txt');
    expect(lstatSync(join(copy, 'src', 'run.sh')).mode & 0o100).toBe(0o100);
    expect(readFileSync(join(copy, 'bin.dat'))).toEqual(Buffer.from([0, 1, 2, 3, 0xff, 0xfe, 0, 1, 2]));
  }, 120_000);

  it.skipIf(!canRunGvisor)(
    `--backend gvisor --out DIR writes the changed files and lists every change (${GVISOR_SKIP_REASON})`,
    async () => {
      const host = hostDir('cligv');
      const out = join(scratch, `cliout-${randomBytes(4).toString('hex')}`);
      const r = await airlockCli([
        'diff',
        '--backend',
        'gvisor',
        '--workspace',
        host,
        '--out',
        out,
        '--',
        CHANGES,
      ]);
      expect(r.code, r.stderr).toBe(0);
      expect(r.stdout.split('\n')).toEqual(
        expect.arrayContaining(['D del.txt', 'A new name.txt', 'M mod.txt', 'M bin.dat']),
      );
      expect(readFileSync(join(out, 'mod.txt'), 'utf8')).toBe('one\nTWO\nthree\nfour');
      expect(existsSync(join(out, 'same.txt'))).toBe(false);
      expect(existsSync(join(out, 'del.txt'))).toBe(false);
    },
    300_000,
  );

  it('--out DIR: links planted in the sandbox, even swapped in during the diff, never make it write outside DIR', async () => {
    const host = hostDir('trick');
    const victim = mkdtempSync(join(scratch, 'victim-'));
    writeFileSync(join(victim, 'precious'), 'keep\n');
    chmodSync(victim, 0o777);
    const out = join(scratch, `trickout-${randomBytes(4).toString('hex')}`);
    const script = [
      'cd /workspace',
      `ln -s ${victim} escape`, // a link to a host path (dangling inside the sandbox)
      `ln -s ${victim}/precious precious-link`,
      'ln -s ../../../../../../.. up',
      'mkdir -p dir && echo inside > dir/file',
      // A loop that keeps swapping dir for a link to the victim while the diff reads the tree.
      `(while :; do rm -rf dir; ln -s ${victim} dir; rm -f dir; mkdir dir; echo inside > dir/file; done) >/dev/null 2>&1 &`,
      'sleep 0.2',
    ].join('\n');
    const r = await airlockCli(['diff', '--workspace', host, '--out', out, '--', script]);
    // Whatever the race gave (a clean diff or an error from a vanished file), nothing left DIR.
    expect([0, 1, 70], r.stderr).toContain(r.code);
    expect(readdirSync(victim)).toEqual(['precious']);
    expect(readFileSync(join(victim, 'precious'), 'utf8')).toBe('keep\n');
    if (r.code === 0) {
      expect(readlinkSync(join(out, 'escape'))).toBe(victim);
      expect(lstatSync(join(out, 'escape')).isSymbolicLink()).toBe(true);
      expect(readlinkSync(join(out, 'precious-link'))).toBe(`${victim}/precious`);
    }
  }, 120_000);

  it('refuses a read-only workspace and a non-empty --out DIR with exit 2', async () => {
    const host = hostDir('ro');
    const ro = await airlockCli(['diff', '--workspace', `${host}:ro`, '--', 'true']);
    expect(ro.code).toBe(2);
    expect(ro.stderr).toContain('--workspace: diff needs a cow workspace');
    const full = mkdtempSync(join(scratch, 'full-'));
    writeFileSync(join(full, 'x'), '');
    const nonEmpty = await airlockCli(['diff', '--workspace', host, '--out', full, '--', 'true']);
    expect(nonEmpty.code).toBe(2);
    expect(nonEmpty.stderr).toContain('must be an empty directory');
  }, 120_000);

  it('leaves no residue', async () => {
    expect(await settledResidue()).toEqual(NO_RESIDUE);
  });
});
