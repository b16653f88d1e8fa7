// A process that exits without `airlock.close()` leaves nothing on the host, without any later
// Airlock start reaping it: warm slots and live sandboxes are released synchronously at exit, for
// every way a Node process ends short of SIGKILL.
import { spawn } from 'node:child_process';
import { readFileSync, readdirSync } from 'node:fs';
import { describe, expect, it, onTestFinished } from 'vitest';
import {
  NO_RESIDUE,
  SKIP_REASON,
  TEST_STATE_DIR,
  TEST_UID_RANGE,
  canRunGvisor,
  canRunNamespaces,
  GVISOR_SKIP_REASON,
  settledResidue,
  testAirlock,
} from '../helpers.js';

interface Ended {
  pid: number;
  code: number | null;
  signal: NodeJS.Signals | null;
  stderr: string;
}

/** Run the fixture until it is ready, then (for `signal`) send `sig`; resolves when it has exited. */
async function runFixture(
  kind: string,
  sig?: NodeJS.Signals,
  variant = '',
  backend = 'namespaces',
): Promise<Ended> {
  const child = spawn(
    process.execPath,
    ['--import', 'tsx', 'test/fixtures/exit-without-close.ts', kind, variant],
    {
      env: {
        ...process.env,
        AIRLOCK_STATE_DIR: TEST_STATE_DIR,
        AIRLOCK_UID_FIRST: String(TEST_UID_RANGE.first),
        AIRLOCK_UID_COUNT: String(TEST_UID_RANGE.count),
        AIRLOCK_TEST_BACKEND: backend,
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    },
  );
  onTestFinished(() => void child.kill('SIGKILL'));
  let stderr = '';
  child.stderr.setEncoding('utf8').on('data', (t: string) => (stderr += t));
  const exited = new Promise<Ended>((r) =>
    child.once('exit', (code, signal) => r({ pid: child.pid!, code, signal, stderr })),
  );
  await new Promise<void>((resolve, reject) => {
    child.stdout.on('data', (d: Buffer) => d.toString().includes('ready') && resolve());
    void exited.then((e) =>
      kind === 'signal' ? reject(new Error(`fixture exited early: ${e.stderr}`)) : resolve(),
    );
  });
  if (sig) child.kill(sig);
  return exited;
}

/** Mounts of the test state dir's sandboxes in the host's (pid 1's) mount namespace too. */
function hostMounts(): string[] {
  return readFileSync('/proc/1/mountinfo', 'utf8')
    .split('\n')
    .map((l) => l.split(' ')[4] ?? '')
    .filter((m) => m.startsWith(`${TEST_STATE_DIR}/sandboxes/`));
}

describe.skipIf(!canRunNamespaces)(`exit without close() (${SKIP_REASON})`, () => {
  const cases: Array<[string, string, NodeJS.Signals | undefined, Partial<Ended>]> = [
    ['process.exit()', 'exit', undefined, { code: 3, signal: null }],
    ['an uncaught exception', 'throw', undefined, { code: 1, signal: null }],
    ['an unhandled rejection', 'reject', undefined, { code: 1, signal: null }],
    ['the natural end of the script', 'natural', undefined, { code: 0, signal: null }],
    ['SIGTERM', 'signal', 'SIGTERM', { code: null, signal: 'SIGTERM' }],
    ['SIGINT', 'signal', 'SIGINT', { code: null, signal: 'SIGINT' }],
    ['SIGHUP', 'signal', 'SIGHUP', { code: null, signal: 'SIGHUP' }],
  ];
  for (const [name, kind, sig, want] of cases) {
    it(`${name}: warm slots and live sandboxes are released, the exit status is kept`, async () => {
      const before = new Set(readdirSync(`${TEST_STATE_DIR}/sandboxes`));
      const ended = await runFixture(kind, sig);
      expect({ code: ended.code, signal: ended.signal }).toEqual(want);
      // No reapOrphans(): nothing may be left for a later Airlock start.
      const r = await settledResidue();
      expect({ ...r, sandboxDirs: r.sandboxDirs.filter((d) => !before.has(d)) }).toEqual(NO_RESIDUE);
      expect(hostMounts()).toEqual([]);
    }, 60_000);
  }

  it('process.exit() at any point of a burst of creates and execs: nothing is left, no lease half-written', async () => {
    // Different delays land the exit in different steps (uid lease, dirs, mounts, netns, cgroup, exec).
    for (const delayMs of [0, 5, 15, 30, 60, 120]) {
      const ended = await runFixture(`mid-create:${delayMs}`);
      expect(ended.code, ended.stderr).toBe(4);
      const r = await settledResidue();
      expect({ ...r, leases: [] }, `exit after ${delayMs} ms`).toEqual(NO_RESIDUE);
      // A lease file operation still on the thread pool when the process exits (a lease dir not on
      // a tmpfs) may land after the sweep: whole (never empty), naming the dead owner, so the next
      // start reaps it. Nothing else may be left.
      for (const uid of r.leases) {
        const lease = JSON.parse(readFileSync(`/run/airlock/uid-leases/${uid}`, 'utf8')) as { pid: number };
        expect(lease.pid).toBe(ended.pid);
      }
    }
    await testAirlock().reapOrphans();
    expect(await settledResidue()).toEqual(NO_RESIDUE);
    expect(readdirSync('/run/airlock/uid-leases').filter((n) => n.startsWith('.lease.'))).toEqual([]);
  }, 120_000);

  it('the default runtime of Sandbox.create (a short script): nothing is left either', async () => {
    const ended = await runFixture('natural', undefined, 'default');
    expect(ended.code).toBe(0);
    const r = await settledResidue();
    expect(r.mounts).toEqual([]);
    expect(r.cgroups).toEqual([]);
    expect(r.sandboxDirs).toEqual([]);
    expect(hostMounts()).toEqual([]);
  }, 60_000);
});

describe.skipIf(!canRunGvisor)(`exit without close() on the gVisor tier (${GVISOR_SKIP_REASON})`, () => {
  for (const [kind, sig] of [
    ['exit', undefined],
    ['signal', 'SIGTERM'],
  ] as const) {
    it(`${sig ?? kind}: runsc sandboxes and warm slots are released`, async () => {
      const before = new Set(readdirSync(`${TEST_STATE_DIR}/sandboxes`));
      await runFixture(kind, sig, '', 'gvisor');
      const r = await settledResidue();
      expect({ ...r, sandboxDirs: r.sandboxDirs.filter((d) => !before.has(d)) }).toEqual(NO_RESIDUE);
      expect(hostMounts()).toEqual([]);
    }, 60_000);
  }
});
