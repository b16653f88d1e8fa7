// zod parsing at trust boundaries: the first issue becomes a typed error naming the offending field.
import { readFileSync } from 'node:fs';
import type { z } from 'zod';
import { AirlockError } from './errors.js';

function dotted(path: readonly PropertyKey[]): string {
  return path.map((p) => String(p)).join('.');
}

/** Parse with zod and turn the first issue into an INVALID_SPEC error naming the field. */
export function parseOrThrow<S extends z.ZodType>(
  schema: S,
  input: unknown,
  what: string,
  code: 'INVALID_SPEC' | 'INVALID_ARGUMENT' | 'MCP_INVALID_CONFIG' = 'INVALID_SPEC',
): z.output<S> {
  const r = schema.safeParse(input);
  if (r.success) return r.data;
  let issue = r.error.issues[0]!;
  // zod wraps record-key failures in an `invalid_key` issue; the useful message is the nested one.
  if (issue.code === 'invalid_key' && issue.issues[0]) {
    issue = { ...issue.issues[0], path: [...issue.path, ...issue.issues[0].path] } as typeof issue;
  }
  const field = dotted(issue.path);
  const message =
    issue.code === 'unrecognized_keys'
      ? `unknown field(s) ${issue.keys.map((k) => `"${k}"`).join(', ')}${field ? ` in ${field}` : ''}; check the spelling`
      : issue.message;
  // An unknown key is reported at its own path (e.g. `mcpServers.fs.airlock.boundry`), not its parent's.
  const at = issue.code === 'unrecognized_keys' ? [field, issue.keys[0]].filter(Boolean).join('.') : field;
  throw new AirlockError(code, `invalid ${what}${at ? ` at ${at}` : ''}: ${message}`, { field: at });
}

/**
 * A record file Airlock wrote itself (root-only state), parsed with `schema`: undefined when the file
 * does not exist; INTERNAL naming the file when it is not valid JSON or fails the schema, so a
 * truncated or hand-edited record never half-loads.
 */
export function readRecordFile<S extends z.ZodType>(
  schema: S,
  path: string,
  what: string,
): z.output<S> | undefined {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw e;
  }
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  const r = schema.safeParse(json);
  if (!r.success) {
    throw new AirlockError(
      'INTERNAL',
      `${what} ${path} is corrupt: ${r.error.issues[0]?.message ?? 'not JSON'}`,
    );
  }
  return r.data;
}
