// `image` through a real `airlock serve` (and its supervisor) with the loopback registry: refused by
// default (the message names the config key), allowed only from the registries the operator lists
// in the server config (images.registries), and then the sandbox runs on the pulled image.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { canRunNamespaces, NO_RESIDUE, settledResidue, SKIP_REASON } from '../helpers.js';
import { create, errorOf, exec, kill } from '../server/serve-api.js';
import { call, newKey, startServe, stopServe, stopSupervisor, type Served } from '../server/serve-helpers.js';
import { busyboxEntries, imageOf, layerOf, pushImage, tarOf } from './build.js';
import { canRunRegistry, startRegistry, type TestRegistry } from './registry.js';

describe.skipIf(!canRunNamespaces || !canRunRegistry)(
  `airlock serve: images from allowed registries only (${SKIP_REASON}; and docker-registry)`,
  () => {
    let reg: TestRegistry;
    let ref: string;
    let s: Served | undefined;
    beforeAll(async () => {
      await stopSupervisor();
      reg = await startRegistry();
      const img = imageOf([layerOf(await tarOf(busyboxEntries()))], {
        config: { Env: ['PATH=/bin', 'FROM_IMAGE=yes'], Cmd: ['/bin/sh'] },
      });
      await pushImage(reg.host, 'team/busybox', 'v1', img);
      ref = `${reg.host}/team/busybox:v1`;
    }, 120_000);
    afterAll(async () => {
      if (s) await stopServe(s);
      await stopSupervisor();
      await reg?.close();
      expect(await settledResidue(5000)).toEqual(NO_RESIDUE);
    }, 120_000);

    const createImage = (key: string, image: string): Promise<Response> =>
      call(s!.url, key, 'POST', '/v1/sandboxes', { image });

    it('default config: a create naming an image is refused, naming images.registries', async () => {
      s = await startServe();
      const key = newKey('img-tenant').key;
      const r = await createImage(key, ref);
      expect(r.status).toBe(403);
      const e = await errorOf(r);
      expect(e.code).toBe('PERMISSION_DENIED');
      expect(e.message).toMatch(/images\.registries/);
      await stopServe(s);
      s = undefined;
    }, 120_000);

    it('allowed registry: the sandbox runs on the pulled image; other registries and bare names are refused', async () => {
      s = await startServe({ images: { registries: [reg.host] } });
      const key = newKey('img-tenant').key;
      const v = await create(s.url, key, { image: ref });
      try {
        const r = await exec(s.url, key, v.id, [
          'sh',
          '-c',
          'cat /etc/motd; echo $FROM_IMAGE; test -e /usr/bin/perl || echo no-host-usr',
        ]);
        expect(r.exitCode).toBe(0);
        expect(r.stdout).toBe('hello from layer 1\nyes\nno-host-usr\n');
      } finally {
        await kill(s.url, key, v.id);
      }
      for (const other of [
        'registry.example.com/team/busybox:v1',
        'team/busybox:v1',
        '127.0.0.1:1/team/busybox:v1',
      ]) {
        const r = await createImage(key, other);
        expect(r.status, other).toBe(403);
        const e = await errorOf(r);
        expect(e.code).toBe('PERMISSION_DENIED');
        expect(e.message).toContain(reg.host);
      }
      // an image that is not in the allowed registry: the pull's own typed error
      const missing = await createImage(key, `${reg.host}/team/none:v1`);
      expect((await errorOf(missing)).code).toBe('IMAGE_NOT_FOUND');
      // internal fields stay refused by the request schema
      const raw = await call(s.url, key, 'POST', '/v1/sandboxes', { rootfs: { layers: ['/'] } });
      expect(raw.status).toBe(400);
    }, 180_000);

    it('executables: an allowlist root by program name; host paths and bad names are refused', async () => {
      s ??= await startServe({ images: { registries: [reg.host] } });
      const key = newKey('img-tenant').key;
      const v = await create(s.url, key, { executables: ['python3'] });
      try {
        const ok = await exec(s.url, key, v.id, ['python3', '-c', 'print(6*7)']);
        expect(ok.stdout).toBe('42\n');
        const sh = await exec(s.url, key, v.id, ['sh', '-c', 'echo reached']);
        expect(sh.exitCode).toBe(127);
        expect(sh.stdout).toBe('');
      } finally {
        await kill(s.url, key, v.id);
      }
      for (const bad of [['/etc/shadow'], [], ['a b'], ['..']]) {
        const r = await call(s.url, key, 'POST', '/v1/sandboxes', { executables: bad });
        expect(r.status, JSON.stringify(bad)).toBe(400);
        expect((await errorOf(r)).message, JSON.stringify(bad)).toMatch(/executables/);
      }
    }, 180_000);
  },
);
