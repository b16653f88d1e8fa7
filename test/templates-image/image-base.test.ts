// Templates on an image (`base: image:<ref>`, `FROM <image>`): the steps run on the image's root, and
// what they changed there (added, deleted, replaced) is captured as a layer above the image's layers
// (host/layer-capture.privileged.ts, area `root`). A sandbox from the template sees exactly that; a
// hostile step (setuid bit, device node, symlink to the host's /etc/shadow, a file past the cap)
// carries nothing dangerous into the layer. Real registry, real sandboxes.
import { lstatSync, mkdtempSync, readlinkSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AirlockError } from '../../src/core/errors.js';
import { Airlock } from '../../src/sandbox/airlock.js';
import { NO_RESIDUE, runCli, settledResidue, TEST_STATE_DIR, TEST_UID_RANGE } from '../helpers.js';
import { busyboxEntries, imageOf, layerOf, pushImage, tarOf, type TestImage } from '../images/build.js';
import { canRunRegistry, startRegistry, type TestRegistry } from '../images/registry.js';

const layerFile = (digest: string, rel: string): string => join(TEST_STATE_DIR, 'layers', digest, 'fs', rel);

describe.skipIf(!canRunRegistry)('templates on an image from a real registry', () => {
  let reg: TestRegistry;
  let img: TestImage;
  let ref: string;
  let airlock: Airlock;

  beforeAll(async () => {
    reg = await startRegistry();
    img = imageOf([layerOf(await tarOf(busyboxEntries()), 'gzip')], {
      config: { Env: ['PATH=/bin', 'FROM_IMAGE=yes'], WorkingDir: '/', Cmd: ['echo', 'image-cmd'] },
    });
    await pushImage(reg.host, 'team/tbase', 'v1', img);
    ref = `${reg.host}/team/tbase:v1`;
    airlock = new Airlock({ stateDir: TEST_STATE_DIR, uidRange: TEST_UID_RANGE, warmPool: 0 });
  });
  afterAll(async () => {
    for (const t of await airlock.templates.list()) await airlock.templates.remove(t.name).catch(() => {});
    await airlock?.close();
    await reg?.close();
    expect(await settledResidue()).toEqual(NO_RESIDUE);
  }, 60_000);

  it('a step adds a file, deletes an image file and replaces a dir: a sandbox from it sees exactly that', async () => {
    const t = await airlock.templates.build({
      name: 'img-changes',
      base: `image:${ref}`,
      files: [{ path: '/workspace/note', content: 'from files\n' }],
      steps: [
        { run: 'rm /etc/motd && rm -rf /opt/data && mkdir /opt/data && echo new > /opt/data/n' },
        // Another network policy: a second build sandbox, on the first one's layer.
        { run: 'echo added > /etc/added', network: { allow: ['example.com'] } },
      ],
      config: { env: ['FROM_TEMPLATE=1'], cmd: ['cat', '/etc/added'] },
    });
    expect(t.layers).toHaveLength(2);
    expect(t.image).toEqual({ ref, digest: img.digest });
    expect(t.base).toEqual({ ref: `image:${ref}`, digest: img.digest });
    // In the layer store's form: a whiteout for the deletion, an opaque marker on the replaced dir.
    const wh = lstatSync(layerFile(t.layers[1]!, 'root/etc/motd'));
    expect(wh.isCharacterDevice() && wh.rdev === 0).toBe(true);
    // What Airlock itself writes into the root is not captured.
    expect(lstatSync(layerFile(t.layers[1]!, 'root/etc/passwd'), { throwIfNoEntry: false })).toBeUndefined();

    const sbx = await airlock.create({ template: 'img-changes' });
    try {
      expect(sbx.info.image).toEqual({ ref, digest: img.digest });
      const r = await sbx.exec([
        'sh',
        '-c',
        'cat /etc/added; ls /opt/data; test -e /etc/motd || echo motd-gone; cat /workspace/note; ' +
          'echo $FROM_IMAGE $FROM_TEMPLATE; grep -c "^user:" /etc/passwd',
      ]);
      expect(r.stderr).toBe('');
      expect(r.stdout).toBe('added\nn\nmotd-gone\nfrom files\nyes 1\n1\n');
      // The sandbox's own writes stay its own: a second sandbox on the template does not see them.
      await sbx.exec(['sh', '-c', 'echo mine > /etc/added']);
    } finally {
      await sbx.kill();
    }
    const again = await airlock.create({ template: 'img-changes' });
    try {
      expect((await again.exec(['cat', '/etc/added'])).stdout).toBe('added\n');
      // CMD of the template (run with no command by the CLI) is its config over the image's.
      expect(again.spec.rootfs?.config.cmd).toEqual(['cat', '/etc/added']);
    } finally {
      await again.kill();
    }
    const run = await runCli(['run', '--template', 'img-changes']);
    expect(run.stderr).toBe('');
    expect(run.stdout).toBe('added\n');
  }, 180_000);

  it('a hostile step: no setuid bit, no device node, a symlink stays a symlink inside the sandbox', async () => {
    const t = await airlock.templates.build({
      name: 'img-hostile',
      base: `image:${ref}`,
      steps: [
        {
          run:
            'cp /bin/busybox /opt/suid && chmod 6755 /opt/suid && ln /opt/suid /opt/hard; ' +
            'busybox mknod /opt/null c 1 3 2>/dev/null; ln -s /etc/shadow /opt/shadow; ' +
            'busybox mkfifo /opt/fifo; true',
        },
      ],
    });
    const top = t.layers[0]!;
    expect(lstatSync(layerFile(top, 'root/opt/suid')).mode & 0o7777).toBe(0o755);
    expect(lstatSync(layerFile(top, 'root/opt/hard')).ino).toBe(
      lstatSync(layerFile(top, 'root/opt/suid')).ino,
    );
    expect(lstatSync(layerFile(top, 'root/opt/null'), { throwIfNoEntry: false })).toBeUndefined();
    expect(readlinkSync(layerFile(top, 'root/opt/shadow'))).toBe('/etc/shadow');
    const sbx = await airlock.create({ template: 'img-hostile' });
    try {
      const r = await sbx.exec(['sh', '-c', 'busybox stat -c %a /opt/suid; cat /opt/shadow; echo rc=$?']);
      expect(r.stdout).toMatch(/^755\n/);
      // The image has no /etc/shadow: the link resolves inside the sandbox's root, never the host's.
      expect(r.stdout).toMatch(/rc=1\n$/);
      expect(r.stdout).not.toMatch(/root:/);
    } finally {
      await sbx.kill();
    }
  }, 120_000);

  it('a file past the cap (sparse, apparent size over the disk) fails the build with DISK_FULL, leaving no layer', async () => {
    const before = (await airlock.templates.list()).length;
    let err: unknown;
    try {
      await airlock.templates.build({
        name: 'img-huge',
        base: `image:${ref}`,
        limits: { diskBytes: 64 * 1024 * 1024 },
        steps: [{ run: 'busybox truncate -s 1G /opt/huge' }],
      });
    } catch (e) {
      err = e;
    }
    expect(AirlockError.isInstance(err) && err.code).toBe('DISK_FULL');
    expect((await airlock.templates.list()).length).toBe(before);
  }, 120_000);

  it('airlock template build -f: FROM <image>, CMD and ENV kept', async () => {
    const ctx = mkdtempSync('/tmp/airlock-df-img-');
    try {
      writeFileSync(
        join(ctx, 'Dockerfile'),
        `FROM ${ref}\nENV GREETING=hi\nRUN echo built > /etc/built\nCMD ["sh", "-c", "echo $GREETING; cat /etc/built"]\n`,
      );
      const b = await runCli(['template', 'build', '-f', join(ctx, 'Dockerfile'), '--name', 'df-img'], {
        timeoutMs: 120_000,
      });
      expect(b.stderr).not.toMatch(/error/i);
      expect(b.code).toBe(0);
      const r = await runCli(['run', '--template', 'df-img']);
      expect(r.stdout).toBe('hi\nbuilt\n');
      expect(r.code).toBe(0);
    } finally {
      rmSync(ctx, { recursive: true, force: true });
    }
  }, 180_000);
});
