#!/usr/bin/env node
// The `airlock` command. From the package (or a clone after `npm run build`): the bundled CLI in
// dist/bin/, plain Node, no TypeScript loader. From a clone without dist: the TypeScript source
// through tsx (a dev dependency), or a message saying how to build.
import { existsSync } from 'node:fs';
import process from 'node:process';
import { fileURLToPath } from 'node:url';
import { dirname, join } from 'node:path';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const built = join(root, 'dist', 'bin', 'main.js');
if (existsSync(built)) {
  const { runAsProcess } = await import(built);
  await runAsProcess();
} else {
  let register;
  try {
    ({ register } = await import('tsx/esm/api'));
  } catch {
    process.stderr.write(
      `airlock: ${built} is missing and tsx (to run the TypeScript source) is not installed;\n` +
        `  in a clone run "npm ci && npm run build" (or "npm ci" alone to run from source through tsx)\n`,
    );
    process.exit(70);
  }
  register();
  const { runAsProcess } = await import(join(root, 'src', 'cli', 'main.ts'));
  await runAsProcess();
}
