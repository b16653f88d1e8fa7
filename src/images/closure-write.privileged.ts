// SECURITY-CRITICAL (privileged): writes an allowlist root. Runs as root to keep each file's owner as
// in the source (lchown to arbitrary uids). Every file is either hardlinked (only when nothing about
// it must change) or copied; setuid and setgid bits are always stripped, so no program in the root can
// gain privilege from its file mode, even where the root is mounted without nosuid. Symlinks are
// written with their source text (they were checked to stay inside the source root while planning).
import { createHash } from 'node:crypto';
import {
  chmodSync,
  closeSync,
  constants,
  copyFileSync,
  fstatSync,
  lchownSync,
  linkSync,
  mkdirSync,
  openSync,
  readSync,
  symlinkSync,
} from 'node:fs';
import { AirlockError } from '../core/errors.js';
import type { PlanItem } from './closure-plan.js';

/** One entry of the manifest: what is at `path` in the root and why it is there. */
export interface ClosureEntry {
  readonly path: string;
  readonly type: 'file' | 'dir' | 'symlink';
  /** Octal, e.g. "0755", after stripping setuid/setgid. */
  readonly mode: string;
  readonly uid: number;
  readonly gid: number;
  /** Files only. */
  readonly size?: number;
  /** Files only, when asked for (`hash: true`): sha256 of the content, hex. */
  readonly sha256?: string;
  /** Symlinks only: the link text. */
  readonly target?: string;
  /** Sorted reasons ("executable", "needed by /usr/bin/git", "interpreter of …"); empty for a parent dir. */
  readonly why: readonly string[];
}

export type LinkMode = 'hardlink' | 'copy';

const STRIP = 0o6000; // setuid, setgid
const YIELD_EVERY = 256;
const HASH_CHUNK = 1 << 20;

function sha256Of(hostPath: string): string {
  const h = createHash('sha256');
  const fd = openSync(hostPath, constants.O_RDONLY | constants.O_NOFOLLOW);
  try {
    const buf = Buffer.alloc(HASH_CHUNK);
    for (;;) {
      const n = readSync(fd, buf, 0, buf.length, null);
      if (n === 0) break;
      h.update(buf.subarray(0, n));
    }
  } finally {
    closeSync(fd);
  }
  return h.digest('hex');
}

/**
 * Copies a regular file without following a symlink that replaced it since it was planned: the
 * source is opened O_NOFOLLOW, checked to be a regular file, and copied through its fd.
 */
function copyRegular(hostPath: string, at: string): void {
  const fd = openSync(hostPath, constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK);
  try {
    if (!fstatSync(fd).isFile())
      throw new AirlockError('EXECUTABLE_INVALID', `${hostPath} changed while building`);
    copyFileSync(`/proc/self/fd/${fd}`, at, constants.COPYFILE_EXCL | constants.COPYFILE_FICLONE);
  } finally {
    closeSync(fd);
  }
}

/**
 * Writes `items` (every path with its parents, '/' included) under `dir`, which exists, is empty and
 * is private (0700) until this returns. Returns the manifest entries, sorted by path.
 */
export async function writeClosure(
  items: ReadonlyMap<string, PlanItem>,
  dir: string,
  link: LinkMode,
  hash: boolean,
  checkpoint: () => void,
): Promise<ClosureEntry[]> {
  const asRoot = process.getuid?.() === 0;
  const paths = [...items.keys()].sort();
  const out: ClosureEntry[] = [];
  const dirs: Array<{ at: string; mode: number; uid: number; gid: number }> = [];
  let n = 0;
  for (const path of paths) {
    if (++n % YIELD_EVERY === 0) {
      checkpoint();
      await new Promise((r) => setImmediate(r));
    }
    const item = items.get(path)!;
    const st = item.src.stat;
    const at = path === '/' ? dir : dir + path;
    const mode = st.mode & 0o7777 & ~STRIP;
    const why = [...item.why].sort();
    const base = { path, type: item.type, mode: mode.toString(8).padStart(4, '0'), uid: st.uid, gid: st.gid };
    if (item.type === 'dir') {
      if (path !== '/') mkdirSync(at, { mode: 0o700 });
      dirs.push({ at, mode, uid: st.uid, gid: st.gid }); // modes last: a 0555 dir must take its children first
      out.push({ ...base, why });
    } else if (item.type === 'symlink') {
      symlinkSync(item.target!, at);
      if (asRoot) lchownSync(at, st.uid, st.gid);
      out.push({ ...base, mode: '0777', target: item.target!, why });
    } else {
      // A hardlink shares the source's inode: only when the mode needs no change (no setuid/setgid)
      // and, as root, the owner is the source's anyway. Falls back to a copy (another filesystem, …).
      let linked = false;
      if (link === 'hardlink' && mode === (st.mode & 0o7777)) {
        try {
          linkSync(item.src.hostPath, at);
          linked = true;
        } catch {
          linked = false;
        }
      }
      if (!linked) {
        copyRegular(item.src.hostPath, at);
        if (asRoot) lchownSync(at, st.uid, st.gid); // before chmod: chown clears setuid bits anyway
        chmodSync(at, mode);
      }
      out.push({ ...base, size: st.size, ...(hash ? { sha256: sha256Of(at) } : {}), why });
    }
  }
  for (const d of dirs.reverse()) {
    if (asRoot) lchownSync(d.at, d.uid, d.gid);
    chmodSync(d.at, d.mode);
  }
  return out;
}
