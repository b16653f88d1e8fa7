// SECURITY-CRITICAL: character-level findings of the MCP definition scanner: invisible Unicode (tag
// characters that smuggle ASCII, zero-width and other characters that render as nothing), bidi
// overrides, and tool names made of look-alike characters. Correct bidi isolates in right-to-left text
// (U+2066..U+2068 each closed by U+2069, in a string with Hebrew or Arabic letters) are how such text is
// meant to be written and are not reported. Pure.
import type { RuleId, Severity } from '../../policy/mcp-rules.js';
import type { Finding } from './types.js';
import type { Field } from './collect.js';
import {
  codeName,
  excerptOf,
  flagTagRunLength,
  foldChar,
  hiddenKind,
  isIgnorable,
  isLegitimateJoiner,
  type HiddenKind,
} from './text.js';

const RTL_LETTER = /[\p{Script=Hebrew}\p{Script=Arabic}\p{Script=Syriac}\p{Script=Thaana}\p{Script=Nko}]/u;

/** Indices of isolate characters that are correctly paired, when the text is right-to-left at all. */
function correctIsolates(s: string): Set<number> {
  const ok = new Set<number>();
  if (!RTL_LETTER.test(s)) return ok;
  const open: number[] = [];
  for (let i = 0; i < s.length; i++) {
    const u = s.charCodeAt(i);
    if (u >= 0x2066 && u <= 0x2068) open.push(i);
    else if (u === 0x2069) {
      const start = open.pop();
      if (start === undefined) return new Set(); // a PDI with nothing to close: not a correct isolate
      ok.add(start).add(i);
    } else if (u >= 0x202a && u <= 0x202e) return new Set(); // overrides are never exempt
  }
  return open.length === 0 ? ok : new Set();
}

export function unicodeFindings(f: Field, out: Finding[]): void {
  const s = f.text;
  const runs: Record<HiddenKind, { count: number; first: number; codes: Set<number> }> = {
    tag: { count: 0, first: -1, codes: new Set() },
    'zero-width': { count: 0, first: -1, codes: new Set() },
    bidi: { count: 0, first: -1, codes: new Set() },
  };
  let decoded = '';
  const isolates = correctIsolates(s);
  for (let i = 0; i < s.length;) {
    const cp = s.codePointAt(i)!;
    const width = cp > 0xffff ? 2 : 1;
    const flagRun = cp === 0x1f3f4 ? flagTagRunLength(s, i + 2) : 0;
    if (flagRun > 0) {
      i += width + flagRun;
      continue;
    }
    const kind = hiddenKind(cp);
    if (kind !== undefined && !isLegitimateJoiner(s, i, cp) && !isolates.has(i)) {
      const run = runs[kind];
      if (run.first < 0) run.first = i;
      run.count++;
      run.codes.add(cp);
      if (kind === 'tag' && cp >= 0xe0020 && cp <= 0xe007e && decoded.length < 500) {
        decoded += String.fromCharCode(cp - 0xe0000);
      }
    }
    i += width;
  }
  const codes = (set: Set<number>) => [...set].slice(0, 8).map(codeName).join(', ');
  const push = (ruleId: RuleId, severity: Severity, kind: HiddenKind, message: string) => {
    const first = runs[kind].first;
    out.push({ ruleId, severity, location: f.location, excerpt: excerptOf(s, first, first + 1), message });
  };
  if (runs.tag.count > 0) {
    push(
      'invisible-unicode',
      'high',
      'tag',
      `${runs.tag.count} invisible Unicode tag character(s) hide ASCII text; decoded: ${JSON.stringify(decoded)}`,
    );
  }
  if (runs['zero-width'].count > 0) {
    const { count, codes: set } = runs['zero-width'];
    push(
      'invisible-unicode',
      'medium',
      'zero-width',
      `${count} zero-width/invisible character(s): ${codes(set)}`,
    );
  }
  if (runs.bidi.count > 0) {
    const { count, codes: set } = runs.bidi;
    push('bidi-override', 'high', 'bidi', `${count} bidirectional override character(s): ${codes(set)}`);
  }
}

export function homoglyphFinding(f: Field, known: ReadonlySet<string>): Finding | undefined {
  let skeleton = '';
  const swaps: string[] = [];
  for (const ch of f.text) {
    const cp = ch.codePointAt(0)!;
    if (cp < 0x80) skeleton += ch;
    else if (isIgnorable(cp)) continue;
    else {
      const folded = foldChar(ch);
      if (!/^[\x21-\x7e]+$/.test(folded)) return undefined; // a genuinely non-Latin name
      skeleton += folded;
      if (swaps.length < 8) swaps.push(`${codeName(cp)}→${folded}`);
    }
  }
  if (swaps.length === 0) return undefined;
  const impersonates = known.has(skeleton.toLowerCase()) ? `, the name of another tool` : '';
  return {
    ruleId: 'homoglyph-name',
    severity: 'high',
    location: f.location,
    excerpt: excerptOf(f.text, 0, f.text.length),
    message: `Name is made of look-alike characters for ${JSON.stringify(skeleton)}${impersonates} (${swaps.join(', ')})`,
  };
}
