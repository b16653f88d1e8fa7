// SECURITY-CRITICAL (privileged): an idmapped view of the caller's workspace dir, so the sandbox's
// uid owns the files it was given (otherwise a root- or user-owned project would be read-only for
// it). The kernel's idmapped mounts (open_tree + mount_setattr(MOUNT_ATTR_IDMAP) + move_mount)
// shift ownership in the *view* only: nothing on disk changes, and the mapping covers exactly one
// uid and one gid (the directory's owner → the sandbox's host uid). Other owners appear as nobody.
// Snapshot layers are shown to their forks the same way (layer owner 0 → the fork's host uid).
import { closeSync, openSync, writeFileSync } from 'node:fs';
import type { Socket } from 'node:net';
import { AirlockError } from '../../core/errors.js';
import { libc } from '../../core/libc.privileged.js';
import { killAndReap, spawnDirect } from './spawn.privileged.js';
import { usernsHelper } from './userns.privileged.js';

const OPEN_TREE_CLONE = 1;
const OPEN_TREE_CLOEXEC = 0o2000000;
const AT_EMPTY_PATH = 0x1000;
const AT_FDCWD = -100;
const MOVE_MOUNT_F_EMPTY_PATH = 0x4;
const MOUNT_ATTR_RDONLY = 0x1;
const MOUNT_ATTR_NOSUID = 0x2;
const MOUNT_ATTR_NODEV = 0x4;
const MOUNT_ATTR_IDMAP = 0x100000;
/** How long the helper may take to reach its new user namespace. */
const HELPER_WAIT_MS = 5000;

/**
 * A user namespace whose only mapping is `owner → hostUid` (uid and gid), held by a short-lived
 * process; returns an fd to it. The process is killed right after the fd is opened. It is a child
 * forked by the user namespace helper (userns.privileged.ts), or where that cannot run, an exec'd
 * `unshare`.
 */
export async function mappingUserns(
  ownerUid: number,
  ownerGid: number,
  hostUid: number,
  /** More single-id mappings (uid and gid alike): [id in the view's source, host id]. */
  extra: ReadonlyArray<readonly [number, number]> = [],
): Promise<number> {
  const helper = usernsHelper();
  if (helper) {
    let pid: number | undefined;
    try {
      pid = await helper.fork();
    } catch {
      // the helper failed (it is restarted or given up on): this one comes from unshare
    }
    if (pid !== undefined) {
      try {
        return openMapped(pid, ownerUid, ownerGid, hostUid, extra);
      } finally {
        helper.release(pid);
      }
    }
  }
  return unshareUserns(ownerUid, ownerGid, hostUid, extra);
}

/** Map the (still unmapped) user namespace of `pid` and open it. */
function openMapped(
  pid: number,
  ownerUid: number,
  ownerGid: number,
  hostUid: number,
  extra: ReadonlyArray<readonly [number, number]> = [],
): number {
  const more = extra.map(([a, b]) => `${a} ${b} 1\n`).join('');
  writeFileSync(`/proc/${pid}/uid_map`, `${ownerUid} ${hostUid} 1\n${more}`);
  writeFileSync(`/proc/${pid}/gid_map`, `${ownerGid} ${hostUid} 1\n${more}`);
  return openSync(`/proc/${pid}/ns/user`, 'r');
}

/** mappingUserns by exec'ing `unshare --user cat` (about 2 ms of CPU). */
export async function unshareUserns(
  ownerUid: number,
  ownerGid: number,
  hostUid: number,
  extra: ReadonlyArray<readonly [number, number]> = [],
): Promise<number> {
  // `unshare --user` leaves the new namespace unmapped; as root we write its maps from outside.
  // Started with posix_spawn (spawn.privileged.ts): forking Airlock would block it for milliseconds.
  // unshare execs cat once it is inside the new namespace; cat echoing a byte back says so, with no
  // polling of /proc (whose reads would also hold up the helper's exec).
  const child = spawnDirect(
    '/usr/bin/unshare',
    ['/usr/bin/unshare', '--user', '/usr/bin/cat'],
    [],
    ['read', 'write', 'null'],
  );
  const [stdin, stdout] = child.pipes as [Socket, Socket];
  try {
    stdin.on('error', () => {});
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(
        () => reject(new Error('user namespace helper did not start')),
        HELPER_WAIT_MS,
      );
      stdout.once('data', () => (clearTimeout(timer), resolve()));
      stdout.once('close', () => (clearTimeout(timer), reject(new Error('user namespace helper exited'))));
      stdin.write('.');
    });
    return openMapped(child.pid, ownerUid, ownerGid, hostUid, extra);
  } finally {
    stdin.destroy();
    stdout.destroy();
    void killAndReap(child);
  }
}

/**
 * Mount an idmapped clone of `source` at `target`. Returns false (and mounts nothing) if the
 * kernel or the source filesystem does not support idmapped mounts; the caller then falls back to
 * the plain directory (files keep their host owners: readable, not writable, for the sandbox).
 */
export async function mountIdmapped(
  source: string,
  target: string,
  owner: { uid: number; gid: number },
  hostUid: number,
  readOnly: boolean,
): Promise<boolean> {
  return (await mountIdmappedAll([{ source, target }], owner, hostUid, readOnly)) === undefined;
}

/**
 * Several idmapped clones with one mapping (one helper process for all of them). Returns undefined
 * when every one is mounted, else the source that could not be (earlier ones stay mounted: the
 * caller's cleanup unmounts them). `prepared`: a mappingUserns() fd made ahead of time for exactly
 * this owner and hostUid; it is closed here, like one made here.
 */
export async function mountIdmappedAll(
  mounts: ReadonlyArray<{ readonly source: string; readonly target: string }>,
  owner: { uid: number; gid: number },
  hostUid: number,
  readOnly: boolean,
  prepared?: number,
): Promise<string | undefined> {
  const s = libc();
  const usernsFd = prepared ?? (await mappingUserns(owner.uid, owner.gid, hostUid));
  try {
    // struct mount_attr { u64 attr_set; u64 attr_clr; u64 propagation; u64 userns_fd; }
    const attr = Buffer.alloc(32);
    attr.writeBigUInt64LE(
      BigInt(MOUNT_ATTR_IDMAP | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | (readOnly ? MOUNT_ATTR_RDONLY : 0)),
      0,
    );
    attr.writeBigUInt64LE(BigInt(usernsFd), 24);
    for (const { source, target } of mounts) {
      const treeFd = s.openTree(AT_FDCWD, source, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
      if (treeFd < 0) return source;
      try {
        if (s.mountSetattr(treeFd, '', AT_EMPTY_PATH, attr, attr.length) !== 0) return source;
        if (s.moveMount(treeFd, '', AT_FDCWD, target, MOVE_MOUNT_F_EMPTY_PATH) !== 0) return source;
      } finally {
        closeSync(treeFd);
      }
    }
    return undefined;
  } finally {
    closeSync(usernsFd);
  }
}

/**
 * Bind `source` (file or dir) read-only, nosuid, nodev at `target` (which must exist and be of the
 * same kind). A detached clone of just that mount (no submounts): the sandbox's uid sees the files
 * with their host owners and modes, so it reads what any other host user could read and writes
 * nothing. open_tree + mount_setattr instead of mount(MS_BIND) + remount: the read-only flag is set
 * on the clone before it becomes visible anywhere.
 */
export function bindReadOnly(source: string, target: string): void {
  const s = libc();
  const treeFd = s.openTree(AT_FDCWD, source, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
  if (treeFd < 0) throw new AirlockError('INTERNAL', `open_tree ${source} failed: errno ${s.errno()}`);
  try {
    const attr = Buffer.alloc(32);
    attr.writeBigUInt64LE(BigInt(MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV), 0);
    if (s.mountSetattr(treeFd, '', AT_EMPTY_PATH, attr, attr.length) !== 0)
      throw new AirlockError('INTERNAL', `mount_setattr ${source} failed: errno ${s.errno()}`);
    if (s.moveMount(treeFd, '', AT_FDCWD, target, MOVE_MOUNT_F_EMPTY_PATH) !== 0)
      throw new AirlockError('INTERNAL', `move_mount ${source} failed: errno ${s.errno()}`);
  } finally {
    closeSync(treeFd);
  }
}
