// Hand-written SVG charts for the benchmark report (no chart dependency): latency distributions as
// horizontal box plots on a log axis, and line charts of a measure against the number of sandboxes.
import { percentile } from './stats.js';

const W = 760;
const FONT = 'font-family="sans-serif" font-size="12"';
const PALETTE = ['#1f77b4', '#d62728', '#2ca02c', '#9467bd', '#ff7f0e', '#8c564b', '#e377c2', '#17becf'];

const esc = (s: string): string =>
  s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;');

const num = (x: number): string =>
  Math.abs(x) >= 100 ? x.toFixed(0) : Math.abs(x) >= 10 ? x.toFixed(1) : x.toFixed(2);

export interface Distribution {
  readonly label: string;
  readonly samples: readonly number[];
  /** Baselines are drawn grey, tiers in colour. */
  readonly baseline?: boolean;
}

/** Log-scale ticks (1, 2, 5 × 10^k) covering [lo, hi]. */
function logTicks(lo: number, hi: number): number[] {
  const out: number[] = [];
  for (let e = Math.floor(Math.log10(lo)); e <= Math.ceil(Math.log10(hi)); e++)
    for (const m of [1, 2, 5]) {
      const v = m * 10 ** e;
      if (v >= lo && v <= hi) out.push(v);
    }
  return out;
}

/** Box plots (p1–p99 whiskers, p25–p75 box, p50 line) on a log axis, one row per distribution. */
export function boxPlotSvg(title: string, unit: string, rows: readonly Distribution[]): string {
  const data = rows.filter((r) => r.samples.length > 0);
  const labelW = 250;
  const rowH = 28;
  const top = 40;
  const h = top + rowH * data.length + 40;
  const all = data.flatMap((r) => r.samples).filter((x) => x > 0);
  const lo = 10 ** Math.floor(Math.log10(Math.min(...all)));
  const hi = 10 ** Math.ceil(Math.log10(Math.max(...all)));
  const x0 = labelW;
  const x1 = W - 20;
  const x = (v: number): number =>
    x0 + ((Math.log10(Math.max(v, lo)) - Math.log10(lo)) / (Math.log10(hi) - Math.log10(lo))) * (x1 - x0);
  const parts: string[] = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${h}" viewBox="0 0 ${W} ${h}" ${FONT}>`,
    `<rect width="100%" height="100%" fill="white"/>`,
    `<text x="${W / 2}" y="20" text-anchor="middle" font-size="14" font-weight="bold">${esc(title)}</text>`,
  ];
  for (const t of logTicks(lo, hi)) {
    parts.push(
      `<line x1="${x(t)}" y1="${top - 5}" x2="${x(t)}" y2="${h - 35}" stroke="#ddd"/>`,
      `<text x="${x(t)}" y="${h - 20}" text-anchor="middle">${num(t)}</text>`,
    );
  }
  parts.push(`<text x="${(x0 + x1) / 2}" y="${h - 5}" text-anchor="middle">${esc(unit)} (log scale)</text>`);
  let colour = 0;
  data.forEach((r, i) => {
    const s = [...r.samples].sort((a, b) => a - b);
    const [p1, p25, p50, p75, p99] = [1, 25, 50, 75, 99].map((p) => percentile(s, p)) as [
      number,
      number,
      number,
      number,
      number,
    ];
    const cy = top + i * rowH + rowH / 2;
    const c = r.baseline ? '#888' : PALETTE[colour++ % PALETTE.length]!;
    parts.push(
      `<text x="${labelW - 8}" y="${cy + 4}" text-anchor="end">${esc(r.label)}</text>`,
      `<line x1="${x(p1)}" y1="${cy}" x2="${x(p99)}" y2="${cy}" stroke="${c}"/>`,
      `<line x1="${x(p1)}" y1="${cy - 5}" x2="${x(p1)}" y2="${cy + 5}" stroke="${c}"/>`,
      `<line x1="${x(p99)}" y1="${cy - 5}" x2="${x(p99)}" y2="${cy + 5}" stroke="${c}"/>`,
      `<rect x="${x(p25)}" y="${cy - 9}" width="${Math.max(1, x(p75) - x(p25))}" height="18" fill="${c}" fill-opacity="0.25" stroke="${c}"/>`,
      `<line x1="${x(p50)}" y1="${cy - 9}" x2="${x(p50)}" y2="${cy + 9}" stroke="${c}" stroke-width="3"/>`,
      `<text x="${Math.min(x(p99) + 6, x1 - 40)}" y="${cy - 10}" font-size="10" fill="#444">p50 ${num(p50)}</text>`,
    );
  });
  parts.push('</svg>');
  return parts.join('\n');
}

export interface Series {
  readonly label: string;
  readonly points: ReadonlyArray<readonly [number, number]>;
  readonly dashed?: boolean;
}

/** A line chart with linear axes (x from 0). */
export function lineChartSvg(
  title: string,
  xLabel: string,
  yLabel: string,
  series: readonly Series[],
  logX = false,
): string {
  const data = series.filter((s) => s.points.length > 0);
  const h = 360;
  const left = 70;
  const right = W - 230;
  const top = 40;
  const bottom = h - 50;
  const xs = data.flatMap((s) => s.points.map((p) => p[0]));
  const ys = data.flatMap((s) => s.points.map((p) => p[1]));
  const xMin = logX ? Math.min(...xs) : 0;
  const xMax = Math.max(...xs, 1);
  const yMax = niceCeil(Math.max(...ys, 0) * 1.05 || 1);
  const yMin = Math.min(0, ...ys);
  const x = (v: number): number =>
    logX
      ? left +
        ((Math.log2(v) - Math.log2(xMin)) / Math.max(1e-9, Math.log2(xMax) - Math.log2(xMin))) *
          (right - left)
      : left + ((v - xMin) / (xMax - xMin)) * (right - left);
  const y = (v: number): number => bottom - ((v - yMin) / (yMax - yMin)) * (bottom - top);
  const parts: string[] = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${h}" viewBox="0 0 ${W} ${h}" ${FONT}>`,
    `<rect width="100%" height="100%" fill="white"/>`,
    `<text x="${W / 2}" y="20" text-anchor="middle" font-size="14" font-weight="bold">${esc(title)}</text>`,
    `<line x1="${left}" y1="${bottom}" x2="${right}" y2="${bottom}" stroke="#000"/>`,
    `<line x1="${left}" y1="${top}" x2="${left}" y2="${bottom}" stroke="#000"/>`,
  ];
  for (let k = 0; k <= 5; k++) {
    const v = yMin + ((yMax - yMin) * k) / 5;
    parts.push(
      `<line x1="${left}" y1="${y(v)}" x2="${right}" y2="${y(v)}" stroke="#eee"/>`,
      `<text x="${left - 6}" y="${y(v) + 4}" text-anchor="end">${num(v)}</text>`,
    );
  }
  const xTicks = logX
    ? [...new Set(xs)].sort((a, b) => a - b)
    : Array.from({ length: 6 }, (_, k) => (xMax * k) / 5);
  for (const v of xTicks)
    parts.push(`<text x="${x(v)}" y="${bottom + 16}" text-anchor="middle">${num(v)}</text>`);
  parts.push(
    `<text x="${(left + right) / 2}" y="${h - 10}" text-anchor="middle">${esc(xLabel)}</text>`,
    `<text x="16" y="${(top + bottom) / 2}" text-anchor="middle" transform="rotate(-90 16 ${(top + bottom) / 2})">${esc(yLabel)}</text>`,
  );
  data.forEach((s, i) => {
    const c = PALETTE[i % PALETTE.length]!;
    const d = s.points.map((p, k) => `${k ? 'L' : 'M'}${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(' ');
    parts.push(
      `<path d="${d}" fill="none" stroke="${c}" stroke-width="2"${s.dashed ? ' stroke-dasharray="6 4"' : ''}/>`,
      ...s.points.map(
        (p) => `<circle cx="${x(p[0]).toFixed(1)}" cy="${y(p[1]).toFixed(1)}" r="3" fill="${c}"/>`,
      ),
      `<line x1="${right + 15}" y1="${top + 10 + i * 20}" x2="${right + 40}" y2="${top + 10 + i * 20}" stroke="${c}" stroke-width="2"${s.dashed ? ' stroke-dasharray="6 4"' : ''}/>`,
      `<text x="${right + 45}" y="${top + 14 + i * 20}">${esc(s.label)}</text>`,
    );
  });
  parts.push('</svg>');
  return parts.join('\n');
}

function niceCeil(v: number): number {
  const e = 10 ** Math.floor(Math.log10(v));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * e >= v) return m * e;
  return 10 * e;
}
