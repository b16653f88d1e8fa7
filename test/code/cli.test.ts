// `airlock run-code`: the real CLI (src/cli/main.ts through tsx) on the test state dir.
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, test } from 'vitest';
import {
  NO_RESIDUE,
  SKIP_REASON,
  TEST_STATE_DIR,
  canRunNamespaces,
  runCli,
  settledResidue,
} from '../helpers.js';

describe.skipIf(!canRunNamespaces)(`airlock run-code (${SKIP_REASON})`, () => {
  test('prints stdout and results; exit 1 on the code error; 2 on bad input; nothing left', async () => {
    const ok = await runCli(['run-code', 'print("hi")\n6 * 7']);
    expect(ok).toMatchObject({ code: 0, stdout: 'hi\n42\n' });
    const file = join(TEST_STATE_DIR, 'run-code-test.js');
    writeFileSync(file, 'console.error("warn"); [1, 2].map((x) => x * 3)');
    const js = await runCli(['run-code', '--language', 'javascript', '--file', file]);
    expect(js).toMatchObject({ code: 0, stdout: '[ 3, 6 ]\n', stderr: 'warn\n' });
    const failed = await runCli(['run-code', '--language', 'bash', 'echo out; exit 3']);
    expect(failed.code).toBe(1);
    expect(failed.stdout).toBe('out\n');
    const raised = await runCli(['run-code', '1/0']);
    expect(raised.code).toBe(1);
    expect(raised.stderr).toContain('ZeroDivisionError');
    const bad = await runCli(['run-code', '--language', 'cobol', '1']);
    expect(bad.code).toBe(2);
    const none = await runCli(['run-code']);
    expect(none.code).toBe(2);
    expect(none.stderr).toContain('--file');
    expect(await settledResidue()).toEqual(NO_RESIDUE);
  });
});
