// The race guard between a create taking a warm slot that holds an image root mounted ahead and an
// image store removing one of that image's layers (backends/host/slot-claim.privileged.ts). Attacked:
// a remover's revoke before the take, a revoke in progress during the take, `image rm`
// + `image load` in a second process between the slot's prepare and the take (the layer dirs
// replaced), `image rm`
// in a second process right after the take (before this process runs another turn of its event
// loop), and rm racing creates in one process. Each case fails when the take does not check the
// claim, or when the remover does not honour a claim taken. The image is loaded from an OCI layout
// (no registry: a child process blocks this one, which would serve the registry's loopback).
import { closeSync, constants, openSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { imageLayerInUse, imageLayerUsers } from '../../src/backends/host/index.js';
import { libc } from '../../src/core/libc.privileged.js';
import { AirlockError } from '../../src/core/errors.js';
import { ImageStore } from '../../src/images/store.js';
import { Airlock, type Sandbox } from '../../src/sandbox/airlock.js';
import { layerInUse } from '../../src/sandbox/images.js';
import { loadImages } from '../../src/images/load.js';
import {
  NO_RESIDUE,
  SKIP_REASON,
  canRunNamespaces,
  runCliSync,
  settledResidue,
  TEST_STATE_DIR,
  TEST_UID_RANGE,
} from '../helpers.js';
import { busyboxEntries, imageOf, layerOf, tarOf, writeLayout } from './build.js';
import { LOCK_EX_NB, SANDBOXES, claimDirs, takeableSlots, until } from './slots.js';

const IMAGES = join(TEST_STATE_DIR, 'images');
const LAYOUT = `${TEST_STATE_DIR}-claim-layout`;
const ref = 'local/claim:v1';

describe.skipIf(!canRunNamespaces)(`warm image slots against image rm (${SKIP_REASON})`, () => {
  let airlock: Airlock;

  beforeAll(async () => {
    rmSync(IMAGES, { recursive: true, force: true });
    rmSync(LAYOUT, { recursive: true, force: true });
    const img = imageOf([
      layerOf(await tarOf(busyboxEntries()), 'gzip'),
      layerOf(await tarOf([{ name: 'etc/which', content: 'C\n' }]), 'gzip'),
    ]);
    writeLayout(LAYOUT, img, ref);
    airlock = new Airlock({ stateDir: TEST_STATE_DIR, uidRange: TEST_UID_RANGE, warmPool: 1 });
  });
  afterAll(async () => {
    await airlock?.close();
    expect(await settledResidue()).toEqual(NO_RESIDUE);
    rmSync(IMAGES, { recursive: true, force: true });
    rmSync(LAYOUT, { recursive: true, force: true });
  });

  /**
   * A warm slot holding the image's root, prepared after a create from it (loaded if need be), with
   * no sandbox left that uses its layers: a remover is free to take them but for the slot.
   */
  async function slotReady(): Promise<{ id: string; layers: string[] }> {
    const store = new ImageStore({ stateDir: TEST_STATE_DIR });
    if (!store.list().some((i) => i.ref === ref)) await loadImages(store, LAYOUT);
    await store.close();
    await (await airlock.create({ image: ref, pull: 'never' })).kill();
    const ready = await until(takeableSlots, (p) => p.length === 1);
    expect(ready).toHaveLength(1);
    // Sandboxes made from the image before are released (their records, and their claims: a remover
    // would find those held).
    const users = (): string[] => ready[0]!.layers.flatMap((l) => imageLayerUsers(TEST_STATE_DIR, l));
    expect(await until(users, (u) => u.length === 0)).toEqual([]);
    expect(await until(claimDirs, (d) => d.length === 1)).toEqual([ready[0]!.id]);
    return ready[0]!;
  }

  /** The sandbox runs on the whole image root, then is killed. */
  async function runsOnWholeRoot(sbx: Sandbox): Promise<void> {
    try {
      expect((await sbx.exec(['cat', '/etc/which'])).stdout).toBe('C\n');
    } finally {
      await sbx.kill();
    }
  }

  const digests = (layers: readonly string[]): string[] =>
    layers.map((l) => /(sha256:[0-9a-f]{64})\/fs$/.exec(l)![1]!).sort();

  it('a slot revoked by a remover (which then kept the layers) is never taken', async () => {
    const slot = await slotReady();
    // What a remover asks of each layer it renamed away: here nothing else holds them, so the
    // prepared slot is revoked (and the layers stay: nothing was renamed).
    for (const l of slot.layers) expect(imageLayerInUse(TEST_STATE_DIR, l)).toBe(false);
    const sbx = await airlock.create({ image: ref, pull: 'never' });
    expect(sbx.id).not.toBe(slot.id);
    await runsOnWholeRoot(sbx);
  });

  it('a slot whose claim a remover holds (mid-revoke) is not taken', async () => {
    const slot = await slotReady();
    const fd = openSync(join(SANDBOXES, slot.id, 'image-claim'), constants.O_RDWR);
    try {
      expect(libc().flock(fd, LOCK_EX_NB)).toBe(0);
      const sbx = await airlock.create({ image: ref, pull: 'never' });
      expect(sbx.id).not.toBe(slot.id);
      await runsOnWholeRoot(sbx);
    } finally {
      closeSync(fd);
    }
  });

  it('image rm and load in a second process between prepare and take: the slot is not taken', async () => {
    const slot = await slotReady();
    const rm = runCliSync(['image', 'rm', '--json', ref]);
    expect(rm).toMatchObject({ code: 0 });
    expect((JSON.parse(rm.stdout) as { removedLayers: string[] }).removedLayers.sort()).toEqual(
      digests(slot.layers),
    );
    // The same layer dirs again (content-addressed), new inodes.
    expect(runCliSync(['image', 'load', LAYOUT])).toMatchObject({ code: 0 });
    // No turn of this process's event loop since: its pool has not heard of the change (its watch),
    // only the claim tells.
    const sbx = await airlock.create({ image: ref, pull: 'never' });
    expect(sbx.id).not.toBe(slot.id);
    await runsOnWholeRoot(sbx);
  });

  it('image rm in a second process right after the take keeps every layer of the slot', async () => {
    const slot = await slotReady();
    const sbx = await airlock.create({ image: ref, pull: 'never' });
    // At once, before this process runs another turn of its event loop (the refill that puts the
    // record naming the layers in use in place runs later): the claim alone says they are.
    const rm = runCliSync(['image', 'rm', '--json', ref]);
    try {
      expect(sbx.id).toBe(slot.id);
      expect(rm.code).toBe(0);
      const r = JSON.parse(rm.stdout) as { removedLayers: string[]; keptInUse: string[] };
      expect([r.removedLayers, r.keptInUse.sort()]).toEqual([[], digests(slot.layers)]);
    } finally {
      await runsOnWholeRoot(sbx);
    }
  });

  it('rm racing a create in one process, at each point of its way: it fails typed or runs on the whole root', async () => {
    const outcomes = new Set<string>();
    // The remove starts after the create has run `hops` turns of the microtask queue (-1: before
    // the create starts): its synchronous part (rename away, revoke, delete) then falls before,
    // during or after the take.
    for (const hops of [-1, 0, 2, 4, 8, 12, 16, 24, 32, 128, 512]) {
      const slot = await slotReady();
      const store = new ImageStore({
        stateDir: TEST_STATE_DIR,
        inUse: await layerInUse(TEST_STATE_DIR, IMAGES),
      });
      try {
        const later = async (): Promise<Awaited<ReturnType<ImageStore['remove']>>> => {
          for (let i = 0; i < hops; i++) await Promise.resolve();
          return store.remove(ref);
        };
        let c: PromiseSettledResult<Sandbox>;
        let r: PromiseSettledResult<Awaited<ReturnType<ImageStore['remove']>>>;
        if (hops < 0)
          [r, c] = await Promise.allSettled([
            store.remove(ref),
            airlock.create({ image: ref, pull: 'never' }),
          ]);
        else [c, r] = await Promise.allSettled([airlock.create({ image: ref, pull: 'never' }), later()]);
        if (r.status === 'rejected') throw r.reason;
        const removed = r.value.removedLayers;
        if (c.status === 'fulfilled') {
          // It took the slot (or made its own): then no layer of it was removed.
          outcomes.add(c.value.id === slot.id ? 'took the slot' : 'own slot');
          expect(removed.filter((d) => digests(slot.layers).includes(d))).toEqual([]);
          await runsOnWholeRoot(c.value);
        } else {
          // Before the take: the image is gone (IMAGE_NOT_FOUND), or its layers are when the create,
          // finding the slot revoked, mounts them itself (INVALID_SPEC: not an unpacked layer dir).
          outcomes.add('refused');
          expect(AirlockError.isInstance(c.reason)).toBe(true);
          expect(removed.sort()).toEqual(digests(slot.layers));
        }
      } finally {
        await store.close();
      }
    }
    // Both sides of the race were exercised.
    expect(outcomes.has('refused')).toBe(true);
    expect(outcomes.has('took the slot')).toBe(true);
  });
});
