// Warm image slots (backends/host/slots.ts): after a create from an image, the pool mounts that
// image's root ahead in a warm slot, so that the next create from it takes a ready slot. Attacked:
// one slot is one sandbox (no shared upper), a slot of image D never serves image E, `image rm`
// drops the slot and its mounts, parallel creates, and nothing is left after close.
import { existsSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { imageLayerUsers } from '../../src/backends/host/index.js';
import { slotClaimHeld } from '../../src/backends/host/slot-claim.privileged.js';
import { AirlockError } from '../../src/core/errors.js';
import { ImageStore } from '../../src/images/store.js';
import { Airlock } from '../../src/sandbox/airlock.js';
import { layerInUse } from '../../src/sandbox/images.js';
import {
  NO_RESIDUE,
  inotifyWatchesOn,
  openFdsIn,
  residue,
  settledResidue,
  TEST_STATE_DIR,
  TEST_UID_RANGE,
} from '../helpers.js';
import { SANDBOXES, preparedSlots, rootMounts, until } from './slots.js';
import { busyboxEntries, imageOf, layerOf, pushImage, tarOf } from './build.js';
import { REGISTRY_SKIP_REASON, canRunRegistry, startRegistry, type TestRegistry } from './registry.js';

describe.skipIf(!canRunRegistry)(
  `warm slots with an image root mounted ahead (${REGISTRY_SKIP_REASON})`,
  () => {
    let reg: TestRegistry;
    let refD: string;
    let refE: string;
    let airlock: Airlock;

    beforeAll(async () => {
      rmSync(`${TEST_STATE_DIR}/images`, { recursive: true, force: true });
      reg = await startRegistry();
      const marked = async (which: string): Promise<ReturnType<typeof imageOf>> =>
        imageOf([
          layerOf(await tarOf(busyboxEntries()), 'gzip'),
          layerOf(await tarOf([{ name: 'etc/which', content: `${which}\n` }]), 'gzip'),
        ]);
      await pushImage(reg.host, 'warm/d', 'v1', await marked('D'));
      await pushImage(reg.host, 'warm/e', 'v1', await marked('E'));
      refD = `${reg.host}/warm/d:v1`;
      refE = `${reg.host}/warm/e:v1`;
      airlock = new Airlock({ stateDir: TEST_STATE_DIR, uidRange: TEST_UID_RANGE, warmPool: 1 });
    });
    afterAll(async () => {
      await airlock?.close();
      await reg?.close();
      expect(await settledResidue()).toEqual(NO_RESIDUE);
    });

    it('a second create from the image takes the prepared slot; neither sees the other’s writes', async () => {
      const a = await airlock.create({ image: refD });
      try {
        const ready = await until(preparedSlots, (p) => p.length === 1);
        expect(ready).toHaveLength(1);
        const b = await airlock.create({ image: refD });
        try {
          // The prepared slot is b's now: its claim is held (a remover's revoke is refused)...
          expect(slotClaimHeld(join(SANDBOXES, ready[0]!.id))).toBe(true);
          // ...and soon its record names the layers in use too (the record staged when the slot was
          // prepared, put in place by the refill the take scheduled).
          const record = (): { id?: string; imageLayers?: string[]; preparedImageLayers?: string[] } =>
            JSON.parse(readFileSync(join(SANDBOXES, ready[0]!.id, 'owner.json'), 'utf8'));
          const rec = await until(record, (r) => r.imageLayers !== undefined);
          expect(rec.imageLayers).toEqual(ready[0]!.layers);
          expect([rec.id, rec.preparedImageLayers]).toEqual([ready[0]!.id, undefined]);
          expect(existsSync(join(SANDBOXES, ready[0]!.id, 'owner.json.staged'))).toBe(false);
          expect((await a.exec(['sh', '-c', 'echo a > /etc/who; cat /etc/which'])).stdout).toBe('D\n');
          const rb = await b.exec(['sh', '-c', 'cat /etc/which; cat /etc/who 2>&1 || echo none']);
          expect(rb.stdout.split('\n').slice(0, 1)).toEqual(['D']);
          expect(rb.stdout).toContain('none');
          await b.exec(['sh', '-c', 'echo b > /etc/who']);
          expect((await a.exec(['cat', '/etc/who'])).stdout).toBe('a\n');
        } finally {
          await b.kill();
        }
      } finally {
        await a.kill();
      }
      // A slot is never reused after its sandbox ran: the next prepared one is a fresh dir and upper.
      const next = await until(preparedSlots, (p) => p.length === 1);
      const c = await airlock.create({ image: refD });
      try {
        expect(next).toHaveLength(1);
        expect((await c.exec(['sh', '-c', 'cat /etc/who 2>/dev/null || echo clean'])).stdout).toBe('clean\n');
      } finally {
        await c.kill();
      }
    });

    it('a slot prepared for image D never serves image E', async () => {
      const d = await airlock.create({ image: refD });
      await d.kill();
      await until(preparedSlots, (p) => p.length >= 1);
      const e = await airlock.create({ image: refE });
      try {
        expect((await e.exec(['cat', '/etc/which'])).stdout).toBe('E\n');
      } finally {
        await e.kill();
      }
      // Both images now have a slot ready (the bound is two), each with its own layers.
      const both = await until(preparedSlots, (p) => p.length === 2);
      expect(new Set(both.map((p) => p.layers.join()))).toHaveProperty('size', 2);
      const d2 = await airlock.create({ image: refD });
      try {
        expect((await d2.exec(['cat', '/etc/which'])).stdout).toBe('D\n');
      } finally {
        await d2.kill();
      }
    });

    it('N parallel creates of one image each get their own root', async () => {
      const sbxs = await Promise.all(Array.from({ length: 5 }, () => airlock.create({ image: refD })));
      try {
        await Promise.all(sbxs.map((s, i) => s.exec(['sh', '-c', `echo ${i} > /etc/mine`])));
        const seen = await Promise.all(sbxs.map((s) => s.exec(['sh', '-c', 'cat /etc/mine /etc/which'])));
        expect(seen.map((r) => r.stdout)).toEqual(sbxs.map((_, i) => `${i}\nD\n`));
      } finally {
        await Promise.all(sbxs.map((s) => s.kill()));
      }
    });

    it('image rm drops the prepared slot and its mounts; the next create gets IMAGE_NOT_FOUND', async () => {
      const d = await airlock.create({ image: refD });
      await d.kill();
      const look = new ImageStore({ stateDir: TEST_STATE_DIR });
      const layersOfD = (await look.resolve(refD, { pull: 'never' })).layers;
      await look.close();
      const same = (s: { layers: string[] }): boolean => s.layers.join() === layersOfD.join();
      const slotOfD = (await until(preparedSlots, (p) => p.some(same))).find(same)!;
      expect(slotOfD).toBeDefined();
      // Killed sandboxes are torn down in batches: wait until no sandbox records a use of its layers.
      const users = (): string[] => slotOfD.layers.flatMap((l) => imageLayerUsers(TEST_STATE_DIR, l));
      expect(await until(users, (u) => u.length === 0)).toEqual([]);
      // The store a runtime or the CLI uses: a layer is in use while a live sandbox records it or a
      // mount names it. A warm slot's mounts are neither.
      const store = new ImageStore({
        stateDir: TEST_STATE_DIR,
        inUse: await layerInUse(TEST_STATE_DIR, join(TEST_STATE_DIR, 'images')),
      });
      const rm = await store.remove(refD);
      await store.close();
      expect(rm.keptInUse).toEqual([]);
      expect(rm.removedLayers.length).toBeGreaterThan(0);
      const left = await until(rootMounts, (m) => !m.includes(slotOfD.id));
      expect(left).not.toContain(slotOfD.id);
      // The slot's release unmounts the root first, then the rest (pts, disk): wait for all of it.
      const under = (): string[] => residue().mounts.filter((m) => m.includes(`/sandboxes/${slotOfD.id}/`));
      expect(await until(under, (m) => m.length === 0)).toEqual([]);
      const err = await airlock.create({ image: refD, pull: 'never' }).catch((e: unknown) => e);
      expect(AirlockError.is(err, 'IMAGE_NOT_FOUND')).toBe(true);
      // With pull: missing, it is pulled again and runs.
      const again = await airlock.create({ image: refD });
      try {
        expect((await again.exec(['cat', '/etc/which'])).stdout).toBe('D\n');
      } finally {
        await again.kill();
      }
    });

    it('close releases every warm slot, image roots included, and every watch on the image store', async () => {
      // (From the store: its ref is cached, held open.)
      await (await airlock.create({ image: refE, pull: 'never' })).kill();
      await until(preparedSlots, (p) => p.length >= 1);
      const images = join(TEST_STATE_DIR, 'images');
      const dirs = ['blobs', 'layers'].map((d) => join(images, d));
      // The store's watches (blobs, layers) and the pool's (layers), and the cached refs' fds.
      expect(inotifyWatchesOn(dirs)).toBeGreaterThan(0);
      expect(openFdsIn(join(images, 'refs'))).toBeGreaterThan(0);
      await airlock.close();
      expect(await settledResidue()).toEqual(NO_RESIDUE);
      expect([inotifyWatchesOn(dirs), openFdsIn(join(images, 'refs'))]).toEqual([0, 0]);
    });
  },
);
