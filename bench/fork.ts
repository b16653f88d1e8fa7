// Snapshot → fork on the namespaces tier: p50/p99 of `snap.fork()` (resolving to a sandbox that can
// exec) beside plain `Sandbox.create` measured in the same run, for a one-layer snapshot and for a
// fork of a fork of a fork (four layers); plus fork→exec→kill against create→exec→kill, and the
// snapshot itself (the sandbox frozen while ~1 MiB in 200 files is copied out). Target (issue 5):
// filesystem fork ≤ 15 ms.
import { Airlock, Sandbox, type Snapshot } from '../src/index.js';
import { BENCH_STATE_DIR, BENCH_UID_RANGE } from './common.js';
import { fmt, summarize, type Summary } from './stats.js';

export interface ForkReport {
  readonly create: Summary;
  readonly fork: Summary;
  readonly forkDeep: Summary;
  readonly createExecKill: Summary;
  readonly forkExecKill: Summary;
  readonly snapshot: Summary;
  readonly layerFiles: number;
  readonly layerBytes: number;
  /** Raw per-run samples (ms) for the distribution charts. */
  readonly samples: { readonly create: number[]; readonly fork: number[]; readonly forkDeep: number[] };
}

const WARMUP = 10;

/** Time `start` only; then check the sandbox runs a command and kill it (untimed). */
async function timeStart(runs: number, start: () => Promise<Sandbox>): Promise<number[]> {
  const out: number[] = [];
  for (let i = 0; i < WARMUP + runs; i++) {
    const t0 = performance.now();
    const sbx = await start();
    const ms = performance.now() - t0;
    const r = await sbx.exec(['/usr/bin/true']);
    if (r.exitCode !== 0) throw new Error(`exec failed in ${sbx.id}: ${r.stderr}`);
    await sbx.kill();
    if (i >= WARMUP) out.push(ms);
  }
  return out;
}

async function timeWhole(runs: number, start: () => Promise<Sandbox>): Promise<number[]> {
  const out: number[] = [];
  for (let i = 0; i < WARMUP + runs; i++) {
    const t0 = performance.now();
    const sbx = await start();
    const r = await sbx.exec(['/usr/bin/true']);
    await sbx.kill();
    if (i >= WARMUP) out.push(performance.now() - t0);
    if (r.exitCode !== 0) throw new Error(`exec failed: ${r.stderr}`);
  }
  return out;
}

export async function forkBench(opts: { runs: number; log: (s: string) => void }): Promise<ForkReport> {
  const { runs, log } = opts;
  const airlock = new Airlock({ stateDir: BENCH_STATE_DIR, uidRange: BENCH_UID_RANGE });
  await airlock.reapOrphans();
  const snaps: Snapshot[] = [];
  try {
    // A small project: 200 files of ~5 KiB in the workspace, a few in home.
    const parent = await Sandbox.create({}, { airlock });
    const setup = await parent.exec(
      'for d in 0 1 2 3 4 5 6 7 8 9; do mkdir -p /workspace/src/$d; for f in $(seq 1 20); do ' +
        'head -c 5000 /dev/urandom > /workspace/src/$d/$f.js; done; done; ' +
        'mkdir -p ~/.cache && echo "{}" > ~/.config.json && head -c 20000 /dev/urandom > ~/.cache/blob',
    );
    if (setup.exitCode !== 0) throw new Error(`setup failed: ${setup.stderr}`);
    log(`fork: snapshot ×${runs} (sandbox frozen while copying)`);
    const snapTimes: number[] = [];
    let snap: Snapshot | undefined;
    for (let i = 0; i < WARMUP + runs; i++) {
      await parent.exec(`echo ${i} > /workspace/run`); // a new layer each time (not the dedup path)
      const t0 = performance.now();
      const s = await parent.snapshot();
      if (i >= WARMUP) snapTimes.push(performance.now() - t0);
      if (snap) await snap.remove();
      snap = s;
    }
    snaps.push(snap!);
    // Three more layers on top: a fork of a fork of a fork.
    let deep = snap!;
    for (let i = 0; i < 3; i++) {
      const f = await deep.fork();
      await f.exec(`echo ${i} > /workspace/level-${i} && echo ${i} >> ~/.levels`);
      deep = await f.snapshot();
      snaps.push(deep);
      await f.kill();
    }
    log(`fork: Sandbox.create ×${runs}`);
    const create = await timeStart(runs, () => Sandbox.create({}, { airlock }));
    log(`fork: snap.fork() ×${runs}`);
    const fork = await timeStart(runs, () => snap!.fork());
    log(`fork: snap.fork() of a 4-layer chain ×${runs}`);
    const forkDeep = await timeStart(runs, () => deep.fork());
    log(`fork: create→exec→kill and fork→exec→kill ×${runs}`);
    const createExecKill = await timeWhole(runs, () => Sandbox.create({}, { airlock }));
    const forkExecKill = await timeWhole(runs, () => snap!.fork());
    await parent.kill();
    return {
      create: summarize(create),
      fork: summarize(fork),
      forkDeep: summarize(forkDeep),
      createExecKill: summarize(createExecKill),
      forkExecKill: summarize(forkExecKill),
      snapshot: summarize(snapTimes),
      layerFiles: snap!.entries,
      layerBytes: snap!.sizeBytes,
      samples: { create, fork, forkDeep },
    };
  } finally {
    await airlock.killAll();
    for (const s of snaps.reverse()) await s.remove().catch(() => {});
  }
}

export function formatFork(r: ForkReport): string {
  const row = (name: string, s: Summary): string =>
    `| ${name} | ${fmt(s.p50)} | ${fmt(s.p99)} | ${fmt(s.mean)} | ${(s.p50 / r.create.p50).toFixed(1)}× |`;
  const met = r.fork.p50 <= 15 && r.forkDeep.p50 <= 15;
  return [
    '| namespaces tier | p50 | p99 | mean | p50 vs create |',
    '|---|---|---|---|---|',
    row('Sandbox.create (warm pool)', r.create),
    row('snap.fork() (1 layer)', r.fork),
    row('snap.fork() (4-layer chain)', r.forkDeep),
    row('create→exec true→kill', r.createExecKill),
    row('fork→exec true→kill', r.forkExecKill),
    row(`sbx.snapshot() (${r.layerFiles} entries, ${(r.layerBytes / 1024).toFixed(0)} KiB)`, r.snapshot),
    '',
    `target: filesystem fork p50 ≤ 15 ms → ${met ? 'MET' : 'MISSED'} ` +
      `(${fmt(r.fork.p50)} one layer, ${fmt(r.forkDeep.p50)} four layers), n=${r.fork.n}`,
  ].join('\n');
}
