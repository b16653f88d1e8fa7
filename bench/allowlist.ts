// Executable allowlist roots (issue 32 part 3): time to build a root from the host root for
// ['python3'], ['python3', 'git'] and ['bash'], hardlinking (the default) and copying every file, and
// the size of what the root holds (files, entries, bytes of file content). No target is set by the
// issue; these figures are for the report. Standalone: `npx tsx bench/allowlist.ts [--runs N]`
// (root needed to keep owners); `allowlistBench` is exported for bench/index.ts.
import { existsSync, mkdirSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { buildExecutableRoot, type ExecutableRoot } from '../src/images/closure.js';
import { BENCH_STATE_DIR, type BenchContext } from './common.js';
import { fmt, summarize, type Summary } from './stats.js';

export const ALLOWLIST_SETS: readonly (readonly string[])[] = [['python3'], ['python3', 'git'], ['bash']];

export interface AllowlistRow {
  readonly executables: readonly string[];
  readonly link: 'hardlink' | 'copy';
  readonly build: Summary;
  readonly files: number;
  readonly entries: number;
  readonly bytes: number;
}

export interface AllowlistReport {
  readonly rows: readonly AllowlistRow[];
}

const WARMUP = 1;

export async function allowlistBench(ctx: BenchContext & { runs?: number }): Promise<AllowlistReport> {
  const runs = ctx.runs ?? (ctx.quick ? 3 : 10);
  const dir = join(BENCH_STATE_DIR, 'allowlist');
  rmSync(dir, { recursive: true, force: true });
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  const rows: AllowlistRow[] = [];
  try {
    for (const executables of ALLOWLIST_SETS) {
      if (executables.includes('git') && !existsSync('/usr/bin/git')) continue;
      for (const link of ['hardlink', 'copy'] as const) {
        const samples: number[] = [];
        let last: ExecutableRoot | undefined;
        for (let i = 0; i < WARMUP + runs; i++) {
          const destDir = join(dir, `root-${i}`);
          const t0 = performance.now();
          last = await buildExecutableRoot({ sourceLayers: ['/'], executables, destDir, link });
          const ms = performance.now() - t0;
          rmSync(destDir, { recursive: true, force: true }); // untimed
          if (i >= WARMUP) samples.push(ms);
        }
        const m = last!.manifest;
        rows.push({
          executables,
          link,
          build: summarize(samples),
          files: m.entries.filter((e) => e.type === 'file').length,
          entries: m.entries.length,
          bytes: last!.bytes,
        });
        ctx.log(`allowlist ${executables.join('+')} (${link}): p50 ${fmt(rows.at(-1)!.build.p50)}`);
      }
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
  return { rows };
}

export function formatAllowlist(r: AllowlistReport): string {
  const lines = [
    '| executables | link | build p50 | build p99 | files in root | entries | MiB |',
    '| --- | --- | --- | --- | --- | --- | --- |',
  ];
  for (const x of r.rows)
    lines.push(
      `| ${x.executables.join(', ')} | ${x.link} | ${fmt(x.build.p50)} | ${fmt(x.build.p99)} | ${x.files} | ` +
        `${x.entries} | ${(x.bytes / 2 ** 20).toFixed(1)} |`,
    );
  return lines.join('\n');
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const at = process.argv.indexOf('--runs');
  const runs = at > 0 ? Number(process.argv[at + 1]) : undefined;
  const log = (s: string): void => void process.stderr.write(s + '\n');
  const report = await allowlistBench({ quick: process.argv.includes('--quick'), log, runs });
  process.stdout.write(formatAllowlist(report) + '\n');
}
