// No sandbox process is left as a zombie for the host's init: Airlock is a child subreaper and
// reaps the orphans it adopts, also as PID 1 of a container's pid namespace, without stealing the
// exit status of any child that libuv (child_process) or spawnDirect waits for.
import { spawn } from 'node:child_process';
import { describe, expect, it, onTestFinished } from 'vitest';
import {
  GVISOR_SKIP_REASON,
  SKIP_REASON,
  TEST_STATE_DIR,
  TEST_UID_RANGE,
  canRunGvisor,
  canRunNamespaces,
  residue,
} from '../helpers.js';

interface Report {
  pid: number;
  zombies: string[];
  codes: Record<string, unknown>;
  adoptedBy: number[];
}

/** Run test/fixtures/reaper.ts (as PID 1 of a new pid namespace with `pid1`); its JSON report. */
async function runReaperFixture(tiers: string, pid1: boolean): Promise<Report> {
  const node = [process.execPath, '--import', 'tsx', 'test/fixtures/reaper.ts', tiers];
  const [cmd, ...args] = pid1 ? ['unshare', '--pid', '--fork', '--mount-proc', ...node] : node;
  const child = spawn(cmd!, args, {
    env: {
      ...process.env,
      AIRLOCK_STATE_DIR: TEST_STATE_DIR,
      AIRLOCK_UID_FIRST: String(TEST_UID_RANGE.first),
      AIRLOCK_UID_COUNT: String(TEST_UID_RANGE.count),
    },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  onTestFinished(() => void child.kill('SIGKILL'));
  let out = '';
  let err = '';
  child.stdout.setEncoding('utf8').on('data', (t: string) => (out += t));
  child.stderr.setEncoding('utf8').on('data', (t: string) => (err += t));
  const code = await new Promise((r) => child.once('close', r));
  expect(code, err).toBe(0);
  return JSON.parse(out.trim().split('\n').at(-1)!) as Report;
}

const EXEC_CODES = (tier: string): Record<string, number> => ({
  [`${tier}-exit-0`]: 40,
  [`${tier}-exit-1`]: 41,
  [`${tier}-exit-2`]: 42,
});

describe.skipIf(!canRunNamespaces)(`zombies (${SKIP_REASON})`, () => {
  it('as PID 1 of a pid namespace: daemonizing sandboxes killed every way leave no zombie', async () => {
    const r = await runReaperFixture('namespaces', true);
    expect(r.pid).toBe(1);
    expect(r.zombies).toEqual([]);
    // Exit statuses are intact: execs (spawnDirect's pidfd waits) and child_process (libuv's).
    expect(r.codes).toEqual({ ...EXEC_CODES('namespaces'), childProcess: [3, 5, 7], early: 9 });
    expect(r.adoptedBy).toEqual([1, 1, 1]);
    expect(residue().processes).toEqual([]);
  }, 120_000);

  it('as a plain process: Airlock is a child subreaper, adopts the orphans and reaps them', async () => {
    const r = await runReaperFixture('namespaces', false);
    expect(r.pid).not.toBe(1);
    expect(r.zombies).toEqual([]);
    expect(r.codes).toEqual({ ...EXEC_CODES('namespaces'), childProcess: [3, 5, 7], early: 9 });
    // Orphans of its children went to Airlock (not to the host's init or another subreaper).
    expect(r.adoptedBy).toEqual([r.pid, r.pid, r.pid]);
  }, 120_000);
});

describe.skipIf(!canRunGvisor)(`zombies on the gVisor tier (${GVISOR_SKIP_REASON})`, () => {
  it('as PID 1: runsc, its gofer and sentry killed every way leave no zombie', async () => {
    const r = await runReaperFixture('gvisor', true);
    expect(r.zombies).toEqual([]);
    expect(r.codes).toEqual({ ...EXEC_CODES('gvisor'), childProcess: [3, 5, 7], early: 9 });
    expect(residue().processes).toEqual([]);
  }, 180_000);
});
