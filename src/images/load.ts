// Loading images without a registry: an OCI image layout directory (oci-layout, index.json, blobs/)
// or a `docker save` tarball (manifest.json + config + layer tars; newer ones carry an OCI layout
// inside, which is preferred). The same checks as a pull: every blob is verified against its digest
// and every layer against the config's diff_ids, by ImageStore.install.
//
// A tarball is first copied out (regular files only, names checked) into a temp dir inside the store;
// symlinks in it (older `docker save` links repeated layers) are followed only within the tarball.
// A `docker save` image has no registry manifest: one is made (OCI, from the config and the layer
// files' digests), so its digest is that of the made manifest, stable for the same tarball content.
import { createHash, randomBytes } from 'node:crypto';
import {
  closeSync,
  constants,
  createReadStream,
  mkdirSync,
  openSync,
  readFileSync,
  readSync,
  rmSync,
  statSync,
  writeSync,
} from 'node:fs';
import { posix, join } from 'node:path';
import { createGunzip } from 'node:zlib';
import { extract } from 'tar-stream';
import { z } from 'zod';
import { AirlockError } from '../core/errors.js';
import type { ResolvedImage } from '../core/image.js';
import { MAX_DOCUMENT_BYTES, MEDIA } from './manifest.js';
import { SHA256_DIGEST, formatImageRef } from './reference.js';
import type { BlobSource, ImageStore, PullOptions } from './store.js';
import { sniffCompression } from './stream.js';

const REF_NAME = 'org.opencontainers.image.ref.name';
const CONTAINERD_NAME = 'io.containerd.image.name';

const LayoutIndex = z.object({
  manifests: z
    .array(
      z.object({
        mediaType: z.string(),
        digest: z.string().regex(SHA256_DIGEST),
        size: z.number().int().nonnegative(),
        annotations: z.record(z.string(), z.string()).optional(),
      }),
    )
    .max(4096),
});

const DockerManifest = z
  .array(
    z.object({
      Config: z.string().max(4096),
      RepoTags: z.array(z.string().max(512)).nullish(),
      Layers: z.array(z.string().max(4096)).max(1024),
    }),
  )
  .max(1024);

function bad(path: string, why: string): AirlockError {
  return new AirlockError('INVALID_ARGUMENT', `${path} is not an image to load: ${why}`, { field: 'path' });
}

function parseJson<S extends z.ZodType>(schema: S, file: string, what: string): z.output<S> {
  let v: unknown;
  try {
    if (statSync(file).size > MAX_DOCUMENT_BYTES) throw new Error('too large');
    v = JSON.parse(readFileSync(file, 'utf8'));
  } catch (e) {
    throw bad(file, `${what} is unreadable (${(e as Error).message})`);
  }
  const r = schema.safeParse(v);
  if (!r.success)
    throw bad(file, `${what}: ${r.error.issues[0]?.path.join('.')}: ${r.error.issues[0]?.message}`);
  return r.data;
}

/** A relative path inside a tarball or layout, refused if it climbs out. */
function inside(root: string, rel: string): string {
  const n = posix.normalize(rel);
  if (n.startsWith('/') || n === '..' || n.startsWith('../') || n.includes('\0'))
    throw bad(root, `"${rel}" points outside it`);
  return join(root, n);
}

function fileSource(
  describe: string,
  pathOf: (digest: string) => string,
  docs: Map<string, Buffer>,
): BlobSource {
  return {
    describe,
    async manifest(digest) {
      const made = docs.get(digest);
      if (made) return { bytes: made };
      const p = pathOf(digest);
      if (!SHA256_DIGEST.test(digest) || statSync(p, { throwIfNoEntry: false }) === undefined) {
        throw new AirlockError('IMAGE_NOT_FOUND', `${describe} has no blob ${digest}`);
      }
      if (statSync(p).size > MAX_DOCUMENT_BYTES)
        throw bad(describe, `manifest ${digest} is over ${MAX_DOCUMENT_BYTES} bytes`);
      return { bytes: readFileSync(p) };
    },
    async blob(digest, size) {
      const p = pathOf(digest);
      const st = statSync(p, { throwIfNoEntry: false });
      if (!SHA256_DIGEST.test(digest) || !st?.isFile())
        throw new AirlockError('IMAGE_NOT_FOUND', `${describe} has no blob ${digest}`);
      if (st.size > size)
        throw new AirlockError(
          'IMAGE_DIGEST_MISMATCH',
          `blob ${digest} in ${describe} is ${st.size} bytes, but its descriptor says ${size}`,
        );
      return createReadStream(p);
    },
  };
}

async function loadLayout(
  store: ImageStore,
  dir: string,
  name: string | undefined,
  o: PullOptions,
): Promise<ResolvedImage[]> {
  const index = parseJson(LayoutIndex, join(dir, 'index.json'), 'index.json');
  const source = fileSource(dir, (d) => join(dir, 'blobs', 'sha256', d.slice(7)), new Map());
  const out: ResolvedImage[] = [];
  for (const m of index.manifests) {
    const annotated = m.annotations?.[CONTAINERD_NAME] ?? m.annotations?.[REF_NAME];
    // A bare tag ("v1") in ref.name names no repository: it needs --name.
    const text = name ?? (annotated && /[/:]/.test(annotated) ? annotated : undefined);
    if (text === undefined) {
      throw bad(
        dir,
        `its index entry ${m.digest} carries no image name${annotated ? ` (only "${annotated}")` : ''}: give one (--name)`,
      );
    }
    out.push(await store.install(formatImageRef(store.parse(text)), m.digest, source, o));
  }
  return out;
}

async function loadDockerSave(
  store: ImageStore,
  dir: string,
  name: string | undefined,
  o: PullOptions,
): Promise<ResolvedImage[]> {
  const entries = parseJson(DockerManifest, join(dir, 'manifest.json'), 'manifest.json');
  const out: ResolvedImage[] = [];
  for (const e of entries) {
    const configPath = inside(dir, e.Config);
    const config = readFileSync(configPath);
    const paths = new Map<string, string>([[sha256(config), configPath]]);
    const layers = [];
    for (const l of e.Layers) {
      const p = inside(dir, l);
      const digest = await sha256File(p);
      paths.set(digest, p);
      const head = Buffer.alloc(4);
      const fd = openSync(p, constants.O_RDONLY);
      readSync(fd, head, 0, 4, 0);
      closeSync(fd);
      const c = sniffCompression(head);
      layers.push({
        mediaType: `application/vnd.oci.image.layer.v1.tar${c === 'none' ? '' : `+${c}`}`,
        digest,
        size: statSync(p).size,
      });
    }
    const manifest = Buffer.from(
      JSON.stringify({
        schemaVersion: 2,
        mediaType: MEDIA.ociManifest,
        config: { mediaType: MEDIA.ociConfig, digest: sha256(config), size: config.length },
        layers,
      }),
    );
    const digest = sha256(manifest);
    const source = fileSource(dir, (d) => paths.get(d) ?? '/nonexistent', new Map([[digest, manifest]]));
    const names = name ? [name] : (e.RepoTags ?? []);
    if (names.length === 0) throw bad(dir, `its image ${e.Config} has no RepoTags: give a name (--name)`);
    for (const n of names) out.push(await store.install(formatImageRef(store.parse(n)), digest, source, o));
  }
  return out;
}

const sha256 = (b: Buffer): string => `sha256:${createHash('sha256').update(b).digest('hex')}`;

async function sha256File(p: string): Promise<string> {
  const h = createHash('sha256');
  for await (const c of createReadStream(p)) h.update(c as Buffer);
  return `sha256:${h.digest('hex')}`;
}

/** Copies a tarball's regular files (and its internal symlinks, as copies) into `dest`. */
async function extractTarball(file: string, dest: string): Promise<void> {
  const head = Buffer.alloc(4);
  const fd = openSync(file, constants.O_RDONLY);
  readSync(fd, head, 0, 4, 0);
  closeSync(fd);
  const c = sniffCompression(head);
  if (c === 'zstd') throw bad(file, 'a zstd-compressed tarball: decompress it first');
  const ex = extract();
  const src = createReadStream(file);
  (c === 'gzip' ? src.pipe(createGunzip()) : src).pipe(ex as unknown as NodeJS.WritableStream);
  const links: Array<[string, string]> = [];
  for await (const entry of ex) {
    const h = entry.header;
    const target = inside(dest, h.name);
    if (h.type === 'file') {
      mkdirSync(join(target, '..'), { recursive: true, mode: 0o700 });
      const out = openSync(
        target,
        constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW,
        0o600,
      );
      try {
        for await (const chunk of entry as unknown as AsyncIterable<Buffer>) writeSync(out, chunk);
      } finally {
        closeSync(out);
      }
    } else if ((h.type === 'symlink' || h.type === 'link') && h.linkname) {
      const to = h.type === 'link' ? h.linkname : posix.join(posix.dirname(h.name), h.linkname);
      links.push([h.name, to]);
    }
    entry.resume();
  }
  // Links within the tarball become copies of their (in-tarball) targets.
  for (const [from, to] of links) {
    const t = inside(dest, to);
    if (statSync(t, { throwIfNoEntry: false })?.isFile()) {
      const f = inside(dest, from);
      mkdirSync(join(f, '..'), { recursive: true, mode: 0o700 });
      const data = createReadStream(t);
      const out = openSync(
        f,
        constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW,
        0o600,
      );
      try {
        for await (const chunk of data) writeSync(out, chunk as Buffer);
      } finally {
        closeSync(out);
      }
    }
  }
}

/**
 * Loads every image in `path` (an OCI layout dir, an extracted or packed `docker save`), recording
 * each under its own name, or under `name` when given.
 */
export async function loadImages(
  store: ImageStore,
  path: string,
  o: PullOptions & { name?: string } = {},
): Promise<ResolvedImage[]> {
  const st = statSync(path, { throwIfNoEntry: false });
  if (!st) throw new AirlockError('FILE_NOT_FOUND', `${path} does not exist`, { field: 'path' });
  let dir = path;
  let tmp: string | undefined;
  if (!st.isDirectory()) {
    mkdirSync(store.root, { recursive: true, mode: 0o700 });
    tmp = join(store.root, `.load-${process.pid}-${randomBytes(6).toString('hex')}`);
    mkdirSync(tmp, { mode: 0o700 });
    dir = tmp;
  }
  try {
    if (tmp) await extractTarball(path, tmp);
    const isLayout =
      statSync(join(dir, 'index.json'), { throwIfNoEntry: false })?.isFile() &&
      statSync(join(dir, 'blobs'), { throwIfNoEntry: false })?.isDirectory();
    if (isLayout) return await loadLayout(store, dir, o.name, o);
    if (statSync(join(dir, 'manifest.json'), { throwIfNoEntry: false })?.isFile())
      return await loadDockerSave(store, dir, o.name, o);
    throw bad(path, 'no index.json with blobs/ (OCI layout) and no manifest.json (docker save)');
  } finally {
    if (tmp) rmSync(tmp, { recursive: true, force: true });
  }
}
