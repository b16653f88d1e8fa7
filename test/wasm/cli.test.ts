// `airlock run --backend wasm`: the CLI reaches the tier (python runs, anything else exits 127).
import { describe, expect, it } from 'vitest';
import { NOT_RUNNABLE } from '../../src/backends/wasm/commands.js';
import { runCli } from '../helpers.js';

describe('airlock run --backend wasm', () => {
  it('runs python and passes its exit code; a non-python command exits 127 with the one line', async () => {
    const ok = await runCli(
      ['run', '--backend', 'wasm', '--', 'python3', '-c', 'import sys; print(6 * 7); sys.exit(5)'],
      {
        timeoutMs: 240_000,
      },
    );
    expect([ok.code, ok.stdout]).toEqual([5, '42\n']);
    const no = await runCli(['run', '--backend', 'wasm', '--', 'ls', '/'], { timeoutMs: 240_000 });
    expect(no.code).toBe(127);
    expect(no.stderr).toContain(`airlock: ls: ${NOT_RUNNABLE}`);
  }, 600_000);
});
