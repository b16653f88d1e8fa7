// Resolving pasted MCP server commands (Claude Desktop configs) into what runs inside the sandbox and the
// read-only mounts it needs. Real file trees built per test: fake npm packages, npm's `_npx` cache
// layout, scoped and nested installs, pnpm and workspace symlinks, scripts with shebangs, a copied ELF
// binary, a fake virtualenv; plus the REAL MCP servers installed in this repo's node_modules. No sandbox
// is started. Every produced mount must also pass the spec's own MountSchema.
import {
  chmodSync,
  copyFileSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  realpathSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AirlockError } from '../../src/core/errors.js';
import { MountSchema } from '../../src/core/spec.js';
import {
  RELOCATED_MOUNTS_ROOT,
  resolveServerCommand,
  SANDBOX_NODE,
  type ResolvedCommand,
} from '../../src/mcp/command.js';

// The sandbox runs the host's /usr/bin/node and /usr/bin/python3; without them resolution refuses.
const NO_USR_NODE = !existsSync(SANDBOX_NODE);
const NO_USR_PYTHON = !existsSync('/usr/bin/python3');
const REPO = realpathSync(join(dirname(new URL(import.meta.url).pathname), '..', '..'));
const NODE_SHEBANG = '#!/usr/bin/env node\nconsole.log(1);\n';

let root: string;
let counter = 0;
beforeAll(() => {
  // /var/tmp, not /tmp: paths under /tmp are relocated (tested on their own below).
  root = realpathSync(mkdtempSync('/var/tmp/airlock-mcp-command-'));
});
afterAll(() => rmSync(root, { recursive: true, force: true }));

/** A fresh test dir `t` with `t/home` as HOME (projects go beside it, never above it). */
function fresh(): string {
  const t = join(root, `t${counter++}`);
  mkdirSync(join(t, 'home'), { recursive: true });
  return t;
}

function write(file: string, content: string, mode?: number): string {
  mkdirSync(dirname(file), { recursive: true });
  writeFileSync(file, content);
  if (mode !== undefined) chmodSync(file, mode);
  return file;
}

function pkg(
  nm: string,
  name: string,
  version: string,
  bin?: string | Record<string, string>,
  extra: Record<string, unknown> = {},
): string {
  const dir = join(nm, name);
  write(
    join(dir, 'package.json'),
    JSON.stringify({ name, version, ...(bin === undefined ? {} : { bin }), ...extra }),
  );
  const bins = typeof bin === 'string' ? [bin] : Object.values(bin ?? {});
  for (const b of bins) write(join(dir, b), NODE_SHEBANG, 0o755);
  return dir;
}

interface RunOpts {
  cwd?: string;
  env?: Record<string, string | undefined>;
  globalRoots?: string[];
}
function run(t: string, argv: string[], o: RunOpts = {}): ResolvedCommand {
  const r = resolveServerCommand(argv, {
    cwd: o.cwd ?? join(t, 'proj'),
    env: { HOME: join(t, 'home'), PATH: '/usr/bin:/bin', ...o.env },
    globalRoots: o.globalRoots ?? [],
  });
  for (const m of r.mounts) expect(MountSchema.parse(m)).toEqual(m);
  return r;
}

function fail(fn: () => unknown): string {
  try {
    fn();
  } catch (e) {
    expect(AirlockError.is(e, 'INVALID_ARGUMENT')).toBe(true);
    return (e as AirlockError).message;
  }
  throw new Error('expected INVALID_ARGUMENT');
}

const same = (p: string) => ({ hostPath: p, path: p });
/** Where a path of this checkout appears in the sandbox: itself, or relocated when the checkout is under /tmp or /home. */
const relocated = !MountSchema.safeParse({ hostPath: REPO, path: REPO }).success;
const inside = (p: string): string => (relocated ? `${RELOCATED_MOUNTS_ROOT}/0${p}` : p);
const mountAt = (p: string) => ({ hostPath: p, path: inside(p) });

describe.skipIf(NO_USR_NODE)('real MCP servers installed in this repo', () => {
  const env = { HOME: process.env.HOME, PATH: process.env.PATH };
  for (const server of ['server-filesystem', 'server-everything', 'server-memory']) {
    it(`npx -y @modelcontextprotocol/${server}`, () => {
      const name = `@modelcontextprotocol/${server}`;
      const r = resolveServerCommand(['npx', '-y', name, '/data'], { cwd: REPO, env });
      expect(r).toEqual({
        argv: [SANDBOX_NODE, inside(`${REPO}/node_modules/${name}/dist/index.js`), '/data'],
        mounts: [mountAt(`${REPO}/node_modules`)],
        source: 'npx-local',
        package: { name, version: '2026.8.31', dir: `${REPO}/node_modules/${name}` },
        description: `npm package ${name}@2026.8.31 from ./node_modules`,
      });
    });
  }

  it('npm exec with an exact version and args after --, and the bin name alone via node_modules/.bin', () => {
    const name = '@modelcontextprotocol/server-everything';
    const r = resolveServerCommand(['npm', 'exec', '--yes', `${name}@2026.8.31`, '--', 'stdio'], {
      cwd: join(REPO, 'src'),
      env,
    });
    expect(r.argv).toEqual([SANDBOX_NODE, inside(`${REPO}/node_modules/${name}/dist/index.js`), 'stdio']);
    expect(r.description).toBe(`npm package ${name}@2026.8.31 from ${REPO}/node_modules`);
    const viaBin = resolveServerCommand(['npx', 'mcp-server-memory'], { cwd: REPO, env });
    expect(viaBin.package?.name).toBe('@modelcontextprotocol/server-memory');
    expect(viaBin.mounts).toEqual([mountAt(`${REPO}/node_modules`)]);
  });

  it('tsx and node --import tsx against the real tsx', () => {
    const r = resolveServerCommand(['tsx', 'src/cli/main.ts', '--help'], { cwd: REPO, env });
    expect(r.argv).toEqual([
      SANDBOX_NODE,
      inside(`${REPO}/node_modules/tsx/dist/cli.mjs`),
      inside(`${REPO}/src/cli/main.ts`),
      '--help',
    ]);
    expect(r.mounts).toEqual([mountAt(REPO)]);
    const n = resolveServerCommand(['node', '--import', 'tsx', 'src/cli/main.ts'], { cwd: REPO, env });
    expect(n.argv).toEqual([
      SANDBOX_NODE,
      '--import',
      inside(`${REPO}/node_modules/tsx/dist/loader.mjs`),
      inside(`${REPO}/src/cli/main.ts`),
    ]);
  });

  it('an uninstalled package is refused with how to install it', () => {
    expect(
      fail(() =>
        resolveServerCommand(['npx', '-y', '@modelcontextprotocol/server-nonexistent-xyz'], {
          cwd: REPO,
          env,
          globalRoots: [],
        }),
      ),
    ).toBe(
      'npm package @modelcontextprotocol/server-nonexistent-xyz is not installed locally or in the npm cache; the sandbox has no network to download it. Install it first: `npm install @modelcontextprotocol/server-nonexistent-xyz` (or run `npx -y @modelcontextprotocol/server-nonexistent-xyz --help` once outside Airlock)',
    );
  });
});

describe.skipIf(NO_USR_NODE)('npx-style: where the package comes from', () => {
  it('local node_modules of the cwd or an ancestor; the whole node_modules is mounted', () => {
    const t = fresh();
    const nm = join(t, 'proj', 'node_modules');
    const dir = pkg(nm, 'srv', '1.0.0', { srv: 'bin/srv.js' });
    pkg(join(dir, 'node_modules'), 'nested-dep', '1.0.0');
    pkg(nm, 'hoisted-dep', '2.0.0');
    const r = run(t, ['npx', 'srv', '--flag', 'x']);
    expect(r.argv).toEqual([SANDBOX_NODE, join(dir, 'bin/srv.js'), '--flag', 'x']);
    expect(r.mounts).toEqual([same(nm)]);
    expect(r.source).toBe('npx-local');
    expect(r.package).toEqual({ name: 'srv', version: '1.0.0', dir });
    expect(r.description).toBe('npm package srv@1.0.0 from ./node_modules');
    mkdirSync(join(t, 'proj', 'a', 'b'), { recursive: true });
    const up = run(t, ['npx', '-y', 'srv'], { cwd: join(t, 'proj', 'a', 'b') });
    expect(up.mounts).toEqual([same(nm)]);
    expect(up.description).toBe(`npm package srv@1.0.0 from ${nm}`);
  });

  it('a nested copy is found from inside a package, and the outermost node_modules is mounted', () => {
    const t = fresh();
    const nm = join(t, 'proj', 'node_modules');
    const a = pkg(nm, 'a', '1.0.0');
    const b = pkg(join(a, 'node_modules'), '@s/b', '2.0.0', 'cli.js');
    const r = run(t, ['npx', '@s/b'], { cwd: a });
    expect(r.argv).toEqual([SANDBOX_NODE, join(b, 'cli.js')]);
    expect(r.mounts).toEqual([same(nm)]);
  });

  it('npx cache: `_npx/<hash>/node_modules`, highest version, or the one a range asks for', () => {
    const t = fresh();
    const cache = join(t, 'home', '.npm', '_npx');
    const v = (hash: string, version: string) =>
      pkg(join(cache, hash, 'node_modules'), '@acme/mcp-thing', version, './dist/index.js');
    v('aaa', '1.2.0');
    v('bbb', '2.1.0');
    v('ccc', '2.1.5');
    v('ddd', '3.0.0-beta.1');
    v('eee', '2.9.9');
    mkdirSync(join(t, 'proj'));
    const pick = (spec: string) => {
      const r = run(t, ['npx', '-y', spec]);
      expect(r.source).toBe('npx-cache');
      return r.package?.version;
    };
    expect(pick('@acme/mcp-thing')).toBe('2.9.9'); // a release beats a higher prerelease
    expect(pick('@acme/mcp-thing@latest')).toBe('2.9.9');
    expect(pick('@acme/mcp-thing@^2.1.0')).toBe('2.9.9');
    expect(pick('@acme/mcp-thing@~2.1.0')).toBe('2.1.5');
    expect(pick('@acme/mcp-thing@2.1.0')).toBe('2.1.0');
    expect(pick('@acme/mcp-thing@=2.1.0')).toBe('2.1.0');
    expect(pick('@acme/mcp-thing@1')).toBe('1.2.0');
    expect(pick('@acme/mcp-thing@1.x')).toBe('1.2.0');
    expect(pick('@acme/mcp-thing@2.1')).toBe('2.1.5');
    expect(pick('@acme/mcp-thing@3.0.0-beta.1')).toBe('3.0.0-beta.1');
    expect(pick('@acme/mcp-thing@^3.0.0-beta.0')).toBe('3.0.0-beta.1');
    // Full semver ranges (the `semver` package): comparators, unions, hyphen ranges, `v` prefixes.
    expect(pick('@acme/mcp-thing@>=2.1.0 <2.2')).toBe('2.1.5');
    expect(pick('@acme/mcp-thing@>=1.0.0')).toBe('2.9.9'); // never a prerelease it did not name
    expect(pick('@acme/mcp-thing@1.x || ~2.1.0')).toBe('2.1.5');
    expect(pick('@acme/mcp-thing@2.1.0 - 2.1.4')).toBe('2.1.0');
    expect(pick('@acme/mcp-thing@<2')).toBe('1.2.0');
    expect(pick('@acme/mcp-thing@>=3.0.0-beta.0')).toBe('3.0.0-beta.1');
    expect(pick('@acme/mcp-thing@v2.1.0')).toBe('2.1.0');
    const r = run(t, ['npx', '-y', '@acme/mcp-thing@2.1.0', 'arg']);
    const nm = join(cache, 'bbb', 'node_modules');
    expect(r.argv).toEqual([SANDBOX_NODE, join(nm, '@acme/mcp-thing/dist/index.js'), 'arg']);
    expect(r.mounts).toEqual([same(nm)]);
    expect(r.description).toBe(`npm package @acme/mcp-thing@2.1.0 from the npx cache (${nm})`);
  });

  it('^0.x and ~ ranges follow semver; a prerelease-only cache still resolves', () => {
    const t = fresh();
    const cache = join(t, 'cache');
    for (const [h, version] of [
      ['a', '0.2.3'],
      ['b', '0.2.9'],
      ['c', '0.3.0'],
      ['d', '0.0.4'],
    ] as const) {
      pkg(join(cache, '_npx', h, 'node_modules'), 'zero', version, 'z.js');
    }
    pkg(join(cache, '_npx', 'e', 'node_modules'), 'only-pre', '1.0.0-rc.2', 'p.js');
    pkg(join(cache, '_npx', 'f', 'node_modules'), 'only-pre', '1.0.0-rc.10', 'p.js');
    mkdirSync(join(t, 'proj'));
    const pick = (spec: string) =>
      run(t, ['npx', spec], { env: { npm_config_cache: cache } }).package?.version;
    expect(pick('zero@^0.2.3')).toBe('0.2.9');
    expect(pick('zero@^0.0.4')).toBe('0.0.4');
    expect(pick('zero@~0.2')).toBe('0.2.9');
    expect(pick('zero@0')).toBe('0.3.0');
    expect(pick('zero@*')).toBe('0.3.0');
    expect(pick('only-pre')).toBe('1.0.0-rc.10');
    expect(fail(() => pick('zero@^0.1.0'))).toMatch(
      /^npm package zero@\^0.1.0 is not installed locally or in the npm cache \(found zero@0.2.3 in .*, which does not match \^0.1.0\); the sandbox has no network/,
    );
  });

  it('a local copy that does not satisfy the range is skipped for the cache; --cache overrides the cache dir', () => {
    const t = fresh();
    pkg(join(t, 'proj', 'node_modules'), 'srv', '1.0.0', 'a.js');
    const cache = join(t, 'elsewhere');
    pkg(join(cache, '_npx', 'h', 'node_modules'), 'srv', '2.0.0', 'a.js');
    expect(run(t, ['npx', 'srv@^2', '--x'], { env: { npm_config_cache: cache } }).package?.version).toBe(
      '2.0.0',
    );
    const r = run(t, ['npx', '--cache', cache, 'srv@2.0.0']);
    expect(r.source).toBe('npx-cache');
    expect(run(t, ['npx', `--cache=${cache}`, 'srv@^2']).source).toBe('npx-cache');
    expect(run(t, ['npx', 'srv']).source).toBe('npx-local');
  });

  it('global roots come last', () => {
    const t = fresh();
    const g = join(t, 'global', 'lib', 'node_modules');
    const dir = pkg(g, 'gsrv', '5.0.0', { gsrv: 'index.js' });
    mkdirSync(join(t, 'proj'));
    const r = run(t, ['npx', 'gsrv'], { globalRoots: [join(t, 'missing'), g] });
    expect(r).toEqual({
      argv: [SANDBOX_NODE, join(dir, 'index.js')],
      mounts: [same(g)],
      source: 'npx-global',
      package: { name: 'gsrv', version: '5.0.0', dir },
      description: `npm package gsrv@5.0.0 from the global npm root ${g}`,
    });
  });

  it('a node_modules in HOME may be mounted (it does not contain HOME)', () => {
    const t = fresh();
    const home = join(t, 'home');
    pkg(join(home, 'node_modules'), 'srv', '1.0.0', 'i.js');
    const r = run(t, ['npx', 'srv'], { cwd: home });
    expect(r.mounts).toEqual([same(join(home, 'node_modules'))]);
  });

  it('pnpm layout: the bin is the real path under .pnpm and the top node_modules is mounted', () => {
    const t = fresh();
    const nm = join(t, 'proj', 'node_modules');
    const real = pkg(join(nm, '.pnpm', '@s+srv@1.0.0', 'node_modules'), '@s/srv', '1.0.0', 'cli.js');
    mkdirSync(join(nm, '@s'), { recursive: true });
    symlinkSync('../.pnpm/@s+srv@1.0.0/node_modules/@s/srv', join(nm, '@s', 'srv'));
    const r = run(t, ['pnpm', 'dlx', '@s/srv', 'a']);
    expect(r.argv).toEqual([SANDBOX_NODE, join(real, 'cli.js'), 'a']);
    expect(r.mounts).toEqual([same(nm)]);
    expect(r.package?.dir).toBe(real);
  });

  it('node_modules/.bin links leading outside the node_modules tree are ignored', () => {
    const t = fresh();
    const nm = join(t, 'proj', 'node_modules');
    write(join(t, 'secret', 'package.json'), JSON.stringify({ name: 'secret', bin: 'x.js' }));
    write(join(t, 'secret', 'x.js'), NODE_SHEBANG, 0o755);
    mkdirSync(join(nm, '.bin'), { recursive: true });
    symlinkSync(join(t, 'secret', 'x.js'), join(nm, '.bin', 'sneaky'));
    expect(fail(() => run(t, ['npx', 'sneaky']))).toMatch(/^npm package sneaky is not installed locally/);
  });

  it('a workspace package linked into node_modules: its own dir and the node_modules are mounted', () => {
    const t = fresh();
    const ws = join(t, 'proj', 'packages', 'srv');
    write(join(ws, 'package.json'), JSON.stringify({ name: 'srv', version: '0.1.0', bin: 'main.js' }));
    write(join(ws, 'main.js'), NODE_SHEBANG, 0o755);
    const nm = join(t, 'proj', 'node_modules');
    mkdirSync(nm, { recursive: true });
    symlinkSync('../packages/srv', join(nm, 'srv'));
    const r = run(t, ['npx', 'srv']);
    expect(r.argv).toEqual([SANDBOX_NODE, join(ws, 'main.js')]);
    expect(r.mounts).toEqual([same(nm), same(ws)]);
  });
});

describe.skipIf(NO_USR_NODE)('npx-style: launchers and flags', () => {
  function fixture() {
    const t = fresh();
    const nm = join(t, 'proj', 'node_modules');
    const multi = pkg(nm, '@x/tools', '1.0.0', { 'tool-a': 'a.js', 'tool-b': 'b.js' });
    const named = pkg(nm, 'server', '1.0.0', { other: 'o.js', server: 's.js' });
    return { t, nm, multi, named };
  }

  it('npx flags before the package are stripped, everything after belongs to the server', () => {
    const { t, named } = fixture();
    const s = join(named, 's.js');
    expect(run(t, ['npx', '-y', '--quiet', 'server', '-y', '--', 'x']).argv).toEqual([
      SANDBOX_NODE,
      s,
      '-y',
      '--',
      'x',
    ]);
    expect(run(t, ['npx', '--yes', '--registry', 'https://r.example', '--', 'server', 'a']).argv).toEqual([
      SANDBOX_NODE,
      s,
      'a',
    ]);
    expect(run(t, ['/usr/local/bin/npx', 'server']).argv).toEqual([SANDBOX_NODE, s]);
  });

  it('npm exec / npm x: npm options anywhere before --, positionals and everything after -- go to the server', () => {
    const { t, named } = fixture();
    const s = join(named, 's.js');
    expect(run(t, ['npm', 'exec', '--yes', 'server', 'a', '--', '--b']).argv).toEqual([
      SANDBOX_NODE,
      s,
      'a',
      '--b',
    ]);
    expect(run(t, ['npm', 'x', '-y', '--', 'server', '--c']).argv).toEqual([SANDBOX_NODE, s, '--c']);
    expect(run(t, ['npm', 'exec', '--package=server', '--', 'other', 'z']).argv).toEqual([
      SANDBOX_NODE,
      join(named, 'o.js'),
      'z',
    ]);
  });

  it('pnpm dlx, pnpx and yarn dlx', () => {
    const { t, named } = fixture();
    const s = join(named, 's.js');
    expect(run(t, ['pnpm', 'dlx', 'server', 'a']).argv).toEqual([SANDBOX_NODE, s, 'a']);
    expect(run(t, ['pnpx', 'server']).argv).toEqual([SANDBOX_NODE, s]);
    expect(run(t, ['yarn', 'dlx', '-q', 'server', '-q']).argv).toEqual([SANDBOX_NODE, s, '-q']);
    expect(run(t, ['yarn', 'dlx', '-p', 'server', 'other']).argv).toEqual([
      SANDBOX_NODE,
      join(named, 'o.js'),
    ]);
  });

  it('bin choice: string bin, bin named like the unscoped package, the only bin, or --package + bin name', () => {
    const { t, nm, multi, named } = fixture();
    const single = pkg(nm, '@x/single', '1.0.0', { 'whatever-name': 'w.js' });
    const str = pkg(nm, '@x/str', '1.0.0', './lib/main.js');
    expect(run(t, ['npx', '@x/single']).argv[1]).toBe(join(single, 'w.js'));
    expect(run(t, ['npx', '@x/str']).argv[1]).toBe(join(str, 'lib/main.js'));
    expect(run(t, ['npx', 'server']).argv[1]).toBe(join(named, 's.js'));
    expect(run(t, ['npx', '-p', '@x/tools', 'tool-b', '1']).argv).toEqual([
      SANDBOX_NODE,
      join(multi, 'b.js'),
      '1',
    ]);
    expect(run(t, ['npx', '--package=@x/tools@^1', '--package', 'server', 'tool-a']).argv[1]).toBe(
      join(multi, 'a.js'),
    );
  });

  it('bin errors: several bins, no bin, unknown bin, missing bin file, bins escaping or not Node.js', () => {
    const { t, nm } = fixture();
    expect(fail(() => run(t, ['npx', '@x/tools']))).toBe(
      'npm package @x/tools@1.0.0 has several bins (tool-a, tool-b) and none is named tools; pick one: `npx --package=@x/tools <bin> ...`',
    );
    pkg(nm, 'nobin', '1.0.0');
    write(join(nm, 'badbin', 'package.json'), JSON.stringify({ name: 'badbin', version: '1.0.0', bin: 7 }));
    expect(fail(() => run(t, ['npx', 'badbin']))).toMatch(/^npm package badbin@1\.0\.0 has no bin/);
    write(join(nm, 'notjson', 'package.json'), '{ nope');
    expect(fail(() => run(t, ['npx', 'notjson']))).toMatch(/^npm package notjson is not installed locally/);
    expect(fail(() => run(t, ['npx', 'nobin']))).toBe(
      'npm package nobin@1.0.0 has no bin, so there is nothing to run; check the package name in the server command',
    );
    expect(fail(() => run(t, ['npx', '-p', '@x/tools', '-p', 'nobin', 'tool-c']))).toBe(
      '`npx --package` runs a bin of the given packages, and none is named `tool-c` (bins: @x/tools: tool-a, tool-b; nobin: none)',
    );
    write(
      join(nm, 'broken', 'package.json'),
      JSON.stringify({ name: 'broken', version: '1.0.0', bin: 'gone.js' }),
    );
    expect(fail(() => run(t, ['npx', 'broken']))).toBe(
      `npm package broken@1.0.0 in ${join(nm, 'broken')} declares bin broken -> gone.js, but that file is missing; reinstall the package`,
    );
    write(join(nm, 'escape', 'package.json'), JSON.stringify({ name: 'escape', bin: '../../../../x.js' }));
    expect(fail(() => run(t, ['npx', 'escape']))).toBe(
      'the bin escape of npm package escape points outside the package',
    );
    write(join(t, 'outside.js'), NODE_SHEBANG);
    write(join(nm, 'linked', 'package.json'), JSON.stringify({ name: 'linked', bin: 'l.js' }));
    symlinkSync(join(t, 'outside.js'), join(nm, 'linked', 'l.js'));
    expect(fail(() => run(t, ['npx', 'linked']))).toBe(
      `the bin linked of npm package linked resolves outside its node_modules (${join(t, 'outside.js')})`,
    );
    write(join(nm, 'shbin', 'package.json'), JSON.stringify({ name: 'shbin', bin: 'run.sh' }));
    write(join(nm, 'shbin', 'run.sh'), '#!/bin/sh\necho hi\n', 0o755);
    expect(fail(() => run(t, ['npx', 'shbin']))).toBe(
      'the bin shbin of npm package shbin is a sh script; airlock mcp runs npm packages with Node.js only',
    );
  });

  it('bin with a shebang carrying node flags keeps the flags', () => {
    const { t, nm } = fixture();
    const dir = pkg(nm, 'flagged', '1.0.0');
    write(join(dir, 'package.json'), JSON.stringify({ name: 'flagged', version: '1.0.0', bin: 'f.js' }));
    write(join(dir, 'f.js'), '#!/usr/bin/env -S node --no-warnings --max-old-space-size 64\n', 0o755);
    expect(run(t, ['npx', 'flagged', 'x']).argv).toEqual([
      SANDBOX_NODE,
      '--no-warnings',
      '--max-old-space-size',
      '64',
      join(dir, 'f.js'),
      'x',
    ]);
  });

  it('launcher errors: shell mode, missing package or value, non-registry specs, bad names and ranges', () => {
    const { t } = fixture();
    for (const argv of [
      ['npx', '-c', 'server --x'],
      ['npx', '--call=server'],
      ['npm', 'exec', '-c', 'server'],
      ['pnpm', 'dlx', '--shell-mode', 'server'],
    ]) {
      expect(fail(() => run(t, argv))).toMatch(
        /^`(npx|npm exec|pnpm dlx) (-c|--call|--shell-mode)` runs a shell command line, which cannot be resolved to the files it needs; give the package and its arguments directly/,
      );
    }
    expect(fail(() => run(t, ['npx', '-y']))).toBe(
      '`npx` needs a package to run, e.g. `npx @modelcontextprotocol/server-memory`',
    );
    expect(fail(() => run(t, ['npm', 'exec', '--']))).toMatch(/^`npm exec` needs a package to run/);
    expect(fail(() => run(t, ['npx', '--package']))).toBe('`npx --package` needs a value');
    for (const spec of [
      './local-dir',
      '/abs/dir',
      'github:me/repo',
      'me/repo',
      'file:../x',
      'https://x.example/p.tgz',
      'npm:alias@1',
    ]) {
      expect(fail(() => run(t, ['npx', spec]))).toBe(
        `\`${spec}\` is not an npm registry package (local paths, git repositories, URLs and aliases are not supported); for a server on disk run its script, e.g. \`node <path/to/index.js>\``,
      );
    }
    expect(fail(() => run(t, ['npx', '.hidden']))).toBe('`.hidden` is not a valid npm package name');
    expect(fail(() => run(t, ['npx', '@/x']))).toBe('`@/x` is not a valid npm package name');
    expect(fail(() => run(t, ['npx', 'server@>=x.y']))).toBe(
      'version range ">=x.y" in server@>=x.y is not a valid semver range; use an exact version (1.2.3), a range (^1.2.3, ~1.2.3, 1.x, >=1.2 <2) or a dist-tag such as latest',
    );
    expect(fail(() => run(t, ['npx', 'server@^^1']))).toMatch(
      /^version range "\^\^1" in server@\^\^1 is not a valid/,
    );
    expect(fail(() => run(t, ['npx', 'server@1.2.3.4']))).toMatch(/^version range "1\.2\.3\.4"/);
  });

  it('other npm/pnpm/yarn subcommands are refused', () => {
    const t = fresh();
    expect(fail(() => run(t, ['npm', 'run', 'start']))).toMatch(
      /^`npm run` is not supported by airlock mcp \(package scripts run through a shell\); use `npm exec <package>` or the server command itself, e\.g\. `node build\/index\.js`\. Supported: /,
    );
    expect(fail(() => run(t, ['pnpm', 'start']))).toMatch(
      /^`pnpm start` is not supported .* use `pnpm dlx <package>`/,
    );
    expect(fail(() => run(t, ['yarn']))).toMatch(/^`yarn` is not supported .* use `yarn dlx <package>`/);
  });

  it('npx tsx <script> runs the script with tsx', () => {
    const t = fresh();
    const nm = join(t, 'proj', 'node_modules');
    const tsx = pkg(nm, 'tsx', '4.1.0', './dist/cli.mjs');
    write(join(t, 'proj', 'package.json'), JSON.stringify({ name: 'proj' }));
    const script = write(join(t, 'proj', 'src', 'server.ts'), 'export {};\n');
    const r = run(t, ['npx', '-y', 'tsx', 'src/server.ts', '--port', '1']);
    expect(r.argv).toEqual([SANDBOX_NODE, join(tsx, 'dist/cli.mjs'), script, '--port', '1']);
    expect(r.mounts).toEqual([same(join(t, 'proj'))]);
    expect(r.source).toBe('script');
  });
});

describe.skipIf(NO_USR_NODE)('node scripts', () => {
  it('a relative script resolves against cwd; the nearest named package.json dir (with node_modules) is mounted', () => {
    const t = fresh();
    const proj = join(t, 'proj');
    write(join(proj, 'package.json'), JSON.stringify({ name: 'srv', type: 'module' }));
    write(join(proj, 'build', 'package.json'), JSON.stringify({ type: 'module' })); // a marker, not a root
    const script = write(join(proj, 'build', 'index.js'), 'export {};\n');
    const r = run(t, ['node', './build/index.js', '--root', '/data']);
    expect(r).toEqual({
      argv: [SANDBOX_NODE, script, '--root', '/data'],
      mounts: [same(proj)],
      source: 'script',
      description: `Node.js script ${script}`,
    });
    expect(run(t, ['node', 'build/index']).argv).toEqual([SANDBOX_NODE, script]);
    expect(run(t, ['/usr/bin/node', script]).argv).toEqual([SANDBOX_NODE, script]);
    expect(run(t, ['nodejs', '--', script]).argv).toEqual([SANDBOX_NODE, script]);
  });

  it('no package.json: the script dir; a symlinked script mounts its real location', () => {
    const t = fresh();
    const script = write(join(t, 'srv', 'main.mjs'), 'export {};\n');
    mkdirSync(join(t, 'proj'));
    expect(run(t, ['node', script]).mounts).toEqual([same(join(t, 'srv'))]);
    symlinkSync(script, join(t, 'proj', 'link.mjs'));
    const r = run(t, ['node', 'link.mjs']);
    expect(r.argv).toEqual([SANDBOX_NODE, script]);
    expect(r.mounts).toEqual([same(join(t, 'srv'))]);
  });

  it('never HOME or a dir containing it: falls back to the script dir, or the script file alone', () => {
    const t = fresh();
    const home = join(t, 'home');
    const nested = write(join(home, 'srv', 'index.js'), '');
    write(join(t, 'package.json'), JSON.stringify({ name: 'above-home' })); // contains HOME
    expect(run(t, ['node', nested]).mounts).toEqual([same(join(home, 'srv'))]);
    write(join(home, 'package.json'), JSON.stringify({ name: 'home-junk' })); // is HOME
    expect(run(t, ['node', nested]).mounts).toEqual([same(join(home, 'srv'))]);
    const top = write(join(home, 'server.js'), '');
    expect(run(t, ['node', 'server.js'], { cwd: home }).mounts).toEqual([same(top)]);
  });

  it('a script inside a node_modules tree mounts the whole tree; under /usr nothing is mounted', () => {
    const t = fresh();
    const nm = join(t, 'proj', 'node_modules');
    const dir = pkg(nm, '@a/b', '1.0.0', 'dist/x.js');
    expect(run(t, ['node', join(dir, 'dist/x.js')]).mounts).toEqual([same(nm)]);
    const r = run(t, ['node', '/usr/lib/node_modules/npm/bin/npm-cli.js'], { cwd: t });
    expect(r.mounts).toEqual([]);
  });

  it('-e/-p inline code needs no mount', () => {
    const t = fresh();
    for (const argv of [
      ['node', '-e', 'console.log(1)', 'a'],
      ['node', '--eval=1', 'a'],
      ['node', '-pe', '1+1'],
      ['node', '--print', '1'],
    ]) {
      const r = run(t, argv);
      expect(r).toEqual({
        argv: [SANDBOX_NODE, ...argv.slice(1)],
        mounts: [],
        source: 'binary',
        description: 'node with inline code (no script file)',
      });
    }
  });

  it('--import/--require/--loader values are resolved on the host, mounted and rewritten to absolute paths', () => {
    const t = fresh();
    const proj = join(t, 'proj');
    write(join(proj, 'package.json'), JSON.stringify({ name: 'p' }));
    const script = write(join(proj, 'index.js'), '');
    const nm = join(proj, 'node_modules');
    const reg = pkg(nm, 'reg', '1.0.0', undefined, {
      exports: {
        '.': { require: './r.cjs', import: { node: './i.mjs' }, default: './d.js' },
        './sub': './sub.mjs',
      },
    });
    for (const f of ['r.cjs', 'i.mjs', 'd.js', 'sub.mjs']) write(join(reg, f), '');
    const plain = pkg(nm, 'plain', '1.0.0', undefined, { main: 'lib/main.js' });
    write(join(plain, 'lib', 'main.js'), '');
    const other = write(join(t, 'loaders', 'hook.mjs'), '');
    const r = run(t, [
      'node',
      '-r',
      'reg',
      '--import=reg',
      '--import',
      'reg/sub',
      '--require',
      'plain',
      '--loader',
      '../loaders/hook.mjs',
      '--import',
      'node:fs',
      '--no-warnings',
      'index.js',
    ]);
    expect(r.argv).toEqual([
      SANDBOX_NODE,
      '-r',
      join(reg, 'r.cjs'),
      `--import=${join(reg, 'i.mjs')}`,
      '--import',
      join(reg, 'sub.mjs'),
      '--require',
      join(plain, 'lib/main.js'),
      '--loader',
      other,
      '--import',
      'node:fs',
      '--no-warnings',
      script,
    ]);
    expect(r.mounts).toEqual([same(join(t, 'loaders')), same(proj)]); // node_modules is inside proj
    expect(fail(() => run(t, ['node', '--import', 'missing-pkg', 'index.js']))).toBe(
      `cannot find \`missing-pkg\` for \`node --import\` from ${proj}; install the package locally or give a path to the file`,
    );
    const evil = pkg(nm, 'evil', '1.0.0', undefined, { exports: { '.': './../../../outside.js' } });
    write(join(t, 'outside.js'), '');
    expect(fail(() => run(t, ['node', '-r', 'evil', 'index.js']))).toBe(
      `\`evil\` for \`node -r\` resolves outside its package (${join(t, 'outside.js')})`,
    );
    write(join(evil, 'package.json'), JSON.stringify({ name: 'evil', main: 'link.js' }));
    symlinkSync(join(t, 'outside.js'), join(evil, 'link.js'));
    expect(fail(() => run(t, ['node', '--import', 'evil', 'index.js']))).toBe(
      `\`evil\` for \`node --import\` resolves outside its package (${join(t, 'outside.js')})`,
    );
    pkg(nm, 'noentry', '1.0.0', undefined, { exports: { './only-sub': './s.js' } });
    expect(fail(() => run(t, ['node', '--import', 'noentry', 'index.js']))).toMatch(/^cannot find `noentry`/);
    // What `resolve.exports` adds: subpath patterns, fallback arrays, and the "node" condition nested.
    const pat = pkg(nm, 'pat', '1.0.0', undefined, {
      exports: {
        '.': [{ node: { import: './esm/main.mjs' } }, './fallback.js'],
        './features/*': { import: './src/features/*.mjs', require: './cjs/features/*.cjs' },
        './features/private/*': null,
      },
    });
    for (const f of ['esm/main.mjs', 'fallback.js', 'src/features/a.mjs', 'cjs/features/a.cjs']) {
      write(join(pat, f), '');
    }
    const p = run(t, [
      'node',
      '--import',
      'pat',
      '--import',
      'pat/features/a',
      '-r',
      'pat/features/a',
      'index.js',
    ]);
    expect(p.argv).toEqual([
      SANDBOX_NODE,
      '--import',
      join(pat, 'esm/main.mjs'),
      '--import',
      join(pat, 'src/features/a.mjs'),
      '-r',
      join(pat, 'cjs/features/a.cjs'),
      script,
    ]);
    expect(fail(() => run(t, ['node', '--import', 'pat/features/private/x', 'index.js']))).toMatch(
      /^cannot find `pat\/features\/private\/x`/,
    );
    expect(fail(() => run(t, ['node', '-r', './nope.cjs', 'index.js']))).toMatch(
      /^cannot find `\.\/nope\.cjs` for `node -r`/,
    );
  });

  it('node errors: missing script, stdin, no script, host-file options, missing option values, forbidden places', () => {
    const t = fresh();
    mkdirSync(join(t, 'proj'));
    expect(fail(() => run(t, ['node', 'build/index.js']))).toBe(
      `node script build/index.js not found at ${join(t, 'proj', 'build/index.js')} (relative paths resolve against ${join(t, 'proj')})`,
    );
    expect(fail(() => run(t, ['node', '-']))).toBe(
      '`node -` reads the program from stdin, which carries the MCP protocol; give a script file',
    );
    expect(fail(() => run(t, ['node']))).toBe(
      '`node` needs a script file to run, e.g. `node build/index.js` (a REPL cannot serve MCP)',
    );
    expect(fail(() => run(t, ['node', '--env-file=.env', 'x.js']))).toBe(
      '`node --env-file` reads a host file the sandbox cannot see; set the variables in the sandbox env instead',
    );
    expect(fail(() => run(t, ['node', '--openssl-config', 'x.cnf', 'x.js']))).toBe(
      '`node --openssl-config` reads a host file the sandbox cannot see; drop the option',
    );
    expect(fail(() => run(t, ['node', '--require']))).toBe('`node --require` needs a value');
    expect(fail(() => run(t, ['node', '/etc/hostname']))).toBe(
      'cannot mount /etc/hostname into the sandbox: mounts[].hostPath cannot be under /etc (host configuration and kernel interfaces are never shared)',
    );
    expect(fail(() => run(t, ['node', '/proc/self/status']))).toMatch(
      /^cannot mount \/proc\/\d+\/status into the sandbox: mounts\[\]\.hostPath cannot be under \/proc/,
    );
  });
});

describe.skipIf(NO_USR_NODE)('tsx', () => {
  function tsxFixture() {
    const t = fresh();
    const proj = join(t, 'proj');
    write(join(proj, 'package.json'), JSON.stringify({ name: 'p' }));
    const tsx = pkg(join(proj, 'node_modules'), 'tsx', '4.2.0', { tsx: './dist/cli.mjs' });
    const script = write(join(proj, 'src', 'server.ts'), 'export {};\n');
    return { t, proj, tsx, script, cli: join(tsx, 'dist/cli.mjs') };
  }

  it("runs tsx's CLI with /usr/bin/node; flags, watch, --tsconfig and extension resolution", () => {
    const { t, proj, script, cli } = tsxFixture();
    const r = run(t, ['tsx', 'src/server.ts', 'a']);
    expect(r).toEqual({
      argv: [SANDBOX_NODE, cli, script, 'a'],
      mounts: [same(proj)],
      source: 'script',
      description: `TypeScript script ${script} run with tsx@4.2.0`,
    });
    const cfg = write(join(proj, 'tsconfig.json'), '{}');
    expect(
      run(t, ['tsx', 'watch', '--tsconfig', './tsconfig.json', '--no-cache', 'src/server']).argv,
    ).toEqual([SANDBOX_NODE, cli, 'watch', '--tsconfig', cfg, '--no-cache', script]);
    expect(run(t, ['tsx', '-e', 'console.log(1)']).argv).toEqual([SANDBOX_NODE, cli, '-e', 'console.log(1)']);
  });

  it("tsx is found from the script's project when the cwd has none, else in global roots", () => {
    const { t, proj, script, cli } = tsxFixture();
    const elsewhere = join(t, 'elsewhere');
    mkdirSync(elsewhere);
    expect(run(t, ['tsx', script], { cwd: elsewhere }).argv).toEqual([SANDBOX_NODE, cli, script]);
    const t2 = fresh();
    const g = join(t2, 'g', 'lib', 'node_modules');
    const gtsx = pkg(g, 'tsx', '4.0.0', './dist/cli.mjs');
    const lone = write(join(t2, 'proj', 'server.ts'), '');
    const r = run(t2, ['tsx', 'server.ts'], { globalRoots: [g] });
    expect(r.argv).toEqual([SANDBOX_NODE, join(gtsx, 'dist/cli.mjs'), lone]);
    expect(r.mounts).toEqual([same(g), same(join(t2, 'proj'))]);
    void proj;
  });

  it('errors: tsx not installed, no script, missing script', () => {
    const t = fresh();
    write(join(t, 'proj', 'server.ts'), '');
    expect(fail(() => run(t, ['tsx', 'server.ts']))).toBe(
      'npm package tsx is not installed locally or in the npm cache; the sandbox has no network to download it. Install it first: `npm install tsx` (or run `npx -y tsx --help` once outside Airlock)',
    );
    expect(fail(() => run(t, ['tsx']))).toBe('`tsx` needs a script file to run, e.g. `tsx src/index.ts`');
    expect(fail(() => run(t, ['tsx', 'nope.ts']))).toMatch(/^tsx script nope\.ts not found at /);
  });
});

describe.skipIf(NO_USR_PYTHON)('python', () => {
  it('python3/python script: /usr/bin/python3, mounting the nearest pyproject.toml dir or the script dir', () => {
    const t = fresh();
    const proj = join(t, 'proj');
    write(join(proj, 'pyproject.toml'), '[project]\nname = "srv"\n');
    const script = write(join(proj, 'src', 'srv', 'server.py'), 'print(1)\n');
    expect(run(t, ['python3', '-u', '-X', 'utf8', 'src/srv/server.py', '--x'])).toEqual({
      argv: ['/usr/bin/python3', '-u', '-X', 'utf8', script, '--x'],
      mounts: [same(proj)],
      source: 'script',
      description: `Python script ${script}`,
    });
    const loose = write(join(t, 'scripts', 'mcp.py'), '');
    expect(run(t, ['python', loose]).argv[0]).toBe('/usr/bin/python3');
    expect(run(t, ['python', loose]).mounts).toEqual([same(join(t, 'scripts'))]);
    expect(run(t, ['/usr/bin/python3', '-Wignore', '--', loose]).argv).toEqual([
      '/usr/bin/python3',
      '-Wignore',
      loose,
    ]);
    expect(run(t, ['python3', '-c', 'print(1)', 'a'])).toEqual({
      argv: ['/usr/bin/python3', '-c', 'print(1)', 'a'],
      mounts: [],
      source: 'script',
      description: 'Python with inline code (no script file)',
    });
  });

  it('a virtualenv made from /usr python is mounted whole and may run -m', () => {
    const t = fresh();
    const proj = join(t, 'proj');
    const venv = join(proj, '.venv');
    write(join(venv, 'pyvenv.cfg'), 'home = /usr/bin\ninclude-system-site-packages = false\n');
    mkdirSync(join(venv, 'bin'));
    symlinkSync('/usr/bin/python3', join(venv, 'bin', 'python'));
    const r = run(t, ['.venv/bin/python', '-m', 'my_server', '--stdio']);
    expect(r).toEqual({
      argv: [join(venv, 'bin', 'python'), '-m', 'my_server', '--stdio'],
      mounts: [same(venv)],
      source: 'script',
      description: `Python module from the virtualenv ${venv}`,
    });
    write(join(proj, 'pyproject.toml'), '');
    const script = write(join(proj, 'server.py'), '');
    expect(run(t, [join(venv, 'bin', 'python'), 'server.py']).mounts).toEqual([same(proj)]);
    expect(run(t, [join(venv, 'bin', 'python'), 'server.py']).argv).toEqual([
      join(venv, 'bin', 'python'),
      script,
    ]);
  });

  it('errors: -m with the system python, stdin, no script, non-/usr interpreters and venvs, missing files', () => {
    const t = fresh();
    const proj = join(t, 'proj');
    mkdirSync(proj);
    expect(fail(() => run(t, ['python3', '-m', 'mcp_server_git']))).toBe(
      "`python -m` is not supported with the system Python: the module would come from the host's site-packages; run the script file (`python3 /path/to/server.py`) or a virtualenv's python (`<venv>/bin/python -m <module>`)",
    );
    expect(fail(() => run(t, ['python3', '-']))).toBe(
      '`python -` reads the program from stdin, which carries the MCP protocol; give a script file',
    );
    expect(fail(() => run(t, ['python3', '-u']))).toBe(
      '`python3` needs a script file to run, e.g. `python3 server.py`',
    );
    expect(fail(() => run(t, ['python3', '-W']))).toBe('`python -W` needs a value');
    expect(fail(() => run(t, ['python3', 'nope.py']))).toBe(
      `python script nope.py not found at ${join(proj, 'nope.py')} (relative paths resolve against ${proj})`,
    );
    expect(fail(() => run(t, ['python3.99', 'x.py']))).toBe(
      'python3.99 is not installed at /usr/bin/python3.99; the sandbox sees only /usr, so install the system Python (e.g. python3)',
    );
    const fakePy = write(join(t, 'pyenv', 'bin', 'python3'), '\x7fELF', 0o755);
    expect(fail(() => run(t, [fakePy, 'x.py']))).toBe(
      `${fakePy} is outside /usr; the sandbox can run only the system Python (/usr/bin/python3) or a virtualenv made from it`,
    );
    const venv = join(t, 'venv2');
    write(join(venv, 'pyvenv.cfg'), `home = ${join(t, 'pyenv', 'bin')}\n`);
    write(join(venv, 'bin', 'python'), '', 0o755);
    expect(fail(() => run(t, [join(venv, 'bin', 'python'), 'x.py']))).toBe(
      `the virtualenv ${venv} is based on ${join(t, 'pyenv', 'bin')}, which the sandbox cannot see (only /usr); recreate it with \`/usr/bin/python3 -m venv\``,
    );
    expect(fail(() => run(t, ['./missing/python', 'x.py']))).toBe(
      `./missing/python not found at ${join(proj, 'missing/python')} (relative paths resolve against ${proj})`,
    );
  });
});

describe.skipIf(NO_USR_NODE)('executables by path', () => {
  it('a #!/usr/bin/env node file runs with /usr/bin/node; -S flags are kept', () => {
    const t = fresh();
    const script = write(join(t, 'srv', 'server'), NODE_SHEBANG, 0o755);
    mkdirSync(join(t, 'proj'));
    expect(run(t, [script, 'a'])).toEqual({
      argv: [SANDBOX_NODE, script, 'a'],
      mounts: [same(join(t, 'srv'))],
      source: 'script',
      description: `Node.js script ${script}`,
    });
    const flagged = write(join(t, 'srv', 'f'), '#!/usr/bin/env -S node --no-warnings\n', 0o755);
    expect(run(t, ['../srv/f']).argv).toEqual([SANDBOX_NODE, '--no-warnings', flagged]);
    const direct = write(join(t, 'srv', 'd'), '#!/usr/local/bin/node\n', 0o755);
    expect(run(t, [direct]).argv).toEqual([SANDBOX_NODE, direct]);
  });

  it.skipIf(NO_USR_PYTHON)(
    'a python shebang runs with python; a shell script or other interpreter runs as is with its dir mounted',
    () => {
      const t = fresh();
      mkdirSync(join(t, 'proj'));
      const py = write(join(t, 'bin', 'srv.py'), '#!/usr/bin/env python3\nprint(1)\n', 0o755);
      expect(run(t, [py, 'x']).argv).toEqual(['/usr/bin/python3', py, 'x']);
      const direct = write(join(t, 'bin', 'srv2.py'), '#!/usr/bin/python3 -u\n', 0o755);
      expect(run(t, [direct]).argv).toEqual(['/usr/bin/python3', '-u', direct]);
      const sh = write(join(t, 'bin', 'run.sh'), '#!/bin/sh\nexec true\n', 0o755);
      expect(run(t, [sh, '1'])).toEqual({
        argv: [sh, '1'],
        mounts: [same(join(t, 'bin'))],
        source: 'binary',
        description: `sh script ${sh}`,
      });
    },
  );

  it('an ELF binary: under /usr no mount, elsewhere its dir (or the file alone in HOME); bare names via PATH', () => {
    const t = fresh();
    mkdirSync(join(t, 'proj'));
    expect(run(t, ['/usr/bin/true', 'x'])).toEqual({
      argv: ['/usr/bin/true', 'x'],
      mounts: [],
      source: 'binary',
      description: 'binary /usr/bin/true',
    });
    const mine = join(t, 'tools', 'my-true');
    mkdirSync(dirname(mine));
    copyFileSync('/usr/bin/true', mine);
    chmodSync(mine, 0o755);
    expect(run(t, [mine])).toEqual({
      argv: [mine],
      mounts: [same(join(t, 'tools'))],
      source: 'binary',
      description: `binary ${mine}`,
    });
    const inHome = join(t, 'home', 'my-true');
    copyFileSync('/usr/bin/true', inHome);
    chmodSync(inHome, 0o755);
    expect(run(t, [inHome]).mounts).toEqual([same(inHome)]);
    expect(run(t, ['true']).argv).toEqual(['/usr/bin/true']);
    expect(run(t, ['my-true'], { env: { PATH: `${join(t, 'tools')}:/usr/bin` } }).argv).toEqual([mine]);
  });

  it('errors: not found, not executable, neither binary nor script, unsupported interpreters, unknown bare command', () => {
    const t = fresh();
    const proj = join(t, 'proj');
    mkdirSync(proj);
    expect(fail(() => run(t, ['./server']))).toBe(
      `./server not found at ${join(proj, 'server')} (relative paths resolve against ${proj})`,
    );
    const sh = write(join(t, 'x', 'run.sh'), '#!/bin/sh\n', 0o644);
    expect(fail(() => run(t, [sh]))).toBe(
      `${sh} is not executable; \`chmod +x\` it or run it with its interpreter`,
    );
    const js = write(join(t, 'x', 'index.js'), 'console.log(1)\n', 0o755);
    expect(fail(() => run(t, [js]))).toBe(
      `${js} is neither a binary nor a script with a #! line; run it with its interpreter, e.g. \`node ${js}\``,
    );
    const deno = write(join(t, 'x', 'd.ts'), '#!/usr/bin/env -S deno run\n', 0o755);
    expect(fail(() => run(t, [deno]))).toMatch(
      new RegExp(
        `^${deno.replace(/[./]/g, '\\$&')} is a deno script, which is not supported \\(Deno is not available inside the sandbox\\)\\. Supported: `,
      ),
    );
    const uv = write(join(t, 'x', 'u.py'), '#!/usr/bin/env -S uv run --script\n', 0o755);
    expect(fail(() => run(t, [uv]))).toMatch(/is a uv script, which is not supported/);
    expect(fail(() => run(t, ['definitely-not-a-command-xyz']))).toMatch(
      /^command `definitely-not-a-command-xyz` was not found on PATH; give its absolute path or run it through node, tsx or python3\. Supported: /,
    );
    expect(fail(() => run(t, ['/etc/hostname']))).toBe(
      '/etc/hostname is neither a binary nor a script with a #! line; run it with its interpreter, e.g. `node /etc/hostname`',
    );
  });
});

describe('unsupported launchers and empty commands', () => {
  it.each([
    ['uvx', 'it downloads Python packages at start-up'],
    ['uv', 'it manages its own Python'],
    ['pipx', 'it downloads Python packages'],
    ['docker', 'containers are not run inside the sandbox'],
    ['podman', 'containers are not run inside the sandbox'],
    ['deno', 'Deno is not available inside the sandbox'],
    ['bun', 'Bun is not available inside the sandbox'],
    ['bunx', 'Bun is not available inside the sandbox'],
    ['bash', 'a shell command line cannot be resolved'],
    ['sh', 'a shell command line cannot be resolved'],
    ['env', 'give the server command itself and set variables in the sandbox env'],
    ['cmd', 'drop the Windows `cmd /c` wrapper'],
    ['/usr/local/bin/docker', 'containers are not run'],
  ])('%s', (cmd, why) => {
    const t = fresh();
    const msg = fail(() => run(t, [cmd, 'x']));
    expect(msg.startsWith(`\`${cmd.split('/').pop()}\` is not supported by airlock mcp (${why}`)).toBe(true);
    expect(msg).toContain(
      'Supported: `npx`, `npm exec`, `pnpm dlx` or `yarn dlx` with an npm package already installed (locally, in the npm cache or globally), `node <script>`, `tsx <script>`, `python3 <script>`, or the path of an executable script or binary.',
    );
  });

  it('an empty command', () => {
    const t = fresh();
    for (const argv of [[], [''], ['  ']]) {
      expect(fail(() => run(t, argv))).toBe(
        'no MCP server command given, e.g. `npx -y @modelcontextprotocol/server-filesystem /data`',
      );
    }
  });
});

describe.skipIf(NO_USR_NODE)('paths that would cover the sandbox layout are relocated', () => {
  let tmp: string;
  beforeAll(() => {
    tmp = realpathSync(mkdtempSync(join(tmpdir(), 'airlock-mcp-command-')));
  });
  afterAll(() => rmSync(tmp, { recursive: true, force: true }));

  it('a project under /tmp is bound under /opt/airlock/mounts/<n>/… and argv follows', () => {
    expect(tmp.startsWith('/tmp/')).toBe(true);
    const proj = join(tmp, 'proj');
    write(join(proj, 'package.json'), JSON.stringify({ name: 'p' }));
    write(join(proj, 'index.js'), '');
    write(join(proj, 'hook.mjs'), '');
    const loaders = write(join(tmp, 'loaders', 'l.mjs'), '');
    const r = resolveServerCommand(['node', '--import=./hook.mjs', '--import', loaders, 'index.js', proj], {
      cwd: proj,
      env: { HOME: '/nonexistent-home' },
      globalRoots: [],
    });
    const a = `${RELOCATED_MOUNTS_ROOT}/0${proj}`;
    const b = `${RELOCATED_MOUNTS_ROOT}/1${join(tmp, 'loaders')}`;
    expect(r.mounts).toEqual([
      { hostPath: proj, path: a },
      { hostPath: join(tmp, 'loaders'), path: b },
    ]);
    expect(r.argv).toEqual([
      SANDBOX_NODE,
      `--import=${a}/hook.mjs`,
      '--import',
      `${b}/l.mjs`,
      `${a}/index.js`,
      proj,
    ]);
    for (const m of r.mounts) expect(MountSchema.parse(m)).toEqual(m);
  });

  it('an npm package in a /tmp project keeps its node_modules tree whole', () => {
    const nm = join(tmp, 'proj2', 'node_modules');
    const dir = pkg(nm, '@s/srv', '1.0.0', 'bin.js');
    const r = resolveServerCommand(['npx', '@s/srv'], { cwd: join(tmp, 'proj2'), env: {}, globalRoots: [] });
    expect(r.mounts).toEqual([{ hostPath: nm, path: `${RELOCATED_MOUNTS_ROOT}/0${nm}` }]);
    expect(r.argv).toEqual([SANDBOX_NODE, `${RELOCATED_MOUNTS_ROOT}/0${join(dir, 'bin.js')}`]);
    expect(r.package?.dir).toBe(dir);
  });
});
