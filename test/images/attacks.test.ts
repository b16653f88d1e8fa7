// Attacks on the image store, through a real registry: tampered blobs (written into the registry's own
// storage), lying manifests and configs, hostile layer tars (traversal, absolute names, writes through
// symlinks, hard links out of the layer, setuid, devices), size caps and decompression bombs. After
// every failure: the typed error, and nothing half-unpacked left in the store.
import {
  existsSync,
  lstatSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import { join } from 'node:path';
import { gzipSync } from 'node:zlib';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AirlockError, type AirlockErrorCode } from '../../src/core/errors.js';
import { ImageStore } from '../../src/images/store.js';
import {
  busyboxEntries,
  imageOf,
  layerOf,
  pushImage,
  registryBlobFile,
  sha256,
  tarOf,
  zstdFrame,
  type TarEntry,
  type TestImage,
  type TestLayer,
} from './build.js';
import { canRunRegistry, startRegistry, type TestRegistry } from './registry.js';

const STATE = `${process.env.AIRLOCK_TEST_STATE_DIR ?? '/var/tmp/airlock-test'}-images-attacks`;

describe.skipIf(!canRunRegistry)('image store attacks', () => {
  let reg: TestRegistry;
  let n = 0;
  const outside = `${STATE}-outside`;

  beforeAll(async () => {
    rmSync(STATE, { recursive: true, force: true });
    mkdirSync(outside, { recursive: true });
    reg = await startRegistry();
  });
  afterAll(async () => {
    await reg?.close();
    rmSync(STATE, { recursive: true, force: true });
    rmSync(outside, { recursive: true, force: true });
  });

  /** Pushes `img` as a fresh repo and pulls it into a fresh store; returns the error (or undefined). */
  async function pullFails(
    img: TestImage,
    o: { maxImageBytes?: number; tamper?: () => void } = {},
  ): Promise<{ error: unknown; stateDir: string }> {
    const repo = `attack/case${n++}`;
    await pushImage(reg.host, repo, 'v1', img);
    o.tamper?.();
    const stateDir = join(STATE, String(n));
    const store = new ImageStore({
      stateDir,
      ...(o.maxImageBytes ? { maxImageBytes: o.maxImageBytes } : {}),
    });
    const error = await store.resolve(`${reg.host}/${repo}:v1`).then(
      () => undefined,
      (e: unknown) => e,
    );
    return { error, stateDir };
  }

  /**
   * After a failed pull the store holds no ref, no temp or trash dir, and no layer but complete,
   * verified ones that came before the failure (the busybox layer under a hostile one).
   */
  function expectNothingKept(stateDir: string, good: readonly string[] = []): void {
    const ls = (d: string): string[] => (existsSync(d) ? readdirSync(d) : []);
    const layers = ls(join(stateDir, 'images', 'layers'));
    expect(layers.filter((l) => !good.includes(l))).toEqual([]);
    for (const l of layers)
      expect(existsSync(join(stateDir, 'images', 'layers', l, 'layer.json'))).toBe(true);
    expect(ls(join(stateDir, 'images', 'refs'))).toEqual([]);
  }

  function expectCode(e: unknown, code: AirlockErrorCode, text?: string): void {
    expect(AirlockError.isInstance(e) ? `${e.code}: ${e.message}` : String(e)).toContain(code);
    if (text) expect((e as Error).message).toContain(text);
  }

  const unsafeLayer = async (entries: TarEntry[]): Promise<TestImage> =>
    imageOf([layerOf(await tarOf(busyboxEntries()), 'gzip'), layerOf(await tarOf(entries), 'gzip')]);

  it('a layer blob tampered with in the registry: IMAGE_DIGEST_MISMATCH, nothing kept', async () => {
    const img = imageOf([
      layerOf(await tarOf([...busyboxEntries(), { name: 'unique', content: 'tamper' }]), 'gzip'),
    ]);
    const layer = img.layers[0]!;
    const { error, stateDir } = await pullFails(img, {
      tamper: () => {
        const f = registryBlobFile(reg.storage, sha256(layer.blob));
        const b = readFileSync(f);
        b[b.length - 20]! ^= 0xff; // same size, different bytes
        writeFileSync(f, b);
      },
    });
    expectCode(error, 'IMAGE_DIGEST_MISMATCH');
    expectNothingKept(stateDir);
  });

  it('a manifest tampered with in the registry: IMAGE_DIGEST_MISMATCH', async () => {
    const img = imageOf([layerOf(await tarOf([{ name: 'f', content: String(Math.random()) }]), 'gzip')]);
    const { error, stateDir } = await pullFails(img, {
      tamper: () => {
        const f = registryBlobFile(reg.storage, img.digest);
        writeFileSync(f, readFileSync(f, 'utf8').replace('"schemaVersion":2', '"schemaVersion":2 '));
      },
    });
    expectCode(error, 'IMAGE_DIGEST_MISMATCH', 'manifest');
    expectNothingKept(stateDir);
  });

  it('a config tampered with in the registry: IMAGE_DIGEST_MISMATCH', async () => {
    const img = imageOf([layerOf(await tarOf([{ name: 'f', content: String(Math.random()) }]), 'gzip')]);
    const { error, stateDir } = await pullFails(img, {
      tamper: () => {
        const f = registryBlobFile(reg.storage, sha256(img.config));
        writeFileSync(f, readFileSync(f, 'utf8').replace('/bin/sh', '/bin/xx'));
      },
    });
    expectCode(error, 'IMAGE_DIGEST_MISMATCH', 'config');
    expectNothingKept(stateDir);
  });

  it("a config whose diff_ids do not match the layers' uncompressed bytes: IMAGE_DIGEST_MISMATCH", async () => {
    const l = layerOf(await tarOf([{ name: 'f', content: String(Math.random()) }]), 'gzip');
    const img = imageOf([l], { diffIds: [sha256('something else')] });
    const { error, stateDir } = await pullFails(img);
    expectCode(error, 'IMAGE_DIGEST_MISMATCH', 'diff_id');
    expectNothingKept(stateDir);
  });

  it('a manifest that understates a layer size: refused before or while reading the extra bytes', async () => {
    const l = layerOf(await tarOf(busyboxEntries()), 'gzip');
    const lie: TestLayer = { ...l };
    const img = imageOf([lie]);
    const m = JSON.parse(img.manifest.toString()) as { layers: Array<{ size: number }> };
    m.layers[0]!.size = 1000;
    const manifest = Buffer.from(JSON.stringify(m));
    const { error, stateDir } = await pullFails({ ...img, manifest, digest: sha256(manifest) });
    expectCode(error, 'IMAGE_DIGEST_MISMATCH');
    expectNothingKept(stateDir);
  });

  for (const [title, entries, name] of [
    ['a "../" entry', [{ name: '../escape', content: 'x' }], '../escape'],
    ['a nested "a/../../" entry', [{ name: 'a/../../escape', content: 'x' }], 'a/../../escape'],
    ['an absolute name', [{ name: '/etc/escape', content: 'x' }], '/etc/escape'],
    [
      'a symlink, then a write through it',
      [
        { name: 'lnk', type: 'symlink', linkname: `${STATE}-outside` },
        { name: 'lnk/planted', content: 'x' },
      ],
      'lnk/planted',
    ],
    [
      'a symlink to a dir, then a directory through it',
      [
        { name: 'd', type: 'symlink', linkname: '/' },
        { name: 'd/tmp/x/', type: 'directory' },
      ],
      'd/tmp/x',
    ],
    ['a hard link to a host file', [{ name: 'pw', type: 'link', linkname: '/etc/passwd' }], 'pw'],
    [
      'a hard link out through ".."',
      [{ name: 'pw', type: 'link', linkname: '../../../../etc/passwd' }],
      'pw',
    ],
    ["a hard link to a lower layer's file", [{ name: 'bb', type: 'link', linkname: 'bin/busybox' }], 'bb'],
    [
      'a hard link to a symlink of the same layer',
      [
        { name: 's', type: 'symlink', linkname: '/etc/passwd' },
        { name: 'h', type: 'link', linkname: 's' },
      ],
      'h',
    ],
    ['a whiteout of ".."', [{ name: 'etc/.wh...' }], '.wh...'],
  ] as Array<[string, TarEntry[], string]>) {
    it(`refuses ${title}: IMAGE_LAYER_UNSAFE naming the entry, nothing written anywhere`, async () => {
      const { error, stateDir } = await pullFails(await unsafeLayer(entries));
      expectCode(error, 'IMAGE_LAYER_UNSAFE', name);
      expectNothingKept(stateDir, [sha256(await tarOf(busyboxEntries()))]);
      expect(readdirSync(outside)).toEqual([]);
      expect(existsSync(join(STATE, '..', 'escape'))).toBe(false);
      expect(existsSync('/etc/escape')).toBe(false);
      expect(existsSync('/tmp/x')).toBe(false);
    });
  }

  it('strips setuid/setgid, skips device nodes and FIFOs, keeps the sticky bit', async () => {
    const img = imageOf([
      layerOf(
        await tarOf([
          { name: 'suid', content: '#!/bin/sh\n', mode: 0o4755 },
          { name: 'sgid-dir/', type: 'directory', mode: 0o2775 },
          { name: 'tmp/', type: 'directory', mode: 0o1777 },
          { name: 'null', type: 'character-device' },
          { name: 'disk', type: 'block-device' },
          { name: 'fifo', type: 'fifo' },
        ]),
        'gzip',
      ),
    ]);
    await pushImage(reg.host, 'attack/modes', 'v1', img);
    const store = new ImageStore({ stateDir: join(STATE, 'modes') });
    const [l] = (await store.resolve(`${reg.host}/attack/modes:v1`)).layers as [string];
    expect(statSync(join(l, 'suid')).mode & 0o7777).toBe(0o755);
    expect(statSync(join(l, 'sgid-dir')).mode & 0o7777).toBe(0o775);
    expect(statSync(join(l, 'tmp')).mode & 0o7777).toBe(0o1777);
    for (const skipped of ['null', 'disk', 'fifo']) expect(existsSync(join(l, skipped))).toBe(false);
  });

  it('maxImageBytes: refused from the manifest sizes before any layer is fetched', async () => {
    const img = imageOf([layerOf(await tarOf(busyboxEntries()), 'gzip')]);
    const { error, stateDir } = await pullFails(img, { maxImageBytes: 100_000 });
    expectCode(error, 'IMAGE_TOO_LARGE', 'manifest lists');
    expectNothingKept(stateDir);
  });

  it('a gzip bomb (small download, huge tar) stops at maxImageBytes while streaming', async () => {
    const tar = await tarOf([{ name: 'zeros', content: Buffer.alloc(64 * 1024 * 1024) }]);
    const l: TestLayer = {
      blob: gzipSync(tar, { level: 9 }),
      mediaType: 'application/vnd.oci.image.layer.v1.tar+gzip',
      diffId: sha256(tar),
    };
    expect(l.blob.length).toBeLessThan(1024 * 1024);
    const { error, stateDir } = await pullFails(imageOf([l]), { maxImageBytes: 8 * 1024 * 1024 });
    expectCode(error, 'IMAGE_TOO_LARGE', 'unpacks past the cap');
    expectNothingKept(stateDir);
  });

  it('a zstd bomb stops at maxImageBytes too', async () => {
    const tar = await tarOf([{ name: 'zeros', content: Buffer.alloc(64 * 1024 * 1024) }]);
    const blob = zstdFrame(tar); // RLE blocks: 64 MiB of zeros in a few KiB
    const l: TestLayer = {
      blob,
      mediaType: 'application/vnd.oci.image.layer.v1.tar+zstd',
      diffId: sha256(tar),
    };
    const { error, stateDir } = await pullFails(imageOf([l]), { maxImageBytes: 8 * 1024 * 1024 });
    expectCode(error, 'IMAGE_TOO_LARGE');
    expectNothingKept(stateDir);
  });

  it('a layer that is not a tar at all: refused, nothing kept', async () => {
    const junk = Buffer.from('this is not a tar archive, just text that goes on '.repeat(40));
    const l: TestLayer = {
      blob: gzipSync(junk),
      mediaType: 'application/vnd.oci.image.layer.v1.tar+gzip',
      diffId: sha256(junk),
    };
    const { error, stateDir } = await pullFails(imageOf([l]));
    expect(AirlockError.isInstance(error) || error instanceof Error).toBe(true);
    expectNothingKept(stateDir);
  });

  it('the same layer in two images is unpacked once and the symlink in it is kept as text', async () => {
    const tar = await tarOf([{ name: 'up', type: 'symlink', linkname: '../../../../etc' }]);
    const img = imageOf([layerOf(tar, 'gzip')]);
    await pushImage(reg.host, 'attack/link', 'v1', img);
    const store = new ImageStore({ stateDir: join(STATE, 'link') });
    const [l] = (await store.resolve(`${reg.host}/attack/link:v1`)).layers as [string];
    expect(lstatSync(join(l, 'up')).isSymbolicLink()).toBe(true);
  });
});
