// Scores the code analysis (src/guard/code/) on its corpus (test/fixtures/code-corpus/) and times it.
//   npx tsx bench/code-analysis.ts [--misses]
// Prints precision and recall per rule and overall (a rule counts when a case expects it and it is
// found; a finding of a rule the case does not expect is a false positive), recall at deny (cases
// that expect a high rule and are denied by the default policy), and the analysis time per KB of
// code (parsers warm; the first, cold analysis is reported apart). Not part of bench/index.ts.
import { loadavg } from 'node:os';
import { analyzeCode } from '../src/guard/code/index.js';
import { loadCorpus, scoreCorpus } from '../test/code-analysis/corpus.js';

const pct = (x: number): string => `${(100 * x).toFixed(1)}%`;

async function main(): Promise<void> {
  const cases = loadCorpus();
  const t0 = performance.now();
  await analyzeCode('x = 1', 'python');
  const cold = performance.now() - t0;
  const score = await scoreCorpus(cases);

  console.log(`corpus: ${score.positives} positive and ${score.negatives} negative cases\n`);
  console.log('rule                  TP  FP  FN  precision  recall');
  for (const r of score.rules) {
    console.log(
      `${r.rule.padEnd(20)} ${String(r.tp).padStart(3)} ${String(r.fp).padStart(3)} ${String(r.fn).padStart(3)}  ${pct(r.precision).padStart(9)}  ${pct(r.recall).padStart(6)}`,
    );
  }
  console.log(
    `${'overall'.padEnd(20)}              ${pct(score.precision).padStart(9)}  ${pct(score.recall).padStart(6)}`,
  );
  console.log(`\nrecall at deny (default policy): ${pct(score.denyRecall)}`);
  console.log(
    `false denies: ${score.falseDenies.length}; clean cases with any finding: ${score.flaggedNegatives.length}`,
  );
  if (process.argv.includes('--misses')) {
    for (const m of score.misses) console.log(`  miss  ${m}`);
    for (const f of score.flaggedNegatives)
      console.log(
        `  flagged  ${f}: ${score.verdicts
          .get(f)!
          .findings.map((x) => x.rule)
          .join(', ')}`,
      );
    for (const r of score.rules) if (r.fp > 0) console.log(`  fp  ${r.rule}`);
  }

  // Speed: the whole corpus, warm, several rounds.
  const bytes = cases.reduce((s, c) => s + Buffer.byteLength(c.code), 0);
  const rounds = 20;
  const t1 = performance.now();
  for (let i = 0; i < rounds; i++) for (const c of cases) await analyzeCode(c.code, c.language);
  const ms = performance.now() - t1;
  const big = cases
    .map((c) => c.code)
    .filter((_, i) => cases[i]!.language === 'python')
    .join('\n')
    .repeat(20);
  const t2 = performance.now();
  await analyzeCode(big.slice(0, 200_000), 'python');
  const bigMs = performance.now() - t2;
  console.log(
    `\nspeed: ${((ms / rounds / bytes) * 1024).toFixed(3)} ms per KB over ${cases.length} small cases (${(ms / rounds / cases.length).toFixed(2)} ms per case)`,
  );
  console.log(
    `       ${((bigMs / 200_000) * 1024).toFixed(3)} ms per KB on one 200 KB Python cell; cold start (grammars loaded) ${cold.toFixed(0)} ms`,
  );
  console.log(`load average ${loadavg()[0]!.toFixed(2)}`);
}

await main();
