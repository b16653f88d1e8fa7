// SECURITY-CRITICAL: the MCP tool-call policy (issue "MCP gateway": tool rules, argument rules, scan
// policy). Pure decisions, no I/O: the gateway asks decideCall() before forwarding a tools/call and
// decideFinding() for every scanner finding (STYLE.md habit 5). Everything an operator writes is
// validated when the config is parsed (globs, JSON Schemas, argument field paths), so a rule that cannot
// be enforced is a config error, never a silent allow.
//
// Order of a call decision: tools.deny (deny wins; matched case-insensitively) → tools.allow (absent =
// every tool; matched exactly) → quarantined definitions → arguments must be an object → for EVERY
// tools.arguments entry whose glob matches the tool (case-insensitively): its JSON Schema, then its path
// fields. Path values are canonicalised before matching (file:// URIs decoded, relative paths resolved
// against cwd, `.`/`..`/`//` collapsed), so `/data/../etc/passwd` is checked as `/etc/passwd`. The
// check is lexical: symlinks inside the sandbox are the sandbox's business (it only sees its own files).
import { posix } from 'node:path';
import type * as AjvModule from 'ajv';
import type { Ajv, ValidateFunction } from 'ajv';
import type * as Ajv2020Module from 'ajv/dist/2020.js';
import type { Ajv2020 } from 'ajv/dist/2020.js';
import picomatch from 'picomatch';
import { z } from 'zod';
import { AirlockError } from '../core/errors.js';
import { lazyRequire } from '../core/lazy.js';
import { RULE_IDS, type RuleId, type Severity } from '../policy/mcp-rules.js';

// JSON Schema validators, loaded when a tool's schema is first compiled.
const ajv = lazyRequire<typeof AjvModule>('ajv');
const ajv2020 = lazyRequire<typeof Ajv2020Module>('ajv/dist/2020.js');

const MAX_GLOB_CHARS = 256;
const MAX_GLOBS = 1000;
const MAX_PATH_CHARS = 4096;
const MAX_FIELD_SEGMENTS = 8;
const MAX_REASON_DETAIL_CHARS = 300;

// ---- globs --------------------------------------------------------------------------------------

type GlobKind = 'tool' | 'path';

interface Glob {
  readonly text: string;
  readonly test: (s: string) => boolean;
}

/**
 * Tool-name globs: `*` matches any characters (including `/` and `.`), `?` one, `{a,b}` alternatives.
 * Path globs: `*` stays within one path segment, `**` crosses segments (`/data/**` is /data and
 * everything below it); dotfiles match like any other name. Deny globs ignore case, so a server that
 * treats names case-insensitively cannot be used to step around a deny rule.
 */
function compileGlob(text: string, kind: GlobKind, nocase: boolean): Glob {
  const test = picomatch(text, { dot: true, nonegate: true, bash: kind === 'tool', nocase });
  return { text, test: (s) => test(s) };
}

function globProblem(text: string, kind: GlobKind): string | undefined {
  if (text === '') return 'a glob cannot be empty';
  if (text.length > MAX_GLOB_CHARS) return `a glob is at most ${MAX_GLOB_CHARS} characters`;
  if (text.includes('\0')) return 'a glob cannot contain NUL';
  if (text.startsWith('!')) return `"${text}": negated globs are not supported; list the name under deny`;
  if (kind === 'path') {
    if (!text.startsWith('/') && !text.startsWith('**'))
      return `"${text}": path globs are absolute (start with /) or start with **; relative paths are resolved before matching`;
    if (text.includes('\\')) return `"${text}": path globs use / as the separator`;
    if (text.split('/').some((s) => s === '.' || s === '..'))
      return `"${text}": path globs cannot contain . or .. segments (paths are normalised before matching)`;
    if (text.includes('//')) return `"${text}": path globs cannot contain //`;
    if (text.length > 1 && text.endsWith('/'))
      return `"${text}": remove the trailing /; use ${text}** for everything below it`;
  }
  try {
    picomatch.makeRe(text, { dot: true, nonegate: true, bash: kind === 'tool' });
  } catch (e) {
    return `"${text}" is not a valid glob: ${(e as Error).message}`;
  }
  return undefined;
}

const glob = (kind: GlobKind) =>
  z.string().superRefine((s, ctx) => {
    const problem = globProblem(s, kind);
    if (problem !== undefined) ctx.addIssue({ code: 'custom', message: problem });
  });

// ---- argument field paths -----------------------------------------------------------------------

/** `path`, `source.path`, `paths.*`, `edits.*.path`: dotted names into the arguments; `*` = each array element. */
function fieldProblem(field: string): string | undefined {
  const segments = field.split('.');
  if (field.includes('\0')) return 'a field path cannot contain NUL';
  if (segments.length > MAX_FIELD_SEGMENTS) return `a field path has at most ${MAX_FIELD_SEGMENTS} segments`;
  if (segments.some((s) => s === ''))
    return `"${field}" is not a field path: write names separated by single dots, e.g. "path" or "edits.*.path"`;
  if (segments.some((s) => s !== '*' && s.includes('*')))
    return `"${field}": * stands alone as a segment and means "every element of this array"`;
  if (segments[0] === '*') return `"${field}": the arguments are an object; start with a field name`;
  return undefined;
}

const fieldPath = z.string().superRefine((s, ctx) => {
  const problem = fieldProblem(s);
  if (problem !== undefined) ctx.addIssue({ code: 'custom', message: problem });
});

// ---- JSON Schema (ajv) --------------------------------------------------------------------------

const DRAFT_2020 = 'https://json-schema.org/draft/2020-12/schema';
const DRAFT_07 = 'http://json-schema.org/draft-07/schema';

type Dialect = '2020-12' | 'draft-07';

/** Strict about keywords (a misspelt `maxLenght` would otherwise silently weaken the rule), lenient about style. */
const AJV_OPTIONS = {
  strictSchema: true,
  strictNumbers: true,
  strictTypes: false,
  strictTuples: false,
  strictRequired: false,
  allowUnionTypes: true,
  allErrors: false,
  coerceTypes: false,
  useDefaults: false,
  removeAdditional: false,
  logger: false,
} as const;

interface Validators {
  compile(schema: Record<string, unknown>): ValidateFunction;
}

/** One ajv instance per dialect, created on first use and owned by one compilation (no singletons). */
function validators(): Validators {
  let a2020: Ajv2020 | undefined;
  let a07: Ajv | undefined;
  return {
    compile(schema) {
      const dialect = dialectOf(schema);
      if (typeof dialect !== 'string') throw new Error(dialect.error);
      if (dialect === 'draft-07') return (a07 ??= new (ajv().Ajv)(AJV_OPTIONS)).compile(schema);
      return (a2020 ??= new (ajv2020().Ajv2020)(AJV_OPTIONS)).compile(schema);
    },
  };
}

function dialectOf(schema: Record<string, unknown>): Dialect | { error: string } {
  const declared = schema['$schema'];
  if (declared === undefined) return '2020-12';
  const uri = typeof declared === 'string' ? declared.replace(/#$/, '') : '';
  if (uri === DRAFT_2020) return '2020-12';
  if (uri === DRAFT_07) return 'draft-07';
  return { error: `$schema must be ${DRAFT_2020} (the default) or ${DRAFT_07}` };
}

/** `arguments/content must NOT have more than 100 characters` (allErrors is off: the first error). */
function schemaErrorsText(errors: ValidateFunction['errors']): string {
  const e = errors?.[0];
  if (!e) return 'the arguments do not match the schema';
  return `arguments${e.instancePath} ${e.message ?? `fail the ${e.keyword} check`}`;
}

function schemaProblem(schema: Record<string, unknown>, v: Validators = validators()): string | undefined {
  try {
    v.compile(schema);
    return undefined;
  } catch (e) {
    const message = (e as Error).message;
    const hint = /unknown format/.test(message)
      ? ' (formats are not checked by Airlock argument rules; use pattern instead)'
      : '';
    return `not a usable JSON Schema: ${message}${hint}`;
  }
}

// ---- schemas ------------------------------------------------------------------------------------

export const PathRuleSchema = z
  .object({
    allow: z
      .array(glob('path'))
      .max(MAX_GLOBS)
      .describe('Path globs the field may name (after normalisation), e.g. "/data/**".'),
    deny: z
      .array(glob('path'))
      .max(MAX_GLOBS)
      .default([])
      .describe('Path globs the field may never name; deny wins and ignores case.'),
  })
  .strict();

export const ArgumentRuleSchema = z
  .object({
    schema: z
      .record(z.string(), z.unknown())
      .superRefine((s, ctx) => {
        const problem = schemaProblem(s);
        if (problem !== undefined) ctx.addIssue({ code: 'custom', message: problem });
      })
      .optional()
      .describe(
        "A JSON Schema (2020-12, or draft-07 via $schema) the arguments must ALSO satisfy, beyond the server's own.",
      ),
    paths: z
      .record(fieldPath, PathRuleSchema)
      .optional()
      .describe('Argument fields that name files: "path", "source.path", "paths.*", "edits.*.path".'),
  })
  .strict();

export const ToolRulesSchema = z
  .object({
    allow: z
      .array(glob('tool'))
      .max(MAX_GLOBS)
      .optional()
      .describe('Tool-name globs that may be called. Absent: every tool the server lists.'),
    deny: z
      .array(glob('tool'))
      .max(MAX_GLOBS)
      .default([])
      .describe('Tool-name globs that may never be called; deny wins over allow and ignores case.'),
    arguments: z
      .record(glob('tool'), ArgumentRuleSchema)
      .default({})
      .describe('Argument rules by tool-name glob; every entry whose glob matches the tool applies.'),
  })
  .strict();

export type ToolRulesInput = z.input<typeof ToolRulesSchema>;
/** A server's validated tool rules (allow, deny, arguments). */
export type ToolRules = z.output<typeof ToolRulesSchema>;
export type PathRule = z.output<typeof PathRuleSchema>;
export type ArgumentRule = z.output<typeof ArgumentRuleSchema>;

// ---- compilation --------------------------------------------------------------------------------

interface CompiledPathRule {
  readonly field: string;
  readonly segments: readonly string[];
  readonly allow: readonly Glob[];
  readonly deny: readonly Glob[];
}

interface CompiledArgumentRule {
  readonly glob: Glob;
  readonly validate: ValidateFunction | undefined;
  readonly paths: readonly CompiledPathRule[];
}

/** Tool rules ready for decideCall(); build once per server with compileToolRules(). */
export interface CompiledToolRules {
  readonly server: string | undefined;
  readonly cwd: string;
  readonly allow: readonly Glob[] | undefined;
  readonly deny: readonly Glob[];
  readonly arguments: readonly CompiledArgumentRule[];
}

export interface CompileToolRulesOptions {
  /** Server name, used in reasons ("… for server fs"). */
  server?: string;
  /** The server's working directory inside the sandbox: relative path arguments resolve against it. Default "/". */
  cwd?: string;
}

function invalid(field: string, message: string): AirlockError {
  return new AirlockError('MCP_INVALID_CONFIG', `invalid tool rules at ${field}: ${message}`, { field });
}

/**
 * Compile validated tool rules (the output of ToolRulesSchema, or a hand-built object of that shape).
 * Anything that would not compile is MCP_INVALID_CONFIG naming the field, never a silent allow.
 */
export function compileToolRules(
  rules: ToolRules | undefined,
  opts: CompileToolRulesOptions = {},
): CompiledToolRules {
  const cwd = opts.cwd ?? '/';
  if (!cwd.startsWith('/') || cwd.includes('\0'))
    throw invalid('cwd', `cwd must be an absolute path inside the sandbox (got ${quote(cwd)})`);
  const v = validators();
  const globs = (list: readonly string[] | undefined, kind: GlobKind, field: string, nocase: boolean) =>
    (list ?? []).map((text, i) => {
      const problem = globProblem(text, kind);
      if (problem !== undefined) throw invalid(`${field}.${i}`, problem);
      return compileGlob(text, kind, nocase);
    });

  const argumentRules = Object.entries(rules?.arguments ?? {}).map(([key, rule]): CompiledArgumentRule => {
    const at = `tools.arguments.${key}`;
    const problem = globProblem(key, 'tool');
    if (problem !== undefined) throw invalid(at, problem);
    let validate: ValidateFunction | undefined;
    if (rule.schema !== undefined) {
      const why = schemaProblem(rule.schema, v);
      if (why !== undefined) throw invalid(`${at}.schema`, why);
      validate = v.compile(rule.schema);
    }
    const paths = Object.entries(rule.paths ?? {}).map(([field, p]): CompiledPathRule => {
      const fp = fieldProblem(field);
      if (fp !== undefined) throw invalid(`${at}.paths.${field}`, fp);
      return {
        field,
        segments: field.split('.'),
        allow: globs(p.allow, 'path', `${at}.paths.${field}.allow`, false),
        deny: globs(p.deny, 'path', `${at}.paths.${field}.deny`, true),
      };
    });
    return { glob: compileGlob(key, 'tool', true), validate, paths };
  });

  return {
    server: opts.server,
    cwd: posix.normalize(cwd),
    allow: rules?.allow === undefined ? undefined : globs(rules.allow, 'tool', 'tools.allow', false),
    deny: globs(rules?.deny, 'tool', 'tools.deny', true),
    arguments: argumentRules,
  };
}

// ---- path canonicalisation ----------------------------------------------------------------------

/**
 * The absolute, normalised path a path-valued argument names, or why it cannot be checked. `file:` URIs
 * are decoded (host empty or localhost; no query or fragment; percent-escapes decoded once, and a value
 * still percent-encoded after that is refused, so a server that decodes twice cannot be steered).
 * Refused outright: NUL, backslashes, `~` (servers expand it to a home directory), empty values.
 */
export function resolveArgumentPath(raw: string, cwd = '/'): { path: string } | { error: string } {
  if (raw.length === 0) return { error: 'is empty' };
  if (raw.length > MAX_PATH_CHARS) return { error: `is longer than ${MAX_PATH_CHARS} characters` };
  let p = raw;
  if (/^file:/i.test(p)) {
    const r = fileUriPath(p);
    if ('error' in r) return r;
    p = r.path;
  }
  if (p.includes('\0')) return { error: 'contains a NUL byte' };
  if (p.includes('\\')) return { error: 'contains a backslash; use / as the path separator' };
  if (p.startsWith('~')) return { error: 'starts with ~ (home-directory shorthand); use an absolute path' };
  const n = posix.normalize(p.startsWith('/') ? p : posix.join(cwd, p));
  return { path: n.length > 1 ? n.replace(/\/+$/, '') : n };
}

function fileUriPath(uri: string): { path: string } | { error: string } {
  let rest = uri.slice('file:'.length);
  if (rest.startsWith('//')) {
    const end = rest.indexOf('/', 2);
    const authority = end === -1 ? rest.slice(2) : rest.slice(2, end);
    if (authority !== '' && authority.toLowerCase() !== 'localhost')
      return { error: `is a file URI for another host (${quote(authority)}); only local paths are allowed` };
    rest = end === -1 ? '' : rest.slice(end);
  }
  if (!rest.startsWith('/')) return { error: 'is not an absolute file URI (use file:///absolute/path)' };
  if (/[?#]/.test(rest)) return { error: 'is a file URI with a query or fragment; send a plain path' };
  let decoded: string;
  try {
    decoded = decodeURIComponent(rest);
  } catch {
    return { error: 'is a file URI with a malformed percent-escape' };
  }
  if (/%[0-9a-f]{2}/i.test(decoded))
    return { error: 'is a file URI that is still percent-encoded after decoding (double encoding)' };
  return { path: decoded };
}

// ---- the decision -------------------------------------------------------------------------------

export type CallDenyCode =
  | 'tool_not_allowed'
  | 'tool_denied'
  | 'arguments_schema'
  | 'path_not_allowed'
  | 'path_invalid'
  | 'quarantined';

/** The verdict on one tool call: allow, or deny with a code and a reason. */
export type CallVerdict = { action: 'allow' } | { action: 'deny'; code: CallDenyCode; reason: string };

export interface CallContext {
  /** Tools whose definitions are quarantined (scan finding or changed pin), with why. */
  quarantined?: ReadonlyMap<string, string>;
}

const PREFIX = 'blocked by Airlock MCP policy: ';
const ALLOW: CallVerdict = { action: 'allow' };
const deny = (code: CallDenyCode, why: string): CallVerdict => ({
  action: 'deny',
  code,
  reason: PREFIX + why,
});
/** A client-supplied string, quoted and cut short for a reason text. */
const quote = (s: string): string => JSON.stringify(s.length > 100 ? `${s.slice(0, 100)}…` : s);
const cut = (s: string): string =>
  s.length > MAX_REASON_DETAIL_CHARS ? `${s.slice(0, MAX_REASON_DETAIL_CHARS)}…` : s;
const isPlainObject = (v: unknown): v is Record<string, unknown> =>
  typeof v === 'object' && v !== null && !Array.isArray(v);
const typeName = (v: unknown): string => (v === null ? 'null' : Array.isArray(v) ? 'array' : typeof v);

/**
 * Whether `toolName` may be called at all (tools.deny, then tools.allow), whatever its arguments. The
 * gateway lists only tools this allows (least privilege: a model is not shown what it may not call);
 * decideCall() starts with the same check, so a call to a hidden tool still gets the reason.
 */
export function decideTool(compiled: CompiledToolRules, toolName: string): CallVerdict {
  const forServer = compiled.server === undefined ? '' : ` for server ${compiled.server}`;
  const tool = quote(toolName);
  const denied = compiled.deny.find((g) => g.test(toolName));
  if (denied) {
    return deny(
      'tool_denied',
      `tool ${tool} is denied by tools.deny entry "${denied.text}"${forServer}; it cannot be called`,
    );
  }
  if (compiled.allow !== undefined && !compiled.allow.some((g) => g.test(toolName))) {
    return deny(
      'tool_not_allowed',
      `tool ${tool} is not in tools.allow${forServer}; ask the operator to allow it`,
    );
  }
  return ALLOW;
}

/**
 * Decide whether `toolName` (the server's own name, without the gateway's namespace prefix) may be called
 * with `args` (the JSON-RPC `params.arguments`, untrusted). Reasons are written for the model.
 */
export function decideCall(
  compiled: CompiledToolRules,
  toolName: string,
  args: unknown,
  context: CallContext = {},
): CallVerdict {
  const forServer = compiled.server === undefined ? '' : ` for server ${compiled.server}`;
  const tool = quote(toolName);

  const byName = decideTool(compiled, toolName);
  if (byName.action === 'deny') return byName;
  const quarantine = context.quarantined?.get(toolName);
  if (quarantine !== undefined) {
    return deny(
      'quarantined',
      `tool ${tool}${forServer} is quarantined until the operator reviews its definition (${cut(quarantine)})`,
    );
  }

  const input = args === undefined ? {} : args;
  if (!isPlainObject(input)) {
    return deny(
      'arguments_schema',
      `the arguments of tool ${tool} must be a JSON object (got ${typeName(input)})`,
    );
  }

  for (const rule of compiled.arguments) {
    if (!rule.glob.test(toolName)) continue;
    const where = `tools.arguments["${rule.glob.text}"]`;
    if (rule.validate !== undefined) {
      let ok: boolean;
      let detail = '';
      try {
        ok = rule.validate(input) === true;
        if (!ok) detail = schemaErrorsText(rule.validate.errors);
      } catch (e) {
        ok = false;
        detail = (e as Error).message;
      }
      if (!ok) {
        return deny(
          'arguments_schema',
          `the arguments of tool ${tool} break the operator's rule ${where}.schema${forServer}: ${cut(detail)}; fix the arguments and retry`,
        );
      }
    }
    for (const p of rule.paths) {
      const verdict = checkPathField(compiled, p, input, tool, where, forServer);
      if (verdict) return verdict;
    }
  }
  return ALLOW;
}

/** Every value at `segments` in `args` (own properties only), or why the arguments do not fit the shape. */
function valuesAt(
  value: unknown,
  segments: readonly string[],
  at: string,
): Array<{ at: string; value: unknown }> | { error: string } {
  if (value === undefined) return [];
  const [head, ...tail] = segments;
  if (head === undefined) return [{ at, value }];
  if (head === '*') {
    if (!Array.isArray(value)) return { error: `${at} must be an array (got ${typeName(value)})` };
    const out: Array<{ at: string; value: unknown }> = [];
    for (const [i, item] of value.entries()) {
      const r = valuesAt(item, tail, `${at}.${i}`);
      if ('error' in r) return r;
      out.push(...r);
    }
    return out;
  }
  if (!isPlainObject(value)) return { error: `${at} must be an object (got ${typeName(value)})` };
  const next = Object.hasOwn(value, head) ? value[head] : undefined;
  return valuesAt(next, tail, at === '' ? head : `${at}.${head}`);
}

function checkPathField(
  compiled: CompiledToolRules,
  rule: CompiledPathRule,
  args: Record<string, unknown>,
  tool: string,
  where: string,
  forServer: string,
): CallVerdict | undefined {
  const found = valuesAt(args, rule.segments, '');
  if ('error' in found) {
    return deny(
      'path_invalid',
      `argument ${found.error} in tool ${tool}: ${where}.paths["${rule.field}"] checks file paths there${forServer}`,
    );
  }
  for (const { at, value } of found) {
    if (typeof value !== 'string') {
      return deny(
        'path_invalid',
        `argument ${at} of tool ${tool} must be a path string (got ${typeName(value)})${forServer}`,
      );
    }
    const r = resolveArgumentPath(value, compiled.cwd);
    if ('error' in r) {
      return deny(
        'path_invalid',
        `argument ${at} of tool ${tool} ${r.error} (got ${quote(value)})${forServer}`,
      );
    }
    const shown = r.path === value ? quote(value) : `${quote(value)} (resolved to ${r.path})`;
    const denied = rule.deny.find((g) => g.test(r.path));
    if (denied) {
      return deny(
        'path_not_allowed',
        `argument ${at} of tool ${tool} names ${shown}, which matches deny entry "${denied.text}" of ${where}.paths["${rule.field}"]${forServer}; it cannot be used`,
      );
    }
    if (!rule.allow.some((g) => g.test(r.path))) {
      const allowed = rule.allow.length ? rule.allow.map((g) => g.text).join(', ') : 'none';
      return deny(
        'path_not_allowed',
        `argument ${at} of tool ${tool} names ${shown}, which is outside the allowed paths${forServer} (allowed: ${allowed}); use a path under them or ask the operator to allow it`,
      );
    }
  }
  return undefined;
}

// ---- scan policy --------------------------------------------------------------------------------

export const SCAN_THRESHOLDS = ['high', 'medium', 'low', 'none'] as const;
export type ScanThreshold = (typeof SCAN_THRESHOLDS)[number];

export const ScanPolicySchema = z
  .object({
    quarantine: z
      .enum(SCAN_THRESHOLDS)
      .default('high')
      .describe(
        'Findings at or above this severity quarantine the tool (it cannot be called until reviewed); ' +
          'lower ones only warn. "none": never quarantine. Default "high".',
      ),
    warn: z
      .array(z.enum(RULE_IDS))
      .default([])
      .describe('Scanner rule ids that only ever warn for this server, whatever their severity.'),
  })
  .strict();

export type ScanPolicyInput = z.input<typeof ScanPolicySchema>;
export type ScanPolicy = z.output<typeof ScanPolicySchema>;

const RANK: Record<ScanThreshold, number> = { high: 3, medium: 2, low: 1, none: Number.POSITIVE_INFINITY };

/** What a scanner finding of `severity` (and optionally `ruleId`) means under `policy`. */
export function decideFinding(
  policy: ScanPolicy,
  severity: Severity,
  ruleId?: RuleId,
): 'quarantine' | 'warn' {
  if (ruleId !== undefined && policy.warn.includes(ruleId)) return 'warn';
  return RANK[severity] >= RANK[policy.quarantine] ? 'quarantine' : 'warn';
}
