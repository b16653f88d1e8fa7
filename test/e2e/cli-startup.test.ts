// `airlock run` start-up (issue 31): what a one-shot skips to start faster must not drop a safety
// step. A one-shot reaps only the tier it uses before its create (not every tier's); the host reap
// is tier-agnostic (every sandbox dir, cgroup and lease on the state dir, whichever tier made it),
// so a crashed process's sandboxes of any tier are still gone once `airlock run` has made its own.
import { spawn } from 'node:child_process';
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it, onTestFinished } from 'vitest';
import {
  GVISOR_SKIP_REASON,
  NO_RESIDUE,
  SKIP_REASON,
  TEST_STATE_DIR,
  TEST_UID_RANGE,
  canRunGvisor,
  canRunNamespaces,
  residue,
  runCli,
  settledResidue,
} from '../helpers.js';
import { buildProgram } from '../../src/cli/main.js';
import type { Command } from 'commander';

/**
 * A process that made a sandbox (plus its warm one) with running processes on `backend`, then was
 * SIGKILLed: no Airlock code ran after it, so its host state is left for the next process to reap.
 */
async function crashedOwner(backend: 'namespaces' | 'gvisor'): Promise<void> {
  const child = spawn(process.execPath, ['--import', 'tsx', 'test/fixtures/orphan-parent.ts', '1'], {
    env: {
      ...process.env,
      AIRLOCK_TEST_BACKEND: backend,
      AIRLOCK_STATE_DIR: TEST_STATE_DIR,
      AIRLOCK_UID_FIRST: String(TEST_UID_RANGE.first),
      AIRLOCK_UID_COUNT: String(TEST_UID_RANGE.count),
    },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  onTestFinished(() => void child.kill('SIGKILL'));
  await new Promise<void>((resolve, reject) => {
    child.stdout.on('data', (d: Buffer) => d.toString().includes('ready') && resolve());
    child.on('exit', (c) => reject(new Error(`fixture exited early (${c})`)));
  });
  child.kill('SIGKILL');
  await new Promise((r) => child.once('exit', r));
  // Its sandboxed processes die with it (--die-with-parent / pdeathsig); its host state stays.
  for (let i = 0; i < 40 && residue().processes.length; i++) await sleep(50);
  const left = residue();
  expect(left.sandboxDirs.length).toBeGreaterThanOrEqual(2);
  expect(left.mounts.length).toBeGreaterThan(0);
}

describe.skipIf(!canRunNamespaces)(`airlock run: start-up skips no safety step (${SKIP_REASON})`, () => {
  it("reaps a crashed process's sandboxes before its own create (its tier only)", async () => {
    expect(await settledResidue()).toEqual(NO_RESIDUE);
    await crashedOwner('namespaces');
    const r = await runCli(['run', '--', 'true']);
    expect(r.stderr).toBe('');
    expect(r.code).toBe(0);
    // Nothing of the crashed process's sandboxes, nor of the run's own, is left.
    expect(await settledResidue()).toEqual(NO_RESIDUE);
  }, 60_000);

  it.skipIf(!canRunGvisor)(
    `a namespaces one-shot still reaps a crashed gVisor sandbox (${GVISOR_SKIP_REASON})`,
    async () => {
      await crashedOwner('gvisor');
      const r = await runCli(['run', '--backend', 'namespaces', '--', 'true']);
      expect(r.code).toBe(0);
      expect(await settledResidue()).toEqual(NO_RESIDUE);
    },
    90_000,
  );
});

describe.skipIf(!canRunNamespaces)(`airlock run: phase timestamps (${SKIP_REASON})`, () => {
  it('AIRLOCK_CLI_PHASES=1 prints one line of phases in order, each at or after the one before', async () => {
    const r = await cliWithEnv(['run', '--', 'true'], { AIRLOCK_CLI_PHASES: '1' });
    expect(r.code).toBe(0);
    const m = /^airlock phases \(ms since the process started\): (.*)\n$/.exec(r.stderr);
    expect(m).not.toBeNull();
    const phases = m![1]!.split(', ').map((p) => /^(\S+) ([\d.]+) \(\+([\d.]+)\)$/.exec(p));
    expect(phases.map((p) => p?.[1])).toEqual(['program', 'modules', 'runtime', 'create', 'exec', 'kill']);
    const at = phases.map((p) => Number(p![2]));
    expect(at).toEqual([...at].sort((a, b) => a - b));
    // Without the variable nothing is printed (the first test's run has an empty stderr too).
    expect((await cliWithEnv(['run', '--', 'true'], {})).stderr).toBe('');
  }, 60_000);
});

/** runCli with extra environment variables (the CLI from source through tsx, on the test state dir). */
function cliWithEnv(
  args: readonly string[],
  env: NodeJS.ProcessEnv,
): Promise<{ code: number | null; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ['--import', 'tsx', 'src/cli/main.ts', ...args], {
      env: {
        ...process.env,
        AIRLOCK_STATE_DIR: TEST_STATE_DIR,
        AIRLOCK_UID_RANGE: `${TEST_UID_RANGE.first}:${TEST_UID_RANGE.count}`,
        AIRLOCK_CLI_PHASES: undefined,
        ...env,
      },
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    let stderr = '';
    child.stderr.setEncoding('utf8').on('data', (t: string) => (stderr += t));
    child.on('error', reject);
    child.on('close', (code) => resolve({ code, stderr }));
  });
}

describe('the one-shot program (main builds it for a command line starting with run or diff)', () => {
  /** Every option and the help text of `name`, as a user of that command sees them. */
  const view = (p: Command, name: string) => {
    const c = p.commands.find((x) => x.name() === name)!;
    let help = '';
    c.configureOutput({ writeOut: (s) => (help += s) });
    c.outputHelp();
    return { help, options: c.options.map((o) => [o.flags, o.description, o.defaultValue, o.argChoices]) };
  };

  it('holds run and diff exactly as the whole program has them, and nothing else', () => {
    const whole = buildProgram();
    const oneShot = buildProgram(undefined, undefined, true);
    expect(oneShot.commands.map((c) => c.name())).toEqual(['run', 'diff']);
    for (const name of ['run', 'diff']) expect(view(oneShot, name)).toEqual(view(whole, name));
    expect(oneShot.version()).toBe(whole.version());
  });
});
