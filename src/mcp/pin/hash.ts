// SECURITY-CRITICAL: what a pin hashes (see ../pin.ts for the exact field list and why). Pure.
import { createHash } from 'node:crypto';
import type { Prompt, ResourceTemplate, Tool } from '@modelcontextprotocol/sdk/types.js';
import { canonicalJson } from '../../core/canonical-json.js';
import { AirlockError } from '../../core/errors.js';
import { displayName } from './widen.js';

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

export type Kind = 'tools' | 'prompts' | 'resourceTemplates';

export interface KindSpec {
  kind: Kind;
  label: string;
  fields: readonly string[];
  keyOf(def: Record<string, unknown>): string;
}

const TOOL_FIELDS = 'name title description inputSchema outputSchema annotations icons execution'.split(' ');
export const KINDS: Kind[] = ['tools', 'prompts', 'resourceTemplates'];
export const SPECS: Record<Kind, KindSpec> = {
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

export function hashOf(spec: KindSpec, def: object): PinHash {
  return sha256(canonicalJson(pick(def, spec.fields)));
}

/** The definition without its key field: equal identities under different keys are a rename. */
export function identityHash(spec: KindSpec, def: Record<string, unknown>): PinHash {
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
export const cmp = (a: string, b: string): number => (a < b ? -1 : a > b ? 1 : 0);

export const toRecord = <T>(m: Map<string, T>): Record<string, T> =>
  Object.fromEntries([...m].sort(([a], [b]) => cmp(a, b)));

interface IndexedServer {
  pin: ServerPin;
  duplicated: Record<Kind, Set<string>>;
}

export function indexServer(defs: ServerDefinitions): IndexedServer {
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
