// SECURITY-CRITICAL: the lockfile `airlock.lock.json`: read and verified (every stored hash recomputed),
// written atomically. The only I/O of pinning.
import { randomBytes } from 'node:crypto';
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
import { z } from 'zod';
import { prettyJson } from '../../core/canonical-json.js';
import { AirlockError } from '../../core/errors.js';
import { hashInstructions, hashOf, KINDS, SPECS, toRecord, type ServerPin } from './hash.js';
import { isObject } from './widen.js';

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
