// Executable allowlists (the Nix-style method): a root filesystem that holds only the listed programs
// and what they need to run — every symlink on the way to them, their shared-library closure as the
// dynamic loader resolves it, the interpreters of scripts, and the data of known runtimes (Python's
// stdlib). Anything else is absent, so exec of an unlisted program fails with ENOENT.
//
// The source is the host root (`['/']`) or an image's unpacked layers (bottom first, overlayfs
// format), read through their merged view without mounting. The result is a plain directory usable
// as a read-only root or as a single overlay lower, with a manifest saying why each path is there.
// What the root does NOT hold, and the tier generates (/etc/passwd, /etc/hosts, resolv.conf, CA
// certificates, /tmp, /proc, /dev): see docs/allowlists.md.
import { randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, isAbsolute, join, basename } from 'node:path';
import { prettyJson } from '../core/canonical-json.js';
import { AirlockError } from '../core/errors.js';
import { CLOSURE_FORMAT, CLOSURE_MANIFEST } from './closure-manifest.js';
import { ClosurePlanner, DEFAULT_SEARCH_PATH, type MissingLibrary } from './closure-plan.js';
import { writeClosure, type ClosureEntry, type LinkMode } from './closure-write.privileged.js';
import { SourceRoot } from './source-root.js';

export { CLOSURE_FORMAT, CLOSURE_MANIFEST };

export interface ExecutableRootOptions {
  /** Absolute dirs, BOTTOM first: an image's unpacked layers (ResolvedImage.layers), or `['/']` for the host root. */
  readonly sourceLayers: readonly string[];
  /** Program names (searched on `searchPath` inside the source) or absolute paths inside the source. */
  readonly executables: readonly string[];
  /** Where the root is written: must not exist yet; its parent must. Written whole or not at all. */
  readonly destDir: string;
  /** More absolute paths inside the source to include: files (an ELF brings its libraries) or whole dirs. */
  readonly extraPaths?: readonly string[];
  /** The PATH searched inside the source, also by `#!/usr/bin/env NAME` (default DEFAULT_SEARCH_PATH). */
  readonly searchPath?: string;
  /** `hardlink` (default): link files that need no change, copy the rest; `copy`: copy every file. */
  readonly link?: LinkMode;
  /** Record each file's sha256 in the manifest (reads every byte: slower on large runtimes). */
  readonly hash?: boolean;
  readonly signal?: AbortSignal;
}

/** The manifest written to `<destDir>/.airlock-closure.json` (deterministic: same input, same bytes). */
export interface ClosureManifest {
  readonly format: typeof CLOSURE_FORMAT;
  readonly executables: readonly string[];
  readonly extraPaths: readonly string[];
  readonly searchPath: string;
  /** Runtimes whose data was included (e.g. python3.11). */
  readonly runtimes: readonly string[];
  /** Libraries that shared objects inside runtime data need but the source lacks (see docs/allowlists.md). */
  readonly missing: readonly MissingLibrary[];
  /** Every path in the root, sorted. */
  readonly entries: readonly ClosureEntry[];
}

export interface ExecutableRoot {
  readonly dir: string;
  readonly manifest: ClosureManifest;
  /** Bytes of regular files in the root (hardlinked files counted whole). */
  readonly bytes: number;
}

type PlanOptions = Omit<ExecutableRootOptions, 'destDir' | 'link' | 'hash'>;

function checkOptions(o: PlanOptions & Partial<ExecutableRootOptions>, withDest = true): void {
  const bad = (field: string, msg: string): never => {
    throw new AirlockError('INVALID_ARGUMENT', msg, { field });
  };
  if (!Array.isArray(o.sourceLayers) || o.sourceLayers.length === 0)
    bad('sourceLayers', 'sourceLayers must list at least one dir (["/"] for the host root)');
  for (const l of o.sourceLayers)
    if (typeof l !== 'string' || !isAbsolute(l) || l.includes('\0') || !existsSync(l))
      bad('sourceLayers', `source layer ${String(l)} is not an existing absolute dir`);
  if (o.sourceLayers.includes('/') && o.sourceLayers.length > 1)
    bad('sourceLayers', '"/" (the host root) cannot be stacked with layers');
  if (!Array.isArray(o.executables) || o.executables.length === 0)
    bad('executables', 'executables must list at least one program');
  for (const e of o.executables)
    if (typeof e !== 'string' || e === '' || e.includes('\0') || e === '.' || e === '..')
      bad('executables', `executable name ${JSON.stringify(e)} is not a program name or absolute path`);
  for (const p of o.extraPaths ?? [])
    if (typeof p !== 'string' || !isAbsolute(p) || p.includes('\0'))
      bad('extraPaths', `extra path ${JSON.stringify(p)} is not an absolute path`);
  if (o.searchPath !== undefined && (typeof o.searchPath !== 'string' || o.searchPath.includes('\0')))
    bad('searchPath', 'searchPath must be a PATH string');
  if (!withDest) return;
  const dest = o.destDir ?? '';
  if (typeof dest !== 'string' || !isAbsolute(dest) || dest.includes('\0'))
    bad('destDir', 'destDir must be an absolute path');
  if (existsSync(dest)) bad('destDir', `destDir ${dest} already exists: give a new path`);
  if (!existsSync(dirname(dest))) bad('destDir', `the parent of destDir ${dest} does not exist`);
  if (o.link !== undefined && o.link !== 'hardlink' && o.link !== 'copy')
    bad('link', 'link must be "hardlink" or "copy"');
}

/** What buildExecutableRoot plans before it writes (see planExecutableRoot). */
export interface ClosurePlan {
  readonly planner: ClosurePlanner;
  readonly searchPath: string;
}

/**
 * Plans a root for `options` (reads the source, writes nothing): which paths it holds and why. The
 * plan can be fingerprinted (closure-cache.ts) before anything is written.
 */
export function planExecutableRoot(options: PlanOptions, checkpoint: () => void): ClosurePlan {
  checkOptions(options, false);
  const searchPath = options.searchPath ?? DEFAULT_SEARCH_PATH;
  const planner = new ClosurePlanner(new SourceRoot(options.sourceLayers), searchPath, checkpoint);
  for (const name of options.executables) planner.addExecutable(name);
  for (const p of options.extraPaths ?? []) planner.addExtra(p);
  planner.addRootLinks();
  planner.addMountPoints();
  if (planner.items.has(`/${CLOSURE_MANIFEST}`))
    throw new AirlockError('INVALID_ARGUMENT', `the source has its own /${CLOSURE_MANIFEST}: remove it`);
  return { planner, searchPath };
}

function abortCheck(signal: AbortSignal | undefined): () => void {
  return () => {
    if (signal?.aborted) throw new AirlockError('ABORTED', 'building the executable root was aborted');
  };
}

/**
 * Builds a root holding only `executables` and their closure, from `sourceLayers`, at `destDir`.
 * Throws EXECUTABLE_NOT_FOUND, EXECUTABLE_INVALID, LIBRARY_NOT_FOUND, ROOT_LINK_UNSAFE,
 * FILE_NOT_FOUND (an extra path), INVALID_ARGUMENT or ABORTED; on any failure nothing is left at
 * `destDir` (the root is built in a private sibling dir and renamed into place).
 */
export async function buildExecutableRoot(options: ExecutableRootOptions): Promise<ExecutableRoot> {
  checkOptions(options);
  const checkpoint = abortCheck(options.signal);
  checkpoint();
  return writeExecutableRoot(planExecutableRoot(options, checkpoint), options);
}

/** Writes a planned root at `options.destDir` (see buildExecutableRoot). */
export async function writeExecutableRoot(
  plan: ClosurePlan,
  options: ExecutableRootOptions,
): Promise<ExecutableRoot> {
  const { planner, searchPath } = plan;
  const checkpoint = abortCheck(options.signal);
  const tmp = join(
    dirname(options.destDir),
    `.${basename(options.destDir)}.tmp-${process.pid}-${randomBytes(4).toString('hex')}`,
  );
  mkdirSync(tmp, { mode: 0o700 });
  try {
    const entries = await writeClosure(
      planner.items,
      tmp,
      options.link ?? 'hardlink',
      options.hash ?? false,
      checkpoint,
    );
    const missing = [
      ...new Map(planner.missing.map((m) => [`${m.library}\0${m.neededBy}`, m])).values(),
    ].sort((a, b) => cmp(a.neededBy, b.neededBy) || cmp(a.library, b.library));
    const manifest: ClosureManifest = {
      format: CLOSURE_FORMAT,
      executables: [...options.executables],
      extraPaths: [...(options.extraPaths ?? [])],
      searchPath,
      runtimes: [...planner.runtimes.keys()].sort(),
      missing,
      entries,
    };
    writeFileSync(join(tmp, CLOSURE_MANIFEST), prettyJson(manifest) + '\n', { mode: 0o444 });
    checkpoint();
    try {
      renameSync(tmp, options.destDir);
    } catch (e) {
      // another build (or anything else) made destDir meanwhile: theirs stays, ours is removed
      throw new AirlockError(
        'INVALID_ARGUMENT',
        `destDir ${options.destDir} appeared while building: give a new path`,
        {
          field: 'destDir',
          cause: e,
        },
      );
    }
    const bytes = entries.reduce((s, e) => s + (e.size ?? 0), 0);
    return { dir: options.destDir, manifest, bytes };
  } catch (e) {
    rmSync(tmp, { recursive: true, force: true });
    throw e;
  }
}

function cmp(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}
