// Packages only some features need are loaded on first use (src/core/lazy.ts): importing the library
// or the CLI's `run` path must not load them, and the feature that needs one must still get it. Each
// case runs in a fresh Node process (this one has loaded everything already).
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const HEAVY = ['yaml', 'node-forge', 'dns-packet', 'tldts', 'gpt-tokenizer', 'ajv'];

/** Run `body` (an async function body, `src` is the src dir URL) in a fresh tsx process; the heavy packages it has loaded. */
function loadedAfter(body: string): string[] {
  const script = `
    import { createRequire } from 'node:module';
    const require = createRequire(import.meta.url);
    const src = ${JSON.stringify(new URL('../../src/', import.meta.url).href)};
    ${body}
    const heavy = ${JSON.stringify(HEAVY)};
    const loaded = heavy.filter((p) => Object.keys(require.cache).some((k) => k.includes('/node_modules/' + p + '/')));
    process.stdout.write(JSON.stringify(loaded));
  `;
  const out = execFileSync(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script], {
    cwd: ROOT,
    encoding: 'utf8',
  });
  return JSON.parse(out) as string[];
}

describe('lazy imports', () => {
  it('the CLI (what cli/main.ts imports before it runs a command) loads none of them', () => {
    // What each command's module loads before the command runs (main.ts imports them when it runs).
    const cli = ['run', 'demo', 'doctor', 'flags', 'snapshot', 'template', 'remote'];
    const body = cli.map((m) => `await import(src + 'cli/${m}.ts');`).join('\n');
    expect(loadedAfter(`await import('commander');\n${body}`)).toEqual([]);
  }, 30_000);

  it('cli/main.ts, imported (not run), builds the whole program loading none of them', () => {
    // Imported by another module, main.ts must not parse this process's command line.
    const script = `
      const src = ${JSON.stringify(new URL('../../src/', import.meta.url).href)};
      const { buildProgram } = await import(src + 'cli/main.ts');
      process.stdout.write(JSON.stringify(buildProgram().commands.map((c) => c.name())));
    `;
    const out = execFileSync(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script], {
      cwd: ROOT,
      encoding: 'utf8',
    });
    expect(JSON.parse(out)).toEqual(
      expect.arrayContaining(['run', 'mcp', 'gateway', 'template', 'doctor', 'ps', 'exec', 'cp']),
    );
    expect(loadedAfter(`(await import(src + 'cli/main.ts')).buildProgram();`)).toEqual([]);
  }, 30_000);

  it('importing the library loads none of them but ajv (the MCP SDK uses it)', () => {
    expect(loadedAfter(`await import(src + 'index.ts');`)).toEqual(['ajv']);
  }, 30_000);

  it("airlock run's path initialises no other tier's modules; a call that needs every tier loads them", () => {
    // What the run path runs before its create (flags, plan, spec), then the CLI's runtime; the
    // source files V8 has parsed so far, as the inspector lists them (tsx runs each as a script).
    const state = mkdtempSync(join(tmpdir(), 'airlock-lazy-'));
    const script = `
      import { Session } from 'node:inspector/promises';
      const session = new Session();
      session.connect();
      const urls = new Set();
      session.on('Debugger.scriptParsed', (m) => urls.add(m.params.url));
      await session.post('Debugger.enable');
      const src = ${JSON.stringify(new URL('../../src/', import.meta.url).href)};
      const tiers = () =>
        [...urls].filter((u) => ['gvisor', 'microvm', 'wasm'].some((t) => u.includes('/src/backends/' + t + '/')))
          .map((u) => u.split('/src/')[1]);
      // Sandbox features a plain run never uses: the code runner (runCode) and the patch writer (diff).
      const features = () =>
        [...urls].filter((u) => u.includes('/src/sandbox/code/') || u.endsWith('/src/sandbox/git-patch.ts'))
          .map((u) => u.split('/src/')[1]);
      const run = await import(src + 'cli/run.ts');
      run.warmUpForCache();
      const airlock = (await import(src + 'cli/lifecycle.ts')).cliAirlock({ oneSandbox: true });
      const before = tiers();
      const featuresBefore = features();
      // Nor koffi (the libc binding): the fd limit is read from /proc/self/limits, as prlimit says it.
      const { createRequire } = await import('node:module');
      const koffi = Object.keys(createRequire(import.meta.url).cache).some((k) => k.includes('/node_modules/koffi/'));
      const nofile = await import(src + 'backends/host/nofile.privileged.ts');
      const limits = [nofile.raiseOpenFileLimit(), nofile.openFileLimit()];
      await airlock.snapshots.list(); // every tier's snapshot store
      const { SandboxBase } = await import(src + 'sandbox/sandbox.ts');
      const gone = Object.create(SandboxBase.prototype);
      gone.killing = Promise.resolve(); // a killed sandbox: runCode loads the runner, then refuses
      const runCode = await gone.runCode('1').then(() => 'ran', (e) => e.code);
      await import(src + 'sandbox/workspace.ts');
      process.stdout.write(
        JSON.stringify({ before, koffi, limits, after: tiers(), featuresBefore, runCode, featuresAfter: features() }),
      );
    `;
    try {
      const out = execFileSync(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script], {
        cwd: ROOT,
        encoding: 'utf8',
        env: { ...process.env, AIRLOCK_STATE_DIR: state },
      });
      const { before, koffi, limits, after, featuresBefore, runCode, featuresAfter } = JSON.parse(out) as {
        before: string[];
        koffi: boolean;
        limits: [unknown, unknown];
        after: string[];
        featuresBefore: string[];
        runCode: string;
        featuresAfter: string[];
      };
      expect(before).toEqual([]);
      expect(featuresBefore).toEqual([]);
      expect(runCode).toBe('SANDBOX_GONE');
      expect(featuresAfter).toEqual(expect.arrayContaining(['sandbox/code/runner.ts']));
      expect(featuresAfter).not.toContain('sandbox/git-patch.ts'); // only diff() loads it
      expect(koffi).toBe(false);
      expect(limits[0]).toEqual(limits[1]);
      expect(after).toEqual(
        expect.arrayContaining([
          'backends/gvisor/index.ts',
          'backends/microvm/index.ts',
          'backends/wasm/index.ts',
        ]),
      );
    } finally {
      rmSync(state, { recursive: true, force: true });
    }
  }, 60_000);

  it('a feature loads its package when used', () => {
    const loaded = loadedAfter(`
      const net = await import(src + 'policy/network.ts');
      net.parsePolicyYaml('network:\\n  allow: ["*.example.com"]\\n');
      const { SessionBudget } = await import(src + 'mcp/budget.ts');
      new SessionBudget({ maxOutputTokens: 10 });
      await import(src + 'egress/dns.ts');
    `);
    expect(loaded).toEqual(expect.arrayContaining(['yaml', 'tldts', 'gpt-tokenizer']));
    expect(loaded).not.toContain('dns-packet'); // imported, never used
  }, 30_000);
});
