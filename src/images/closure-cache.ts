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
import { createHash, randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync } from 'node:fs';
import { z } from 'zod';
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

/**
 * Delete allowlist roots nothing uses: no live sandbox runs on one (`inUse`: its records or a mount
 * naming the dir) and no snapshot layer was taken on one (a fork of it starts on the same root).
 * Each is renamed away before it is checked, so a create that starts using it meanwhile finds it
 * gone (and builds it again) rather than having it deleted from under it.
 */
export function pruneClosures(
  stateDir: string,
  inUse: (dir: string) => boolean,
): { removedClosures: string[]; keptClosures: string[] } {
  const store = closuresDir(stateDir);
  const kept = layerRecordRoots(stateDir);
  const removedClosures: string[] = [];
  const keptClosures: string[] = [];
  for (const n of readdirOr(store)) {
    if (!/^sha256:[0-9a-f]{64}$/.test(n)) continue;
    const dir = join(store, n);
    if (kept.has(dir)) {
      keptClosures.push(n);
      continue;
    }
    const trash = join(store, `.trash-${randomBytes(6).toString('hex')}`);
    renameSync(dir, trash);
    if (inUse(dir)) {
      renameSync(trash, dir);
      keptClosures.push(n);
      continue;
    }
    rmSync(trash, { recursive: true, force: true });
    removedClosures.push(n);
  }
  // Left by a prune that died between its rename and its removal.
  for (const n of readdirOr(store))
    if (n.startsWith('.trash-')) rmSync(join(store, n), { recursive: true, force: true });
  return { removedClosures, keptClosures };
}

/** Root layer dirs named by the snapshot layers' records (their source sandboxes' rootfs). */
function layerRecordRoots(stateDir: string): Set<string> {
  const out = new Set<string>();
  const layers = join(stateDir, 'layers');
  for (const n of readdirOr(layers)) {
    let text: string;
    try {
      text = readFileSync(join(layers, n, 'snapshot.json'), 'utf8');
    } catch {
      continue;
    }
    const rec = LayerRootfsSchema.safeParse(safeJson(text));
    for (const d of rec.success ? (rec.data.spec.rootfs?.layers ?? []) : []) out.add(d);
  }
  return out;
}

const LayerRootfsSchema = z.object({
  spec: z.object({ rootfs: z.object({ layers: z.array(z.string()) }).optional() }),
});

function safeJson(text: string): unknown {
  try {
    return JSON.parse(text) as unknown;
  } catch {
    return undefined;
  }
}

function readdirOr(dir: string): string[] {
  try {
    return readdirSync(dir);
  } catch {
    return [];
  }
}
