// The Python SDK's pytest suite (python/tests), run here so that the README's test command runs it.
// pytest starts its own real server (scripts/test-server.ts) on this run's state dir and uid range;
// afterwards the host must hold nothing of it.
import { spawnSync } from 'node:child_process';
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
const PYTEST_SKIP =
  'needs python3 with pytest (Debian: apt-get install python3-pytest; scripts/setup.sh does)';

describe.skipIf(python === undefined || !canRunNamespaces)(
  `Python SDK: pytest python/tests (${python === undefined ? PYTEST_SKIP : SKIP_REASON})`,
  () => {
    it('passes against a real server and leaves nothing behind', { timeout: 900_000 }, async () => {
      const r = spawnSync(python!, ['-m', 'pytest', 'python/tests', '-q', '-p', 'no:cacheprovider'], {
        cwd: ROOT,
        env: { ...process.env, PYTHONDONTWRITEBYTECODE: '1' },
        encoding: 'utf8',
        timeout: 840_000,
        maxBuffer: 64 * 1024 * 1024,
      });
      // On failure, pytest's own report is the message.
      expect(r.status, `${r.stdout}\n${r.stderr}`).toBe(0);
      expect(r.stdout).toMatch(/\d+ passed/);
      expect(r.stdout).not.toMatch(/\d+ (failed|error)/);
      expect(await settledResidue(10_000)).toEqual(NO_RESIDUE);
    });
  },
);
