// The analysis scored on its corpus (test/fixtures/code-corpus/): the floors below are what it
// reaches; bench/code-analysis.ts prints the table. A rule that regresses on any case fails here.
import { beforeAll, describe, expect, it } from 'vitest';
import { CODE_RULE_IDS } from '../../src/guard/code/index.js';
import { loadCorpus, scoreCorpus, type Case, type CorpusScore } from './corpus.js';

let cases: Case[];
let score: CorpusScore;

beforeAll(async () => {
  cases = loadCorpus();
  score = await scoreCorpus(cases);
});

describe('code-analysis corpus', () => {
  it('has enough cases, in every language, each naming a known rule and its public source', () => {
    expect(score.positives).toBeGreaterThanOrEqual(60);
    expect(score.negatives).toBeGreaterThanOrEqual(80);
    for (const lang of ['python', 'javascript', 'typescript', 'bash']) {
      expect(cases.filter((c) => c.language === lang && c.expect.size > 0).length).toBeGreaterThanOrEqual(5);
      expect(cases.filter((c) => c.language === lang && c.expect.size === 0).length).toBeGreaterThanOrEqual(
        5,
      );
    }
    for (const c of cases) {
      for (const r of c.expect) expect(CODE_RULE_IDS as readonly string[]).toContain(r);
      expect(c.source.length).toBeGreaterThan(10);
    }
  });

  it('every rule id the corpus is about has positives', () => {
    const covered = new Set(cases.flatMap((c) => [...c.expect]));
    for (const r of CODE_RULE_IDS.filter((r) => r !== 'parse-error' && r !== 'analysis-limit'))
      expect(covered).toContain(r);
  });

  it('overall precision and recall stay at their floors', () => {
    expect(score.misses).toEqual([]);
    expect(score.recall).toBeGreaterThanOrEqual(0.95);
    expect(score.precision).toBeGreaterThanOrEqual(0.95);
  });

  it('per rule: precision and recall at least 0.9', () => {
    for (const r of score.rules) {
      expect({ rule: r.rule, ok: r.precision >= 0.9 && r.recall >= 0.9 }).toEqual({ rule: r.rule, ok: true });
    }
  });

  it('the default policy denies at least 90% of the cases that expect a high rule, and no clean case', () => {
    expect(score.denyRecall).toBeGreaterThanOrEqual(0.9);
    expect(score.falseDenies).toEqual([]);
    expect(score.flaggedNegatives).toEqual([]);
  });
});
