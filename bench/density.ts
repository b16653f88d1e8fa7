// P5: density. N concurrent idle sandboxes, each with an egress bridge (a network policy) and one
// sleeping process, beside two floors started the same way in the same run: N plain `sleep`
// processes and N raw bwrap sandboxes (the minimal flags + seccomp) running `sleep`.
// Measured: the time to start all N; host memory per sandbox from MemAvailable deltas and from the PSS
// (/proc/<pid>/smaps_rollup) of every process that belongs to a sandbox (all run as its host uid; the
// egress bridge lives in Airlock's own process, whose PSS growth is counted too); memory at steps of
// the ramp (for the chart); p50 exec latency on one sandbox while all are live, against the same on a
// lone sandbox before the ramp. Target ≤ 2 MiB per sandbox, and no failure.
import { spawn, type ChildProcess } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { Airlock, type ExecHandle, type Sandbox } from '../src/index.js';
import { buildSeccompFilter } from '../src/backends/host/seccomp.privileged.js';
import {
  BENCH_STATE_DIR,
  BENCH_UID_RANGE,
  RAW_UID,
  memAvailableBytes,
  pidsOfUids,
  pssBytes,
  sleepMs,
  type BenchContext,
} from './common.js';
import { RAW_BWRAP } from './lifecycle.js';
import { summarize, type Summary } from './stats.js';

const MiB = 2 ** 20;
const START_CONCURRENCY = 8;
const SETTLE_MS = 1000;

export interface MemPoint {
  readonly live: number;
  /** Host MemAvailable drop since before the ramp, MiB. */
  readonly memAvailDeltaMiB: number;
  /** PSS of the sandboxes' processes (+ Airlock's own growth, for Airlock), MiB. */
  readonly pssMiB: number;
}

export interface Population {
  readonly label: string;
  readonly n: number;
  readonly started: number;
  readonly startSeconds: number;
  /** Per member, MiB: the MemAvailable drop after the ramp divided by N (includes one-time costs). */
  readonly memAvailPerMiB: number;
  /** Per member, MiB: the least-squares slope of the MemAvailable drop over the ramp (marginal cost). */
  readonly memAvailSlopeMiB: number;
  /** R² of that line: low when other work on the host moved MemAvailable during the ramp. */
  readonly memAvailFitR2: number;
  readonly pssPerMiB: number;
  readonly processes: number;
  readonly ramp: MemPoint[];
}

export interface DensityReport {
  readonly n: number;
  readonly plainSleep: Population;
  readonly rawBwrap: Population;
  readonly airlock: Population & {
    /** Airlock's own (this process's) PSS growth per sandbox, MiB: the egress bridge and bookkeeping. */
    readonly airlockSelfPerMiB: number;
    /** PSS of the sandboxes' own processes per sandbox, MiB. */
    readonly sandboxProcsPerMiB: number;
    readonly failures: number;
    readonly firstError?: string;
  };
  readonly execLone: Summary;
  readonly execWhileLive: Summary;
  readonly limits: Record<string, string>;
}

/** Least-squares slope of y over x, and how well a line fits (R², 1 = perfectly). */
export function fit(points: ReadonlyArray<readonly [number, number]>): { slope: number; r2: number } {
  const n = points.length;
  if (n < 2) return { slope: NaN, r2: NaN };
  const mx = points.reduce((a, p) => a + p[0], 0) / n;
  const my = points.reduce((a, p) => a + p[1], 0) / n;
  const sxy = points.reduce((a, p) => a + (p[0] - mx) * (p[1] - my), 0);
  const sxx = points.reduce((a, p) => a + (p[0] - mx) ** 2, 0);
  const syy = points.reduce((a, p) => a + (p[1] - my) ** 2, 0);
  return { slope: sxx ? sxy / sxx : NaN, r2: sxx && syy ? (sxy * sxy) / (sxx * syy) : NaN };
}

const rampFit = (r: readonly MemPoint[]): { slope: number; r2: number } =>
  fit(r.map((p) => [p.live, p.memAvailDeltaMiB] as const));

function steps(n: number): Set<number> {
  const s = new Set<number>();
  for (let k = 1; k <= 10; k++) s.add(Math.max(1, Math.round((n * k) / 10)));
  return s;
}

/** Start n members with `start(i)` (START_CONCURRENCY at a time), sampling memory at ramp steps. */
async function ramp(
  n: number,
  start: (i: number) => Promise<void>,
  pss: () => number,
  ctx: BenchContext,
  label: string,
): Promise<{ started: number; seconds: number; points: MemPoint[]; errors: string[] }> {
  const base = memAvailableBytes();
  const basePss = pss();
  const marks = steps(n);
  const points: MemPoint[] = [];
  const errors: string[] = [];
  let next = 0;
  let started = 0;
  const t0 = performance.now();
  let elapsed = 0;
  const worker = async (): Promise<void> => {
    while (next < n) {
      const i = next++;
      try {
        await start(i);
        started++;
      } catch (e) {
        errors.push((e as Error).message);
      }
      if (marks.has(i + 1)) {
        const at = performance.now();
        points.push({
          live: started,
          memAvailDeltaMiB: (base - memAvailableBytes()) / MiB,
          pssMiB: (pss() - basePss) / MiB,
        });
        elapsed -= performance.now() - at; // sampling is not start time
        if (i + 1 === n || (i + 1) % Math.max(1, Math.round(n / 4)) === 0)
          ctx.log(`P5: ${label}: ${started}/${n} live`);
      }
    }
  };
  await Promise.all(Array.from({ length: START_CONCURRENCY }, worker));
  elapsed += performance.now() - t0;
  points.sort((a, b) => a.live - b.live);
  return { started, seconds: elapsed / 1000, points, errors };
}

async function settledDelta(base: number): Promise<number> {
  await sleepMs(SETTLE_MS);
  return base - memAvailableBytes();
}

function waitSpawn(c: ChildProcess): Promise<void> {
  return new Promise((resolve, reject) => {
    c.once('spawn', () => resolve());
    c.once('error', reject);
  });
}

async function killAll(children: ChildProcess[]): Promise<void> {
  await Promise.all(
    children.map(
      (c) =>
        new Promise<void>((r) => {
          if (c.exitCode !== null || c.signalCode !== null) return r();
          c.once('exit', () => r());
          c.kill('SIGKILL');
        }),
    ),
  );
}

async function plainPopulation(n: number, ctx: BenchContext): Promise<Population> {
  const children: ChildProcess[] = [];
  const pss = (): number => children.reduce((a, c) => a + pssBytes(c.pid ?? 0), 0);
  const base = memAvailableBytes();
  try {
    const r = await ramp(
      n,
      async () => {
        const c = spawn('/usr/bin/sleep', ['3600'], { env: {}, stdio: 'ignore' });
        children.push(c);
        await waitSpawn(c);
      },
      pss,
      ctx,
      'plain sleep',
    );
    const delta = await settledDelta(base);
    return {
      label: 'plain `sleep` processes',
      n,
      started: r.started,
      startSeconds: r.seconds,
      memAvailPerMiB: delta / n / MiB,
      memAvailSlopeMiB: rampFit(r.points).slope,
      memAvailFitR2: rampFit(r.points).r2,
      pssPerMiB: pss() / n / MiB,
      processes: children.length,
      ramp: r.points,
    };
  } finally {
    await killAll(children);
  }
}

async function rawBwrapPopulation(n: number, ctx: BenchContext): Promise<Population> {
  const seccomp = buildSeccompFilter();
  const args = [...RAW_BWRAP.slice(0, -1), '/usr/bin/sleep', '3600'];
  const children: ChildProcess[] = [];
  const pss = (): number => pidsOfUids(RAW_UID, 1).reduce((a, p) => a + pssBytes(p), 0);
  const base = memAvailableBytes();
  try {
    const r = await ramp(
      n,
      async () => {
        const c = spawn('/usr/bin/bwrap', args, {
          env: {},
          stdio: ['ignore', 'ignore', 'ignore', 'pipe'],
          uid: RAW_UID,
          gid: RAW_UID,
        });
        children.push(c);
        (c.stdio[3] as NodeJS.WritableStream).end(seccomp);
        await waitSpawn(c);
      },
      pss,
      ctx,
      'raw bwrap',
    );
    await sleepMs(200); // let the last ones finish setting up their namespaces
    const delta = await settledDelta(base);
    return {
      label: 'raw bwrap running `sleep`',
      n,
      started: r.started,
      startSeconds: r.seconds,
      memAvailPerMiB: delta / n / MiB,
      memAvailSlopeMiB: rampFit(r.points).slope,
      memAvailFitR2: rampFit(r.points).r2,
      pssPerMiB: pss() / n / MiB,
      processes: pidsOfUids(RAW_UID, 1).length,
      ramp: r.points,
    };
  } finally {
    await killAll(children);
  }
}

async function execLatency(sbx: Sandbox, runs: number): Promise<Summary> {
  const out: number[] = [];
  for (let i = 0; i < runs + 5; i++) {
    const t0 = performance.now();
    const r = await sbx.exec(['/usr/bin/true']);
    if (r.exitCode !== 0) throw new Error(`exec failed: ${r.stderr}`);
    if (i >= 5) out.push(performance.now() - t0);
  }
  return summarize(out);
}

function readLimit(path: string): string {
  try {
    return readFileSync(path, 'utf8').trim();
  } catch {
    return '?';
  }
}

export async function densityBench(ctx: BenchContext): Promise<DensityReport> {
  const n = ctx.quick ? 50 : 1000;
  const execRuns = ctx.quick ? 30 : 100;
  if (n > BENCH_UID_RANGE.count)
    throw new Error(`uid range holds ${BENCH_UID_RANGE.count} sandboxes, need ${n}`);
  const limits = {
    'uid range': `${BENCH_UID_RANGE.count} uids from ${BENCH_UID_RANGE.first}`,
    'open files (this process)':
      readLimit('/proc/self/limits')
        .split('\n')
        .find((l) => l.startsWith('Max open files'))
        ?.replace(/\s+/g, ' ')
        .trim() ?? '?',
    'kernel.pid_max': readLimit('/proc/sys/kernel/pid_max'),
    'user.max_net_namespaces': readLimit('/proc/sys/user/max_net_namespaces'),
    'user.max_user_namespaces': readLimit('/proc/sys/user/max_user_namespaces'),
  };

  ctx.log(`P5: ${n} plain sleep processes`);
  const plainSleep = await plainPopulation(n, ctx);
  ctx.log(`P5: ${n} raw bwrap sandboxes running sleep`);
  const rawBwrap = await rawBwrapPopulation(n, ctx);

  ctx.log(`P5: ${n} Airlock sandboxes (egress bridge + a sleeping process each)`);
  const airlock = new Airlock({ stateDir: BENCH_STATE_DIR, uidRange: BENCH_UID_RANGE });
  await airlock.reapOrphans();
  const sandboxes: Sandbox[] = [];
  const handles: ExecHandle[] = [];
  const spec = { network: { allow: ['bench.invalid'] }, ttlMs: 1_800_000 };
  try {
    // A lone sandbox's exec latency first (the baseline), then it stays as member 0.
    const lone = await airlock.create(spec);
    const execLone = await execLatency(lone, execRuns);
    await lone.kill();
    const selfBase = pssBytes(process.pid);
    const sbxPss = (): number =>
      pidsOfUids(BENCH_UID_RANGE.first, BENCH_UID_RANGE.count).reduce((a, p) => a + pssBytes(p), 0);
    const pss = (): number => sbxPss() + pssBytes(process.pid);
    const base = memAvailableBytes();
    const r = await ramp(
      n,
      async () => {
        const sbx = await airlock.create(spec);
        sandboxes.push(sbx);
        handles.push(await sbx.exec(['/usr/bin/sleep', '3600'], { background: true }));
      },
      pss,
      ctx,
      'airlock',
    );
    const delta = await settledDelta(base);
    const procPss = sbxPss();
    const selfGrowth = Math.max(0, pssBytes(process.pid) - selfBase);
    ctx.log(`P5: exec latency on one sandbox while ${r.started} are live ×${execRuns}`);
    const execWhileLive = sandboxes[0] ? await execLatency(sandboxes[0], execRuns) : summarize([]);
    const live = Math.max(1, r.started);
    return {
      n,
      plainSleep,
      rawBwrap,
      airlock: {
        label: 'Airlock sandboxes (egress bridge + `sleep`)',
        n,
        started: r.started,
        startSeconds: r.seconds,
        memAvailPerMiB: delta / live / MiB,
        memAvailSlopeMiB: rampFit(r.points).slope,
        memAvailFitR2: rampFit(r.points).r2,
        pssPerMiB: (procPss + selfGrowth) / live / MiB,
        processes: pidsOfUids(BENCH_UID_RANGE.first, BENCH_UID_RANGE.count).length,
        ramp: r.points,
        airlockSelfPerMiB: selfGrowth / live / MiB,
        sandboxProcsPerMiB: procPss / live / MiB,
        failures: r.errors.length,
        ...(r.errors[0] ? { firstError: r.errors[0] } : {}),
      },
      execLone,
      execWhileLive,
      limits,
    };
  } finally {
    ctx.log(`P5: killing ${sandboxes.length} sandboxes`);
    await Promise.all(handles.map((h) => h.kill().catch(() => {})));
    await airlock.killAll();
    await airlock.close();
    // Killing everything at once must leave nothing mounted (a leak here once left 745 disks). The
    // state dir's own runtime tmpfs (sandboxes/) and /dev tree stay by design (see state.ts).
    const kept = new Set([`${BENCH_STATE_DIR}/sandboxes`, `${BENCH_STATE_DIR}/dev`]);
    const left = readFileSync('/proc/self/mountinfo', 'utf8')
      .split('\n')
      .map((l) => l.split(' ')[4] ?? '')
      .filter((m) => m.startsWith(`${BENCH_STATE_DIR}/`) && !kept.has(m)).length;
    ctx.log(
      `P5: after kill and close: ${left} mount(s) left under ${BENCH_STATE_DIR}${left ? ' — LEAK' : ''}`,
    );
  }
}
