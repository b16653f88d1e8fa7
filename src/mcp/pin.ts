// SECURITY-CRITICAL: pinning of MCP server definitions (issue 4, "Definitions: scan and pin"). A server
// can change what a tool means after it was reviewed (a "rug pull"): the same name, a new description
// that instructs the model, a wider input schema. This module hashes each definition canonically,
// compares what a server lists now against what was pinned (in `airlock.lock.json`, or on first use in a
// session), and says which tools must be quarantined and why. Everything is pure and deterministic
// except `readLockfile`/`writeLockfile`. It only reports; the gateway enforces the quarantine.
//
// What is hashed (exactly these fields; any other field a server sends is ignored):
//   tool:              name, title, description, inputSchema, outputSchema, annotations, icons, execution
//   prompt:            name, title, description, arguments, icons
//   resource template: name, title, uriTemplate, description, mimeType, annotations, icons
//   instructions:      the string
// `icons` are included: clients show them as the tool's identity, so a swapped icon (or an icon URL moved
// to another host, which the client then fetches) changes what the user trusts. `execution` is included:
// it changes how a client must invoke the tool. `_meta` is excluded: it is protocol and extension
// bookkeeping, never the tool's description to the model, and varies between server builds, so hashing it
// would quarantine on noise. Consequence: nothing may act on a tool's `_meta` without pinning it itself.
//
// Schema widenings are reported in addition to the change itself: a changed tool is quarantined whether or
// not a widening was found, so a missed widening never lets a change through. The comparison is still
// conservative: what it cannot judge (`$ref`, `allOf`, `not`, `if`, unknown keywords) is 'changed-unknown'.

import { createHash, randomBytes } from 'node:crypto';
import {
  closeSync,
  fchmodSync,
  fsyncSync,
  openSync,
  readFileSync,
  renameSync,
  statSync,
  unlinkSync,
  writeSync,
} from 'node:fs';
import { basename, dirname, join } from 'node:path';
import type { Prompt, ResourceTemplate, Tool } from '@modelcontextprotocol/sdk/types.js';
import { z } from 'zod';
import { AirlockError } from '../core/errors.js';
import type { Severity } from './scan.js';

// ---------------------------------------------------------------------------------------------------
// Canonical JSON (RFC 8785 style)

/** Deeper values are refused: the serializer recurses, and a hostile peer can nest arbitrarily. */
const MAX_JSON_DEPTH = 512;

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
function escapeInvisible(s: string): string {
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
      parts.push(open + name + sep + writeJson(member, `${path}${segment(key)}`, depth + 1, seen, fmt));
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

function jsonEqual(a: unknown, b: unknown, depth = 0): boolean {
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

// ---------------------------------------------------------------------------------------------------
// Definitions and hashes

/** Structurally compatible with the SDK's `Tool` (extra fields such as `_meta` are accepted and ignored). */
export interface ToolDefinition {
  name: string;
  title?: string;
  description?: string;
  inputSchema?: unknown;
  outputSchema?: unknown;
  annotations?: unknown;
  icons?: unknown;
  execution?: unknown;
}

/** Structurally compatible with the SDK's `Prompt`. */
export interface PromptDefinition {
  name: string;
  title?: string;
  description?: string;
  arguments?: unknown;
  icons?: unknown;
}

/** Structurally compatible with the SDK's `ResourceTemplate`. */
export interface ResourceTemplateDefinition {
  name: string;
  title?: string;
  uriTemplate: string;
  description?: string;
  mimeType?: string;
  annotations?: unknown;
  icons?: unknown;
}

/**
 * What a server said about itself: initialize's instructions plus the three list results (all pages),
 * as the SDK types so callers can pass the visible ones on unchanged.
 */
export interface ServerDefinitions {
  instructions?: string;
  tools: Tool[];
  prompts: Prompt[];
  resourceTemplates: ResourceTemplate[];
}

/** `sha256:` and 64 lowercase hex digits. */
export type PinHash = string;

export interface PinEntry<T> {
  hash: PinHash;
  /** The pinned fields exactly as hashed, so a diff can be shown later. */
  definition: T;
}

export interface ServerPin {
  instructions?: PinEntry<string>;
  tools: Record<string, PinEntry<ToolDefinition>>;
  prompts: Record<string, PinEntry<PromptDefinition>>;
  /** Keyed by `uriTemplate` (by `name` if a server omits it). */
  resourceTemplates: Record<string, PinEntry<ResourceTemplateDefinition>>;
}

type Kind = 'tools' | 'prompts' | 'resourceTemplates';

interface KindSpec {
  kind: Kind;
  label: string;
  fields: readonly string[];
  keyOf(def: Record<string, unknown>): string;
}

const TOOL_FIELDS = 'name title description inputSchema outputSchema annotations icons execution'.split(' ');
const SPECS: Record<Kind, KindSpec> = {
  tools: { kind: 'tools', label: 'tool', fields: TOOL_FIELDS, keyOf: (d) => String(d.name) },
  prompts: {
    kind: 'prompts',
    label: 'prompt',
    fields: ['name', 'title', 'description', 'arguments', 'icons'],
    keyOf: (d) => String(d.name),
  },
  resourceTemplates: {
    kind: 'resourceTemplates',
    label: 'resource template',
    fields: ['name', 'title', 'uriTemplate', 'description', 'mimeType', 'annotations', 'icons'],
    keyOf: (d) =>
      typeof d.uriTemplate === 'string' && d.uriTemplate !== '' ? d.uriTemplate : String(d.name),
  },
};

function pick(value: object, fields: readonly string[]): Record<string, unknown> {
  const src = value as Record<string, unknown>;
  return Object.fromEntries(
    fields.filter((f) => Object.hasOwn(src, f) && src[f] !== undefined).map((f) => [f, src[f]]),
  );
}

function sha256(text: string): PinHash {
  return `sha256:${createHash('sha256').update(text, 'utf8').digest('hex')}`;
}

function hashOf(spec: KindSpec, def: object): PinHash {
  return sha256(canonicalJson(pick(def, spec.fields)));
}

/** The definition without its key field: equal identities under different keys are a rename. */
function identityHash(spec: KindSpec, def: Record<string, unknown>): PinHash {
  const rest = { ...def };
  delete rest[
    spec.kind === 'resourceTemplates' && typeof def.uriTemplate === 'string' ? 'uriTemplate' : 'name'
  ];
  return sha256(canonicalJson(rest));
}

/** sha256 over the canonical JSON of the pinned tool fields. */
export function hashTool(tool: ToolDefinition): PinHash {
  return hashOf(SPECS.tools, tool);
}
export function hashPrompt(prompt: PromptDefinition): PinHash {
  return hashOf(SPECS.prompts, prompt);
}
export function hashResourceTemplate(template: ResourceTemplateDefinition): PinHash {
  return hashOf(SPECS.resourceTemplates, template);
}
/** sha256 over the canonical JSON of the string (that is, with its quotes). */
export function hashInstructions(instructions: string): PinHash {
  return sha256(canonicalJson(instructions));
}

interface Indexed<T> {
  entries: Map<string, PinEntry<T>>;
  /** Keys listed more than once with different definitions: which one a client uses is unknowable. */
  duplicated: Set<string>;
}

function indexItems<T>(spec: KindSpec, items: readonly object[]): Indexed<T> {
  const entries = new Map<string, PinEntry<T>>();
  const duplicated = new Set<string>();
  for (const item of items) {
    const definition = pick(item, spec.fields);
    const key = spec.keyOf(definition);
    const hash = sha256(canonicalJson(definition));
    const seen = entries.get(key);
    if (seen !== undefined && seen.hash !== hash) duplicated.add(key);
    if (seen === undefined) entries.set(key, { hash, definition: definition as T });
  }
  for (const key of duplicated) entries.delete(key);
  return { entries, duplicated };
}

/** Code-unit order, as `Array.prototype.sort` without a comparator. */
const cmp = (a: string, b: string): number => (a < b ? -1 : a > b ? 1 : 0);

const toRecord = <T>(m: Map<string, T>): Record<string, T> =>
  Object.fromEntries([...m].sort(([a], [b]) => cmp(a, b)));

interface IndexedServer {
  pin: ServerPin;
  duplicated: Record<Kind, Set<string>>;
}

function indexServer(defs: ServerDefinitions): IndexedServer {
  const tools = indexItems<ToolDefinition>(SPECS.tools, defs.tools);
  const prompts = indexItems<PromptDefinition>(SPECS.prompts, defs.prompts);
  const templates = indexItems<ResourceTemplateDefinition>(SPECS.resourceTemplates, defs.resourceTemplates);
  const pin: ServerPin = {
    tools: toRecord(tools.entries),
    prompts: toRecord(prompts.entries),
    resourceTemplates: toRecord(templates.entries),
  };
  if (defs.instructions !== undefined) {
    pin.instructions = { hash: hashInstructions(defs.instructions), definition: defs.instructions };
  }
  return {
    pin,
    duplicated: {
      tools: tools.duplicated,
      prompts: prompts.duplicated,
      resourceTemplates: templates.duplicated,
    },
  };
}

/**
 * Pin a server's definitions. Throws `MCP_SERVER_FAILED` if the server lists one name twice with
 * different definitions (nothing trustworthy can be pinned for it); identical repeats are collapsed.
 */
export function pinDefinitions(defs: ServerDefinitions): ServerPin {
  const { pin, duplicated } = indexServer(defs);
  for (const kind of Object.keys(duplicated) as Kind[]) {
    const first = [...duplicated[kind]].sort()[0];
    if (first !== undefined) {
      throw new AirlockError(
        'MCP_SERVER_FAILED',
        `The server lists ${SPECS[kind].label} ${displayName(first)} more than once with different definitions; refusing to pin it`,
        { field: `${kind}[${first}]` },
      );
    }
  }
  return pin;
}

// ---------------------------------------------------------------------------------------------------
// Comparing

export const WIDENING_KINDS = [
  'schema-opened',
  'additional-properties-opened',
  'property-added',
  'property-removed',
  'required-dropped',
  'type-broadened',
  'type-removed',
  'enum-extended',
  'enum-removed',
  'const-changed',
  'const-removed',
  'limit-raised',
  'limit-lowered',
  'limit-removed',
  'multiple-of-relaxed',
  'pattern-changed',
  'pattern-removed',
  'format-changed',
  'format-removed',
  'unique-items-dropped',
  'branch-added',
  'keyword-removed',
  'changed-unknown',
] as const;
export type WideningKind = (typeof WIDENING_KINDS)[number];

export interface Widening {
  /** Dotted path from the schema root, e.g. `inputSchema.properties.path.maxLength`. */
  path: string;
  kind: WideningKind;
  before?: unknown;
  after?: unknown;
  message: string;
}

export interface ChangedEntry<T> {
  name: string;
  before: PinEntry<T>;
  after: PinEntry<T>;
  /** Top-level pinned fields whose values differ, e.g. `['description', 'inputSchema']`. */
  fields: string[];
  /** Ways the new inputSchema accepts more (tools only; empty for prompts and templates). */
  widenings: Widening[];
}

export interface KindDiff<T> {
  unchanged: string[];
  changed: Array<ChangedEntry<T>>;
  added: string[];
  removed: string[];
  /** A removed and an added item identical except for the name (the key). */
  renamed: Array<{ from: string; to: string }>;
  /** Listed more than once with different definitions; neither pinned nor usable. */
  duplicated: string[];
}

export interface PinDiff {
  pinned: ServerPin;
  /** The current definitions pinned the same way (duplicated names left out). */
  current: ServerPin;
  tools: KindDiff<ToolDefinition>;
  prompts: KindDiff<PromptDefinition>;
  resourceTemplates: KindDiff<ResourceTemplateDefinition>;
  instructionsChanged: boolean;
}

function compareKind<T>(
  spec: KindSpec,
  pinned: Record<string, PinEntry<T>>,
  current: Record<string, PinEntry<T>>,
  duplicated: Set<string>,
): KindDiff<T> {
  const before = new Map(Object.entries(pinned));
  const after = new Map(Object.entries(current));
  const diff: KindDiff<T> = {
    unchanged: [],
    changed: [],
    added: [],
    removed: [],
    renamed: [],
    duplicated: [...duplicated].sort(),
  };
  const keys = [...new Set([...before.keys(), ...after.keys()])].sort();
  for (const key of keys) {
    if (duplicated.has(key)) continue;
    const b = before.get(key);
    const a = after.get(key);
    if (b === undefined) diff.added.push(key);
    else if (a === undefined) diff.removed.push(key);
    else if (b.hash === a.hash) diff.unchanged.push(key);
    else {
      const bd = b.definition as Record<string, unknown>;
      const ad = a.definition as Record<string, unknown>;
      diff.changed.push({
        name: key,
        before: b,
        after: a,
        fields: spec.fields.filter((f) => !jsonEqual(bd[f], ad[f])),
        widenings:
          spec.kind === 'tools' ? schemaWidenings(bd.inputSchema, ad.inputSchema, 'inputSchema') : [],
      });
    }
  }
  // Renames: pair each removed item with the first unused added item of the same identity.
  const addedByIdentity = new Map<string, string[]>();
  for (const key of diff.added) {
    const id = identityHash(spec, after.get(key)!.definition as Record<string, unknown>);
    addedByIdentity.set(id, [...(addedByIdentity.get(id) ?? []), key]);
  }
  const renamedFrom = new Set<string>();
  const renamedTo = new Set<string>();
  for (const key of diff.removed) {
    const candidates = addedByIdentity.get(
      identityHash(spec, before.get(key)!.definition as Record<string, unknown>),
    );
    const to = candidates?.shift();
    if (to === undefined) continue;
    diff.renamed.push({ from: key, to });
    renamedFrom.add(key);
    renamedTo.add(to);
  }
  diff.removed = diff.removed.filter((k) => !renamedFrom.has(k));
  diff.added = diff.added.filter((k) => !renamedTo.has(k));
  return diff;
}

/** Compare what a server lists now with a pin. Pure; throws only for non-JSON definitions. */
export function comparePins(pinned: ServerPin, current: ServerDefinitions): PinDiff {
  const { pin, duplicated } = indexServer(current);
  return {
    pinned,
    current: pin,
    tools: compareKind(SPECS.tools, pinned.tools, pin.tools, duplicated.tools),
    prompts: compareKind(SPECS.prompts, pinned.prompts, pin.prompts, duplicated.prompts),
    resourceTemplates: compareKind(
      SPECS.resourceTemplates,
      pinned.resourceTemplates,
      pin.resourceTemplates,
      duplicated.resourceTemplates,
    ),
    instructionsChanged: pinned.instructions?.hash !== pin.instructions?.hash,
  };
}

/** True when nothing differs from the pin. */
export function isCleanDiff(diff: PinDiff): boolean {
  const kinds = [diff.tools, diff.prompts, diff.resourceTemplates] as Array<KindDiff<unknown>>;
  return (
    !diff.instructionsChanged &&
    kinds.every(
      (k) =>
        k.changed.length + k.added.length + k.removed.length + k.renamed.length + k.duplicated.length === 0,
    )
  );
}

export interface PinMessageOptions {
  /** Trust on first use: the baseline is what this session saw first, not a lockfile. */
  firstUse?: boolean;
}

const shortHash = (h: string): string => `${h.slice(0, 'sha256:'.length + 12)}…`;
const since = (o: PinMessageOptions): string =>
  o.firstUse ? 'since it was first seen in this session' : 'since it was pinned';
const notInBaseline = (o: PinMessageOptions): string =>
  o.firstUse ? 'appeared after the first listing of this session' : 'is not in the pin';
const APPROVE = 'run `airlock mcp pin` to approve';

/** Changed, renamed-to, added and duplicated tools, each with a model/operator-readable reason. */
export function quarantinedTools(diff: PinDiff, opts: PinMessageOptions = {}): Map<string, string> {
  const out = new Map<string, string>();
  for (const c of diff.tools.changed) {
    const fields = c.fields.length > 0 ? `; changed: ${c.fields.join(', ')}` : '';
    out.set(
      c.name,
      `Tool ${displayName(c.name)} changed ${since(opts)} (${shortHash(c.before.hash)} → ${shortHash(c.after.hash)}${fields}); ${APPROVE}`,
    );
  }
  for (const r of diff.tools.renamed) {
    out.set(
      r.to,
      `Tool ${displayName(r.to)} is tool ${displayName(r.from)} renamed ${since(opts)}; ${APPROVE}`,
    );
  }
  for (const name of diff.tools.added) {
    out.set(name, `Tool ${displayName(name)} is new: it ${notInBaseline(opts)}; ${APPROVE}`);
  }
  for (const name of diff.tools.duplicated) {
    out.set(
      name,
      `Tool ${displayName(name)} is listed more than once with different definitions; it cannot be pinned or called`,
    );
  }
  return out;
}

// ---------------------------------------------------------------------------------------------------
// Schema widening

const MAX_SCHEMA_DEPTH = 64;
const MAX_SCHEMA_NODES = 10_000;
const MAX_WIDENINGS = 200;

/** Keywords that never change which values validate. */
const ANNOTATIONS = new Set(
  'title description $comment examples default deprecated readOnly writeOnly'.split(' '),
);
const MAX_LIMITS = new Set(['maxLength', 'maxItems', 'maximum', 'maxProperties', 'maxContains']);
const MIN_LIMITS = new Set(['minLength', 'minItems', 'minimum', 'minProperties', 'minContains']);
/** Adding one of these only adds a constraint. */
const NARROWING_WHEN_ADDED = new Set([
  ...MAX_LIMITS,
  ...MIN_LIMITS,
  ...'allOf anyOf oneOf not if then else contains dependentRequired dependentSchemas dependencies'.split(' '),
  ...'propertyNames uniqueItems multipleOf required enum const pattern format type'.split(' '),
  ...'exclusiveMaximum exclusiveMinimum items prefixItems additionalItems unevaluatedItems'.split(' '),
  'unevaluatedProperties',
]);
const PROPERTY_KEYWORDS = new Set(['properties', 'additionalProperties', 'patternProperties']);

interface WalkContext {
  out: Widening[];
  nodes: number;
  truncated: boolean;
}

type Schema = Record<string, unknown>;

const isObject = (v: unknown): v is Record<string, unknown> =>
  typeof v === 'object' && v !== null && !Array.isArray(v);
const own = (o: Record<string, unknown>, k: string): unknown => (Object.hasOwn(o, k) ? o[k] : undefined);

/** `.key` for plain identifiers, `["key"]` otherwise (escaped, so a hostile key cannot forge a path). */
function segment(key: string): string {
  return /^[A-Za-z_$][\w$-]*$/.test(key) ? `.${key}` : `[${escapeInvisible(JSON.stringify(key))}]`;
}

/** A name for messages: quoted, invisible characters escaped, at most 200 characters. */
function displayName(name: string): string {
  const shown = escapeInvisible(JSON.stringify(name));
  return shown.length > 200 ? `${shown.slice(0, 199)}…"` : shown;
}

/** A value for messages: compact JSON, invisible characters escaped, at most 80 characters. */
function brief(value: unknown): string {
  if (value === undefined) return '(absent)';
  let text: string;
  try {
    text = escapeInvisible(canonicalJson(value));
  } catch {
    text = '(not JSON)';
  }
  return text.length > 80 ? `${text.slice(0, 79)}…` : text;
}

/** Canonical text of each value, for set lookups (a value that cannot be serialized matches nothing). */
function canonicalKeys(values: readonly unknown[]): string[] {
  return values.map((v, i) => {
    try {
      return canonicalJson(v);
    } catch {
      return `\u0000unserializable ${i}`;
    }
  });
}

function acceptsAnything(s: unknown): boolean {
  return s === undefined || s === true || (isObject(s) && Object.keys(s).every((k) => ANNOTATIONS.has(k)));
}

function push(ctx: WalkContext, w: Widening): void {
  if (ctx.out.length < MAX_WIDENINGS) ctx.out.push(w);
  else ctx.truncated = true;
}

function unknownChange(ctx: WalkContext, path: string, before: unknown, after: unknown, why: string): void {
  push(ctx, {
    path,
    kind: 'changed-unknown',
    before,
    after,
    message: `${why}; cannot tell whether it accepts more`,
  });
}

/**
 * Every way `after` accepts input that `before` rejected, as far as can be told without evaluating
 * schemas. Narrowings and annotation edits (title, description, default...) are not reported.
 */
export function schemaWidenings(before: unknown, after: unknown, path = 'inputSchema'): Widening[] {
  const ctx: WalkContext = { out: [], nodes: 0, truncated: false };
  walk(before, after, path, 0, ctx);
  if (ctx.truncated) {
    ctx.out.push({
      path,
      kind: 'changed-unknown',
      message: `More than ${MAX_WIDENINGS} widenings; the rest are not listed`,
    });
  }
  return ctx.out;
}

function walk(before: unknown, after: unknown, path: string, depth: number, ctx: WalkContext): void {
  if (jsonEqual(before, after)) return;
  if (++ctx.nodes > MAX_SCHEMA_NODES || depth > MAX_SCHEMA_DEPTH) {
    unknownChange(ctx, path, undefined, undefined, 'Schema too large or too deep to compare');
    return;
  }
  if (acceptsAnything(before) || after === false) return;
  if (acceptsAnything(after)) {
    push(ctx, {
      path,
      kind: 'schema-opened',
      before,
      after,
      message: `Now accepts any value (was ${brief(before)})`,
    });
    return;
  }
  if (before === false) {
    push(ctx, {
      path,
      kind: 'schema-opened',
      before,
      after,
      message: `Accepted nothing, now accepts ${brief(after)}`,
    });
    return;
  }
  if (!isObject(before) || !isObject(after)) {
    unknownChange(ctx, path, before, after, 'Not a JSON Schema object');
    return;
  }
  const keys = [...new Set([...Object.keys(before), ...Object.keys(after)])].sort();
  let propertiesDone = false;
  for (const k of keys) {
    const b = own(before, k);
    const a = own(after, k);
    if (ANNOTATIONS.has(k) || jsonEqual(b, a)) continue;
    if (PROPERTY_KEYWORDS.has(k)) {
      if (!propertiesDone) compareProperties(before, after, path, depth, ctx);
      propertiesDone = true;
      continue;
    }
    compareKeyword(k, b, a, `${path}${segment(k)}`, depth, ctx);
  }
}

function compareKeyword(
  k: string,
  b: unknown,
  a: unknown,
  path: string,
  depth: number,
  ctx: WalkContext,
): void {
  if (b === undefined && NARROWING_WHEN_ADDED.has(k)) return;
  if (MAX_LIMITS.has(k) || MIN_LIMITS.has(k) || k === 'exclusiveMaximum' || k === 'exclusiveMinimum') {
    compareLimit(k, b, a, path, ctx);
    return;
  }
  switch (k) {
    case 'type':
      return compareType(b, a, path, ctx);
    case 'enum':
      return compareEnum(b, a, path, ctx);
    case 'const':
      if (a === undefined)
        push(ctx, { path, kind: 'const-removed', before: b, message: `const ${brief(b)} removed` });
      else
        push(ctx, {
          path,
          kind: 'const-changed',
          before: b,
          after: a,
          message: `const changed from ${brief(b)} to ${brief(a)}`,
        });
      return;
    case 'pattern':
    case 'format': {
      const kind = `${k}-${a === undefined ? 'removed' : 'changed'}` as WideningKind;
      const to = a === undefined ? 'removed' : `changed to ${brief(a)}`;
      push(ctx, { path, kind, before: b, after: a, message: `${k} ${brief(b)} ${to}` });
      return;
    }
    case 'multipleOf': {
      const tighter = typeof b === 'number' && typeof a === 'number' && a !== 0 && Number.isInteger(a / b);
      if (!tighter) {
        push(ctx, {
          path,
          kind: 'multiple-of-relaxed',
          before: b,
          after: a,
          message: `multipleOf ${brief(b)} → ${brief(a)}`,
        });
      }
      return;
    }
    case 'uniqueItems':
      if (b === true && a !== true) {
        push(ctx, {
          path,
          kind: 'unique-items-dropped',
          before: b,
          after: a,
          message: 'Duplicate items now accepted',
        });
      }
      return;
    case 'required':
      return compareRequired(b, a, path, ctx);
    case 'items':
    case 'prefixItems':
    case 'additionalItems':
    case 'unevaluatedItems':
    case 'unevaluatedProperties':
    case 'propertyNames':
      if (Array.isArray(b) || Array.isArray(a)) return compareTuple(b, a, path, depth, ctx);
      return walk(b, a, path, depth + 1, ctx);
    case 'contains':
      if (a === undefined) return keywordRemoved(ctx, path, b);
      return walk(b, a, path, depth + 1, ctx);
    case 'anyOf':
    case 'oneOf':
      return compareBranches(k, b, a, path, depth, ctx);
    case '$defs':
    case 'definitions':
      // New definitions change nothing until something refers to them (which is its own change).
      if (isObject(b) && isObject(a) && Object.keys(b).every((d) => jsonEqual(b[d], own(a, d)))) return;
      return unknownChange(ctx, path, undefined, undefined, `${k} changed (referenced definitions)`);
    default:
      if (a === undefined) return keywordRemoved(ctx, path, b);
      return unknownChange(ctx, path, b, a, `${k} ${b === undefined ? 'added' : 'changed'}`);
  }
}

function keywordRemoved(ctx: WalkContext, path: string, before: unknown): void {
  push(ctx, { path, kind: 'keyword-removed', before, message: `Constraint removed (was ${brief(before)})` });
}

function compareLimit(k: string, b: unknown, a: unknown, path: string, ctx: WalkContext): void {
  const isMax = MAX_LIMITS.has(k) || k === 'exclusiveMaximum';
  if (a === undefined && typeof b === 'number') {
    push(ctx, { path, kind: 'limit-removed', before: b, message: `${k} ${brief(b)} removed` });
    return;
  }
  if (typeof b === 'number' && typeof a === 'number') {
    if (isMax && a > b)
      push(ctx, {
        path,
        kind: 'limit-raised',
        before: b,
        after: a,
        message: `${k} raised from ${b} to ${a}`,
      });
    if (!isMax && a < b)
      push(ctx, {
        path,
        kind: 'limit-lowered',
        before: b,
        after: a,
        message: `${k} lowered from ${b} to ${a}`,
      });
    return;
  }
  if (b === true && a !== true) {
    push(ctx, {
      path,
      kind: 'limit-removed',
      before: b,
      after: a,
      message: `${k} (draft-04 flag) turned off`,
    });
    return;
  }
  if (b === false && (a === true || a === undefined)) return; // draft-04 exclusive flag turned on, or still off
  unknownChange(ctx, path, b, a, `${k} changed from ${brief(b)} to ${brief(a)}`);
}

function typeSet(t: unknown): string[] | undefined {
  if (typeof t === 'string') return [t];
  if (Array.isArray(t) && t.every((x) => typeof x === 'string')) return t as string[];
  return undefined;
}

function compareType(b: unknown, a: unknown, path: string, ctx: WalkContext): void {
  const bt = typeSet(b);
  const at = typeSet(a);
  if (bt !== undefined && a === undefined) {
    push(ctx, {
      path,
      kind: 'type-removed',
      before: b,
      message: `type ${brief(b)} removed: any type accepted`,
    });
    return;
  }
  if (bt === undefined || at === undefined) {
    unknownChange(ctx, path, b, a, `type changed from ${brief(b)} to ${brief(a)}`);
    return;
  }
  const added = at.filter((t) => !bt.includes(t) && !(t === 'integer' && bt.includes('number')));
  if (added.length > 0) {
    push(ctx, {
      path,
      kind: 'type-broadened',
      before: b,
      after: a,
      message: `type ${brief(b)} broadened to ${brief(a)}`,
    });
  }
}

function compareEnum(b: unknown, a: unknown, path: string, ctx: WalkContext): void {
  if (!Array.isArray(b)) return unknownChange(ctx, path, b, a, 'enum changed');
  if (a === undefined) {
    push(ctx, { path, kind: 'enum-removed', before: b, message: `enum ${brief(b)} removed` });
    return;
  }
  if (!Array.isArray(a)) return unknownChange(ctx, path, b, a, 'enum changed');
  const known = new Set(canonicalKeys(b));
  const aKeys = canonicalKeys(a);
  const extra = a.filter((_, i) => !known.has(aKeys[i]!));
  if (extra.length > 0) {
    push(ctx, {
      path,
      kind: 'enum-extended',
      before: b,
      after: a,
      message: `enum now also accepts ${brief(extra)}`,
    });
  }
}

function compareRequired(b: unknown, a: unknown, path: string, ctx: WalkContext): void {
  if (!Array.isArray(b)) return unknownChange(ctx, path, b, a, 'required changed');
  const now = new Set(Array.isArray(a) ? a : []);
  for (const name of b) {
    if (now.has(name)) continue;
    push(ctx, {
      path,
      kind: 'required-dropped',
      before: name,
      message: `${typeof name === 'string' ? displayName(name) : brief(name)} is no longer required`,
    });
  }
}

function compareTuple(b: unknown, a: unknown, path: string, depth: number, ctx: WalkContext): void {
  if (!Array.isArray(b) || !Array.isArray(a)) {
    if (Array.isArray(b) && a === undefined) return keywordRemoved(ctx, path, b);
    return unknownChange(ctx, path, undefined, undefined, 'Tuple form changed');
  }
  for (let i = 0; i < Math.min(b.length, a.length); i++) walk(b[i], a[i], `${path}[${i}]`, depth + 1, ctx);
  if (b.length !== a.length) {
    unknownChange(ctx, path, b.length, a.length, `Tuple length changed from ${b.length} to ${a.length}`);
  }
}

function compareBranches(
  k: string,
  b: unknown,
  a: unknown,
  path: string,
  depth: number,
  ctx: WalkContext,
): void {
  if (!Array.isArray(b)) return unknownChange(ctx, path, undefined, undefined, `${k} changed`);
  if (a === undefined) return keywordRemoved(ctx, path, b);
  if (!Array.isArray(a)) return unknownChange(ctx, path, undefined, undefined, `${k} changed`);
  const bKeys = canonicalKeys(b);
  const aKeys = canonicalKeys(a);
  const inAfter = new Set(aKeys);
  const inBefore = new Set(bKeys);
  const unmatchedBefore = b.filter((_, i) => !inAfter.has(bKeys[i]!));
  const unmatchedAfter = a.map((x, i) => ({ x, i })).filter(({ i }) => !inBefore.has(aKeys[i]!));
  unmatchedAfter.forEach(({ x, i }, n) => {
    const counterpart = unmatchedBefore[n];
    if (counterpart === undefined) {
      push(ctx, {
        path: `${path}[${i}]`,
        kind: 'branch-added',
        after: x,
        message: `${k} gained a branch ${brief(x)}`,
      });
    } else if (k === 'anyOf') {
      walk(counterpart, x, `${path}[${i}]`, depth + 1, ctx);
    } else {
      // oneOf: narrowing a branch can let a value match exactly one branch where it matched two.
      unknownChange(ctx, `${path}[${i}]`, counterpart, x, 'oneOf branch changed');
    }
  });
  if (k === 'oneOf' && unmatchedBefore.length > unmatchedAfter.length) {
    unknownChange(ctx, path, undefined, undefined, 'oneOf lost a branch');
  }
}

function compareProperties(
  before: Schema,
  after: Schema,
  path: string,
  depth: number,
  ctx: WalkContext,
): void {
  const bp = own(before, 'properties') ?? {};
  const ap = own(after, 'properties') ?? {};
  const bAdd = own(before, 'additionalProperties');
  const aAdd = own(after, 'additionalProperties');
  const bPat = own(before, 'patternProperties');
  const aPat = own(after, 'patternProperties');
  if (!isObject(bp) || !isObject(ap)) {
    unknownChange(ctx, `${path}.properties`, undefined, undefined, 'properties is not an object');
    return;
  }
  // unevaluatedProperties: false closes the object too (as far as can be told without evaluating allOf...).
  const closed = bAdd === false || (bAdd === undefined && own(before, 'unevaluatedProperties') === false);
  const addPath = `${path}.additionalProperties`;
  if (bAdd === false && aAdd !== false) {
    push(ctx, {
      path: addPath,
      kind: 'additional-properties-opened',
      before: bAdd,
      after: aAdd,
      message: `additionalProperties was false, now ${brief(aAdd)}: unlisted properties accepted`,
    });
  } else if (bAdd !== false) {
    walk(bAdd, aAdd, addPath, depth + 1, ctx);
  }
  if (!jsonEqual(bPat, aPat)) {
    if (isObject(bPat) && isObject(aPat)) {
      for (const p of Object.keys(bPat).sort()) {
        const sub = `${path}.patternProperties${segment(p)}`;
        if (Object.hasOwn(aPat, p)) walk(bPat[p], aPat[p], sub, depth + 1, ctx);
        else keywordRemoved(ctx, sub, bPat[p]);
      }
      if (bAdd === false && Object.keys(aPat).some((p) => !Object.hasOwn(bPat, p))) {
        unknownChange(
          ctx,
          `${path}.patternProperties`,
          undefined,
          undefined,
          'patternProperties gained a pattern',
        );
      }
    } else if (aPat === undefined) {
      keywordRemoved(ctx, `${path}.patternProperties`, bPat);
    } else if (bPat !== undefined || bAdd === false) {
      unknownChange(ctx, `${path}.patternProperties`, bPat, aPat, 'patternProperties changed');
    }
  }
  // With patternProperties, which schema governed an unlisted key depends on regexes: do not guess.
  const patterns = bPat !== undefined || aPat !== undefined;
  const keys = [...new Set([...Object.keys(bp), ...Object.keys(ap)])].sort();
  for (const key of keys) {
    const sub = `${path}.properties${segment(key)}`;
    const inBefore = Object.hasOwn(bp, key);
    const inAfter = Object.hasOwn(ap, key);
    if (inBefore && inAfter) {
      walk(bp[key], ap[key], sub, depth + 1, ctx);
    } else if (inAfter) {
      if (closed && !patterns) {
        push(ctx, {
          path: sub,
          kind: 'property-added',
          after: ap[key],
          message: `New property ${displayName(key)} accepted (additionalProperties was false)`,
        });
      } else if (patterns) {
        unknownChange(
          ctx,
          sub,
          undefined,
          ap[key],
          `Property ${displayName(key)} added next to patternProperties`,
        );
      } else {
        walk(bAdd, ap[key], sub, depth + 1, ctx);
      }
    } else if (aAdd === false && !patterns) {
      continue; // the property is now rejected outright
    } else if (patterns) {
      unknownChange(
        ctx,
        sub,
        bp[key],
        undefined,
        `Property ${displayName(key)} removed next to patternProperties`,
      );
    } else if (acceptsAnything(aAdd)) {
      if (!acceptsAnything(bp[key])) {
        push(ctx, {
          path: sub,
          kind: 'property-removed',
          before: bp[key],
          message: `Property ${displayName(key)} lost its schema: any value accepted`,
        });
      }
    } else {
      walk(bp[key], aAdd, sub, depth + 1, ctx);
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// Findings and the text diff

export const PIN_RULE_IDS = [
  'definition-changed',
  'definition-added',
  'definition-renamed',
  'definition-removed',
  'definition-duplicated',
  'schema-widened',
  'instructions-changed',
] as const;
export type PinRuleId = (typeof PIN_RULE_IDS)[number];

/** Same shape as the scanner's `Finding`, with the pin rule ids. */
export interface PinFinding {
  ruleId: PinRuleId;
  severity: Severity;
  /** e.g. `tools["write_file"].inputSchema.properties.path.maxLength`. */
  location: string;
  excerpt: string;
  message: string;
}

const KINDS: Kind[] = ['tools', 'prompts', 'resourceTemplates'];
/** `tools[write_file]`, like the scanner's locations: the name JSON-escaped, without its quotes. */
const where = (kind: Kind, key: string): string => `${kind}[${displayName(key).slice(1, -1)}]`;

/** Findings for a diff, sorted by location then rule id. */
export function diffFindings(serverName: string, diff: PinDiff, opts: PinMessageOptions = {}): PinFinding[] {
  const server = `Server ${displayName(serverName)}`;
  const out: PinFinding[] = [];
  for (const kind of KINDS) {
    const spec = SPECS[kind];
    const d = diff[kind] as KindDiff<unknown>;
    for (const c of d.changed) {
      out.push({
        ruleId: 'definition-changed',
        severity: 'high',
        location: where(kind, c.name),
        excerpt: `${shortHash(c.before.hash)} → ${shortHash(c.after.hash)}`,
        message: `${server}: ${spec.label} ${displayName(c.name)} changed ${since(opts)} (${c.fields.join(', ') || 'definition'})`,
      });
      for (const w of c.widenings) {
        out.push({
          ruleId: 'schema-widened',
          severity: 'high',
          location: `${where(kind, c.name)}.${w.path}`,
          excerpt: `${brief(w.before)} → ${brief(w.after)}`,
          message: `${server}: ${spec.label} ${displayName(c.name)} accepts more input ${since(opts)}: ${w.message}`,
        });
      }
    }
    for (const name of d.added) {
      const hash = diff.current[kind][name]?.hash ?? '';
      out.push({
        ruleId: 'definition-added',
        severity: 'high',
        location: where(kind, name),
        excerpt: shortHash(hash),
        message: `${server}: new ${spec.label} ${displayName(name)} ${notInBaseline(opts)}`,
      });
    }
    for (const r of d.renamed) {
      out.push({
        ruleId: 'definition-renamed',
        severity: 'high',
        location: where(kind, r.to),
        excerpt: `${displayName(r.from)} → ${displayName(r.to)}`,
        message: `${server}: ${spec.label} ${displayName(r.from)} was renamed to ${displayName(r.to)}`,
      });
    }
    for (const name of d.removed) {
      out.push({
        ruleId: 'definition-removed',
        severity: 'low',
        location: where(kind, name),
        excerpt: shortHash(diff.pinned[kind][name]?.hash ?? ''),
        message: `${server}: ${spec.label} ${displayName(name)} is no longer listed`,
      });
    }
    for (const name of d.duplicated) {
      out.push({
        ruleId: 'definition-duplicated',
        severity: 'high',
        location: where(kind, name),
        excerpt: displayName(name),
        message: `${server}: ${spec.label} ${displayName(name)} is listed more than once with different definitions`,
      });
    }
  }
  if (diff.instructionsChanged) {
    const now = diff.current.instructions?.definition;
    out.push({
      ruleId: 'instructions-changed',
      severity: 'high',
      location: 'instructions',
      excerpt: now === undefined ? '(removed)' : brief(now),
      message: `${server}: server instructions changed ${since(opts)}`,
    });
  }
  return out.sort((a, b) => cmp(a.location, b.location) || cmp(a.ruleId, b.ruleId));
}

type Op = { op: ' ' | '-' | '+'; line: string };

/** Line diff: common prefix and suffix, then LCS on the middle (all-removed/all-added if too large). */
function lineDiff(a: string[], b: string[]): Op[] {
  let start = 0;
  while (start < a.length && start < b.length && a[start] === b[start]) start++;
  let endA = a.length;
  let endB = b.length;
  while (endA > start && endB > start && a[endA - 1] === b[endB - 1]) {
    endA--;
    endB--;
  }
  const ops: Op[] = a.slice(0, start).map((line) => ({ op: ' ', line }));
  const ma = a.slice(start, endA);
  const mb = b.slice(start, endB);
  const n = ma.length;
  const m = mb.length;
  if (n * m > 4_000_000) {
    ops.push(...ma.map((line): Op => ({ op: '-', line })), ...mb.map((line): Op => ({ op: '+', line })));
  } else {
    const lcs = new Uint32Array((n + 1) * (m + 1));
    const at = (i: number, j: number) => lcs[i * (m + 1) + j]!;
    for (let i = n - 1; i >= 0; i--) {
      for (let j = m - 1; j >= 0; j--) {
        lcs[i * (m + 1) + j] = ma[i] === mb[j] ? at(i + 1, j + 1) + 1 : Math.max(at(i + 1, j), at(i, j + 1));
      }
    }
    let i = 0;
    let j = 0;
    while (i < n || j < m) {
      if (i < n && j < m && ma[i] === mb[j]) {
        ops.push({ op: ' ', line: ma[i++]! });
        j++;
      } else if (i < n && (j === m || at(i + 1, j) >= at(i, j + 1))) ops.push({ op: '-', line: ma[i++]! });
      else ops.push({ op: '+', line: mb[j++]! });
    }
  }
  ops.push(...a.slice(endA).map((line): Op => ({ op: ' ', line })));
  return ops;
}

/** Unified-diff hunks with `context` lines around each change. */
function unified(before: string, after: string, context = 3): string[] {
  const ops = lineDiff(before.split('\n'), after.split('\n'));
  const changed = ops.flatMap((o, i) => (o.op === ' ' ? [] : [i]));
  const out: string[] = ['--- pinned', '+++ current'];
  let k = 0;
  while (k < changed.length) {
    let last = k;
    while (last + 1 < changed.length && changed[last + 1]! - changed[last]! <= 2 * context + 1) last++;
    const from = Math.max(0, changed[k]! - context);
    const to = Math.min(ops.length, changed[last]! + context + 1);
    let oldLine = 1;
    let newLine = 1;
    for (const o of ops.slice(0, from)) {
      if (o.op !== '+') oldLine++;
      if (o.op !== '-') newLine++;
    }
    const hunk = ops.slice(from, to);
    const oldCount = hunk.filter((o) => o.op !== '+').length;
    const newCount = hunk.filter((o) => o.op !== '-').length;
    out.push(`@@ -${oldLine},${oldCount} +${newLine},${newCount} @@`, ...hunk.map((o) => `${o.op}${o.line}`));
    k = last + 1;
  }
  return out;
}

const indent = (lines: string[], prefix = '    '): string[] => lines.map((l) => prefix + l);

/** Readable text for `airlock mcp diff`: a status line per difference, line diffs of changed definitions. */
export function formatDiff(serverName: string, diff: PinDiff): string {
  const lines: string[] = [];
  const count = (d: KindDiff<unknown>): string => {
    const parts: Array<[number, string]> = [
      [d.changed.length, 'changed'],
      [d.added.length, 'added'],
      [d.removed.length, 'removed'],
      [d.renamed.length, 'renamed'],
      [d.duplicated.length, 'duplicated'],
      [d.unchanged.length, 'unchanged'],
    ];
    return (
      parts
        .filter(([n]) => n > 0)
        .map(([n, what]) => `${n} ${what}`)
        .join(', ') || 'none'
    );
  };
  const clean = isCleanDiff(diff);
  lines.push(`Server ${displayName(serverName)}: ${clean ? 'matches the pin' : 'differs from the pin'}`);
  for (const kind of KINDS) lines.push(`  ${kind}: ${count(diff[kind] as KindDiff<unknown>)}`);
  lines.push(`  instructions: ${diff.instructionsChanged ? 'changed' : 'unchanged'}`);
  for (const kind of KINDS) {
    const label = SPECS[kind].label;
    const d = diff[kind] as KindDiff<unknown>;
    for (const c of d.changed) {
      lines.push(
        '',
        `~ ${label} ${displayName(c.name)} changed (${shortHash(c.before.hash)} → ${shortHash(c.after.hash)})`,
      );
      for (const w of c.widenings) lines.push(`    ! widened at ${w.path}: ${w.message}`);
      lines.push(...indent(unified(prettyJson(c.before.definition), prettyJson(c.after.definition))));
    }
    for (const name of d.added) {
      const entry = diff.current[kind][name];
      lines.push('', `+ ${label} ${displayName(name)} added (${shortHash(entry?.hash ?? '')})`);
      if (entry) lines.push(...indent(prettyJson(entry.definition).split('\n'), '    +'));
    }
    for (const r of d.renamed) {
      lines.push(
        '',
        `> ${label} ${displayName(r.from)} renamed to ${displayName(r.to)} (definition otherwise unchanged)`,
      );
    }
    for (const name of d.removed) lines.push('', `- ${label} ${displayName(name)} removed`);
    for (const name of d.duplicated) {
      lines.push('', `! ${label} ${displayName(name)} listed more than once with different definitions`);
    }
  }
  if (diff.instructionsChanged) {
    const show = (e: PinEntry<string> | undefined) =>
      e === undefined ? '' : e.definition.split('\n').map(escapeInvisible).join('\n');
    lines.push('', '~ instructions changed');
    lines.push(...indent(unified(show(diff.pinned.instructions), show(diff.current.instructions))));
  }
  return `${lines.join('\n')}\n`;
}

// ---------------------------------------------------------------------------------------------------
// Lockfile

export const LOCKFILE_NAME = 'airlock.lock.json';
const MAX_LOCKFILE_BYTES = 32 * 1024 * 1024;

const HashSchema = z
  .string()
  .regex(/^sha256:[0-9a-f]{64}$/, 'expected "sha256:" and 64 lowercase hex digits');
const entrySchema = <T extends z.ZodType>(definition: T) =>
  z.object({ hash: HashSchema, definition }).strict();

const ToolDefinitionSchema = z
  .object({
    name: z.string(),
    title: z.string().optional(),
    description: z.string().optional(),
    inputSchema: z.unknown().optional(),
    outputSchema: z.unknown().optional(),
    annotations: z.unknown().optional(),
    icons: z.unknown().optional(),
    execution: z.unknown().optional(),
  })
  .strict();
const PromptDefinitionSchema = z
  .object({
    name: z.string(),
    title: z.string().optional(),
    description: z.string().optional(),
    arguments: z.unknown().optional(),
    icons: z.unknown().optional(),
  })
  .strict();
const ResourceTemplateDefinitionSchema = z
  .object({
    name: z.string(),
    title: z.string().optional(),
    uriTemplate: z.string(),
    description: z.string().optional(),
    mimeType: z.string().optional(),
    annotations: z.unknown().optional(),
    icons: z.unknown().optional(),
  })
  .strict();

const TAMPERED = 'stored hash does not match the stored definition (edited by hand or tampered with)';

export const ServerPinSchema = z
  .object({
    instructions: entrySchema(z.string()).optional(),
    tools: z.record(z.string(), entrySchema(ToolDefinitionSchema)),
    prompts: z.record(z.string(), entrySchema(PromptDefinitionSchema)),
    resourceTemplates: z.record(z.string(), entrySchema(ResourceTemplateDefinitionSchema)),
  })
  .strict()
  .superRefine((pin, ctx) => {
    const check = (path: PropertyKey[], stored: string, compute: () => string) => {
      let actual: string;
      try {
        actual = compute();
      } catch (e) {
        ctx.addIssue({
          code: 'custom',
          path,
          message: AirlockError.isInstance(e) ? e.message : 'cannot be hashed',
        });
        return;
      }
      if (actual !== stored) ctx.addIssue({ code: 'custom', path, message: TAMPERED });
    };
    if (pin.instructions) {
      const text = pin.instructions.definition;
      check(['instructions', 'hash'], pin.instructions.hash, () => hashInstructions(text));
    }
    for (const kind of KINDS) {
      const spec = SPECS[kind];
      for (const [key, entry] of Object.entries(pin[kind])) {
        const def = entry.definition as Record<string, unknown>;
        if (spec.keyOf(def) !== key) {
          ctx.addIssue({
            code: 'custom',
            path: [kind, key, 'definition'],
            message: 'does not match its key',
          });
        }
        check([kind, key, 'hash'], entry.hash, () => hashOf(spec, def));
      }
    }
  });

export const LockfileSchema = z
  .object({
    lockfileVersion: z.literal(1),
    servers: z.record(
      z.string().min(1),
      z
        .object({
          /** The command the server was pinned from: informational only, never run from here. */
          command: z.array(z.string()).optional(),
          pinnedAt: z.iso.datetime({ offset: true }),
          pin: ServerPinSchema,
        })
        .strict(),
    ),
  })
  .strict();

export type Lockfile = z.infer<typeof LockfileSchema>;
export type LockedServer = Lockfile['servers'][string];

// The inferred lockfile pin must be usable wherever a ServerPin is expected (a compile-time check).
type _Assert<T extends true> = T;
type _LockedPinIsServerPin = _Assert<LockedServer['pin'] extends ServerPin ? true : false>;

function invalidLockfile(path: string, error: z.ZodError): AirlockError {
  const issues = error.issues.slice(0, 3).map((i) => {
    const at = i.path.map(String).join('.');
    return `${at === '' ? '(root)' : at}: ${i.message}`;
  });
  const more = error.issues.length > 3 ? ` (and ${error.issues.length - 3} more)` : '';
  const field = error.issues[0]?.path.map(String).join('.');
  return new AirlockError('MCP_INVALID_CONFIG', `${path}: invalid lockfile: ${issues.join('; ')}${more}`, {
    ...(field ? { field } : {}),
    cause: error,
  });
}

/** Read and verify a lockfile; `undefined` if it does not exist. Throws `MCP_INVALID_CONFIG` otherwise. */
export function readLockfile(path: string): Lockfile | undefined {
  let text: string;
  try {
    const st = statSync(path);
    if (!st.isFile()) throw new AirlockError('MCP_INVALID_CONFIG', `${path}: lockfile is not a regular file`);
    if (st.size > MAX_LOCKFILE_BYTES) {
      throw new AirlockError(
        'MCP_INVALID_CONFIG',
        `${path}: lockfile is larger than ${MAX_LOCKFILE_BYTES} bytes`,
      );
    }
    text = readFileSync(path, 'utf8');
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    if (AirlockError.isInstance(e)) throw e;
    throw new AirlockError('MCP_INVALID_CONFIG', `${path}: cannot read lockfile: ${(e as Error).message}`, {
      cause: e,
    });
  }
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch (e) {
    const why = (e as Error).message;
    throw new AirlockError('MCP_INVALID_CONFIG', `${path}: lockfile is not valid JSON: ${why}`, { cause: e });
  }
  if (isObject(raw) && typeof raw.lockfileVersion === 'number' && raw.lockfileVersion > 1) {
    throw new AirlockError(
      'MCP_INVALID_CONFIG',
      `${path}: lockfileVersion ${raw.lockfileVersion} was written by a newer airlock; this one reads version 1`,
      { field: 'lockfileVersion' },
    );
  }
  const parsed = LockfileSchema.safeParse(raw);
  if (!parsed.success) throw invalidLockfile(path, parsed.error);
  return parsed.data;
}

/** Serialize a lockfile: sorted keys, 2-space indent, invisible characters escaped, trailing newline. */
export function serializeLockfile(lock: Lockfile): string {
  return `${prettyJson(lock)}\n`;
}

/** Validate, then write atomically (temp file in the same directory, fsync, rename), mode 0644. */
export function writeLockfile(path: string, lock: Lockfile): void {
  const parsed = LockfileSchema.safeParse(lock);
  if (!parsed.success) throw invalidLockfile(path, parsed.error);
  const text = serializeLockfile(lock);
  const tmp = join(dirname(path), `.${basename(path)}.${process.pid}.${randomBytes(6).toString('hex')}.tmp`);
  let fd: number | undefined;
  try {
    fd = openSync(tmp, 'wx', 0o644);
    fchmodSync(fd, 0o644);
    writeSync(fd, text);
    fsyncSync(fd);
    closeSync(fd);
    fd = undefined;
    renameSync(tmp, path);
  } catch (e) {
    if (fd !== undefined) closeSync(fd);
    try {
      unlinkSync(tmp);
    } catch {
      // already renamed or never created
    }
    throw new AirlockError('MCP_INVALID_CONFIG', `${path}: cannot write lockfile: ${(e as Error).message}`, {
      cause: e,
    });
  }
}

/** A copy of `lock` (or a new lockfile) with one server's pin replaced. Pure: the caller supplies the time. */
export function setServerPin(
  lock: Lockfile | undefined,
  serverName: string,
  pin: ServerPin,
  opts: { pinnedAt: string; command?: string[] },
): Lockfile {
  const entry: LockedServer = { pinnedAt: opts.pinnedAt, pin: pin as LockedServer['pin'] };
  if (opts.command !== undefined) entry.command = [...opts.command];
  const servers = new Map(Object.entries(lock?.servers ?? {}));
  servers.set(serverName, entry);
  return { lockfileVersion: 1, servers: toRecord(servers) };
}

// ---------------------------------------------------------------------------------------------------
// Trust on first use

export interface PinObservation {
  diff: PinDiff;
  /** Tool name → reason; the gateway hides or refuses these until re-pinned. */
  quarantined: Map<string, string>;
  findings: PinFinding[];
}

/**
 * The pin a session checks every tools/list against: the lockfile's when there is one, otherwise the
 * definitions of the first observation (trust on first use). Pass complete (all pages) lists.
 */
export class SessionPins {
  #baseline: ServerPin | undefined;
  readonly mode: 'lockfile' | 'first-use';
  readonly #serverName: string;

  constructor(locked?: ServerPin, opts: { serverName?: string } = {}) {
    this.#baseline = locked === undefined ? undefined : structuredClone(locked);
    this.mode = locked === undefined ? 'first-use' : 'lockfile';
    this.#serverName = opts.serverName ?? 'server';
  }

  /** The pin compared against, once there is one. */
  get baseline(): ServerPin | undefined {
    return this.#baseline === undefined ? undefined : structuredClone(this.#baseline);
  }

  observe(defs: ServerDefinitions): PinObservation {
    // On first use, names listed twice with different definitions stay out of the baseline: they show
    // up as duplicated now and as added later, quarantined either way.
    this.#baseline ??= indexServer(defs).pin;
    const diff = comparePins(this.#baseline, defs);
    const opts = { firstUse: this.mode === 'first-use' };
    return {
      diff,
      quarantined: quarantinedTools(diff, opts),
      findings: diffFindings(this.#serverName, diff, opts),
    };
  }
}
