// Small statistics helpers for benchmarks (never used by tests).
export function percentile(sorted: readonly number[], p: number): number {
  if (sorted.length === 0) return NaN;
  const i = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
  return sorted[i]!;
}

export interface Summary {
  readonly n: number;
  readonly p50: number;
  readonly p99: number;
  readonly mean: number;
  readonly min: number;
}

export function summarize(samples: readonly number[]): Summary {
  const s = [...samples].sort((a, b) => a - b);
  return {
    n: s.length,
    p50: percentile(s, 50),
    p99: percentile(s, 99),
    mean: s.reduce((a, b) => a + b, 0) / s.length,
    min: s[0] ?? NaN,
  };
}

export async function sample(n: number, f: () => Promise<void>, warmup = 10): Promise<number[]> {
  for (let i = 0; i < warmup; i++) await f();
  const out: number[] = [];
  for (let i = 0; i < n; i++) {
    const t0 = performance.now();
    await f();
    out.push(performance.now() - t0);
  }
  return out;
}

export function fmt(ms: number): string {
  return `${ms.toFixed(2)} ms`;
}
