// runCode on the gVisor tier, briefly (its sandboxes are slower): the same kernels run under runsc.
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import type { Airlock, Sandbox } from '../../src/index.js';
import { GVISOR_SKIP_REASON, NO_RESIDUE, canRunGvisor, settledResidue, testAirlock } from '../helpers.js';

describe.skipIf(!canRunGvisor)(`runCode on gVisor (${GVISOR_SKIP_REASON})`, () => {
  let airlock: Airlock;
  let sbx: Sandbox;

  beforeAll(async () => {
    airlock = testAirlock();
    sbx = await airlock.create({ backend: 'gvisor' });
  });

  afterAll(async () => {
    await sbx?.kill();
    await airlock?.close();
    expect(await settledResidue()).toEqual(NO_RESIDUE);
  });

  test('a python context keeps state; javascript and bash run one-shot; a timeout restarts', async () => {
    const ctx = await sbx.createCodeContext({ language: 'python' });
    await sbx.runCode('n = 6', { context: ctx });
    expect((await sbx.runCode('print("p")\nn * 7', { context: ctx })).results[0]?.text).toBe('42');
    const js = await sbx.runCode('[1, 2].length', { language: 'javascript' });
    expect(js.results[0]?.json).toBeUndefined();
    expect(js.results[0]?.text).toBe('2');
    expect((await sbx.runCode('echo $((2 + 3))', { language: 'bash' })).stdout).toBe('5\n');
    const slow = await sbx.runCode('import time\ntime.sleep(600)', { context: ctx, timeoutMs: 1500 });
    expect(slow.error?.name).toBe('TimeoutError');
    expect((await sbx.runCode('n', { context: ctx })).error?.name).toBe('NameError');
  });
});
