// SECURITY-CRITICAL: comparing what a server lists now with its pin, which tools to quarantine and why,
// findings for the scan report and the readable diff of `airlock mcp diff`. Pure.
import { structuredPatch } from 'diff';
import { escapeInvisible, jsonEqual, prettyJson } from '../../core/canonical-json.js';
import type { Severity } from '../../policy/mcp-rules.js';
import {
  cmp,
  identityHash,
  indexServer,
  KINDS,
  type PromptDefinition,
  type ResourceTemplateDefinition,
  type ToolDefinition,
  SPECS,
  type Kind,
  type KindSpec,
  type PinEntry,
  type ServerDefinitions,
  type ServerPin,
} from './hash.js';
import { brief, displayName, schemaWidenings, type Widening } from './widen.js';

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

/** Above this many inserted plus removed lines the diff shows the whole definition removed and added. */
const MAX_EDIT_LINES = 4_000;

/** Unified-diff hunks with `context` lines around each change (jsdiff, line mode). */
function unified(before: string, after: string, context = 3): string[] {
  // A trailing newline on both sides: definitions are compared as lines, never as "no newline at end".
  const patch = structuredPatch('pinned', 'current', `${before}\n`, `${after}\n`, undefined, undefined, {
    context,
    maxEditLength: MAX_EDIT_LINES,
  });
  const out: string[] = ['--- pinned', '+++ current'];
  if (patch === undefined) {
    const a = before.split('\n');
    const b = after.split('\n');
    out.push(`@@ -1,${a.length} +1,${b.length} @@`, ...a.map((l) => `-${l}`), ...b.map((l) => `+${l}`));
    return out;
  }
  for (const h of patch.hunks) {
    out.push(`@@ -${h.oldStart},${h.oldLines} +${h.newStart},${h.newLines} @@`, ...h.lines);
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
