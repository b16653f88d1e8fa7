// The image store a runtime uses unless it is given one (`new Airlock({ images })`): the OCI store in
// the runtime's state dir, with registry settings from the environment (src/images/options.ts).
// Loaded on first use, so a sandbox on the host root never loads the registry client or tar code.
import { join } from 'node:path';
import type { ImageResolver } from '../core/image.js';
import { RootfsSchema, type SandboxSpec } from '../core/spec.js';
import { parseOrThrow } from '../core/validate.js';
import { imageLayerUsers } from '../backends/host/index.js';
import { SANDBOX_UID } from '../backends/host/rootfs.js';

/**
 * True while a layer dir is in use: a live sandbox's record names it (written before it mounts), or
 * any mount on the host names it (a sandbox of another state dir or an older Airlock).
 */
export async function layerInUse(stateDir: string, storeRoot: string): Promise<(dir: string) => boolean> {
  const { mountedLayerPredicate } = await import('../images/in-use.js');
  return (dir) => imageLayerUsers(stateDir, dir).length > 0 || mountedLayerPredicate(storeRoot)(dir);
}

export function defaultImageResolver(stateDir: string, env: NodeJS.ProcessEnv = process.env): ImageResolver {
  let store: Promise<ImageResolver> | undefined;
  const open = async (): Promise<ImageResolver> => {
    const [{ ImageStore }, { imageOptionsFromEnv }] = await Promise.all([
      import('../images/store.js'),
      import('../images/options.js'),
    ]);
    // ImageStore keeps its files under <stateDir>/images (ImageStore.root).
    const inUse = await layerInUse(stateDir, join(stateDir, 'images'));
    const s = new ImageStore({ stateDir, ...imageOptionsFromEnv(env), inUse });
    return s;
  };
  return {
    async resolve(ref, options) {
      store ??= open();
      try {
        return await (await store).resolve(ref, options);
      } catch (e) {
        // A failed open (e.g. a malformed auth file) is retried on the next create, not cached.
        if (
          !(await store.then(
            () => true,
            () => false,
          ))
        )
          store = undefined;
        throw e;
      }
    },
  };
}

/**
 * A spec with `executables` → the spec of a sandbox on its allowlist root (`rootfs`): built from the
 * image's layers when the spec has an image (resolved already), else from the host root, and cached
 * by the plan's digest (images/closure-cache.ts). The root runs with the image's config, or on the
 * host root with none: as uid 1000, so what root owns in it shows as nobody's (read-only), as the
 * host's /usr does in a sandbox on the host root.
 */
export async function withExecutables(stateDir: string, spec: SandboxSpec): Promise<SandboxSpec> {
  const { ensureExecutableRoot } = await import('../images/closure-cache.js');
  const root = await ensureExecutableRoot({
    stateDir,
    sourceLayers: spec.rootfs?.layers ?? ['/'],
    executables: spec.executables!,
  });
  const config = spec.rootfs?.config ?? {
    env: [],
    workingDir: '',
    user: String(SANDBOX_UID),
    entrypoint: [],
    cmd: [],
    labels: {},
  };
  const rootfs = parseOrThrow(
    RootfsSchema,
    { layers: [root.dir], config, ...(spec.rootfs?.image ? { image: spec.rootfs.image } : {}) },
    'executables',
  );
  return { ...spec, rootfs };
}
