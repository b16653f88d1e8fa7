// The image store: pulls (or loads) images, verifies every blob, unpacks layers, and caches them.
//
//   <stateDir>/images/                        0700 root
//   <stateDir>/images/blobs/sha256:<hex>       verified manifests, indexes and configs (raw bytes)
//   <stateDir>/images/layers/sha256:<diffid>/fs/          an unpacked layer (overlayfs format)
//   <stateDir>/images/layers/sha256:<diffid>/layer.json   its record (size, entries, when)
//   <stateDir>/images/layers/.tmp-<pid>-<rand>/  an unpack in progress (reaped once its pid is gone)
//   <stateDir>/images/refs/<sha256 of ref>.json  ref → digest, one file per ref (atomic replace)
//   <stateDir>/images/.lock                    flock: pulls shared, rm/prune exclusive
//
// Image layers live beside the snapshot layer store (<stateDir>/layers/), not in it: they are keyed
// by the OCI diff_id (sha256 of the uncompressed tar), snapshot layers by Airlock's own capture
// digest, and the two never share a record format. Both are the same on-disk format and are used
// the same way (read-only overlay lowers). Every layer is unpacked into a fresh .tmp dir and renamed
// into place only after both its digests checked out, so a layer dir that exists is complete; two
// pulls of the same layer race only on that rename, and the loser discards its copy.
import { createHash, randomBytes } from 'node:crypto';
import {
  closeSync,
  existsSync,
  fstatSync,
  openSync,
  mkdirSync,
  readFileSync,
  readdirSync,
  renameSync,
  rmSync,
  statSync,
  watch,
  writeFileSync,
  type FSWatcher,
} from 'node:fs';
import { join } from 'node:path';
import { pipeline } from 'node:stream/promises';
import { z } from 'zod';
import { AirlockError } from '../core/errors.js';
import { deepFreeze } from '../core/freeze.js';
import type { ImageResolver, PullPolicy, ResolvedImage } from '../core/image.js';
import { withFileLock } from './lock.privileged.js';
import {
  MAX_DOCUMENT_BYTES,
  imageConfigOf,
  parseConfig,
  parseManifestDoc,
  pickPlatform,
  type Descriptor,
  type ImageConfigDoc,
  type Manifest,
} from './manifest.js';
import { SHA256_DIGEST, formatImageRef, parseImageRef, type ImageRef } from './reference.js';
import { RegistryClient, type RegistryCredentials } from './registry.js';
import { fetchLayer, mismatch, type BlobSource, type PullEvent, type PullOptions } from './layer-fetch.js';
import { Meter } from './stream.js';

/** Default cap on an image: compressed download and unpacked content each (bytes). */
export const DEFAULT_MAX_IMAGE_BYTES = 8 * 1024 ** 3;
/** Layers downloaded and unpacked at once. */
const LAYER_CONCURRENCY = 3;

export interface ImageStoreOptions {
  readonly stateDir: string;
  /** `host[:port]` put in front of references without a host. None by default. */
  readonly defaultRegistry?: string;
  /** Non-loopback registries reached over plain http. */
  readonly insecure?: readonly string[];
  readonly credentials?: (registry: string) => RegistryCredentials | undefined;
  /** Cap on an image's size, compressed and unpacked (default 8 GiB). */
  readonly maxImageBytes?: number;
  /** True while a live sandbox uses the layer dir (`layers/sha256:<diffid>/fs`): rm/prune keep it. */
  readonly inUse?: (layerDir: string) => boolean;
}

export type { BlobSource, PullEvent, PullOptions };

const RefRecord = z.object({
  ref: z.string(),
  digest: z.string().regex(SHA256_DIGEST),
  pulledAt: z.string(),
});
type RefRecord = z.infer<typeof RefRecord>;

const LayerRecord = z.object({
  diffId: z.string(),
  sizeBytes: z.number(),
  entries: z.number(),
  unpackedAt: z.string(),
});

export interface ImageSummary {
  readonly ref: string;
  readonly digest: string;
  readonly pulledAt: string;
  readonly layers: number;
  /** Unpacked bytes of its layers present in the store. */
  readonly sizeBytes: number;
}

const sha256 = (b: Buffer | string): string => `sha256:${createHash('sha256').update(b).digest('hex')}`;

function readJson(file: string | number): unknown {
  try {
    return JSON.parse(readFileSync(file, 'utf8'));
  } catch {
    return undefined;
  }
}

export class ImageStore implements ImageResolver {
  readonly root: string;
  private readonly client: RegistryClient;
  private readonly maxBytes: number;
  private readonly inflight = new Map<string, Promise<void>>();
  /**
   * Blobs already read and verified, by digest, with the identity of the file they were read from
   * (device, inode, size, mtime): a resolve of a cached image then reads none again while the file
   * is unchanged. Bounded: cleared when it grows past MAX_VERIFIED_BLOBS.
   */
  private readonly verified = new Map<string, { id: string; bytes: Buffer }>();
  /**
   * Images resolved from the store alone, by normalised ref, each with an open fd of the ref file it
   * was read through: a resolve of a cached image then costs one fstat and parses nothing. An entry
   * is used only while that file is still linked and unchanged: the store changes a ref only by a
   * rename over it (re-pull) or an unlink (rm), and either drops the link count of the file held to
   * 0 at once, in the kernel; a write in place (by hand) changes its size or its ctime, which the
   * same fstat compares (as the stat of the path it replaces did; synchronous, and it walks no path;
   * like that stat, it misses a same-size write within the clock tick of the file's last change). All entries are dropped at any change in
   * the blobs or layers dirs (`watching`: a blob written or removed, a layer added, renamed away or
   * removed; the event comes within a turn of the event loop). A layer removed from under a create is
   * still caught where it counts: a warm slot holding it is revoked by the remover before the layer
   * goes (backends/host slot-claim.privileged.ts), and a create that mounts it itself fails to
   * (mountImageRoot). Bounded (MAX_VERIFIED_BLOBS fds); close() closes them.
   */
  private readonly resolved = new Map<string, { fd: number; id: string; image: ResolvedImage }>();
  /** References parsed (parse), by their text, with their normalised name (formatImageRef). */
  private readonly parsed = new Map<string, { ref: ImageRef; name: string }>();
  /** Watches on the blobs and layers dirs (undefined: not set up yet; null: cannot watch, no cache). */
  private watching: FSWatcher[] | null | undefined;

  constructor(private readonly opts: ImageStoreOptions) {
    this.root = join(opts.stateDir, 'images');
    this.maxBytes = opts.maxImageBytes ?? DEFAULT_MAX_IMAGE_BYTES;
    this.client = new RegistryClient({
      ...(opts.insecure ? { insecure: opts.insecure } : {}),
      ...(opts.credentials ? { credentials: opts.credentials } : {}),
    });
  }

  private ensure(): void {
    for (const d of [
      this.root,
      join(this.root, 'blobs'),
      join(this.root, 'layers'),
      join(this.root, 'refs'),
    ]) {
      mkdirSync(d, { recursive: true, mode: 0o700 });
    }
  }

  /** The unpacked tree of a layer (what the tiers mount). */
  layerDir(diffId: string): string {
    return join(this.root, 'layers', diffId, 'fs');
  }

  parse(ref: string): ImageRef {
    return this.parsedName(ref).ref;
  }

  /** `ref` parsed, and its normalised name. */
  private parsedName(ref: string): { ref: ImageRef; name: string } {
    // Pure (the default registry is fixed): a reference parsed once is not parsed again.
    let p = this.parsed.get(ref);
    if (!p) {
      const r = Object.freeze(parseImageRef(ref, this.opts.defaultRegistry));
      p = { ref: r, name: formatImageRef(r) };
      if (this.parsed.size >= MAX_VERIFIED_BLOBS) this.parsed.clear();
      this.parsed.set(ref, p);
    }
    return p;
  }

  resolve(ref: string, options: { pull?: PullPolicy; signal?: AbortSignal } = {}): Promise<ResolvedImage> {
    return this.pull(ref, options);
  }

  /**
   * What `pull(text, o)` would return at once, when `text` was resolved from the store before and
   * its entry is still current (see `resolved`); undefined otherwise (or with pull "always").
   */
  cached(text: string, o: { pull?: PullPolicy } = {}): ResolvedImage | undefined {
    if (o.pull === 'always') return undefined;
    const p = this.parsed.get(text);
    return p && this.current(p.name);
  }

  /** The cached image of normalised ref `name` if its ref file is still the one it was read from. */
  private current(name: string): ResolvedImage | undefined {
    const hit = this.resolved.get(name);
    if (!hit) return undefined;
    if (heldId(hit.fd) === hit.id) return hit.image;
    this.resolved.delete(name);
    closeSync(hit.fd);
    return undefined;
  }

  /** Drops every resolved image (and closes the fds they hold). */
  private forget(): void {
    for (const { fd } of this.resolved.values()) closeSync(fd);
    this.resolved.clear();
  }

  /** Resolves `text` per the pull policy (default `missing`), pulling what is needed. */
  async pull(text: string, o: PullOptions = {}): Promise<ResolvedImage> {
    const { ref: r, name } = this.parsedName(text);
    const policy = o.pull ?? 'missing';
    if (policy !== 'always') {
      const local = this.local(r, name);
      if (local) return local;
      if (policy === 'never') {
        throw new AirlockError(
          'IMAGE_NOT_FOUND',
          `image ${name} is not in the local store and pull is "never": pull or load it first`,
          { field: 'image' },
        );
      }
    }
    if (r.registry === undefined) {
      throw new AirlockError(
        'IMAGE_NOT_FOUND',
        `image ${name} is not in the local store and names no registry: give host/path:tag, set a default registry, or load it`,
        { field: 'image' },
      );
    }
    const registry = r.registry;
    const source: BlobSource = {
      describe: `${registry}/${r.repository}`,
      manifest: (ref, signal) => this.client.manifest(registry, r.repository, ref, signal),
      blob: (digest, size, signal) => this.client.blob(registry, r.repository, digest, size, signal),
    };
    return this.install(name, r.digest ?? r.tag!, source, o);
  }

  /**
   * Fetches, verifies and stores the image `reference` (tag or digest) from `source`, recording it
   * under `name`. Exported for the loaders (OCI layout, docker tarball).
   */
  async install(
    name: string,
    reference: string,
    source: BlobSource,
    o: PullOptions = {},
  ): Promise<ResolvedImage> {
    this.ensure();
    return withFileLock(
      join(this.root, '.lock'),
      'shared',
      async () => {
        const top = await source.manifest(reference, o.signal);
        const topDigest = sha256(top.bytes);
        if (SHA256_DIGEST.test(reference) && topDigest !== reference)
          throw mismatch(`manifest of ${name}`, reference, topDigest);
        if (top.claimedDigest !== undefined && top.claimedDigest !== topDigest)
          throw mismatch(`manifest of ${name}`, top.claimedDigest, topDigest);
        const docs: Array<[string, Buffer]> = [[topDigest, top.bytes]];
        let doc = parseManifestDoc(top.bytes, top.contentType, `manifest of ${name}`);
        if (doc.kind === 'index') {
          const d = pickPlatform(doc.manifests, name);
          const m = await source.manifest(d.digest, o.signal);
          const got = sha256(m.bytes);
          if (got !== d.digest || m.bytes.length !== d.size)
            throw mismatch(`platform manifest of ${name}`, d.digest, got);
          doc = parseManifestDoc(m.bytes, m.contentType, `platform manifest of ${name}`);
          if (doc.kind !== 'manifest')
            throw new AirlockError(
              'IMAGE_REGISTRY_ERROR',
              `the linux/amd64 entry of ${name} is another index`,
            );
          docs.push([got, m.bytes]);
        }
        const manifest = doc.manifest;
        const total = manifest.layers.reduce((n, l) => n + l.size, manifest.config.size);
        if (total > this.maxBytes) throw this.tooLarge(name, `its manifest lists ${total} bytes`);
        const configBytes = await this.document(source, manifest.config, `config of ${name}`, o.signal);
        docs.push([manifest.config.digest, configBytes]);
        const config = parseConfig(configBytes, name);
        const diffIds = config.rootfs.diff_ids;
        if (diffIds.length !== manifest.layers.length) {
          throw new AirlockError(
            'IMAGE_REGISTRY_ERROR',
            `image ${name}: its config lists ${diffIds.length} layers, its manifest ${manifest.layers.length}`,
          );
        }
        o.onProgress?.({
          kind: 'resolved',
          ref: name,
          digest: topDigest,
          layers: diffIds.length,
          bytes: total,
        });
        const budget = { left: this.maxBytes };
        // Up to LAYER_CONCURRENCY layers at once; after a failure no new one starts, and the running ones
        // finish (or fail) and clean up before the error is thrown.
        const queue = [...manifest.layers.entries()];
        let failed = false;
        const worker = async (): Promise<void> => {
          for (let next = queue.shift(); next && !failed; next = queue.shift()) {
            try {
              await this.layer(name, next[0], next[1], diffIds[next[0]]!, source, budget, o);
            } catch (e) {
              failed = true;
              throw e;
            }
          }
        };
        const settled = await Promise.allSettled(Array.from({ length: LAYER_CONCURRENCY }, worker));
        const errors = settled
          .filter((r): r is PromiseRejectedResult => r.status === 'rejected')
          .map((r) => r.reason as unknown);
        if (errors.length) throw errors.find((e) => AirlockError.isInstance(e)) ?? errors[0];
        for (const [d, b] of docs) this.writeBlob(d, b);
        this.writeRef({ ref: name, digest: topDigest, pulledAt: new Date().toISOString() });
        return {
          ref: name,
          digest: topDigest,
          layers: diffIds.map((d) => this.layerDir(d)),
          config: imageConfigOf(config),
        };
      },
      o.signal,
    );
  }

  private tooLarge(name: string, what: string): AirlockError {
    return new AirlockError(
      'IMAGE_TOO_LARGE',
      `image ${name} is over maxImageBytes (${this.maxBytes}): ${what}; raise the cap or use a smaller image`,
      { field: 'image' },
    );
  }

  /** A small blob (config), read whole and verified. */
  private async document(
    source: BlobSource,
    d: Descriptor,
    what: string,
    signal?: AbortSignal,
  ): Promise<Buffer> {
    if (d.size > MAX_DOCUMENT_BYTES)
      throw new AirlockError(
        'IMAGE_REGISTRY_ERROR',
        `${what} is ${d.size} bytes, over the ${MAX_DOCUMENT_BYTES}-byte cap`,
      );
    const cached = this.readBlob(d.digest);
    if (cached) return cached;
    const meter = new Meter(d.size, () =>
      mismatch(`${what} (longer than its descriptor)`, d.digest, 'more bytes'),
    );
    const chunks: Buffer[] = [];
    await pipeline(await source.blob(d.digest, d.size, signal), meter, async (src: AsyncIterable<Buffer>) => {
      for await (const c of src) chunks.push(c);
    });
    const got = meter.digest();
    if (got !== d.digest || meter.bytes !== d.size) throw mismatch(what, d.digest, got);
    return Buffer.concat(chunks);
  }

  /** One layer: present already (by diff_id), or downloaded, verified twice and unpacked. */
  private async layer(
    name: string,
    index: number,
    d: Descriptor,
    diffId: string,
    source: BlobSource,
    budget: { left: number },
    o: PullOptions,
  ): Promise<void> {
    const present = this.layerRecord(diffId);
    o.onProgress?.({ kind: 'layer', index, digest: d.digest, size: d.size, cached: present !== undefined });
    if (present) {
      budget.left -= present.sizeBytes;
      if (budget.left < 0) throw this.tooLarge(name, 'its unpacked layers add up past the cap');
      return;
    }
    let p = this.inflight.get(diffId);
    if (!p) {
      p = fetchLayer({ name, index, d, diffId, source, budget, o }, join(this.root, 'layers'), (what) =>
        this.tooLarge(name, what),
      ).finally(() => this.inflight.delete(diffId));
      this.inflight.set(diffId, p);
    }
    await p;
    o.onProgress?.({ kind: 'layer-done', index, digest: d.digest });
  }

  private layerRecord(diffId: string): z.infer<typeof LayerRecord> | undefined {
    const r = LayerRecord.safeParse(readJson(join(this.root, 'layers', diffId, 'layer.json')));
    return r.success && r.data.diffId === diffId ? r.data : undefined;
  }

  private readBlob(digest: string): Buffer | undefined {
    if (!SHA256_DIGEST.test(digest)) return undefined;
    const file = join(this.root, 'blobs', digest);
    try {
      const st = statSync(file, { bigint: true });
      const id = `${st.dev}:${st.ino}:${st.size}:${st.mtimeNs}`;
      const known = this.verified.get(digest);
      if (known?.id === id) return known.bytes;
      const b = readFileSync(file);
      if (sha256(b) !== digest) return undefined;
      if (this.verified.size >= MAX_VERIFIED_BLOBS) this.verified.clear();
      // (Only small blobs are read here: manifests, indexes and configs.)
      if (b.length <= 1024 * 1024) this.verified.set(digest, { id, bytes: b });
      return b;
    } catch {
      return undefined;
    }
  }

  private writeBlob(digest: string, bytes: Buffer): void {
    const file = join(this.root, 'blobs', digest);
    if (existsSync(file)) return;
    const tmp = `${file}.tmp-${process.pid}-${randomBytes(4).toString('hex')}`;
    writeFileSync(tmp, bytes, { mode: 0o600 });
    renameSync(tmp, file);
  }

  private refFile(ref: string): string {
    return join(this.root, 'refs', `${sha256(ref).slice(7)}.json`);
  }

  private writeRef(r: RefRecord): void {
    const file = this.refFile(r.ref);
    const tmp = `${file}.tmp-${process.pid}-${randomBytes(4).toString('hex')}`;
    writeFileSync(tmp, JSON.stringify(r), { mode: 0o600 });
    renameSync(tmp, file);
  }

  /** The ref file of `ref`, or `fd` when it was opened already. */
  private readRef(ref: string, fd?: number): RefRecord | undefined {
    const r = RefRecord.safeParse(readJson(fd ?? this.refFile(ref)));
    return r.success && r.data.ref === ref ? r.data : undefined;
  }

  /** The manifest (and its layers' diff_ids and config) of a stored digest, if all of it is here. */
  private stored(
    digest: string,
    name: string,
  ): { manifest: Manifest; diffIds: string[]; config: ImageConfigDoc } | undefined {
    const top = this.readBlob(digest);
    if (!top) return undefined;
    let doc = parseManifestDoc(top, undefined, `stored manifest of ${name}`);
    if (doc.kind === 'index') {
      const m = this.readBlob(pickPlatform(doc.manifests, name).digest);
      if (!m) return undefined;
      doc = parseManifestDoc(m, undefined, `stored manifest of ${name}`);
      if (doc.kind !== 'manifest') return undefined;
    }
    const configBytes = this.readBlob(doc.manifest.config.digest);
    if (!configBytes) return undefined;
    const config = parseConfig(configBytes, name);
    return { manifest: doc.manifest, diffIds: config.rootfs.diff_ids, config };
  }

  /** The image from the store alone, or undefined when any part is missing. */
  private local(r: ImageRef, name: string): ResolvedImage | undefined {
    const hit = this.current(name);
    if (hit) return hit;
    // Watching before reading, and the ref read through the fd the entry keeps: whatever changes
    // from here on drops the entry made below.
    const cache = this.watchStore();
    let fd = openOr(this.refFile(name));
    try {
      // Its identity before its content: a write in between shows at the next check.
      const id = fd === undefined ? undefined : heldId(fd);
      const ref = fd === undefined ? undefined : this.readRef(name, fd);
      const digest = r.digest ?? ref?.digest;
      if (!digest) return undefined;
      const s = this.stored(digest, name);
      if (!s || !s.diffIds.every((d) => this.layerRecord(d))) return undefined;
      if (r.digest !== undefined && !ref)
        this.writeRef({ ref: name, digest, pulledAt: new Date().toISOString() });
      const image = deepFreeze({
        ref: name,
        digest,
        layers: s.diffIds.map((d) => this.layerDir(d)),
        config: imageConfigOf(s.config),
      });
      // Kept only when resolved through a ref file that was there all along (none written just now).
      if (cache && ref && fd !== undefined && id !== undefined) {
        if (this.resolved.size >= MAX_VERIFIED_BLOBS) this.forget();
        this.resolved.set(name, { fd, id, image });
        fd = undefined; // the entry's now
      }
      return image;
    } finally {
      if (fd !== undefined) closeSync(fd);
    }
  }

  /** Sets up `watching` once; whether resolved images may be cached. */
  private watchStore(): boolean {
    if (this.watching !== undefined) return this.watching !== null;
    const drop = (): void => this.forget();
    const ws: FSWatcher[] = [];
    try {
      for (const d of ['blobs', 'layers']) {
        // Not persistent: a store's watches never keep its process alive.
        const w = watch(join(this.root, d), { persistent: false }, drop);
        ws.push(w);
        w.on('error', () => {
          for (const x of ws) x.close();
          if (this.watching === ws) this.watching = null; // (not after close())
          drop();
        });
      }
      this.watching = ws;
    } catch (e) {
      for (const x of ws) x.close();
      // No store yet (nothing to cache either): tried again at the next resolve.
      this.watching = (e as NodeJS.ErrnoException).code === 'ENOENT' ? undefined : null;
    }
    return this.watching !== undefined && this.watching !== null;
  }

  /**
   * Stop watching the store's dirs, and forget the images resolved (those watches kept them
   * current). The store stays usable: the next resolve watches again.
   */
  async close(): Promise<void> {
    for (const w of this.watching ?? []) w.close();
    this.watching = undefined;
    this.forget();
  }

  /** Every ref in the store with its digest and size. */
  list(): ImageSummary[] {
    const out: ImageSummary[] = [];
    for (const f of readdirOr(join(this.root, 'refs'))) {
      if (!f.endsWith('.json')) continue;
      const r = RefRecord.safeParse(readJson(join(this.root, 'refs', f)));
      if (!r.success) continue;
      let diffIds: string[] = [];
      try {
        diffIds = this.stored(r.data.digest, r.data.ref)?.diffIds ?? [];
      } catch {
        diffIds = [];
      }
      const sizeBytes = diffIds.reduce((n, d) => n + (this.layerRecord(d)?.sizeBytes ?? 0), 0);
      out.push({ ...r.data, layers: diffIds.length, sizeBytes });
    }
    return out.sort((a, b) => a.ref.localeCompare(b.ref));
  }

  /** Removes the ref `text` (IMAGE_NOT_FOUND if absent), then collects what no ref needs. */
  async remove(text: string): Promise<{ ref: string; removedLayers: string[]; keptInUse: string[] }> {
    const { name } = this.parsedName(text);
    const file = this.refFile(name);
    if (!this.readRef(name))
      throw new AirlockError('IMAGE_NOT_FOUND', `no image ${name} in the store (see airlock image ls)`, {
        field: 'image',
      });
    return withFileLock(join(this.root, '.lock'), 'exclusive', async () => {
      rmSync(file, { force: true });
      return { ref: name, ...this.collect() };
    });
  }

  /** Deletes layers and blobs that no ref needs and no live sandbox uses, and dead pulls' temp dirs. */
  async prune(): Promise<{ removedLayers: string[]; keptInUse: string[] }> {
    this.ensure();
    return withFileLock(join(this.root, '.lock'), 'exclusive', async () => this.collect());
  }

  /** Under the exclusive lock: no pull is between unpacking a layer and recording its ref. */
  private collect(): { removedLayers: string[]; keptInUse: string[] } {
    const needLayers = new Set<string>();
    const needBlobs = new Set<string>();
    for (const img of this.list()) {
      needBlobs.add(img.digest);
      const top = this.readBlob(img.digest);
      const s = this.stored(img.digest, img.ref);
      if (!top || !s) continue;
      const doc = parseManifestDoc(top, undefined, img.ref);
      if (doc.kind === 'index') needBlobs.add(pickPlatform(doc.manifests, img.ref).digest);
      needBlobs.add(s.manifest.config.digest);
      for (const d of s.diffIds) needLayers.add(d);
    }
    const removedLayers: string[] = [];
    const keptInUse: string[] = [];
    const layers = join(this.root, 'layers');
    for (const n of readdirOr(layers)) {
      const path = join(layers, n);
      const tmp = /^\.tmp-(\d+)-/.exec(n);
      if (tmp && !pidAlive(Number(tmp[1]))) rmSync(path, { recursive: true, force: true });
      if (!SHA256_DIGEST.test(n) || needLayers.has(n)) continue;
      // Rename away first, then ask: a sandbox that starts using the layer meanwhile finds it gone
      // (and fails) rather than having it deleted from under it.
      const trash = join(layers, `.trash-${randomBytes(6).toString('hex')}`);
      renameSync(path, trash);
      if (this.opts.inUse?.(join(path, 'fs'))) {
        renameSync(trash, path);
        keptInUse.push(n);
        continue;
      }
      rmSync(trash, { recursive: true, force: true });
      removedLayers.push(n);
    }
    for (const n of readdirOr(this.root)) {
      const load = /^\.load-(\d+)-/.exec(n);
      if (load && !pidAlive(Number(load[1]))) rmSync(join(this.root, n), { recursive: true, force: true });
    }
    for (const n of readdirOr(join(this.root, 'blobs'))) {
      if (!needBlobs.has(n)) rmSync(join(this.root, 'blobs', n), { force: true });
    }
    return { removedLayers, keptInUse };
  }
}

/** Verified blobs a store keeps in memory (see ImageStore.verified). */
const MAX_VERIFIED_BLOBS = 256;

/**
 * What a held ref file's entry is checked against: still linked (not renamed over, not removed), and
 * its size and ctime (not written in place). undefined once unlinked. One fstat, no bigint.
 */
function heldId(fd: number): string | undefined {
  const st = fstatSync(fd);
  return st.nlink > 0 ? `${st.size}:${st.ctimeMs}` : undefined;
}

/** `file` opened for reading, or undefined when it is absent (or cannot be opened). */
function openOr(file: string): number | undefined {
  try {
    return openSync(file, 'r');
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

function pidAlive(pid: number): boolean {
  if (pid === process.pid) return true;
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === 'EPERM';
  }
}
