// `airlock image ls|pull|load|rm|prune` as a user runs them (the CLI spawned through tsx), against
// a real registry; exit codes for bad references and unknown images.
import { rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runCli, TEST_STATE_DIR } from '../helpers.js';
import { busyboxEntries, imageOf, layerOf, pushImage, tarOf, type TestImage } from './build.js';
import { canRunRegistry, startRegistry, type TestRegistry } from './registry.js';

describe.skipIf(!canRunRegistry)('airlock image (CLI)', () => {
  let reg: TestRegistry;
  let img: TestImage;
  const images = join(TEST_STATE_DIR, 'images');

  beforeAll(async () => {
    rmSync(images, { recursive: true, force: true });
    reg = await startRegistry();
    img = imageOf([layerOf(await tarOf(busyboxEntries()), 'gzip')]);
    await pushImage(reg.host, 'cli/bb', 'v1', img);
  });
  afterAll(async () => {
    await reg?.close();
    rmSync(images, { recursive: true, force: true });
  });

  it('pull prints progress lines (not a TTY) and the digest; ls lists it; rm and prune free it', async () => {
    const ref = `${reg.host}/cli/bb:v1`;
    const pull = await runCli(['image', 'pull', ref]);
    expect(pull.stderr).toContain(`${ref}: ${img.digest}, 1 layer`);
    expect(pull.stderr).toMatch(/layer 1\/1 sha256:[0-9a-f]{12}: .* pulled/);
    expect(pull.stdout).toBe(`${ref} ${img.digest}\n`);
    expect(pull.code).toBe(0);
    const again = await runCli(['image', 'pull', ref]);
    expect(again.stderr).toContain('cached');
    const ls = await runCli(['image', 'ls', '--json']);
    const list = JSON.parse(ls.stdout) as Array<{
      ref: string;
      digest: string;
      layers: number;
      sizeBytes: number;
    }>;
    expect(list.map((i) => [i.ref, i.digest, i.layers])).toEqual([[ref, img.digest, 1]]);
    expect(list[0]!.sizeBytes).toBeGreaterThan(1_000_000); // busybox
    expect((await runCli(['image', 'ls'])).stdout).toMatch(/^REF\s+DIGEST\s+LAYERS\s+SIZE\s+PULLED\n/);
    const rm = await runCli(['image', 'rm', ref]);
    expect([rm.code, rm.stdout]).toEqual([0, `removed ${ref} (1 layer freed)\n`]);
    expect((await runCli(['image', 'ls'])).stdout).toContain('no images');
  });

  it('load a docker save tarball under --name', async () => {
    const tar = await tarOf(busyboxEntries());
    const file = join(TEST_STATE_DIR, 'cli-save.tar');
    writeFileSync(
      file,
      await tarOf([
        {
          name: 'manifest.json',
          content: JSON.stringify([{ Config: 'c.json', RepoTags: null, Layers: ['l.tar'] }]),
        },
        { name: 'c.json', content: img.config },
        { name: 'l.tar', content: tar },
      ]),
    );
    const r = await runCli(['image', 'load', file, '--name', 'local/bb:1', '--json']);
    rmSync(file);
    expect(r.code).toBe(0);
    expect((JSON.parse(r.stdout) as Array<{ ref: string }>)[0]!.ref).toBe('local/bb:1');
    expect((await runCli(['image', 'prune', '--json'])).code).toBe(0);
    expect((await runCli(['image', 'rm', 'local/bb:1'])).code).toBe(0);
  });

  it('exit codes: 2 for a bad reference, 3 for an unknown image, with what to fix', async () => {
    const bad = await runCli(['image', 'pull', 'Bad/Name']);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toContain('invalid path component "Bad"');
    const unknown = await runCli(['image', 'pull', `${reg.host}/cli/none:v1`]);
    expect(unknown.code).toBe(3);
    expect(unknown.stderr).toContain('not found');
    const rm = await runCli(['image', 'rm', 'never/pulled:v1']);
    expect(rm.code).toBe(3);
  });
});
