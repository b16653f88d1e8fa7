// What the warm-slot tests look at on the host: sandbox dirs with an image root mounted, and which
// of them are warm slots holding one prepared for no sandbox yet.
import { closeSync, constants, existsSync, openSync, readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { libc } from '../../src/core/libc.privileged.js';
import { residue, TEST_STATE_DIR } from '../helpers.js';

export const SANDBOXES = join(TEST_STATE_DIR, 'sandboxes');

/** Sandbox dirs with an image root mounted (live sandboxes' and warm slots'). */
export function rootMounts(): string[] {
  return residue()
    .mounts.map((m) => /\/sandboxes\/([^/]+)\/root$/.exec(m)?.[1])
    .filter((id): id is string => id !== undefined);
}

/** Warm slots holding an image root mounted ahead (their record names the layers as prepared only). */
export function preparedSlots(): Array<{ id: string; layers: string[] }> {
  const out: Array<{ id: string; layers: string[] }> = [];
  for (const id of rootMounts()) {
    const rec = JSON.parse(readFileSync(join(SANDBOXES, id, 'owner.json'), 'utf8')) as {
      preparedImageLayers?: string[];
      imageLayers?: string[];
    };
    if (rec.preparedImageLayers && !rec.imageLayers) out.push({ id, layers: rec.preparedImageLayers });
  }
  return out;
}

/** Waits (bounded) until `cond` holds; returns its last value. */
export async function until<T>(f: () => T, cond: (v: T) => boolean, maxMs = 10_000): Promise<T> {
  let v = f();
  for (let i = 0; i < maxMs / 25 && !cond(v); i++) {
    await new Promise((r) => setTimeout(r, 25));
    v = f();
  }
  return v;
}

/** Sandbox dirs with a claim file (warm image slots, and sandboxes made from one until released). */
export function claimDirs(): string[] {
  return readdirSync(SANDBOXES).filter((id) => existsSync(join(SANDBOXES, id, 'image-claim')));
}

/**
 * Warm slots of the pool ready to be taken: prepared, done (the helper bind is the last mount a
 * prepare makes: once it shows, the pool holds the slot, as this process runs the pool), and neither
 * revoked (no claim file) nor taken (its lock held: a sandbox made from it, maybe being released).
 */
export function takeableSlots(): Array<{ id: string; layers: string[] }> {
  const mounts = residue().mounts;
  return preparedSlots().filter((s) => {
    if (!mounts.some((m) => m.endsWith(`/sandboxes/${s.id}/helper`))) return false;
    let fd: number;
    try {
      fd = openSync(join(SANDBOXES, s.id, 'image-claim'), constants.O_RDWR);
    } catch {
      return false;
    }
    try {
      return libc().flock(fd, LOCK_EX_NB) === 0; // (released at close: nothing runs in between)
    } finally {
      closeSync(fd);
    }
  });
}

/** flock(2) LOCK_EX | LOCK_NB. */
export const LOCK_EX_NB = 2 | 4;
