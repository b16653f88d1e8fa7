// The benchmark report: every measure as rows of (absolute value, ratio to a baseline measured in the
// same run, target, whether it holds), rendered as Markdown with linked SVG charts.
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { cpus, loadavg, release, totalmem } from 'node:os';

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
