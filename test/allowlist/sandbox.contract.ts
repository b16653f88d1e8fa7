// `executables` in a sandbox spec, against every tier (sandbox-namespaces.test.ts,
// sandbox-gvisor.test.ts): the sandbox's root holds only the listed programs and their closure, over
// the host root and over an image root. What is not listed fails to exec (127 through exec, with the
// exec check's message); Airlock's own helper (the static busybox at /.airlock/bin/busybox, used by
// sbx.files) is never found as `sh` or on PATH.
import { existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync, symlinkSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Airlock, type Sandbox } from '../../src/index.js';
import type { BackendName } from '../../src/core/spec.js';
import type { ImageResolver } from '../../src/core/image.js';
import { NO_RESIDUE, TEST_STATE_DIR, TEST_UID_RANGE, settledResidue } from '../helpers.js';
import { buildFixtures, type Fixtures } from '../images-root/fixtures.js';
import { writeFile } from './fixtures.js';

const PYTHON = 'example.com/test/python:3.11';
const SCRIPTED = 'example.com/test/scripted:1';
const SCRIPT = '#!/usr/bin/env python3\nimport sys\nprint("script", sys.argv[1:])\n';

/** The fixtures' images, plus one with a `#!/usr/bin/env python3` script and an env for it. */
function resolverWithScript(fx: Fixtures, extra: string): ImageResolver {
  return {
    async resolve(ref, o) {
      if (ref !== SCRIPTED) return fx.resolver.resolve(ref, o);
      const base = await fx.resolver.resolve(PYTHON);
      return { ...base, ref, layers: [...base.layers, extra] };
    },
  };
}

export function allowlistSandboxContract(backend: BackendName): void {
  describe(`executables: ${backend}`, () => {
    let fx: Fixtures;
    let airlock: Airlock;
    let hostScript: string;

    beforeAll(() => {
      fx = buildFixtures(mkdtempSync(join(`${TEST_STATE_DIR}-allowlist-fx-`)));
      const extra = join(fx.root, 'scripted');
      writeFile(extra, 'usr/local/bin/hello', SCRIPT, 0o755);
      // env from the image's busybox (the python layer has none)
      mkdirSync(join(extra, 'usr/bin'), { mode: 0o755 });
      symlinkSync('../../bin/busybox', join(extra, 'usr/bin/env'));
      hostScript = writeFile(fx.root, 'host-bin/hello', SCRIPT, 0o755);
      airlock = new Airlock({
        stateDir: TEST_STATE_DIR,
        uidRange: TEST_UID_RANGE,
        images: resolverWithScript(fx, extra),
      });
    }, 120_000);
    afterAll(async () => {
      await airlock?.close();
      if (fx) rmSync(fx.root, { recursive: true, force: true });
    });

    const absent = async (sbx: Sandbox): Promise<void> => {
      for (const argv of [
        ['sh', '-c', 'echo reached'],
        ['curl', '--version'],
        ['ls', '/'],
      ]) {
        const r = await sbx.exec(argv);
        expect(r.exitCode, argv[0]).toBe(127);
        expect(r.stderr, argv[0]).toMatch(/command not found/);
        expect(r.stdout).toBe('');
      }
      // a shell string needs /bin/sh, which is not there either
      const s = await sbx.exec('echo reached');
      expect(s.exitCode).toBe(127);
      expect(s.stdout).toBe('');
      // Airlock's helper is not on PATH and not `sh`: python's own lookup finds neither
      const which =
        'import os\nw=lambda n:[d for d in os.environ["PATH"].split(":") if os.access(d+"/"+n,os.X_OK)]\n' +
        'print(w("sh"),w("busybox"),w("env"),os.path.exists("/bin/sh"))';
      const w = await sbx.exec(['python3', '-c', which]);
      expect(w.stderr).toBe('');
      expect(w.stdout.trim()).toBe('[] [] [] False');
    };

    it('over the host root: python3 runs with its stdlib, sh/curl/ls are absent, files work', async () => {
      const sbx = await airlock.create({ backend, executables: ['python3'] });
      try {
        const r = await sbx.exec(['python3', '-c', 'import json,hashlib;print(json.dumps([1]))']);
        expect(r.stderr).toBe('');
        expect(r.stdout).toBe('[1]\n');
        await absent(sbx);
        // the top of the root: the closure, the mount points, nothing else of the host
        const top = await sbx.exec(['python3', '-c', 'import os;print(" ".join(sorted(os.listdir("/"))))']);
        const names = top.stdout.trim().split(' ');
        expect(names).toContain('usr');
        for (const host of ['root', 'var', 'opt', 'srv', 'sbin']) expect(names).not.toContain(host);
        // sbx.files runs on Airlock's helper, not on programs of the root
        await sbx.files.write('/workspace/a.txt', 'hello');
        expect(await sbx.files.read('/workspace/a.txt')).toBe('hello');
        expect((await sbx.files.list('/workspace')).map((e) => e.name)).toEqual(['a.txt']);
        // the host's root-owned files are not the sandbox's to change
        const w = await sbx.exec(['python3', '-c', 'open("/usr/bin/python3","a")']);
        expect(w.exitCode).not.toBe(0);
        expect(w.stderr).toMatch(/Permission denied|Read-only/);
      } finally {
        await sbx.kill();
      }
    });

    it('a listed #!/usr/bin/env python3 script runs (env and python3 come with it)', async () => {
      const sbx = await airlock.create({ backend, executables: [hostScript] });
      try {
        const r = await sbx.exec([hostScript, 'a']);
        expect(r.stderr).toBe('');
        expect(r.stdout).toBe("script ['a']\n");
        expect((await sbx.exec(['python3', '-c', 'print(3)'])).stdout).toBe('3\n');
        expect((await sbx.exec(['sh', '-c', 'echo reached'])).exitCode).toBe(127);
      } finally {
        await sbx.kill();
      }
    });

    it("over an image root: the image's python runs, its busybox shell is absent", async () => {
      const sbx = await airlock.create({ backend, image: PYTHON, executables: ['python3'] });
      try {
        expect(sbx.info.image?.ref).toBe(PYTHON);
        const r = await sbx.exec(['python3', '-c', 'import sys;print(sys.version_info[:2])']);
        expect(r.stdout).toBe('(3, 11)\n');
        await absent(sbx);
        // the image's config still applies (its PATH)
        expect((await sbx.exec(['python3', '-c', 'import os;print(os.environ["PATH"])'])).stdout).toBe(
          '/usr/bin:/bin\n',
        );
      } finally {
        await sbx.kill();
      }
      // A script of the image, listed by name: its #!/usr/bin/env resolves to the image's busybox env.
      const s = await airlock.create({
        backend,
        image: SCRIPTED,
        executables: ['hello'],
        env: { PATH: '/usr/local/bin:/usr/bin:/bin' },
      });
      try {
        const r = await s.exec(['hello', 'b']);
        expect(r.stderr).toBe('');
        expect(r.stdout).toBe("script ['b']\n");
        expect((await s.exec(['sh', '-c', 'echo reached'])).exitCode).toBe(127);
      } finally {
        await s.kill();
      }
    });

    it('the same request reuses the cached root; an unknown program is a typed error', async () => {
      const dir = join(TEST_STATE_DIR, 'closures');
      const before = existsSync(dir) ? readdirSync(dir).length : 0;
      const sbx = await airlock.create({ backend, executables: ['python3'] });
      await sbx.kill();
      expect(readdirSync(dir).length).toBe(before);
      await expect(airlock.create({ backend, executables: ['no-such-program-here'] })).rejects.toMatchObject({
        code: 'EXECUTABLE_NOT_FOUND',
      });
      await expect(airlock.create({ backend, executables: ['a b'] })).rejects.toMatchObject({
        code: 'INVALID_SPEC',
      });
      expect(readdirSync(dir).filter((n) => n.startsWith('.'))).toEqual([]);
      await airlock.close(); // the warm slot too: a failed create leaves nothing beside it
      expect(await settledResidue()).toEqual(NO_RESIDUE);
    });
  });
}
