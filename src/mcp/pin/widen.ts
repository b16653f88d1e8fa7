// SECURITY-CRITICAL: schema widening. Says every way a tool's new input schema accepts input the pinned
// one rejected, as far as can be told without evaluating schemas; what it cannot judge ($ref, allOf, not,
// if, unknown keywords) is 'changed-unknown'. A changed tool is quarantined whether or not a widening is
// found: this only explains. Pure.
import {
  canonicalJson,
  escapeInvisible,
  jsonEqual,
  jsonPathSegment as segment,
} from '../../core/canonical-json.js';

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

export const isObject = (v: unknown): v is Record<string, unknown> =>
  typeof v === 'object' && v !== null && !Array.isArray(v);
const own = (o: Record<string, unknown>, k: string): unknown => (Object.hasOwn(o, k) ? o[k] : undefined);

/** A name for messages: quoted, invisible characters escaped, at most 200 characters. */
export function displayName(name: string): string {
  const shown = escapeInvisible(JSON.stringify(name));
  return shown.length > 200 ? `${shown.slice(0, 199)}…"` : shown;
}

/** A value for messages: compact JSON, invisible characters escaped, at most 80 characters. */
export function brief(value: unknown): string {
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
