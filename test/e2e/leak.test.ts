// Leak tests: whatever happens, no process, mount, cgroup, sandbox dir or uid lease survives.
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, describe, expect, it, onTestFinished } from 'vitest';
import { Sandbox } from '../../src/index.js';
import {
  NO_RESIDUE,
  SKIP_REASON,
  GVISOR_SKIP_REASON,
  TEST_STATE_DIR,
  TEST_UID_RANGE,
  canRunGvisor,
  canRunNamespaces,
  residue,
  testAirlock,
  type Residue,
} from '../helpers.js';

async function settledResidue(): Promise<Residue> {
  let r = residue();
  for (let i = 0; i < 40 && JSON.stringify(r) !== JSON.stringify(NO_RESIDUE); i++) {
    await sleep(50);
    r = residue();
  }
  return r;
}

describe.skipIf(!canRunNamespaces)(`leaks (${SKIP_REASON})`, () => {
  const airlock = testAirlock();
  afterAll(() => airlock.killAll());

  it('200 create/exec/kill cycles leave nothing behind', async () => {
    await airlock.reapOrphans();
    for (let i = 0; i < 200; i++) {
      const sbx = await Sandbox.create(
        i % 2 ? { workspace: { mode: 'empty' } } : { workspace: { mode: 'ro', hostDir: '/usr/share/doc' } },
        { airlock },
      );
      // Alternate clean exits, failures, background processes and kills mid-exec.
      const bg = await sbx.exec('sleep 100', { background: true });
      const r = await sbx.exec(i % 3 === 0 ? 'exit 3' : 'echo ok', { timeoutMs: 10_000 });
      expect(r.exitCode).toBe(i % 3 === 0 ? 3 : 0);
      if (i % 5 === 0) await bg.kill();
      await sbx.kill();
    }
    await airlock.close(); // releases the prepared (warm) sandbox too
    expect(await settledResidue()).toEqual(NO_RESIDUE);
  }, 180_000);

  it('kill() resolves with nothing of the sandbox running; close() waits for the deferred host teardown', async () => {
    // A zombie runs nothing; bwrap's pid-1 can be one briefly (its monitor exits without reaping it
    // and the host's init reaps it), which residue() counts: look only at processes that are alive.
    const alive = (pids: number[]): number[] =>
      pids.filter((p) => {
        try {
          const stat = readFileSync(`/proc/${p}/stat`, 'utf8');
          return stat.slice(stat.lastIndexOf(')') + 2)[0] !== 'Z';
        } catch {
          return false; // gone
        }
      });
    for (let i = 0; i < 5; i++) {
      const sbx = await Sandbox.create(
        i % 2 ? {} : { workspace: { mode: 'cow', hostDir: '/usr/share/doc' } },
        { airlock },
      );
      await sbx.exec('sleep 100', { background: true });
      await sbx.exec('true');
      await sbx.kill();
      // No polling: every process is dead the moment kill() resolves.
      expect(alive(residue().processes)).toEqual([]);
    }
    // An exec still starting (its cgroup enrolment in flight) when kill() is called.
    for (let i = 0; i < 10; i++) {
      const sbx = await Sandbox.create({}, { airlock });
      const run = sbx.exec('sleep 100').catch(() => undefined);
      if (i % 2) await sleep(i); // at different points of the start
      await sbx.kill();
      expect(alive(residue().processes)).toEqual([]);
      await run;
    }
    await airlock.close();
    // No polling either: close() resolved only after every teardown finished.
    const r = residue();
    expect({ ...r, processes: alive(r.processes) }).toEqual(NO_RESIDUE);
  });

  it('a crashed exec (bwrap setup failure) leaves nothing behind', async () => {
    const sbx = await Sandbox.create({}, { airlock });
    const r = await sbx.exec('true', { cwd: '/does/not/exist' });
    expect(r.exitCode).not.toBe(0);
    expect(r.stderr).toMatch(/chdir/);
    expect((await sbx.exec('echo still usable')).stdout).toBe('still usable\n');
    await sbx.kill();
    await airlock.close();
    expect(await settledResidue()).toEqual(NO_RESIDUE);
  });

  it(
    'a SIGKILLed parent: its sandboxes die with it, the next start reaps the rest',
    () => sigkilledParent('namespaces'),
    60_000,
  );

  it(
    'Airlock killed at any point while starting processes: nothing keeps running once reaped',
    () => crashMidExec('namespaces'),
    120_000,
  );
});

describe.skipIf(!canRunGvisor)(`leaks on the gVisor tier (${GVISOR_SKIP_REASON})`, () => {
  const airlock = testAirlock();
  afterAll(() => airlock.killAll());

  it('50 create/exec/kill cycles leave nothing behind', async () => {
    for (let i = 0; i < 50; i++) {
      const sbx = await Sandbox.create({ backend: 'gvisor' }, { airlock });
      const r = await sbx.exec(['/bin/sh', '-c', 'echo $0', String(i)]);
      expect(r.stdout).toBe(`${i}\n`);
      await sbx.kill();
    }
    await airlock.close();
    expect(await settledResidue()).toEqual(NO_RESIDUE);
  }, 120_000);

  it(
    'a SIGKILLed parent: its sandboxes (runsc, gofer, sentry) die with it, the next start reaps the rest',
    () => sigkilledParent('gvisor'),
    60_000,
  );

  it(
    'Airlock killed at any point while starting runsc: nothing keeps running once reaped',
    () => crashMidExec('gvisor'),
    120_000,
  );
});

async function sigkilledParent(backend: 'namespaces' | 'gvisor'): Promise<void> {
  const dirsBefore = new Set(residue().sandboxDirs);
  const child = spawn(process.execPath, ['--import', 'tsx', 'test/fixtures/orphan-parent.ts', '3'], {
    env: {
      ...process.env,
      AIRLOCK_TEST_BACKEND: backend,
      AIRLOCK_STATE_DIR: TEST_STATE_DIR,
      AIRLOCK_UID_FIRST: String(TEST_UID_RANGE.first),
      AIRLOCK_UID_COUNT: String(TEST_UID_RANGE.count),
    },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  await new Promise<void>((resolve, reject) => {
    child.stdout.on('data', (d: Buffer) => d.toString().includes('ready') && resolve());
    child.on('exit', (c) => reject(new Error(`fixture exited early (${c})`)));
  });
  // Whatever an assertion below does, the fixture must not outlive the test.
  onTestFinished(() => void child.kill('SIGKILL'));
  const before = residue();
  // Three sandboxes plus the one the fixture's warm pool prepared: all are the dead owner's to reap.
  expect(before.sandboxDirs.filter((d) => !dirsBefore.has(d))).toHaveLength(4);
  expect(before.processes.length).toBeGreaterThanOrEqual(3);

  child.kill('SIGKILL');
  await new Promise((r) => child.once('exit', r));

  // bwrap --die-with-parent / runsc's pdeathsig: every sandboxed process is gone without any
  // Airlock code running.
  let procs = residue().processes;
  for (let i = 0; i < 40 && procs.length; i++) {
    await sleep(50);
    procs = residue().processes;
  }
  expect(procs).toEqual([]);
  // Host state is still there until a new Airlock process starts...
  expect(residue().mounts.length).toBeGreaterThan(0);
  // ...whose reaper removes it: a fresh runtime, as a restarted service would have.
  await testAirlock().reapOrphans();
  expect(await settledResidue()).toEqual(NO_RESIDUE);
}

async function crashMidExec(backend: 'namespaces' | 'gvisor'): Promise<void> {
  const env = {
    ...process.env,
    AIRLOCK_TEST_BACKEND: backend,
    AIRLOCK_STATE_DIR: TEST_STATE_DIR,
    AIRLOCK_UID_FIRST: String(TEST_UID_RANGE.first),
    AIRLOCK_UID_COUNT: String(TEST_UID_RANGE.count),
  };
  // Different delays land the SIGKILL in different steps of process start-up.
  for (const delayMs of [30, 45, 60, 80, 110]) {
    const child = spawn(
      process.execPath,
      ['--import', 'tsx', 'test/fixtures/crash-mid-exec.ts', String(delayMs)],
      {
        env,
        stdio: 'ignore',
      },
    );
    onTestFinished(() => void child.kill('SIGKILL'));
    await new Promise((r) => child.once('exit', r));
  }
  await testAirlock().reapOrphans();
  // Zombies (already dead, waiting for the host's init to reap them) are not running code.
  const running = (): number[] =>
    residue().processes.filter((pid) => {
      try {
        return !/^State:\s+Z/m.test(readFileSync(`/proc/${pid}/status`, 'utf8'));
      } catch {
        return false;
      }
    });
  let left = running();
  for (let i = 0; i < 40 && left.length; i++) {
    await sleep(50);
    left = running();
  }
  expect(left).toEqual([]);
  expect(await settledResidue()).toEqual(NO_RESIDUE);
}
