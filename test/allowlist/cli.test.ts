// `airlock run --executables`: the CLI's way to the spec field (the sandbox cases are in
// sandbox.contract.ts): what is listed runs, the shell does not exist, a bad list is a typed error.
import { describe, expect, it } from 'vitest';
import { canRunNamespaces, runCli, SKIP_REASON } from '../helpers.js';

describe.skipIf(!canRunNamespaces)(`airlock run --executables (${SKIP_REASON})`, () => {
  it('python3 listed: it runs; sh is "command not found" (127)', async () => {
    const ok = await runCli(['run', '--executables', 'python3', '--', 'python3', '-c', 'print(6*7)']);
    expect(ok.stderr).toBe('');
    expect(ok.stdout).toBe('42\n');
    expect(ok.code).toBe(0);
    const sh = await runCli(['run', '--executables', 'python3', '--', 'sh', '-c', 'echo reached']);
    expect(sh.code).toBe(127);
    expect(sh.stdout).toBe('');
    expect(sh.stderr).toMatch(/sh: command not found/);
  }, 120_000);

  it('an empty list and an unknown program are typed errors', async () => {
    const empty = await runCli(['run', '--executables', ',', '--', 'true']);
    expect(empty.code).not.toBe(0);
    expect(empty.stderr).toMatch(/executables lists at least one program/);
    const unknown = await runCli(['run', '--executables', 'no-such-program-x', '--', 'true']);
    expect(unknown.code).not.toBe(0);
    expect(unknown.stderr).toMatch(/no-such-program-x/);
  }, 120_000);
});
