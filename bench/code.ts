// Code execution (issue 34): one-shot `sbx.runCode` (a fresh kernel per run: start, run, kill) for
// python and javascript on the namespaces tier, beside a raw exec of `python3 -c 1` and
// `node -e 1` in the same sandbox and the same run (the floor: the interpreter's own start-up), and a
// run in a warm context (the kernel already started). One exported function per tier, so the WASM
// tier's can sit beside it (`codeBenchWasm`); bench/index.ts does not run this file (run it alone:
// `npx tsx bench/code.ts [--quick]`).
import { fileURLToPath } from 'node:url';
import { Airlock } from '../src/index.js';
import { BENCH_STATE_DIR, BENCH_UID_RANGE, type BenchContext } from './common.js';
import { fmt, sample, summarize, type Summary } from './stats.js';

export interface CodeRow {
  readonly tier: string;
  readonly what: string;
  readonly latency: Summary;
}

export interface CodeReport {
  readonly rows: readonly CodeRow[];
}

/** The namespaces tier: one-shot runCode and warm-context runCode per language, and the raw exec floor. */
export async function codeBenchNamespaces(ctx: BenchContext & { runs?: number }): Promise<CodeReport> {
  const runs = ctx.runs ?? (ctx.quick ? 10 : 50);
  const warmup = ctx.quick ? 2 : 5;
  const airlock = new Airlock({ stateDir: BENCH_STATE_DIR, uidRange: BENCH_UID_RANGE, warmPool: 0 });
  const rows: CodeRow[] = [];
  const row = (what: string, samples: number[]): void => {
    rows.push({ tier: 'namespaces', what, latency: summarize(samples) });
    ctx.log(`code namespaces ${what}: p50 ${fmt(rows.at(-1)!.latency.p50)}`);
  };
  try {
    const sbx = await airlock.create({});
    try {
      const check = async (p: Promise<{ error: unknown }>): Promise<void> => {
        const r = await p;
        if (r.error) throw new Error(`bench run failed: ${JSON.stringify(r.error)}`);
      };
      row(
        'exec python3 -c 1 (floor)',
        await sample(runs, async () => void (await sbx.exec(['python3', '-c', '1'])), warmup),
      );
      row('runCode python one-shot', await sample(runs, () => check(sbx.runCode('1 + 1')), warmup));
      const py = await sbx.createCodeContext({ language: 'python' });
      row(
        'runCode python warm context',
        await sample(runs, () => check(sbx.runCode('1 + 1', { context: py })), warmup),
      );
      row(
        'exec node -e 1 (floor)',
        await sample(runs, async () => void (await sbx.exec(['node', '-e', '1'])), warmup),
      );
      row(
        'runCode javascript one-shot',
        await sample(runs, () => check(sbx.runCode('1 + 1', { language: 'javascript' })), warmup),
      );
      const js = await sbx.createCodeContext({ language: 'javascript' });
      row(
        'runCode javascript warm context',
        await sample(runs, () => check(sbx.runCode('1 + 1', { context: js })), warmup),
      );
    } finally {
      await sbx.kill();
    }
  } finally {
    await airlock.close();
  }
  return { rows };
}

export function formatCode(r: CodeReport): string {
  const lines = ['| tier | what | p50 | p99 | mean |', '| --- | --- | --- | --- | --- |'];
  for (const x of r.rows) {
    lines.push(
      `| ${x.tier} | ${x.what} | ${fmt(x.latency.p50)} | ${fmt(x.latency.p99)} | ${fmt(x.latency.mean)} |`,
    );
  }
  return lines.join('\n');
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const at = process.argv.indexOf('--runs');
  const runs = at > 0 ? Number(process.argv[at + 1]) : undefined;
  const log = (s: string): void => void process.stderr.write(s + '\n');
  const report = await codeBenchNamespaces({ quick: process.argv.includes('--quick'), log, runs });
  process.stdout.write(formatCode(report) + '\n');
}
