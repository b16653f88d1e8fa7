// Downloading one layer: the blob is hashed as it streams (every byte, even after the unpack side
// failed, so a tampered blob is reported as a digest mismatch), decompressed, hashed again (the
// config's diff_id), capped by the image's shared unpacked-size budget, and unpacked into a fresh
// temp dir that is renamed into place only when both digests match. On any failure the temp dir is
// removed: nothing half-unpacked is ever left in the store.
import { createHash, randomBytes } from 'node:crypto';
import { mkdirSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Readable, Writable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { AirlockError } from '../core/errors.js';
import type { PullPolicy } from '../core/image.js';
import type { Descriptor } from './manifest.js';
import { Meter, compressionOf, decompressor, type Compression } from './stream.js';
import { unpackLayer } from './unpack.privileged.js';

export type PullEvent =
  | {
      readonly kind: 'resolved';
      readonly ref: string;
      readonly digest: string;
      readonly layers: number;
      readonly bytes: number;
    }
  | {
      readonly kind: 'layer';
      readonly index: number;
      readonly digest: string;
      readonly size: number;
      readonly cached: boolean;
    }
  | { readonly kind: 'bytes'; readonly index: number; readonly bytes: number }
  | { readonly kind: 'layer-done'; readonly index: number; readonly digest: string };

export interface PullOptions {
  readonly pull?: PullPolicy;
  readonly signal?: AbortSignal;
  readonly onProgress?: (e: PullEvent) => void;
}

/** Where an image's blobs come from: a registry repository, an OCI layout dir, a docker tarball. */
export interface BlobSource {
  readonly describe: string;
  manifest(
    reference: string,
    signal?: AbortSignal,
  ): Promise<{ bytes: Buffer; contentType?: string | undefined; claimedDigest?: string | undefined }>;
  blob(digest: string, size: number, signal?: AbortSignal): Promise<Readable>;
}

export function mismatch(what: string, want: string, got: string): AirlockError {
  return new AirlockError(
    'IMAGE_DIGEST_MISMATCH',
    `${what}: expected ${want}, got ${got}; nothing was kept (the source serves corrupt or tampered data)`,
  );
}

/** Resolves when `s` can take more, or is gone (an error destroys it: the caller checks). */
function drained(s: Writable): Promise<void> {
  return new Promise((res) => {
    const done = (): void => {
      s.off('drain', done);
      s.off('close', done);
      res();
    };
    s.on('drain', done);
    s.on('close', done);
  });
}

export interface LayerJob {
  readonly name: string;
  readonly index: number;
  readonly d: Descriptor;
  readonly diffId: string;
  readonly source: BlobSource;
  /** Unpacked bytes the image may still use (shared by its layers, taken from as bytes flow). */
  readonly budget: { left: number };
  readonly o: PullOptions;
}

/** Fetches, verifies and unpacks one layer into `layersDir/<diffId>/fs` (with its layer.json). */
export async function fetchLayer(
  job: LayerJob,
  layersDir: string,
  tooLarge: (what: string) => AirlockError,
): Promise<void> {
  const { name, index, d, diffId, source, budget, o } = job;
  const tmp = join(layersDir, `.tmp-${process.pid}-${randomBytes(6).toString('hex')}`);
  mkdirSync(join(tmp, 'fs'), { recursive: true, mode: 0o700 });
  try {
    const blob = await source.blob(d.digest, d.size, o.signal);
    const over = (): AirlockError => tooLarge(`layer ${d.digest} unpacks past the cap`);
    const compression: Compression = compressionOf(d.mediaType);
    const stream: Readable = blob;
    const dec = decompressor(compression, budget.left, over);
    const tar = new Meter(Number.MAX_SAFE_INTEGER, over, undefined, budget);
    let sinkError: unknown;
    const piped = pipeline(dec, tar).catch((e: unknown) => void (sinkError ??= e));
    const unpacked = unpackLayer(tar, join(tmp, 'fs'), o.signal);
    unpacked.catch(() => undefined); // judged below, after the digest
    // Every byte of the blob is hashed, even after the unpack side failed: a blob that is not what
    // its digest says is reported as that, whatever else went wrong with it.
    const hash = createHash('sha256');
    let bytes = 0;
    for await (const chunk of stream as AsyncIterable<Buffer>) {
      bytes += chunk.length;
      if (bytes > d.size) {
        stream.destroy();
        break;
      }
      hash.update(chunk);
      o.onProgress?.({ kind: 'bytes', index, bytes: chunk.length });
      if (sinkError === undefined && !dec.destroyed && !dec.write(chunk)) await drained(dec);
    }
    if (!dec.destroyed) dec.end();
    const got = `sha256:${hash.digest('hex')}`;
    if (got !== d.digest || bytes !== d.size) {
      dec.destroy(new Error('blob digest mismatch'));
      tar.destroy(new Error('blob digest mismatch'));
      await Promise.allSettled([piped, unpacked]);
      throw mismatch(
        `layer ${d.digest} of ${name}`,
        `${d.digest} (${d.size} bytes)`,
        bytes > d.size ? 'more bytes' : got,
      );
    }
    await piped;
    const settled = await Promise.allSettled([unpacked]);
    const unpackError = settled[0].status === 'rejected' ? (settled[0].reason as unknown) : undefined;
    for (const e of [unpackError, sinkError]) if (AirlockError.isInstance(e)) throw e;
    if (sinkError !== undefined || unpackError !== undefined) {
      const e = (sinkError ?? unpackError) as Error;
      const what = compression === 'none' ? 'tar' : `${compression} tar`;
      throw new AirlockError('IMAGE_LAYER_UNSAFE', `layer is not a readable ${what}: ${e.message}`);
    }
    const diff = tar.digest();
    if (diff !== diffId)
      throw mismatch(`uncompressed layer ${index} of ${name} (config diff_id)`, diffId, diff);
    const r = (settled[0] as PromiseFulfilledResult<{ entries: number; sizeBytes: number }>).value;
    writeFileSync(
      join(tmp, 'layer.json'),
      JSON.stringify({
        diffId,
        sizeBytes: r.sizeBytes,
        entries: r.entries,
        unpackedAt: new Date().toISOString(),
      }),
    );
    try {
      renameSync(tmp, join(layersDir, diffId));
    } catch (e) {
      // Another pull put the same layer in place first: its copy is as good as ours.
      if (!['ENOTEMPTY', 'EEXIST'].includes((e as NodeJS.ErrnoException).code ?? '')) throw e;
      rmSync(tmp, { recursive: true, force: true });
    }
  } catch (e) {
    rmSync(tmp, { recursive: true, force: true });
    if (AirlockError.is(e, 'IMAGE_LAYER_UNSAFE')) {
      throw new AirlockError(
        'IMAGE_LAYER_UNSAFE',
        `image ${name}, layer ${d.digest}: ${e.message}; nothing was kept`,
      );
    }
    throw e;
  }
}
