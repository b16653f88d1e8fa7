// Static analysis of code before it runs (issue 34): parse with tree-sitter, evaluate rules, apply
// the policy. STUB on main until the analysis lands: it allows everything and finds nothing. The
// signature is the seam runCode calls; keep it.
import type { CodeLanguage, CodePolicy, CodeVerdict } from '../../core/code.js';

/** Analyse `code` and apply `policy` (default: high → deny, medium/low → warn). */
export async function analyzeCode(
  code: string,
  language: CodeLanguage,
  policy: CodePolicy = {},
): Promise<CodeVerdict> {
  void code;
  void language;
  void policy;
  return { allowed: true, findings: [] };
}
