// The real `airlock` CLI as a child process, run from any directory (the diff tests run it in the
// host dir it works on): tsx is loaded by absolute path so the cwd need not hold node_modules.
import { spawn } from 'node:child_process';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { TEST_STATE_DIR, TEST_UID_RANGE } from '../helpers.js';

export const ROOT = join(import.meta.dirname, '..', '..');
const TSX = pathToFileURL(join(ROOT, 'node_modules', 'tsx', 'dist', 'loader.mjs')).href;
const MAIN = join(ROOT, 'src', 'cli', 'main.ts');

export interface CliRun {
  code: number | null;
  stdout: string;
  stderr: string;
}

export function airlockCli(
  args: readonly string[],
  o: { cwd?: string; timeoutMs?: number } = {},
): Promise<CliRun> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ['--import', TSX, MAIN, ...args], {
      cwd: o.cwd ?? ROOT,
      env: {
        ...process.env,
        AIRLOCK_STATE_DIR: TEST_STATE_DIR,
        AIRLOCK_UID_RANGE: `${TEST_UID_RANGE.first}:${TEST_UID_RANGE.count}`,
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (t: string) => (stdout += t));
    child.stderr.setEncoding('utf8').on('data', (t: string) => (stderr += t));
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`airlock ${args.join(' ')} did not exit in time; stderr: ${stderr}`));
    }, o.timeoutMs ?? 120_000);
    child.on('error', reject);
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
  });
}
