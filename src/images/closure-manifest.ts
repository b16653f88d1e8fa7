// The schema of an allowlist root's manifest (<root>/.airlock-closure.json), for whoever reads one
// back (a tier deciding what a root holds, a user auditing it). The builder writes exactly this shape.
import { join } from 'node:path';
import { z } from 'zod';
import { AirlockError } from '../core/errors.js';
import { readRecordFile } from '../core/validate.js';

/** The manifest's file name, at the top of the built root. */
export const CLOSURE_MANIFEST = '.airlock-closure.json';
/** The manifest's `format`: bumped when its meaning changes. */
export const CLOSURE_FORMAT = 'airlock-closure/1';

const absolute = z.string().startsWith('/');

export const ClosureEntrySchema = z
  .object({
    path: absolute,
    type: z.enum(['file', 'dir', 'symlink']),
    mode: z.string().regex(/^0[0-7]{3,4}$/),
    uid: z.number().int().nonnegative(),
    gid: z.number().int().nonnegative(),
    size: z.number().int().nonnegative().optional(),
    sha256: z
      .string()
      .regex(/^[0-9a-f]{64}$/)
      .optional(),
    target: z.string().min(1).optional(),
    why: z.array(z.string()),
  })
  .strict()
  .refine(
    (e) => (e.type === 'symlink') === (e.target !== undefined),
    'a symlink (and only a symlink) has a target',
  )
  .refine(
    (e) => e.type === 'file' || (e.size === undefined && e.sha256 === undefined),
    'only files have a size',
  );

export const ClosureManifestSchema = z
  .object({
    format: z.literal(CLOSURE_FORMAT),
    executables: z.array(z.string().min(1)).min(1),
    extraPaths: z.array(absolute),
    searchPath: z.string(),
    runtimes: z.array(z.string()),
    missing: z.array(z.object({ library: z.string(), neededBy: absolute }).strict()),
    entries: z.array(ClosureEntrySchema),
  })
  .strict();

/** Reads and validates the manifest of a built root; undefined when the dir has none. */
export function readClosureManifest(rootDir: string): z.output<typeof ClosureManifestSchema> | undefined {
  const m = readRecordFile(ClosureManifestSchema, join(rootDir, CLOSURE_MANIFEST), 'allowlist manifest');
  if (m && m.entries.some((e, i) => i > 0 && m.entries[i - 1]!.path >= e.path))
    throw new AirlockError('INTERNAL', `allowlist manifest in ${rootDir} is corrupt: entries not sorted`);
  return m;
}
