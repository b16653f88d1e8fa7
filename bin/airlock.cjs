#!/usr/bin/env node
// The `airlock` command. From the package (or a clone after `npm run build`): the bundled CLI,
// dist/bin/airlock.cjs, on plain Node with the V8 code cache the build made for it. From a clone
// without dist: the TypeScript source through tsx (a dev dependency), or a message saying how to build.
//
// The code cache: most of a one-shot command's start-up was V8 parsing and compiling the bundle, and
// a cache hit skips that (an ES module cannot be given a cache on Node 20, hence CommonJS, here and
// in the bundle). The cache is part of the build, as trusted as the code beside it, and is never
// written at run time. V8 rejects a cache made by another Node/V8 version or other V8 flags (the CLI
// then compiles as usual); its own check of the source is only its length, so the cache file starts
// with the SHA-256 of the source it was made from, and is ignored for any other source.
'use strict';
const { createHash } = require('node:crypto');
const { existsSync, readFileSync, writeFileSync } = require('node:fs');
const Module = require('node:module');
const { basename, dirname, join } = require('node:path');
const vm = require('node:vm');

const BUNDLE = join(__dirname, '..', 'dist', 'bin', 'airlock.cjs');
// The same program with only the modules of the commands that make one sandbox and exit (scripts
// and agents start them over and over): a start reads and deserialises the code cache of what the
// bundle initialises, and the full bundle's holds every command's modules. Same flags, same help.
const RUN_BUNDLE = join(__dirname, '..', 'dist', 'bin', 'airlock-run.cjs');
const RUN_BUNDLE_COMMANDS = ['run', 'diff']; // as in scripts/build.ts
const HASH_BYTES = 32;

/**
 * Compiles and evaluates the bundle `file`, with `cache` when it was made from this source. `cache`
 * in the result: 'none' (no cache, or one made from another source), 'accepted' or 'rejected' (by V8).
 */
function load(file, cache) {
  const source = readFileSync(file);
  const hash = createHash('sha256').update(source).digest();
  const cachedData =
    cache && cache.length > HASH_BYTES && hash.equals(cache.subarray(0, HASH_BYTES))
      ? cache.subarray(HASH_BYTES)
      : undefined;
  // The build emits ASCII only (esbuild escapes the rest; scripts/build.ts checks): latin1 decodes
  // it as utf8 would, and faster.
  let text = source.toString('latin1');
  if (text.startsWith('#!')) text = `//${text.slice(2)}`; // the entry's hashbang, inside a function wrapper
  const script = new vm.Script(Module.wrap(text), {
    filename: file,
    cachedData,
    importModuleDynamically: vm.constants?.USE_MAIN_CONTEXT_DEFAULT_LOADER,
  });
  const module = { exports: {} };
  script.runInThisContext()(module.exports, Module.createRequire(file), module, file, dirname(file));
  const used = cachedData === undefined ? 'none' : script.cachedDataRejected ? 'rejected' : 'accepted';
  return { script, hash, exports: module.exports, cache: used };
}

/** The bundle that runs this command line (`argv` without node and this script). */
function bundleFor(argv) {
  return RUN_BUNDLE_COMMANDS.includes(argv[0]) && existsSync(RUN_BUNDLE) ? RUN_BUNDLE : BUNDLE;
}

/**
 * Build step (scripts/build.ts, in a plain `node` so that the V8 flags match the CLI's): evaluates
 * a bundle ('run': the run bundle), loads its commands' modules so that their code is compiled
 * too ('run', as root: and makes one real sandbox, see oneShotForCache in src/cli/main.ts), and
 * writes its cache.
 */
async function writeCliCache(which) {
  const file = which === 'run' ? RUN_BUNDLE : BUNDLE;
  const { script, hash, exports: cli } = load(file, undefined);
  await cli.loadCommands(which === 'run' ? RUN_BUNDLE_COMMANDS : undefined);
  if (which === 'run') {
    // What a one-shot runs after loading (create → exec → kill) compiled into the cache too.
    const why = await cli.oneShotForCache();
    process.stderr.write(
      why === undefined
        ? 'airlock-run.cjs.cache: made after a real `airlock run -- true`\n'
        : `airlock-run.cjs.cache: made after loading only (${why}); a one-shot compiles its sandbox code at each start\n`,
    );
  }
  writeFileSync(`${file}.cache`, Buffer.concat([hash, script.createCachedData()]));
}

async function fromSource() {
  let register;
  try {
    ({ register } = await import('tsx/esm/api'));
  } catch {
    process.stderr.write(
      `airlock: ${BUNDLE} is missing and tsx (to run the TypeScript source) is not installed;\n` +
        `  in a clone run "npm ci && npm run build" (or "npm ci" alone to run from source through tsx)\n`,
    );
    process.exit(70);
  }
  register();
  const { runAsProcess } = await import(join(__dirname, '..', 'src', 'cli', 'main.ts'));
  await runAsProcess();
}

if (require.main === module) {
  // AIRLOCK_CLI_PHASES=1: start-up phase timestamps on stderr (src/cli/phases.ts prints them).
  const phases =
    process.env.AIRLOCK_CLI_PHASES === '1'
      ? (globalThis[Symbol.for('airlock.cli.phases')] = [['node', process.uptime() * 1000]])
      : undefined;
  if (existsSync(BUNDLE)) {
    const file = bundleFor(process.argv.slice(2));
    let cache;
    try {
      cache = readFileSync(`${file}.cache`);
    } catch {
      // a build without a cache: compile as usual
    }
    const loaded = load(file, cache);
    phases?.push([`${basename(file)} (code cache ${loaded.cache})`, process.uptime() * 1000]);
    void loaded.exports.runAsProcess();
  } else {
    void fromSource();
  }
} else {
  module.exports = { BUNDLE, RUN_BUNDLE, RUN_BUNDLE_COMMANDS, bundleFor, load, writeCliCache };
}
