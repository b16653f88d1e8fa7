// The Python SDK's pytest suite (python/tests), run here so that the README's test command runs it.
// pytest starts its own real server (scripts/test-server.ts) on this run's state dir and uid range;
// afterwards the host must hold nothing of it.
import { spawn, spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { NO_RESIDUE, SKIP_REASON, canRunNamespaces, settledResidue } from './helpers.js';

const ROOT = join(import.meta.dirname, '..');

/** Debian's python3 (python3-pytest) first, else the first python3 on PATH that has pytest. */
function findPython(): string | undefined {
  for (const py of ['/usr/bin/python3', 'python3']) {
    const r = spawnSync(py, ['-c', 'import pytest'], { stdio: 'ignore' });
    if (r.status === 0) return py;
  }
  return undefined;
}

const python = findPython();

/** Run a command to its end (killed after `timeoutMs`): its exit status and output. */
function run(
  cmd: string,
  args: string[],
  timeoutMs: number,
): Promise<{ status: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, {
      cwd: ROOT,
      env: { ...process.env, PYTHONDONTWRITEBYTECODE: '1' },
      stdio: ['ignore', 'pipe', 'pipe'],
      timeout: timeoutMs,
    });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (d: string) => (stdout += d));
    child.stderr.setEncoding('utf8').on('data', (d: string) => (stderr += d));
    child.on('error', reject);
    child.on('close', (status) => resolve({ status, stdout, stderr }));
  });
}

const PYTEST_SKIP =
  'needs python3 with pytest (Debian: apt-get install python3-pytest; scripts/setup.sh does)';

describe.skipIf(python === undefined || !canRunNamespaces)(
  `Python SDK: pytest python/tests (${python === undefined ? PYTEST_SKIP : SKIP_REASON})`,
  () => {
    it('passes against a real server and leaves nothing behind', { timeout: 900_000 }, async () => {
      // Asynchronously: a blocked event loop would starve vitest's own worker messages.
      const r = await run(python!, ['-m', 'pytest', 'python/tests', '-q', '-p', 'no:cacheprovider'], 840_000);
      // On failure, pytest's own report is the message.
      expect(r.status, `${r.stdout}\n${r.stderr}`).toBe(0);
      expect(r.stdout).toMatch(/\d+ passed/);
      expect(r.stdout).not.toMatch(/\d+ (failed|error)/);
      expect(await settledResidue(10_000)).toEqual(NO_RESIDUE);
    });
  },
);
