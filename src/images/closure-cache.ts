// Allowlist roots for sandboxes (`executables` in a sandbox spec), cached by content:
//
//   <stateDir>/closures/                 0700 root
//   <stateDir>/closures/sha256:<hex>/    a built root (closure.ts), never changed once renamed in
//
// The key is a digest of the PLAN, not of the request: the executables and search PATH, the source
// layers, and every planned path with what the source has there (type, mode, owner, size, mtime,
// inode, link text, and the host file it comes from). The same request over a changed source (a
// host package upgraded, another image) plans differently and so gets a new root; an unchanged one
// reuses the root already built. Planning reads ELF headers and directory listings only, no file
// contents, so it stays cheap next to writing a root.
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { canonicalJson } from '../core/canonical-json.js';
import { AirlockError } from '../core/errors.js';
import { CLOSURE_FORMAT } from './closure-manifest.js';
import { planExecutableRoot, writeExecutableRoot } from './closure.js';

export interface CachedRootRequest {
  readonly stateDir: string;
  /** Absolute dirs, BOTTOM first, or `['/']` for the host root. */
  readonly sourceLayers: readonly string[];
  readonly executables: readonly string[];
  readonly signal?: AbortSignal;
}

export interface CachedRoot {
  /** The root dir: a single layer in overlayfs format (nothing in it is a whiteout). */
  readonly dir: string;
  /** `sha256:<hex>` of the plan (see the header). */
  readonly digest: string;
  /** False when an identical root was already built. */
  readonly built: boolean;
}

/** The dir allowlist roots are kept in. */
export function closuresDir(stateDir: string): string {
  return join(stateDir, 'closures');
}

/** The root of `executables` over `sourceLayers`, built unless an identical one exists. */
export async function ensureExecutableRoot(r: CachedRootRequest): Promise<CachedRoot> {
  const checkpoint = (): void => {
    if (r.signal?.aborted) throw new AirlockError('ABORTED', 'building the executable root was aborted');
  };
  const plan = planExecutableRoot({ sourceLayers: r.sourceLayers, executables: r.executables }, checkpoint);
  const items = [...plan.planner.items.entries()]
    .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
    .map(([path, it]) => {
      const st = it.src.stat;
      return [
        path,
        it.type,
        it.src.hostPath,
        st.mode,
        st.uid,
        st.gid,
        st.size,
        st.mtimeMs,
        st.ino,
        it.target ?? '',
      ];
    });
  const digest = `sha256:${createHash('sha256')
    .update(
      canonicalJson({
        format: CLOSURE_FORMAT,
        sources: r.sourceLayers,
        executables: r.executables,
        searchPath: plan.searchPath,
        items,
      }),
    )
    .digest('hex')}`;
  const store = closuresDir(r.stateDir);
  const dir = join(store, digest);
  if (existsSync(dir)) return { dir, digest, built: false };
  mkdirSync(store, { recursive: true, mode: 0o700 });
  try {
    await writeExecutableRoot(plan, {
      sourceLayers: r.sourceLayers,
      executables: r.executables,
      destDir: dir,
      ...(r.signal ? { signal: r.signal } : {}),
    });
  } catch (e) {
    // Another create built the same root meanwhile: theirs is complete (renamed in whole).
    if (existsSync(dir) && AirlockError.isInstance(e) && e.code === 'INVALID_ARGUMENT')
      return { dir, digest, built: false };
    throw e;
  }
  return { dir, digest, built: true };
}
