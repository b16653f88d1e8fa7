// Response body decoding before the credential scrubber (src/egress/content-coding.ts): the codings
// Airlock can undo are undone (also stacked, also as a transfer coding), an empty body is fine, and any
// other coding is refused, never passed on unread.
import { Readable } from 'node:stream';
import { brotliCompressSync, deflateSync, gzipSync } from 'node:zlib';
import { describe, expect, it } from 'vitest';
import { responseBodyDecoding } from '../../src/egress/content-coding.js';

async function decode(body: Buffer, ce?: string, te?: string): Promise<string> {
  const d = responseBodyDecoding(ce, te);
  if (!d.ok) throw new Error(`refused ${d.coding}`);
  let s: NodeJS.ReadableStream = Readable.from([body]);
  for (const x of d.decoders) s = s.pipe(x);
  const parts: Buffer[] = [];
  for await (const c of s as AsyncIterable<Buffer>) parts.push(c);
  return Buffer.concat(parts).toString('utf8');
}

describe('responseBodyDecoding', () => {
  const text = 'reflected: Bearer real-value '.repeat(20);
  it('undoes gzip, x-gzip, deflate, br, identity, in any case', async () => {
    expect(await decode(gzipSync(text), 'gzip')).toBe(text);
    expect(await decode(gzipSync(text), 'X-GZIP')).toBe(text);
    expect(await decode(deflateSync(text), 'deflate')).toBe(text);
    expect(await decode(brotliCompressSync(text), 'br')).toBe(text);
    expect(await decode(Buffer.from(text), 'identity')).toBe(text);
  });

  it('undoes stacked codings in reverse order, and transfer codings before content codings', async () => {
    expect(await decode(brotliCompressSync(gzipSync(text)), 'gzip, br')).toBe(text);
    expect(await decode(gzipSync(deflateSync(text)), 'deflate', 'gzip, chunked')).toBe(text);
  });

  it('an empty body decodes to nothing, not an error', async () => {
    for (const c of ['gzip', 'deflate', 'br']) expect(await decode(Buffer.alloc(0), c)).toBe('');
  });

  it('refuses any other coding, also behind a known one', () => {
    for (const [ce, te, coding] of [
      ['zstd', undefined, 'zstd'],
      ['compress', undefined, 'compress'],
      ['gzip, x-custom', undefined, 'x-custom'],
      [undefined, 'base64, chunked', 'base64'],
    ] as const) {
      expect(responseBodyDecoding(ce, te)).toEqual({ ok: false, coding });
    }
  });
});
