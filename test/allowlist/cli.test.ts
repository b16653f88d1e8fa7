// `airlock run --executables`: the CLI's way to the spec field (the sandbox cases are in
// sandbox.contract.ts): what is listed runs, the shell does not exist, a bad list is a typed error.
import { existsSync, readdirSync } from 'node:fs';
import { basename, join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { Airlock } from '../../src/sandbox/airlock.js';
import {
  canRunNamespaces,
  NO_RESIDUE,
  runCli,
  settledResidue,
  SKIP_REASON,
  TEST_STATE_DIR,
  TEST_UID_RANGE,
} from '../helpers.js';

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

  it('airlock image prune removes the allowlist roots no live sandbox uses, and keeps the one in use', async () => {
    const closures = join(TEST_STATE_DIR, 'closures');
    expect((await runCli(['run', '--executables', 'true', '--', 'true'])).code).toBe(0);
    const airlock = new Airlock({ stateDir: TEST_STATE_DIR, uidRange: TEST_UID_RANGE, warmPool: 0 });
    try {
      const sbx = await airlock.create({ executables: ['ls'] });
      const live = basename(sbx.spec.rootfs!.layers[0]!);
      const before = readdirSync(closures).filter((n) => n.startsWith('sha256:'));
      expect(before.length).toBeGreaterThanOrEqual(2);
      const p = await runCli(['image', 'prune', '--json']);
      expect(p.code).toBe(0);
      const r = JSON.parse(p.stdout) as { removedClosures: string[]; keptClosures: string[] };
      expect(r.keptClosures).toContain(live);
      expect(r.removedClosures).not.toContain(live);
      expect(readdirSync(closures).filter((n) => n.startsWith('sha256:'))).toEqual([live]);
      // The live sandbox still runs on its root.
      expect((await sbx.exec(['ls', '/'])).exitCode).toBe(0);
      await sbx.kill();
      const again = JSON.parse((await runCli(['image', 'prune', '--json'])).stdout) as {
        removedClosures: string[];
      };
      expect(again.removedClosures).toEqual([live]);
      expect(existsSync(join(closures, live))).toBe(false);
    } finally {
      await airlock.close();
    }
    expect(await settledResidue()).toEqual(NO_RESIDUE);
  }, 120_000);
});
