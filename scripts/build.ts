// `npm run build` (and `npm pack` through prepack): dist/ from nothing.
//   1. tsc: the library, one .js and .d.ts per source file (workers sit next to the module that starts
//      them, as src/core/worker.ts expects). No source maps: the package ships no src/ to map to.
//   2. esbuild: the CLI bundled into one CommonJS file, dist/bin/airlock.cjs, with its dependencies
//      (koffi, a native addon, stays outside). Each command's module is initialised only when that
//      command runs. Every worker module file is an entry point of its own, written flat beside it, so
//      `moduleWorker(import.meta.url, './x-worker…')` finds it.
//      A second bundle, dist/bin/airlock-run.cjs, holds the same program with only the one-sandbox
//      commands' modules (RUN_BUNDLE_COMMANDS): `airlock run` is started by scripts and agents
//      many times over, and most of a start is V8 reading the code cache, whose size is what the
//      bundle initialises (every command's modules, for the full one).
//   3. The V8 code cache of each bundle (dist/bin/*.cjs.cache; bin/airlock.cjs explains it).
// docs/reference/cli.md gives the command; bench/lifecycle.ts measures its start-up.
import { execFileSync } from 'node:child_process';
import { cpSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
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

/** The commands in dist/bin/airlock-run.cjs (bin/airlock.cjs starts it for these; keep the two alike). */
export const RUN_BUNDLE_COMMANDS = ['run', 'diff'];

/**
 * For the run bundle: every other command's module, which main.ts imports dynamically, becomes a
 * module that throws (bin/airlock.cjs never runs those commands from this bundle; if it ever did,
 * the error says so rather than a command doing nothing).
 */
const onlyRunCommands: Plugin = {
  name: 'only-run-commands',
  setup(b) {
    // flags.js: main.ts's error lines; one-shot.js: the settings main.ts applies before a one-shot.
    const kept = new Set([...RUN_BUNDLE_COMMANDS.map((c) => `./${c}.js`), './flags.js', './one-shot.js']);
    b.onResolve({ filter: /^\.\/[a-z-]+\.js$/ }, (args) =>
      args.kind === 'dynamic-import' &&
      /[/\\]src[/\\]cli[/\\][a-z-]+\.ts$/.test(args.importer) &&
      !kept.has(args.path)
        ? { path: args.path, namespace: 'not-in-run-bundle' }
        : undefined,
    );
    b.onLoad({ filter: /.*/, namespace: 'not-in-run-bundle' }, (args) => ({
      contents: `throw new Error(${JSON.stringify(`airlock: ${args.path} is not in dist/bin/airlock-run.cjs`)});`,
      loader: 'js',
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
  // The code kernels (src/sandbox/code/kernels/*.py|.js|.sh) are read at run time beside the module
  // that starts them: beside the library's and beside the CLI bundles (whose import.meta.url is theirs).
  for (const to of [join(DIST, 'sandbox/code/kernels'), join(CLI_OUT, 'kernels')]) {
    cpSync(join(ROOT, 'src/sandbox/code/kernels'), to, { recursive: true });
  }
  const common: BuildOptions = {
    absWorkingDir: ROOT,
    bundle: true,
    platform: 'node',
    target: 'node20',
    outdir: CLI_OUT,
    // Native modules load their .node file relative to their own package: never bundled.
    // esbuild (TypeScript for runCode) finds its platform binary relative to its own package too.
    // The WASM tier's interpreters (pyodide, quickjs-emscripten and its @jitl variants) find their
    // .wasm and stdlib files relative to their own packages: never bundled either.
    external: [
      'koffi',
      'better-sqlite3',
      'tsx',
      'tsx/*',
      'esbuild',
      'pyodide',
      'quickjs-emscripten',
      '@jitl/*',
    ],
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
  const cli: BuildOptions = {
    ...common,
    format: 'cjs',
    outExtension: { '.js': '.cjs' },
    define: { 'import.meta.url': '__airlockUrl' },
    banner: {
      js: "const __airlockUrl = require('node:url').pathToFileURL(__filename).href; const __airlockRequire = require;",
    },
  };
  await build({ ...cli, entryPoints: [{ in: 'src/cli/main.ts', out: 'airlock' }] });
  await build({
    ...cli,
    entryPoints: [{ in: 'src/cli/main.ts', out: 'airlock-run' }],
    plugins: [...(common.plugins ?? []), onlyRunCommands],
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
  // bin/airlock.cjs decodes the bundles as latin1, which is only right for ASCII. esbuild's default
  // charset escapes strings but leaves regular expression literals as written (the MCP scanner's
  // multilingual lexicon), so every UTF-16 unit left above 0x7f becomes \uXXXX: the same character in
  // a regex literal (a surrogate pair of escapes is one code point under /u too), a string or a
  // template. In String.raw it stays the six characters, which only RegExp sources read, and RegExp
  // decodes them alike.
  for (const name of ['airlock.cjs', 'airlock-run.cjs']) {
    const text = readFileSync(join(CLI_OUT, name), 'utf8');
    const escaped = text.replace(
      /[\u0080-\uffff]/g,
      (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`,
    );
    // import('x') left in the bundle (external packages and built-ins, e.g. the grammar and Pyodide
    // loaders' `await import("node:module")`) becomes a require through the banner's alias: the
    // bundle runs from a vm.Script with a code cache, and V8 drops the dynamic-import callback of
    // functions compiled from that cache (ERR_VM_DYNAMIC_IMPORT_CALLBACK_MISSING in `airlock
    // run-code`). The alias, because those loaders declare a `var require` of their own in scope.
    const required = escaped.replace(
      /(?<![\w$.])import\("([^"]+)"\)/g,
      (_, spec: string) => `Promise.resolve().then(() => __airlockRequire(${JSON.stringify(spec)}))`,
    );
    if (required !== text) writeFileSync(join(CLI_OUT, name), required);
    const bundle = readFileSync(join(CLI_OUT, name));
    const nonAscii = bundle.findIndex((b) => b > 0x7f);
    if (nonAscii !== -1) throw new Error(`dist/bin/${name} has a non-ASCII byte at offset ${nonAscii}`);
  }
  // The code caches, made by a plain `node` (the V8 flags of the cache and of the CLI must match),
  // each in a process of its own (V8 reuses code it compiled earlier in the same process).
  for (const args of [[], ['run']]) {
    execFileSync(
      process.execPath,
      [
        '-e',
        'require(process.argv[1]).writeCliCache(process.argv[2])',
        join(ROOT, 'bin', 'airlock.cjs'),
        ...args,
      ],
      { cwd: ROOT, stdio: 'inherit', env: { ...process.env, NODE_OPTIONS: '' } },
    );
  }
}

await main();
