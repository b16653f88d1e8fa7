// SECURITY-CRITICAL: the output guard. Every tools/call result from an untrusted MCP server passes through
// guardToolResult before the client (an LLM agent) sees it: known secret values, sentinels and canaries
// are redacted (also when hex, base64 or percent-encoded), then credential-shaped text; the text is cut
// to a head and a tail (the full redacted text goes to the audit spill); instruction-like text is flagged
// (never altered); and the result gets provenance metadata the server cannot forge. Pure: no I/O, no
// clock, no randomness; the only outside call is the caller's `spill`. The input is never mutated.
//
// What passes, and how:
// - text items, embedded `resource.text`/`uri`, resource_link uri/name/title/description and every string
//   value of `structuredContent`: redacted, counted against maxTextBytes, truncated, scanned for
//   instructions. Object keys of structuredContent are redacted too (not truncated; very long keys cut).
// - image/audio `data` and `resource.blob`: not altered, counted against maxBinaryBytes; an item over the
//   cap, or whose bytes hold a known value, is replaced by a text item saying so.
// - `_meta`, `annotations`, `icons`, mimeType and other small fields: strings redacted, size-capped (over
//   the cap: omitted). Every `airlock/…` key the server sent in a `_meta` is removed.
// - content items of an unknown type: passed (strings redacted) only when their JSON is at most
//   GUARD_LIMITS.maxUnknownItemBytes, else replaced by a text item; unknown top-level result fields
//   (e.g. the legacy `toolResult`) are dropped: nothing reaches the client unguarded.
// Detection of encoded values is best effort (see secrets/detect.ts); instruction flags are heuristics.
import type { CallToolResult } from '@modelcontextprotocol/sdk/types.js';
import { AirlockError } from '../core/errors.js';
import { excerptOf, SCAN_LIMITS, scanPhrases } from './scan.js';
import { Needle, prepareHaystack } from '../secrets/detect.js';
import { CREDENTIAL_PATTERNS, findCredentials } from './credentials.js';

export const PROVENANCE_META_KEY = 'airlock/provenance';

export const GUARD_LIMITS = {
  defaultMaxTextBytes: 64_000,
  defaultMaxBinaryBytes: 8 * 1024 * 1024,
  /** Known values shorter than this cannot be told from ordinary text and are not redacted. */
  minValueChars: 4,
  maxContentItems: 1000,
  maxUnknownItemBytes: 4096,
  maxMetaBytes: 16_384,
  maxJsonDepth: 64,
  maxKeyChars: 256,
  maxFindings: 100,
} as const;

export interface NamedValue {
  readonly name: string;
  readonly value: string;
}

export interface RedactOptions {
  /** Real secret values known to the broker: redacted as [REDACTED:secret:NAME]. */
  secrets: ReadonlyArray<NamedValue>;
  /** Sentinels standing in for secrets: redacted as [REDACTED:sentinel:NAME]. */
  sentinels?: ReadonlyArray<NamedValue>;
  /** Planted fake credentials: redacted as [REDACTED:canary:NAME], with a high-severity finding. */
  canaries: ReadonlyArray<NamedValue>;
  /** Redact credential shapes (credentials.ts) as [REDACTED:credential:ID]. Default true. */
  redactCredentialPatterns?: boolean;
  /** Flag instruction-like text (hidden instructions, secrecy toward the user). Default true. */
  flagInstructions?: boolean;
}

export interface GuardProvenance {
  server: string;
  tool: string;
  sandboxId?: string;
  callId?: string;
}

/** How tool results are shaped before the model sees them: size cap, redaction. */
export interface GuardOptions extends RedactOptions {
  /** UTF-8 bytes of all text of one result together (the truncation marker included). Default 64_000. */
  maxTextBytes?: number;
  /** Base64 characters of all image/audio data and resource blobs of one result. Default 8 MiB. */
  maxBinaryBytes?: number;
  provenance: GuardProvenance;
  /**
   * Called once, only when the text is truncated, with the full redacted text (one text item: that text;
   * several: each after a `--- <location> ---` line). Returns a reference (spill id or path) for the
   * marker and the metadata. Errors propagate: the caller decides whether the call fails.
   */
  spill?: (fullText: string) => string | undefined;
}

export type RedactionKind = 'secret' | 'sentinel' | 'canary' | 'credential';
export type GuardRuleId =
  'canary-in-output' | 'secret-in-output' | 'credential-in-output' | 'instruction-in-output';

export interface GuardFinding {
  ruleId: GuardRuleId;
  severity: 'high' | 'medium' | 'low';
  /** Where in the server's result, e.g. `content[0].text` or `structuredContent.items[2].name`. */
  location: string;
  /** At most 120 characters of the redacted text around the redaction or phrase. */
  excerpt: string;
  message: string;
}

export interface Redaction {
  kind: RedactionKind;
  /** The secret, sentinel or canary name, or the credential pattern id. */
  label: string;
  count: number;
}

/** What the output guard did to a result: truncation, redactions. */
export interface GuardReport {
  truncated: boolean;
  /** UTF-8 bytes of the server's text (every guarded text field) before redaction. */
  originalTextBytes: number;
  /** UTF-8 bytes of that text as passed on (after redaction and truncation, the marker included). */
  keptTextBytes: number;
  redactions: Redaction[];
  findings: GuardFinding[];
  /** Parts removed or replaced by a marker (binary over the cap, unknown item types, oversized metadata). */
  dropped: Array<{ location: string; reason: string }>;
  spillRef?: string;
}

export interface ProvenanceMeta {
  server: string;
  tool: string;
  sandboxId?: string;
  callId?: string;
  truncated: boolean;
  redacted: boolean;
  /** Number of values redacted. */
  redactions: number;
  /** Instruction-like text was found (and left in place). */
  flagged: boolean;
  spillRef?: string;
}

// ---------------------------------------------------------------------------------------------------
// Redaction of one string

const escapeRegExp = (s: string): string => s.replace(/[.*+?^${}()|[\]\\/-]/g, '\\$&');
export const utf8Bytes = (s: string): number => Buffer.byteLength(s, 'utf8');

/** The value with every character also allowed percent-encoded (up to three times, any hex case). */
function spelledPattern(value: string): string {
  let src = '';
  for (const ch of value) {
    const encoded = [...Buffer.from(ch, 'utf8')]
      .map((b) => `%(?:25){0,2}${b.toString(16).padStart(2, '0')}`)
      .join('');
    src += `(?:${escapeRegExp(ch)}|${encoded}${ch === ' ' ? '|\\+' : ''})`;
  }
  return src;
}

/** Same cores as Needle: base64 of the value at each byte alignment, only the groups it fully decides. */
function base64Cores(value: string): string[] {
  const bytes = Buffer.from(value, 'utf8');
  const cores = [0, 1, 2]
    .map((o) => {
      const b64 = Buffer.concat([Buffer.alloc(o), bytes]).toString('base64');
      return b64.slice(Math.ceil(o / 3) * 4, Math.floor((o + bytes.length) / 3) * 4);
    })
    .filter((c) => c.length >= 8);
  return [...new Set([...cores, ...cores.map((c) => c.replace(/\+/g, '-').replace(/\//g, '_'))])];
}

const isBase64Char = (c: number): boolean =>
  (c >= 0x30 && c <= 0x39) ||
  (c >= 0x41 && c <= 0x5a) ||
  (c >= 0x61 && c <= 0x7a) ||
  c === 0x2b ||
  c === 0x2f ||
  c === 0x2d ||
  c === 0x5f;

interface Span {
  start: number;
  end: number;
  marker: string;
}

/** s with each span (any order; overlapping ones merge into the first) replaced by its marker, in one pass. */
function splice(s: string, spans: Span[]): string {
  const parts: string[] = [];
  let at = 0;
  for (const { start, end, marker } of [...spans].sort((a, b) => a.start - b.start)) {
    if (end <= at) continue;
    parts.push(s.slice(at, Math.max(at, start)), start < at ? '' : marker);
    at = end;
  }
  parts.push(s.slice(at));
  return parts.join('');
}

interface Known {
  kind: 'secret' | 'sentinel' | 'canary';
  name: string;
  marker: string;
  lower: string;
  /** Non-global, for a quick test of the original text. */
  probe: RegExp;
  spelled: RegExp;
  hex: RegExp;
  base64: string[];
  needle: Needle;
}

interface Hit {
  kind: RedactionKind;
  label: string;
  count: number;
  encoded: boolean;
  whole: boolean;
}

const RULE: Record<RedactionKind, { ruleId: GuardRuleId; severity: GuardFinding['severity'] }> = {
  canary: { ruleId: 'canary-in-output', severity: 'high' },
  secret: { ruleId: 'secret-in-output', severity: 'high' },
  sentinel: { ruleId: 'secret-in-output', severity: 'low' },
  credential: { ruleId: 'credential-in-output', severity: 'medium' },
};
const SEVERITY_RANK = { high: 3, medium: 2, low: 1 } as const;
const KIND_ORDER: RedactionKind[] = ['canary', 'secret', 'sentinel', 'credential'];
const DESCRIPTIONS = new Map(CREDENTIAL_PATTERNS.map((p) => [p.id, p.description]));

/** Counts and findings of one guard run. */
class Tally {
  readonly redactions = new Map<string, Redaction>();
  readonly findings = new Map<string, GuardFinding>();

  record(h: Hit, text: string, location: string): void {
    const key = `${h.kind}:${h.label}`;
    const r = this.redactions.get(key);
    if (r) r.count += h.count;
    else this.redactions.set(key, { kind: h.kind, label: h.label, count: h.count });
    let at = text.indexOf(`[REDACTED:${key}]`);
    if (at < 0) at = text.indexOf(`[REDACTED:${key}:`);
    const end = at < 0 ? -1 : text.indexOf(']', at);
    const how = `${h.count}×${h.encoded ? ', encoded' : ''}${h.whole ? '; the whole text was withheld' : ''}`;
    const what = {
      canary: `Canary ${h.label} (a planted fake credential) appeared in the output`,
      secret: `The real value of secret ${h.label} appeared in the output`,
      sentinel: `The sentinel standing in for secret ${h.label} appeared in the output`,
      credential: `Credential-shaped text (${DESCRIPTIONS.get(h.label) ?? h.label}) in the output`,
    }[h.kind];
    this.add(`${location}\0${key}`, {
      ...RULE[h.kind],
      location,
      excerpt: at < 0 ? '' : excerptOf(text, at, end < 0 ? text.length : end + 1),
      message: `${what} (${how}); redacted`,
    });
  }

  add(key: string, f: GuardFinding): void {
    if (!this.findings.has(key)) this.findings.set(key, f);
  }

  sortedRedactions(): Redaction[] {
    return [...this.redactions.values()].sort(
      (a, b) => KIND_ORDER.indexOf(a.kind) - KIND_ORDER.indexOf(b.kind) || (a.label < b.label ? -1 : 1),
    );
  }

  sortedFindings(): GuardFinding[] {
    return [...this.findings.values()]
      .sort((a, b) => SEVERITY_RANK[b.severity] - SEVERITY_RANK[a.severity])
      .slice(0, GUARD_LIMITS.maxFindings);
  }

  total(): number {
    let n = 0;
    for (const r of this.redactions.values()) n += r.count;
    return n;
  }
}

export class Redactor {
  readonly known: Known[];
  readonly #credentials: boolean;
  /** Whether credential shapes are redacted. */
  readonly credentials: boolean;
  readonly #markers: ReadonlySet<string>;
  readonly tally = new Tally();

  constructor(opts: RedactOptions) {
    const seen = new Set<string>();
    const known: Known[] = [];
    const add = (kind: Known['kind'], list: ReadonlyArray<NamedValue> | undefined) => {
      for (const { name, value } of list ?? []) {
        if (typeof value !== 'string' || value.length < GUARD_LIMITS.minValueChars || seen.has(value))
          continue;
        seen.add(value);
        const src = spelledPattern(value);
        known.push({
          kind,
          name: String(name),
          marker: `[REDACTED:${kind}:${String(name)}]`,
          lower: value.toLowerCase(),
          probe: new RegExp(src, 'i'),
          spelled: new RegExp(src, 'gi'),
          hex: new RegExp(Buffer.from(value, 'utf8').toString('hex'), 'gi'),
          base64: base64Cores(value),
          needle: new Needle(value),
        });
      }
    };
    add('canary', opts.canaries);
    add('secret', opts.secrets);
    add('sentinel', opts.sentinels);
    // Longest first, so a value containing another is redacted whole.
    this.known = known.sort((a, b) => b.lower.length - a.lower.length);
    this.#credentials = opts.redactCredentialPatterns !== false;
    this.credentials = this.#credentials;
    this.#markers = new Set(known.map((k) => k.marker));
  }

  /** Whether `s` is exactly one of this redactor's markers (it holds nothing more). */
  isMarker(s: string): boolean {
    return this.#markers.has(s);
  }

  /** The known values whose needle is in `s` (raw, hex, base64, percent-encoded). */
  knownIn(s: string): Known[] {
    if (this.known.length === 0) return [];
    const hay = prepareHaystack(Buffer.from(s, 'utf8'));
    return this.known.filter((k) => k.needle.foundIn(hay));
  }

  /**
   * `s` with every known value and credential replaced; counts and findings recorded at `location`.
   * Also after normalising: a value broken up by invisible characters (soft hyphen, zero-width, tag
   * characters, variation selectors) or spelled in compatibility forms (full-width letters) is found in
   * the normalised text, which is then what passes (redacted); text with no hit keeps its own spelling.
   */
  redact(s: string, location: string): string {
    const plain = this.#redact(s, location);
    const norm = normalizeForRedaction(plain);
    if (norm === plain) return plain;
    const again = this.#redact(norm, location);
    return again === norm ? plain : again;
  }

  #redact(s: string, location: string): string {
    let text = s;
    const hits: Hit[] = [];
    const found = new Set(this.knownIn(s));
    for (const k of this.known) {
      if (!found.has(k) && !k.probe.test(s)) continue;
      const r = redactKnown(text, k);
      text = r.text;
      if (r.hit.count > 0) hits.push(r.hit);
    }
    if (this.#credentials) {
      // A match that is exactly one of our markers (a URL password already redacted) holds nothing more.
      const matches = findCredentials(text).filter((m) => !this.#markers.has(text.slice(m.start, m.end)));
      if (matches.length > 0) {
        const counts = new Map<string, number>();
        for (const m of matches) counts.set(m.patternId, (counts.get(m.patternId) ?? 0) + 1);
        text = splice(
          text,
          matches.map((m) => ({ ...m, marker: `[REDACTED:credential:${m.patternId}]` })),
        );
        for (const [label, count] of counts)
          hits.push({ kind: 'credential', label, count, encoded: false, whole: false });
      }
    }
    for (const h of hits) this.tally.record(h, text, location);
    return text;
  }
}

/**
 * Characters that render as nothing (or as a line-break hint) and so can split a value without the
 * reader seeing it: soft hyphen, combining grapheme joiner, Arabic letter mark, Hangul fillers, Mongolian
 * vowel separator, zero-width and bidi controls, word joiner and invisible operators, BOM, variation
 * selectors, tag characters.
 */
const INVISIBLE_RANGES: ReadonlyArray<readonly [number, number]> = [
  [0x00ad, 0x00ad],
  [0x034f, 0x034f],
  [0x061c, 0x061c],
  [0x115f, 0x1160],
  [0x17b4, 0x17b5],
  [0x180b, 0x180f],
  [0x200b, 0x200f],
  [0x202a, 0x202e],
  [0x2060, 0x206f],
  [0x3164, 0x3164],
  [0xfe00, 0xfe0f],
  [0xfeff, 0xfeff],
  [0xffa0, 0xffa0],
  [0xe0000, 0xe007f],
  [0xe0100, 0xe01ef],
];

const isInvisible = (cp: number): boolean => INVISIBLE_RANGES.some(([a, b]) => cp >= a && cp <= b);

/** `s` without invisible characters, in NFKC (full-width and other compatibility forms folded). */
export function normalizeForRedaction(s: string): string {
  // eslint-disable-next-line no-control-regex
  if (/^[\x00-\x7f]*$/.test(s)) return s;
  let out = '';
  for (const ch of s) if (!isInvisible(ch.codePointAt(0)!)) out += ch;
  return out.normalize('NFKC');
}

/**
 * Known values and credential shapes that only show when several guarded texts are read together (a
 * value split over two content items), also after normalising; each is recorded at `location`.
 * Returns the markers to show in place of all the text (empty: nothing found).
 */
export function splitHits(redactor: Redactor, texts: readonly string[], location: string): string[] {
  if (texts.length < 2) return [];
  const joined = texts.join('');
  const norm = normalizeForRedaction(joined);
  const known = new Set([...redactor.knownIn(joined), ...redactor.knownIn(norm)]);
  const markers: string[] = [];
  for (const k of known) {
    const marker = `[REDACTED:${k.kind}:${k.name}: found split across text fields]`;
    redactor.tally.record(
      { kind: k.kind, label: k.name, count: 1, encoded: true, whole: true },
      marker,
      location,
    );
    markers.push(marker);
  }
  if (redactor.credentials) {
    // The texts were redacted one by one already: a shape that matches now crosses a boundary.
    const shapes = (t: string): string[] =>
      findCredentials(t)
        .filter((m) => !redactor.isMarker(t.slice(m.start, m.end)))
        .map((m) => m.patternId);
    const labels = new Set([...shapes(joined), ...(norm === joined ? [] : shapes(norm))]);
    for (const label of labels) {
      const marker = `[REDACTED:credential:${label}: found split across text fields]`;
      const hit = { kind: 'credential' as const, label, count: 1, encoded: false, whole: true };
      redactor.tally.record(hit, marker, location);
      markers.push(marker);
    }
  }
  return markers;
}

const BASE64 = /^[A-Za-z0-9+/\s]*={0,2}\s*$/;
const BASE64URL = /^[A-Za-z0-9_\-\s]*={0,2}\s*$/;
/** Decoded bytes that read as text: valid UTF-8 without control characters other than whitespace. */
function asText(bytes: Buffer): string | undefined {
  try {
    const t = new TextDecoder('utf-8', { fatal: true }).decode(bytes);
    // eslint-disable-next-line no-control-regex
    return /[\x00-\x08\x0e-\x1f\x7f]/.test(t) ? undefined : t;
  } catch {
    return undefined;
  }
}

/**
 * Base64 data (a resource blob, image or audio data) from an untrusted server: decoded; text is redacted
 * like any text and re-encoded when something was redacted; binary that holds a known value or a
 * credential shape is withheld (bytes cannot be redacted in place without corrupting the format).
 * Known values in the base64 spelling itself are caught as well.
 */
export function guardBase64(
  redactor: Redactor,
  data: string,
  location: string,
): { data: string } | { reason: string } {
  const url = !BASE64.test(data) && BASE64URL.test(data);
  const bytes = BASE64.test(data) || url ? Buffer.from(data, url ? 'base64url' : 'base64') : undefined;
  const text = bytes && asText(bytes);
  if (text !== undefined) {
    const out = redactor.redact(text, `${location} (decoded)`);
    return out === text
      ? { data }
      : { data: Buffer.from(out, 'utf8').toString(url ? 'base64url' : 'base64') };
  }
  const latin1 = bytes?.toString('latin1') ?? '';
  const hits = new Set([...redactor.knownIn(data), ...(bytes ? redactor.knownIn(latin1) : [])]);
  const shapes = redactor.credentials ? findCredentials(latin1) : [];
  for (const k of hits) {
    const marker = `[REDACTED:${k.kind}:${k.name}: found in binary data; the item was withheld]`;
    redactor.tally.record(
      { kind: k.kind, label: k.name, count: 1, encoded: true, whole: true },
      marker,
      location,
    );
  }
  for (const label of new Set(shapes.map((m) => m.patternId))) {
    const marker = `[REDACTED:credential:${label}: found in binary data; the item was withheld]`;
    redactor.tally.record(
      { kind: 'credential', label, count: 1, encoded: true, whole: true },
      marker,
      location,
    );
  }
  if (hits.size === 0 && shapes.length === 0) return { data };
  const what = [
    ...[...hits].map((k) => `[REDACTED:${k.kind}:${k.name}]`),
    ...[...new Set(shapes.map((m) => `[REDACTED:credential:${m.patternId}]`))],
  ];
  return { reason: `holds ${what.join(', ')}` };
}

function redactKnown(input: string, k: Known): { text: string; hit: Hit } {
  let raw = 0;
  let encoded = 0;
  let text = input.replace(k.spelled, (m) => {
    if (m.toLowerCase() === k.lower) raw++;
    else encoded++;
    return k.marker;
  });
  text = text.replace(k.hex, () => {
    encoded++;
    return k.marker;
  });
  // Base64 cannot be spliced at the value's edges: the whole base64 run that holds it goes.
  const spans: Span[] = [];
  for (const core of k.base64) {
    for (let at = text.indexOf(core); at >= 0;) {
      let start = at;
      let end = at + core.length;
      while (start > 0 && isBase64Char(text.charCodeAt(start - 1))) start--;
      while (end < text.length && isBase64Char(text.charCodeAt(end))) end++;
      while (end < text.length && text[end] === '=') end++;
      spans.push({ start, end, marker: k.marker });
      encoded++;
      at = text.indexOf(core, end);
    }
  }
  if (spans.length > 0) text = splice(text, spans);
  let whole = false;
  // Still there (wrapped base64, encodings nested in ways no splice can undo): withhold the whole text.
  if (k.needle.foundIn(prepareHaystack(Buffer.from(text, 'utf8')))) {
    text = `[REDACTED:${k.kind}:${k.name}: found in an encoded form; the whole text (${utf8Bytes(input)} bytes) was withheld]`;
    whole = true;
    encoded = Math.max(encoded, 1);
  }
  return { text, hit: { kind: k.kind, label: k.name, count: raw + encoded, encoded: encoded > 0, whole } };
}

// ---------------------------------------------------------------------------------------------------
// Instruction-like text

/** scanPhrases' hidden-instruction and secrecy findings over the whole text, window by window. */
export function instructionFindings(text: string, location: string): GuardFinding[] {
  const window = SCAN_LIMITS.maxPhraseScanChars;
  const overlap = 1000;
  const out: GuardFinding[] = [];
  const seen = new Set<string>();
  for (let from = 0; from < text.length || from === 0; from += window - overlap) {
    const start = from > 0 && /[\uDC00-\uDFFF]/.test(text[from] ?? '') ? from + 1 : from;
    for (const f of scanPhrases(text.slice(start, start + window), location)) {
      if ((f.ruleId !== 'hidden-instruction' && f.ruleId !== 'secrecy') || seen.has(f.ruleId)) continue;
      seen.add(f.ruleId);
      out.push({
        ruleId: 'instruction-in-output',
        severity: 'medium',
        location,
        excerpt: f.excerpt,
        message: f.message,
      });
    }
    if (start + window >= text.length || seen.size === 2) break;
  }
  return out;
}

/**
 * Redact one text outside a tool result (a prompt, a resource read): known values, sentinels, canaries
 * and credential shapes, then flag instruction-like text. Nothing is truncated.
 */
export function redactText(
  text: string,
  opts: RedactOptions,
  location = 'text',
): { text: string; redactions: Redaction[]; findings: GuardFinding[] } {
  const r = new Redactor(opts);
  const out = r.redact(text, location);
  if (opts.flagInstructions !== false) {
    instructionFindings(out, location).forEach((f, i) => r.tally.add(`${location}\0instruction${i}`, f));
  }
  return { text: out, redactions: r.tally.sortedRedactions(), findings: r.tally.sortedFindings() };
}

// ---------------------------------------------------------------------------------------------------
// Walking a result

export interface Slot {
  readonly location: string;
  /** Index of the content item it belongs to (undefined for structuredContent). */
  readonly item: number | undefined;
  text: string;
  readonly put: (text: string) => void;
  /** Entirely inside the truncated middle. */
  gone: boolean;
}

export const isRecord = (v: unknown): v is Record<string, unknown> =>
  typeof v === 'object' && v !== null && !Array.isArray(v);

export const segment = (key: string): string =>
  /^[A-Za-z_$][\w$]*$/.test(key) ? `.${key}` : `[${JSON.stringify(key)}]`;

export function setOwn(o: Record<string, unknown>, key: string, value: unknown): void {
  Object.defineProperty(o, key, { value, writable: true, enumerable: true, configurable: true });
}

/** Whether the JSON size of `v` (strings included when asked) stays within `max` bytes. Stops early. */
function fitsJson(v: unknown, max: number, countStrings: boolean): boolean {
  let left = max;
  const visit = (x: unknown, depth: number): boolean => {
    if (typeof x === 'string') left -= 2 + (countStrings ? utf8Bytes(x) : 0);
    else if (typeof x !== 'object' || x === null) left -= String(x).length + 1;
    else if (depth > GUARD_LIMITS.maxJsonDepth) left -= 64;
    else {
      left -= 2;
      for (const [k, c] of Object.entries(x)) {
        left -= (Array.isArray(x) ? 0 : Math.min(k.length, GUARD_LIMITS.maxKeyChars) + 4) + 1;
        if (left < 0 || !visit(c, depth + 1)) return false;
      }
    }
    return left >= 0;
  };
  return visit(v, 0);
}

/** What a JSON copy does at each string and object (see copyJson). */
export interface JsonCopyHooks {
  /** Each string value, with the setter for its place in the copy and the object key it is under. */
  onString(s: string, location: string, put: (s: string) => void, key: string | undefined): void;
  /** True: leave this key out of the copy (e.g. `airlock/…` keys of a `_meta`). */
  dropKey?(key: string, location: string, depth: number): boolean;
  /**
   * Take over an object before its keys are copied: `{ value }` replaces it, `{ verbatim }` sets those
   * keys as given (not walked, not redacted); undefined copies it normally.
   */
  object?(
    src: Record<string, unknown>,
    location: string,
    depth: number,
  ): { value: unknown } | { verbatim: Record<string, unknown> } | undefined;
}

/**
 * The one walk over an untrusted JSON tree (tool results and every other server message): a copy of
 * `v` in which each string goes to `hooks.onString`, keys are redacted and cut to maxKeyChars (clashes
 * numbered), and nesting beyond GUARD_LIMITS.maxJsonDepth is replaced (and listed in `dropped`).
 */
export function copyJson(
  v: unknown,
  location: string,
  redactor: Redactor,
  dropped: Array<{ location: string; reason: string }>,
  hooks: JsonCopyHooks,
  depth = 0,
): unknown {
  if (typeof v === 'string') {
    let out = v;
    hooks.onString(v, location, (s) => (out = s), undefined);
    return out;
  }
  if (typeof v === 'number' || typeof v === 'boolean' || v === null) return v;
  if (typeof v !== 'object') return null;
  if (depth >= GUARD_LIMITS.maxJsonDepth) {
    dropped.push({ location, reason: `nested deeper than ${GUARD_LIMITS.maxJsonDepth} levels` });
    return `[airlock: nested deeper than ${GUARD_LIMITS.maxJsonDepth} levels; dropped]`;
  }
  if (Array.isArray(v)) {
    const arr: unknown[] = [];
    v.forEach((x, i) => {
      const at = `${location}[${i}]`;
      if (typeof x === 'string') hooks.onString(x, at, (s) => (arr[i] = s), undefined);
      else arr[i] = copyJson(x, at, redactor, dropped, hooks, depth + 1);
    });
    return arr;
  }
  const src = v as Record<string, unknown>;
  const taken = hooks.object?.(src, location, depth);
  if (taken !== undefined && 'value' in taken) return taken.value;
  const verbatim = taken?.verbatim ?? {};
  const obj: Record<string, unknown> = {};
  for (const [rawKey, x] of Object.entries(src)) {
    if (hooks.dropKey?.(rawKey, location, depth)) continue;
    if (Object.hasOwn(verbatim, rawKey)) {
      setOwn(obj, rawKey, verbatim[rawKey]);
      continue;
    }
    let key = redactor.redact(rawKey, `${location} (a key)`);
    if (key.length > GUARD_LIMITS.maxKeyChars) key = `${key.slice(0, GUARD_LIMITS.maxKeyChars)}…`;
    for (let n = 2; Object.hasOwn(obj, key); n++) key = `${key.replace(/ #\d+$/, '')} #${n}`;
    const at = location + segment(key);
    const k = key;
    if (typeof x === 'string') hooks.onString(x, at, (s) => setOwn(obj, k, s), rawKey);
    else if (x !== undefined) setOwn(obj, k, copyJson(x, at, redactor, dropped, hooks, depth + 1));
  }
  return obj;
}

class ResultWalker {
  readonly slots: Slot[] = [];
  readonly dropped: Array<{ location: string; reason: string }> = [];
  #binaryLeft: number;

  constructor(
    readonly redactor: Redactor,
    readonly maxBinaryBytes: number,
  ) {
    this.#binaryLeft = maxBinaryBytes;
  }

  slot(location: string, item: number | undefined, text: string, put: (text: string) => void): void {
    put(text);
    this.slots.push({ location, item, text, put, gone: false });
  }

  /** Small server-supplied JSON (metadata, annotations, unknown items): strings redacted, or omitted. */
  aux(v: unknown, location: string, maxBytes: number, meta = false): unknown {
    if (v === undefined) return undefined;
    if (!fitsJson(v, maxBytes, true)) {
      this.dropped.push({ location, reason: `larger than ${maxBytes} bytes` });
      return undefined;
    }
    return copyJson(v, location, this.redactor, this.dropped, {
      onString: (s, at, put) => put(this.redactor.redact(s, at)),
      dropKey: (key, _at, depth) => meta && depth === 0 && key.startsWith('airlock/'),
    });
  }

  /** Known fields of a content item that are not guarded text: annotations, _meta. */
  extras(item: Record<string, unknown>, location: string): Record<string, unknown> {
    const out: Record<string, unknown> = {};
    const annotations = this.aux(
      item.annotations,
      `${location}.annotations`,
      GUARD_LIMITS.maxUnknownItemBytes,
    );
    if (annotations !== undefined) out.annotations = annotations;
    const meta = this.aux(item._meta, `${location}._meta`, GUARD_LIMITS.maxMetaBytes, true);
    if (meta !== undefined) out._meta = meta;
    return out;
  }

  /** The base64 `data` as it may pass (text inside redacted), or the reason it may not (findings recorded). */
  binaryVerdict(data: unknown, location: string): { data: string } | { reason: string } {
    if (typeof data !== 'string') return { reason: 'not a base64 string' };
    if (data.length > this.#binaryLeft)
      return { reason: `binary output over the ${this.maxBinaryBytes}-byte cap` };
    this.#binaryLeft -= data.length;
    return guardBase64(this.redactor, data, location);
  }

  withheld(location: string, what: string, reason: string): { type: 'text'; text: string } {
    this.dropped.push({ location, reason });
    return { type: 'text', text: `[airlock: ${what} at ${location} withheld: ${reason}]` };
  }

  contentItem(item: unknown, i: number): unknown {
    const loc = `content[${i}]`;
    const str = (v: unknown): v is string => typeof v === 'string';
    if (!isRecord(item)) return this.withheld(loc, 'content item', 'not an object');
    const redactAux = (v: unknown, at: string) => (str(v) ? this.redactor.redact(v, at) : undefined);
    switch (item.type) {
      case 'text': {
        if (!str(item.text)) break;
        const o: Record<string, unknown> = { type: 'text', text: '' };
        this.slot(`${loc}.text`, i, item.text, (s) => (o.text = s));
        return Object.assign(o, this.extras(item, loc));
      }
      case 'image':
      case 'audio': {
        const v = this.binaryVerdict(item.data, `${loc}.data`);
        if ('reason' in v) return this.withheld(loc, `${item.type} item`, v.reason);
        const o: Record<string, unknown> = { type: item.type, data: v.data };
        o.mimeType = redactAux(item.mimeType, `${loc}.mimeType`) ?? 'application/octet-stream';
        return Object.assign(o, this.extras(item, loc));
      }
      case 'resource': {
        const r = item.resource;
        if (!isRecord(r) || !str(r.uri) || (!str(r.text) && !str(r.blob))) break;
        const blobVerdict = str(r.text) ? undefined : this.binaryVerdict(r.blob, `${loc}.resource.blob`);
        if (blobVerdict && 'reason' in blobVerdict)
          return this.withheld(loc, 'embedded resource', blobVerdict.reason);
        const res: Record<string, unknown> = {};
        this.slot(`${loc}.resource.uri`, i, r.uri, (s) => (res.uri = s));
        if (str(r.mimeType)) res.mimeType = redactAux(r.mimeType, `${loc}.resource.mimeType`);
        if (str(r.text)) this.slot(`${loc}.resource.text`, i, r.text, (s) => (res.text = s));
        else res.blob = blobVerdict?.data;
        const meta = this.aux(r._meta, `${loc}.resource._meta`, GUARD_LIMITS.maxMetaBytes, true);
        if (meta !== undefined) res._meta = meta;
        return Object.assign({ type: 'resource', resource: res }, this.extras(item, loc));
      }
      case 'resource_link': {
        if (!str(item.uri) || !str(item.name)) break;
        const o: Record<string, unknown> = { type: 'resource_link' };
        for (const field of ['uri', 'name', 'title', 'description'] as const) {
          const v = item[field];
          if (str(v)) this.slot(`${loc}.${field}`, i, v, (s) => (o[field] = s));
        }
        if (str(item.mimeType)) o.mimeType = redactAux(item.mimeType, `${loc}.mimeType`);
        if (typeof item.size === 'number') o.size = item.size;
        const icons = this.aux(item.icons, `${loc}.icons`, GUARD_LIMITS.maxMetaBytes);
        if (icons !== undefined) o.icons = icons;
        return Object.assign(o, this.extras(item, loc));
      }
    }
    // An unknown type, or a known type with malformed fields: small ones pass with strings redacted.
    const max = GUARD_LIMITS.maxUnknownItemBytes;
    if (fitsJson(item, max, true)) return this.aux(item, loc, max);
    const type = typeof item.type === 'string' && /^[\w-]{1,40}$/.test(item.type) ? item.type : 'unknown';
    return this.withheld(loc, `content item of type ${type}`, `larger than ${max} bytes`);
  }
}

// ---------------------------------------------------------------------------------------------------
// Truncation

/** Code units of the longest prefix of s whose UTF-8 fits in maxBytes; never splits a surrogate pair. */
function prefixWithin(s: string, maxBytes: number): number {
  let bytes = 0;
  let i = 0;
  while (i < s.length) {
    const c = s.charCodeAt(i);
    const pair = c >= 0xd800 && c <= 0xdbff && /[\uDC00-\uDFFF]/.test(s[i + 1] ?? '');
    const n = pair ? 4 : c < 0x80 ? 1 : c < 0x800 ? 2 : 3;
    if (bytes + n > maxBytes) break;
    bytes += n;
    i += pair ? 2 : 1;
  }
  return i;
}

/** Start of the longest suffix of s whose UTF-8 fits in maxBytes; never splits a surrogate pair. */
function suffixWithin(s: string, maxBytes: number): number {
  let bytes = 0;
  let j = s.length;
  while (j > 0) {
    const c = s.charCodeAt(j - 1);
    const pair = c >= 0xdc00 && c <= 0xdfff && j >= 2 && /[\uD800-\uDBFF]/.test(s[j - 2]!);
    const n = pair ? 4 : c < 0x80 ? 1 : c < 0x800 ? 2 : 3;
    if (bytes + n > maxBytes) break;
    bytes += n;
    j -= pair ? 2 : 1;
  }
  return j;
}

function truncationMarker(bytes: number, ref: string | undefined): string {
  const where = ref === undefined ? '' : `; full output kept in audit spill ${ref}`;
  return `\n…[airlock: ${bytes} bytes truncated${where}]…\n`;
}

/** Keep the first and last bytes of the slots taken as one stream; the marker goes where the cut starts. */
export function truncate(slots: Slot[], total: number, maxBytes: number, ref: string | undefined): void {
  // The count in the marker is at most `total`, so a marker for `total` is never shorter than the real one.
  const budget = Math.max(0, maxBytes - utf8Bytes(truncationMarker(total, ref)));
  const head = Math.floor(budget / 2);
  const tailFrom = total - (budget - head);
  const cuts: Array<{ slot: Slot; pre: number; post: number }> = [];
  let kept = 0;
  let pos = 0;
  for (const slot of slots) {
    const len = utf8Bytes(slot.text);
    const a = pos;
    pos += len;
    if (pos <= head || a >= tailFrom) {
      kept += len;
      continue;
    }
    const pre = prefixWithin(slot.text, Math.max(0, head - a));
    const post = suffixWithin(slot.text, Math.max(0, pos - tailFrom));
    kept += utf8Bytes(slot.text.slice(0, pre)) + utf8Bytes(slot.text.slice(post));
    cuts.push({ slot, pre, post });
  }
  const marker = truncationMarker(total - kept, ref);
  cuts.forEach(({ slot, pre, post }, i) => {
    slot.text = slot.text.slice(0, pre) + (i === 0 ? marker : '') + slot.text.slice(post);
    slot.gone = i > 0 && slot.text === '';
    slot.put(slot.text);
  });
}

// ---------------------------------------------------------------------------------------------------
// The guard

export function checkBytes(v: number | undefined, fallback: number, field: string): number {
  if (v === undefined) return fallback;
  if (!Number.isSafeInteger(v) || v < 0) {
    throw new AirlockError('INVALID_ARGUMENT', `${field} must be a non-negative integer`, { field });
  }
  return v;
}

/**
 * Guard one tools/call result from an untrusted server (see the file header for what happens to each
 * part). Returns a new result with `_meta['airlock/provenance']` set, and a report for the audit log.
 * Finding locations index the server's result (items removed by truncation shift later indices).
 */
export function guardToolResult(
  result: CallToolResult,
  opts: GuardOptions,
): { result: CallToolResult; report: GuardReport } {
  const maxText = checkBytes(opts.maxTextBytes, GUARD_LIMITS.defaultMaxTextBytes, 'maxTextBytes');
  const maxBinary = checkBytes(opts.maxBinaryBytes, GUARD_LIMITS.defaultMaxBinaryBytes, 'maxBinaryBytes');
  const redactor = new Redactor(opts);
  const w = new ResultWalker(redactor, maxBinary);
  const input: Record<string, unknown> = isRecord(result) ? result : {};

  // 1. Copy the result, collecting every guarded text field as a slot.
  const items = Array.isArray(input.content) ? input.content : [];
  const content: unknown[] = items
    .slice(0, GUARD_LIMITS.maxContentItems)
    .map((item: unknown, i) => w.contentItem(item, i));
  if (items.length > GUARD_LIMITS.maxContentItems) {
    const extra = items.length - GUARD_LIMITS.maxContentItems;
    content.push(
      w.withheld(
        `content[${GUARD_LIMITS.maxContentItems}…]`,
        `${extra} more content items`,
        'too many items',
      ),
    );
  }
  const out: Record<string, unknown> = { content };
  const sc = input.structuredContent;
  if (isRecord(sc)) {
    if (fitsJson(sc, maxText, false)) {
      const slot = (s: string, at: string, put: (s: string) => void) => w.slot(at, undefined, s, put);
      out.structuredContent = copyJson(sc, 'structuredContent', w.redactor, w.dropped, { onString: slot });
    } else {
      content.push(
        w.withheld('structuredContent', 'structuredContent', `its structure is over ${maxText} bytes`),
      );
    }
  }
  if (typeof input.isError === 'boolean') out.isError = input.isError;

  // 2. Redact each text field, then what only shows when fields are read together (a value split in two).
  let originalTextBytes = 0;
  for (const s of w.slots) {
    originalTextBytes += utf8Bytes(s.text);
    s.text = redactor.redact(s.text, s.location);
    s.put(s.text);
  }
  const split = splitHits(
    redactor,
    w.slots.map((s) => s.text),
    'content',
  );
  if (split.length > 0) {
    w.slots.forEach((s, i) => {
      s.text = i === 0 ? `${split.join(' ')} [airlock: all text was withheld]` : '';
      s.put(s.text);
    });
  }

  // 3. Truncate: head and tail of all text as one stream; the spill gets the full redacted text.
  const total = w.slots.reduce((n, s) => n + utf8Bytes(s.text), 0);
  let spillRef: string | undefined;
  if (total > maxText) {
    if (opts.spill) {
      const full =
        w.slots.length === 1
          ? w.slots[0]!.text
          : w.slots.map((s) => `--- ${s.location} ---\n${s.text}`).join('\n');
      spillRef = opts.spill(full);
    }
    truncate(w.slots, total, maxText, spillRef);
  }
  const goneItems = new Set<number>();
  for (const s of w.slots) if (s.item !== undefined && s.gone) goneItems.add(s.item);
  for (const s of w.slots) if (s.item !== undefined && !s.gone) goneItems.delete(s.item);
  out.content = content.filter((_, i) => !goneItems.has(i));

  // 4. Flag instruction-like text the client will see.
  let flagged = false;
  if (opts.flagInstructions !== false) {
    for (const s of w.slots) {
      if (s.gone) continue;
      instructionFindings(s.text, s.location).forEach((f, i) => {
        redactor.tally.add(`${s.location}\0instruction${i}`, f);
        flagged = true;
      });
    }
  }

  // 5. Provenance: ours, never the server's.
  const meta = w.aux(input._meta, '_meta', GUARD_LIMITS.maxMetaBytes, true);
  const keptTextBytes = w.slots.reduce((n, s) => n + utf8Bytes(s.text), 0);
  const redactions = redactor.tally.total();
  const { server, tool, sandboxId, callId } = opts.provenance;
  const truncated = total > maxText;
  const provenance: ProvenanceMeta = {
    server: String(server),
    tool: String(tool),
    ...(sandboxId !== undefined && { sandboxId: String(sandboxId) }),
    ...(callId !== undefined && { callId: String(callId) }),
    truncated,
    redacted: redactions > 0,
    redactions,
    flagged,
    ...(spillRef !== undefined && { spillRef }),
  };
  out._meta = { ...(isRecord(meta) ? meta : {}), [PROVENANCE_META_KEY]: provenance };

  const report: GuardReport = {
    truncated,
    originalTextBytes,
    keptTextBytes,
    redactions: redactor.tally.sortedRedactions(),
    findings: redactor.tally.sortedFindings(),
    dropped: w.dropped,
  };
  if (spillRef !== undefined) report.spillRef = spillRef;
  return { result: out as CallToolResult, report };
}
