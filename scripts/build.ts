// `npm run build` (and `npm pack` through prepack): dist/ from nothing.
//   1. tsc: the library, one .js and .d.ts per source file (workers sit next to the module that starts
//      them, as src/core/worker.ts expects). No source maps: the package ships no src/ to map to.
//   2. esbuild: the CLI bundled into one CommonJS file, dist/bin/airlock.cjs, with its dependencies
//      (koffi, a native addon, stays outside). Each command's module is initialised only when that
//      command runs. Every worker module file is an entry point of its own, written flat beside it, so
//      `moduleWorker(import.meta.url, './x-worker…')` finds it.
//   3. The V8 code cache of that bundle (dist/bin/airlock.cjs.cache; bin/airlock.cjs explains it).
// docs/reference/cli.md gives the command; bench/lifecycle.ts measures its start-up.
import { execFileSync } from 'node:child_process';
import { readFileSync, readdirSync, rmSync } from 'node:fs';
import { basename, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { build, type BuildOptions, type Plugin } from 'esbuild';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const DIST = join(ROOT, 'dist');
const CLI_OUT = join(DIST, 'bin');

/** src files that run as worker threads: `*-worker.ts` / `*-worker.privileged.ts`. */
export function workerEntries(dir = join(ROOT, 'src')): string[] {
  const found = readdirSync(dir, { recursive: true, encoding: 'utf8' })
    .filter((f) => /(^|\/)[^/]+-worker(\.privileged)?\.ts$/.test(f))
    .map((f) => join(dir, f));
  const names = new Map<string, string>();
  for (const f of found) {
    const other = names.get(basename(f));
    if (other) throw new Error(`two worker files named ${basename(f)}: ${other} and ${f}; rename one`);
    names.set(basename(f), f);
  }
  return found;
}

/**
 * zod ships about 60 message locales (a third of its code) and `import { z } from 'zod'` pulls all of
 * them in through `z.locales`; Airlock's messages are English only, so the CLI bundle keeps that one.
 */
const zodEnglishOnly: Plugin = {
  name: 'zod-english-only',
  setup(b) {
    b.onResolve({ filter: /^\.\.\/locales\/index\.js$/ }, (args) =>
      /[/\\]zod[/\\]v4[/\\](classic|core)$/.test(args.resolveDir)
        ? { path: join(args.resolveDir, '..', 'locales', 'en.js'), namespace: 'zod-english-only' }
        : undefined,
    );
    b.onLoad({ filter: /.*/, namespace: 'zod-english-only' }, (args) => ({
      contents: `export { default as en } from ${JSON.stringify(args.path)};`,
      resolveDir: ROOT,
    }));
  },
};

async function main(): Promise<void> {
  rmSync(DIST, { recursive: true, force: true });
  execFileSync(
    process.execPath,
    [join(ROOT, 'node_modules/typescript/bin/tsc'), '-p', 'tsconfig.build.json'],
    {
      cwd: ROOT,
      stdio: 'inherit',
    },
  );
  const common: BuildOptions = {
    absWorkingDir: ROOT,
    bundle: true,
    platform: 'node',
    target: 'node20',
    outdir: CLI_OUT,
    external: ['koffi', 'tsx', 'tsx/*'],
    plugins: [zodEnglishOnly],
    legalComments: 'eof',
    // Less for V8 to read and parse at every start; names are kept for stack traces and errors.
    minify: true,
    keepNames: true,
    logLevel: 'warning',
  };
  // The CLI: one CommonJS file (bin/airlock.cjs runs it with a V8 code cache, which an ES module
  // cannot have on Node 20). Each command's module still runs only when that command does: esbuild
  // turns the dynamic imports into lazily initialised sections of the bundle.
  await build({
    ...common,
    entryPoints: [{ in: 'src/cli/main.ts', out: 'airlock' }],
    format: 'cjs',
    outExtension: { '.js': '.cjs' },
    define: { 'import.meta.url': '__airlockUrl' },
    banner: { js: "const __airlockUrl = require('node:url').pathToFileURL(__filename).href;" },
  });
  // Workers: ES modules, each whole in its own file (the CLI's moduleWorker finds them beside it).
  await build({
    ...common,
    entryPoints: workerEntries().map((f) => ({ in: relative(ROOT, f), out: basename(f, '.ts') })),
    format: 'esm',
    // Bundled CommonJS packages call require(); ESM has none, so give every file one.
    banner: {
      js: "import { createRequire as __airlockCreateRequire } from 'node:module'; const require = __airlockCreateRequire(import.meta.url);",
    },
  });
  // bin/airlock.cjs decodes the bundle as latin1, which is only right for ASCII (esbuild's default
  // charset escapes everything else).
  const bundle = readFileSync(join(CLI_OUT, 'airlock.cjs'));
  const nonAscii = bundle.findIndex((b) => b > 0x7f);
  if (nonAscii !== -1) throw new Error(`dist/bin/airlock.cjs has a non-ASCII byte at offset ${nonAscii}`);
  // The code cache, made by a plain `node` (the V8 flags of the cache and of the CLI must match).
  execFileSync(
    process.execPath,
    ['-e', 'require(process.argv[1]).writeCliCache()', join(ROOT, 'bin', 'airlock.cjs')],
    { cwd: ROOT, stdio: 'inherit', env: { ...process.env, NODE_OPTIONS: '' } },
  );
}

await main();
