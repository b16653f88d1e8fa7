// Git-style patch text for one file change, in the exact dialect `git apply` reads: `diff --git`
// headers with full blob ids, unified hunks (line diff from jsdiff) for text, `GIT binary patch`
// literals (zlib + git's base85) for binary content. Pure: no I/O.
import { createHash } from 'node:crypto';
import { deflateSync } from 'node:zlib';
import { structuredPatch } from 'diff';

/** Git's file modes: a regular file, an executable one, a symlink (content = its target). */
export type GitMode = '100644' | '100755' | '120000';

export interface PatchSide {
  readonly mode: GitMode;
  readonly content: Buffer;
}

export interface FilePatch {
  /** Path relative to the tree root, as raw bytes (latin1 string: one char per byte). */
  readonly pathBytes: string;
  readonly old?: PatchSide;
  readonly new?: PatchSide;
  readonly binary: boolean;
}

const NULL_ID = '0'.repeat(40);
/**
 * Above this many edits a line diff is not worth computing (Myers' cost grows with lines × edits:
 * 1,000 keeps a 60,000-line rewrite well under a second): the hunk then replaces the whole file.
 */
const MAX_EDIT_LENGTH = 1_000;

/** The git blob id of `content` (what `git hash-object` prints). */
export function blobId(content: Buffer): string {
  return createHash('sha1').update(`blob ${content.length}\0`).update(content).digest('hex');
}

/** Git's own test: a NUL in the first 8000 bytes. Invalid UTF-8 is binary here too (hunks are text). */
export function isBinary(content: Buffer): boolean {
  if (content.subarray(0, 8000).includes(0)) return true;
  try {
    new TextDecoder('utf-8', { fatal: true }).decode(content);
    return false;
  } catch {
    return true;
  }
}

const C_ESCAPES: Record<number, string> = {
  7: '\\a',
  8: '\\b',
  9: '\\t',
  10: '\\n',
  11: '\\v',
  12: '\\f',
  13: '\\r',
  34: '\\"',
  92: '\\\\',
};

/**
 * `prefix + path` as git writes it in headers: bare, or C-quoted with octal escapes when it holds
 * control bytes, `"`, `\` or non-ASCII bytes (git's core.quotePath default).
 */
export function gitQuote(prefix: string, pathBytes: string): string {
  const raw = prefix + pathBytes;
  let quoted = '';
  let needs = false;
  for (let i = 0; i < raw.length; i++) {
    const c = raw.charCodeAt(i);
    if (C_ESCAPES[c] !== undefined) {
      quoted += C_ESCAPES[c];
      needs = true;
    } else if (c < 0x20 || c >= 0x7f) {
      quoted += `\\${c.toString(8).padStart(3, '0')}`;
      needs = true;
    } else quoted += raw[i];
  }
  return needs ? `"${quoted}"` : raw;
}

/** One file's section of a git patch, ending in a newline. */
export function filePatch(f: FilePatch): string {
  const a = gitQuote('a/', f.pathBytes);
  const b = gitQuote('b/', f.pathBytes);
  const out = [`diff --git ${a} ${b}`];
  const oldId = f.old ? blobId(f.old.content) : NULL_ID;
  const newId = f.new ? blobId(f.new.content) : NULL_ID;
  if (!f.old) out.push(`new file mode ${f.new!.mode}`);
  else if (!f.new) out.push(`deleted file mode ${f.old.mode}`);
  else if (f.old.mode !== f.new.mode) out.push(`old mode ${f.old.mode}`, `new mode ${f.new.mode}`);
  const sameMode = f.old && f.new && f.old.mode === f.new.mode;
  if (oldId !== newId) out.push(`index ${oldId}..${newId}${sameMode ? ` ${f.old!.mode}` : ''}`);
  const oldContent = f.old?.content ?? Buffer.alloc(0);
  const newContent = f.new?.content ?? Buffer.alloc(0);
  if (oldId === newId) return `${out.join('\n')}\n`; // a mode change only
  if (f.binary) {
    out.push('GIT binary patch', ...binaryLiteral(newContent), '');
    return `${out.join('\n')}\n`;
  }
  // A text file added or deleted empty has no hunks (and then no ---/+++ lines, as git writes it).
  if (oldContent.length === 0 && newContent.length === 0) return `${out.join('\n')}\n`;
  out.push(`--- ${f.old ? a : '/dev/null'}`, `+++ ${f.new ? b : '/dev/null'}`);
  out.push(...textHunks(oldContent.toString('utf8'), newContent.toString('utf8')));
  return `${out.join('\n')}\n`;
}

function textHunks(oldText: string, newText: string): string[] {
  const p = structuredPatch('a', 'b', oldText, newText, '', '', {
    context: 3,
    maxEditLength: MAX_EDIT_LENGTH,
  });
  const hunks = p ? p.hunks : [wholeFileHunk(oldText, newText)];
  const out: string[] = [];
  for (const h of hunks) {
    // Unified diff quirk: an empty range names the line before it.
    const oldStart = h.oldLines === 0 ? h.oldStart - 1 : h.oldStart;
    const newStart = h.newLines === 0 ? h.newStart - 1 : h.newStart;
    out.push(`@@ -${oldStart},${h.oldLines} +${newStart},${h.newLines} @@`, ...h.lines);
  }
  return out;
}

/** Every old line removed, every new line added (when the line diff would cost too much). */
function wholeFileHunk(
  oldText: string,
  newText: string,
): { oldStart: number; oldLines: number; newStart: number; newLines: number; lines: string[] } {
  const side = (text: string, sign: string): string[] => {
    if (text === '') return [];
    const lines = text.split('\n');
    const noEol = lines[lines.length - 1] !== '';
    if (!noEol) lines.pop();
    const out = lines.map((l) => sign + l);
    if (noEol) out.push('\\ No newline at end of file');
    return out;
  };
  const minus = side(oldText, '-');
  const plus = side(newText, '+');
  const count = (l: string[]): number => l.filter((x) => !x.startsWith('\\')).length;
  return {
    oldStart: 1,
    oldLines: count(minus),
    newStart: 1,
    newLines: count(plus),
    lines: [...minus, ...plus],
  };
}

const B85 = '0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz!#$%&()*+-;<=>?@^_`{|}~';

/** `literal N` and git's base85 lines of the zlib-deflated content (as `git diff --binary` writes). */
function binaryLiteral(content: Buffer): string[] {
  const z = deflateSync(content);
  const out = [`literal ${content.length}`];
  for (let off = 0; off < z.length; off += 52) {
    const chunk = z.subarray(off, off + 52);
    const n = chunk.length;
    // Line length: A-Z for 1-26 bytes, a-z for 27-52.
    let line = n <= 26 ? String.fromCharCode(64 + n) : String.fromCharCode(96 + n - 26);
    const padded = Buffer.alloc(Math.ceil(n / 4) * 4);
    chunk.copy(padded);
    for (let i = 0; i < padded.length; i += 4) {
      let v = padded.readUInt32BE(i);
      const five: string[] = [];
      for (let k = 0; k < 5; k++) {
        five.unshift(B85[v % 85]!);
        v = Math.floor(v / 85);
      }
      line += five.join('');
    }
    out.push(line);
  }
  return out;
}
