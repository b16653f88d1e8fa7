// SECURITY-CRITICAL (privileged): host-side mount(2)/umount2(2) for sandbox filesystems, called as root
// (a direct call ~0.1 ms; spawning mount(8) ~3 ms). Only the few mount shapes Airlock needs are
// exposed; every path comes from Airlock's own state dir or a validated spec.
import { closeSync, mkdirSync, openSync, readdirSync, statfsSync } from 'node:fs';
import { dirname } from 'node:path';
import { AirlockError } from '../../core/errors.js';
import { libc } from './libc.privileged.js';

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
