// The real `airlock` CLI as a child process, run from any directory (the diff tests run it in the
// host dir it works on): test/helpers.ts runCli, under the name these tests use.
import { join } from 'node:path';
import { runCli } from '../helpers.js';

export const ROOT = join(import.meta.dirname, '..', '..');

export interface CliRun {
  code: number | null;
  stdout: string;
  stderr: string;
}

export function airlockCli(
  args: readonly string[],
  o: { cwd?: string; timeoutMs?: number } = {},
): Promise<CliRun> {
  return runCli(args, o);
}
