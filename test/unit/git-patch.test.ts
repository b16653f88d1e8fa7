// The git patch dialect sbx.workspace.diff() writes, checked against the real git: blob ids, path
// quoting, and patches `git apply` accepts and applies to the exact bytes (text, binary, links).
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, readlinkSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { blobId, filePatch, gitQuote, isBinary } from '../../src/sandbox/git-patch.js';

const dir = mkdtempSync(join(tmpdir(), 'airlock-git-patch-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

function apply(patch: string): void {
  writeFileSync(join(dir, '.p'), patch);
  execFileSync('git', ['apply', '.p'], { cwd: dir, stdio: 'pipe' });
}

describe('git-patch', () => {
  it('blobId is what git hash-object prints', () => {
    for (const content of [Buffer.alloc(0), Buffer.from('hello\n'), randomBytes(10_000)]) {
      const git = execFileSync('git', ['hash-object', '--stdin'], { input: content }).toString().trim();
      expect(blobId(content)).toBe(git);
    }
  });

  it('quotes paths as git does (octal bytes for non-ASCII, C escapes)', () => {
    expect(gitQuote('a/', 'plain name.txt')).toBe('a/plain name.txt');
    expect(gitQuote('a/', Buffer.from('é', 'utf8').toString('latin1'))).toBe('"a/\\303\\251"');
    expect(gitQuote('b/', 'tab\there"q\\')).toBe('"b/tab\\there\\"q\\\\"');
  });

  it('isBinary: NUL bytes or invalid UTF-8', () => {
    expect(isBinary(Buffer.from('plain ü\n'))).toBe(false);
    expect(isBinary(Buffer.from([0x61, 0, 0x62]))).toBe(true);
    expect(isBinary(Buffer.from([0x63, 0xe9, 0x0a]))).toBe(true);
  });

  it('git apply reproduces the exact bytes: text edits, binary, a symlink, a deletion', () => {
    const oldText = Buffer.from('a\nb\nc\n');
    const newText = Buffer.from('a\nB\nc\nd');
    const bin = randomBytes(3000);
    writeFileSync(join(dir, 't.txt'), oldText);
    writeFileSync(join(dir, 'gone'), 'x\n');
    const k = (s: string): string => Buffer.from(s, 'utf8').toString('latin1');
    apply(
      filePatch({
        pathBytes: k('t.txt'),
        binary: false,
        old: { mode: '100644', content: oldText },
        new: { mode: '100644', content: newText },
      }) +
        filePatch({ pathBytes: k('b ü.bin'), binary: true, new: { mode: '100755', content: bin } }) +
        filePatch({
          pathBytes: k('l'),
          binary: false,
          new: { mode: '120000', content: Buffer.from('t.txt') },
        }) +
        filePatch({
          pathBytes: k('gone'),
          binary: false,
          old: { mode: '100644', content: Buffer.from('x\n') },
        }),
    );
    expect(readFileSync(join(dir, 't.txt'))).toEqual(newText);
    expect(readFileSync(join(dir, 'b ü.bin'))).toEqual(bin);
    expect(readlinkSync(join(dir, 'l'))).toBe('t.txt');
    expect(() => readFileSync(join(dir, 'gone'))).toThrow();
  });

  it('a change too big for a line diff becomes one whole-file hunk git still applies', () => {
    const lines = (tag: string): string => Array.from({ length: 30_000 }, (_, i) => `${tag}${i}`).join('\n');
    const before = Buffer.from(`${lines('old')}\n`);
    const after = Buffer.from(lines('new')); // no final newline
    writeFileSync(join(dir, 'big.txt'), before);
    const patch = filePatch({
      pathBytes: 'big.txt',
      binary: false,
      old: { mode: '100644', content: before },
      new: { mode: '100644', content: after },
    });
    expect(patch).toContain('@@ -1,30000 +1,30000 @@');
    apply(patch);
    expect(readFileSync(join(dir, 'big.txt'))).toEqual(after);
  });
});
