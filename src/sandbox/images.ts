// The image store a runtime uses unless it is given one (`new Airlock({ images })`): the OCI store in
// the runtime's state dir, with registry settings from the environment (src/images/options.ts).
// Loaded on first use, so a sandbox on the host root never loads the registry client or tar code.
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { AirlockError } from '../core/errors.js';
import type { ImageResolver } from '../core/image.js';
import type { ImageStore } from '../images/store.js';
import type { SnapshotRecord } from '../core/snapshot.js';
import { RootfsSchema, type Rootfs, type SandboxSpec } from '../core/spec.js';
import type { TemplateConfig } from '../core/template.js';
import { parseOrThrow } from '../core/validate.js';
import { imageLayerInUse, preparedSlotMount } from '../backends/host/index.js';
import { SANDBOX_UID } from '../backends/host/rootfs.js';

/**
 * True while a layer dir is in use: a live sandbox's record names it (written before it mounts), a
 * create took a warm slot holding it (its claim; other such slots are revoked: see imageLayerInUse),
 * or any mount on the host names it (a sandbox of another state dir or an older Airlock), but a warm
 * slot's image root mounted ahead (dropped by its pool once the layers are gone).
 */
export async function layerInUse(stateDir: string, storeRoot: string): Promise<(dir: string) => boolean> {
  const { mountedLayerPredicate } = await import('../images/in-use.js');
  const mounted = mountedLayerPredicate(storeRoot, preparedSlotMount(stateDir));
  return (dir) => imageLayerInUse(stateDir, dir) || mounted(dir);
}

export function defaultImageResolver(stateDir: string, env: NodeJS.ProcessEnv = process.env): ImageResolver {
  let store: Promise<ImageStore> | undefined;
  /** The store once open (what `cached` asks, synchronously). */
  let opened: ImageStore | undefined;
  const open = async (): Promise<ImageStore> => {
    const [{ ImageStore }, { imageOptionsFromEnv }] = await Promise.all([
      import('../images/store.js'),
      import('../images/options.js'),
    ]);
    // ImageStore keeps its files under <stateDir>/images (ImageStore.root).
    const inUse = await layerInUse(stateDir, join(stateDir, 'images'));
    return (opened = new ImageStore({ stateDir, ...imageOptionsFromEnv(env), inUse }));
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
    cached: (ref, options) => opened?.cached(ref, options),
    // Its watches; the store stays open (a later create resolves through it again).
    close: async () => opened?.close(),
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

/**
 * The root of a sandbox on snapshot or template layers taken on an image (or allowlist) root: the
 * root their source sandbox ran on (its recorded spec's `rootfs`, whose layer dirs are
 * content-addressed), re-resolved by digest where the store no longer holds those dirs, with a
 * template's config over the image's. Undefined for layers taken on the host root.
 */
export async function rootOfLayer(
  top: SnapshotRecord,
  resolver: ImageResolver | undefined,
  template: { image?: { ref: string; digest: string }; config?: TemplateConfig } = {},
): Promise<Rootfs | undefined> {
  const recorded = RootfsSchema.safeParse((top.spec as { rootfs?: unknown }).rootfs);
  if (!recorded.success) return undefined;
  let rootfs = recorded.data;
  const image = template.image ?? rootfs.image;
  if (!rootfs.layers.every((d) => existsSync(d))) {
    if (!image || !resolver) {
      throw new AirlockError(
        'TEMPLATE_NOT_FOUND',
        `the root snapshot ${top.digest} was taken on is gone (its layers were removed); rebuild it`,
        { field: 'template' },
      );
    }
    // By digest: the image the layer's changes were made on, and no other.
    const name = image.ref.replace(/@sha256:[0-9a-f]{64}$/, '').replace(/:[\w][\w.-]*$/, '');
    const img = await resolver.resolve(`${name}@${image.digest}`);
    rootfs = { ...rootfs, layers: [...img.layers] };
  }
  const c = template.config ?? {};
  const names = new Set((c.env ?? []).map((e) => e.slice(0, e.indexOf('='))));
  const config = {
    ...rootfs.config,
    env: [...rootfs.config.env.filter((e) => !names.has(e.slice(0, e.indexOf('=')))), ...(c.env ?? [])],
    ...(c.workingDir !== undefined ? { workingDir: c.workingDir } : {}),
    // An ENTRYPOINT resets the image's CMD (as Docker does); a CMD alone keeps the entrypoint.
    ...(c.entrypoint !== undefined ? { entrypoint: c.entrypoint, cmd: c.cmd ?? [] } : {}),
    ...(c.cmd !== undefined ? { cmd: c.cmd } : {}),
  };
  return parseOrThrow(
    RootfsSchema,
    { ...rootfs, config, ...(image ? { image: { ref: image.ref, digest: image.digest } } : {}) },
    `snapshot ${top.digest}`,
  );
}
