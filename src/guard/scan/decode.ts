// SECURITY-CRITICAL: text a definition hides from the person reading it, recovered so the scanner's
// rules can read it too (issue 35): markup that does not render (HTML and markdown comments, hidden
// elements, zero-size or same-colour text) and embedded encodings (base64, hex, percent, \u and \x
// escapes, HTML entities, rot13). Each recovered piece is a View; the scanner re-scans views and
// reports what they say under the view's name. Pure, bounded (SCAN_LIMITS.maxDecodeCandidates per
// string, decoded text capped), deterministic.
import { SCAN_LIMITS } from './text.js';

export interface View {
  /** How the text was recovered, e.g. "base64", "HTML comment". */
  how: string;
  kind: 'markup' | 'encoding';
  text: string;
}

const MAX_VIEW_CHARS = 4000;

// ---- markup -------------------------------------------------------------------------------------------

const HIDDEN_STYLE =
  /display\s*:\s*none|visibility\s*:\s*hidden|font-size\s*:\s*0(?![.\d]*[1-9])|opacity\s*:\s*0(?![.\d]*[1-9])|color\s*:\s*(?:white|#fff(?:fff)?|transparent)\b[^"']*background(?:-color)?\s*:\s*(?:white|#fff(?:fff)?)\b|height\s*:\s*0(?![.\d]*[1-9])|left\s*:\s*-\d{3,}/i;

/** Text inside markup that a renderer hides. */
function markupViews(s: string, out: View[]): void {
  if (!/[<[]/.test(s)) return;
  for (const m of s.matchAll(/<!--([\s\S]*?)(?:-->|$)/g)) push(out, 'HTML comment', 'markup', m[1]!);
  // Markdown "comments": link reference definitions nobody links to, e.g. [//]: # (text).
  for (const m of s.matchAll(/^[ \t]*\[(?:\/\/|comment|_|#)\]:\s*(?:#|<>)?\s*[("']([^\n]*)[)"']\s*$/gim))
    push(out, 'markdown comment', 'markup', m[1]!);
  for (const m of s.matchAll(/<([a-z][a-z0-9]*)\b([^>]*)>([\s\S]*?)<\/\1\s*>/gi)) {
    const [, tag, attrs, inner] = m;
    const hidden =
      /\bhidden\b|aria-hidden\s*=\s*["']?true/i.test(attrs!) ||
      HIDDEN_STYLE.test(attrs!) ||
      tag!.toLowerCase() === 'details';
    if (hidden) push(out, `hidden <${tag!.toLowerCase()}> element`, 'markup', inner!);
  }
}

// ---- encodings ----------------------------------------------------------------------------------------

/** Mostly printable text with some letters: what an instruction decodes to (binary data does not). */
function readable(s: string): boolean {
  if (s.length < 8) return false;
  let printable = 0;
  let letters = 0;
  for (const ch of s) {
    if (/[\p{L}\p{N}\p{P}\p{Zs}\n\t~$^`|<>=+]/u.test(ch)) printable++;
    if (/\p{L}/u.test(ch)) letters++;
  }
  return printable / s.length > 0.9 && letters >= 6 && /\p{L}{2,}[\s\p{P}]+\p{L}{2,}/u.test(s);
}

function utf8(bytes: Buffer): string | undefined {
  const s = new TextDecoder('utf-8', { fatal: false }).decode(bytes);
  return s.includes('\uFFFD') ? undefined : s;
}

function encodingViews(s: string, out: View[]): void {
  let candidates = 0;
  const budget = () => candidates++ < SCAN_LIMITS.maxDecodeCandidates;
  // base64 / base64url: a long run of the alphabet (with at least one digit, capital or + / - _ mix).
  for (const m of s.matchAll(/(?<![A-Za-z0-9+/_-])[A-Za-z0-9+/_-]{16,}={0,2}/g)) {
    const run = m[0];
    if (!/[A-Z]/.test(run) || !/[a-z]/.test(run) || !budget()) continue;
    const text = utf8(Buffer.from(run.replace(/-/g, '+').replace(/_/g, '/'), 'base64'));
    if (text !== undefined && readable(text)) push(out, 'base64', 'encoding', text);
  }
  for (const m of s.matchAll(/(?<![0-9a-f])(?:[0-9a-f]{2}){12,}(?![0-9a-f])/gi)) {
    if (!budget()) break;
    const text = utf8(Buffer.from(m[0], 'hex'));
    if (text !== undefined && readable(text)) push(out, 'hex', 'encoding', text);
  }
  const escapes: Array<[string, RegExp, (m: string) => string]> = [
    ['percent-encoding', /(?:%[0-9a-f]{2}){3,}/gi, (m) => safeUri(m)],
    ['\\u escapes', /(?:\\u\{?[0-9a-f]{4,5}\}?){3,}/gi, (m) => unescapeU(m)],
    [
      '\\x escapes',
      /(?:\\x[0-9a-f]{2}){3,}/gi,
      (m) => utf8(Buffer.from(m.replace(/\\x/gi, ''), 'hex')) ?? '',
    ],
    ['HTML entities', /(?:&#x?[0-9a-f]+;|&[a-z]{2,8};){3,}/gi, (m) => unentity(m)],
  ];
  for (const [how, re, decode] of escapes) {
    if (!re.test(s)) continue;
    re.lastIndex = 0;
    const text = s.replace(re, (m) => decode(m));
    if (text !== s && budget()) push(out, how, 'encoding', text);
  }
  // rot13: only when the rotated text reads more like English than the original does.
  // (Cheap gate first: common English words as rot13 spells them.)
  if (/\b(?:gur|naq|lbh|gb|vf|guvf|gung|nyy|nal|hfre|svyr|fraq|pnyy|gbby)\b/i.test(s)) {
    const r = rot13(s);
    if (englishScore(r) > englishScore(s) + 2) push(out, 'rot13', 'encoding', r);
  }
}

function safeUri(m: string): string {
  try {
    return decodeURIComponent(m);
  } catch {
    return '';
  }
}
function unescapeU(m: string): string {
  return m.replace(/\\u\{?([0-9a-f]{4,5})\}?/gi, (_x, h: string) => {
    const cp = parseInt(h, 16);
    return cp <= 0x10ffff ? String.fromCodePoint(cp) : '';
  });
}
const NAMED: Record<string, string> = { amp: '&', lt: '<', gt: '>', quot: '"', apos: "'", nbsp: ' ' };
function unentity(m: string): string {
  return m.replace(
    /&#(x?)([0-9a-f]+);|&([a-z]{2,8});/gi,
    (_x, hexFlag: string, num: string, name: string) => {
      if (name !== undefined) return NAMED[name.toLowerCase()] ?? '';
      const cp = parseInt(num, hexFlag ? 16 : 10);
      return cp > 0 && cp <= 0x10ffff ? String.fromCodePoint(cp) : '';
    },
  );
}
export function rot13(s: string): string {
  return s.replace(/[a-z]/gi, (c) => {
    const base = c <= 'Z' ? 65 : 97;
    return String.fromCharCode(((c.charCodeAt(0) - base + 13) % 26) + base);
  });
}
const COMMON =
  /\b(?:the|and|to|you|of|is|it|in|this|that|for|with|all|any|do|not|your|user|send|call|file|tool)\b/gi;
function englishScore(s: string): number {
  return s.match(COMMON)?.length ?? 0;
}

function push(out: View[], how: string, kind: View['kind'], text: string): void {
  const t = text.trim();
  if (t.length >= 8) out.push({ how, kind, text: t.slice(0, MAX_VIEW_CHARS) });
}

/** Hidden markup and decoded encodings in `s` (one level; the scanner recurses on what it gets). */
export function hiddenViews(s: string): View[] {
  const out: View[] = [];
  const head = s.length > SCAN_LIMITS.maxPhraseScanChars ? s.slice(0, SCAN_LIMITS.maxPhraseScanChars) : s;
  markupViews(head, out);
  encodingViews(head, out);
  return out;
}
