// The claim on a warm slot that holds an image root mounted ahead (host.ts prepareImage): who gets
// the slot's layers, a create from the image (the slot becomes its sandbox, and its layers are in
// use) or an image store removing one of those layers (`image rm`, prune, closure prune: the slot is
// revoked and never handed out). Decided by one flock(2) on one file, `<slot dir>/image-claim`:
//
//   prepare:  image-claim created and held open (its fd in HostResources.claimFd), then the slot's
//             record (owner.json, preparedImageLayers), then the layer dirs checked, then mounted.
//   take:     flock(claimFd, LOCK_EX | LOCK_NB), then fstat(claimFd): the slot is the create's only
//             if the lock was granted and the file is still linked. The lock is held until the
//             sandbox's resources are released (the fd closes with them, after the unmounts).
//   revoke:   (imageLayerInUse, asked by a remover after it renamed the layer dir away) for each
//             live slot whose record names the layer as prepared: open image-claim by its path,
//             flock(LOCK_EX | LOCK_NB); granted: unlink it, then close (the slot is dead, not a
//             use); refused: a create holds it (a use: the layer is kept).
//
// Why no create runs on a layer a remover removed or is removing, across processes: flock locks of
// two open file descriptions exclude each other (in one process too), so take and revoke are
// ordered. If the revoke's lock comes first, the file is unlinked before that lock is released, so
// the take's lock is refused (revoke still running) or granted on an unlinked file (nlink 0): either
// way the create drops the slot. If the take's lock comes first, the revoke's is refused for as long
// as the sandbox lives, and the remover keeps the layer (renames it back). A remover that looked
// before the slot's record existed had renamed the layer away already, so the prepare's check of the
// layer dirs (after the record) fails, or its mount does. The lock lives with this process: a
// sandbox whose process died is not a use here, as for the records (ownerAlive); the reaper clears it.
// This replaces the check the take made before (rename the staged record in place, then lstat every
// layer dir: two journalled or path-walking steps on the create's path); the record still follows,
// off that path (host.ts), for readers that look at owner.json only.
import { closeSync, constants, fstatSync, openSync, unlinkSync } from 'node:fs';
import { join } from 'node:path';
import { libc } from '../../core/libc.privileged.js';

const CLAIM_FILE = 'image-claim';
const LOCK_EX = 2;
const LOCK_NB = 4;

/** Creates the slot's claim file (before its record names any layer) and returns its open fd. */
export function openSlotClaim(slotDir: string): number {
  const { O_RDWR, O_CREAT, O_EXCL, O_NOFOLLOW } = constants;
  return openSync(join(slotDir, CLAIM_FILE), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW, 0o600);
}

/** The create's take: true when the slot is now this create's (lock granted, file not revoked). */
export function takeSlotClaim(fd: number): boolean {
  if (libc().flock(fd, LOCK_EX | LOCK_NB) !== 0) return false; // a revoke holds it: revoked
  return fstatSync(fd).nlink > 0;
}

/**
 * A remover's revoke of the slot in `slotDir`: false when the slot is revoked (now, or before: no
 * claim file), true when a create holds it, or when it cannot tell (kept: the safe answer).
 */
export function slotClaimHeld(slotDir: string): boolean {
  const file = join(slotDir, CLAIM_FILE);
  let fd: number;
  try {
    fd = openSync(file, constants.O_RDWR | constants.O_NOFOLLOW);
  } catch (e) {
    return (e as NodeJS.ErrnoException).code !== 'ENOENT';
  }
  try {
    if (libc().flock(fd, LOCK_EX | LOCK_NB) !== 0) return true;
    unlinkSync(file); // before the lock goes (at close): a later take finds nlink 0
    return false;
  } catch {
    return true;
  } finally {
    closeSync(fd);
  }
}
