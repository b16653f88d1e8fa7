// docs/benchmarks.md is written by the bench from a saved run (bench/report.ts), never by hand: the
// writer turns every row of a run into one table beside its same-run baseline, and the committed page
// carries the generated header.
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { expect, it } from 'vitest';
import {
  latestRun,
  notMeasured,
  renderBenchmarksDoc,
  row,
  writeBenchmarksDoc,
  type SavedRun,
} from '../../bench/report.js';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..');

// A saved run's shape with made-up figures (the writer is under test, not the machine).
const RUN: SavedRun = {
  stamp: '2026-01-02T03-04-05-000Z',
  mode: 'quick',
  seconds: 118.4,
  facts: {
    cores: 2,
    cpu: 'Example CPU',
    memoryGiB: 7.8,
    kernel: '6.1.0',
    os: 'Debian GNU/Linux 12 (bookworm)',
    node: 'v20.19.0',
    bwrap: 'bubblewrap 0.8.0',
    runsc: 'not installed',
    loadAtStart: '0.10 / 0.20 / 0.30',
    commit: 'abc1234',
  },
  errors: { gvisor: 'runsc not installed\nmore detail' },
  sections: [
    {
      id: 'P1',
      title: 'one-shot',
      rows: [row('create → exec → kill p50', '7.00 ms', '1.20× raw bwrap (5.83 ms)', '≤ 1.5×', 'PASS')],
    },
    { id: 'P2', title: 'gVisor', rows: [notMeasured('gVisor one-shot', 'runsc not installed', '≤ 1.2×')] },
  ],
};

it('renders one table of every row beside its baseline, with the machine and the failures', () => {
  const md = renderBenchmarksDoc(RUN, 'bench/results/x.json');
  expect(md).toContain('do not edit');
  expect(md).toContain('commit abc1234, on 2 × Example CPU');
  expect(md.split('\n').filter((l) => l.startsWith('| P'))).toEqual([
    '| P1 | create → exec → kill p50 | 7.00 ms | 1.20× raw bwrap (5.83 ms) | ≤ 1.5× | **PASS** |',
    '| P2 | gVisor one-shot | not measured (runsc not installed) | — | ≤ 1.2× |  |',
  ]);
  expect(md).toContain('- gvisor: runsc not installed\n');
  expect(md).not.toContain('more detail');
});

it('writes the page from the newest saved run in a results dir', () => {
  const dir = mkdtempSync(join(tmpdir(), 'airlock-bench-doc-'));
  try {
    writeFileSync(join(dir, '2026-01-01T00-00-00-000Z.json'), JSON.stringify({ ...RUN, stamp: 'older' }));
    writeFileSync(join(dir, `${RUN.stamp}.json`), JSON.stringify(RUN));
    writeFileSync(join(dir, `${RUN.stamp}.md`), 'not a run');
    const latest = latestRun(dir);
    expect(latest).toBe(join(dir, `${RUN.stamp}.json`));
    const out = join(dir, 'benchmarks.md');
    writeBenchmarksDoc(latest, out);
    expect(readFileSync(out, 'utf8')).toContain(`Run ${RUN.stamp} (quick, 118 s)`);
    expect(latestRun(join(dir, 'absent'))).toBeUndefined();
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

it('the committed docs/benchmarks.md is the generated page', () => {
  const md = readFileSync(join(ROOT, 'docs', 'benchmarks.md'), 'utf8');
  expect(md.startsWith(renderBenchmarksDoc(undefined).split('\n').slice(0, 5).join('\n'))).toBe(true);
});
