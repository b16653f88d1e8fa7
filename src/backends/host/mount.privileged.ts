// SECURITY-CRITICAL (privileged): host-side mount(2)/umount2(2) for sandbox filesystems, called as root
// (a direct call ~0.1 ms; spawning mount(8) ~3 ms). Only the few mount shapes Airlock needs are
// exposed; every path comes from Airlock's own state dir or a validated spec.
import {
  chmodSync,
  closeSync,
  lstatSync,
  mkdirSync,
  openSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  statfsSync,
  symlinkSync,
} from 'node:fs';
import { dirname, join } from 'node:path';
import { AirlockError } from '../../core/errors.js';
import { libc } from '../../core/libc.privileged.js';

export const MS_RDONLY = 0x1;
export const MS_NOSUID = 0x2;
export const MS_NODEV = 0x4;
export const MS_NOEXEC = 0x8;
const MS_REMOUNT = 0x20;
const MNT_DETACH = 0x2;
const UMOUNT_NOFOLLOW = 0x8;
const EINVAL = 22;
const ENOENT = 2;

function fail(what: string, errno: number): never {
  throw new AirlockError('INTERNAL', `${what} failed: errno ${errno}`);
}

/** A size-capped tmpfs: the sandbox's writable disk (its quota is the tmpfs size). */
export function mountTmpfs(target: string, sizeBytes: number, uid: number, mode = 0o700): void {
  const c = libc();
  const data = `size=${sizeBytes},nr_inodes=${Math.max(1024, Math.floor(sizeBytes / 4096))},mode=${mode.toString(8)},uid=${uid},gid=${uid}`;
  if (c.mount('airlock-disk', target, 'tmpfs', MS_NOSUID | MS_NODEV, data) !== 0)
    fail(`tmpfs mount on ${target}`, c.errno());
}

/**
 * A private devpts instance for one sandbox, capped at `max` terminals: bwrap's own devpts has no
 * cap, so one sandbox could take every pty of the host (kernel.pty.max is host-wide).
 */
export function mountDevpts(target: string, max: number): void {
  const c = libc();
  const data = `newinstance,ptmxmode=0666,mode=0620,max=${max}`;
  if (c.mount('devpts', target, 'devpts', MS_NOSUID | MS_NOEXEC, data) !== 0)
    fail(`devpts mount on ${target}`, c.errno());
}

const TMPFS_MAGIC = 0x01021994;
const LOCK_SH = 1;
const LOCK_EX = 2;
/** The runtime tmpfs holds small files and mount points only (disks are their own tmpfs mounts). */
const RUNTIME_TMPFS_BYTES = 256 * 1024 * 1024;

/**
 * Put `dir` (a state dir's `sandboxes/`: runtime state that means nothing after a reboot, since its
 * mounts, cgroups and processes are gone too) on a tmpfs, once per host: its files then never touch
 * a journaling disk, where creating and deleting them cost each sandbox about 0.7 ms of CPU (more
 * with online discard). Mounted only while the dir is empty, so nothing of an earlier run is ever
 * hidden beneath it (that run's sandboxes stay on disk until they are reaped; the next start mounts).
 * `lockFile` serialises Airlock processes sharing the dir, so two never stack two mounts. The mount
 * stays after Airlock exits (like the cgroup hierarchy): later runs use it as it is.
 */
export function ensureRuntimeTmpfs(
  dir: string,
  lockFile: string,
): { tmpfs: true } | { tmpfs: false; reason: string } {
  if (statfsSync(dir).type === TMPFS_MAGIC) return { tmpfs: true };
  try {
    return underLock(lockFile, LOCK_EX, () => {
      if (statfsSync(dir).type === TMPFS_MAGIC) return { tmpfs: true }; // mounted by another process meanwhile
      const left = readdirSync(dir).length;
      if (left > 0)
        return { tmpfs: false, reason: `${dir} still holds ${left} sandbox dir(s) of an earlier run` };
      const c = libc();
      const data = `size=${RUNTIME_TMPFS_BYTES},mode=711`;
      if (c.mount('airlock-run', dir, 'tmpfs', MS_NOSUID | MS_NODEV, data) !== 0)
        fail(`tmpfs mount on ${dir}`, c.errno());
      return { tmpfs: true };
    });
  } catch (e) {
    return { tmpfs: false, reason: (e as Error).message }; // the dirs stay on disk, as before
  }
}

/**
 * mkdir `dir` in a sandboxes dir that is still on disk, under a shared lock on `lockFile`: a runtime
 * deciding whether to mount (ensureRuntimeTmpfs, exclusive) then either sees the new dir, and leaves
 * the dir on disk, or has mounted already, and the dir is made on the tmpfs. Without the lock a dir
 * made between its emptiness check and its mount would be hidden under the tmpfs. Returns whether
 * the parent is a tmpfs by now.
 */
export function mkdirUnderRuntimeLock(dir: string, lockFile: string, mode: number): boolean {
  return underLock(lockFile, LOCK_SH, () => {
    mkdirSync(dir, { mode });
    return statfsSync(dirname(dir)).type === TMPFS_MAGIC;
  });
}

/** Run `f` holding flock(`op`) on `lockFile` (created 0600 if missing; released when it is closed). */
function underLock<T>(lockFile: string, op: number, f: () => T): T {
  const c = libc();
  const lock = openSync(lockFile, 'a', 0o600);
  try {
    if (c.flock(lock, op) !== 0) fail(`flock ${lockFile}`, c.errno());
    return f();
  } finally {
    closeSync(lock);
  }
}

/** The device nodes of every sandbox's /dev (those bwrap's own --dev binds in): name, major, minor. */
const DEV_NODES: ReadonlyArray<readonly [string, number, number]> = [
  ['null', 1, 3],
  ['zero', 1, 5],
  ['full', 1, 7],
  ['random', 1, 8],
  ['urandom', 1, 9],
  ['tty', 5, 0],
];
const DEV_LINKS: ReadonlyArray<readonly [string, string]> = [
  ['fd', '/proc/self/fd'],
  ['stdin', '/proc/self/fd/0'],
  ['stdout', '/proc/self/fd/1'],
  ['stderr', '/proc/self/fd/2'],
  ['ptmx', 'pts/ptmx'],
];
/** Mount points only: the sandbox's own devpts and its /dev/shm (on its disk) are bound over them. */
const DEV_DIRS = ['pts', 'shm'];
const S_IFCHR = 0o020000;

/**
 * The tree every sandbox's /dev is a bind of (bwrapOptions): a read-only, nosuid, noexec tmpfs at
 * `dir` holding exactly DEV_NODES, DEV_LINKS and DEV_DIRS, owned by root. bwrap's own --dev builds
 * the same tree again in every exec (a tmpfs, six binds of host device nodes, a read-only remount),
 * and bwrap reads the whole mount table again after each bind: about 1 ms of CPU per exec here. Made
 * once per state dir under `lockFile` and left mounted (like the runtime tmpfs); a runtime that
 * finds one checks it exactly (devTreeProblem) and replaces it if it differs. Any failure: the caller keeps
 * bwrap's --dev (the same nodes), so nothing depends on this succeeding.
 */
export function ensureDevTree(dir: string, lockFile: string): { ok: true } | { ok: false; reason: string } {
  try {
    return underLock(lockFile, LOCK_EX, () => {
      if (topMountAt(dir)?.includes(' - tmpfs airlock-dev ')) {
        if (!devTreeProblem(dir)) return { ok: true };
        // Not as this version makes it (another version's, or tampered with): replace it. Sandboxes
        // already running keep the tree they started with (bwrap copied it into their namespace).
        unmount(dir);
      }
      const c = libc();
      mkdirSync(dir, { recursive: true, mode: 0o755 });
      if (c.mount('airlock-dev', dir, 'tmpfs', MS_NOSUID | MS_NOEXEC, 'size=64k,nr_inodes=64,mode=755') !== 0)
        fail(`tmpfs mount on ${dir}`, c.errno());
      try {
        for (const [name, major, minor] of DEV_NODES) {
          const path = join(dir, name);
          // glibc's makedev for numbers below 256: (major << 8) | minor.
          if (c.mknod(Buffer.from(`${path}\0`), S_IFCHR | 0o666, (major << 8) | minor) !== 0)
            fail(`mknod ${path}`, c.errno());
          chmodSync(path, 0o666); // mknod's mode is narrowed by the umask
        }
        for (const [name, target] of DEV_LINKS) symlinkSync(target, join(dir, name));
        for (const name of DEV_DIRS) mkdirSync(join(dir, name), { mode: 0o755 });
        if (c.mount(null, dir, null, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NOEXEC, null) !== 0)
          fail(`read-only remount of ${dir}`, c.errno());
        const problem = devTreeProblem(dir);
        if (problem) throw new Error(problem);
      } catch (e) {
        unmount(dir);
        throw e;
      }
      return { ok: true };
    });
  } catch (e) {
    return { ok: false, reason: (e as Error).message };
  }
}

/** What is wrong with the dev tree mounted at `dir` (undefined: exactly as ensureDevTree makes it). */
export function devTreeProblem(dir: string): string | undefined {
  const line = topMountAt(dir);
  if (!line) return 'not mounted';
  const opts = line.split(' ')[5]!.split(',');
  for (const want of ['ro', 'nosuid', 'noexec']) if (!opts.includes(want)) return `not mounted ${want}`;
  const want = [...DEV_NODES.map(([n]) => n), ...DEV_LINKS.map(([n]) => n), ...DEV_DIRS].sort();
  const have = readdirSync(dir).sort();
  if (have.join('/') !== want.join('/')) return `holds ${have.join(', ')}`;
  for (const [name, major, minor] of DEV_NODES) {
    const st = lstatSync(join(dir, name));
    if (
      !st.isCharacterDevice() ||
      st.rdev !== ((major << 8) | minor) ||
      (st.mode & 0o7777) !== 0o666 ||
      st.uid !== 0
    )
      return `${name} is not device ${major},${minor} (root, 0666)`;
  }
  for (const [name, target] of DEV_LINKS) {
    if (!lstatSync(join(dir, name)).isSymbolicLink() || readlinkSync(join(dir, name)) !== target)
      return `${name} is not a symlink to ${target}`;
  }
  for (const name of DEV_DIRS) {
    const st = lstatSync(join(dir, name));
    if (!st.isDirectory() || (st.mode & 0o7777) !== 0o755 || st.uid !== 0)
      return `${name} is not a root dir 0755`;
  }
  return undefined;
}

/** `path` as /proc/self/mountinfo spells it: space, tab, newline and backslash escaped as octal. */
export function mountinfoPath(path: string): string {
  return path.replace(/[ \t\n\\]/g, (ch) => `\\${ch.charCodeAt(0).toString(8).padStart(3, '0')}`);
}

/** The /proc/self/mountinfo line of the mount on top at `dir` (the last one listed there). */
function topMountAt(dir: string): string | undefined {
  const escaped = mountinfoPath(dir);
  return readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .filter((l) => l.split(' ')[4] === escaped)
    .at(-1);
}

/** Resize a sandbox disk made by mountTmpfs (used on a pre-made, still empty disk). */
export function resizeTmpfs(target: string, sizeBytes: number): void {
  const c = libc();
  const data = `size=${sizeBytes},nr_inodes=${Math.max(1024, Math.floor(sizeBytes / 4096))}`;
  if (c.mount('airlock-disk', target, null, MS_REMOUNT | MS_NOSUID | MS_NODEV, data) !== 0) {
    fail(`tmpfs resize on ${target}`, c.errno());
  }
}

/**
 * Overlayfs over `lowers` (read-only layers, first on top). With `upper` the mount is writable and
 * every change lands in upper (on the sandbox's tmpfs); without it the mount is read-only. A
 * read-only overlay (rather than a bind) also means host sockets and FIFOs in the shared dir are
 * not connectable from the sandbox: overlay inodes are its own.
 */
export function mountOverlay(
  target: string,
  lowers: readonly string[],
  upper?: { dir: string; work: string },
): void {
  const c = libc();
  const paths = [...lowers, ...(upper ? [upper.dir, upper.work] : [])];
  for (const p of paths) {
    // overlayfs option syntax uses ',' and ':' as separators; a path holding them would change meaning.
    if (/[,:\\]/.test(p)) {
      throw new AirlockError(
        'INVALID_SPEC',
        `path "${p}" contains ',', ':' or '\\', which overlayfs cannot take`,
        {
          field: 'workspace.hostDir',
        },
      );
    }
  }
  // Explicitly without redirects, metacopy and the inode index (whatever the module defaults): an
  // upper dir then holds only plain files, dirs, symlinks, whiteouts and opaque markers, which is
  // exactly what a snapshot layer records (layer-capture.privileged.ts).
  const data =
    `lowerdir=${lowers.join(':')}${upper ? `,upperdir=${upper.dir},workdir=${upper.work}` : ''}` +
    ',redirect_dir=off,metacopy=off,index=off';
  const flags = MS_NOSUID | MS_NODEV | (upper ? 0 : MS_RDONLY);
  if (c.mount('airlock-ws', target, 'overlay', flags, data) !== 0) {
    fail(`overlay mount on ${target}`, c.errno());
  }
}

/** Detach-unmount; returns false when nothing was mounted there. */
export function unmount(target: string): boolean {
  const c = libc();
  if (c.umount2(target, MNT_DETACH | UMOUNT_NOFOLLOW) === 0) return true;
  const e = c.errno();
  if (e === EINVAL || e === ENOENT) return false;
  return fail(`umount ${target}`, e);
}

/**
 * unmount() off the event loop: a lazy umount can wait for an RCU grace period (milliseconds on a
 * busy host) while it holds the calling thread. Same result as unmount().
 */
export async function unmountAsync(target: string): Promise<boolean> {
  const r = await libc()
    .umount2Async(target, MNT_DETACH | UMOUNT_NOFOLLOW)
    .catch(() => -1); // the async call itself failed: do it here (below)
  if (r === 0) return true;
  // errno belongs to the worker thread: ask again here (nothing mounted: EINVAL/ENOENT, at once).
  return unmount(target);
}
