// End to end: an image pushed to a real registry (docker-registry in its own netns, reached over
// loopback), pulled by the runtime's default image store, run as a sandbox's root on both tiers and
// from the CLI; the store keeps the layers a live sandbox runs on.
import { rmSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Airlock } from '../../src/sandbox/airlock.js';
import { ImageStore } from '../../src/images/store.js';
import { layerInUse } from '../../src/sandbox/images.js';
import {
  canRunGvisor,
  NO_RESIDUE,
  runCli,
  settledResidue,
  TEST_STATE_DIR,
  TEST_UID_RANGE,
} from '../helpers.js';
import {
  busyboxEntries,
  imageOf,
  layerOf,
  overlayEntries,
  pushImage,
  tarOf,
  type TestImage,
} from './build.js';
import { canRunRegistry, startRegistry, type TestRegistry } from './registry.js';

describe.skipIf(!canRunRegistry)('sandboxes on an image from a real registry', () => {
  let reg: TestRegistry;
  let img: TestImage;
  let ref: string;
  let airlock: Airlock;

  beforeAll(async () => {
    rmSync(`${TEST_STATE_DIR}/images`, { recursive: true, force: true });
    reg = await startRegistry();
    img = imageOf(
      [layerOf(await tarOf(busyboxEntries()), 'gzip'), layerOf(await tarOf(overlayEntries()), 'zstd')],
      { config: { Env: ['PATH=/bin', 'FROM_IMAGE=yes'], WorkingDir: '/opt', Cmd: ['echo', 'from-cmd'] } },
    );
    await pushImage(reg.host, 'team/busybox', 'v1', img);
    ref = `${reg.host}/team/busybox:v1`;
    airlock = new Airlock({ stateDir: TEST_STATE_DIR, uidRange: TEST_UID_RANGE, warmPool: 0 });
  });
  afterAll(async () => {
    await airlock?.close();
    await reg?.close();
    expect(await settledResidue()).toEqual(NO_RESIDUE);
  });

  for (const backend of ['namespaces', 'gvisor'] as const) {
    it.skipIf(backend === 'gvisor' && !canRunGvisor)(
      `${backend}: pulls the tag, runs on its root, reports the digest`,
      async () => {
        const sbx = await airlock.create({ backend, image: ref });
        try {
          expect(sbx.info.image).toEqual({ ref, digest: img.digest });
          const r = await sbx.exec([
            'sh',
            '-c',
            'echo $FROM_IMAGE; pwd; cat /opt/data/c; test -e /usr/bin/perl || echo no-host-usr; test -e /etc/motd || echo motd-deleted',
          ]);
          expect(r.exitCode).toBe(0);
          expect(r.stdout.split('\n')).toEqual([
            'yes',
            '/opt',
            'c from layer 2',
            'no-host-usr',
            'motd-deleted',
            '',
          ]);
        } finally {
          await sbx.kill();
        }
      },
    );
  }

  it('pull never finds a cached tag and refuses an uncached one; a digest reference runs the same image', async () => {
    const cached = await airlock.create({ image: ref, pull: 'never' });
    await cached.kill();
    await expect(
      airlock.create({ image: `${reg.host}/team/busybox:v2`, pull: 'never' }),
    ).rejects.toMatchObject({
      code: 'IMAGE_NOT_FOUND',
    });
    await expect(airlock.create({ image: `${reg.host}/team/nothing:v1` })).rejects.toMatchObject({
      code: 'IMAGE_NOT_FOUND',
    });
    const byDigest = await airlock.create({ image: `${reg.host}/team/busybox@${img.digest}` });
    try {
      expect(byDigest.info.image?.digest).toBe(img.digest);
      expect((await byDigest.exec(['cat', '/opt/data/c'])).stdout).toBe('c from layer 2\n');
    } finally {
      await byDigest.kill();
    }
  });

  it('rm and prune keep the layers of a live sandbox, and remove them once it is gone', async () => {
    const sbx = await airlock.create({ image: ref });
    const store = new ImageStore({ stateDir: TEST_STATE_DIR, inUse: (d) => inUse(d) });
    const inUse = await layerInUse(TEST_STATE_DIR, store.root);
    try {
      // The digest reference of the test before still names the same layers: nothing to free yet.
      expect(await store.remove(`${reg.host}/team/busybox@${img.digest}`)).toMatchObject({
        removedLayers: [],
        keptInUse: [],
      });
      const r = await store.remove(ref);
      expect(r.removedLayers).toEqual([]);
      expect(r.keptInUse).toHaveLength(2);
      // The sandbox still runs on its root.
      expect((await sbx.exec(['cat', '/opt/data/c'])).stdout).toBe('c from layer 2\n');
    } finally {
      await sbx.kill();
    }
    // Its teardown (unmounts, owner record) runs after kill returns: until then the layers stay.
    expect(await settledResidue()).toEqual(NO_RESIDUE);
    const p = await store.prune();
    expect(p.keptInUse).toEqual([]);
    expect(p.removedLayers).toHaveLength(2);
    expect(store.list()).toEqual([]);
  });

  it('airlock run --image pulls and runs the command, or the image entrypoint and cmd', async () => {
    const a = await runCli(['run', '--image', ref, '--', 'cat', '/opt/data/c']);
    expect(a.stderr).toBe('');
    expect(a.stdout).toBe('c from layer 2\n');
    expect(a.code).toBe(0);
    const b = await runCli(['run', '--image', ref, '--pull', 'never']);
    expect(b.stdout).toBe('from-cmd\n');
    expect(b.code).toBe(0);
    const c = await runCli(['image', 'ls', '--json']);
    expect(JSON.parse(c.stdout)).toEqual(
      expect.arrayContaining([expect.objectContaining({ ref, digest: img.digest })]),
    );
  });
});
