// SECURITY-CRITICAL (privileged): a sandbox's root filesystem made of an image's layers.
//
//   <sandboxDir>/img-<i>   idmapped, read-only, nosuid, nodev views of the unpacked layers (top first):
//                          the image user's uid/gid → the sandbox's host uid, every other owner shows
//                          as nobody (root-owned files stay read-only for the sandbox, as the host's
//                          /usr is on a host root)
//   <disk>/root            the overlay's upper dir, on the sandbox's size-capped tmpfs disk: every
//                          write to /usr, /etc … lands here, counts against limits.diskBytes, and
//                          vanishes with the sandbox. Layers are never written.
//   <sandboxDir>/root      the overlay (nosuid, nodev): what the tier shows as "/".
//
// What Airlock writes into the upper dir before the overlay is mounted (it wins over the image):
//   /etc/passwd, /etc/group   the image's entries, minus any at uid/gid 1000 or with the image user's
//                             name, plus the sandbox user (the image user's name, uid/gid 1000, home
//                             /home/user); root and nobody are added if the image lacks them
//   /etc/hosts, /etc/hostname, /etc/resolv.conf   Airlock's (the sandbox's network is Airlock's)
//   /etc/nsswitch.conf        only where the image has none
//   /etc/ssl/certs/ca-certificates.crt   the host's public CA bundle, where the image has no such
//                             plain file (none, or a symlink)
//   mount points              /proc /dev /sys /tmp /home/user /workspace /.airlock/bin/busybox, the
//                             egress CA file, and every read-only mount's target: always real dirs
//                             and files of the upper, so a symlink in an image can never redirect a
//                             mount made by bwrap or runsc (they would follow it outside the root).
// Files of the image are read on the host only through lstat/O_NOFOLLOW walks of the layer dirs
// (findInImage): an image's symlinks are never followed on the host.
import { createHash } from 'node:crypto';
import {
  chmodSync,
  chownSync,
  closeSync,
  constants,
  copyFileSync,
  existsSync,
  lstatSync,
  mkdirSync,
  openSync,
  readdirSync,
  readFileSync,
  renameSync,
  rmSync,
  writeFileSync,
  type Stats,
} from 'node:fs';
import { dirname, join } from 'node:path';
import { AirlockError } from '../../core/errors.js';
import type { Rootfs } from '../../core/spec.js';
import { libc } from '../../core/libc.privileged.js';
import { mappingUserns, mountIdmappedAll } from './idmap.privileged.js';
import { LAYER_OTHER_ID, LAYER_SELF_ID, OPAQUE_XATTR } from './layer-capture.privileged.js';
import { mountOverlay } from './mount.privileged.js';
import { SANDBOX_HOME, SANDBOX_HOSTNAME, SANDBOX_UID } from './rootfs.js';
import { mkOwned } from './workspace.js';

import { IMAGE_HELPER_PATH } from './layout.js';
const HOST_CA_BUNDLE = '/etc/ssl/certs/ca-certificates.crt';
/** Mount points every tier binds over (their dirs made in the upper). */
const MOUNT_DIRS = ['proc', 'dev/shm', 'dev/pts', 'sys', 'tmp', 'home/user', 'workspace', '.airlock/bin'];
/** Mount points that are files. */
const MOUNT_FILES = [
  IMAGE_HELPER_PATH.slice(1),
  'etc/ssl/certs/airlock-egress-ca.pem',
  'etc/ssl/certs/ca-certificates.crt',
];
const MAX_ETC_FILE_BYTES = 1024 * 1024;
const NOBODY = 65534;

/** Who the image's processes run as, resolved from its config's `user` and its /etc/passwd. */
export interface ImageUser {
  readonly name: string;
  /** The image's uid and gid of that user: files it owns in the layers are the sandbox user's. */
  readonly uid: number;
  readonly gid: number;
}

export interface ImageRoot {
  /** The overlay mount: the sandbox's "/". */
  readonly dir: string;
  readonly user: ImageUser;
  /** The upper dir (the sandbox's changes to its root: what a snapshot of it captures). */
  readonly upper: string;
  /**
   * Paths in the upper (relative, no leading slash) that Airlock wrote or that are mount points: a
   * snapshot leaves them out, since every sandbox on the image gets its own (see the header).
   */
  readonly generated: readonly string[];
}

/**
 * The host path of `rel` (no leading slash) in the merged view of `layers` (bottom first), as
 * overlayfs would show it, without following any symlink: undefined where it is absent, deleted by a
 * whiteout, hidden by an opaque dir, or under a component that is not a directory.
 */
export function findInImage(layers: readonly string[], rel: string): { path: string; st: Stats } | undefined {
  const parts = rel.split('/').filter((p) => p !== '' && p !== '.');
  if (parts.some((p) => p === '..')) return undefined;
  for (let l = layers.length - 1; l >= 0; l--) {
    let opaque = false;
    let missing = false;
    for (let i = 0; i < parts.length; i++) {
      const p = join(layers[l]!, ...parts.slice(0, i + 1));
      let st: Stats;
      try {
        st = lstatSync(p);
      } catch {
        missing = true;
        break;
      }
      if (st.isCharacterDevice() && st.rdev === 0) return undefined; // whiteout
      if (i === parts.length - 1) return { path: p, st };
      if (!st.isDirectory()) return undefined;
      if (isOpaque(p)) opaque = true;
    }
    if (!missing) return undefined;
    if (opaque) return undefined; // an opaque dir on the way hides the layers below
  }
  return undefined;
}

function isOpaque(path: string): boolean {
  const value = Buffer.alloc(8);
  const n = libc().lgetxattr(Buffer.from(`${path}\0`), OPAQUE_XATTR, value, value.length);
  return n === 1 && value[0] === 0x79; // 'y'
}

/** A regular file of the image (never through a symlink), or undefined. */
function readImageFile(layers: readonly string[], rel: string): string | undefined {
  const f = findInImage(layers, rel);
  if (!f || !f.st.isFile() || f.st.size > MAX_ETC_FILE_BYTES) return undefined;
  const fd = openSync(f.path, constants.O_RDONLY | constants.O_NOFOLLOW);
  try {
    return readFileSync(fd, 'utf8');
  } finally {
    closeSync(fd);
  }
}

const ID_RE = /^\d{1,10}$/;

/** The image config's `user` (`name`, `uid`, `uid:gid`, `name:group`) → the image user. */
export function resolveImageUser(layers: readonly string[], user: string): ImageUser {
  const [u = '', g] = user.split(':', 2);
  const passwd = parseDb(readImageFile(layers, 'etc/passwd') ?? '');
  const bad = (what: string): never => {
    throw new AirlockError(
      'INVALID_SPEC',
      `image user "${user}": ${what}; the image's config must name a user of its /etc/passwd or a numeric uid`,
      { field: 'image' },
    );
  };
  let name: string;
  let uid: number;
  let gid: number;
  if (u === '' || u === 'root') {
    [name, uid, gid] = ['root', 0, 0];
  } else if (ID_RE.test(u)) {
    uid = Number(u);
    const entry = passwd.find((e) => e[2] === u);
    name = entry?.[0] ?? 'user';
    gid = entry && ID_RE.test(entry[3] ?? '') ? Number(entry[3]) : uid;
  } else {
    const entry = passwd.find((e) => e[0] === u);
    if (!entry || !ID_RE.test(entry[2] ?? '') || !ID_RE.test(entry[3] ?? ''))
      bad("not in the image's /etc/passwd");
    [name, uid, gid] = [u, Number(entry![2]), Number(entry![3])];
  }
  if (g !== undefined && g !== '') {
    if (ID_RE.test(g)) gid = Number(g);
    else {
      const group = parseDb(readImageFile(layers, 'etc/group') ?? '').find((e) => e[0] === g);
      if (!group || !ID_RE.test(group[2] ?? '')) bad(`group "${g}" is not in the image's /etc/group`);
      gid = Number(group![2]);
    }
  }
  if (uid > 0xfffffffe || gid > 0xfffffffe) bad('uid or gid out of range');
  if (!/^[A-Za-z_][A-Za-z0-9_.-]{0,31}$/.test(name)) name = 'user';
  return { name, uid, gid };
}

function parseDb(text: string): string[][] {
  return text
    .split('\n')
    .filter((l) => l !== '' && !l.startsWith('#'))
    .map((l) => l.split(':'));
}

/** /etc/passwd and /etc/group of a sandbox on this image (see the header). */
function identityFiles(layers: readonly string[], user: ImageUser): { passwd: string; group: string } {
  const keep = (text: string, self: (e: string[]) => boolean): string[] =>
    parseDb(text)
      .filter((e) => !self(e))
      .map((e) => e.join(':'));
  const sid = String(SANDBOX_UID);
  // The sandbox user stands in for the image's user; for an image that runs as root it is not root
  // (uid 1000), so it is not called root either.
  const name = user.uid === 0 ? 'user' : user.name;
  const passwd = keep(readImageFile(layers, 'etc/passwd') ?? '', (e) => e[0] === name || e[2] === sid);
  const group = keep(readImageFile(layers, 'etc/group') ?? '', (e) => e[0] === name || e[2] === sid);
  const shell = findInImage(layers, 'bin/sh') ? '/bin/sh' : '/sbin/nologin';
  if (!passwd.some((l) => l.startsWith('root:'))) passwd.unshift('root:x:0:0:root:/root:/sbin/nologin');
  if (!passwd.some((l) => l.startsWith('nobody:')))
    passwd.push('nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin');
  if (!group.some((l) => l.startsWith('root:'))) group.unshift('root:x:0:');
  passwd.push(`${name}:x:${sid}:${sid}:sandbox user:${SANDBOX_HOME}:${shell}`);
  group.push(`${name}:x:${sid}:`);
  return { passwd: passwd.join('\n') + '\n', group: group.join('\n') + '\n' };
}

/** Write `content` at `rel` in the upper dir (parents made root-owned 0755), mode 0644, owner root. */
function put(upper: string, rel: string, content: string | Buffer): void {
  const p = join(upper, rel);
  mkdirSync(dirname(p), { recursive: true, mode: 0o755 });
  writeFileSync(p, content, { mode: 0o644, flag: 'w' });
}

export interface ImageRootRequest {
  readonly rootfs: Rootfs;
  /** The sandbox's host dir (mount points of the layer views and the overlay). */
  readonly dir: string;
  /** Its tmpfs disk (upper and work dirs). */
  readonly disk: string;
  readonly hostUid: number;
  /** Paths inside the sandbox of read-only mounts (their targets are made in the upper). */
  readonly mountTargets: ReadonlyArray<{ readonly path: string; readonly file: boolean }>;
  /**
   * A template or snapshot built on this image: the `root/` trees of its layers (host dirs, TOP
   * first, in the layer store's format: owner 0 = the sandbox, 65534 = anyone else). They lie above
   * the image's layers, below the sandbox's upper. A layer without a `root/` tree is skipped.
   */
  readonly snapshotRoots?: readonly string[];
  /**
   * A mappingUserns(0 → hostUid) fd made ahead in the warm slot (consumed, whatever happens): the
   * very mapping the layer views need when the image user is root, so none is made now; otherwise
   * it is closed unused.
   */
  readonly rootUserns?: number;
}

/** Mount the image root of one sandbox (see the header). The caller's cleanup unmounts on failure. */
export async function mountImageRoot(r: ImageRootRequest): Promise<ImageRoot> {
  let ahead = r.rootUserns;
  try {
    return await mountRoot(r, () => {
      const fd = ahead;
      ahead = undefined;
      return fd;
    });
  } finally {
    if (ahead !== undefined) closeSync(ahead);
  }
}

async function mountRoot(r: ImageRootRequest, takeAhead: () => number | undefined): Promise<ImageRoot> {
  const layers = r.rootfs.layers;
  for (const [i, l] of layers.entries()) {
    let st: Stats | undefined;
    try {
      st = lstatSync(l);
    } catch {
      st = undefined;
    }
    if (!st?.isDirectory()) {
      throw new AirlockError('INVALID_SPEC', `rootfs.layers.${i}: ${l} is not an unpacked layer dir`, {
        field: `rootfs.layers.${i}`,
      });
    }
  }
  const user = resolveImageUser(layers, r.rootfs.config.user);
  // Layer views, top first (overlayfs takes its lowers top first).
  const views = [...layers].reverse().map((source, i) => ({ source, target: join(r.dir, `img-${i}`) }));
  for (const v of views) mkdirSync(v.target, { mode: 0o755 });
  const snaps = (r.snapshotRoots ?? [])
    .filter((d) => lstatSync(d, { throwIfNoEntry: false })?.isDirectory() === true)
    .map((source, i) => ({ source, target: join(r.dir, `imgsnap-${i}`) }));
  for (const v of snaps) mkdirSync(v.target, { mode: 0o755 });
  if (snaps.length) {
    // Snapshot layers keep the sandbox's files at owner 0 and everything else at 65534, which maps
    // to the host's nobody here (as the image's root does below): copy-up needs a mapped owner.
    const fd = await mappingUserns(LAYER_SELF_ID, LAYER_SELF_ID, r.hostUid, [[LAYER_OTHER_ID, NOBODY]]);
    const bad = await mountIdmappedAll(
      snaps,
      { uid: LAYER_SELF_ID, gid: LAYER_SELF_ID },
      r.hostUid,
      true,
      fd,
    );
    if (bad !== undefined)
      throw new AirlockError(
        'BACKEND_UNAVAILABLE',
        `could not mount the snapshot layer ${bad} of an image root`,
      );
  }
  // What the sandbox sees of the image before its own upper: the snapshot trees above the image's.
  const merged = [...layers, ...[...(r.snapshotRoots ?? [])].reverse()];
  const isSnap = (p: string): boolean => (r.snapshotRoots ?? []).some((d) => p.startsWith(`${d}/`));
  // The image's root (when it is not the image user) → the host's nobody: a root-owned dir then has a
  // valid owner, so overlayfs can copy it up when the sandbox writes below it (else EOVERFLOW).
  const extra: Array<[number, number]> = user.uid !== 0 && user.gid !== 0 ? [[0, NOBODY]] : [];
  // An image that runs as root needs 0 → hostUid and nothing else: the slot's fd made ahead is that.
  const prepared = user.uid === 0 && user.gid === 0 ? takeAhead() : undefined;
  const usernsFd = prepared ?? (await mappingUserns(user.uid, user.gid, r.hostUid, extra));
  const failed = await mountIdmappedAll(views, { uid: user.uid, gid: user.gid }, r.hostUid, true, usernsFd);
  if (failed !== undefined) {
    throw new AirlockError(
      'BACKEND_UNAVAILABLE',
      `sandboxes on an image need idmapped mounts of its layers (Linux ≥ 5.12 and a filesystem that supports them): ${failed}`,
    );
  }
  // "/" is root's (shown as nobody), even on an image that runs as root: the sandbox can change what
  // its image user owns, but never rename or replace the mount points at the top of its root.
  const upper = mkOwned(join(r.disk, 'root'), 0, 0o755);
  const work = mkOwned(join(r.disk, 'root-work'), 0, 0o700);
  const ids = identityFiles(layers, user);
  put(upper, 'etc/passwd', ids.passwd);
  put(upper, 'etc/group', ids.group);
  put(upper, 'etc/hostname', `${SANDBOX_HOSTNAME}\n`);
  put(
    upper,
    'etc/hosts',
    `127.0.0.1\tlocalhost ${SANDBOX_HOSTNAME}\n::1\tlocalhost ip6-localhost ip6-loopback\n`,
  );
  put(upper, 'etc/resolv.conf', 'nameserver 127.0.0.1\noptions timeout:1 attempts:1\n');
  const hasNsswitch = findInImage(merged, 'etc/nsswitch.conf') !== undefined;
  if (!hasNsswitch) put(upper, 'etc/nsswitch.conf', 'passwd: files\ngroup: files\nhosts: files dns\n');
  // The image's own bundle if it is a plain file; one that is a symlink (or none) is replaced by the
  // host's, so that the egress CA bundle can always be bound onto a real file (a bind onto a symlink
  // would follow it outside the sandbox's root while bwrap or runsc sets the root up).
  // (Over the snapshot trees too: a step may have replaced the bundle with a symlink.)
  const hasBundle = findInImage(merged, MOUNT_FILES[2]!)?.st.isFile() === true;
  for (const d of MOUNT_DIRS) mkdirSync(join(upper, d), { recursive: true, mode: 0o755 });
  for (const m of r.mountTargets) {
    const p = join(upper, m.path);
    if (!p.startsWith(upper + '/')) continue;
    mkdirSync(m.file ? dirname(p) : p, { recursive: true, mode: 0o755 });
    if (m.file && !existsSync(p)) writeFileSync(p, '', { mode: 0o444 });
  }
  for (const f of MOUNT_FILES) {
    if (f === MOUNT_FILES[2] && hasBundle) continue;
    put(upper, f, '');
  }
  if (!hasBundle && existsSync(HOST_CA_BUNDLE)) copyFileSync(HOST_CA_BUNDLE, join(upper, MOUNT_FILES[2]!));
  // The image's working dir exists (a process starts there), the sandbox user's where Airlock made it.
  const wd = r.rootfs.config.workingDir;
  if (wd !== '' && wd !== '/' && !findInImage(merged, wd.slice(1))?.st.isDirectory()) {
    const p = join(upper, wd);
    if (p.startsWith(upper + '/')) {
      mkdirSync(p, { recursive: true, mode: 0o755 });
      chownSync(p, r.hostUid, r.hostUid);
    }
  }
  matchImageDirs(
    upper,
    '',
    merged,
    (st, p) =>
      isSnap(p)
        ? [st.uid === LAYER_SELF_ID, st.gid === LAYER_SELF_ID]
        : [st.uid === user.uid, st.gid === user.gid],
    r.hostUid,
  );
  const dir = join(r.dir, 'root');
  mkdirSync(dir, { mode: 0o755 });
  mountOverlay(
    dir,
    [...snaps, ...views].map((v) => v.target),
    { dir: upper, work },
  );
  const generated = [
    'etc/passwd',
    'etc/group',
    'etc/hostname',
    'etc/hosts',
    'etc/resolv.conf',
    ...(hasNsswitch ? [] : ['etc/nsswitch.conf']),
    ...MOUNT_DIRS.map((d) => d.split('/')[0]!).filter((d) => d !== 'home'),
    'home/user',
    ...MOUNT_FILES.filter((f) => f !== MOUNT_FILES[2] || !hasBundle),
    ...r.mountTargets.map((m) => m.path.replace(/^\/+/, '')),
  ];
  return { dir, user, upper, generated: [...new Set(generated)] };
}

/**
 * The dirs Airlock made in the upper that the image also has take the image's mode and owner (as the
 * layer views show it: the image user's → the sandbox's host uid, any other → root), since overlayfs
 * shows a merged dir with the upper's attributes.
 */
function matchImageDirs(
  upper: string,
  rel: string,
  layers: readonly string[],
  /** Whether the uid and gid of an entry (at that host path) are the image user's. */
  own: (st: Stats, path: string) => [boolean, boolean],
  hostUid: number,
): void {
  for (const name of readdirSync(join(upper, rel))) {
    const r = rel ? `${rel}/${name}` : name;
    const p = join(upper, r);
    if (!lstatSync(p).isDirectory()) continue;
    const img = findInImage(layers, r);
    if (img?.st.isDirectory()) {
      const [u, g] = own(img.st, img.path);
      chownSync(p, u ? hostUid : 0, g ? hostUid : 0);
      chmodSync(p, img.st.mode & 0o1777);
    }
    matchImageDirs(upper, r, layers, own, hostUid);
  }
}

/**
 * A copy of the host's static busybox under `stateRoot` (made once per content), bound read-only at
 * IMAGE_HELPER_PATH into sandboxes on an image root: Airlock's own in-sandbox helpers (the exec
 * check, sbx.files) then run on any image, one without a shell included. Undefined (with the reason)
 * where the host has no static busybox.
 */
export function ensureImageHelper(
  stateRoot: string,
  source = '/bin/busybox',
): { path: string } | { path?: undefined; reason: string } {
  let bin: Buffer;
  try {
    bin = readFileSync(source);
  } catch {
    return { reason: `${source} not found: apt-get install busybox-static` };
  }
  if (!isStaticElf(bin))
    return { reason: `${source} is not statically linked: apt-get install busybox-static` };
  const dir = join(stateRoot, `helper-${createHash('sha256').update(bin).digest('hex').slice(0, 16)}`);
  const path = join(dir, 'busybox');
  if (existsSync(path)) return { path };
  const tmp = `${dir}.tmp-${process.pid}`;
  rmSync(tmp, { recursive: true, force: true });
  mkdirSync(tmp, { mode: 0o755 });
  writeFileSync(join(tmp, 'busybox'), bin, { mode: 0o755 });
  chmodSync(join(tmp, 'busybox'), 0o755);
  try {
    renameSync(tmp, dir);
  } catch (e) {
    rmSync(tmp, { recursive: true, force: true });
    if (!existsSync(path)) throw e;
  }
  return { path };
}

/** An x86-64/aarch64 ELF executable without a PT_INTERP program header (needs no dynamic loader). */
function isStaticElf(b: Buffer): boolean {
  if (b.length < 64 || b.readUInt32BE(0) !== 0x7f454c46 || b[4] !== 2) return false; // ELF64
  const phoff = Number(b.readBigUInt64LE(32));
  const phentsize = b.readUInt16LE(54);
  const phnum = b.readUInt16LE(56);
  for (let i = 0; i < phnum; i++) {
    const off = phoff + i * phentsize;
    if (off + 4 > b.length) return false;
    if (b.readUInt32LE(off) === 3) return false; // PT_INTERP
  }
  return true;
}
