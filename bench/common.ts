// What every benchmark shares: the state dir and uid range of bench sandboxes (apart from the tests'
// and from any real Airlock on the host), the run's mode, and small process helpers.
import { fileURLToPath } from 'node:url';
import { spawn } from 'node:child_process';
import { readFileSync, readdirSync } from 'node:fs';
import { reaped, spawnDirect } from '../src/backends/host/spawn.privileged.js';
import type { UidRange } from '../src/backends/host/state.js';

/**
 * State dir of bench sandboxes (the tests use their own; a real Airlock uses /var/lib/airlock).
 * AIRLOCK_BENCH_STATE_DIR / AIRLOCK_BENCH_UID_FIRST let two bench runs share a host without sharing state.
 */
export const BENCH_STATE_DIR = process.env.AIRLOCK_BENCH_STATE_DIR ?? '/var/tmp/airlock-bench';
/**
 * Host uids of bench sandboxes: one per live sandbox, so the density run (1,000 live) needs ≥ 1,000.
 * The tests use 3_900_000 + 4096; the egress and MCP benches keep their own ranges.
 */
export const BENCH_UID_RANGE: UidRange = {
  first: Number(process.env.AIRLOCK_BENCH_UID_FIRST ?? 3_960_000),
  count: 4096,
};
/** Uids for raw bwrap baselines (outside the range, so the reaper never sees them). */
export const RAW_UID = BENCH_UID_RANGE.first - 1;
export const RAW_SAME_LAYOUT_UID = BENCH_UID_RANGE.first - 2;
/** The uid of the CLI floor's sandbox (bench/cli-floor.privileged.cjs), outside the range as well. */
export const FLOOR_UID = BENCH_UID_RANGE.first - 3;
/** The uid bench/microvm-jail.ts runs a raw QEMU as (its `uid` piece), outside the range as well. */
export const JAIL_BENCH_UID = BENCH_UID_RANGE.first - 4;

export type Log = (s: string) => void;

export interface BenchContext {
  readonly quick: boolean;
  readonly log: Log;
}

/** Run a command to completion (stdout/stderr ignored); rejects on a non-zero exit. */
export function runQuiet(
  cmd: string,
  args: readonly string[],
  opts: { env?: NodeJS.ProcessEnv } = {},
): Promise<void> {
  return new Promise((resolve, reject) => {
    const c = spawn(cmd, args, { env: opts.env ?? {}, stdio: ['ignore', 'ignore', 'pipe'] });
    let err = '';
    c.stderr.setEncoding('utf8').on('data', (t: string) => (err = (err + t).slice(-2000)));
    c.on('error', reject);
    c.on('close', (code) =>
      code === 0 ? resolve() : reject(new Error(`${cmd} exited ${code}: ${err.trim()}`)),
    );
  });
}

/** Run a command and return its stdout; rejects on a non-zero exit. */
export function runOut(
  cmd: string,
  args: readonly string[],
  env: NodeJS.ProcessEnv = process.env,
): Promise<string> {
  return new Promise((resolve, reject) => {
    const c = spawn(cmd, args, { env, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    c.stdout.setEncoding('utf8').on('data', (t: string) => (out += t));
    c.stderr.setEncoding('utf8').on('data', (t: string) => (err = (err + t).slice(-2000)));
    c.on('error', reject);
    c.on('close', (code) =>
      code === 0 ? resolve(out) : reject(new Error(`${cmd} exited ${code}: ${err.trim()}`)),
    );
  });
}

/** MemAvailable from /proc/meminfo, bytes. */
export function memAvailableBytes(): number {
  const m = /^MemAvailable:\s+(\d+) kB$/m.exec(readFileSync('/proc/meminfo', 'utf8'));
  return Number(m?.[1] ?? NaN) * 1024;
}

/** Pss of one process from /proc/<pid>/smaps_rollup, bytes (0 if it is gone). */
export function pssBytes(pid: number): number {
  try {
    const m = /^Pss:\s+(\d+) kB$/m.exec(readFileSync(`/proc/${pid}/smaps_rollup`, 'utf8'));
    return Number(m?.[1] ?? 0) * 1024;
  } catch {
    return 0;
  }
}

/** Pids of every process whose real uid is in [first, first + count). */
export function pidsOfUids(first: number, count: number): number[] {
  const out: number[] = [];
  for (const p of readdirSync('/proc')) {
    if (!/^\d+$/.test(p)) continue;
    try {
      const uid = Number(/^Uid:\s+(\d+)/m.exec(readFileSync(`/proc/${p}/status`, 'utf8'))?.[1]);
      if (uid >= first && uid < first + count) out.push(Number(p));
    } catch {
      /* exited */
    }
  }
  return out;
}

export const sleepMs = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/**
 * Run a command to completion the way Airlock starts bwrap (posix_spawn: this Node process is not
 * forked), so a baseline pays the same process-creation cost as Airlock. `uid` runs it as that uid
 * and gid with no groups; `seccomp` is fed on fd 3. Rejects on a non-zero exit.
 */
export async function runDirect(
  cmd: string,
  args: readonly string[],
  opts: { uid?: number; seccomp?: Buffer } = {},
): Promise<void> {
  const child = spawnDirect(
    cmd,
    [cmd, ...args],
    [],
    opts.seccomp ? ['null', 'write', 'write', 'feed'] : ['null', 'write', 'write'],
    opts.uid !== undefined ? { uid: opts.uid, gid: opts.uid } : undefined,
  );
  if (opts.seccomp) child.feed(3, opts.seccomp);
  let err = '';
  const out = child.pipes[1]!;
  const errPipe = child.pipes[2]!;
  out.resume();
  errPipe.setEncoding('utf8').on('data', (t: string) => (err = (err + t).slice(-2000)));
  await Promise.all([out, errPipe].map((s) => new Promise((r) => s.once('close', r))));
  const x = await reaped(child);
  if (x.exitCode !== 0) throw new Error(`${cmd} exited ${x.exitCode ?? x.signal}: ${err.trim()}`);
}

/** The built CLI, as the package ships it (bin/airlock.cjs running dist/bin/airlock-run.cjs for run, dist/bin/airlock.cjs otherwise: plain Node, no TypeScript loader). */
export const BUILT_CLI = fileURLToPath(new URL('../bin/airlock.cjs', import.meta.url));
let cliBuild: Promise<void> | undefined;

/** Builds dist (npm run build) once per bench run, so the CLI rows measure the current source. */
export function buildCli(): Promise<void> {
  cliBuild ??= runQuiet(
    process.execPath,
    ['--import', 'tsx', fileURLToPath(new URL('../scripts/build.ts', import.meta.url))],
    {
      env: process.env,
    },
  );
  return cliBuild;
}

/** The environment the CLI rows run `airlock` in: the bench state dir and uid range, nothing else. */
export function cliEnv(): NodeJS.ProcessEnv {
  return {
    PATH: '/usr/local/bin:/usr/bin:/bin',
    AIRLOCK_STATE_DIR: BENCH_STATE_DIR,
    AIRLOCK_UID_RANGE: `${BENCH_UID_RANGE.first}:${BENCH_UID_RANGE.count}`,
  };
}
