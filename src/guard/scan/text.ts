// SECURITY-CRITICAL: characters as the MCP definition scanner reads them (issue 4, issue 35): invisible
// and format characters, look-alike folding (NFKC + a confusables table), the folded text the rules
// match on with a map back to the original, and excerpts that show hidden characters escaped. Pure.

export const SCAN_LIMITS = {
  maxSchemaDepth: 32,
  maxSchemaNodes: 10_000,
  maxPhraseScanChars: 100_000,
  /** Decoded payloads (base64, hex, escapes, hidden markup) are re-scanned at most this deep. */
  maxDecodeDepth: 2,
  /** At most this many decoded candidates per string (a string of many short tokens stays cheap). */
  maxDecodeCandidates: 16,
} as const;
const EXCERPT_MAX_CHARS = 120;
// ---------------------------------------------------------------------------------------------------
// Characters

export type HiddenKind = 'tag' | 'zero-width' | 'bidi';

export function hiddenKind(cp: number): HiddenKind | undefined {
  if (cp >= 0xe0000 && cp <= 0xe007f) return 'tag';
  if ((cp >= 0x202a && cp <= 0x202e) || (cp >= 0x2066 && cp <= 0x2069)) return 'bidi';
  if ((cp >= 0x200b && cp <= 0x200d) || cp === 0x2060 || cp === 0xfeff) return 'zero-width';
  // Other characters that render as nothing: invisible operators, Mongolian vowel separator, Hangul
  // fillers, and the supplementary variation selectors (used to smuggle bytes behind one glyph).
  if ((cp >= 0x2061 && cp <= 0x2064) || cp === 0x180e || cp === 0x115f || cp === 0x1160) return 'zero-width';
  if (cp === 0x3164 || cp === 0xffa0 || (cp >= 0xe0100 && cp <= 0xe01ef)) return 'zero-width';
  return undefined;
}

/** Dropped from the text the phrase rules read (formatting only, no letters). */
export function isIgnorable(cp: number): boolean {
  return (
    hiddenKind(cp) !== undefined ||
    cp === 0x00ad ||
    cp === 0x034f ||
    cp === 0x200e ||
    cp === 0x200f ||
    (cp >= 0xfe00 && cp <= 0xfe0f)
  );
}

const ESCAPED = /[\p{Cc}\p{Cf}\p{Co}\p{Cs}]/u;
const PICTOGRAPH = /\p{Extended_Pictographic}|\p{Emoji_Modifier}|\uFE0F/u;
const NON_LATIN_LETTER = /^(?![\p{Script=Latin}\p{Script=Common}])[\p{L}\p{M}]$/u;

function cpAt(s: string, i: number): string {
  const cp = s.codePointAt(i);
  return cp === undefined ? '' : String.fromCodePoint(cp);
}
function cpBefore(s: string, i: number): string {
  if (i <= 0) return '';
  const low = s.charCodeAt(i - 1);
  return low >= 0xdc00 && low <= 0xdfff && i >= 2 ? cpAt(s, i - 2) : cpAt(s, i - 1);
}

/** ZWJ inside an emoji sequence, ZWNJ/ZWJ between letters of scripts that need them (Persian, Indic). */
export function isLegitimateJoiner(s: string, i: number, cp: number): boolean {
  if (cp !== 0x200c && cp !== 0x200d) return false;
  const prev = cpBefore(s, i);
  const next = cpAt(s, i + 1);
  if (cp === 0x200d && PICTOGRAPH.test(prev) && PICTOGRAPH.test(next)) return true;
  return NON_LATIN_LETTER.test(prev) && NON_LATIN_LETTER.test(next);
}

/** Length of a subdivision-flag tag run after U+1F3F4 (🏴 + tag letters + CANCEL TAG), else 0. */
export function flagTagRunLength(s: string, from: number): number {
  let i = from;
  let letters = 0;
  for (;;) {
    const cp = s.codePointAt(i);
    if (cp === 0xe007f) return letters >= 2 && letters <= 6 ? i + 2 - from : 0;
    if (cp === undefined || !((cp >= 0xe0030 && cp <= 0xe0039) || (cp >= 0xe0061 && cp <= 0xe007a))) return 0;
    letters++;
    i += 2;
  }
}

// Look-alikes that NFKC leaves alone: Cyrillic, Greek, Armenian and Latin letters that render like ASCII.
const LOOKALIKES: Record<string, string> = {
  a: '\u0430\u03b1\u0251',
  c: '\u0441\u03f2',
  d: '\u0501',
  e: '\u0435',
  g: '\u0261',
  h: '\u04bb\u0570',
  i: '\u0456\u03b9\u0131\u0269',
  j: '\u0458\u03f3\u0237',
  k: '\u03ba',
  l: '\u04cf',
  o: '\u043e\u03bf\u0585',
  p: '\u0440\u03c1',
  q: '\u051b',
  s: '\u0455',
  u: '\u03c5\u057d',
  v: '\u03bd',
  w: '\u051d',
  x: '\u0445\u03c7',
  y: '\u0443',
  A: '\u0410\u0391',
  B: '\u0412\u0392',
  C: '\u0421\u03f9',
  E: '\u0415\u0395',
  H: '\u041d\u0397',
  I: '\u0406\u0399\u04c0',
  J: '\u0408',
  K: '\u041a\u039a',
  M: '\u041c\u039c',
  N: '\u039d',
  O: '\u041e\u039f',
  P: '\u0420\u03a1',
  Q: '\u051a',
  S: '\u0405',
  T: '\u0422\u03a4',
  W: '\u051c',
  X: '\u0425\u03a7',
  Y: '\u04ae\u03a5',
  Z: '\u0396',
  '-': '\u2010\u2011\u2012\u2013\u2014\u2212',
  "'": '\u2018\u2019\u02bc',
  '"': '\u201c\u201d',
};
const CONFUSABLE = new Map<string, string>();
for (const [ascii, alikes] of Object.entries(LOOKALIKES)) for (const ch of alikes) CONFUSABLE.set(ch, ascii);

/** One code point folded towards ASCII: NFKC, then the look-alike table. */
export function foldChar(ch: string): string {
  let out = '';
  for (const c of ch.normalize('NFKC')) out += CONFUSABLE.get(c) ?? c;
  return out;
}

export function codeName(cp: number): string {
  return `U+${cp.toString(16).toUpperCase().padStart(4, '0')}`;
}

/** Code points of s[from, to) as display tokens: controls and invisibles escaped, whitespace a space. */
function displayTokens(s: string, from: number, to: number): string[] {
  const out: string[] = [];
  for (let i = from; i < to;) {
    const cp = s.codePointAt(i)!;
    const ch = String.fromCodePoint(cp);
    if (/\s/u.test(ch)) out.push(' ');
    else if (ESCAPED.test(ch) || isIgnorable(cp)) out.push(`\\u{${cp.toString(16).toUpperCase()}}`);
    else out.push(ch);
    i += ch.length;
  }
  return out;
}

export const display = (s: string): string => displayTokens(s, 0, s.length).join('');

function fitHead(tokens: string[], budget: number): string[] {
  const out: string[] = [];
  let used = 0;
  for (const t of tokens) {
    if (used + t.length > budget) break;
    out.push(t);
    used += t.length;
  }
  return out;
}
const fitTail = (tokens: string[], budget: number): string[] =>
  fitHead([...tokens].reverse(), budget).reverse();
const cost = (tokens: string[]): number => tokens.reduce((n, t) => n + t.length, 0);

/** At most EXCERPT_MAX_CHARS around s[start, end): the match first, a third of the room before it. */
export function excerptOf(s: string, start: number, end: number): string {
  const snap = (i: number): number => (i > 0 && /[\uDC00-\uDFFF]/.test(s[i] ?? '') ? i - 1 : i);
  const matchEnd = Math.min(end, start + 2 * EXCERPT_MAX_CHARS);
  const match = displayTokens(s, start, matchEnd);
  const shown = fitHead(match, EXCERPT_MAX_CHARS - 2);
  if (shown.length < match.length || matchEnd < end) {
    return `${start > 0 ? '…' : ''}${shown.join('')}…`;
  }
  const room = EXCERPT_MAX_CHARS - 2 - cost(shown);
  const beforeFrom = snap(Math.max(0, start - EXCERPT_MAX_CHARS));
  const before = displayTokens(s, beforeFrom, start);
  const afterTo = snap(Math.min(s.length, end + 2 * EXCERPT_MAX_CHARS));
  const after = displayTokens(s, end, afterTo);
  const b = fitTail(before, Math.floor(room / 3));
  const a = fitHead(after, room - cost(b));
  const lead = b.length < before.length || beforeFrom > 0 ? '…' : '';
  const trail = a.length < after.length || afterTo < s.length ? '…' : '';
  return `${lead}${b.join('')}${shown.join('')}${a.join('')}${trail}`;
}

// ---------------------------------------------------------------------------------------------------
// Text as the phrase rules read it

export interface Folded {
  /** Tag characters decoded to ASCII, invisibles dropped, NFKC + look-alikes folded, spaces collapsed. */
  text: string;
  /**
   * For each UTF-16 unit of `text`, the index of the code point in the original it came from. Built on
   * first use (only findings need it), by the full fold; `source` is what it was folded from.
   */
  readonly origin: number[];
}

/** The folded text of `s`; an ASCII-only string takes a fast path (origins are computed lazily). */
export function fold(s: string): Folded {
  if (!/[\u0080-\uffff]/.test(s)) {
    const head = s.length > SCAN_LIMITS.maxPhraseScanChars ? s.slice(0, SCAN_LIMITS.maxPhraseScanChars) : s;
    let origin: number[] | undefined;
    return {
      text: head.replace(/^\s+/, '').replace(/\s+/g, ' '),
      get origin() {
        return (origin ??= slowFold(s).origin);
      },
    };
  }
  return slowFold(s);
}

function slowFold(s: string): Folded {
  const limit = Math.min(s.length, SCAN_LIMITS.maxPhraseScanChars);
  const parts: string[] = [];
  const origin: number[] = [];
  let lastSpace = true;
  for (let i = 0; i < limit;) {
    const cp = s.codePointAt(i)!;
    const width = cp > 0xffff ? 2 : 1;
    let out: string;
    if (cp >= 0xe0020 && cp <= 0xe007e) out = String.fromCharCode(cp - 0xe0000);
    else if (isIgnorable(cp)) out = '';
    else if (cp < 0x80) out = s[i]!;
    else out = foldChar(String.fromCodePoint(cp));
    if (/^\s+$/.test(out)) out = lastSpace ? '' : ' ';
    if (out !== '') {
      lastSpace = out.endsWith(' ');
      parts.push(out);
      for (let k = 0; k < out.length; k++) origin.push(i);
    }
    i += width;
  }
  return { text: parts.join(''), origin };
}

export function originalSpan(s: string, f: Folded, index: number, length: number): [number, number] {
  const start = f.origin[index] ?? 0;
  const last = f.origin[index + length - 1] ?? start;
  return [start, last + ((s.codePointAt(last) ?? 0) > 0xffff ? 2 : 1)];
}
