// The image fields of a sandbox spec: `image` and `pull` are public, `rootfs` is internal and never
// accepted from a remote client; a runtime without an image store refuses `image` with a typed error.
import { describe, expect, it } from 'vitest';
import { Airlock } from '../../src/index.js';
import { parseSandboxSpec } from '../../src/core/spec.js';
import { CreateRequestSchema } from '../../src/server/contract.js';
import { TEST_STATE_DIR, TEST_UID_RANGE } from '../helpers.js';

const CONFIG = { env: [], workingDir: '', user: '', entrypoint: [], cmd: [], labels: {} };

describe('image spec fields', () => {
  it('accepts image and pull, and refuses pull without image', () => {
    expect(parseSandboxSpec({ image: 'example.com/a/b:1', pull: 'never' })).toMatchObject({ pull: 'never' });
    expect(() => parseSandboxSpec({ pull: 'always' })).toThrow(expect.objectContaining({ field: 'pull' }));
    expect(() => parseSandboxSpec({ image: 'a', pull: 'sometimes' })).toThrow(
      expect.objectContaining({ code: 'INVALID_SPEC', field: 'pull' }),
    );
    expect(() => parseSandboxSpec({ image: 'has space' })).toThrow(
      expect.objectContaining({ field: 'image' }),
    );
  });

  it('refuses image together with a template or snapshot layers', () => {
    expect(() => parseSandboxSpec({ image: 'a:1', template: 'py' })).toThrow(
      expect.objectContaining({ field: 'image' }),
    );
    expect(() => parseSandboxSpec({ image: 'a:1', layers: [`sha256:${'a'.repeat(64)}`] })).toThrow(
      expect.objectContaining({ field: 'image' }),
    );
  });

  it('checks rootfs layer paths (absolute, normalised, nothing overlayfs would misread)', () => {
    const spec = (layers: string[]): unknown => ({ rootfs: { layers, config: CONFIG } });
    expect(parseSandboxSpec(spec(['/var/lib/x/l1'])).rootfs?.layers).toEqual(['/var/lib/x/l1']);
    expect(parseSandboxSpec(spec(['/var/lib/x/sha256:ab/fs'])).rootfs?.layers).toEqual([
      '/var/lib/x/sha256:ab/fs',
    ]);
    for (const bad of [['relative'], ['/a/../etc'], ['/a,upperdir=/tmp'], []]) {
      expect(() => parseSandboxSpec(spec(bad)), JSON.stringify(bad)).toThrow(
        expect.objectContaining({ code: 'INVALID_SPEC' }),
      );
    }
  });

  it('a remote create request may not carry rootfs (internal: host paths)', () => {
    const r = CreateRequestSchema.safeParse({ rootfs: { layers: ['/etc'], config: CONFIG } });
    expect(r.success).toBe(false);
  });

  it("a resolver's answer is checked like a spec (relative layer dirs are refused before any host work)", async () => {
    const airlock = new Airlock({
      stateDir: TEST_STATE_DIR,
      uidRange: TEST_UID_RANGE,
      warmPool: 0,
      images: {
        resolve: async (ref) => ({
          ref,
          digest: `sha256:${'b'.repeat(64)}`,
          layers: ['relative/layer'],
          config: CONFIG,
        }),
      },
    });
    try {
      await expect(airlock.create({ image: 'example.com/a/b:1' })).rejects.toMatchObject({
        code: 'INVALID_SPEC',
        field: 'layers.0',
      });
    } finally {
      await airlock.close();
    }
  });

  it('with images turned off, image is refused with BACKEND_UNAVAILABLE naming the field', async () => {
    const airlock = new Airlock({
      stateDir: TEST_STATE_DIR,
      uidRange: TEST_UID_RANGE,
      warmPool: 0,
      images: false,
    });
    try {
      await expect(airlock.create({ image: 'example.com/a/b:1' })).rejects.toMatchObject({
        code: 'BACKEND_UNAVAILABLE',
        field: 'image',
        message: expect.stringContaining('images are not available'),
      });
    } finally {
      await airlock.close();
    }
  });
});
