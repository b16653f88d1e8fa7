// Loading without a registry: an OCI image layout directory and a `docker save` tarball, built here
// from busybox-static's files, with the same verification as a pull (tampered blobs are refused).
import { readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AirlockError } from '../../src/core/errors.js';
import { loadImages } from '../../src/images/load.js';
import { ImageStore } from '../../src/images/store.js';
import {
  busyboxEntries,
  imageOf,
  layerOf,
  overlayEntries,
  sha256,
  tarOf,
  writeLayout,
  type TestImage,
} from './build.js';

const ROOT = `${process.env.AIRLOCK_TEST_STATE_DIR ?? '/var/tmp/airlock-test'}-images-load`;
const canRun = process.getuid?.() === 0;

describe.skipIf(!canRun)('image load (no registry)', () => {
  let img: TestImage;
  let tars: Buffer[];
  let n = 0;
  const fresh = (): ImageStore => new ImageStore({ stateDir: join(ROOT, `state-${n++}`) });

  beforeAll(async () => {
    rmSync(ROOT, { recursive: true, force: true });
    tars = [await tarOf(busyboxEntries()), await tarOf(overlayEntries())];
    img = imageOf([layerOf(tars[0]!, 'gzip'), layerOf(tars[1]!, 'none')], {
      config: { Env: ['PATH=/bin'], Cmd: ['/bin/sh'] },
    });
  });
  afterAll(() => rmSync(ROOT, { recursive: true, force: true }));

  it('an OCI layout directory: loads under its ref name, then resolves with pull "never"', async () => {
    const dir = join(ROOT, 'layout');
    writeLayout(dir, img, 'registry.example.com/team/bb:v1');
    const store = fresh();
    const [r] = await loadImages(store, dir);
    expect(r!.ref).toBe('registry.example.com/team/bb:v1');
    expect(r!.digest).toBe(img.digest);
    const again = await store.resolve('registry.example.com/team/bb:v1', { pull: 'never' });
    expect(again).toEqual(r);
    expect(readFileSync(join(again.layers[1]!, 'opt/data/c'), 'utf8')).toBe('c from layer 2\n');
    // A bare tag in ref.name names no repository: --name is required.
    const bare = join(ROOT, 'layout-bare');
    writeLayout(bare, img, 'v1');
    await expect(loadImages(fresh(), bare)).rejects.toThrow(/--name/);
    expect((await loadImages(fresh(), bare, { name: 'local/bb:v1' }))[0]!.ref).toBe('local/bb:v1');
  });

  it('an OCI layout with a tampered layer blob: IMAGE_DIGEST_MISMATCH, nothing kept', async () => {
    const dir = join(ROOT, 'layout-tampered');
    writeLayout(dir, img, 'registry.example.com/team/bb:v1');
    const f = join(dir, 'blobs', 'sha256', sha256(img.layers[1]!.blob).slice(7));
    const b = readFileSync(f);
    b[600]! ^= 1;
    writeFileSync(f, b);
    const store = fresh();
    const e = await loadImages(store, dir).catch((x: unknown) => x);
    expect(AirlockError.is(e, 'IMAGE_DIGEST_MISMATCH')).toBe(true);
    expect(store.list()).toEqual([]);
    expect(readdirSync(join(store.root, 'layers')).filter((l) => l.startsWith('.'))).toEqual([]);
  });

  it('a docker save tarball (manifest.json, config, layer tars, a symlinked repeated layer)', async () => {
    const config = img.config;
    const tarball = await tarOf([
      {
        name: 'manifest.json',
        content: JSON.stringify([
          {
            Config: 'cfg.json',
            RepoTags: ['bb:latest', 'registry.example.com/bb:1'],
            Layers: ['l1/layer.tar', 'l2/layer.tar'],
          },
        ]),
      },
      { name: 'cfg.json', content: config },
      { name: 'l1/', type: 'directory' },
      { name: 'l1/layer.tar', content: tars[0]! },
      { name: 'l2/', type: 'directory' },
      { name: 'real/layer.tar', content: tars[1]! },
      { name: 'l2/layer.tar', type: 'symlink', linkname: '../real/layer.tar' },
    ]);
    const file = join(ROOT, 'save.tar');
    writeFileSync(file, tarball);
    const store = fresh();
    const loaded = await loadImages(store, file);
    expect(loaded.map((r) => r.ref)).toEqual(['bb:latest', 'registry.example.com/bb:1']);
    expect(loaded[0]!.layers).toEqual(loaded[1]!.layers);
    expect(loaded[0]!.config.cmd).toEqual(['/bin/sh']);
    expect(
      readFileSync(join(loaded[0]!.layers[0]!, 'bin/busybox')).equals(readFileSync('/bin/busybox')),
    ).toBe(true);
    expect(readdirSync(store.root).filter((d) => d.startsWith('.load-'))).toEqual([]);
  });

  it('a docker save tarball whose layer does not match the config diff_ids: refused; a tarball escaping via a link: refused', async () => {
    const wrong = await tarOf([
      {
        name: 'manifest.json',
        content: JSON.stringify([{ Config: 'cfg.json', RepoTags: ['bb:bad'], Layers: ['l1.tar', 'l2.tar'] }]),
      },
      { name: 'cfg.json', content: img.config },
      { name: 'l1.tar', content: tars[1]! },
      { name: 'l2.tar', content: tars[0]! },
    ]);
    writeFileSync(join(ROOT, 'wrong.tar'), wrong);
    const store = fresh();
    await expect(loadImages(store, join(ROOT, 'wrong.tar'))).rejects.toMatchObject({
      code: 'IMAGE_DIGEST_MISMATCH',
    });
    expect(store.list()).toEqual([]);
    const escape = await tarOf([
      {
        name: 'manifest.json',
        content: JSON.stringify([{ Config: '../../etc/passwd', RepoTags: ['bb:x'], Layers: [] }]),
      },
    ]);
    writeFileSync(join(ROOT, 'escape.tar'), escape);
    await expect(loadImages(store, join(ROOT, 'escape.tar'))).rejects.toThrow(/points outside/);
    await expect(loadImages(store, join(ROOT, 'nope.tar'))).rejects.toMatchObject({ code: 'FILE_NOT_FOUND' });
  });
});
