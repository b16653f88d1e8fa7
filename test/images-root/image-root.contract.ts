// One suite of image-root cases, run against every tier (namespaces.test.ts, gvisor.test.ts): a
// sandbox on an image sees the image, never the host's /usr; writes land in its own upper dir and
// vanish with it; the image's config (env, working dir, user) applies; Airlock's own commands work
// on a shell-less image.
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { basename, join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Airlock, type Sandbox } from '../../src/index.js';
import type { BackendName } from '../../src/core/spec.js';
import { NO_RESIDUE, TEST_STATE_DIR, TEST_UID_RANGE, settledResidue } from '../helpers.js';
import { buildFixtures, type Fixtures } from './fixtures.js';

const BUSYBOX = 'example.com/test/busybox:1';
const PYTHON = 'example.com/test/python:3.11';
const PY_ONLY = 'example.com/test/python-only:3.11';

export function imageRootContract(backend: BackendName): void {
  describe(`image root: ${backend}`, () => {
    let fx: Fixtures;
    let airlock: Airlock;
    const before: Record<string, string> = {};
    const create = (image: string, extra: Record<string, unknown> = {}): Promise<Sandbox> =>
      airlock.create({ backend, image, ...extra });

    beforeAll(() => {
      fx = buildFixtures(mkdtempSync(join(`${TEST_STATE_DIR}-fixtures-`)));
      for (const [k, d] of Object.entries(fx.layers)) before[k] = fx.hash(d);
      airlock = new Airlock({ stateDir: TEST_STATE_DIR, uidRange: TEST_UID_RANGE, images: fx.resolver });
    }, 120_000);
    afterAll(async () => {
      await airlock?.close();
      if (fx) rmSync(fx.root, { recursive: true, force: true });
    });

    it("the host's /usr is not visible; the image's files are", async () => {
      const sbx = await create(BUSYBOX);
      try {
        const r = await sbx.exec('test -e /usr/bin/perl && echo host || echo absent; cat /etc/passwd');
        expect(r.stdout).toContain('absent');
        expect(r.exitCode).toBe(0);
        expect((await sbx.exec(['ls', '/opt/lower'])).stdout.split('\n').filter(Boolean)).toEqual(['c']);
        // Its owner.json names the image layers it runs on (an image store checks it before removing one).
        const owner = JSON.parse(
          readFileSync(join(TEST_STATE_DIR, 'sandboxes', sbx.id, 'owner.json'), 'utf8'),
        ) as { imageLayers?: string[] };
        expect(owner.imageLayers).toEqual([fx.layers.busybox, fx.layers.mask]);
        expect(sbx.info.image).toEqual({
          ref: BUSYBOX,
          digest: expect.stringMatching(/^sha256:[0-9a-f]{64}$/),
        });
      } finally {
        await sbx.kill();
      }
    });

    it('a whiteout hides a lower file, an opaque dir hides the lower contents', async () => {
      const sbx = await create(BUSYBOX);
      try {
        const r = await sbx.exec('test -e /etc/motd && echo motd; ls -a /opt/lower');
        expect(r.stdout).not.toContain('motd');
        expect(r.stdout).not.toMatch(/^a$|^b$/m);
        expect(r.stdout).toMatch(/^c$/m);
      } finally {
        await sbx.kill();
      }
    });

    it('runs python from the image, not from the host', async () => {
      const sbx = await create(PYTHON);
      try {
        const r = await sbx.exec(['python3', '-c', 'import sys; print(1, sys.executable)']);
        expect(r.stderr).toBe('');
        expect(r.stdout.trim()).toBe('1 /usr/bin/python3');
        // The host has perl; the image does not.
        expect((await sbx.exec(['perl', '-e', '1'])).exitCode).toBe(127);
      } finally {
        await sbx.kill();
      }
    });

    it('writes land in the upper dir: other sandboxes never see them, the layers stay unchanged, kill leaves nothing', async () => {
      const a = await create(BUSYBOX);
      const b = await create(BUSYBOX);
      try {
        // The image user (app) owns /srv/data in the image: as the sandbox user it may write there.
        const w = await a.exec(
          'echo mine > /srv/data/owned-by-app && echo new > /srv/data/new && rm /srv/data/owned-by-app && echo again > /srv/data/owned-by-app && cat /srv/data/owned-by-app /srv/data/new',
        );
        expect(w.stderr).toBe('');
        expect(w.stdout).toBe('again\nnew\n');
        expect((await a.exec('echo x > /srv/data/owned-by-root')).exitCode).not.toBe(0);
        const r = await b.exec('cat /srv/data/owned-by-app; test -e /srv/data/new && echo leaked');
        expect(r.stdout).toBe('app data\n');
      } finally {
        await a.kill();
        await b.kill();
      }
      for (const [k, d] of Object.entries(fx.layers)) expect(fx.hash(d), k).toBe(before[k]);
      await airlock.close();
      expect(await settledResidue()).toEqual(NO_RESIDUE);
    });

    it('the image user is the sandbox uid (never root), with the image env and working dir', async () => {
      const sbx = await create(BUSYBOX, { env: { OVERRIDDEN: 'spec' } });
      try {
        const r = await sbx.exec(
          'id -u; id -un; pwd; echo $IMAGE_VAR $OVERRIDDEN $USER; grep -c ":x:1000:" /etc/passwd',
        );
        expect(r.stdout.split('\n')).toEqual(['1000', 'app', '/srv/app', 'from-image spec app', '1', '']);
        expect((await sbx.exec('pwd', { cwd: '/tmp' })).stdout).toBe('/tmp\n');
        expect(sbx.info.hostUid).toBeGreaterThanOrEqual(TEST_UID_RANGE.first);
      } finally {
        await sbx.kill();
      }
    });

    it('setuid in a layer has no effect (nosuid)', async () => {
      const sbx = await create(PYTHON);
      try {
        const r = await sbx.exec([
          '/opt/suid/python3',
          '-c',
          'import os; print(os.geteuid(), oct(os.stat("/opt/suid/python3").st_mode))',
        ]);
        expect(r.stdout.trim()).toBe('1000 0o104755');
        // On the host: the root overlay and every layer view are nosuid, nodev (the views read-only).
        const mine = readFileSync('/proc/self/mountinfo', 'utf8')
          .split('\n')
          .filter((l) => (l.split(' ')[4] ?? '').includes(`/${sbx.id}/`))
          .map((l) => ({ at: basename(l.split(' ')[4]!), opts: l.split(' ')[5]!.split(',') }))
          .filter((m) => m.at === 'root' || m.at.startsWith('img-'));
        expect(mine.map((m) => m.at).sort()).toEqual(['img-0', 'img-1', 'img-2', 'root']);
        for (const m of mine) expect(m.opts, m.at).toEqual(expect.arrayContaining(['nosuid', 'nodev']));
        for (const m of mine.filter((x) => x.at !== 'root')) expect(m.opts, m.at).toContain('ro');
      } finally {
        await sbx.kill();
      }
    });

    it('exec, files and kill work on an image with no shell', async () => {
      const sbx = await create(PY_ONLY);
      try {
        expect((await sbx.exec(['python3', '-c', 'print(6*7)'])).stdout).toBe('42\n');
        const sh = await sbx.exec(['sh', '-c', 'echo hi']);
        expect(sh.exitCode).toBe(127);
        expect(sh.stderr).toContain('sh: command not found');
        expect((await sbx.exec('echo from a shell string')).exitCode).toBe(127);
        await sbx.files.write('/workspace/d/f.txt', 'content');
        expect(await sbx.files.read('/workspace/d/f.txt')).toBe('content');
        expect(await sbx.files.exists('/workspace/d/f.txt')).toBe(true);
        const list = await sbx.files.list('/workspace/d');
        expect(list.map((e) => [e.name, e.type, e.size])).toEqual([['f.txt', 'file', 7]]);
        await sbx.files.remove('/workspace/d');
        expect(await sbx.files.exists('/workspace/d')).toBe(false);
        await expect(sbx.files.read('/nope')).rejects.toMatchObject({ code: 'FILE_NOT_FOUND' });
        const bg = await sbx.exec(['python3', '-c', 'import time; time.sleep(60)'], { background: true });
        await sbx.kill();
        expect((await bg.wait()).killedBy).toBeDefined();
      } finally {
        await sbx.kill();
      }
    });

    it('workspace.diff works on a shell-less image (the helper lists the tree)', async () => {
      const host = mkdtempSync('/var/tmp/airlock-ir-ws-');
      writeFileSync(join(host, 'kept.txt'), 'same\n');
      writeFileSync(join(host, 'changed.txt'), 'old\n');
      const sbx = await create(PY_ONLY, { workspace: { hostDir: host, mode: 'cow' } });
      try {
        const w = await sbx.exec([
          'python3',
          '-c',
          'open("/workspace/changed.txt","w").write("new\\n"); open("/workspace/added.txt","w").write("a\\n")',
        ]);
        expect(w.stderr).toBe('');
        const d = await sbx.workspace.diff();
        expect(d.changes.map((c) => [c.path, c.kind]).sort()).toEqual([
          ['added.txt', 'added'],
          ['changed.txt', 'modified'],
        ]);
        expect(d.patch).toContain('+new');
      } finally {
        await sbx.kill();
        rmSync(host, { recursive: true, force: true });
      }
    });

    it("a layer's symlink to a host path resolves inside the sandbox root", async () => {
      const sbx = await create(BUSYBOX);
      try {
        const r = await sbx.exec('cat /shadow-link; echo; test -e /perl-link && echo perl');
        expect(r.stdout).not.toContain('perl');
        expect(r.stdout).not.toContain('root:');
      } finally {
        await sbx.kill();
      }
    });

    it('a layer whose mount points and /etc/passwd are symlinks to host paths reaches nothing on the host', async () => {
      const sbx = await create('example.com/test/hostile:1');
      try {
        const r = await sbx.exec(
          'for d in /tmp /workspace /home/user; do echo x > $d/planted || echo "no $d"; done; ls /proc/self >/dev/null && echo proc; id -u; grep -c evil /etc/passwd',
        );
        expect(r.stdout).toBe('proc\n1000\n0\n');
        expect(readdirSync(fx.hostDir)).toEqual([]);
      } finally {
        await sbx.kill();
      }
      // The image user is looked up without following the layer's symlink to the host's file.
      await expect(create('example.com/test/hostile-user:1')).rejects.toMatchObject({
        code: 'INVALID_SPEC',
        field: 'image',
      });
      await airlock.close(); // the warm slot too: a failed create leaves nothing beside it
      expect(await settledResidue()).toEqual(NO_RESIDUE);
    });

    it('a numeric image user maps to the sandbox uid; an unknown user name is a typed error', async () => {
      const sbx = await create('example.com/test/numeric-user:1');
      try {
        const r = await sbx.exec('id -u; id -un; echo x > /srv/data/owned-by-app && echo wrote');
        expect(r.stderr).toBe('');
        expect(r.stdout).toBe('1000\napp\nwrote\n');
      } finally {
        await sbx.kill();
      }
      await expect(create('example.com/test/unknown-user:1')).rejects.toMatchObject({
        code: 'INVALID_SPEC',
        message: expect.stringContaining('nobody-here'),
      });
    });

    it('limits still apply: the disk limit holds writes to the image root', async () => {
      const sbx = await create(BUSYBOX, { limits: { diskBytes: 4 * 1024 * 1024 } });
      try {
        const r = await sbx.exec('dd if=/dev/zero of=/srv/data/big bs=1M count=8');
        expect(r.exitCode).not.toBe(0);
        expect(r.stderr).toMatch(/No space left/);
      } finally {
        await sbx.kill();
      }
    });

    it('a snapshot of a sandbox on an image keeps its changes to the root; a fork runs on the same image', async () => {
      const sbx = await create(BUSYBOX);
      let snap: Awaited<ReturnType<Sandbox['snapshot']>> | undefined;
      try {
        const w = await sbx.exec(
          'echo kept > /srv/data/new && rm /srv/data/owned-by-app && echo ws > /workspace/w',
        );
        expect(w.stderr).toBe('');
        snap = await sbx.snapshot();
      } finally {
        await sbx.kill();
      }
      const fork = await snap.fork();
      try {
        expect(fork.info.image?.ref).toBe(BUSYBOX);
        const r = await fork.exec(
          'cat /srv/data/new /workspace/w; ls /srv/data; cat /etc/motd || echo masked',
        );
        expect(r.stdout).toBe('kept\nws\nnew\nowned-by-root\nmasked\n');
      } finally {
        await fork.kill();
        await snap.remove();
      }
    });

    it('the pull policy reaches the resolver', async () => {
      const sbx = await create(BUSYBOX, { pull: 'never' });
      await sbx.kill();
      expect(fx.resolver.calls.at(-1)).toEqual({ ref: BUSYBOX, pull: 'never' });
    });
  });
}
