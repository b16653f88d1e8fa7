// Human units for sizes and durations ("256m", "30s"), parsed strictly: a typo is an error, not a zero.
import { AirlockError } from './errors.js';

const SIZE_UNITS: Record<string, number> = {
  '': 1,
  b: 1,
  k: 1024,
  kb: 1024,
  kib: 1024,
  m: 1024 ** 2,
  mb: 1024 ** 2,
  mib: 1024 ** 2,
  g: 1024 ** 3,
  gb: 1024 ** 3,
  gib: 1024 ** 3,
  t: 1024 ** 4,
  tb: 1024 ** 4,
  tib: 1024 ** 4,
};

const TIME_UNITS: Record<string, number> = { ms: 1, s: 1000, m: 60_000, h: 3_600_000 };

/** A size with a unit (`256m`, `1g`) as bytes; throws `AirlockError` on a bad value. */
export function parseBytes(text: string, field = 'size'): number {
  const m = /^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$/i.exec(text);
  const mult = m ? SIZE_UNITS[m[2]!.toLowerCase()] : undefined;
  if (!m || mult === undefined) {
    throw new AirlockError('INVALID_ARGUMENT', `${field}: "${text}" is not a size; use e.g. 512k, 256m, 2g`, {
      field,
    });
  }
  return Math.floor(Number(m[1]) * mult);
}

/**
 * "500ms", "30s", "2m", "1h" → milliseconds. The unit is required: a bare number ("30") is refused,
 * since it reads as seconds to some and as milliseconds to others.
 */
export function parseDurationMs(text: string, field = 'duration'): number {
  const m = /^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$/i.exec(text);
  if (!m) {
    throw new AirlockError(
      'INVALID_ARGUMENT',
      `${field}: "${text}" is not a duration; use e.g. 500ms, 30s, 2m, 1h`,
      { field },
    );
  }
  if (m[2] === undefined) {
    throw new AirlockError(
      'INVALID_ARGUMENT',
      `${field}: "${text}" has no unit; write ${m[1]}s or ${Number(m[1]) * 1000}ms (units: ms, s, m, h)`,
      { field },
    );
  }
  return Math.floor(Number(m[1]) * TIME_UNITS[m[2].toLowerCase()]!);
}

/** Bytes as a short human-readable size, e.g. `256 MiB`. */
export function formatBytes(n: number): string {
  if (n < 1024) return `${n} B`;
  const units = ['KiB', 'MiB', 'GiB', 'TiB'];
  let v = n / 1024;
  let i = 0;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return `${v.toFixed(v < 10 ? 1 : 0)} ${units[i]}`;
}

/**
 * A monotonic clock in milliseconds, for durations: performance.now() without `performance`, whose
 * first use loads perf_hooks (nine of Node's internal modules), start-up work for every one-shot
 * `airlock run` (issue 31).
 */
export function monotonicMs(): number {
  const [s, ns] = process.hrtime();
  return s * 1000 + ns / 1e6;
}
