// Static analysis of code before it runs (issue 34): parse with tree-sitter, evaluate the rules of
// rules.ts on the syntax tree (python.ts, javascript.ts, bash.ts; literal shell commands inside
// Python and JavaScript go through the bash rules too), then apply the policy. A speed bump for
// agent-written code, not a boundary: the sandbox is the boundary. Deterministic: the same code and
// policy always give the same findings in the same order.
import type { Node, Language } from 'web-tree-sitter';
import {
  CODE_LANGUAGES,
  CodePolicySchema,
  type CodeAction,
  type CodeFinding,
  type CodeLanguage,
  type CodePolicy,
  type CodeSeverity,
  type CodeVerdict,
} from '../../core/code.js';
import { AirlockError } from '../../core/errors.js';
import { analyzeBash, argvFromList, checkArgv } from './bash.js';
import type { Sink } from './flow.js';
import { analyzeJavaScript } from './javascript.js';
import { loadGrammar, parseWith } from './parser.js';
import { analyzePython } from './python.js';
import { CODE_RULES, codeRule, type CodeRuleId } from './rules.js';

export { CODE_RULES, CODE_RULE_IDS, type CodeRule, type CodeRuleId } from './rules.js';

/** Code over this many bytes (UTF-8) is not parsed: an `analysis-limit` finding says so. */
export const MAX_CODE_BYTES = 256 * 1024;
/** Parsing longer than this gives up with an `analysis-limit` finding. */
const PARSE_DEADLINE_MS = 2_000;
/** Code inside strings (shell commands, exec literals) inside strings is followed this deep. */
const MAX_NESTED_DEPTH = 3;
const SNIPPET_CHARS = 120;

const DEFAULT_ACTION: Record<CodeSeverity, CodeAction> = { high: 'deny', medium: 'warn', low: 'warn' };
const SEVERITY_RANK: Record<CodeSeverity, number> = { high: 0, medium: 1, low: 2 };
const RULE_RANK = new Map(CODE_RULES.map((r, i) => [r.id, i]));

interface Raw {
  readonly rule: CodeRuleId;
  readonly severity: CodeSeverity;
  readonly line: number;
  readonly column: number;
  readonly snippet: string;
}

function snippetOf(text: string): string {
  const one = text.replace(/\s+/g, ' ').trim();
  return one.length > SNIPPET_CHARS ? `${one.slice(0, SNIPPET_CHARS - 1)}\u2026` : one;
}

/** True when more than half of the code's bytes sit in ERROR nodes. */
function mostlyErrors(root: Node, total: number): Node | null {
  let bad = 0;
  let first: Node | null = null;
  const walk = (n: Node): void => {
    if (n.isError || n.isMissing) {
      bad += n.endIndex - n.startIndex;
      first ??= n;
      return;
    }
    if (!n.hasError) return;
    for (const c of n.children) if (c) walk(c);
  };
  walk(root);
  return total > 0 && bad * 2 > total ? (first ?? root) : null;
}

function validate(code: unknown, language: unknown, policy: unknown): CodePolicy {
  if (typeof code !== 'string') {
    throw new AirlockError('INVALID_ARGUMENT', 'analyzeCode: code must be a string', { field: 'code' });
  }
  if (!(CODE_LANGUAGES as readonly unknown[]).includes(language)) {
    throw new AirlockError(
      'INVALID_ARGUMENT',
      `analyzeCode: language must be one of ${CODE_LANGUAGES.join(', ')} (got ${JSON.stringify(language)})`,
      {
        field: 'language',
      },
    );
  }
  const parsed = CodePolicySchema.safeParse(policy ?? {});
  if (!parsed.success) {
    const issue = parsed.error.issues[0]!;
    const field = ['codePolicy', ...issue.path.map(String)].join('.');
    throw new AirlockError('INVALID_ARGUMENT', `analyzeCode: ${field}: ${issue.message}`, { field });
  }
  return parsed.data;
}

/** The action `policy` takes on a finding: `rules[id]`, then `severity[sev]`, then the default. */
export function codeActionFor(policy: CodePolicy, rule: string, severity: CodeSeverity): CodeAction {
  return policy.rules?.[rule] ?? policy.severity?.[severity] ?? DEFAULT_ACTION[severity];
}

/**
 * Analyse `code` and apply `policy` (default: high → deny, medium/low → warn). A deny finding makes
 * the verdict `allowed: false`; warn and allow findings are listed and let the code run. Throws INVALID_ARGUMENT for a
 * non-string code, an unknown language or a malformed policy.
 */
export async function analyzeCode(
  code: string,
  language: CodeLanguage,
  policy: CodePolicy = {},
): Promise<CodeVerdict> {
  const pol = validate(code, language, policy);
  if (pol.disabled) return { allowed: true, findings: [] };
  const raw: Raw[] = [];
  const bytes = Buffer.byteLength(code, 'utf8');
  const limit = (): void => {
    raw.push({
      rule: 'analysis-limit',
      severity: 'high',
      line: 1,
      column: 1,
      snippet: snippetOf(code.slice(0, 200)),
    });
  };
  if (bytes > MAX_CODE_BYTES) limit();
  else {
    const [lang, bash] = await Promise.all([loadGrammar(language), loadGrammar('bash')]);
    const push = (rule: CodeRuleId, node: Node, severity?: CodeSeverity): void => {
      raw.push({
        rule,
        severity: severity ?? codeRule(rule).severity,
        line: node.startPosition.row + 1,
        // web-tree-sitter parses UTF-16: columns are UTF-16 units, like JavaScript strings and editors.
        column: node.startPosition.column + 1,
        snippet: snippetOf(node.text),
      });
    };
    const ok = analyse(lang, bash, code, language, push);
    if (!ok) limit();
  }
  return verdict(raw, pol);
}

/** Parse and run the language's rules; false when the parse gave up (deadline). */
function analyse(
  lang: Language,
  bash: Language,
  code: string,
  language: CodeLanguage,
  push: Sink['report'],
): boolean {
  const tree = parseWith(lang, code, PARSE_DEADLINE_MS);
  if (!tree) return false;
  try {
    let bad: Node | null;
    try {
      bad = mostlyErrors(tree.rootNode, code.trim().length);
    } catch (e) {
      if (e instanceof RangeError) return false;
      throw e;
    }
    if (bad) push('parse-error', bad);
    const run = (root: Node, lng: CodeLanguage, s: Sink): void => {
      if (lng === 'python') analyzePython(root, s);
      else if (lng === 'bash') analyzeBash(root, s);
      else analyzeJavaScript(root, s);
    };
    // Code inside a string (a shell command, an exec'd literal) is parsed and analysed too, its
    // findings reported at the string's own position; nesting stops at MAX_NESTED_DEPTH.
    const nested = (
      grammar: Language,
      lng: CodeLanguage,
      source: string,
      at: Node,
      report: Sink['report'],
      depth: number,
    ): void => {
      if (depth >= MAX_NESTED_DEPTH || source.length > 65_536) return;
      const sub = parseWith(grammar, source, PARSE_DEADLINE_MS);
      if (!sub) return;
      try {
        run(
          sub.rootNode,
          lng,
          sink((rule, _n, sev) => report(rule, at, sev), depth + 1),
        );
      } finally {
        sub.delete();
      }
    };
    const sink = (report: Sink['report'], depth: number): Sink => {
      const self: Sink = {
        report,
        shell(command, at) {
          nested(bash, 'bash', command, at, report, depth);
        },
        code(source, at) {
          nested(lang, language, source, at, report, depth);
        },
        argv(list, at) {
          checkArgv(argvFromList(list), at, self, { captured: false });
        },
      };
      return self;
    };
    const top = sink(push, 0);
    try {
      run(tree.rootNode, language, top);
    } catch (e) {
      // The walkers recurse with the syntax tree: code nested thousands deep overflows the stack.
      // What was found so far stands; the rest was not analysed, which is itself a finding.
      if (e instanceof RangeError) return false;
      throw e;
    }
    return true;
  } finally {
    tree.delete();
  }
}

/** One finding per rule and line (the worst severity), in source order, with the policy's action. */
function verdict(raw: readonly Raw[], policy: CodePolicy): CodeVerdict {
  const best = new Map<string, Raw>();
  for (const r of raw) {
    const key = `${r.rule}:${r.line}`;
    const seen = best.get(key);
    if (
      !seen ||
      SEVERITY_RANK[r.severity] < SEVERITY_RANK[seen.severity] ||
      (r.severity === seen.severity && r.column < seen.column)
    ) {
      best.set(key, r);
    }
  }
  const findings: CodeFinding[] = [...best.values()]
    .sort((a, b) => a.line - b.line || a.column - b.column || RULE_RANK.get(a.rule)! - RULE_RANK.get(b.rule)!)
    .map((r) => ({
      ...r,
      reason: codeRule(r.rule).reason,
      action: codeActionFor(policy, r.rule, r.severity),
    }));
  return { allowed: !findings.some((f) => f.action === 'deny'), findings };
}
