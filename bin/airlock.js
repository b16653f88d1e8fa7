#!/usr/bin/env node
// Thin launcher: the compiled CLI when built, else the TypeScript source through tsx (dev checkout).
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { dirname, join } from 'node:path';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const built = join(root, 'dist', 'cli', 'main.js');
if (existsSync(built)) {
  await import(built);
} else {
  const { register } = await import('tsx/esm/api');
  register();
  await import(join(root, 'src', 'cli', 'main.ts'));
}
