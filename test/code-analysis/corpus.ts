// The code-analysis corpus (test/fixtures/code-corpus/<language>/<case>) and its scoring, shared by
// corpus.test.ts (floors) and bench/code-analysis.ts (the table). Each case's first comment lines
// name what it expects (`expect: rule[, rule]` or `expect: clean`) and the public source it is
// modelled on (`source: …`).
import { readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { analyzeCode, CODE_RULES } from '../../src/guard/code/index.js';
import type { CodeLanguage, CodeVerdict } from '../../src/core/code.js';

export const CORPUS_DIR = fileURLToPath(new URL('../fixtures/code-corpus/', import.meta.url));

export interface Case {
  readonly file: string;
  readonly language: CodeLanguage;
  readonly code: string;
  /** Expected rule ids; empty for a clean case. */
  readonly expect: ReadonlySet<string>;
  readonly source: string;
}

const LANGS: readonly CodeLanguage[] = ['python', 'javascript', 'typescript', 'bash'];

export function loadCorpus(): Case[] {
  const cases: Case[] = [];
  for (const language of LANGS) {
    for (const name of readdirSync(join(CORPUS_DIR, language)).sort()) {
      const code = readFileSync(join(CORPUS_DIR, language, name), 'utf8');
      const expect = /^(?:#|\/\/)\s*expect:\s*(.+)$/m.exec(code)?.[1]?.trim();
      const source = /^(?:#|\/\/)\s*source:\s*(.+)$/m.exec(code)?.[1]?.trim();
      if (!expect || !source) throw new Error(`${language}/${name}: no expect: or source: header`);
      const rules = expect === 'clean' ? [] : expect.split(/[,\s]+/).filter(Boolean);
      cases.push({ file: `${language}/${name}`, language, code, expect: new Set(rules), source });
    }
  }
  return cases;
}

export interface RuleScore {
  readonly rule: string;
  readonly tp: number;
  readonly fp: number;
  readonly fn: number;
  readonly precision: number;
  readonly recall: number;
}

export interface CorpusScore {
  readonly positives: number;
  readonly negatives: number;
  readonly rules: RuleScore[];
  /** Micro-averaged over rules: every expected rule found / every finding's rule expected. */
  readonly precision: number;
  readonly recall: number;
  /** Positive cases that expect a high rule and are denied by the default policy. */
  readonly denyRecall: number;
  /** Clean cases denied by the default policy. */
  readonly falseDenies: string[];
  /** Clean cases with any finding. */
  readonly flaggedNegatives: string[];
  readonly misses: string[];
  readonly verdicts: Map<string, CodeVerdict>;
}

const ratio = (n: number, d: number): number => (d === 0 ? 1 : n / d);
const HIGH = new Set(CODE_RULES.filter((r) => r.severity === 'high').map((r) => r.id as string));

export async function scoreCorpus(cases: readonly Case[]): Promise<CorpusScore> {
  const counts = new Map<string, { tp: number; fp: number; fn: number }>();
  const count = (r: string) => {
    let c = counts.get(r);
    if (!c) counts.set(r, (c = { tp: 0, fp: 0, fn: 0 }));
    return c;
  };
  const verdicts = new Map<string, CodeVerdict>();
  const falseDenies: string[] = [];
  const flaggedNegatives: string[] = [];
  const misses: string[] = [];
  let denyWanted = 0;
  let denyHit = 0;
  for (const c of cases) {
    const v = await analyzeCode(c.code, c.language);
    verdicts.set(c.file, v);
    const found = new Set(v.findings.map((f) => f.rule));
    for (const r of c.expect) {
      if (found.has(r)) count(r).tp++;
      else {
        count(r).fn++;
        misses.push(`${c.file}: ${r}`);
      }
    }
    for (const r of found) if (!c.expect.has(r)) count(r).fp++;
    const wantsDeny = [...c.expect].some((r) => HIGH.has(r));
    if (wantsDeny) {
      denyWanted++;
      if (!v.allowed) denyHit++;
    }
    if (c.expect.size === 0 && !v.allowed) falseDenies.push(c.file);
    if (c.expect.size === 0 && v.findings.length > 0) flaggedNegatives.push(c.file);
  }
  const rules = [...counts.entries()]
    .sort(([a], [b]) => a.localeCompare(b))
    .map(([rule, c]) => ({
      rule,
      ...c,
      precision: ratio(c.tp, c.tp + c.fp),
      recall: ratio(c.tp, c.tp + c.fn),
    }));
  const sum = (k: 'tp' | 'fp' | 'fn'): number => rules.reduce((s, r) => s + r[k], 0);
  return {
    positives: cases.filter((c) => c.expect.size > 0).length,
    negatives: cases.filter((c) => c.expect.size === 0).length,
    rules,
    precision: ratio(sum('tp'), sum('tp') + sum('fp')),
    recall: ratio(sum('tp'), sum('tp') + sum('fn')),
    denyRecall: ratio(denyHit, denyWanted),
    falseDenies,
    flaggedNegatives,
    misses,
    verdicts,
  };
}
