// SECURITY-CRITICAL: every string an MCP server says about itself, with its JSON path (issue 4,
// issue 35): names, titles, descriptions, annotations, _meta and icons of tools, prompts, resources and
// resource templates, server instructions, and every key and string value of input and output schemas
// (descriptions, titles, defaults, enum values, examples, $defs, nested objects and arrays), walked with
// bounds on depth and size. Pure; tolerates any runtime type a hostile server sends.
import type { ScanInput } from './types.js';
import type { Finding } from './types.js';
import { display, SCAN_LIMITS } from './text.js';

export type FieldKind = 'name' | 'prose' | 'description';
export interface Field {
  owner: string;
  location: string;
  text: string;
  kind: FieldKind;
  /** A tool or prompt name: checked for look-alike characters. */
  identifier?: boolean;
}
export interface Param {
  owner: string;
  location: string;
  name: string;
  description?: string;
}
export interface Collected {
  fields: Field[];
  params: Param[];
  findings: Finding[];
}

/** Schema keys whose string values are identifiers or syntax, not prose. */
const NON_PROSE_KEYS = new Set([
  'type',
  'format',
  'pattern',
  '$ref',
  '$schema',
  '$id',
  '$anchor',
  'src',
  'mimeType',
  'sizes',
  'theme',
]);

function segment(key: string): string {
  return /^[A-Za-z_$][\w$-]*$/.test(key) ? `.${key}` : `[${display(JSON.stringify(key))}]`;
}

export const isRecord = (v: unknown): v is Record<string, unknown> =>
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

export const list = <T>(v: readonly T[] | undefined): readonly T[] => (Array.isArray(v) ? v : []);
export const label = (name: unknown, index: number): string =>
  typeof name === 'string' && name !== '' ? display(name) : `#${index}`;

export function collect(input: ScanInput): Collected {
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
    walkSchema(c, owner, `${owner}._meta`, tool?._meta);
    walkSchema(c, owner, `${owner}.icons`, tool?.icons);
  });
  list(input.prompts).forEach((prompt, i) => {
    const owner = `prompts[${label(prompt?.name, i)}]`;
    add(owner, `${owner}.name`, prompt?.name, 'name', true);
    add(owner, `${owner}.title`, prompt?.title, 'prose');
    add(owner, `${owner}.description`, prompt?.description, 'description');
    walkSchema(c, owner, `${owner}._meta`, prompt?._meta);
    walkSchema(c, owner, `${owner}.icons`, prompt?.icons);
    list(prompt?.arguments).forEach((arg, j) => {
      const loc = `${owner}.arguments[${label(arg?.name, j)}]`;
      add(owner, `${loc}.name`, arg?.name, 'name');
      add(owner, `${loc}.title`, arg?.title, 'prose');
      add(owner, `${loc}.description`, arg?.description, 'description');
    });
  });
  list(input.resources).forEach((r, i) => {
    const owner = `resources[${label(r?.name ?? r?.uri, i)}]`;
    add(owner, `${owner}.name`, r?.name, 'prose');
    add(owner, `${owner}.uri`, r?.uri, 'prose');
    add(owner, `${owner}.title`, r?.title, 'prose');
    add(owner, `${owner}.description`, r?.description, 'description');
    walkSchema(c, owner, `${owner}._meta`, r?._meta);
    walkSchema(c, owner, `${owner}.icons`, r?.icons);
    walkSchema(c, owner, `${owner}.annotations`, r?.annotations);
  });
  list(input.resourceTemplates).forEach((r, i) => {
    const owner = `resourceTemplates[${label(r?.name ?? r?.uriTemplate, i)}]`;
    add(owner, `${owner}.name`, r?.name, 'prose');
    add(owner, `${owner}.uriTemplate`, r?.uriTemplate, 'prose');
    add(owner, `${owner}.title`, r?.title, 'prose');
    add(owner, `${owner}.description`, r?.description, 'description');
    walkSchema(c, owner, `${owner}._meta`, r?._meta);
    walkSchema(c, owner, `${owner}.icons`, r?.icons);
    walkSchema(c, owner, `${owner}.annotations`, r?.annotations);
  });
  add('instructions', 'instructions', input.instructions, 'description');
  return c;
}
