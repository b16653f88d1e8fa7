// SECURITY-CRITICAL (privileged): unpacking an image layer tar, as root, into an overlayfs-format
// layer directory.
//
// The tar comes from a registry or a file: it is hostile input (its digest only proves it is the
// tar the image's author chose). It is written into `dest`, a fresh directory inside the image
// store (0700 root: nothing else can write there while this runs), so checking a path with lstat
// and then using it cannot race with anyone. The promises:
// - Nothing is written outside `dest`: absolute names and `..` components are refused; every parent
//   component is lstat'ed and must be a real directory made by this layer (a symlink there is
//   refused: nothing is ever written through a link); files are opened O_CREAT|O_EXCL|O_NOFOLLOW.
// - Hard links point only at regular files this same layer already wrote.
// - Device nodes and FIFOs are skipped (a char 0/0 in a tar is NOT taken as a whiteout: only the
//   OCI `.wh.` names make whiteouts). setuid/setgid bits are dropped. xattrs (including file
//   capabilities) and sparse-file maps in the tar are not applied.
// - OCI whiteouts become overlayfs ones: `.wh.<name>` → char device 0/0 `<name>`; `.wh..wh..opq`
//   → xattr trusted.overlay.opaque=y on its directory. A whiteout hides lower layers only, so an
//   entry of this same layer at that name wins over it, whichever comes first in the tar.
// - Owner ids are kept as written in the tar (uid/gid numbers, names ignored): the tiers mount the
//   layer idmapped, so image uid 0 is the sandbox's own uid, never host root.
// On any refusal this throws IMAGE_LAYER_UNSAFE naming the entry; the caller removes `dest`.
import {
  closeSync,
  constants,
  fchmodSync,
  fchownSync,
  futimesSync,
  lchownSync,
  linkSync,
  lstatSync,
  lutimesSync,
  mkdirSync,
  chmodSync,
  chownSync,
  openSync,
  symlinkSync,
  unlinkSync,
  writeSync,
  type Stats,
} from 'node:fs';
import { join } from 'node:path';
import type { Readable } from 'node:stream';
import { extract, type Header } from 'tar-stream';
import { AirlockError } from '../core/errors.js';
import { libc } from '../core/libc.privileged.js';

export const OPAQUE_XATTR = 'trusted.overlay.opaque';
const WHITEOUT = '.wh.';
const OPAQUE = '.wh..wh..opq';
const S_IFCHR = 0o020000;
/** Mode bits kept: permissions and the sticky bit; setuid (0o4000) and setgid (0o2000) are dropped. */
const MODE_KEPT = 0o1777;
const MAX_ENTRIES = 1_000_000;
const MAX_PATH = 4096;

export interface UnpackResult {
  readonly entries: number;
  /** Bytes of file content written. */
  readonly sizeBytes: number;
}

function unsafe(name: string, why: string): AirlockError {
  return new AirlockError('IMAGE_LAYER_UNSAFE', `layer entry "${name.slice(0, 300)}" ${why}`);
}

/** The components of a tar name, or a refusal: no absolute names, no `..`, no NUL. */
function components(name: string): string[] {
  if (name.length > MAX_PATH || name.includes('\0')) throw unsafe(name, 'has a NUL byte or is too long');
  if (name.startsWith('/')) throw unsafe(name, 'is an absolute path');
  const parts = name.split('/').filter((p) => p !== '' && p !== '.');
  if (parts.includes('..')) throw unsafe(name, 'has a ".." component (path traversal)');
  return parts;
}

function lstatOrUndefined(p: string): Stats | undefined {
  try {
    return lstatSync(p);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw e;
  }
}

class Unpacker {
  entries = 0;
  sizeBytes = 0;
  /** Regular files this layer wrote (relative paths): the only hard-link targets allowed. */
  private readonly files = new Set<string>();
  /** Directories with their header times, set last (making entries inside changes a dir's mtime). */
  private readonly dirTimes: Array<[string, Date]> = [];

  constructor(private readonly dest: string) {}

  /**
   * The host path of `parts`' parent, every component checked: a missing one is made (0755, root),
   * an existing one must be a real directory. Never follows a symlink.
   */
  private parent(name: string, parts: readonly string[]): string {
    let p = this.dest;
    for (const c of parts.slice(0, -1)) {
      p = join(p, c);
      const st = lstatOrUndefined(p);
      if (st === undefined) mkdirSync(p, 0o755);
      else if (st.isSymbolicLink()) throw unsafe(name, `would be written through the symlink "${c}"`);
      else if (!st.isDirectory()) throw unsafe(name, `has a parent "${c}" that is not a directory`);
    }
    return p;
  }

  /** Makes room at `path` for a new non-directory entry (a later entry of the same name replaces). */
  private clear(name: string, path: string): void {
    const st = lstatOrUndefined(path);
    if (st === undefined) return;
    if (st.isDirectory()) throw unsafe(name, 'would replace a directory of the same layer');
    unlinkSync(path); // unlink never follows a symlink
  }

  async entry(h: Header, body: AsyncIterable<Buffer>): Promise<void> {
    if (++this.entries > MAX_ENTRIES) throw unsafe(h.name, `is past ${MAX_ENTRIES} entries`);
    const parts = components(h.name);
    const base = parts[parts.length - 1];
    if (base === undefined) {
      // The layer's root ("./"): its mode and owner, like any directory.
      if (h.type === 'directory') this.dirMeta(h.name, this.dest, h);
      return;
    }
    if (base.startsWith(WHITEOUT)) return this.whiteout(h.name, parts, base);
    const path = join(this.parent(h.name, parts), base);
    const rel = parts.join('/');
    switch (h.type) {
      case 'file':
      case 'contiguous-file':
        return this.file(h, path, rel, body);
      case 'directory': {
        const st = lstatOrUndefined(path);
        if (st !== undefined && !st.isDirectory()) unlinkSync(path); // e.g. a whiteout made earlier
        if (st === undefined || !st.isDirectory()) mkdirSync(path, 0o700);
        this.dirMeta(h.name, path, h);
        return;
      }
      case 'symlink': {
        const target = h.linkname ?? '';
        if (target === '' || target.length > MAX_PATH || target.includes('\0')) {
          throw unsafe(h.name, 'is a symlink with an empty, over-long or NUL target');
        }
        this.clear(h.name, path);
        // The target is only text here: it is resolved inside the sandbox's root, never by this code.
        symlinkSync(target, path);
        lchownSync(path, h.uid ?? 0, h.gid ?? 0);
        if (h.mtime) lutimesSync(path, h.mtime, h.mtime);
        return;
      }
      case 'link':
        return this.hardlink(h, path);
      default:
        // Character and block devices, FIFOs and unknown types are skipped on purpose.
        return;
    }
  }

  private async file(h: Header, path: string, rel: string, body: AsyncIterable<Buffer>): Promise<void> {
    this.clear(h.name, path);
    const fd = openSync(
      path,
      constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW,
      0o600,
    );
    try {
      for await (const chunk of body) {
        let off = 0;
        while (off < chunk.length) off += writeSync(fd, chunk, off, chunk.length - off);
        this.sizeBytes += chunk.length;
      }
      fchownSync(fd, h.uid ?? 0, h.gid ?? 0);
      fchmodSync(fd, (h.mode ?? 0o644) & MODE_KEPT); // after chown; setuid/setgid never set
      if (h.mtime) futimesSync(fd, h.mtime, h.mtime);
    } finally {
      closeSync(fd);
    }
    this.files.add(rel);
  }

  private hardlink(h: Header, path: string): void {
    let target: string[];
    try {
      target = components(h.linkname ?? '');
    } catch (e) {
      throw unsafe(
        h.name,
        `is a hard link to "${h.linkname}": ${(e as Error).message.replace(/^layer entry "[^"]*" /, '')}`,
      );
    }
    const rel = target.join('/');
    // Only a regular file this layer already wrote: never a link to a lower layer or the host.
    if (!this.files.has(rel))
      throw unsafe(h.name, `is a hard link to "${h.linkname}", which this layer did not write before it`);
    const from = join(this.parent(h.name, target), target[target.length - 1]!);
    if (!lstatOrUndefined(from)?.isFile())
      throw unsafe(h.name, `is a hard link to "${h.linkname}", which is not a regular file`);
    this.clear(h.name, path);
    linkSync(from, path);
    this.files.add(path.slice(this.dest.length + 1));
  }

  private dirMeta(name: string, path: string, h: Header): void {
    chownSync(path, h.uid ?? 0, h.gid ?? 0);
    chmodSync(path, (h.mode ?? 0o755) & MODE_KEPT);
    if (h.mtime) this.dirTimes.push([path, h.mtime]);
    void name;
  }

  private whiteout(name: string, parts: readonly string[], base: string): void {
    if (base === OPAQUE) {
      // The directory holding the marker hides everything below it in lower layers.
      const dir = this.parent(name, [...parts.slice(0, -1), 'x']);
      const c = libc();
      const p = Buffer.from(`${dir}\0`);
      if (c.lsetxattr(p, OPAQUE_XATTR, Buffer.from('y'), 1, 0) !== 0) {
        throw new AirlockError('INTERNAL', `could not mark ${dir} opaque (errno ${c.errno()})`);
      }
      return;
    }
    const hidden = base.slice(WHITEOUT.length);
    if (hidden === '' || hidden === '.' || hidden === '..' || hidden.startsWith(WHITEOUT)) {
      throw unsafe(name, 'is a whiteout of no valid name');
    }
    const path = join(this.parent(name, parts), hidden);
    if (lstatOrUndefined(path) !== undefined) return; // this layer's own entry wins
    const c = libc();
    if (c.mknod(Buffer.from(`${path}\0`), S_IFCHR, 0) !== 0) {
      throw new AirlockError('INTERNAL', `could not make whiteout ${path} (errno ${c.errno()})`);
    }
  }

  finish(): void {
    for (const [p, t] of this.dirTimes.reverse()) lutimesSync(p, t, t);
  }
}

/**
 * Unpacks the tar stream `tar` into `dest` (an empty directory the caller made and removes on
 * failure). Resolves once the whole tar was read and written.
 */
export async function unpackLayer(tar: Readable, dest: string, signal?: AbortSignal): Promise<UnpackResult> {
  const ex = extract();
  const u = new Unpacker(dest);
  tar.on('error', (e) => ex.destroy(e));
  // A source destroyed without an error (the caller gave up on it) must end the loop below too.
  tar.on('close', () => {
    if (!tar.readableEnded) ex.destroy(new Error('the layer stream was cut off'));
  });
  tar.pipe(ex);
  try {
    for await (const entry of ex) {
      signal?.throwIfAborted();
      await u.entry(entry.header, entry as unknown as AsyncIterable<Buffer>);
      entry.resume(); // drain what a skipped entry carries
    }
  } catch (e) {
    tar.unpipe(ex);
    tar.destroy();
    ex.destroy();
    throw e;
  }
  u.finish();
  return { entries: u.entries, sizeBytes: u.sizeBytes };
}
