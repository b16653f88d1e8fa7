// P4: sustained throughput of one-shot sandboxes (create → exec `true` → kill) at several
// concurrencies, beside raw bwrap (the minimal flags + seccomp) at the same concurrencies in
// the same run. The best rate and the concurrency that gives it are the result; target ≥ 150/s.
import { Airlock, Sandbox } from '../src/index.js';
import { buildSeccompFilter } from '../src/backends/host/seccomp.privileged.js';
import { BENCH_STATE_DIR, BENCH_UID_RANGE, type BenchContext } from './common.js';
import { rawBwrapOnce } from './lifecycle.js';

export interface RatePoint {
  readonly concurrency: number;
  readonly completed: number;
  readonly seconds: number;
  readonly perS: number;
}

export interface ThroughputReport {
  readonly durationMs: number;
  readonly airlock: RatePoint[];
  readonly rawBwrap: RatePoint[];
  readonly best: RatePoint;
  readonly bestRaw: RatePoint;
}

/** Keep `concurrency` loops of `once` going for `durationMs`; completions per second. */
async function rate(concurrency: number, durationMs: number, once: () => Promise<void>): Promise<RatePoint> {
  for (let i = 0; i < concurrency; i++) await once(); // warm-up
  let completed = 0;
  const start = performance.now();
  const deadline = start + durationMs;
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (performance.now() < deadline) {
        await once();
        completed++;
      }
    }),
  );
  const seconds = (performance.now() - start) / 1000;
  return { concurrency, completed, seconds, perS: completed / seconds };
}

export async function throughputBench(ctx: BenchContext): Promise<ThroughputReport> {
  const levels = ctx.quick ? [1, 4, 16] : [1, 2, 4, 8, 16, 32];
  const durationMs = ctx.quick ? 1000 : 4000;
  const seccomp = buildSeccompFilter();
  const airlockPts: RatePoint[] = [];
  const rawPts: RatePoint[] = [];
  for (const c of levels) {
    // A warm pool as deep as the concurrency: every create finds prepared host state when it can.
    const airlock = new Airlock({ stateDir: BENCH_STATE_DIR, uidRange: BENCH_UID_RANGE, warmPool: c });
    try {
      await airlock.reapOrphans();
      const p = await rate(c, durationMs, async () => {
        const sbx = await Sandbox.create({}, { airlock });
        const r = await sbx.exec(['/usr/bin/true']);
        await sbx.kill();
        if (r.exitCode !== 0) throw new Error(`exec failed: ${r.stderr}`);
      });
      airlockPts.push(p);
    } finally {
      await airlock.close();
    }
    const q = await rate(c, durationMs, () => rawBwrapOnce(seccomp));
    rawPts.push(q);
    ctx.log(
      `P4: concurrency ${c}: airlock ${airlockPts.at(-1)!.perS.toFixed(0)}/s, raw bwrap ${q.perS.toFixed(0)}/s`,
    );
  }
  const best = airlockPts.reduce((a, b) => (b.perS > a.perS ? b : a));
  const bestRaw = rawPts.reduce((a, b) => (b.perS > a.perS ? b : a));
  return { durationMs, airlock: airlockPts, rawBwrap: rawPts, best, bestRaw };
}
