// SECURITY-CRITICAL: the response body of a host with a bound secret is scrubbed of real values
// (secrets/scrub.ts), which only works on bytes the scrubber can read. A compressed body would carry a
// reflected value past it, so the codings Airlock can undo (gzip, deflate, br) are decoded here first,
// and a body in any other coding is refused with a reason, never passed on unread.
import type { Transform } from 'node:stream';
import { constants, createBrotliDecompress, createGunzip, createUnzip } from 'node:zlib';

// An empty or cut-short body decodes to what it holds (a decoder would otherwise fail it as truncated);
// bytes that are not in the coding still fail, and the gateway then cuts the response.
const ZLIB = { finishFlush: constants.Z_SYNC_FLUSH };
const BROTLI = { finishFlush: constants.BROTLI_OPERATION_FLUSH };

export type BodyDecoding =
  { readonly ok: true; readonly decoders: Transform[] } | { readonly ok: false; readonly coding: string };

/** Codings split from a Content-Encoding / Transfer-Encoding value, in the order they were applied. */
function codings(value: string | string[] | undefined): string[] {
  const v = Array.isArray(value) ? value.join(',') : (value ?? '');
  return v
    .split(',')
    .map((c) => c.trim().toLowerCase())
    .filter((c) => c !== '' && c !== 'identity');
}

/**
 * Decoders, in the order to pipe the body through, for a response with these headers. Transfer codings
 * other than chunked (which Node's parser removes) were applied last, so they are undone first.
 */
export function responseBodyDecoding(
  contentEncoding: string | string[] | undefined,
  transferEncoding: string | string[] | undefined,
): BodyDecoding {
  const applied = [...codings(contentEncoding), ...codings(transferEncoding).filter((c) => c !== 'chunked')];
  const decoders: Transform[] = [];
  for (const c of applied.reverse()) {
    if (c === 'gzip' || c === 'x-gzip') decoders.push(createGunzip(ZLIB));
    // "deflate" is zlib-wrapped by the standard; createUnzip also takes gzip. Raw deflate fails (closed).
    else if (c === 'deflate') decoders.push(createUnzip(ZLIB));
    else if (c === 'br') decoders.push(createBrotliDecompress(BROTLI));
    else {
      for (const d of decoders) d.destroy();
      return { ok: false, coding: c };
    }
  }
  return { ok: true, decoders };
}
