// SECURITY-CRITICAL: the offline description scanner for MCP definitions (issue 4, "Definitions: scan
// and pin"). It reads what an untrusted server says about itself (tool names, titles, descriptions,
// every string and key of its schemas, prompts, resources, server instructions) and reports text that
// speaks to the model instead of describing the tool, hides from the user, points at credentials or at
// other servers' tools, or hides characters. Pure and deterministic: no I/O, no clock, no randomness;
// the same input gives the same findings in the same order. It only reports; policy decides whether a
// finding means warn or quarantine. Phrase rules are heuristics: a determined author can word around
// them, which is why definitions are also pinned and calls are mediated.

import { RULE_IDS, type RuleId, type Severity } from '../policy/mcp-rules.js';

export { RULE_IDS, type RuleId, type Severity };

export interface Finding {
  ruleId: RuleId;
  severity: Severity;
  /** Where, e.g. `tools[read_file].inputSchema.properties.path.description`; invisible chars escaped. */
  location: string;
  /** At most 120 chars around the match; invisible and control chars shown as `\u{...}`. */
  excerpt: string;
  message: string;
}

export interface ScanInput {
  tools?: Array<{
    name: string;
    title?: string;
    description?: string;
    inputSchema?: unknown;
    outputSchema?: unknown;
    annotations?: unknown;
  }>;
  prompts?: Array<{
    name: string;
    description?: string;
    arguments?: Array<{ name: string; description?: string }>;
  }>;
  resources?: Array<{ name?: string; uri?: string; description?: string }>;
  resourceTemplates?: Array<{ name?: string; uriTemplate?: string; description?: string }>;
  instructions?: string;
  /** Tool names of the other servers behind the same gateway (plain or namespaced). */
  otherServersToolNames?: readonly string[];
}

export interface ScanOptions {
  /** Longer descriptions (in code points) get an `excessive-length` finding. Default 2000. */
  maxDescriptionChars?: number;
}

/** Bounds on the schema walk, so a hostile schema cannot make the scanner slow or crash it. */
export const SCAN_LIMITS = {
  maxSchemaDepth: 32,
  maxSchemaNodes: 10_000,
  maxPhraseScanChars: 100_000,
} as const;
const DEFAULT_MAX_DESCRIPTION_CHARS = 2000;
const EXCERPT_MAX_CHARS = 120;
const RANK: Record<Severity, number> = { high: 3, medium: 2, low: 1 };

// ---------------------------------------------------------------------------------------------------
// Characters

type HiddenKind = 'tag' | 'zero-width' | 'bidi';

function hiddenKind(cp: number): HiddenKind | undefined {
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
function isIgnorable(cp: number): boolean {
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
function isLegitimateJoiner(s: string, i: number, cp: number): boolean {
  if (cp !== 0x200c && cp !== 0x200d) return false;
  const prev = cpBefore(s, i);
  const next = cpAt(s, i + 1);
  if (cp === 0x200d && PICTOGRAPH.test(prev) && PICTOGRAPH.test(next)) return true;
  return NON_LATIN_LETTER.test(prev) && NON_LATIN_LETTER.test(next);
}

/** Length of a subdivision-flag tag run after U+1F3F4 (🏴 + tag letters + CANCEL TAG), else 0. */
function flagTagRunLength(s: string, from: number): number {
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
function foldChar(ch: string): string {
  let out = '';
  for (const c of ch.normalize('NFKC')) out += CONFUSABLE.get(c) ?? c;
  return out;
}

function codeName(cp: number): string {
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

const display = (s: string): string => displayTokens(s, 0, s.length).join('');

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

interface Folded {
  /** Tag characters decoded to ASCII, invisibles dropped, NFKC + look-alikes folded, spaces collapsed. */
  text: string;
  /** For each UTF-16 unit of `text`, the index of the code point in the original it came from. */
  origin: number[];
}

function fold(s: string): Folded {
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

function originalSpan(s: string, f: Folded, index: number, length: number): [number, number] {
  const start = f.origin[index] ?? 0;
  const last = f.origin[index + length - 1] ?? start;
  return [start, last + ((s.codePointAt(last) ?? 0) > 0xffff ? 2 : 1)];
}

// ---------------------------------------------------------------------------------------------------
// Phrase rules (matched case-insensitively on folded text)

interface PhraseRule {
  id: 'hidden-instruction' | 'secrecy' | 'sensitive-path';
  severity: Severity;
  what: string;
  patterns: RegExp[];
}

const PHRASE_RULES: PhraseRule[] = [
  {
    id: 'hidden-instruction',
    severity: 'medium',
    what: 'Instructions aimed at the model',
    patterns: [
      /\b(?:ignore|disregard|forget|override) (?:all |any )?(?:of )?(?:the |your |my )?(?:previous|prior|above|earlier|preceding|other|existing|system) (?:instructions?|prompts?|messages?|rules|directions|guidelines)\b/i,
      /<\s*\/?\s*(?:important|system|instructions?|secret|hidden|admin|critical|assistant)\s*>/i,
      /\[\/?inst\]|<<\/?sys>>|<\|im_(?:start|end)\|>/i,
      /\bbefore (?:using|calling|invoking|running|executing|you use|you call) (?:this|the|any|that)(?: \w+)? (?:tool|function)\b/i,
      /\byou (?:must|have to|are required to|should always|should first|should never)\b/i,
      /\b(?:the |this )?(?:assistant|model|ai|llm|agent)(?: must| should always| is required to| has to)\b/i,
      /\b(?:always|immediately) (?:call|invoke|execute|run|use|read|send)\b|\bfirst (?:call|invoke|execute|read)\b/i,
      /\bwhen (?:this|the) tool is (?:available|present|loaded|installed|enabled)\b/i,
      /\b(?:new|updated|real|actual|hidden) instructions?\b/i,
      /\b(?:do not|don't|never|without) (?:ask(?:ing)?|wait(?:ing)? for|request(?:ing)?) (?:the user (?:for )?|for )?(?:confirmation|permission|approval|consent)\b/i,
      /\b(?:pass|send|include|put|insert|append|attach|forward) (?:its|their|the file'?s?) (?:full |entire |whole |complete )?(?:contents?|text|data)\b/i,
    ],
  },
  {
    id: 'secrecy',
    severity: 'high',
    what: 'Secrecy toward the user',
    patterns: [
      /\b(?:do not|don't|dont|never|must not|should not|shouldn't|mustn't) (?:ever |explicitly |directly )?(?:mention|tell|inform|notify|alert)\b/i,
      /\b(?:do not|don't|never|must not|should not) (?:show|reveal|disclose|display|report|explain|say|let|expose|share)\b[^.!?\n]{0,40}\b(?:user|human|operator|anyone)s?\b/i,
      /\bwithout informing\b|\bwithout (?:telling|notifying|alerting|letting|warning|showing) (?:the |any )?(?:user|human|operator|them|anyone)s?\b/i,
      /\bwithout (?:the )?(?:user|human)(?:'s)? (?:knowing|noticing|knowledge|awareness|consent|seeing|approval)\b/i,
      /\bkeep (?:this|it|that|these(?: \w+)?|the following|them) (?:a |as a )?(?:secret|hidden|confidential|private|between us|to yourself)\b/i,
      /\bhide (?:this |it |that |these |the \w+ )?from (?:the )?(?:user|human)s?\b/i,
      /\b(?:secretly|covertly|surreptitiously|stealthily)\b/i,
      /\b(?:silently|quietly) (?:send|call|read|include|pass|forward|upload|add|copy|post|invoke|email)\b/i,
      /\b(?:the )?(?:user|human)s? (?:must|should|does|need) (?:not|never) (?:know|see|notice|find out|learn|be (?:told|informed|notified|aware))\b/i,
    ],
  },
  {
    id: 'sensitive-path',
    severity: 'high',
    what: 'Reference to credentials or sensitive files',
    patterns: [
      /(?<!\w)\.ssh\b/i,
      /\bid_(?:rsa|dsa|ecdsa|ed25519)\b/i,
      /(?<!\w)\.env(?![\w-])/i,
      /\.aws[/\\](?:credentials|config)\b/i,
      /(?<!\w)\.(?:netrc|pgpass|npmrc|pypirc|git-credentials|gnupg|bash_history|zsh_history)\b/i,
      /(?<!\w)\.(?:kube[/\\]config|docker[/\\]config\.json)\b/i,
      /\bcredentials\b|\bcredential (?:file|store|helper)s?\b/i,
      /\bprivate[ _-]?keys?\b/i,
      /\b(?:mcp|mcp_config|claude_desktop_config)\.json\b/i,
      /\/etc\/(?:shadow|passwd|sudoers)\b/i,
    ],
  },
];

const CONVERSATION_ASK =
  /\b(?:conversation|chat(?: log| history)?|dialog(?:ue)?|transcript|(?:previous|prior|earlier) (?:messages|turns|prompts|responses)|message history|system prompt|(?:the )?user'?s? (?:messages?|requests?|prompts?|queries)|what the user (?:said|asked|wrote|typed)|context window|your instructions)\b/i;
const SECRET_ASK =
  /\b(?:secrets?|(?:api|secret|access|ssh|private|encryption|signing) ?keys?|(?:access|auth|bearer|api|session|refresh) ?tokens?|passwords?|passphrases?|credentials?|file contents?|contents? of (?:any |the |a |all |your )?(?:files?|\S*[/~]\S*)|env(?:ironment)? var(?:iable)?s?)\b|(?<!\w)\.env\b|(?<!\w)\.ssh\b/i;
const SIDE_CHANNEL_EXACT = new Set(['context', 'notes', 'note', 'feedback', 'memo', 'summary', 'remarks']);
const SIDE_CHANNEL_PART =
  /conversation|history|sidenote|summaryofchat|chatsummary|systemprompt|previousmessages|transcript|chatlog/;

function isSideChannelName(name: string): boolean {
  const n = name.toLowerCase().replace(/[^a-z0-9]/g, '');
  return SIDE_CHANNEL_EXACT.has(n) || SIDE_CHANNEL_PART.test(n);
}

const escapeRegExp = (s: string): string => s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');

/** Names of other servers' tools as they would appear in prose; plain words only when marked as tools. */
function crossServerMatcher(names: readonly string[], own: ReadonlySet<string>): RegExp | undefined {
  const usable = [...new Set(names.map((n) => String(n).toLowerCase()))]
    .filter((n) => n.length >= 3 && !own.has(n))
    .sort((a, b) => b.length - a.length || (a < b ? -1 : 1));
  const compound = usable.filter((n) => /[^a-z]/.test(n)).map(escapeRegExp);
  const plain = usable.filter((n) => /^[a-z]+$/.test(n)).map(escapeRegExp);
  const alts: string[] = [];
  if (compound.length > 0) alts.push(`(?<![\\w-])(${compound.join('|')})(?![\\w-])`);
  if (plain.length > 0) {
    const p = plain.join('|');
    alts.push(
      `[\`'"](${p})[\`'"]`,
      `(?<![\\w-])(${p}) (?:tool|function)\\b`,
      `\\b(?:tool|function) (${p})(?![\\w-])`,
    );
  }
  return alts.length === 0 ? undefined : new RegExp(alts.join('|'), 'gi');
}

// ---------------------------------------------------------------------------------------------------
// Collecting every string the server controls

type FieldKind = 'name' | 'prose' | 'description';
interface Field {
  owner: string;
  location: string;
  text: string;
  kind: FieldKind;
  /** A tool or prompt name: checked for look-alike characters. */
  identifier?: boolean;
}
interface Param {
  owner: string;
  location: string;
  name: string;
  description?: string;
}
interface Collected {
  fields: Field[];
  params: Param[];
  findings: Finding[];
}

/** Schema keys whose string values are identifiers or syntax, not prose. */
const NON_PROSE_KEYS = new Set(['type', 'format', 'pattern', '$ref', '$schema', '$id', '$anchor']);

function segment(key: string): string {
  return /^[A-Za-z_$][\w$-]*$/.test(key) ? `.${key}` : `[${display(JSON.stringify(key))}]`;
}

const isRecord = (v: unknown): v is Record<string, unknown> =>
  typeof v === 'object' && v !== null && !Array.isArray(v);

function walkSchema(c: Collected, owner: string, base: string, root: unknown): void {
  if (root === undefined) return;
  let nodes = 0;
  let stopped = false;
  let reason: string | undefined;
  const seen = new WeakSet<object>();
  const visit = (
    value: unknown,
    path: string,
    depth: number,
    key: string | undefined,
    propertyMap: boolean,
  ) => {
    if (stopped) return;
    if (++nodes > SCAN_LIMITS.maxSchemaNodes) {
      stopped = true;
      reason ??= `more than ${SCAN_LIMITS.maxSchemaNodes} nodes`;
      return;
    }
    if (typeof value === 'string') {
      const kind = key === 'description' ? 'description' : key && NON_PROSE_KEYS.has(key) ? 'name' : 'prose';
      c.fields.push({ owner, location: path, text: value, kind });
      return;
    }
    if (typeof value !== 'object' || value === null) return;
    if (depth >= SCAN_LIMITS.maxSchemaDepth) {
      reason ??= `nested deeper than ${SCAN_LIMITS.maxSchemaDepth} levels`;
      return;
    }
    if (seen.has(value)) return;
    seen.add(value);
    if (Array.isArray(value)) {
      for (let i = 0; i < value.length && !stopped; i++)
        visit(value[i], `${path}[${i}]`, depth + 1, key, false);
      return;
    }
    const record = value as Record<string, unknown>;
    for (const k of Object.keys(record)) {
      if (stopped) return;
      const childPath = path + segment(k);
      const child = record[k];
      if (/[^\x20-\x7e]/.test(k)) c.fields.push({ owner, location: childPath, text: k, kind: 'name' });
      if (propertyMap) {
        const description =
          isRecord(child) && typeof child.description === 'string' ? child.description : undefined;
        c.params.push({ owner, location: childPath, name: k, description });
      }
      visit(child, childPath, depth + 1, propertyMap ? undefined : k, !propertyMap && k === 'properties');
    }
  };
  visit(root, base, 0, undefined, false);
  if (reason !== undefined) {
    c.findings.push({
      ruleId: 'schema-too-large',
      severity: 'medium',
      location: base,
      excerpt: '',
      message: `Schema walk stopped (${reason}); the rest of this schema was not scanned`,
    });
  }
}

const list = <T>(v: readonly T[] | undefined): readonly T[] => (Array.isArray(v) ? v : []);
const label = (name: unknown, index: number): string =>
  typeof name === 'string' && name !== '' ? display(name) : `#${index}`;

function collect(input: ScanInput): Collected {
  const c: Collected = { fields: [], params: [], findings: [] };
  const add = (owner: string, location: string, text: unknown, kind: FieldKind, identifier = false) => {
    if (typeof text === 'string') c.fields.push({ owner, location, text, kind, identifier });
  };
  list(input.tools).forEach((tool, i) => {
    const owner = `tools[${label(tool?.name, i)}]`;
    add(owner, `${owner}.name`, tool?.name, 'name', true);
    add(owner, `${owner}.title`, tool?.title, 'prose');
    add(owner, `${owner}.description`, tool?.description, 'description');
    walkSchema(c, owner, `${owner}.inputSchema`, tool?.inputSchema);
    walkSchema(c, owner, `${owner}.outputSchema`, tool?.outputSchema);
    walkSchema(c, owner, `${owner}.annotations`, tool?.annotations);
  });
  list(input.prompts).forEach((prompt, i) => {
    const owner = `prompts[${label(prompt?.name, i)}]`;
    add(owner, `${owner}.name`, prompt?.name, 'name', true);
    add(owner, `${owner}.description`, prompt?.description, 'description');
    list(prompt?.arguments).forEach((arg, j) => {
      const loc = `${owner}.arguments[${label(arg?.name, j)}]`;
      add(owner, `${loc}.name`, arg?.name, 'name');
      add(owner, `${loc}.description`, arg?.description, 'description');
    });
  });
  list(input.resources).forEach((r, i) => {
    const owner = `resources[${label(r?.name ?? r?.uri, i)}]`;
    add(owner, `${owner}.name`, r?.name, 'prose');
    add(owner, `${owner}.uri`, r?.uri, 'prose');
    add(owner, `${owner}.description`, r?.description, 'description');
  });
  list(input.resourceTemplates).forEach((r, i) => {
    const owner = `resourceTemplates[${label(r?.name ?? r?.uriTemplate, i)}]`;
    add(owner, `${owner}.name`, r?.name, 'prose');
    add(owner, `${owner}.uriTemplate`, r?.uriTemplate, 'prose');
    add(owner, `${owner}.description`, r?.description, 'description');
  });
  add('instructions', 'instructions', input.instructions, 'description');
  return c;
}

// ---------------------------------------------------------------------------------------------------
// Rules over one field

function unicodeFindings(f: Field, out: Finding[]): void {
  const s = f.text;
  const runs: Record<HiddenKind, { count: number; first: number; codes: Set<number> }> = {
    tag: { count: 0, first: -1, codes: new Set() },
    'zero-width': { count: 0, first: -1, codes: new Set() },
    bidi: { count: 0, first: -1, codes: new Set() },
  };
  let decoded = '';
  for (let i = 0; i < s.length;) {
    const cp = s.codePointAt(i)!;
    const width = cp > 0xffff ? 2 : 1;
    const flagRun = cp === 0x1f3f4 ? flagTagRunLength(s, i + 2) : 0;
    if (flagRun > 0) {
      i += width + flagRun;
      continue;
    }
    const kind = hiddenKind(cp);
    if (kind !== undefined && !isLegitimateJoiner(s, i, cp)) {
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

function homoglyphFinding(f: Field, known: ReadonlySet<string>): Finding | undefined {
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

function phraseFindings(f: Field, folded: Folded, out: Finding[]): void {
  for (const rule of PHRASE_RULES) {
    let first: RegExpExecArray | undefined;
    const phrases = new Set<string>();
    for (const re of rule.patterns) {
      const m = re.exec(folded.text);
      if (!m) continue;
      phrases.add(m[0].toLowerCase());
      if (!first || m.index < first.index) first = m;
    }
    if (!first) continue;
    const [start, end] = originalSpan(f.text, folded, first.index, first[0].length);
    const quoted = [...phrases].sort().map((p) => JSON.stringify(p));
    out.push({
      ruleId: rule.id,
      severity: rule.severity,
      location: f.location,
      excerpt: excerptOf(f.text, start, end),
      message: `${rule.what}: ${quoted.join(', ')}`,
    });
  }
}

function crossServerFinding(f: Field, folded: Folded, re: RegExp): Finding | undefined {
  const names = new Set<string>();
  let first: RegExpExecArray | undefined;
  for (const m of folded.text.matchAll(re)) {
    first ??= m;
    names.add(
      m
        .slice(1)
        .find((g) => g !== undefined)!
        .toLowerCase(),
    );
  }
  if (!first) return undefined;
  const [start, end] = originalSpan(f.text, folded, first.index, first[0].length);
  return {
    ruleId: 'cross-server-reference',
    severity: 'medium',
    location: f.location,
    excerpt: excerptOf(f.text, start, end),
    message: `Mentions tool(s) of another server: ${[...names].sort().join(', ')}`,
  };
}

function codePointLength(s: string): number {
  let n = 0;
  for (let i = 0; i < s.length; i++) {
    const u = s.charCodeAt(i);
    if (u < 0xdc00 || u > 0xdfff) n++;
  }
  return n;
}

// ---------------------------------------------------------------------------------------------------
// The scan

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
  const c = collect(input ?? {});
  const findings = c.findings;
  const ownNames = new Set(list(input?.tools).map((t) => String(t?.name ?? '').toLowerCase()));
  const others = list(input?.otherServersToolNames).map((n) => String(n));
  const knownNames = new Set([...others.map((n) => n.toLowerCase()), ...ownNames]);
  const crossRe = crossServerMatcher(others, ownNames);
  /** Folded prose that carried a phrase finding, per owner: where a side-channel parameter gets named. */
  const flagged = new Map<string, Array<{ location: string; text: string; strong: boolean }>>();
  const owners = new Map<Finding, string>();

  for (const f of c.fields) {
    const local: Finding[] = [];
    unicodeFindings(f, local);
    if (f.identifier) {
      const h = homoglyphFinding(f, knownNames);
      if (h) local.push(h);
    }
    const length = codePointLength(f.text);
    if (length > SCAN_LIMITS.maxPhraseScanChars) {
      local.push({
        ruleId: 'excessive-length',
        severity: 'medium',
        location: f.location,
        excerpt: excerptOf(f.text, 0, 0),
        message: `Text is ${length} characters; only the first ${SCAN_LIMITS.maxPhraseScanChars} were checked for hidden instructions`,
      });
    } else if (f.kind === 'description' && length > maxChars) {
      local.push({
        ruleId: 'excessive-length',
        severity: 'low',
        location: f.location,
        excerpt: excerptOf(f.text, 0, 0),
        message: `Description is ${length} characters (limit ${maxChars})`,
      });
    }
    if (f.kind !== 'name') {
      const folded = fold(f.text);
      const before = local.length;
      phraseFindings(f, folded, local);
      const phrased = local.slice(before);
      if (phrased.length > 0) {
        const strong = phrased.some((p) => p.ruleId === 'hidden-instruction' || p.ruleId === 'secrecy');
        const entries = flagged.get(f.owner) ?? [];
        entries.push({ location: f.location, text: folded.text, strong });
        flagged.set(f.owner, entries);
      }
      const cross = crossRe ? crossServerFinding(f, folded, crossRe) : undefined;
      if (cross) local.push(cross);
    }
    for (const finding of local) {
      owners.set(finding, f.owner);
      findings.push(finding);
    }
  }

  // Hidden instructions next to secrecy or credential paths (anywhere in the same definition) are high.
  const aggravated = new Set<string>();
  for (const f of findings) {
    if (f.ruleId === 'secrecy' || f.ruleId === 'sensitive-path') aggravated.add(owners.get(f) ?? '');
  }
  for (const f of findings) {
    if (f.ruleId === 'hidden-instruction' && aggravated.has(owners.get(f) ?? '')) {
      f.severity = 'high';
      f.message += '; combined with secrecy or sensitive paths in the same definition';
    }
  }

  for (const p of c.params) {
    const desc = p.description === undefined ? undefined : fold(p.description);
    const suspicious = isSideChannelName(p.name);
    const ask = desc && suspicious ? (SECRET_ASK.exec(desc.text) ?? CONVERSATION_ASK.exec(desc.text)) : null;
    if (ask && desc && p.description !== undefined) {
      const [start, end] = originalSpan(p.description, desc, ask.index, ask[0].length);
      const secret = SECRET_ASK.test(desc.text);
      findings.push({
        ruleId: 'side-channel-parameter',
        severity: secret ? 'high' : 'medium',
        location: p.location,
        excerpt: excerptOf(p.description, start, end),
        message: `Parameter ${JSON.stringify(p.name)} asks for ${secret ? 'secrets or file contents' : 'conversation content'}`,
      });
      continue;
    }
    if (p.name.length < 3) continue;
    const ref = new RegExp(`(?<![\\w-])${escapeRegExp(p.name)}(?![\\w-])`, 'i');
    const hit = (flagged.get(p.owner) ?? []).find(
      (e) => (suspicious || e.strong) && !e.location.startsWith(p.location) && ref.test(e.text),
    );
    if (!hit) continue;
    const m = ref.exec(hit.text)!;
    findings.push({
      ruleId: 'side-channel-parameter',
      severity: aggravated.has(p.owner) ? 'high' : 'medium',
      location: p.location,
      excerpt: excerptOf(hit.text, m.index, m.index + m[0].length),
      message: `Parameter ${JSON.stringify(p.name)} is named by suspicious instructions at ${hit.location}`,
    });
  }
  return findings.sort(compareFindings);
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
  phraseFindings({ owner: location, location, text, kind: 'prose' }, fold(text), out);
  return out;
}
