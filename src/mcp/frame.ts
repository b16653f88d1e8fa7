// SECURITY-CRITICAL: the one parser for every JSON-RPC (MCP) message the gateway sees, in both directions.
// Every stage (policy, guard, audit, forwarding) reads the value returned here, and the gateway forwards
// serializeMessage(value), never the peer's bytes: what is checked is what is forwarded. It refuses text
// that two JSON readers could read differently: duplicate keys (JSON.parse keeps the last, others keep
// the first), keys that differ only by case, `__proto__`, invalid UTF-8, lone surrogates, numbers that do
// not survive a round trip (1e309 reads as Infinity and writes as null), batches, trailing data, and
// anything over the size, depth, key and string limits. The size limit is checked before any parsing and
// recursion is bounded by maxDepth, so hostile input costs time linear in its (bounded) size. Pure: no
// I/O, no clock, no shared mutable state.
import { z } from 'zod';
import { AirlockError } from '../core/errors.js';

// ---------------------------------------------------------------------------------------------------
// Limits

export interface FrameLimits {
  /** Largest message (one stdio line, counting a trailing CR) in UTF-8 bytes. */
  maxFrameBytes: number;
  /** Deepest nesting of objects and arrays; the top-level object is depth 1. */
  maxDepth: number;
  /** Most members in one object. */
  maxKeys: number;
  /** Longest string (key or value) in UTF-8 bytes, after unescaping. */
  maxStringBytes: number;
}

const MIB = 1024 * 1024;
export const FRAME_LIMITS: Readonly<FrameLimits> = Object.freeze({
  maxFrameBytes: 4 * MIB,
  maxDepth: 64,
  maxKeys: 10_000,
  maxStringBytes: 4 * MIB,
});
/** The parser recurses once per level; this caps a caller-supplied maxDepth far below the stack size. */
const MAX_DEPTH_CAP = 512;

function resolveLimits(opts: Partial<FrameLimits> | undefined): FrameLimits {
  if (opts === undefined) return FRAME_LIMITS;
  const out = { ...FRAME_LIMITS };
  for (const key of Object.keys(FRAME_LIMITS) as Array<keyof FrameLimits>) {
    const v = opts[key];
    if (v === undefined) continue;
    const cap = key === 'maxDepth' ? MAX_DEPTH_CAP : Number.MAX_SAFE_INTEGER;
    if (!Number.isSafeInteger(v) || v < 1 || v > cap) {
      throw new AirlockError('INVALID_ARGUMENT', `${key} must be an integer from 1 to ${cap}`, {
        field: key,
      });
    }
    out[key] = v;
  }
  return out;
}

// ---------------------------------------------------------------------------------------------------
// Messages

export type JsonRpcId = string | number;
export interface JsonRpcRequest {
  jsonrpc: '2.0';
  id: JsonRpcId;
  method: string;
  params?: Record<string, unknown>;
}
export interface JsonRpcNotification {
  jsonrpc: '2.0';
  method: string;
  params?: Record<string, unknown>;
}
export interface JsonRpcSuccessResponse {
  jsonrpc: '2.0';
  id: JsonRpcId;
  result: Record<string, unknown>;
}
export interface JsonRpcErrorObject {
  code: number;
  message: string;
  data?: unknown;
}
/** `id` is null (JSON-RPC 2.0) or absent (current MCP schema) when the request id could not be read. */
export interface JsonRpcErrorResponse {
  jsonrpc: '2.0';
  id?: JsonRpcId | null;
  error: JsonRpcErrorObject;
}
export type JsonRpcResponse = JsonRpcSuccessResponse | JsonRpcErrorResponse;
/** A parsed JSON-RPC 2.0 message. */
export type JsonRpcMessage = JsonRpcRequest | JsonRpcNotification | JsonRpcResponse;

export function messageKind(m: JsonRpcMessage): 'request' | 'notification' | 'result' | 'error' {
  if ('method' in m) return 'id' in m ? 'request' : 'notification';
  return 'error' in m ? 'error' : 'result';
}

export const FRAME_ERROR_CODES = [
  'oversized',
  'invalid_utf8',
  'not_json',
  'lone_surrogate',
  'number_out_of_range',
  'duplicate_key',
  'case_variant_key',
  'forbidden_key',
  'too_deep',
  'too_many_keys',
  'string_too_long',
  'not_object',
  'batch_unsupported',
  'invalid_jsonrpc',
] as const;
export type FrameErrorCode = (typeof FRAME_ERROR_CODES)[number];

export interface ParseFailure {
  ok: false;
  code: FrameErrorCode;
  /** Short, printable ASCII; quotes at most ~80 characters of the input. Safe to log and to send back. */
  reason: string;
  /**
   * The request id to answer: the input is an object with a top-level `method` member and one
   * unambiguous top-level `id` that is a string or a safe integer, read up to the first point the
   * text breaks (recoverIds). A broken request is answered with a JSON-RPC error, never dropped
   * silently, whatever broke it (a duplicate key deep in params, a lone surrogate, bad nesting...).
   */
  id?: JsonRpcId;
  /**
   * The id of a broken response (`result` or `error`, no `method`): never answered (that would inject
   * a reply the peer never asked for), but the receiver can fail its own pending request with that
   * id at once, with the reason, instead of waiting for its timeout.
   */
  responseId?: JsonRpcId;
}
export type ParseResult = { ok: true; message: JsonRpcMessage; bytes: number } | ParseFailure;

// ---------------------------------------------------------------------------------------------------
// Envelope schemas (STYLE.md habit 3). Strict, like the MCP SDK's: JSON-RPC defines every member.

const isPlainObject = (v: unknown): v is Record<string, unknown> =>
  typeof v === 'object' && v !== null && !Array.isArray(v);
/** Strings, or integers that survive a round trip through a double and JSON.stringify (not -0). */
const isId = (v: unknown): v is JsonRpcId =>
  typeof v === 'string' || (typeof v === 'number' && Number.isSafeInteger(v) && !Object.is(v, -0));

const JSONRPC = z.literal('2.0', { error: 'must be "2.0"' });
const ID = z.custom<JsonRpcId>(isId, { error: 'must be a string or a safe integer' });
const METHOD = z.string({ error: 'must be a string' }).min(1, { error: 'must not be empty' });
const OBJECT = z.custom<Record<string, unknown>>(isPlainObject, { error: 'must be an object' });

const RequestSchema: z.ZodType<JsonRpcRequest> = z.strictObject({
  jsonrpc: JSONRPC,
  id: ID,
  method: METHOD,
  params: OBJECT.optional(),
});
const NotificationSchema: z.ZodType<JsonRpcNotification> = z.strictObject({
  jsonrpc: JSONRPC,
  method: METHOD,
  params: OBJECT.optional(),
});
const SuccessSchema: z.ZodType<JsonRpcSuccessResponse> = z.strictObject({
  jsonrpc: JSONRPC,
  id: ID,
  result: OBJECT,
});
const ErrorResponseSchema: z.ZodType<JsonRpcErrorResponse> = z.strictObject({
  jsonrpc: JSONRPC,
  id: ID.nullable().optional(),
  error: z.strictObject(
    {
      code: z.custom<number>((v) => Number.isSafeInteger(v), { error: 'must be an integer' }),
      message: z.string({ error: 'must be a string' }),
      data: z.unknown().optional(),
    },
    { error: 'must be an object' },
  ),
});

type Issue = z.ZodError['issues'][number];

function describeIssue(issue: Issue): string {
  if (issue.code === 'unrecognized_keys') {
    return `unknown member ${shown(issue.keys[0] ?? '', 24)} in ${pathText(issue.path)}`;
  }
  return `${pathText(issue.path)} ${issue.message}`;
}

function checkEnvelope(
  v: Record<string, unknown>,
): { ok: true; message: JsonRpcMessage } | { ok: false; reason: string } {
  const schema = Object.hasOwn(v, 'method')
    ? Object.hasOwn(v, 'id')
      ? RequestSchema
      : NotificationSchema
    : Object.hasOwn(v, 'error')
      ? ErrorResponseSchema
      : Object.hasOwn(v, 'result')
        ? SuccessSchema
        : undefined;
  if (schema === undefined) return { ok: false, reason: 'no "method", "result" or "error" member' };
  const r = schema.safeParse(v);
  if (!r.success) return { ok: false, reason: describeIssue(r.error.issues[0]!) };
  // The schema accepted exactly this tree (no transforms); return it, not zod's copy, so key order and
  // every value are the ones that were parsed.
  return { ok: true, message: v as unknown as JsonRpcMessage };
}

// ---------------------------------------------------------------------------------------------------
// Reasons: printable ASCII only, input quoted in short clipped pieces (logs and peers see them).

function shown(s: string, max: number): string {
  let out = '';
  for (let k = 0; k < s.length && out.length < max; k++) {
    const c = s.charCodeAt(k);
    if (c === 0x22 || c === 0x5c) out += `\\${s[k]}`;
    else if (c >= 0x20 && c < 0x7f) out += s[k];
    else out += `\\u${c.toString(16).padStart(4, '0')}`;
  }
  return out.length < max ? `"${out}"` : `"${out.slice(0, max)}..."`;
}

function pathText(path: ReadonlyArray<PropertyKey>): string {
  let out = '$';
  for (const p of path) {
    if (typeof p === 'number') out += `[${p}]`;
    else if (typeof p === 'string' && p.length <= 24 && /^[A-Za-z_][A-Za-z0-9_]*$/.test(p)) out += `.${p}`;
    else out += `[${shown(String(p), 24)}]`;
    if (out.length > 60) return `${out.slice(0, 60)}...`;
  }
  return out;
}

function describeChar(cp: number): string {
  if (cp === 0x27) return `"'"`;
  return cp >= 0x21 && cp < 0x7f
    ? `'${String.fromCharCode(cp)}'`
    : `U+${cp.toString(16).toUpperCase().padStart(4, '0')}`;
}

// ---------------------------------------------------------------------------------------------------
// The strict JSON parser (RFC 8259 grammar, value identical to JSON.parse for accepted input)

class Reject {
  constructor(
    readonly code: FrameErrorCode,
    readonly reason: string,
  ) {}
}

/**
 * Approximates Unicode full case folding: `Method`/`method`, U+212A KELVIN SIGN/`k` and U+00DF (sharp s)/`ss`
 * all collide. Over-approximating only refuses more.
 */
function foldCase(key: string): string {
  let ascii = true;
  let lower = true;
  for (let k = 0; k < key.length; k++) {
    const c = key.charCodeAt(k);
    if (c > 0x7f) ascii = false;
    else if (c >= 0x41 && c <= 0x5a) lower = false;
  }
  if (!ascii) return key.toUpperCase().toLowerCase();
  return lower ? key : key.toLowerCase(); // the usual key folds to itself: no ICU call, no new string
}

class Parser {
  private i = 0;
  /** Keys and indexes from the root to the value being parsed, for reasons. */
  private readonly path: Array<string | number> = [];

  constructor(
    private readonly s: string,
    private readonly limits: FrameLimits,
  ) {}

  document(): unknown {
    if (this.s.charCodeAt(0) === 0xfeff)
      throw new Reject('not_json', 'byte order mark (U+FEFF) before the JSON');
    this.ws();
    if (this.i === this.s.length) throw new Reject('not_json', 'empty message');
    const value = this.value(0);
    this.ws();
    if (this.i !== this.s.length) throw this.unexpected('after the JSON value');
    return value;
  }

  private ws(): void {
    const s = this.s;
    let c = s.charCodeAt(this.i);
    while (c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09) c = s.charCodeAt(++this.i);
  }

  private unexpected(what: string): Reject {
    if (this.i >= this.s.length) return new Reject('not_json', `unexpected end of input ${what}`);
    const cp = this.s.codePointAt(this.i)!;
    return new Reject('not_json', `unexpected ${describeChar(cp)} at offset ${this.i} ${what}`);
  }

  private value(depth: number): unknown {
    const s = this.s;
    const c = s.charCodeAt(this.i);
    if (c === 0x7b) return this.object(depth + 1);
    if (c === 0x5b) return this.array(depth + 1);
    if (c === 0x22) return this.string();
    if (c === 0x2d || (c >= 0x30 && c <= 0x39)) return this.number();
    const word = c === 0x74 ? 'true' : c === 0x66 ? 'false' : c === 0x6e ? 'null' : '';
    if (word === '' || !s.startsWith(word, this.i)) throw this.unexpected('where a value was expected');
    this.i += word.length;
    return word === 'true' ? true : word === 'false' ? false : null;
  }

  private enter(depth: number): void {
    if (depth > this.limits.maxDepth) {
      throw new Reject('too_deep', `nested deeper than ${this.limits.maxDepth} at ${pathText(this.path)}`);
    }
    this.i++;
    this.ws();
  }

  private object(depth: number): Record<string, unknown> {
    this.enter(depth);
    const obj: Record<string, unknown> = {};
    if (this.s.charCodeAt(this.i) === 0x7d) {
      this.i++;
      return obj;
    }
    const folded = new Map<string, string>();
    for (let count = 1; ; count++) {
      if (this.s.charCodeAt(this.i) !== 0x22) throw this.unexpected('where a key was expected');
      const key = this.string();
      if (key === '__proto__' || key.includes('\0')) {
        throw new Reject('forbidden_key', `forbidden key ${shown(key, 24)} in ${pathText(this.path)}`);
      }
      // An exact repeat folds to the same key too: one lookup finds both kinds of ambiguity.
      const f = foldCase(key);
      const first = folded.get(f);
      if (first === key) {
        throw new Reject('duplicate_key', `duplicate key ${shown(key, 24)} in ${pathText(this.path)}`);
      }
      if (first !== undefined) {
        const pair = `${shown(first, 20)} and ${shown(key, 20)}`;
        throw new Reject('case_variant_key', `keys ${pair} differ only by case in ${pathText(this.path)}`);
      }
      if (count > this.limits.maxKeys) {
        throw new Reject('too_many_keys', `more than ${this.limits.maxKeys} keys in ${pathText(this.path)}`);
      }
      folded.set(f, key);
      this.ws();
      if (this.s.charCodeAt(this.i) !== 0x3a) throw this.unexpected("where ':' was expected");
      this.i++;
      this.ws();
      this.path.push(key);
      // Safe: `__proto__` is refused above, so assignment only ever creates an own data property.
      obj[key] = this.value(depth);
      this.path.pop();
      this.ws();
      const c = this.s.charCodeAt(this.i++);
      if (c === 0x7d) return obj;
      if (c !== 0x2c) {
        this.i--;
        throw this.unexpected("where ',' or '}' was expected");
      }
      this.ws();
    }
  }

  private array(depth: number): unknown[] {
    this.enter(depth);
    const arr: unknown[] = [];
    if (this.s.charCodeAt(this.i) === 0x5d) {
      this.i++;
      return arr;
    }
    for (;;) {
      this.path.push(arr.length);
      arr.push(this.value(depth));
      this.path.pop();
      this.ws();
      const c = this.s.charCodeAt(this.i++);
      if (c === 0x5d) return arr;
      if (c !== 0x2c) {
        this.i--;
        throw this.unexpected("where ',' or ']' was expected");
      }
      this.ws();
    }
  }

  private hex4(at: number): number {
    let n = 0;
    for (let k = at; k < at + 4; k++) {
      const c = this.s.charCodeAt(k);
      const d =
        c >= 0x30 && c <= 0x39
          ? c - 0x30
          : c >= 0x61 && c <= 0x66
            ? c - 0x57
            : c >= 0x41 && c <= 0x46
              ? c - 0x37
              : -1;
      if (d < 0) throw new Reject('not_json', `invalid \\u escape at offset ${at - 2}`);
      n = n * 16 + d;
    }
    return n;
  }

  /** At a '"'; returns the unescaped string and leaves `i` after the closing quote. */
  private string(): string {
    const s = this.s;
    const open = this.i;
    let out = '';
    let start = open + 1;
    let j = start;
    for (;;) {
      let c = s.charCodeAt(j);
      // Skip the run that needs no attention: no quote, backslash, control character or surrogate.
      while (c >= 0x20 && c !== 0x22 && c !== 0x5c && (c < 0xd800 || c > 0xdfff)) c = s.charCodeAt(++j);
      if (c === 0x22) break;
      if (c === 0x5c) {
        out += s.slice(start, j);
        const e = s.charCodeAt(j + 1);
        let len = 2;
        if (e === 0x22 || e === 0x5c || e === 0x2f) out += String.fromCharCode(e);
        else if (e === 0x62) out += '\b';
        else if (e === 0x66) out += '\f';
        else if (e === 0x6e) out += '\n';
        else if (e === 0x72) out += '\r';
        else if (e === 0x74) out += '\t';
        else if (e === 0x75) {
          const cu = this.hex4(j + 2);
          len = 6;
          if (cu >= 0xd800 && cu <= 0xdfff) {
            // Only a high escape directly followed by a low escape is a character; anything else is a
            // lone surrogate, which other parsers reject or replace with U+FFFD: a second reading.
            const lo = cu <= 0xdbff && s.startsWith('\\u', j + 6) ? this.hex4(j + 8) : -1;
            if (lo < 0xdc00 || lo > 0xdfff) {
              this.i = j;
              throw new Reject(
                'lone_surrogate',
                `lone surrogate escape at offset ${j} in ${pathText(this.path)}`,
              );
            }
            out += String.fromCharCode(cu, lo);
            len = 12;
          } else out += String.fromCharCode(cu);
        } else {
          this.i = j;
          throw new Reject('not_json', `invalid escape at offset ${j}`);
        }
        j += len;
        start = j;
      } else if (c < 0x20 || Number.isNaN(c)) {
        this.i = j;
        if (Number.isNaN(c)) throw new Reject('not_json', `unterminated string starting at offset ${open}`);
        throw new Reject('not_json', `raw control character ${describeChar(c)} in a string at offset ${j}`);
      } else {
        // A surrogate: a pair is one character; an unpaired one can only come from string input
        // (decoded UTF-8 never holds one) and has no UTF-8 form to forward.
        const d = s.charCodeAt(j + 1);
        if (c > 0xdbff || !(d >= 0xdc00 && d <= 0xdfff)) {
          throw new Reject(
            'invalid_utf8',
            `unpaired surrogate at offset ${j}: the text is not valid Unicode`,
          );
        }
        j += 2;
      }
    }
    out += s.slice(start, j);
    this.i = j + 1;
    const max = this.limits.maxStringBytes;
    if (out.length > max || (out.length * 3 > max && Buffer.byteLength(out, 'utf8') > max)) {
      throw new Reject('string_too_long', `string longer than ${max} bytes at ${pathText(this.path)}`);
    }
    return out;
  }

  private digits(from: number): number {
    let j = from;
    for (let c = this.s.charCodeAt(j); c >= 0x30 && c <= 0x39; c = this.s.charCodeAt(++j));
    return j;
  }

  private number(): number {
    const s = this.s;
    const start = this.i;
    let j = s.charCodeAt(start) === 0x2d ? start + 1 : start;
    const first = s.charCodeAt(j);
    const bad = (): Reject => {
      this.i = j;
      return this.unexpected('in a number');
    };
    if (first === 0x30) j++;
    else if (first >= 0x31 && first <= 0x39) j = this.digits(j);
    else throw bad();
    if (s.charCodeAt(j) === 0x2e) {
      const k = this.digits(++j);
      if (k === j) throw bad();
      j = k;
    }
    if ((s.charCodeAt(j) | 0x20) === 0x65) {
      j++;
      if (s.charCodeAt(j) === 0x2b || s.charCodeAt(j) === 0x2d) j++;
      const k = this.digits(j);
      if (k === j) throw bad();
      j = k;
    }
    // Number() on a JSON number token is the same conversion JSON.parse does (huge integers round,
    // 1e-400 is 0, -0 stays -0). Infinity is refused: JSON.stringify would forward it as null.
    const n = Number(s.slice(start, j));
    if (!Number.isFinite(n)) {
      throw new Reject('number_out_of_range', `number at offset ${start} is out of range for a double`);
    }
    this.i = j;
    return n;
  }
}

// ---------------------------------------------------------------------------------------------------
// Public API

/** ignoreBOM keeps a BOM in the text, where the parser refuses it: no stage may silently drop bytes. */
const UTF8 = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });

function fail(code: FrameErrorCode, reason: string, id?: JsonRpcId): ParseFailure {
  return id === undefined ? { ok: false, code, reason } : { ok: false, code, reason, id };
}

// ---------------------------------------------------------------------------------------------------
// Id recovery from a rejected frame (only ever used to answer it; nothing in it is forwarded)

/** Index just past the JSON string starting at `i` (a '"'), or -1 if it does not end. */
function skipString(s: string, i: number): number {
  for (let j = i + 1; j < s.length; j++) {
    const c = s.charCodeAt(j);
    if (c === 0x5c) j++;
    else if (c === 0x22) return j + 1;
  }
  return -1;
}

/** Index just past the (possibly invalid) JSON value starting at `i`, or -1 if the text ends inside it. */
function skipValue(s: string, i: number): number {
  const c = s.charCodeAt(i);
  if (c === 0x22) return skipString(s, i);
  if (c === 0x7b || c === 0x5b) {
    // Bracket counting, iterative (no recursion however deep); strings may hold brackets.
    let depth = 0;
    for (let j = i; j < s.length; j++) {
      const d = s.charCodeAt(j);
      if (d === 0x22) {
        j = skipString(s, j);
        if (j < 0) return -1;
        j--;
      } else if (d === 0x7b || d === 0x5b) depth++;
      else if (d === 0x7d || d === 0x5d) {
        if (--depth === 0) return j + 1;
      }
    }
    return -1;
  }
  // A scalar (number, literal or junk): up to a delimiter; at the end of the text it may be cut short.
  let j = i;
  while (j < s.length && !/[,}\]\s]/.test(s[j]!)) j++;
  return j === s.length ? -1 : j;
}

/** One token (a key, an id) read by the canonical parser itself; undefined if it is not clean JSON. */
function token(text: string): unknown {
  try {
    return new Parser(text, FRAME_LIMITS).document();
  } catch {
    return undefined;
  }
}

/**
 * The request or response id a rejected frame carries, read leniently: the top-level members of an
 * object, in order, up to the first point the text breaks (values are skipped, not parsed, so a broken
 * or too deep value does not hide the id). Only an `id` every reader agrees on counts: one value (or
 * the same value repeated), a string or a safe integer, read cleanly; a replacement character from
 * invalid UTF-8 disqualifies it. Linear in the (size-limited) input.
 */
export function recoverIds(text: string): { id?: JsonRpcId; responseId?: JsonRpcId } {
  const s = text;
  let i = s.charCodeAt(0) === 0xfeff ? 1 : 0;
  const ws = (): void => {
    while (/\s/.test(s[i] ?? 'x')) i++;
  };
  ws();
  if (s[i] !== '{') return {};
  i++;
  let id: JsonRpcId | undefined;
  let idSeen = false;
  let idBad = false;
  let method = false;
  let answer = false;
  for (;;) {
    ws();
    if (s[i] !== '"') break;
    const keyEnd = skipString(s, i);
    if (keyEnd < 0) break;
    const key = token(s.slice(i, keyEnd));
    i = keyEnd;
    ws();
    if (s[i] !== ':') break;
    i++;
    ws();
    if (key === 'method') method = true;
    if (key === 'result' || key === 'error') answer = true;
    const start = i;
    const end = skipValue(s, i);
    if (end < 0) break;
    if (key === 'id') {
      const v = token(s.slice(start, end));
      const ok = isId(v) && !(typeof v === 'string' && (v.includes('\ufffd') || !isWellFormed(v)));
      if (!ok || (idSeen && v !== id)) idBad = true;
      else id = v;
      idSeen = true;
    }
    i = end;
    ws();
    if (s[i] !== ',') break;
    i++;
  }
  if (idBad || id === undefined) return {};
  if (method) return { id };
  return answer ? { responseId: id } : {};
}

/** No lone surrogate (String.prototype.isWellFormed where @types/node lacks it). */
function isWellFormed(v: string): boolean {
  return !/[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/.test(v);
}

/** A failure with whatever id the rejected text carries (see recoverIds). */
function failWithIds(code: FrameErrorCode, reason: string, text: string): ParseFailure {
  const ids = recoverIds(text);
  const out: ParseFailure = { ok: false, code, reason };
  if (ids.id !== undefined) out.id = ids.id;
  if (ids.responseId !== undefined) out.responseId = ids.responseId;
  return out;
}

/** Lossy decoding, for id recovery from text that is not valid UTF-8 only. */
const UTF8_LOSSY = new TextDecoder('utf-8', { fatal: false, ignoreBOM: true });

function parseWith(input: string | Uint8Array, limits: FrameLimits): ParseResult {
  const max = limits.maxFrameBytes;
  let text: string;
  let bytes: number;
  if (typeof input === 'string') {
    // Every UTF-16 unit is at least one UTF-8 byte: a long string is refused before it is measured.
    bytes = input.length > max ? input.length : Buffer.byteLength(input, 'utf8');
    text = input;
  } else {
    bytes = input.byteLength;
    text = '';
  }
  if (bytes > max) return fail('oversized', `message is over ${max} bytes`);
  if (typeof input !== 'string') {
    try {
      text = UTF8.decode(input);
    } catch {
      return failWithIds('invalid_utf8', 'message is not valid UTF-8', UTF8_LOSSY.decode(input));
    }
  }

  let value: unknown;
  try {
    value = new Parser(text, limits).document();
  } catch (e) {
    if (e instanceof Reject) return failWithIds(e.code, e.reason, text);
    throw e;
  }
  if (Array.isArray(value)) {
    return fail(
      'batch_unsupported',
      'JSON-RPC batches (arrays) are not supported: send one message per line',
    );
  }
  if (!isPlainObject(value)) {
    return fail('not_object', `top-level value is ${value === null ? 'null' : typeof value}, not an object`);
  }
  const r = checkEnvelope(value);
  if (r.ok) return { ok: true, message: r.message, bytes };
  // Answerable only when it claims to be a request: answering a broken response or notification would
  // inject a reply the peer never asked for. A broken response's id lets the receiver fail its request.
  const reason = `invalid JSON-RPC message: ${r.reason}`;
  if (!isId(value.id)) return fail('invalid_jsonrpc', reason);
  if (Object.hasOwn(value, 'method')) return fail('invalid_jsonrpc', reason, value.id);
  if (Object.hasOwn(value, 'result') || Object.hasOwn(value, 'error'))
    return { ok: false, code: 'invalid_jsonrpc', reason, responseId: value.id };
  return fail('invalid_jsonrpc', reason);
}

/**
 * Parse one JSON-RPC message (UTF-8 bytes or a string). Never throws on any input; throws only for
 * invalid `opts` (INVALID_ARGUMENT).
 */
export function parseMessage(input: string | Uint8Array, opts?: Partial<FrameLimits>): ParseResult {
  return parseWith(input, resolveLimits(opts));
}

/** First spot where `v` is not data JSON.stringify writes faithfully (undefined members are omitted). */
function unfaithful(v: unknown, path: Array<string | number>, maxDepth: number): string | undefined {
  if (v === null || typeof v === 'string' || typeof v === 'boolean') return undefined;
  if (typeof v === 'number')
    return Number.isFinite(v) ? undefined : `${pathText(path)} is not a finite number`;
  if (typeof v !== 'object') return `${pathText(path)} is ${typeof v}`;
  if (path.length >= maxDepth) return `${pathText(path)} is nested too deep (or circular)`;
  const proto: unknown = Object.getPrototypeOf(v);
  if (!Array.isArray(v) && proto !== Object.prototype && proto !== null) {
    return `${pathText(path)} is not a plain object`;
  }
  const entries: Array<[string | number, unknown]> = Array.isArray(v) ? [...v.entries()] : Object.entries(v);
  for (const [k, item] of entries) {
    path.push(k);
    const bad =
      item !== undefined
        ? unfaithful(item, path, maxDepth)
        : Array.isArray(v)
          ? `${pathText(path)} is undefined`
          : undefined;
    path.pop();
    if (bad !== undefined) return bad;
  }
  return undefined;
}

/**
 * One line for newline-delimited stdio framing: JSON.stringify (which escapes every control character,
 * so the line holds no raw newline) plus '\n'. Throws MCP_INVALID_MESSAGE unless the text is a faithful
 * copy of `msg` that parseMessage accepts with the same limits: the gateway never sends what it would
 * refuse to receive.
 */
export function serializeMessage(msg: JsonRpcMessage, opts?: Partial<FrameLimits>): string {
  const limits = resolveLimits(opts);
  const bad = unfaithful(msg, [], limits.maxDepth);
  if (bad !== undefined) throw new AirlockError('MCP_INVALID_MESSAGE', `cannot serialize message: ${bad}`);
  const text = JSON.stringify(msg);
  const check = parseWith(text, limits);
  if (!check.ok) throw new AirlockError('MCP_INVALID_MESSAGE', `cannot serialize message: ${check.reason}`);
  return `${text}\n`;
}

export const JSONRPC_PARSE_ERROR = -32700;
export const JSONRPC_INVALID_REQUEST = -32600;

/** Text-level failures are Parse errors; a readable JSON value that is not a valid message is Invalid Request. */
export function jsonRpcErrorFor(failure: ParseFailure | FrameErrorEvent): JsonRpcErrorResponse {
  const invalidRequest =
    failure.code === 'not_object' ||
    failure.code === 'batch_unsupported' ||
    failure.code === 'invalid_jsonrpc';
  return {
    jsonrpc: '2.0',
    id: failure.id ?? null,
    error: { code: invalidRequest ? JSONRPC_INVALID_REQUEST : JSONRPC_PARSE_ERROR, message: failure.reason },
  };
}

// ---------------------------------------------------------------------------------------------------
// Newline-delimited stdio framing

export type FrameErrorEvent = {
  kind: 'error';
  code: FrameErrorCode;
  reason: string;
  id?: JsonRpcId;
  responseId?: JsonRpcId;
};
export type FrameEvent = { kind: 'message'; message: JsonRpcMessage; bytes: number } | FrameErrorEvent;

/**
 * Splits a byte stream on '\n' (never inside a UTF-8 character: 0x0A is no part of a multibyte
 * sequence), drops one trailing '\r', ignores empty lines and parses each line. A line longer than
 * maxFrameBytes gives one 'oversized' error and is skipped up to the next '\n' without being buffered,
 * so memory held stays at most maxFrameBytes whatever the peer sends.
 */
export class LineFramer {
  readonly #limits: FrameLimits;
  #parts: Buffer[] = [];
  #buffered = 0;
  #discarding = false;

  constructor(opts?: Partial<FrameLimits>) {
    this.#limits = resolveLimits(opts);
  }

  /** Bytes of the current partial line held in memory (never more than maxFrameBytes). */
  get bufferedBytes(): number {
    return this.#buffered;
  }

  push(chunk: Uint8Array): FrameEvent[] {
    const buf = Buffer.isBuffer(chunk)
      ? chunk
      : Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
    const events: FrameEvent[] = [];
    let pos = 0;
    while (pos < buf.length) {
      const nl = buf.indexOf(0x0a, pos);
      if (nl === -1) {
        this.#hold(buf.subarray(pos), events);
        break;
      }
      if (this.#discarding) this.#discarding = false;
      else this.#line(buf.subarray(pos, nl), events);
      pos = nl + 1;
    }
    return events;
  }

  /** The stream ended: a final line without '\n' is parsed like any other. Resets the framer. */
  end(): FrameEvent[] {
    const events: FrameEvent[] = [];
    if (!this.#discarding && this.#buffered > 0) this.#line(Buffer.alloc(0), events);
    this.#reset();
    this.#discarding = false;
    return events;
  }

  #reset(): void {
    this.#parts = [];
    this.#buffered = 0;
  }

  #oversized(events: FrameEvent[]): void {
    const max = this.#limits.maxFrameBytes;
    events.push({ kind: 'error', code: 'oversized', reason: `line is over ${max} bytes; skipped` });
    this.#reset();
  }

  #hold(rest: Buffer, events: FrameEvent[]): void {
    if (this.#discarding) return;
    if (this.#buffered + rest.length > this.#limits.maxFrameBytes) {
      this.#oversized(events);
      this.#discarding = true;
      return;
    }
    this.#parts.push(Buffer.from(rest)); // a copy: never pin the caller's (possibly large) chunk
    this.#buffered += rest.length;
  }

  #line(tail: Buffer, events: FrameEvent[]): void {
    const total = this.#buffered + tail.length;
    if (total > this.#limits.maxFrameBytes) return this.#oversized(events);
    let line = this.#buffered === 0 ? tail : Buffer.concat([...this.#parts, tail], total);
    this.#reset();
    if (line.length > 0 && line[line.length - 1] === 0x0d) line = line.subarray(0, line.length - 1);
    if (line.length === 0) return;
    const r = parseWith(line, this.#limits);
    if (r.ok) events.push({ kind: 'message', message: r.message, bytes: r.bytes });
    else {
      const ev: FrameErrorEvent = { kind: 'error', code: r.code, reason: r.reason };
      if (r.id !== undefined) ev.id = r.id;
      if (r.responseId !== undefined) ev.responseId = r.responseId;
      events.push(ev);
    }
  }
}
