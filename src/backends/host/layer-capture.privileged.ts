// SECURITY-CRITICAL (privileged): copying a sandbox's files out into a snapshot layer, as root.
//
// The source trees (the sandbox's home, its empty-mode workspace, or an overlayfs upper dir) live on
// the sandbox's tmpfs and were written by hostile code. The caller freezes the sandbox first, so
// nothing changes while this runs; on top of that nothing is ever followed: every entry is lstat'ed
// and must be on the sandbox's own disk (same device as the tree's root), files are opened
// O_NOFOLLOW and must be the inode that was lstat'ed, symlinks are recorded as symlinks (a target is
// only text), and every write goes to a fresh directory only root can reach. Nothing is hard-linked
// to the sandbox: the layer shares no inode with anything the sandbox can still write.
//
// Layer format = overlayfs layer format, so a layer is directly usable as a read-only lower:
//   <dest>/workspace/…  <dest>/home/…   one tree per area
//   <dest>/root/…       on an image root only: the root overlay's upper dir (what the sandbox changed
//                       in /usr, /etc, /opt …), minus what Airlock itself wrote there (`exclude`:
//                       identity files, mount points), which every sandbox on the image gets anew
//   whiteout (a deletion)  char device 0/0              opaque dir  xattr trusted.overlay.opaque=y
//   owned by the sandbox → uid/gid 0 on disk (an idmapped mount maps 0 to a fork's uid)
//   owned by anyone else → 65534 on disk (unmapped in a fork: shows as nobody, like host files)
//   setuid/setgid bits are dropped; sockets and device nodes are not captured; xattrs other than
//   the opaque marker are not captured; hard links inside the tree stay hard links.
//
// The digest is sha256 over a header (format version, what the layer lies on) and one record per
// entry in byte-wise sorted path order: path, type, mode, ownership relative to the sandbox
// (self/other), symlink target, hard-link target, file bytes. Timestamps are copied but not hashed,
// so the same content gives the same digest whenever and wherever it was made.
import { createHash, type Hash } from 'node:crypto';
import {
  closeSync,
  constants,
  fchmodSync,
  fchownSync,
  fstatSync,
  futimesSync,
  lchownSync,
  linkSync,
  lstatSync,
  lutimesSync,
  mkdirSync,
  openSync,
  readSync,
  readdirSync,
  readlinkSync,
  symlinkSync,
  utimesSync,
  chmodSync,
  chownSync,
  ftruncateSync,
  writeSync,
  type Stats,
} from 'node:fs';
import { setImmediate as yieldToLoop } from 'node:timers/promises';
import { AirlockError } from '../../core/errors.js';
import { libc } from '../../core/libc.privileged.js';

export type AreaName = 'workspace' | 'home' | 'root';

/**
 * One area of the sandbox to capture. `full`: a plain directory (everything in it is the state);
 * `diff`: an overlayfs upper dir (changes over lower layers, with whiteouts and opaque dirs);
 * `none`: nothing can have changed (a read-only workspace): an empty tree.
 */
export interface CaptureSource {
  readonly area: AreaName;
  readonly kind: 'full' | 'diff' | 'none';
  readonly dir: string;
  /**
   * Paths relative to `dir` (no leading slash) left out of the layer, whatever they are (a file, a
   * dir with everything under it, a whiteout): what Airlock wrote into an image root's upper dir.
   */
  readonly exclude?: readonly string[];
}

export interface CaptureResult {
  readonly digest: string;
  readonly sizeBytes: number;
  readonly diskBytes: number;
  readonly entries: number;
}

export const LAYER_FORMAT = 'airlock-layer/v1';
/** On-disk owner of what the sandbox owned (mapped to each fork's uid by an idmapped mount). */
export const LAYER_SELF_ID = 0;
/** On-disk owner of anything else (left unmapped: a fork sees nobody, as for foreign host files). */
export const LAYER_OTHER_ID = 65534;
export const OPAQUE_XATTR = 'trusted.overlay.opaque';

const S_IFCHR = 0o020000;
const S_IFIFO = 0o010000;
const KEPT_MODE_BITS = 0o1777; // no setuid/setgid in a layer (they grant nothing in a sandbox anyway)
const CHUNK = 1024 * 1024;
const HOLE_BLOCK = 64 * 1024;
const YIELD_EVERY = 256;

interface Walk {
  readonly hash: Hash;
  readonly selfUid: number;
  readonly checkpoint: () => void;
  readonly maxContentBytes: number;
  readonly buf: Buffer;
  readonly links: Map<string, Buffer>; // "dev:ino" of a multiply-linked file → its first layer path (rel)
  dev: number;
  /** Layer paths (`<area>/<rel>`, latin1: byte-exact) not captured. */
  exclude: Set<string>;
  destRoot: Buffer;
  sizeBytes: number;
  diskBytes: number;
  entries: number;
  sinceYield: number;
}

/**
 * Copy `sources` into `dest` (an existing, empty, root-only directory) and return the layer's
 * digest. `checkpoint` is called between entries and chunks and throws to abort (e.g. the sandbox is
 * being killed). `maxContentBytes` caps the file bytes copied (sparse files count at their apparent
 * size): beyond it the capture fails with DISK_FULL.
 */
export async function captureLayer(o: {
  readonly sources: readonly CaptureSource[];
  readonly dest: string;
  readonly selfUid: number;
  readonly header: string;
  readonly checkpoint: () => void;
  readonly maxContentBytes: number;
}): Promise<CaptureResult> {
  const w: Walk = {
    hash: createHash('sha256'),
    selfUid: o.selfUid,
    checkpoint: o.checkpoint,
    maxContentBytes: o.maxContentBytes,
    buf: Buffer.allocUnsafe(CHUNK),
    links: new Map(),
    dev: -1,
    exclude: new Set(),
    destRoot: Buffer.from(o.dest),
    sizeBytes: 0,
    diskBytes: 0,
    entries: 0,
    sinceYield: 0,
  };
  record(w, 'H', LAYER_FORMAT, o.header);
  for (const src of [...o.sources].sort((a, b) => (a.area < b.area ? -1 : 1))) {
    const rel = Buffer.from(src.area);
    const dst = Buffer.concat([w.destRoot, Buffer.from('/'), rel]);
    if (src.kind === 'none') {
      mkdirSync(dst, { mode: 0o755 });
      chownSync(dst, LAYER_SELF_ID, LAYER_SELF_ID);
      chmodSync(dst, 0o755);
      record(w, 'd', rel, '755', 'ss', '0');
      w.entries++;
      continue;
    }
    const srcPath = Buffer.from(src.dir);
    const st = lstatSync(srcPath);
    if (!st.isDirectory())
      throw new AirlockError('INTERNAL', `snapshot source ${src.dir} is not a directory`);
    w.dev = st.dev;
    w.exclude = new Set((src.exclude ?? []).map((p) => `${src.area}/${p}`));
    await copyDir(w, srcPath, dst, rel, st, src.kind === 'diff');
  }
  return {
    digest: `sha256:${w.hash.digest('hex')}`,
    sizeBytes: w.sizeBytes,
    diskBytes: w.diskBytes,
    entries: w.entries,
  };
}

/** Length-prefixed fields: no two different entry lists hash the same byte stream. */
function record(w: Walk, type: string, ...fields: Array<string | Buffer>): void {
  for (const f of [type, ...fields]) field(w.hash, typeof f === 'string' ? Buffer.from(f) : f);
}

function field(h: Hash, b: Buffer): void {
  const len = Buffer.allocUnsafe(8);
  len.writeBigUInt64BE(BigInt(b.length));
  h.update(len);
  h.update(b);
}

const join = (a: Buffer, name: Buffer): Buffer => Buffer.concat([a, Buffer.from('/'), name]);

const modeOf = (st: Stats): number => st.mode & KEPT_MODE_BITS;

/** Ownership relative to the sandbox: `s` (the sandbox's own uid/gid) or `o` (anyone else). */
function ownerTag(w: Walk, st: Stats): string {
  return (st.uid === w.selfUid ? 's' : 'o') + (st.gid === w.selfUid ? 's' : 'o');
}

function diskIds(tag: string): [number, number] {
  return [tag[0] === 's' ? LAYER_SELF_ID : LAYER_OTHER_ID, tag[1] === 's' ? LAYER_SELF_ID : LAYER_OTHER_ID];
}

function fail(what: string, rel: Buffer, cause?: unknown): never {
  if (AirlockError.isInstance(cause)) throw cause;
  const code = (cause as NodeJS.ErrnoException | undefined)?.code;
  throw new AirlockError(
    'INTERNAL',
    `snapshot failed: ${what} ${rel.toString('utf8')}${code ? ` (${code})` : ''}`,
    cause === undefined ? {} : { cause },
  );
}

async function step(w: Walk): Promise<void> {
  w.checkpoint();
  if (++w.sinceYield >= YIELD_EVERY) {
    w.sinceYield = 0;
    await yieldToLoop(); // a big tree must not stall every other sandbox's I/O in this process
  }
}

function isOpaque(path: Buffer): boolean {
  const value = Buffer.alloc(8);
  const n = libc().lgetxattr(Buffer.concat([path, Buffer.from([0])]), OPAQUE_XATTR, value, value.length);
  return n === 1 && value[0] === 0x79; // 'y'
}

async function copyDir(
  w: Walk,
  src: Buffer,
  dst: Buffer,
  rel: Buffer,
  st: Stats,
  diff: boolean,
): Promise<void> {
  if (st.dev !== w.dev) fail('refusing to cross into another filesystem at', rel);
  mkdirSync(dst, { mode: 0o700 });
  const opaque = diff && isOpaque(src);
  const tag = ownerTag(w, st);
  record(w, 'd', rel, modeOf(st).toString(8), tag, opaque ? '1' : '0');
  w.entries++;
  let names: Buffer[];
  try {
    names = readdirSync(src, { encoding: 'buffer' }).sort(Buffer.compare);
  } catch (e) {
    return fail('could not list', rel, e);
  }
  for (const name of names) {
    await step(w);
    const s = join(src, name);
    const d = join(dst, name);
    const r = join(rel, name);
    // latin1 maps bytes to chars one to one: a name of any bytes matches only its exact path.
    if (w.exclude.has(r.toString('latin1'))) continue;
    let cst: Stats;
    try {
      cst = lstatSync(s);
    } catch (e) {
      fail('could not stat', r, e);
    }
    if (cst.dev !== w.dev) fail('refusing to cross into another filesystem at', r);
    try {
      if (cst.isDirectory()) await copyDir(w, s, d, r, cst, diff);
      else if (cst.isFile()) await copyFile(w, s, d, r, cst);
      else if (cst.isSymbolicLink()) copySymlink(w, s, d, r, cst);
      else if (cst.isFIFO()) makeNode(w, d, r, cst, S_IFIFO | modeOf(cst), 'p');
      else if (cst.isCharacterDevice() && cst.rdev === 0 && diff) makeNode(w, d, r, cst, S_IFCHR, 'w');
      // Sockets, device nodes (and a 0/0 node in a plain tree, which a layer cannot tell from a
      // deletion) are not captured.
    } catch (e) {
      fail('could not copy', r, e);
    }
  }
  const [uid, gid] = diskIds(tag);
  chownSync(dst, uid, gid);
  chmodSync(dst, modeOf(st));
  if (opaque) {
    const y = Buffer.from('y');
    const rc = libc().lsetxattr(Buffer.concat([dst, Buffer.from([0])]), OPAQUE_XATTR, y, 1, 0);
    if (rc !== 0) fail(`could not mark opaque (errno ${libc().errno()})`, rel);
  }
  utimesSync(dst, st.atime, st.mtime); // after its entries were made, which touch it
  w.diskBytes += lstatSync(dst).blocks * 512;
}

async function copyFile(w: Walk, src: Buffer, dst: Buffer, rel: Buffer, st: Stats): Promise<void> {
  const key = `${st.dev}:${st.ino}`;
  if (st.nlink > 1) {
    const first = w.links.get(key);
    if (first !== undefined) {
      linkSync(join(w.destRoot, first), dst); // a link inside the layer, to the layer's own copy
      record(w, 'h', rel, first);
      w.entries++;
      return;
    }
    w.links.set(key, rel);
  }
  w.sizeBytes += st.size;
  if (w.sizeBytes > w.maxContentBytes) {
    throw new AirlockError(
      'DISK_FULL',
      `snapshot stopped at ${rel.toString('utf8')}: more than ${w.maxContentBytes} bytes of file content ` +
        '(the sandbox disk size; sparse files count at their apparent size)',
    );
  }
  const tag = ownerTag(w, st);
  record(w, 'f', rel, modeOf(st).toString(8), tag, String(st.size));
  w.entries++;
  const inFd = openSync(
    src,
    constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK | constants.O_NOCTTY,
  );
  let outFd = -1;
  try {
    const fst = fstatSync(inFd);
    if (!fst.isFile() || fst.ino !== st.ino || fst.dev !== st.dev) fail('file changed while copying:', rel);
    outFd = openSync(
      dst,
      constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW,
      0o600,
    );
    let pos = 0;
    for (;;) {
      const n = readSync(inFd, w.buf, 0, CHUNK, pos);
      if (n === 0) break;
      if (pos + n > st.size) fail('file grew while copying:', rel);
      const chunk = w.buf.subarray(0, n);
      w.hash.update(chunk);
      // All-zero blocks are left as holes: a sparse file stays sparse in the layer.
      for (let off = 0; off < n; off += HOLE_BLOCK) {
        const block = chunk.subarray(off, Math.min(n, off + HOLE_BLOCK));
        if (!isZero(block)) writeSync(outFd, block, 0, block.length, pos + off);
      }
      pos += n;
      if (n === CHUNK) await step(w);
    }
    if (pos !== st.size) fail('file shrank while copying:', rel);
    ftruncateSync(outFd, st.size);
    const [uid, gid] = diskIds(tag);
    fchownSync(outFd, uid, gid);
    fchmodSync(outFd, modeOf(st)); // after chown, which clears setuid bits anyway
    futimesSync(outFd, st.atime, st.mtime);
    w.diskBytes += fstatSync(outFd).blocks * 512;
  } finally {
    closeSync(inFd);
    if (outFd >= 0) closeSync(outFd);
  }
}

const ZEROS = Buffer.alloc(HOLE_BLOCK);

function isZero(b: Buffer): boolean {
  return b.equals(ZEROS.subarray(0, b.length));
}

function copySymlink(w: Walk, src: Buffer, dst: Buffer, rel: Buffer, st: Stats): void {
  const target = readlinkSync(src, { encoding: 'buffer' });
  const tag = ownerTag(w, st);
  record(w, 'l', rel, tag, target);
  w.entries++;
  symlinkSync(target, dst);
  const [uid, gid] = diskIds(tag);
  lchownSync(dst, uid, gid);
  lutimesSync(dst, st.atime, st.mtime);
}

/** A FIFO (`p`) or a whiteout (`w`, char 0/0: the path was deleted in the sandbox). */
function makeNode(w: Walk, dst: Buffer, rel: Buffer, st: Stats, mode: number, type: 'p' | 'w'): void {
  if (type === 'w') record(w, 'w', rel);
  else record(w, 'p', rel, modeOf(st).toString(8), ownerTag(w, st));
  w.entries++;
  const c = libc();
  if (c.mknod(Buffer.concat([dst, Buffer.from([0])]), mode, 0) !== 0)
    fail(`mknod failed (errno ${c.errno()}) for`, rel);
  if (type === 'p') {
    const [uid, gid] = diskIds(ownerTag(w, st));
    lchownSync(dst, uid, gid);
    chmodSync(dst, modeOf(st));
    utimesSync(dst, st.atime, st.mtime);
  }
}
