// The package as a user gets it: `npm pack` (prepack builds dist), then the tarball installed into a
// scratch project and used from there with plain Node: the library imported by its package name, and
// the `airlock` command through npx. No tsx at run time (it is a dev dependency: not installed there).
// NETWORK SAFETY: the install is `--offline`: packages come only from the npm cache that `npm ci`
// filled. The scratch lockfile is made from this project's (its production entries); their tarball
// addresses are derived at run time from `npm config get registry` (pacote needs one per entry;
// this project's lockfile omits them), so no registry host is written here. The one egress request
// goes to a host the policy denies, refused by the proxy before any name is resolved.
import { execFile, execFileSync, spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import {
  mkdirSync,
  mkdtempSync,
  readFileSync,
  readdirSync,
  rmSync,
  writeFileSync,
  existsSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  NO_RESIDUE,
  SKIP_REASON,
  TEST_STATE_DIR,
  TEST_UID_RANGE,
  canRunNamespaces,
  settledResidue,
} from '../helpers.js';

const ROOT = join(import.meta.dirname, '..', '..');
const PKG = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as {
  name: string;
  version: string;
  license: string;
  bin: Record<string, string>;
  engines: Record<string, string>;
  dependencies: Record<string, string>;
};

interface LockEntry {
  version?: string;
  resolved?: string;
  dev?: boolean;
  link?: boolean;
}

/** The scratch project: depends on the tarball only; its lockfile lists this project's production packages. */
function writeScratchProject(dir: string, tarball: string): void {
  const lock = JSON.parse(readFileSync(join(ROOT, 'package-lock.json'), 'utf8')) as {
    packages: Record<string, LockEntry>;
  };
  const registry = execFileSync('npm', ['config', 'get', 'registry'], { encoding: 'utf8' })
    .trim()
    .replace(/\/?$/, '/');
  const spec = `file:${tarball}`;
  const packages: Record<string, unknown> = {
    '': { name: 'scratch', version: '1.0.0', dependencies: { [PKG.name]: spec } },
    [`node_modules/${PKG.name}`]: {
      version: PKG.version,
      resolved: spec,
      license: PKG.license,
      dependencies: PKG.dependencies,
      bin: PKG.bin,
      engines: PKG.engines,
    },
  };
  for (const [path, entry] of Object.entries(lock.packages)) {
    if (path === '' || entry.dev || entry.link) continue;
    const name = path.slice(path.lastIndexOf('node_modules/') + 'node_modules/'.length);
    const file = `${name.split('/').pop()}-${entry.version}.tgz`;
    packages[path] = { ...entry, resolved: entry.resolved ?? `${registry}${name}/-/${file}` };
  }
  const manifest = { name: 'scratch', version: '1.0.0', private: true, dependencies: { [PKG.name]: spec } };
  writeFileSync(join(dir, 'package.json'), JSON.stringify(manifest, null, 2));
  writeFileSync(
    join(dir, 'package-lock.json'),
    JSON.stringify(
      { name: 'scratch', version: '1.0.0', lockfileVersion: 3, requires: true, packages },
      null,
      2,
    ),
  );
}

interface Run {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** `file args` in the scratch project with the test state dir, uid range and no TypeScript loader. */
function inScratch(
  dir: string,
  file: string,
  args: readonly string[],
  timeoutMs = 60_000,
  moreEnv: NodeJS.ProcessEnv = {},
): Promise<Run> {
  return new Promise((resolve, reject) => {
    const env: NodeJS.ProcessEnv = {
      ...process.env,
      ...moreEnv,
      AIRLOCK_STATE_DIR: TEST_STATE_DIR,
      AIRLOCK_UID_RANGE: `${TEST_UID_RANGE.first}:${TEST_UID_RANGE.count}`,
      npm_config_offline: 'true',
    };
    delete env.NODE_OPTIONS; // vitest's or tsx's loader must not reach the installed package
    const child = spawn(file, args, { cwd: dir, env, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (t: string) => (stdout += t));
    child.stderr.setEncoding('utf8').on('data', (t: string) => (stderr += t));
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`${file} ${args.join(' ')} did not exit within ${timeoutMs} ms; stderr: ${stderr}`));
    }, timeoutMs);
    child.on('error', reject);
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
  });
}

/** The library, imported by package name from an ES module evaluated by plain node. */
const LIBRARY_SCRIPT = `
import { Airlock, Sandbox } from '${PKG.name}';
const [first, count] = process.env.AIRLOCK_UID_RANGE.split(':').map(Number);
const airlock = new Airlock({ stateDir: process.env.AIRLOCK_STATE_DIR, uidRange: { first, count } });
const out = {};
try {
  const sbx = await Sandbox.create({ network: { allow: ['allowed.example.com'] } }, { airlock });
  try {
    const hi = await sbx.exec(['/bin/echo', 'hi']);
    out.echo = { exitCode: hi.exitCode, stdout: hi.stdout };
    const denied = await sbx.exec(
      "curl -sS -m 20 -o /dev/null -w '%{http_code}' http://denied.example.net/ || true",
    );
    out.denied = { stdout: denied.stdout, egress: denied.egress };
  } finally {
    await sbx.kill();
  }
} finally {
  await airlock.close();
}
process.stdout.write(JSON.stringify(out));
`;

describe.skipIf(!canRunNamespaces)(
  `the packed ${PKG.name} installed in a scratch project (${SKIP_REASON})`,
  () => {
    let work = '';
    let scratch = '';

    // Asynchronous: a minute of blocking here would starve vitest's worker of its own messages.
    beforeAll(async () => {
      const run = promisify(execFile);
      work = mkdtempSync(join(tmpdir(), 'airlock-pack-'));
      scratch = join(work, 'scratch');
      mkdirSync(scratch);
      // prepack builds dist (a clean tsc + the CLI bundle) before the files are packed.
      await run('npm', ['pack', '--pack-destination', work], { cwd: ROOT, maxBuffer: 64 << 20 });
      const tarball = readdirSync(work).find((f) => f.endsWith('.tgz'));
      if (!tarball) throw new Error(`npm pack left no tarball in ${work}`);
      writeScratchProject(scratch, join(work, tarball));
      await run('npm', ['install', '--offline', '--no-audit', '--no-fund'], {
        cwd: scratch,
        maxBuffer: 64 << 20,
      });
    }, 600_000);

    afterAll(() => {
      if (work) rmSync(work, { recursive: true, force: true });
    });

    it('the tarball holds dist and bin, with no tests, source maps or TypeScript sources', () => {
      const root = join(scratch, 'node_modules', PKG.name);
      const files = readdirSync(root, { recursive: true, encoding: 'utf8' });
      expect(files).toEqual(
        expect.arrayContaining([
          'bin/airlock.cjs',
          'dist/index.js',
          'dist/index.d.ts',
          'dist/bin/airlock.cjs',
          'dist/bin/airlock.cjs.cache',
          'dist/bin/airlock-run.cjs',
          'dist/bin/airlock-run.cjs.cache',
        ]),
      );
      expect(files.filter((f) => f.endsWith('.map'))).toEqual([]);
      expect(files.filter((f) => /(^|\/)(test|src|bench|scripts)(\/|$)/.test(f))).toEqual([]);
      expect(files.filter((f) => f.endsWith('.ts') && !f.endsWith('.d.ts'))).toEqual([]);
      // Every worker module the library starts ships as .js beside the module that starts it.
      const workers = readdirSync(join(ROOT, 'src'), { recursive: true, encoding: 'utf8' }).filter((f) =>
        /-worker(\.privileged)?\.ts$/.test(f),
      );
      for (const w of workers) expect(files).toContain(`dist/${w.replace(/\.ts$/, '.js')}`);
    });

    it('tsx is not installed there (nothing may need it at run time)', async () => {
      expect(existsSync(join(scratch, 'node_modules', 'tsx'))).toBe(false);
      const r = await inScratch(scratch, process.execPath, [
        '--input-type=module',
        '-e',
        "import.meta.resolve('tsx'); process.stdout.write('resolved')",
      ]);
      expect(r.stdout).not.toBe('resolved');
      expect(r.code).not.toBe(0);
    });

    // Fails with "require is not defined" inside a worker while the launcher and relay workers are
    // built from Function.prototype.toString() strings (issue 31 C): they inherit --input-type=module.
    it('imports the library by name under node --input-type=module: create, exec, a refused egress request, kill', async () => {
      const r = await inScratch(
        scratch,
        process.execPath,
        ['--input-type=module', '-e', LIBRARY_SCRIPT],
        120_000,
      );
      expect(r.stderr).toBe('');
      expect(r.code).toBe(0);
      const out = JSON.parse(r.stdout) as {
        echo: { exitCode: number; stdout: string };
        denied: { stdout: string; egress: { host: string; decision: string; code?: string }[] };
      };
      expect(out.echo).toEqual({ exitCode: 0, stdout: 'hi\n' });
      expect(out.denied.stdout).toBe('403');
      expect(out.denied.egress).toEqual([
        expect.objectContaining({ host: 'denied.example.net', decision: 'deny', code: expect.any(String) }),
      ]);
    }, 150_000);

    // bin/airlock.cjs runs the CLI bundle with the code cache the build made; a cache made from any
    // other source must never reach V8 (V8's own source check is only the length).
    it.each(['BUNDLE', 'RUN_BUNDLE'])(
      "the CLI's code cache of %s is made from the shipped bundle, is accepted by V8, and a cache of another source is ignored",
      async (which) => {
        const bin = join(scratch, 'node_modules', PKG.name, 'bin', 'airlock.cjs');
        // Each case in a process of its own: V8 also caches compiled code per process, and a second
        // load of the same source there would not look at the cache it is given.
        const load = async (cache: string): Promise<unknown> => {
          const probe = `
          const { createHash, randomBytes } = require('node:crypto');
          const { readFileSync } = require('node:fs');
          const { ${which}: BUNDLE, load } = require(${JSON.stringify(bin)});
          const shipped = readFileSync(BUNDLE + '.cache');
          const cache = ${cache};
          const r = load(BUNDLE, cache);
          process.stdout.write(JSON.stringify({ cache: r.cache, cli: typeof r.exports.runAsProcess }));`;
          const r = await inScratch(scratch, process.execPath, ['-e', probe]);
          expect(r.stderr).toBe('');
          return JSON.parse(r.stdout);
        };
        const name = which === 'BUNDLE' ? 'airlock.cjs' : 'airlock-run.cjs';
        const cached = readFileSync(join(scratch, 'node_modules', PKG.name, 'dist', 'bin', `${name}.cache`));
        const bundle = readFileSync(join(scratch, 'node_modules', PKG.name, 'dist', 'bin', name));
        expect(cached.subarray(0, 32)).toEqual(createHash('sha256').update(bundle).digest());
        expect(await load('shipped')).toEqual({ cache: 'accepted', cli: 'function' });
        // Another source's hash in front of a valid cache: never handed to V8.
        expect(await load('Buffer.concat([randomBytes(32), shipped.subarray(32)])')).toEqual({
          cache: 'none',
          cli: 'function',
        });
        // The right hash in front of garbage: V8 rejects it, and the CLI compiles as usual.
        expect(await load('Buffer.concat([shipped.subarray(0, 32), randomBytes(4096)])')).toEqual({
          cache: 'rejected',
          cli: 'function',
        });
        expect(await load('shipped.subarray(0, 32)')).toEqual({ cache: 'none', cli: 'function' });
        expect(await load('undefined')).toEqual({ cache: 'none', cli: 'function' });
      },
    );

    // run and diff start from dist/bin/airlock-run.cjs (bin/airlock.cjs): the same program as the full
    // bundle (flags, help), without the other commands' modules, which fail loudly if ever reached.
    it('the run bundle serves run and diff with the same program as the full bundle, and no other command', async () => {
      const bin = join(scratch, 'node_modules', PKG.name, 'bin', 'airlock.cjs');
      const probe = `
        const { BUNDLE, RUN_BUNDLE, bundleFor, load } = require(${JSON.stringify(bin)});
        const run = async (file, argv) => {
          let out = '', err = '';
          const code = await load(file, undefined).exports.main(argv, { out: (s) => (out += s), err: (s) => (err += s) });
          return { code, out, err };
        };
        (async () => {
          const same = [];
          for (const argv of [['run', '--help'], ['diff', '--help'], ['run', '--memory', 'lots', '--', 'true'], ['--help']]) {
            same.push(JSON.stringify(await run(BUNDLE, argv)) === JSON.stringify(await run(RUN_BUNDLE, argv)));
          }
          const other = await run(RUN_BUNDLE, ['snapshot', 'ls']);
          process.stdout.write(JSON.stringify({
            run: bundleFor(['run', '--', 'true']) === RUN_BUNDLE,
            diff: bundleFor(['diff']) === RUN_BUNDLE,
            mcp: bundleFor(['mcp']) === BUNDLE,
            bare: bundleFor([]) === BUNDLE,
            same,
            other: { code: other.code, err: other.err.includes('is not in dist/bin/airlock-run.cjs') },
          }));
        })();`;
      const r = await inScratch(scratch, process.execPath, ['-e', probe]);
      expect(r.stderr).toBe('');
      expect(JSON.parse(r.stdout)).toEqual({
        run: true,
        diff: true,
        mcp: true,
        bare: true,
        same: [true, true, true, true],
        other: { code: 70, err: true },
      });
    });

    it("npx airlock keys create uses the server's SQLite store (a native module, never bundled)", async () => {
      const state = mkdtempSync(join(tmpdir(), 'airlock-pkg-keys-'));
      try {
        const r = await inScratch(scratch, 'npx', [
          '--offline',
          'airlock',
          'keys',
          'create',
          '--tenant',
          'pkg',
          '--state-dir',
          state,
        ]);
        expect(r.stderr).toMatch(/for tenant "pkg"/);
        expect(r.code).toBe(0);
        expect(r.stdout).toMatch(/^alk_[0-9a-f]{16}_\S+\n$/);
      } finally {
        rmSync(state, { recursive: true, force: true });
      }
    });

    it('npx airlock --version prints the package version', async () => {
      const r = await inScratch(scratch, 'npx', ['--offline', 'airlock', '--version']);
      expect(r).toMatchObject({ code: 0, stdout: `${PKG.version}\n` });
    });

    it('npx airlock run -- echo hi runs a sandbox', async () => {
      const r = await inScratch(scratch, 'npx', ['--offline', 'airlock', 'run', '--', 'echo', 'hi']);
      expect(r).toEqual({ code: 0, stdout: 'hi\n', stderr: '' });
    });

    it('npx airlock run starts the run bundle with its code cache accepted (AIRLOCK_CLI_PHASES=1)', async () => {
      const r = await inScratch(scratch, 'npx', ['--offline', 'airlock', 'run', '--', 'true'], 60_000, {
        AIRLOCK_CLI_PHASES: '1',
      });
      expect(r.code).toBe(0);
      // The cache was made by `npm pack`'s build with this node: V8 takes it (else every start compiles).
      expect(r.stderr).toMatch(
        /^airlock phases \(ms since the process started\): node [\d.]+ \(\+[\d.]+\), airlock-run\.cjs \(code cache accepted\) [\d.]+ /,
      );
    });

    it('npx airlock run-code analyses and runs a cell from the cached full bundle (its loaders import() built-ins)', async () => {
      // The grammar (web-tree-sitter) and Pyodide loaders `await import('node:module')`; from a code
      // cache that failed with ERR_VM_DYNAMIC_IMPORT_CALLBACK_MISSING until the build turned them
      // into require(). A denied cell also proves the analysis ran.
      const ok = await inScratch(scratch, 'npx', ['--offline', 'airlock', 'run-code', 'print(6 * 7)']);
      expect(ok).toEqual({ code: 0, stdout: '42\n', stderr: '' });
      const denied = await inScratch(scratch, 'npx', [
        '--offline',
        'airlock',
        'run-code',
        "import base64; exec(base64.b64decode('cHJpbnQoMSk='))",
      ]);
      expect(denied.code).not.toBe(0);
      expect(denied.stderr).toMatch(/obfuscated-exec/);
    });

    it('npx airlock run --backend wasm runs Python and JavaScript (the interpreters load from their packages)', async () => {
      // The WASM worker is its own file beside the bundle, and Pyodide and QuickJS are external: each
      // finds its .wasm files in its own package (bundled, they looked for them in dist/bin).
      const py = await inScratch(
        scratch,
        'npx',
        ['--offline', 'airlock', 'run', '--backend', 'wasm', '--', 'python', '-c', 'print(1 + 1)'],
        120_000,
      );
      expect(py).toEqual({ code: 0, stdout: '2\n', stderr: '' });
      const js = await inScratch(
        scratch,
        'npx',
        ['--offline', 'airlock', 'run', '--backend', 'wasm', '--', 'node', '-e', 'console.log(2 + 3)'],
        120_000,
      );
      expect(js).toEqual({ code: 0, stdout: '5\n', stderr: '' });
    });

    it('npx airlock doctor --json reports the namespaces tier available', async () => {
      const r = await inScratch(scratch, 'npx', ['--offline', 'airlock', 'doctor', '--json']);
      expect(r.code).toBe(0);
      const report = JSON.parse(r.stdout) as { tiers: { namespaces: { available: boolean } } };
      expect(report.tiers.namespaces.available).toBe(true);
    });

    it('leaves nothing behind on the host', async () => {
      expect(await settledResidue()).toEqual(NO_RESIDUE);
    });
  },
);
