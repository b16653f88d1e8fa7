// SECURITY-CRITICAL: the offline description scanner for MCP definitions (issue 4, "Definitions: scan
// and pin"; v2: issue 35). It reads what an untrusted server says about itself (every string anywhere
// in its tools, prompts, resources, resource templates and instructions, with its JSON path; see
// scan/collect.ts), normalises it (NFKC, look-alikes, invisible characters, scan/text.ts), recovers
// what markup and encodings hide (scan/decode.ts) and reports text that speaks to the model instead of
// describing the tool: overrides of the user or system, secrecy, data moving from credentials, files or
// the conversation into parameters or URLs, changes to other tools' behaviour, in English and ten other
// languages (scan/rules.ts, scan/lexicon.ts); parameters that ask for conversation or secrets;
// annotations that contradict the description; hidden characters and look-alike names
// (scan/unicode.ts); definitions the MCP SDK would reject. The severity model is in docs/guides/
// mcp-scanner.md. Pure and deterministic: no I/O, no clock, no randomness. It only reports; policy
// decides whether a finding means warn or quarantine. Heuristics: a determined author can word around
// them, which is why definitions are also pinned and calls are mediated.
import { ToolSchema } from '@modelcontextprotocol/sdk/types.js';
import { RULE_IDS, type RuleId, type Severity } from '../policy/mcp-rules.js';
import type { Finding, Hit, ScanInput } from './scan/types.js';
import { collect, isRecord, label, list, type Field } from './scan/collect.js';
import { hiddenViews } from './scan/decode.js';
import { asksForSource, phraseHits, textHits } from './scan/rules.js';
import { excerptOf, fold, originalSpan, SCAN_LIMITS, type Folded } from './scan/text.js';
import { homoglyphFinding, unicodeFindings } from './scan/unicode.js';
import { annotationFindings } from './scan/annotations.js';
import {
  crossServerFinding,
  crossServerMatcher,
  isSideChannelName,
  v1SideChannelAsk,
} from './scan/params.js';

export { RULE_IDS, type RuleId, type Severity };
export type { Finding, ScanInput };
export { excerptOf, SCAN_LIMITS };

export interface ScanOptions {
  /** Longer descriptions (in code points) get an `excessive-length` finding. Default 2000. */
  maxDescriptionChars?: number;
}

const DEFAULT_MAX_DESCRIPTION_CHARS = 2000;
const RANK: Record<Severity, number> = { high: 3, medium: 2, low: 1 };
/** Rules whose finding means the definition does something only an attack needs. */
const STRONG = new Set<RuleId>([
  'secrecy',
  'instruction-override',
  'exfiltration',
  'tool-shadowing',
  'hidden-markup',
  'encoded-payload',
]);
const ZERO_WIDTH = /[\u200B-\u200D\u2060\u2061-\u2064\u180E\uFEFF]/g;

/** One finding per rule for the hits in one text: the most severe, quoting every phrase matched. */
function findingsFromHits(f: Field, folded: Folded, hits: Hit[], out: Finding[]): void {
  const byRule = new Map<RuleId, Hit[]>();
  for (const h of hits) byRule.set(h.ruleId, [...(byRule.get(h.ruleId) ?? []), h]);
  for (const [ruleId, group] of byRule) {
    const first = group.reduce((a, b) => ((b.index >= 0 && b.index < a.index) || a.index < 0 ? b : a));
    const severity = group.reduce<Severity>((s, h) => (RANK[h.severity] > RANK[s] ? h.severity : s), 'low');
    const phrases = [
      ...new Set(
        group
          .filter((h) => h.index >= 0)
          .map((h) => folded.text.slice(h.index, h.index + h.length).toLowerCase()),
      ),
    ].sort();
    const [start, end] =
      first.index >= 0
        ? originalSpan(f.text, folded, first.index, first.length)
        : [0, Math.min(f.text.length, 60)];
    out.push({
      ruleId,
      severity,
      location: f.location,
      excerpt: excerptOf(f.text, start, end),
      message: phrases.length
        ? `${first.what}: ${phrases.map((p) => JSON.stringify(p)).join(', ')}`
        : first.what,
    });
  }
}

/** What markup or an encoding hides, scanned again (up to SCAN_LIMITS.maxDecodeDepth levels deep). */
function viewFindings(f: Field, text: string, depth: number, out: Finding[]): void {
  for (const v of hiddenViews(text)) {
    const folded = fold(v.text);
    const hits = textHits(folded.text, light(v.text));
    if (hits.length > 0) {
      const kinds = [...new Set(hits.map((h) => h.what))].slice(0, 3).join('; ');
      out.push({
        ruleId: v.kind === 'markup' ? 'hidden-markup' : 'encoded-payload',
        severity: 'high',
        location: f.location,
        excerpt: excerptOf(v.text, 0, Math.min(v.text.length, 100)),
        message: `Text hidden in ${v.how} reads as instructions (${kinds}); hidden text is never needed to describe a tool`,
      });
      continue;
    }
    if (depth + 1 < SCAN_LIMITS.maxDecodeDepth) viewFindings(f, folded.text, depth + 1, out);
  }
}

/** NFKC without the look-alike table (for the lexicon: Cyrillic must stay Cyrillic), bounded. */
function light(s: string): string {
  return s.slice(0, SCAN_LIMITS.maxPhraseScanChars).normalize('NFKC').replace(INVISIBLE, '');
}
const INVISIBLE =
  /\u00AD|\u034F|[\u200B-\u200F]|[\u2060-\u2064]|[\u202A-\u202E]|[\u2066-\u2069]|\uFEFF|\u180E/g;

function codePointLength(s: string): number {
  let n = 0;
  for (let i = 0; i < s.length; i++) {
    const u = s.charCodeAt(i);
    if (u < 0xdc00 || u > 0xdfff) n++;
  }
  return n;
}

function lengthFinding(f: Field, maxChars: number): Finding | undefined {
  const length = codePointLength(f.text);
  if (length > SCAN_LIMITS.maxPhraseScanChars) {
    return {
      ruleId: 'excessive-length',
      severity: 'medium',
      location: f.location,
      excerpt: excerptOf(f.text, 0, 0),
      message: `Text is ${length} characters; only the first ${SCAN_LIMITS.maxPhraseScanChars} were checked for hidden instructions`,
    };
  }
  if (f.kind === 'description' && length > maxChars) {
    return {
      ruleId: 'excessive-length',
      severity: 'low',
      location: f.location,
      excerpt: excerptOf(f.text, 0, 0),
      message: `Description is ${length} characters (limit ${maxChars})`,
    };
  }
  return undefined;
}

/** A tool the MCP SDK's schema rejects (e.g. an inputSchema without `"type": "object"`). */
function invalidToolFindings(input: ScanInput, out: Finding[]): void {
  list(input.tools).forEach((tool, i) => {
    // A missing inputSchema is left to the caller (scan inputs built by hand often omit it); one that is
    // there but malformed, like a bare {"$schema": ...}, is what breaks clients.
    const parsed = ToolSchema.safeParse(isRecord(tool) ? { inputSchema: { type: 'object' }, ...tool } : tool);
    if (parsed.success) return;
    const issues = parsed.error.issues
      .slice(0, 3)
      .map((x) => `${x.path.length ? x.path.join('.') : '(root)'}: ${x.message}`)
      .join('; ');
    const owner = `tools[${label(isRecord(tool) ? tool.name : undefined, i)}]`;
    out.push({
      ruleId: 'invalid-definition',
      severity: 'medium',
      location: owner,
      excerpt: '',
      message: `Not a valid MCP tool definition (${issues}); MCP SDK clients reject it, so the server must fix it (an inputSchema needs "type": "object")`,
    });
  });
}

function compareFindings(a: Finding, b: Finding): number {
  const keys: Array<[string | number, string | number]> = [
    [a.location, b.location],
    [a.ruleId, b.ruleId],
    [RANK[b.severity], RANK[a.severity]],
    [a.message, b.message],
    [a.excerpt, b.excerpt],
  ];
  for (const [x, y] of keys) if (x !== y) return x < y ? -1 : 1;
  return 0;
}

/** Scan a server's definitions; findings sorted by location, then rule id. */
export function scanDefinitions(input: ScanInput, opts: ScanOptions = {}): Finding[] {
  const maxChars = opts.maxDescriptionChars ?? DEFAULT_MAX_DESCRIPTION_CHARS;
  input = isRecord(input) ? input : {};
  const c = collect(input);
  const findings = c.findings;
  const ownNames = new Set(list(input.tools).map((t) => String(t?.name ?? '').toLowerCase()));
  const others = list(input.otherServersToolNames).map((n) => String(n));
  const knownNames = new Set([...others.map((n) => n.toLowerCase()), ...ownNames]);
  const crossRe = crossServerMatcher(others, ownNames);
  /** Folded prose that carried a finding, per owner: where a side-channel parameter gets named. */
  const flagged = new Map<string, Array<{ location: string; text: string; strong: boolean }>>();
  const owners = new Map<Finding, string>();

  for (const f of c.fields) {
    const local: Finding[] = [];
    unicodeFindings(f, local);
    if (f.identifier) {
      const h = homoglyphFinding(f, knownNames);
      if (h) local.push(h);
    }
    const long = lengthFinding(f, maxChars);
    if (long) local.push(long);
    if (f.kind !== 'name') {
      const folded = fold(f.text);
      const hits = textHits(folded.text, light(f.text));
      // Zero-width characters between words: read them as spaces too.
      if (ZERO_WIDTH.test(f.text)) {
        const spaced = fold(f.text.replace(ZERO_WIDTH, ' '));
        const seen = new Set(hits.map((h) => h.ruleId));
        for (const h of textHits(spaced.text))
          if (!seen.has(h.ruleId)) hits.push({ ...h, index: 0, length: 0 });
      }
      // A credential path as the value of a URI or a default is used as is: high.
      if (/\.(?:uri|uriTemplate|default)$|\.default\[/.test(f.location))
        for (const h of hits) if (h.ruleId === 'sensitive-path') h.severity = 'high';
      const before = local.length;
      findingsFromHits(f, folded, hits, local);
      viewFindings(f, f.text, 0, local); // the original: markdown comments need their line breaks
      const textual = local.slice(before);
      if (textual.length > 0) {
        const strong = textual.some((p) => STRONG.has(p.ruleId));
        const entries = flagged.get(f.owner) ?? [];
        entries.push({ location: f.location, text: folded.text, strong });
        flagged.set(f.owner, entries);
        // Invisible characters that hide instructions are not decoration.
        for (const u of local.slice(0, before))
          if (u.ruleId === 'invisible-unicode' && u.severity !== 'high') {
            u.severity = 'high';
            u.message += '; they hide instructions';
          }
      }
      const cross = crossRe ? crossServerFinding(f, folded, crossRe) : undefined;
      if (cross) local.push(cross);
    }
    for (const finding of local) {
      owners.set(finding, f.owner);
      findings.push(finding);
    }
  }
  invalidToolFindings(input, findings);
  for (const a of annotationFindings(input)) {
    owners.set(a, /^tools\[.*?\](?=\.|$)/.exec(a.location)?.[0] ?? a.location);
    findings.push(a);
  }

  // Instructions aimed at the model next to an attack (anywhere in the same definition) are high.
  const aggravated = new Set<string>();
  for (const f of findings) {
    // (An override is itself the instruction: it does not make its own phrasing any worse.)
    const attack = STRONG.has(f.ruleId) && f.ruleId !== 'instruction-override';
    if (f.severity === 'high' && (attack || f.ruleId === 'sensitive-path'))
      aggravated.add(owners.get(f) ?? '');
  }
  for (const f of findings) {
    if (f.ruleId === 'hidden-instruction' && f.severity !== 'high' && aggravated.has(owners.get(f) ?? '')) {
      f.severity = 'high';
      f.message += '; combined with secrecy, sensitive paths or data movement in the same definition';
    }
  }

  for (const p of c.params) findings.push(...paramFindings(p, flagged, aggravated));
  return findings.sort(compareFindings);
}

const CREDENTIAL_NAME = /key|token|secret|passw|pwd|auth|credential|cookie|session|bearer|\bpat\b/i;
const CONVERSATION_NAME = /message|history|conversation|transcript|prompt|chat/i;
const SECRET_WORD =
  /password|passphrase|credential|api[ _-]?key|token|private key|ssh key|secret|card number|bank account|environment|env var|printenv|\.env|\.ssh|id_rsa/i;

function paramFindings(
  p: { owner: string; location: string; name: string; description?: string },
  flagged: Map<string, Array<{ location: string; text: string; strong: boolean }>>,
  aggravated: ReadonlySet<string>,
): Finding[] {
  const desc = p.description === undefined ? undefined : fold(p.description);
  const suspicious = isSideChannelName(p.name);
  if (desc && p.description !== undefined) {
    const v2 = asksForSource(desc.text);
    const ask = v2 ?? (suspicious ? v1SideChannelAsk(desc.text) : null);
    if (ask) {
      const secret = SECRET_WORD.test(ask[0]);
      // A parameter that says what it is (apiKey: "your API key", messages: "the chat history") is
      // asking openly; the attack is a harmless-sounding name that asks for secrets or the conversation.
      const open = secret ? CREDENTIAL_NAME.test(p.name) : CONVERSATION_NAME.test(p.name);
      // Conversation content asked for by a parameter whose name says so (history, chat) is medium.
      const severity: Severity = secret || (v2 && !open) ? 'high' : 'medium';
      if (!open || suspicious) {
        const [start, end] = originalSpan(p.description, desc, ask.index, ask[0].length);
        return [
          {
            ruleId: 'side-channel-parameter',
            severity,
            location: p.location,
            excerpt: excerptOf(p.description, start, end),
            message: `Parameter ${JSON.stringify(p.name)} asks for ${secret ? 'secrets or file contents' : 'conversation content'} (${JSON.stringify(ask[0].toLowerCase())}); a tool never needs them in a side field`,
          },
        ];
      }
    }
  }
  if (p.name.length < 3) return [];
  const escaped = p.name.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
  const ref = new RegExp(`(?<![\\w-])${escaped}(?![\\w-])`, 'i');
  // Only a side-channel name (sidenote, notes, context, ...) named by flagged text: every parameter a
  // long flagged description mentions would otherwise be reported.
  if (!suspicious) return [];
  const hit = (flagged.get(p.owner) ?? []).find(
    (e) => !e.location.startsWith(p.location) && ref.test(e.text),
  );
  if (!hit) return [];
  const m = ref.exec(hit.text)!;
  return [
    {
      ruleId: 'side-channel-parameter',
      severity: aggravated.has(p.owner) ? 'high' : 'medium',
      location: p.location,
      excerpt: excerptOf(hit.text, m.index, m.index + m[0].length),
      message: `Parameter ${JSON.stringify(p.name)} is named by suspicious instructions at ${hit.location}`,
    },
  ];
}

/** The most severe finding's severity, or undefined when there are none. */
export function highestSeverity(findings: readonly Finding[]): Severity | undefined {
  let best: Severity | undefined;
  for (const f of findings) if (best === undefined || RANK[f.severity] > RANK[best]) best = f.severity;
  return best;
}

/** The owner label findings use for the item `name` at `index` (e.g. `tools[<label>]`). */
export const ownerLabel = (name: unknown, index: number): string => label(name, index);

/**
 * The phrase rules alone (hidden instructions, secrecy toward the user, sensitive paths) on any text,
 * e.g. a tool result: the same folding (tag characters decoded, invisibles dropped, look-alikes folded)
 * and the same limit (the first SCAN_LIMITS.maxPhraseScanChars characters) as scanDefinitions. At most
 * one finding per rule, in rule order, each located at `location`.
 */
export function scanPhrases(text: string, location: string): Finding[] {
  const out: Finding[] = [];
  const folded = fold(text);
  const field: Field = { owner: location, location, text, kind: 'prose' };
  findingsFromHits(field, folded, phraseHits(folded.text), out);
  return out;
}
