// Streaming checks for blobs: a pass-through that hashes and counts what flows and stops at a byte
// cap, and the layer decompressors (gzip from node:zlib, zstd from fzstd, or none), told apart by
// the stream's first bytes. Nothing here keeps data: callers decide what to do on success.
import { createHash } from 'node:crypto';
import { Transform, type TransformCallback } from 'node:stream';
import { createGunzip } from 'node:zlib';
import { Decompress as ZstdDecompress } from 'fzstd';
import { AirlockError } from '../core/errors.js';

/** Hashes (sha256) and counts bytes; fails with `onOver()` once more than `maxBytes` pass. */
export class Meter extends Transform {
  private readonly hash = createHash('sha256');
  bytes = 0;

  constructor(
    private readonly maxBytes: number,
    private readonly onOver: () => AirlockError,
    private readonly onBytes?: (n: number) => void,
    /** A budget shared with other meters (concurrent layers of one image): each byte takes from it. */
    private readonly shared?: { left: number },
  ) {
    super();
  }

  override _transform(chunk: Buffer, _enc: BufferEncoding, cb: TransformCallback): void {
    this.bytes += chunk.length;
    if (this.shared) this.shared.left -= chunk.length;
    if (this.bytes > this.maxBytes || (this.shared && this.shared.left < 0)) return cb(this.onOver());
    this.hash.update(chunk);
    this.onBytes?.(chunk.length);
    cb(null, chunk);
  }

  /** `sha256:<hex>` of everything that passed (call once, after the end). */
  digest(): string {
    return `sha256:${this.hash.digest('hex')}`;
  }
}

/** zstd (fzstd's streaming decoder) as a Transform. */
class Unzstd extends Transform {
  private out = 0;
  private readonly d = new ZstdDecompress((chunk) => {
    this.out += chunk.length;
    this.push(Buffer.from(chunk.buffer, chunk.byteOffset, chunk.length));
  });

  constructor(
    private readonly maxOutBytes: number,
    private readonly onOver: () => AirlockError,
  ) {
    super();
  }

  override _transform(chunk: Buffer, _enc: BufferEncoding, cb: TransformCallback): void {
    try {
      // Small pieces, so the output cap is checked before a bomb can grow far in memory.
      for (let off = 0; off < chunk.length; off += 4096) {
        this.d.push(chunk.subarray(off, off + 4096));
        if (this.out > this.maxOutBytes) return cb(this.onOver());
      }
      cb();
    } catch (e) {
      cb(new AirlockError('IMAGE_LAYER_UNSAFE', `layer is not valid zstd: ${(e as Error).message}`));
    }
  }

  override _flush(cb: TransformCallback): void {
    try {
      this.d.push(new Uint8Array(0), true);
      cb();
    } catch (e) {
      cb(new AirlockError('IMAGE_LAYER_UNSAFE', `layer is not valid zstd: ${(e as Error).message}`));
    }
  }
}

export type Compression = 'gzip' | 'zstd' | 'none';

/** The size of gunzip's output chunks (see decompressor). */
const GUNZIP_CHUNK_BYTES = 128 * 1024;

/** The compression a layer media type names. */
export function compressionOf(mediaType: string): Compression {
  if (mediaType.endsWith('+gzip') || mediaType.endsWith('.tar.gzip')) return 'gzip';
  if (mediaType.endsWith('+zstd')) return 'zstd';
  return 'none';
}

/** The compression of a stream that starts with `head` (for tarballs, which name none). */
export function sniffCompression(head: Buffer): Compression {
  if (head[0] === 0x1f && head[1] === 0x8b) return 'gzip';
  if (head[0] === 0x28 && head[1] === 0xb5 && head[2] === 0x2f && head[3] === 0xfd) return 'zstd';
  return 'none';
}

/**
 * The decompressor for `c`. `maxOutBytes` caps zstd's output as it is produced (fzstd ignores
 * back-pressure, so a small frame could otherwise expand in memory before the meter downstream
 * sees it); gzip respects back-pressure and the downstream meter caps it.
 */
export function decompressor(c: Compression, maxOutBytes: number, onOver: () => AirlockError): Transform {
  if (c === 'gzip') {
    // Output in 128 KiB chunks, not zlib's default 16 KiB: each chunk is a write (and a trip
    // through tar-stream and the meter) in the unpack; measured, a 48 MiB image pulled in 0.47 s
    // instead of 0.75 s (median of 5 each, interleaved).
    return createGunzip({ chunkSize: GUNZIP_CHUNK_BYTES });
  }
  if (c === 'zstd') return new Unzstd(maxOutBytes, onOver);
  return new Transform({ transform: (chunk, _e, cb) => cb(null, chunk) });
}
