// `airlock run --image REF [--pull P] [-- CMD]`: the real CLI (no image store is wired in yet: a
// typed refusal), and the run flow in-process with the test resolver (with no CMD, the image's
// entrypoint + cmd run).
import { mkdtempSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { planRun } from '../../src/cli/flags.js';
import { runPlan } from '../../src/cli/run.js';
import {
  canRunNamespaces,
  NO_RESIDUE,
  runCli,
  settledResidue,
  SKIP_REASON,
  TEST_STATE_DIR,
  TEST_UID_RANGE,
} from '../helpers.js';
import { buildFixtures, type Fixtures } from './fixtures.js';

describe.skipIf(!canRunNamespaces)(`airlock run --image (${SKIP_REASON})`, () => {
  let fx: Fixtures;
  beforeAll(() => {
    fx = buildFixtures(mkdtempSync(join(`${TEST_STATE_DIR}-cli-fixtures-`)));
    process.env.AIRLOCK_STATE_DIR = TEST_STATE_DIR;
    process.env.AIRLOCK_UID_RANGE = `${TEST_UID_RANGE.first}:${TEST_UID_RANGE.count}`;
  }, 120_000);
  afterAll(() => {
    if (fx) rmSync(fx.root, { recursive: true, force: true });
  });

  const run = async (
    args: string[],
    flags: Record<string, unknown>,
  ): Promise<{ status: number; out: string; err: string }> => {
    let out = '';
    let err = '';
    const io = { out: (s: string) => void (out += s), err: (s: string) => void (err += s) };
    const status = await runPlan(planRun(args, { env: [], ...flags }, '/'), {}, io, {
      airlock: { images: fx.resolver },
      output: { onStdout: io.out, onStderr: io.err },
      after: () => {},
    });
    return { status, out, err };
  };

  it("with no CMD runs the image's entrypoint + cmd, on a shell-less image too", async () => {
    expect(await run([], { image: 'example.com/test/busybox:1' })).toMatchObject({
      status: 0,
      out: 'hello from the image\n',
    });
    expect(await run([], { image: 'example.com/test/python-only:3.11', pull: 'always' })).toMatchObject({
      status: 0,
      out: '42\n',
    });
    expect(fx.resolver.calls.at(-1)).toEqual({ ref: 'example.com/test/python-only:3.11', pull: 'always' });
    // A command given runs instead.
    expect(await run(['id', '-un'], { image: 'example.com/test/busybox:1' })).toMatchObject({ out: 'app\n' });
    // An image without entrypoint or cmd needs one.
    await expect(run([], { image: 'example.com/test/python:3.11' })).rejects.toMatchObject({
      code: 'INVALID_ARGUMENT',
      field: 'CMD',
    });
    expect(await settledResidue()).toEqual(NO_RESIDUE);
  });

  it('the CLI resolves --image in its image store (an uncached image with --pull never is not found), and --pull needs --image (exit 2)', async () => {
    const a = await runCli(['run', '--image', 'example.com/test/busybox:1', '--pull', 'never', '--', 'true']);
    expect(a.code).toBe(3);
    expect(a.stderr).toContain('is not in the local store');
    const b = await runCli(['run', '--pull', 'never', '--', 'true']);
    expect(b.code).toBe(2);
    expect(b.stderr).toContain('--pull needs --image');
    const c = await runCli(['run', '--image', 'example.com/x:1', '--pull', 'sometimes', '--', 'true']);
    expect(c.code).toBe(2);
  });
});
