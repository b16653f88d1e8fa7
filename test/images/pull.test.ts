// Pulling from a real registry (docker-registry in a netns of its own, see registry.ts): references,
// manifests and indexes, gzip/zstd/plain layers, whiteouts, hard links, the config, the cache and
// pull policies, token auth, concurrent pulls. Attacks on verification and unpacking are in
// attacks.test.ts.
import { lstatSync, readFileSync, readdirSync, readlinkSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AirlockError } from '../../src/core/errors.js';
import { ImageStore } from '../../src/images/store.js';
import { libc } from '../../src/core/libc.privileged.js';
import {
  busyboxEntries,
  imageOf,
  indexOf,
  layerOf,
  overlayEntries,
  pushImage,
  pushManifest,
  sha256,
  tarOf,
  OCI_INDEX,
  type TestImage,
} from './build.js';
import { canRunRegistry, startRegistry, startTokenService, type TestRegistry } from './registry.js';
import { inotifyWatchesOn, openFdsIn } from '../helpers.js';

const STATE = `${process.env.AIRLOCK_TEST_STATE_DIR ?? '/var/tmp/airlock-test'}-images`;

function xattr(path: string, name: string): string | undefined {
  const buf = Buffer.alloc(16);
  const n = libc().lgetxattr(Buffer.from(`${path}\0`), name, buf, buf.length);
  return n < 0 ? undefined : buf.subarray(0, n).toString();
}

/** Nothing half-done left in the store: no temp or trash dirs. */
function leftovers(stateDir: string): string[] {
  const dir = join(stateDir, 'images', 'layers');
  try {
    return readdirSync(dir).filter((n) => n.startsWith('.'));
  } catch {
    return [];
  }
}

describe.skipIf(!canRunRegistry)('image pull from a real registry', () => {
  let reg: TestRegistry;
  let img: TestImage;
  let stateDir: string;
  let n = 0;
  const freshStore = (o: Partial<ConstructorParameters<typeof ImageStore>[0]> = {}): ImageStore => {
    stateDir = `${STATE}/${process.pid}-${n++}`;
    return new ImageStore({ stateDir, ...o });
  };

  beforeAll(async () => {
    rmSync(STATE, { recursive: true, force: true });
    reg = await startRegistry();
    img = imageOf(
      [layerOf(await tarOf(busyboxEntries()), 'gzip'), layerOf(await tarOf(overlayEntries()), 'zstd')],
      {
        config: {
          Env: ['PATH=/bin', 'A=1'],
          WorkingDir: '/opt',
          User: '1000:1000',
          Entrypoint: ['/bin/sh', '-c'],
          Cmd: ['echo hi'],
          Labels: { team: 'x' },
        },
      },
    );
    await pushImage(reg.host, 'test/busybox', 'v1', img);
  });
  afterAll(async () => {
    await reg?.close();
    // The registry (and so its network namespace) is gone.
    expect(reg.child.exitCode !== null || reg.child.signalCode !== null).toBe(true);
    rmSync(STATE, { recursive: true, force: true });
  });

  it('pulls by tag: layers bottom first, overlayfs whiteouts and opaque dirs, hard links, the config', async () => {
    const store = freshStore();
    const r = await store.resolve(`${reg.host}/test/busybox:v1`);
    expect(r.ref).toBe(`${reg.host}/test/busybox:v1`);
    expect(r.digest).toBe(img.digest);
    expect(r.layers).toEqual(img.layers.map((l) => join(stateDir, 'images', 'layers', l.diffId, 'fs')));
    expect(r.config).toEqual({
      env: ['PATH=/bin', 'A=1'],
      workingDir: '/opt',
      user: '1000:1000',
      entrypoint: ['/bin/sh', '-c'],
      cmd: ['echo hi'],
      labels: { team: 'x' },
    });
    const [l1, l2] = r.layers as [string, string];
    expect(readFileSync(join(l1, 'bin/busybox')).equals(readFileSync('/bin/busybox'))).toBe(true);
    expect(statSync(join(l1, 'bin/busybox')).mode & 0o7777).toBe(0o755);
    expect(readlinkSync(join(l1, 'bin/sh'))).toBe('busybox');
    const owned = lstatSync(join(l1, 'etc/owned'));
    expect([owned.uid, owned.gid]).toEqual([1000, 1001]); // kept as written: the tiers idmap them
    const wh = lstatSync(join(l2, 'etc/motd'));
    expect(wh.isCharacterDevice() && wh.rdev === 0).toBe(true);
    expect(xattr(join(l2, 'opt/data'), 'trusted.overlay.opaque')).toBe('y');
    expect(readFileSync(join(l2, 'opt/data/c'), 'utf8')).toBe('c from layer 2\n');
    expect(lstatSync(join(l2, 'opt/data/c2')).ino).toBe(lstatSync(join(l2, 'opt/data/c')).ino);
    expect(readdirSync(join(l2, 'opt/data')).sort()).toEqual(['c', 'c2']);
    expect(leftovers(stateDir)).toEqual([]);
    expect(store.list().map((i) => [i.ref, i.digest, i.layers])).toEqual([[r.ref, img.digest, 2]]);
  });

  it('pull policies: never refuses what is not cached; missing uses the cache without the registry; always asks again', async () => {
    const store = freshStore();
    const ref = `${reg.host}/test/busybox:v1`;
    await expect(store.resolve(ref, { pull: 'never' })).rejects.toMatchObject({ code: 'IMAGE_NOT_FOUND' });
    const first = await store.resolve(ref);
    // With the registry's manifest for the tag gone, "missing" still answers from the cache…
    const tmpReg = await startRegistry();
    try {
      const offline = new ImageStore({ stateDir });
      expect(await offline.resolve(ref, { pull: 'never' })).toEqual(first);
      expect(await offline.resolve(ref, { pull: 'missing' })).toEqual(first);
      // …and by digest too, under its own ref.
      const byDigest = `${reg.host}/test/busybox@${img.digest}`;
      expect((await offline.resolve(byDigest, { pull: 'never' })).digest).toBe(img.digest);
    } finally {
      await tmpReg.close();
    }
    // "always" fetches the manifest again; a layer already unpacked is not fetched again.
    const events: string[] = [];
    await store.pull(ref, {
      pull: 'always',
      onProgress: (e) => e.kind === 'layer' && events.push(String(e.cached)),
    });
    expect(events).toEqual(['true', 'true']);
  });

  it('an index: picks linux/amd64; without one lists the platforms it has', async () => {
    const arm = imageOf(img.layers, { architecture: 'arm64' });
    await pushImage(reg.host, 'test/multi', 'arm', arm);
    await pushImage(reg.host, 'test/multi', 'amd', img);
    const index = indexOf([
      { image: arm, os: 'linux', architecture: 'arm64' },
      { image: img, os: 'linux', architecture: 'amd64' },
    ]);
    const indexDigest = await pushManifest(reg.host, 'test/multi', 'both', index, OCI_INDEX);
    const store = freshStore();
    const r = await store.resolve(`${reg.host}/test/multi:both`);
    expect(r.digest).toBe(indexDigest);
    expect(r.layers).toHaveLength(2);
    const only = indexOf([
      { image: arm, os: 'linux', architecture: 'arm64' },
      { image: arm, os: 'windows', architecture: 'amd64' },
    ]);
    await pushManifest(reg.host, 'test/multi', 'armonly', only, OCI_INDEX);
    const e = await store.resolve(`${reg.host}/test/multi:armonly`).catch((x: unknown) => x);
    expect(AirlockError.is(e, 'IMAGE_PLATFORM_UNSUPPORTED')).toBe(true);
    expect((e as Error).message).toContain('linux/arm64, windows/amd64');
    // A single-platform manifest for another architecture: refused from its config.
    await expect(store.resolve(`${reg.host}/test/multi:arm`)).rejects.toMatchObject({
      code: 'IMAGE_PLATFORM_UNSUPPORTED',
    });
    expect(leftovers(stateDir)).toEqual([]);
  });

  it('plain (uncompressed) layers, and an unknown repository or tag is IMAGE_NOT_FOUND', async () => {
    const plain = imageOf([layerOf(await tarOf(busyboxEntries()), 'none')]);
    await pushImage(reg.host, 'test/plain', 'v1', plain);
    const store = freshStore();
    expect((await store.resolve(`${reg.host}/test/plain:v1`)).layers).toHaveLength(1);
    await expect(store.resolve(`${reg.host}/test/plain:nope`)).rejects.toMatchObject({
      code: 'IMAGE_NOT_FOUND',
    });
    await expect(store.resolve(`${reg.host}/no/such:v1`)).rejects.toMatchObject({ code: 'IMAGE_NOT_FOUND' });
    await expect(store.resolve('local-only:v1')).rejects.toMatchObject({ code: 'IMAGE_NOT_FOUND' });
    await expect(store.resolve(`${reg.host}/Test/Upper:v1`)).rejects.toMatchObject({
      code: 'IMAGE_REF_INVALID',
    });
  });

  it('concurrent pulls of one image (one store and two stores on one state dir) all succeed and agree', async () => {
    const a = freshStore();
    const b = new ImageStore({ stateDir });
    const ref = `${reg.host}/test/busybox:v1`;
    const all = await Promise.all([
      a.resolve(ref),
      a.resolve(ref),
      b.resolve(ref),
      b.resolve(ref, { pull: 'always' }),
    ]);
    for (const r of all) expect(r).toEqual(all[0]);
    expect(readdirSync(join(stateDir, 'images', 'layers')).sort()).toEqual(
      img.layers.map((l) => l.diffId).sort(),
    );
    expect(readFileSync(join(all[0]!.layers[1]!, 'opt/data/c'), 'utf8')).toBe('c from layer 2\n');
  });

  it('a cached image resolves to the same frozen object until its ref or a stored blob changes', async () => {
    const store = freshStore();
    const ref = `${reg.host}/test/cached:v1`;
    await pushImage(reg.host, 'test/cached', 'v1', img);
    await store.resolve(ref);
    const a = await store.resolve(ref, { pull: 'never' });
    expect(await store.resolve(ref, { pull: 'never' })).toBe(a);
    expect(Object.isFrozen(a) && Object.isFrozen(a.layers) && Object.isFrozen(a.config.env)).toBe(true);
    // The tag moved and was pulled again (a new ref file): the new image, not the cached one.
    const other = imageOf([layerOf(await tarOf(busyboxEntries()), 'none')]);
    await pushImage(reg.host, 'test/cached', 'v1', other);
    await store.resolve(ref, { pull: 'always' });
    const b = await store.resolve(ref, { pull: 'never' });
    expect([b.digest, b.layers.length]).toEqual([other.digest, 1]);
    expect(await store.resolve(ref, { pull: 'never' })).toBe(b);
    // Removed: IMAGE_NOT_FOUND at once (the ref file is checked at each resolve).
    await store.remove(ref);
    await expect(store.resolve(ref, { pull: 'never' })).rejects.toMatchObject({ code: 'IMAGE_NOT_FOUND' });
    // Pulled again, cached again; then a stored blob changes in place: the cache is dropped (the
    // blobs dir is watched) and the blob fails its digest check.
    await store.resolve(ref, { pull: 'always' });
    const c = await store.resolve(ref, { pull: 'never' });
    expect(await store.resolve(ref, { pull: 'never' })).toBe(c);
    const config = join(stateDir, 'images', 'blobs', sha256(other.config));
    writeFileSync(config, `${readFileSync(config, 'utf8')} `);
    await expect
      .poll(() =>
        store.resolve(ref, { pull: 'never' }).then(
          () => 'cached',
          (e: unknown) => (e as AirlockError).code,
        ),
      )
      .toBe('IMAGE_NOT_FOUND');
  });

  it('cached() answers as resolve does, and no longer once another store re-pulls or removes the ref', async () => {
    const other = freshStore();
    const ref = `${reg.host}/test/moving:v1`;
    const second = imageOf([layerOf(await tarOf(busyboxEntries()), 'none')]);
    await pushImage(reg.host, 'test/moving', 'v1', img);
    await pushImage(reg.host, 'test/moving', 'v2', second);
    await other.resolve(ref);
    await other.resolve(`${reg.host}/test/moving:v2`);
    // (Made after those pulls: its watches see none of their writes.)
    const store = new ImageStore({ stateDir });
    expect(store.cached(ref)).toBeUndefined(); // never resolved here
    const a = await store.resolve(ref, { pull: 'never' });
    expect(await store.resolve(ref, { pull: 'never' })).toBe(a);
    expect(store.cached(ref)).toBe(a);
    expect(store.cached(ref, { pull: 'never' })).toBe(a);
    expect(store.cached(ref, { pull: 'always' })).toBeUndefined();
    // The tag moves to an image whose blobs and layers are all stored already: another store's
    // re-pull writes nothing but the ref file (nothing the watches see). Checked before any turn of
    // the event loop could deliver an event: the held ref file is no longer linked.
    await pushImage(reg.host, 'test/moving', 'v1', second);
    const moved = await other.resolve(ref, { pull: 'always' });
    expect(moved.digest).toBe(second.digest);
    expect(store.cached(ref)).toBeUndefined();
    expect((await store.resolve(ref, { pull: 'never' })).digest).toBe(second.digest);
    expect(store.cached(ref)?.digest).toBe(second.digest);
    // The ref file written in place (same inode, still linked), as by hand, back to the first image,
    // in another size: not cached any more, at once, and resolve reads the new content. (A same-size
    // write within the clock tick of the last change keeps the ctime too: store.ts says so.)
    const refs = join(stateDir, 'images', 'refs');
    const refFile = readdirSync(refs)
      .map((f) => join(refs, f))
      .find((f) => (JSON.parse(readFileSync(f, 'utf8')) as { ref: string }).ref === moved.ref)!;
    const ino = statSync(refFile).ino;
    const record = JSON.parse(readFileSync(refFile, 'utf8')) as { digest: string };
    const text = JSON.stringify({ ...record, digest: a.digest });
    writeFileSync(refFile, `${text}${' '.repeat(statSync(refFile).size === text.length ? 1 : 0)}`);
    expect(statSync(refFile).ino).toBe(ino);
    expect(store.cached(ref)).toBeUndefined();
    expect((await store.resolve(ref, { pull: 'never' })).digest).toBe(a.digest);
    // Removed by another store: not cached any more, at once.
    await other.remove(ref);
    expect(store.cached(ref)).toBeUndefined();
    await expect(store.resolve(ref, { pull: 'never' })).rejects.toMatchObject({ code: 'IMAGE_NOT_FOUND' });
    await store.close();
    await other.close();
  });

  it('close() leaves no watch on the store and no ref file open; the store resolves (and watches) again', async () => {
    const store = freshStore();
    const ref = `${reg.host}/test/closing:v1`;
    await pushImage(reg.host, 'test/closing', 'v1', img);
    await store.resolve(ref);
    const dirs = ['blobs', 'layers'].map((d) => join(stateDir, 'images', d));
    const refs = join(stateDir, 'images', 'refs');
    const a = await store.resolve(ref, { pull: 'never' });
    expect([inotifyWatchesOn(dirs), openFdsIn(refs)]).toEqual([2, 1]);
    await store.close();
    expect([inotifyWatchesOn(dirs), openFdsIn(refs)]).toEqual([0, 0]);
    expect(store.cached(ref)).toBeUndefined();
    const b = await store.resolve(ref, { pull: 'never' });
    expect([b.digest, store.cached(ref)]).toEqual([a.digest, b]);
    expect([inotifyWatchesOn(dirs), openFdsIn(refs)]).toEqual([2, 1]);
    await store.close();
    await store.close(); // twice is fine
    expect([inotifyWatchesOn(dirs), openFdsIn(refs)]).toEqual([0, 0]);
  });

  it('rm and prune: unused layers go, layers a live sandbox uses stay', async () => {
    const inUse = new Set<string>();
    const store = freshStore({ inUse: (d) => inUse.has(d) });
    const ref = `${reg.host}/test/busybox:v1`;
    const r = await store.resolve(ref);
    inUse.add(r.layers[0]!);
    const res = await store.remove(ref);
    expect(res.keptInUse).toEqual([img.layers[0]!.diffId]);
    expect(res.removedLayers).toEqual([img.layers[1]!.diffId]);
    expect(statSync(r.layers[0]!).isDirectory()).toBe(true);
    expect(store.list()).toEqual([]);
    await expect(store.remove(ref)).rejects.toMatchObject({ code: 'IMAGE_NOT_FOUND' });
    inUse.clear();
    expect((await store.prune()).removedLayers).toEqual([img.layers[0]!.diffId]);
    expect(readdirSync(join(stateDir, 'images', 'layers'))).toEqual([]);
    expect(readdirSync(join(stateDir, 'images', 'blobs'))).toEqual([]);
  });
});

describe.skipIf(!canRunRegistry)('token auth (distribution token spec) against a real registry', () => {
  it('gets a bearer token with the configured credentials; wrong or missing ones are IMAGE_AUTH_FAILED', async () => {
    // Push without auth, then serve the same storage with token auth.
    const open = await startRegistry({ storage: `${STATE}-auth-storage` });
    const img = imageOf([layerOf(await tarOf(busyboxEntries()), 'gzip')]);
    try {
      await pushImage(open.host, 'team/app', 'v1', img);
    } finally {
      await open.close();
    }
    const token = await startTokenService('alice', 's3cret');
    const reg = await startRegistry({ storage: `${STATE}-auth-storage`, token });
    const stateDir = `${STATE}/auth-${process.pid}`;
    try {
      const ref = `${reg.host}/team/app:v1`;
      const none = new ImageStore({ stateDir });
      await expect(none.resolve(ref)).rejects.toMatchObject({ code: 'IMAGE_AUTH_FAILED' });
      const wrong = new ImageStore({
        stateDir,
        credentials: () => ({ username: 'alice', password: 'nope' }),
      });
      await expect(wrong.resolve(ref)).rejects.toMatchObject({ code: 'IMAGE_AUTH_FAILED' });
      const good = new ImageStore({
        stateDir,
        credentials: (h) => (h === reg.host ? { username: 'alice', password: 's3cret' } : undefined),
      });
      const r = await good.resolve(ref);
      expect(r.digest).toBe(img.digest);
      expect(token.issued).toBeGreaterThan(0);
      expect(leftovers(stateDir)).toEqual([]);
    } finally {
      await reg.close();
      await token.close();
      rmSync(`${STATE}-auth-storage`, { recursive: true, force: true });
      rmSync(stateDir, { recursive: true, force: true });
    }
  });
});
