// Templates on the namespaces tier: build (files, steps, per-step network), create by name and by
// digest, determinism, digest pinning across a rebuild, step failures, unknown templates, removal
// rules, and the real `airlock template` CLI. No step touches a real network.
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import {
  AirlockError,
  TemplateBuildError,
  parseTemplateYaml,
  type Airlock,
  type AirlockErrorCode,
  type Sandbox,
  type TemplateInput,
} from '../../src/index.js';
import {
  GVISOR_SKIP_REASON,
  NO_RESIDUE,
  SKIP_REASON,
  TEST_STATE_DIR,
  TEST_UID_RANGE,
  canRunGvisor,
  canRunNamespaces,
  runCli,
  settledResidue,
  testAirlock,
} from '../helpers.js';
import { templateBuildCommand } from '../../src/cli/template.js';
import type { Io } from '../../src/cli/run.js';

const LAYERS = join(TEST_STATE_DIR, 'layers');
const TEMPLATES = join(TEST_STATE_DIR, 'templates');

const cli = runCli;

async function expectCode(p: Promise<unknown>, code: AirlockErrorCode): Promise<AirlockError> {
  const e = await p.then(
    () => undefined,
    (x: unknown) => x,
  );
  if (!AirlockError.isInstance(e)) expect.fail(`expected ${code}, got ${String(e)}`);
  expect({ code: e.code, message: e.message }).toMatchObject({ code });
  return e;
}

const layerCount = (): number => (existsSync(LAYERS) ? readdirSync(LAYERS).length : 0);

describe.skipIf(!canRunNamespaces)(
  `templates on the namespaces tier${canRunNamespaces ? '' : ` [skipped: ${SKIP_REASON}]`}`,
  () => {
    let airlock: Airlock;
    const owned: Sandbox[] = [];
    const names = new Set<string>();
    const digests = new Set<string>();
    const hostPaths: string[] = [];
    const suffix = `${process.pid}`;
    const n = (base: string): string => {
      const name = `${base}-${suffix}`;
      names.add(name);
      return name;
    };

    beforeAll(() => {
      airlock = testAirlock();
    });
    afterEach(async () => {
      await Promise.allSettled(owned.splice(0).map((s) => s.kill()));
      // Children first (a template built on another blocks its base).
      for (const name of [...names].reverse()) await airlock.templates.remove(name).catch(() => {});
      names.clear();
      for (const d of digests) await airlock.snapshots.remove(d).catch(() => {});
      digests.clear();
      for (const p of hostPaths.splice(0)) rmSync(p, { recursive: true, force: true });
    });
    afterAll(async () => {
      await airlock?.killAll();
    });
    const create = async (template: string): Promise<Sandbox> => {
      const s = await airlock.create({ template });
      owned.push(s);
      return s;
    };
    const sh = async (sbx: Sandbox, cmd: string): Promise<string> => {
      const r = await sbx.exec(cmd);
      expect({ stderr: r.stderr, exitCode: r.exitCode }).toEqual({ stderr: '', exitCode: 0 });
      return r.stdout;
    };
    const tool = (name: string, version: string): TemplateInput => ({
      name,
      files: [
        { path: 'app/config.json', content: `{"version":"${version}"}\n` },
        { path: '/home/user/.toolrc', content: 'color=never\n' },
      ],
      steps: [
        {
          run: `mkdir -p bin && printf '#!/bin/sh\\necho tool ${version}\\n' > bin/tool && chmod 755 bin/tool`,
        },
        {
          run: ['/bin/sh', '-c', 'echo "$GREETING" > greeting'],
          env: { GREETING: 'hi' },
          workdir: '/home/user',
        },
      ],
    });

    it('builds files and steps into a layer; sandboxes start from its name or its digest', async () => {
      const name = n('tool');
      const progress: string[] = [];
      const t = await airlock.templates.build(tool(name, '1'), {
        onProgress: (p) => progress.push(p.phase === 'step' ? `step ${p.index + 1}/${p.steps}` : p.phase),
      });
      expect(t.digest).toMatch(/^sha256:[0-9a-f]{64}$/);
      expect(t.layers).toEqual([t.digest]);
      expect(t.base).toEqual({ ref: 'host', digest: null });
      expect(t.files).toEqual(['/workspace/app/config.json', '/home/user/.toolrc']);
      expect(progress).toEqual(['start', 'files', 'step 1/2', 'step 2/2', 'layer', 'done']);
      const rec = statSync(join(TEMPLATES, `${name}.json`));
      expect({ mode: rec.mode & 0o777, uid: rec.uid }).toEqual({ mode: 0o600, uid: 0 });
      expect(statSync(TEMPLATES).mode & 0o777).toBe(0o700);
      expect(readdirSync(TEMPLATES).filter((f) => f.endsWith('.tmp'))).toEqual([]);

      const byName = await create(name);
      expect(byName.info.template).toEqual({ name, digest: t.digest });
      expect(byName.info.layers).toEqual([t.digest]);
      expect(
        await sh(byName, 'bin/tool; cat app/config.json ~/.toolrc ~/greeting; stat -c %U bin/tool'),
      ).toBe('tool 1\n{"version":"1"}\ncolor=never\nhi\nuser\n');
      // A sandbox's changes never reach the template.
      await sh(byName, 'rm -r bin && echo dirty > ~/.toolrc');
      const byDigest = await create(t.digest);
      expect(byDigest.info.template).toEqual({ digest: t.digest });
      expect(await sh(byDigest, 'bin/tool; cat ~/.toolrc')).toBe('tool 1\ncolor=never\n');
      expect(await airlock.templates.inspect(t.digest)).toMatchObject({ name, digest: t.digest });
      expect((await airlock.templates.list()).map((x) => x.name)).toContain(name);
    }, 60_000);

    it('is deterministic: the same inputs give the same digest, from an object or a YAML file', async () => {
      const name = n('det');
      const a = await airlock.templates.build(tool(name, '1'));
      await new Promise((r) => setTimeout(r, 1100)); // a second later: timestamps differ, digests do not
      const b = await airlock.templates.build(tool(name, '1'));
      expect(b.digest).toBe(a.digest);
      expect(b.sourceDigest).toBe(a.sourceDigest);
      const dir = mkdtempSync(join(tmpdir(), 'airlock-tpl-'));
      hostPaths.push(dir);
      const file = join(dir, 'template.yaml');
      writeFileSync(
        file,
        [
          `name: ${name}`,
          'base: host',
          'steps:',
          `  - run: "mkdir -p bin && printf '#!/bin/sh\\\\necho tool 1\\\\n' > bin/tool && chmod 755 bin/tool"`,
          '  - workdir: /home/user',
          '    env: { GREETING: hi }',
          '    run: [/bin/sh, -c, echo "$GREETING" > greeting]',
          'files:',
          '  - { path: app/config.json, content: "{\\"version\\":\\"1\\"}\\n" }',
          '  - { path: /home/user/.toolrc, content: "color=never\\n" }',
          '',
        ].join('\n'),
      );
      const c = await airlock.templates.build(file);
      expect(c.digest).toBe(a.digest);
      expect(c.sourceDigest).toBe(a.sourceDigest);
    }, 60_000);

    it('a pinned digest keeps running the old content after the name is rebuilt', async () => {
      const name = n('pin');
      const v1 = await airlock.templates.build(tool(name, '1'));
      const pinned = await create(v1.digest);
      const v2 = await airlock.templates.build(tool(name, '2'));
      digests.add(v1.digest); // no longer named: removed as a snapshot at the end
      expect(v2.digest).not.toBe(v1.digest);
      expect((await airlock.templates.inspect(name)).digest).toBe(v2.digest);
      expect(await sh(pinned, 'bin/tool')).toBe('tool 1\n');
      expect(await sh(await create(v1.digest), 'bin/tool')).toBe('tool 1\n');
      const byName = await create(name);
      expect(byName.info.template).toEqual({ name, digest: v2.digest });
      expect(await sh(byName, 'bin/tool')).toBe('tool 2\n');
    }, 60_000);

    it.skipIf(!canRunGvisor)(
      `gVisor sandboxes start from a template by name or pinned digest (the same layers)${canRunGvisor ? '' : ` (skipped: ${GVISOR_SKIP_REASON})`}`,
      async () => {
        const name = n('gv');
        const v1 = await airlock.templates.build(tool(name, '1'));
        const gv = async (template: string): Promise<Sandbox> => {
          const s = await airlock.create({ backend: 'gvisor', template });
          owned.push(s);
          return s;
        };
        const pinned = await gv(v1.digest);
        expect(pinned.info.template).toEqual({ digest: v1.digest });
        const v2 = await airlock.templates.build(tool(name, '2'));
        digests.add(v1.digest);
        expect(await sh(pinned, 'bin/tool')).toBe('tool 1\n');
        expect(await sh(await gv(v1.digest), 'bin/tool')).toBe('tool 1\n');
        const byName = await gv(name);
        expect(byName.info.template).toEqual({ name, digest: v2.digest });
        expect(await sh(byName, 'bin/tool; cat ~/.toolrc')).toBe('tool 2\ncolor=never\n');
        // A gVisor fork of it keeps the template underneath and its own changes on top.
        await sh(byName, 'echo mine > mine');
        const snap = await byName.snapshot();
        digests.add(snap.id);
        const f = await snap.fork();
        owned.push(f);
        expect(await sh(f, 'bin/tool; cat mine')).toBe('tool 2\nmine\n');
      },
      90_000,
    );

    it.skipIf(!canRunGvisor)(
      `a build runs on its base's tier (or the one asked for), and sandboxes from it start there${canRunGvisor ? '' : ` (skipped: ${GVISOR_SKIP_REASON})`}`,
      async () => {
        const hostKernel = readFileSync('/proc/version', 'utf8'); // a namespaces sandbox's kernel
        // A gVisor snapshot as the base: the build's steps run on gVisor, not on the default tier.
        const gv = await airlock.create({ backend: 'gvisor' });
        owned.push(gv);
        const gvKernel = await sh(gv, 'cat /proc/version');
        expect(gvKernel).not.toBe(hostKernel);
        await sh(gv, 'echo base > base');
        const base = await gv.snapshot();
        digests.add(base.id);
        const onBase = await airlock.templates.build({
          name: n('ongv'),
          base: base.id,
          steps: [{ run: 'cat /proc/version > kernel' }],
        });
        const a = await create(onBase.name);
        expect(a.info.backend).toBe('gvisor');
        expect(await sh(a, 'cat base kernel; cat /proc/version')).toBe(`base\n${gvKernel}${gvKernel}`);
        // Asked for on the host base: the steps run on gVisor; a named tier still wins at create.
        const asked = await airlock.templates.build(
          { name: n('askgv'), steps: [{ run: 'cat /proc/version > kernel' }] },
          { backend: 'gvisor' },
        );
        const b = await create(asked.name);
        expect([b.info.backend, await sh(b, 'cat kernel')]).toEqual(['gvisor', gvKernel]);
        const c = await airlock.create({ backend: 'namespaces', template: asked.name });
        owned.push(c);
        expect([c.info.backend, await sh(c, 'cat kernel; cat /proc/version')]).toEqual([
          'namespaces',
          `${gvKernel}${hostKernel}`,
        ]);
      },
      120_000,
    );

    it('a failing step is a typed error with its index and stderr tail; nothing is left behind', async () => {
      const before = layerCount();
      const t: TemplateInput = {
        name: n('fails'),
        steps: [{ run: 'echo ok > a' }, { run: 'echo first >&2; echo "no such package" >&2; exit 3' }],
      };
      const e = await expectCode(airlock.templates.build(t), 'TEMPLATE_BUILD_FAILED');
      expect(e).toBeInstanceOf(TemplateBuildError);
      const b = e as TemplateBuildError;
      expect({ step: b.step, exitCode: b.exitCode, field: b.field }).toEqual({
        step: 1,
        exitCode: 3,
        field: 'steps.1',
      });
      expect(b.stderrTail).toBe('first\nno such package\n');
      expect(b.message).toContain('no such package');
      const timeout = await expectCode(
        airlock.templates.build({ name: n('slow'), steps: [{ run: 'sleep 30', timeoutMs: 1000 }] }),
        'TEMPLATE_BUILD_FAILED',
      );
      expect((timeout as TemplateBuildError).killedBy).toBe('timeout');
      expect(layerCount()).toBe(before);
      expect(existsSync(join(TEMPLATES, `fails-${suffix}.json`))).toBe(false);
      expect(airlock.list()).toEqual([]); // the build sandboxes were killed
    }, 60_000);

    it('unknown templates and invalid template files are typed errors', async () => {
      await expectCode(airlock.create({ template: `nope-${suffix}` }), 'TEMPLATE_NOT_FOUND');
      await expectCode(airlock.create({ template: `sha256:${'0'.repeat(64)}` }), 'TEMPLATE_NOT_FOUND');
      await expectCode(airlock.templates.inspect(`nope-${suffix}`), 'TEMPLATE_NOT_FOUND');
      await expectCode(airlock.templates.remove(`nope-${suffix}`), 'TEMPLATE_NOT_FOUND');
      await expectCode(
        airlock.templates.build({ name: n('orphan'), base: `nope-${suffix}` }),
        'TEMPLATE_NOT_FOUND',
      );
      const bad = await expectCode(airlock.create({ template: 'Bad Name' }), 'INVALID_SPEC');
      expect(bad.field).toBe('template');
      await expectCode(
        airlock.create({ template: `sha256:${'0'.repeat(64)}`, layers: [`sha256:${'0'.repeat(64)}`] }),
        'INVALID_SPEC',
      );
      const cases: Array<[string, string]> = [
        ['name: host\n', 'name'],
        ['name: x\nsteps: [{ run: "" }]\n', 'steps.0.run'],
        ['name: x\nsteps: [{ run: ls, netwrk: {} }]\n', 'steps.0.netwrk'],
        ['name: x\nsteps: [{ run: ls, network: { allow: ["*"] } }]\n', 'steps.0.network.allow.0'],
        ['name: x\nfiles: [{ path: ../etc/passwd, content: x }]\n', 'files.0.path'],
        ['name: x\nfiles: [{ path: /etc/passwd, content: x }]\n', 'files.0.path'],
        ['name: x\nlimits: { memoryBytes: 1 }\n', 'limits.memoryBytes'],
        ['name: x\nname: y\n', ''],
      ];
      for (const [yaml, field] of cases) {
        let thrown: unknown;
        try {
          parseTemplateYaml(yaml);
        } catch (x) {
          thrown = x;
        }
        expect(AirlockError.is(thrown, 'INVALID_SPEC'), yaml).toBe(true);
        if (field) expect((thrown as AirlockError).field, yaml).toBe(field);
      }
      // A network policy is validated like a sandbox's (and canonicalised), never used here.
      const ok = parseTemplateYaml(
        'name: npm\nsteps:\n  - run: npm ci\n    network: { allow: [registry.example.com] }\n',
      );
      expect(ok.steps[0]!.network?.allow).toEqual(['registry.example.com']);
    });

    it('each step runs with its own network policy, in its own sandbox when the policy changes', async () => {
      const name = n('net');
      const probe = 'env | grep -c "^HTTPS_PROXY=" || true';
      const t = await airlock.templates.build({
        name,
        steps: [
          { run: `(${probe}) > offline1` },
          // Validated and attached, never used: nothing here talks to the network.
          {
            run: `(${probe}) > online`,
            network: { allow: ['registry.npm.example.com'], transparent: false },
          },
          { run: `(${probe}) > offline2` },
        ],
      });
      expect(t.layers).toHaveLength(3);
      const sbx = await create(name);
      expect(sbx.info.layers).toEqual(t.layers);
      expect(await sh(sbx, 'cat offline1 online offline2')).toBe('0\n1\n0\n');
      expect(sbx.spec.network).toBeUndefined(); // a template's step policy is not the sandbox's
      await sbx.kill();
      const before = layerCount();
      await airlock.templates.remove(name);
      names.delete(name);
      expect(layerCount()).toBe(before - 3);
    }, 60_000);

    it('a template can build on another; removal follows the snapshot in-use rules', async () => {
      const base = n('base');
      const child = n('child');
      const b = await airlock.templates.build({ name: base, steps: [{ run: 'echo base > b' }] });
      const c = await airlock.templates.build({ name: child, base, steps: [{ run: 'echo child > c' }] });
      expect(c.base).toEqual({ ref: base, digest: b.digest });
      expect(c.layers).toEqual([c.digest]);
      const sbx = await create(child);
      expect(sbx.info.layers).toEqual([c.digest, b.digest]);
      expect(await sh(sbx, 'cat b c')).toBe('base\nchild\n');
      await expectCode(airlock.templates.remove(base), 'SNAPSHOT_IN_USE'); // child is built on it
      await expectCode(airlock.templates.remove(child), 'SNAPSHOT_IN_USE'); // a live sandbox runs on it
      expect((await airlock.templates.inspect(child)).digest).toBe(c.digest); // nothing removed
      await sbx.kill();
      await airlock.templates.remove(child);
      await airlock.templates.remove(base);
      names.delete(child);
      names.delete(base);
      expect(existsSync(join(LAYERS, c.digest))).toBe(false);
      expect(existsSync(join(LAYERS, b.digest))).toBe(false);
      await expectCode(airlock.create({ template: child }), 'TEMPLATE_NOT_FOUND');
    }, 60_000);

    it('airlock template build / ls / inspect / rm through the real CLI', async () => {
      const name = n('cli');
      const dir = mkdtempSync(join(tmpdir(), 'airlock-tpl-'));
      hostPaths.push(dir);
      const file = join(dir, 't.yaml');
      writeFileSync(
        file,
        `name: ${name}\nsteps:\n  - run: echo one > one\n  - run: head -c 3000 /dev/zero > zeros\n`,
      );
      const build = await cli(['template', 'build', file]);
      expect(build.stderr).toContain('step 1/2: echo one > one\nstep 2/2: head -c 3000 /dev/zero > zeros\n');
      expect(build.stderr).toMatch(/layer sha256:[0-9a-f]{12}: 2\.9 KiB\n/);
      expect(build.code).toBe(0);
      const [outName, digest] = build.stdout.trim().split(' ');
      expect(outName).toBe(name);
      expect(digest).toMatch(/^sha256:[0-9a-f]{64}$/);

      const ls = await cli(['template', 'ls', '--json']);
      expect(ls.code).toBe(0);
      const listed = (JSON.parse(ls.stdout) as Array<{ name: string; digest: string }>).find(
        (t) => t.name === name,
      );
      expect(listed?.digest).toBe(digest);
      const table = await cli(['template', 'ls']);
      expect(table.stdout).toMatch(new RegExp(`^${name}\\s+${digest!.slice(0, 19)}\\s`, 'm'));
      for (const ref of [name, digest!]) {
        const inspect = await cli(['template', 'inspect', ref]);
        expect(inspect.code).toBe(0);
        expect(JSON.parse(inspect.stdout)).toMatchObject({
          name,
          digest,
          steps: [{ run: 'echo one > one' }, {}],
        });
      }
      const sbx = await create(name);
      expect(await sh(sbx, 'cat one; wc -c < zeros')).toBe('one\n3000\n');
      const busy = await cli(['template', 'rm', name]);
      expect(busy.code).toBe(1);
      expect(busy.stderr).toContain(sbx.id);
      await sbx.kill();
      const rm = await cli(['template', 'rm', name]);
      expect({ code: rm.code, stdout: rm.stdout }).toEqual({ code: 0, stdout: `removed ${name}\n` });
      names.delete(name);
      expect((await cli(['template', 'inspect', name])).code).toBe(3);
      expect((await cli(['template', 'rm', name])).code).toBe(3);
      const bad = await cli(['template', 'build', join(dir, 'missing.yaml')]);
      expect(bad.code).toBe(1);
      writeFileSync(file, 'name: x\nsteps: [{ run: ls, bogus: 1 }]\n');
      const invalid = await cli(['template', 'build', file]);
      expect(invalid.code).toBe(2);
      expect(invalid.stderr).toContain('steps.0.bogus');
      expect(readFileSync(file, 'utf8')).toContain('bogus'); // untouched
    }, 90_000);

    it('on a TTY, build progress is one updating line', async () => {
      const name = n('tty');
      const dir = mkdtempSync(join(tmpdir(), 'airlock-tpl-'));
      hostPaths.push(dir);
      const file = join(dir, 't.yaml');
      writeFileSync(file, `name: ${name}\nsteps:\n  - run: echo a > a\n  - run: echo b > b\n`);
      const saved = { dir: process.env.AIRLOCK_STATE_DIR, uids: process.env.AIRLOCK_UID_RANGE };
      process.env.AIRLOCK_STATE_DIR = TEST_STATE_DIR;
      process.env.AIRLOCK_UID_RANGE = `${TEST_UID_RANGE.first}:${TEST_UID_RANGE.count}`;
      let out = '';
      let err = '';
      try {
        const code = await templateBuildCommand(
          file,
          {},
          { out: (s) => (out += s), err: (s) => (err += s) } satisfies Io,
          true,
        );
        expect(code).toBe(0);
      } finally {
        if (saved.dir === undefined) delete process.env.AIRLOCK_STATE_DIR;
        else process.env.AIRLOCK_STATE_DIR = saved.dir;
        if (saved.uids === undefined) delete process.env.AIRLOCK_UID_RANGE;
        else process.env.AIRLOCK_UID_RANGE = saved.uids;
      }
      const digest = (await airlock.templates.inspect(name)).digest;
      expect(out).toBe(`${name} ${digest}\n`);
      expect(err).toContain('\r\x1b[Kstep 1/2: echo a > a\r\x1b[Kstep 2/2: echo b > b\r\x1b[Klayer ');
      expect(err.endsWith(`\r\x1b[Kbuilt ${digest} (4 B)\n`)).toBe(true);
      expect(err.split('\n')).toHaveLength(2); // one line, then its newline
    }, 60_000);

    it('leaves no residue on the host', async () => {
      await Promise.allSettled(owned.splice(0).map((s) => s.kill()));
      await airlock.killAll();
      expect(await settledResidue()).toEqual(NO_RESIDUE);
      expect(readdirSync(LAYERS).filter((x) => x.startsWith('.'))).toEqual([]);
    });
  },
);
