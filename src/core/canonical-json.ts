// Canonical JSON (RFC 8785 style): the one deterministic serializer. Hashes over it (MCP pins, template
// digests) must not change, so any change here is a change of every stored hash. Pure; no I/O.
import { AirlockError } from './errors.js';

/** Deeper values are refused: the serializer recurses, and a hostile peer can nest arbitrarily. */
export const MAX_JSON_DEPTH = 512;

interface JsonFormat {
  /** '' for the compact canonical form. */
  indent: string;
  /** Escape invisible/format characters as `\uXXXX` (display and lockfile only, never for hashing). */
  escapeInvisible: boolean;
}

const CANONICAL: JsonFormat = { indent: '', escapeInvisible: false };
const PRETTY: JsonFormat = { indent: '  ', escapeInvisible: true };

// Characters that render as nothing or reorder text; JSON.stringify leaves them raw.
const FORMAT_OR_CONTROL = /[\p{Cc}\p{Cf}\p{Co}]/u;

function isInvisible(cp: number): boolean {
  return (
    FORMAT_OR_CONTROL.test(String.fromCodePoint(cp)) ||
    cp === 0x2028 ||
    cp === 0x2029 ||
    cp === 0x115f ||
    cp === 0x1160 ||
    cp === 0x3164 ||
    cp === 0xffa0 ||
    (cp >= 0xfe00 && cp <= 0xfe0f) ||
    (cp >= 0xe0100 && cp <= 0xe01ef)
  );
}

/** Invisible characters as `\uXXXX` escapes (surrogate pairs for astral ones): still valid JSON. */
export function escapeInvisible(s: string): string {
  let out = '';
  for (const ch of s) {
    if (!isInvisible(ch.codePointAt(0)!)) {
      out += ch;
      continue;
    }
    for (let i = 0; i < ch.length; i++) out += `\\u${ch.charCodeAt(i).toString(16).padStart(4, '0')}`;
  }
  return out;
}

function notJson(path: string, what: string): AirlockError {
  return new AirlockError('INVALID_ARGUMENT', `Not a JSON value at ${path}: ${what}`, { field: path });
}

function writeJson(value: unknown, path: string, depth: number, seen: Set<object>, fmt: JsonFormat): string {
  switch (typeof value) {
    case 'boolean':
      return value ? 'true' : 'false';
    case 'number':
      if (!Number.isFinite(value)) throw notJson(path, `${value} is not a JSON number`);
      return JSON.stringify(value);
    case 'string':
      return fmt.escapeInvisible ? escapeInvisible(JSON.stringify(value)) : JSON.stringify(value);
    case 'object':
      if (value === null) return 'null';
      break;
    default:
      throw notJson(path, `a ${typeof value} is not a JSON value`);
  }
  if (depth >= MAX_JSON_DEPTH) throw notJson(path, `nested deeper than ${MAX_JSON_DEPTH} levels`);
  if (seen.has(value)) throw notJson(path, 'a cycle');
  const isArray = Array.isArray(value);
  const proto: unknown = Object.getPrototypeOf(value);
  if (!isArray && proto !== Object.prototype && proto !== null) {
    throw notJson(path, 'only plain objects and arrays are JSON (not a Date, Map, class instance...)');
  }
  seen.add(value);
  try {
    const open = fmt.indent === '' ? '' : `\n${fmt.indent.repeat(depth + 1)}`;
    const close = fmt.indent === '' ? '' : `\n${fmt.indent.repeat(depth)}`;
    const parts: string[] = [];
    if (isArray) {
      const arr = value as unknown[];
      for (let i = 0; i < arr.length; i++) {
        if (arr[i] === undefined) throw notJson(`${path}[${i}]`, 'undefined (or a hole) in an array');
        parts.push(open + writeJson(arr[i], `${path}[${i}]`, depth + 1, seen, fmt));
      }
      return parts.length === 0 ? '[]' : `[${parts.join(',')}${close}]`;
    }
    const obj = value as Record<string, unknown>;
    // Default sort compares UTF-16 code units, as RFC 8785 requires.
    for (const key of Object.keys(obj).sort()) {
      const member = obj[key];
      if (member === undefined) continue;
      const name = writeJson(key, path, depth, seen, fmt);
      const sep = fmt.indent === '' ? ':' : ': ';
      parts.push(
        open + name + sep + writeJson(member, `${path}${jsonPathSegment(key)}`, depth + 1, seen, fmt),
      );
    }
    return parts.length === 0 ? '{}' : `{${parts.join(',')}${close}}`;
  } finally {
    seen.delete(value);
  }
}

/**
 * Deterministic JSON: object keys sorted by UTF-16 code units, no whitespace, numbers and strings as
 * `JSON.stringify` writes them, `undefined` object members dropped, arrays in order. Throws
 * `INVALID_ARGUMENT` for anything that is not JSON (functions, NaN, Infinity, bigint, cycles, Dates).
 */
export function canonicalJson(value: unknown): string {
  return writeJson(value, '$', 0, new Set(), CANONICAL);
}

/** Sorted keys, 2-space indent, invisible characters escaped: for the lockfile and for diffs. */
export function prettyJson(value: unknown): string {
  return writeJson(value, '$', 0, new Set(), PRETTY);
}

export function jsonEqual(a: unknown, b: unknown, depth = 0): boolean {
  if (a === b) return true;
  if (typeof a !== 'object' || typeof b !== 'object' || a === null || b === null) return false;
  if (depth > MAX_JSON_DEPTH || Array.isArray(a) !== Array.isArray(b)) return false;
  if (Array.isArray(a) && Array.isArray(b)) {
    return a.length === b.length && a.every((v, i) => jsonEqual(v, b[i], depth + 1));
  }
  const ra = a as Record<string, unknown>;
  const rb = b as Record<string, unknown>;
  const ka = Object.keys(ra).filter((k) => ra[k] !== undefined);
  const kb = Object.keys(rb).filter((k) => rb[k] !== undefined);
  return (
    ka.length === kb.length && ka.every((k) => Object.hasOwn(rb, k) && jsonEqual(ra[k], rb[k], depth + 1))
  );
}

/** `.key` for plain identifiers, `["key"]` otherwise (escaped, so a hostile key cannot forge a path). */
export function jsonPathSegment(key: string): string {
  return /^[A-Za-z_$][\w$-]*$/.test(key) ? `.${key}` : `[${escapeInvisible(JSON.stringify(key))}]`;
}
