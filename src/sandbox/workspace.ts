// sbx.workspace.diff(): the sandbox's /workspace against its host dir, as a git patch and (with
// `dir`) as the changed files written into a fresh directory. With a cow workspace this is the only
// way writes leave the sandbox: they are discarded when it ends.
//
// The sandbox side is read INSIDE the sandbox (find and cat as its uid, through the files runner),
// so it works on every tier and a symlink the sandbox planted resolves inside the sandbox. The host
// side is the host dir, walked without following symlinks. Writing into `dir` never follows a link:
// parents are real directories made here, files are created O_EXCL|O_NOFOLLOW, symlinks come last.
import {
  closeSync,
  constants,
  lstatSync,
  mkdirSync,
  openSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  symlinkSync,
  writeSync,
} from 'node:fs';
import { join } from 'node:path';
import { AirlockError } from '../core/errors.js';
import type { RunRaw } from './files.js';
import type { GitMode, PatchSide } from './git-patch.js';

export interface WorkspaceChange {
  /** Relative to /workspace (and to the host dir), `/`-separated. */
  readonly path: string;
  readonly kind: 'added' | 'modified' | 'deleted';
  /** Content that is not UTF-8 text (NUL bytes or invalid UTF-8): a `GIT binary patch` in `patch`. */
  readonly binary: boolean;
  /** What the path is in the sandbox (for `deleted`: what it was in the host dir). */
  readonly type: 'file' | 'symlink';
  /** Git's mode for it: 100644, 100755 or 120000 (symlink). */
  readonly mode: GitMode;
}

export interface WorkspaceDiff {
  /** Sorted by path (byte order). Directories are not listed: they follow from the files. */
  readonly changes: WorkspaceChange[];
  /**
   * A git-style patch of the host dir → the sandbox's /workspace: `git apply` run in the host dir
   * applies it (binary files as `GIT binary patch` literals). Empty string when nothing changed.
   */
  readonly patch: string;
}

export interface WorkspaceDiffOptions {
  /**
   * Also write the added and modified files into this directory (created if missing; it must be
   * empty). Deleted paths are only listed in `changes`.
   */
  readonly dir?: string;
  /** Largest file (either side) a change may involve; larger → FILE_TOO_LARGE. Default 16 MiB. */
  readonly maxBytes?: number;
}

const DEFAULT_MAX_BYTES = 16 * 1024 * 1024;
/** Git refuses patches touching a `.git` path; those directories are left out on both sides. */
const SKIP_NAME = '.git';

interface Entry {
  readonly type: 'f' | 'l' | 'd' | 'other';
  readonly size: number;
  readonly perm: number;
  /** mtime in nanoseconds, as text (both sides exact integers). */
  readonly mtimeNs: string;
  readonly target: string;
}

type Tree = Map<string, Entry>; // key: path bytes as latin1

export class SandboxWorkspace {
  constructor(
    private readonly run: RunRaw,
    /** The host dir /workspace started from; undefined for an empty workspace. */
    private readonly hostDir: string | undefined,
  ) {}

  /**
   * What the sandbox changed in /workspace, relative to the host dir (an empty workspace: relative to
   * nothing). Take it when the sandbox is quiet: a file written during the diff may show either
   * state. Symlinks are kept as symlinks (mode 120000). Refused with WORKSPACE_DIFF_UNSUPPORTED: a
   * changed special file (fifo, socket, device) or a changed path that is not UTF-8; with
   * FILE_TOO_LARGE: a changed file over maxBytes. `.git` directories are left out (git apply refuses
   * them). A file is unchanged when its type, size, mode and mtime (ns) all match; otherwise its
   * contents are compared.
   */
  async diff(opts: WorkspaceDiffOptions = {}): Promise<WorkspaceDiff> {
    const maxBytes = opts.maxBytes ?? DEFAULT_MAX_BYTES;
    if (!Number.isSafeInteger(maxBytes) || maxBytes < 0) {
      throw new AirlockError('INVALID_ARGUMENT', 'maxBytes must be a whole number of bytes', {
        field: 'maxBytes',
      });
    }
    const outDir = opts.dir === undefined ? undefined : prepareOutDir(opts.dir);
    // Loaded here, not with this module: the patch writer (zlib, the diff package) is start-up work
    // for every `airlock run`, which never diffs (issue 31).
    const { filePatch, isBinary } = await import('./git-patch.js');
    const inside = await this.sandboxTree();
    const host = this.hostDir === undefined ? new Map<string, Entry>() : hostTree(this.hostDir);
    const keys = [...new Set([...inside.keys(), ...host.keys()])].sort(byBytes);
    const changes: WorkspaceChange[] = [];
    const sections: string[] = [];
    const writes: Array<{ key: string; side: PatchSide }> = [];
    for (const key of keys) {
      // A special file the sandbox made (or turned a file into) cannot be carried by a patch.
      if (inside.get(key)?.type === 'other' && host.get(key)?.type !== 'other') {
        throw unsupported(key, 'is a special file (fifo, socket or device)', 'remove it');
      }
      const s = usable(inside.get(key));
      const h = usable(host.get(key));
      if (!s && !h) continue;
      if (s && h && s.type === h.type && s.size === h.size && s.perm === h.perm && s.mtimeNs === h.mtimeNs) {
        if (s.type === 'f' || s.target === h.target) continue;
      }
      const path = utf8Path(key);
      const hostSide = h ? this.hostSide(key, h, maxBytes) : undefined;
      const sandboxSide = s ? await this.sandboxSide(path, s, maxBytes) : undefined;
      const oldSide = hostSide && (!sandboxSide || sameKind(hostSide, sandboxSide)) ? hostSide : undefined;
      const emit = (old: PatchSide | undefined, neu: PatchSide | undefined): void => {
        if (old && neu && old.mode === neu.mode && old.content.equals(neu.content)) return;
        const binary = (old ? isBinary(old.content) : false) || (neu ? isBinary(neu.content) : false);
        const ref = (neu ?? old)!;
        const kind = !old ? 'added' : !neu ? 'deleted' : 'modified';
        changes.push({
          path,
          kind,
          binary: binary && ref.mode !== '120000',
          type: ref.mode === '120000' ? 'symlink' : 'file',
          mode: ref.mode,
        });
        sections.push(
          filePatch({
            pathBytes: key,
            binary: binary && ref.mode !== '120000',
            ...(old ? { old } : {}),
            ...(neu ? { new: neu } : {}),
          }),
        );
        if (neu) writes.push({ key, side: neu });
      };
      if (hostSide && sandboxSide && !oldSide) {
        // A file became a symlink or back: git writes that as a deletion and an addition.
        emit(hostSide, undefined);
        emit(undefined, sandboxSide);
      } else emit(oldSide, sandboxSide);
    }
    if (outDir !== undefined) writeOut(outDir, writes);
    return { changes, patch: sections.join('') };
  }

  /** `find` inside the sandbox: type, size, mode, mtime, link target and path of every entry. */
  private async sandboxTree(): Promise<Tree> {
    const r = await this.run(
      [
        '/usr/bin/find',
        '/workspace',
        '-mindepth',
        '1',
        '-name',
        SKIP_NAME,
        '-prune',
        '-o',
        '-printf',
        '%y\\0%s\\0%m\\0%T@\\0%l\\0%P\\0',
      ],
      { maxBytes: 256 * 1024 * 1024 },
    );
    if (r.exitCode !== 0) {
      throw new AirlockError(
        'INTERNAL',
        `listing /workspace failed: ${r.stderr.trim().split('\n').pop() ?? ''}`,
      );
    }
    const f = r.stdout.toString('latin1').split('\0');
    const tree: Tree = new Map();
    for (let i = 0; i + 5 < f.length; i += 6) {
      const [sec, frac = ''] = f[i + 3]!.split('.');
      tree.set(f[i + 5]!, {
        type: f[i] === 'f' ? 'f' : f[i] === 'l' ? 'l' : f[i] === 'd' ? 'd' : 'other',
        size: Number(f[i + 1]),
        perm: parseInt(f[i + 2]!, 8),
        mtimeNs: (BigInt(sec!) * 1_000_000_000n + BigInt(frac.padEnd(9, '0').slice(0, 9))).toString(),
        target: Buffer.from(f[i + 4]!, 'latin1').toString('utf8'),
      });
    }
    return tree;
  }

  private hostSide(key: string, e: Entry, maxBytes: number): PatchSide {
    const p = join(this.hostDir!, Buffer.from(key, 'latin1').toString('utf8'));
    if (e.type === 'l') return { mode: '120000', content: Buffer.from(e.target, 'utf8') };
    if (e.size > maxBytes) throw tooLarge(key, e.size, maxBytes, 'the host dir');
    return { mode: gitMode(e), content: readFileSync(p) };
  }

  private async sandboxSide(path: string, e: Entry, maxBytes: number): Promise<PatchSide> {
    if (e.type === 'l') return { mode: '120000', content: Buffer.from(e.target, 'utf8') };
    if (e.size > maxBytes) throw tooLarge(path, e.size, maxBytes, 'the sandbox');
    const r = await this.run(['/bin/cat', '--', `/workspace/${path}`], { maxBytes });
    if (r.exitCode !== 0) {
      throw new AirlockError(
        'INTERNAL',
        `reading /workspace/${path} failed: ${r.stderr.trim().split('\n').pop() ?? ''}`,
      );
    }
    return { mode: gitMode(e), content: r.stdout };
  }
}

const usable = (e: Entry | undefined): Entry | undefined =>
  e && (e.type === 'f' || e.type === 'l') ? e : undefined;
const sameKind = (a: PatchSide, b: PatchSide): boolean => (a.mode === '120000') === (b.mode === '120000');
const gitMode = (e: Entry): GitMode => (e.perm & 0o100 ? '100755' : '100644');
const byBytes = (a: string, b: string): number => (a < b ? -1 : a > b ? 1 : 0);

/** A path key (latin1 bytes) as UTF-8 text; a changed path that is not UTF-8 is refused. */
function utf8Path(key: string): string {
  const bytes = Buffer.from(key, 'latin1');
  try {
    return new TextDecoder('utf-8', { fatal: true }).decode(bytes);
  } catch {
    throw unsupported(key, 'has a name that is not UTF-8', 'rename it');
  }
}

function unsupported(key: string, what: string, fix: string): AirlockError {
  const shown = JSON.stringify(Buffer.from(key, 'latin1').toString('utf8'));
  return new AirlockError(
    'WORKSPACE_DIFF_UNSUPPORTED',
    `workspace path ${shown} ${what}: a patch cannot carry it; ${fix} in the sandbox before taking the diff`,
    { field: 'path' },
  );
}

function tooLarge(path: string, size: number, maxBytes: number, where: string): AirlockError {
  return new AirlockError(
    'FILE_TOO_LARGE',
    `workspace file ${JSON.stringify(path)} in ${where} is ${size} bytes, over maxBytes (${maxBytes}); raise maxBytes or remove it in the sandbox`,
    { field: 'maxBytes' },
  );
}

/** The host dir's tree, symlinks not followed, `.git` left out. */
function hostTree(root: string): Tree {
  const tree: Tree = new Map();
  const walk = (rel: Buffer | undefined): void => {
    const dir = rel === undefined ? Buffer.from(root) : Buffer.concat([Buffer.from(`${root}/`), rel]);
    for (const name of readdirSync(dir, { encoding: 'buffer' })) {
      if (name.toString('latin1') === SKIP_NAME) continue;
      const relPath = rel === undefined ? name : Buffer.concat([rel, Buffer.from('/'), name]);
      const full = Buffer.concat([dir, Buffer.from('/'), name]);
      const st = lstatSync(full, { bigint: true });
      const type = st.isFile() ? 'f' : st.isSymbolicLink() ? 'l' : st.isDirectory() ? 'd' : 'other';
      tree.set(relPath.toString('latin1'), {
        type,
        size: Number(st.size),
        perm: Number(st.mode & 0o7777n),
        mtimeNs: st.mtimeNs.toString(),
        target: type === 'l' ? readlinkUtf8(full) : '',
      });
      if (type === 'd') walk(relPath);
    }
  };
  walk(undefined);
  return tree;
}

function readlinkUtf8(p: Buffer): string {
  return readlinkSync(p, { encoding: 'buffer' }).toString('utf8');
}

/** `dir` made ready for writeOut: created if missing, else an empty real directory. */
function prepareOutDir(dir: string): string {
  let st;
  try {
    st = lstatSync(dir);
  } catch {
    mkdirSync(dir, { recursive: true, mode: 0o755 });
    return dir;
  }
  if (!st.isDirectory() || readdirSync(dir).length > 0) {
    throw new AirlockError('INVALID_ARGUMENT', `dir: ${dir} must be an empty directory or not exist yet`, {
      field: 'dir',
    });
  }
  return dir;
}

/**
 * Write the changed files under `root`. Every path component is checked (no "", ".", ".."), every
 * parent is a real directory made here (lstat, never a link), files are created O_EXCL|O_NOFOLLOW,
 * and symlinks are made last, so no write goes through a link the sandbox chose.
 */
function writeOut(root: string, writes: ReadonlyArray<{ key: string; side: PatchSide }>): void {
  const links: Array<{ at: string; target: string }> = [];
  for (const { key, side } of writes) {
    const parts = Buffer.from(key, 'latin1').toString('utf8').split('/');
    if (parts.some((p) => p === '' || p === '.' || p === '..')) {
      throw new AirlockError(
        'WORKSPACE_DIFF_UNSUPPORTED',
        `workspace path ${JSON.stringify(key)} is not a plain relative path`,
        { field: 'path' },
      );
    }
    let at = root;
    for (const p of parts.slice(0, -1)) {
      at = join(at, p);
      let st;
      try {
        st = lstatSync(at);
      } catch {
        mkdirSync(at, { mode: 0o755 });
        continue;
      }
      if (!st.isDirectory()) {
        throw new AirlockError('WORKSPACE_DIFF_UNSUPPORTED', `writing ${key}: ${at} is not a directory`, {
          field: 'path',
        });
      }
    }
    at = join(at, parts[parts.length - 1]!);
    if (side.mode === '120000') {
      links.push({ at, target: side.content.toString('utf8') });
      continue;
    }
    const fd = openSync(
      at,
      constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW,
      side.mode === '100755' ? 0o755 : 0o644,
    );
    try {
      for (let off = 0; off < side.content.length;) off += writeSync(fd, side.content, off);
    } finally {
      closeSync(fd);
    }
  }
  for (const l of links) symlinkSync(l.target, l.at);
}
