// `npm run build` (and `npm pack` through prepack): dist/ from nothing.
//   1. tsc: the library, one .js and .d.ts per source file (workers sit next to the module that starts
//      them, as src/core/worker.ts expects). No source maps: the package ships no src/ to map to.
//   2. esbuild: the CLI bundled into dist/bin/ with its dependencies (koffi, a native addon, stays
//      outside), split at its dynamic imports so each command loads only its own code. One bundle
//      instead of ~250 module files is most of what `airlock run` start-up saves (docs/reference/cli.md
//      gives the command; bench/index.ts P1 the figures). Every worker module file is an entry point
//      of its own, written flat beside the chunks, so `moduleWorker(import.meta.url, './x-worker…')`
//      from any chunk finds it.
import { execFileSync } from 'node:child_process';
import { readdirSync, rmSync } from 'node:fs';
import { basename, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { build, type Plugin } from 'esbuild';

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
  const workers = workerEntries();
  await build({
    absWorkingDir: ROOT,
    entryPoints: [
      { in: 'src/cli/main.ts', out: 'main' },
      ...workers.map((f) => ({ in: relative(ROOT, f), out: basename(f, '.ts') })),
    ],
    bundle: true,
    splitting: true,
    platform: 'node',
    format: 'esm',
    target: 'node20',
    outdir: CLI_OUT,
    chunkNames: 'chunk-[hash]',
    external: ['koffi', 'tsx', 'tsx/*'],
    // Bundled CommonJS packages call require(); ESM has none, so give every chunk one.
    banner: {
      js: "import { createRequire as __airlockCreateRequire } from 'node:module'; const require = __airlockCreateRequire(import.meta.url);",
    },
    plugins: [zodEnglishOnly],
    legalComments: 'eof',
    logLevel: 'warning',
  });
}

await main();
