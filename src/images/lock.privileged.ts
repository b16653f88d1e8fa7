// An advisory flock(2) on the image store's lock file: pulls and loads hold it shared while they add
// layers and refs, garbage collection (rm, prune) holds it exclusive, so a collection never deletes a
// layer that a pull has unpacked but not yet recorded under a ref. Non-blocking attempts, retried on
// a timer, so waiting never blocks the event loop.
import { closeSync, constants, openSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import { libc } from '../core/libc.privileged.js';

const LOCK_SH = 1;
const LOCK_EX = 2;
const LOCK_NB = 4;
const EWOULDBLOCK = 11;

/** Runs `f` holding the lock on `file` (shared or exclusive); released when `f` settles. */
export async function withFileLock<T>(
  file: string,
  mode: 'shared' | 'exclusive',
  f: () => Promise<T>,
  signal?: AbortSignal,
): Promise<T> {
  const fd = openSync(file, constants.O_RDWR | constants.O_CREAT | constants.O_NOFOLLOW, 0o600);
  try {
    const c = libc();
    const op = (mode === 'shared' ? LOCK_SH : LOCK_EX) | LOCK_NB;
    for (let wait = 5; c.flock(fd, op) !== 0; wait = Math.min(wait * 2, 200)) {
      const errno = c.errno();
      if (errno !== EWOULDBLOCK) throw new Error(`flock ${file} failed (errno ${errno})`);
      signal?.throwIfAborted();
      await sleep(wait);
    }
    return await f();
  } finally {
    closeSync(fd); // releases the lock
  }
}
