// OCI / Docker image manifests, indexes and configs: zod schemas for what a registry (or a layout
// directory, or a `docker save` tarball) hands us, the platform choice, and the ImageConfig the tiers
// use. Pure: no I/O. Every document is parsed from bytes whose digest was verified first.
import { z } from 'zod';
import { AirlockError } from '../core/errors.js';
import type { ImageConfig } from '../core/image.js';
import { SHA256_DIGEST } from './reference.js';

export const MEDIA = {
  ociManifest: 'application/vnd.oci.image.manifest.v1+json',
  ociIndex: 'application/vnd.oci.image.index.v1+json',
  dockerManifest: 'application/vnd.docker.distribution.manifest.v2+json',
  dockerList: 'application/vnd.docker.distribution.manifest.list.v2+json',
  ociConfig: 'application/vnd.oci.image.config.v1+json',
} as const;

/** The Accept header of a manifest request: every manifest and index type this store reads. */
export const MANIFEST_ACCEPT = [
  MEDIA.ociManifest,
  MEDIA.ociIndex,
  MEDIA.dockerManifest,
  MEDIA.dockerList,
].join(', ');

/** Largest manifest, index or config accepted (bytes): real ones are a few KiB. */
export const MAX_DOCUMENT_BYTES = 4 * 1024 * 1024;

/** The only platform this version runs. */
export const PLATFORM = { os: 'linux', architecture: 'amd64' } as const;

const Digest = z.string().regex(SHA256_DIGEST, 'must be sha256:<64 hex>');
const Size = z.number().int().nonnegative().max(Number.MAX_SAFE_INTEGER);

const Descriptor = z.object({
  mediaType: z.string().max(255),
  digest: Digest,
  size: Size,
  platform: z
    .object({
      os: z.string().max(64),
      architecture: z.string().max(64),
      variant: z.string().max(64).optional(),
    })
    .optional(),
});
export type Descriptor = z.infer<typeof Descriptor>;

const ManifestSchema = z.object({
  schemaVersion: z.literal(2),
  mediaType: z.string().optional(),
  config: Descriptor,
  layers: z.array(Descriptor).max(1024),
});
export type Manifest = z.infer<typeof ManifestSchema>;

const IndexSchema = z.object({
  schemaVersion: z.literal(2),
  mediaType: z.string().optional(),
  manifests: z.array(Descriptor).max(4096),
});

const StringList = z.array(z.string().max(65536)).max(4096).nullish();
const ConfigSchema = z.object({
  os: z.string().max(64).optional(),
  architecture: z.string().max(64).optional(),
  config: z
    .object({
      Env: StringList,
      WorkingDir: z.string().max(4096).nullish(),
      User: z.string().max(256).nullish(),
      Entrypoint: StringList,
      Cmd: StringList,
      Labels: z.record(z.string().max(4096), z.string().max(65536)).nullish(),
    })
    .nullish(),
  rootfs: z.object({ type: z.literal('layers'), diff_ids: z.array(Digest).max(1024) }),
});
export type ImageConfigDoc = z.infer<typeof ConfigSchema>;

const LAYER_TYPES = new Set([
  'application/vnd.oci.image.layer.v1.tar',
  'application/vnd.oci.image.layer.v1.tar+gzip',
  'application/vnd.oci.image.layer.v1.tar+zstd',
  'application/vnd.docker.image.rootfs.diff.tar.gzip',
  'application/vnd.docker.image.rootfs.diff.tar',
]);

function invalid(what: string, detail: string): AirlockError {
  return new AirlockError('IMAGE_REGISTRY_ERROR', `${what} is not a valid image document: ${detail}`);
}

function json(bytes: Buffer, what: string): unknown {
  try {
    return JSON.parse(bytes.toString('utf8'));
  } catch {
    throw invalid(what, 'not JSON');
  }
}

function check<S extends z.ZodType>(schema: S, v: unknown, what: string): z.output<S> {
  const r = schema.safeParse(v);
  if (!r.success) {
    const i = r.error.issues[0]!;
    throw invalid(what, `${i.path.join('.') || '(top)'}: ${i.message}`);
  }
  return r.data;
}

export type ManifestDoc =
  | { readonly kind: 'index'; readonly manifests: readonly Descriptor[] }
  | { readonly kind: 'manifest'; readonly manifest: Manifest };

/** A manifest or an index, told apart by its media type (the document's own, else the response's). */
export function parseManifestDoc(bytes: Buffer, contentType: string | undefined, what: string): ManifestDoc {
  const v = json(bytes, what) as { mediaType?: unknown; manifests?: unknown };
  const type = typeof v?.mediaType === 'string' ? v.mediaType : (contentType ?? '').split(';')[0]!.trim();
  if (type === MEDIA.ociIndex || type === MEDIA.dockerList || (type === '' && Array.isArray(v?.manifests))) {
    return { kind: 'index', manifests: check(IndexSchema, v, what).manifests };
  }
  if (type !== '' && type !== MEDIA.ociManifest && type !== MEDIA.dockerManifest) {
    throw invalid(what, `unsupported media type "${type}" (schema 1 manifests are not read)`);
  }
  const m = check(ManifestSchema, v, what);
  for (const l of m.layers) {
    if (!LAYER_TYPES.has(l.mediaType)) {
      throw invalid(what, `layer ${l.digest} has unsupported media type "${l.mediaType}"`);
    }
  }
  return { kind: 'manifest', manifest: m };
}

/** The linux/amd64 entry of an index; IMAGE_PLATFORM_UNSUPPORTED listing what the index has. */
export function pickPlatform(manifests: readonly Descriptor[], ref: string): Descriptor {
  const hit = manifests.find(
    (d) =>
      d.platform?.os === PLATFORM.os &&
      d.platform.architecture === PLATFORM.architecture &&
      (d.mediaType === MEDIA.ociManifest || d.mediaType === MEDIA.dockerManifest),
  );
  if (hit) return hit;
  const have = manifests
    .map((d) =>
      d.platform
        ? `${d.platform.os}/${d.platform.architecture}${d.platform.variant ? `/${d.platform.variant}` : ''}`
        : 'unknown',
    )
    .filter((p) => p !== 'unknown/unknown');
  throw new AirlockError(
    'IMAGE_PLATFORM_UNSUPPORTED',
    `image ${ref} has no ${PLATFORM.os}/${PLATFORM.architecture} variant (it has: ${[...new Set(have)].join(', ') || 'none'})`,
    { field: 'image' },
  );
}

export function parseConfig(bytes: Buffer, ref: string): ImageConfigDoc {
  const c = check(ConfigSchema, json(bytes, `config of ${ref}`), `config of ${ref}`);
  const os = c.os ?? PLATFORM.os;
  const arch = c.architecture ?? PLATFORM.architecture;
  if (os !== PLATFORM.os || arch !== PLATFORM.architecture) {
    throw new AirlockError(
      'IMAGE_PLATFORM_UNSUPPORTED',
      `image ${ref} is for ${os}/${arch}; only ${PLATFORM.os}/${PLATFORM.architecture} runs here`,
      { field: 'image' },
    );
  }
  return c;
}

/** What the tiers use from an image config. */
export function imageConfigOf(c: ImageConfigDoc): ImageConfig {
  const k = c.config ?? {};
  return {
    env: [...(k.Env ?? [])],
    workingDir: k.WorkingDir ?? '',
    user: k.User ?? '',
    entrypoint: [...(k.Entrypoint ?? [])],
    cmd: [...(k.Cmd ?? [])],
    labels: { ...(k.Labels ?? {}) },
  };
}
