// The benchmark report: every measure as rows of (absolute value, ratio to a baseline measured in the
// same run, target, whether it holds), rendered as Markdown with linked SVG charts.
import { execFileSync } from 'node:child_process';
import { existsSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { cpus, loadavg, release, totalmem } from 'node:os';
import { dirname, join, relative } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

export type Verdict = 'PASS' | 'MISS' | '';

export interface Row {
  readonly measure: string;
  /** Absolute value, with its unit. */
  readonly value: string;
  /** "1.23× raw bwrap (4.56 ms)": the ratio and the baseline's own absolute value. */
  readonly ratio: string;
  readonly target: string;
  readonly verdict: Verdict;
}

export interface Chart {
  readonly file: string;
  readonly title: string;
  readonly svg: string;
}

export interface Section {
  readonly id: string;
  readonly title: string;
  readonly intro?: string;
  readonly rows: Row[];
  readonly notes?: string[];
  readonly charts?: Chart[];
  /** The bench's own detailed tables, shown folded. */
  readonly detail?: string;
}

export const verdict = (ok: boolean): Verdict => (ok ? 'PASS' : 'MISS');
export const ms = (x: number): string => (Number.isFinite(x) ? `${x.toFixed(x < 10 ? 2 : 1)} ms` : '—');
export const mib = (x: number): string => (Number.isFinite(x) ? `${x.toFixed(2)} MiB` : '—');
export const ratioTo = (x: number, base: number, name: string, baseText: string): string =>
  Number.isFinite(x / base) ? `${(x / base).toFixed(2)}× ${name} (${baseText})` : '—';

export function row(measure: string, value: string, ratio: string, target = '', v: Verdict = ''): Row {
  return { measure, value, ratio, target, verdict: v };
}

/** A row for something that was not measured, with the reason. */
export function notMeasured(measure: string, reason: string, target = ''): Row {
  return { measure, value: `not measured (${reason})`, ratio: '—', target, verdict: '' };
}

function tryRun(cmd: string, args: string[]): string {
  try {
    return execFileSync(cmd, args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'], timeout: 10_000 })
      .split('\n')[0]!
      .trim();
  } catch {
    return 'not installed';
  }
}

export interface MachineFacts {
  readonly cores: number;
  readonly cpu: string;
  readonly memoryGiB: number;
  readonly kernel: string;
  readonly os: string;
  readonly node: string;
  readonly bwrap: string;
  readonly runsc: string;
  readonly loadAtStart: string;
  readonly commit: string;
}

export function machineFacts(): MachineFacts {
  let os = '?';
  try {
    os = /^PRETTY_NAME="?([^"\n]*)"?$/m.exec(readFileSync('/etc/os-release', 'utf8'))?.[1] ?? '?';
  } catch {
    /* not Linux-like */
  }
  return {
    cores: cpus().length,
    cpu: cpus()[0]?.model ?? '?',
    memoryGiB: totalmem() / 2 ** 30,
    kernel: release(),
    os,
    node: process.version,
    bwrap: tryRun('bwrap', ['--version']),
    runsc: tryRun('runsc', ['--version']),
    loadAtStart: loadavg()
      .map((l) => l.toFixed(2))
      .join(' / '),
    commit: tryRun('git', ['rev-parse', '--short', 'HEAD']),
  };
}

const cell = (s: string): string => s.replace(/\|/g, '\\|').replace(/\n/g, ' ');

export function renderMarkdown(o: {
  readonly stamp: string;
  readonly facts: MachineFacts;
  readonly extraFacts: Record<string, string>;
  readonly mode: string;
  readonly seconds: number;
  readonly sections: readonly Section[];
}): string {
  const f = o.facts;
  const out: string[] = [
    `# Airlock benchmark report — ${o.stamp}`,
    '',
    `Mode: **${o.mode}**, ${o.seconds.toFixed(0)} s. Every figure is given as an absolute value and as a ratio to a baseline ` +
      'measured in the same run on the same machine; targets are those of issue 6.',
    '',
    '| machine | |',
    '|---|---|',
    `| cores | ${f.cores} × ${cell(f.cpu)} |`,
    `| memory | ${f.memoryGiB.toFixed(1)} GiB |`,
    `| OS, kernel | ${cell(f.os)}, ${cell(f.kernel)} |`,
    `| node | ${f.node} |`,
    `| bwrap | ${cell(f.bwrap)} |`,
    `| runsc | ${cell(f.runsc)} |`,
    `| load average at start (1/5/15 min) | ${f.loadAtStart} |`,
    ...Object.entries(o.extraFacts).map(([k, v]) => `| ${cell(k)} | ${cell(v)} |`),
    `| commit | ${cell(f.commit)} |`,
    '',
  ];
  const all = o.sections.flatMap((s) => s.rows.filter((r) => r.verdict).map((r) => ({ s, r })));
  if (all.length) {
    out.push(
      '## Summary',
      '',
      '| | measure | value | ratio to baseline | target | holds |',
      '|---|---|---|---|---|---|',
      ...all.map(
        ({ s, r }) =>
          `| ${s.id} | ${cell(r.measure)} | ${cell(r.value)} | ${cell(r.ratio)} | ${cell(r.target)} | **${r.verdict}** |`,
      ),
      '',
    );
  }
  for (const s of o.sections) {
    out.push(`## ${s.id} — ${s.title}`, '');
    if (s.intro) out.push(s.intro, '');
    if (s.rows.length) {
      out.push(
        '| measure | value | ratio to baseline | target | holds |',
        '|---|---|---|---|---|',
        ...s.rows.map(
          (r) =>
            `| ${cell(r.measure)} | ${cell(r.value)} | ${cell(r.ratio)} | ${cell(r.target)} | ${r.verdict ? `**${r.verdict}**` : ''} |`,
        ),
        '',
      );
    }
    for (const n of s.notes ?? []) out.push(`- ${n}`);
    if (s.notes?.length) out.push('');
    for (const c of s.charts ?? []) out.push(`![${c.title}](${c.file})`, '', `[${c.file}](${c.file})`, '');
    if (s.detail) out.push('<details><summary>details</summary>', '', s.detail, '', '</details>', '');
  }
  return out.join('\n');
}

// ---- docs/benchmarks.md ---------------------------------------------------------------------------

/** What bench/index.ts writes to bench/results/<stamp>.json (the fields this page reads). */
export interface SavedRun {
  readonly stamp: string;
  readonly mode: string;
  readonly seconds: number;
  readonly facts: MachineFacts;
  readonly errors?: Record<string, string>;
  readonly sections: readonly Section[];
}

const HEADER = [
  '# Benchmarks',
  '',
  '<!-- Generated by `npm run bench` (bench/report.ts, writeBenchmarksDoc) from its latest run; do not edit.',
  '     `npm run docs:bench [-- RESULTS.json]` writes it again from a saved run. -->',
  '',
];

/**
 * docs/benchmarks.md: one table of every measure of a run beside the baseline measured in the same run
 * (absolute value, ratio, target, whether it holds), with the machine it ran on. SPECIFICATION.md names
 * the rows that hold its targets; the full report with charts stays in bench/results/.
 */
export function renderBenchmarksDoc(run: SavedRun | undefined, source?: string): string {
  if (!run) {
    return [
      ...HEADER,
      'No benchmark run was recorded when this page was generated: `npm run bench` runs them all',
      '(`npm run bench -- --quick` in about 2 minutes) and writes this page from the run.',
      '',
    ].join('\n');
  }
  const f = run.facts;
  const rows = run.sections.flatMap((s) => s.rows.map((r) => ({ s, r })));
  const out = [
    ...HEADER,
    `Run ${run.stamp} (${run.mode}, ${run.seconds.toFixed(0)} s)${source ? ` — \`${source}\`` : ''}, commit ${cell(f.commit)}, on ` +
      `${f.cores} × ${cell(f.cpu)}, ${f.memoryGiB.toFixed(1)} GiB, ${cell(f.os)}, kernel ${cell(f.kernel)}, node ${f.node}; ` +
      `load at start ${f.loadAtStart}. Every ratio is to a baseline measured in the same run on the same machine.`,
    '',
    '| | measure | value | ratio to baseline | target | holds |',
    '|---|---|---|---|---|---|',
    ...rows.map(
      ({ s, r }) =>
        `| ${s.id} | ${cell(r.measure)} | ${cell(r.value)} | ${cell(r.ratio)} | ${cell(r.target)} | ${r.verdict ? `**${r.verdict}**` : ''} |`,
    ),
    '',
  ];
  const errors = Object.entries(run.errors ?? {});
  if (errors.length)
    out.push('Failed in this run:', '', ...errors.map(([k, v]) => `- ${k}: ${cell(v.split('\n')[0]!)}`), '');
  return out.join('\n');
}

/** The newest bench/results/<stamp>.json in `dir`, if any. */
export function latestRun(dir: string): string | undefined {
  if (!existsSync(dir)) return undefined;
  const runs = readdirSync(dir)
    .filter((f) => f.endsWith('.json'))
    .sort();
  return runs.length ? join(dir, runs[runs.length - 1]!) : undefined;
}

/** Write docs/benchmarks.md from a saved run (or the "no run recorded" page when there is none). */
export function writeBenchmarksDoc(resultsFile: string | undefined, outFile: string): void {
  const run = resultsFile ? (JSON.parse(readFileSync(resultsFile, 'utf8')) as SavedRun) : undefined;
  const root = join(dirname(outFile), '..');
  writeFileSync(outFile, renderBenchmarksDoc(run, resultsFile ? relative(root, resultsFile) : undefined));
}

// `tsx bench/report.ts [RESULTS.json]` (npm run docs:bench): docs/benchmarks.md from a saved run.
if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const here = dirname(fileURLToPath(import.meta.url));
  const file = process.argv[2] ?? latestRun(join(here, 'results'));
  writeBenchmarksDoc(file, join(here, '..', 'docs', 'benchmarks.md'));
  process.stderr.write(`wrote docs/benchmarks.md from ${file ?? 'no saved run'}\n`);
}
