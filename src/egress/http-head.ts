// SECURITY-CRITICAL: parses bytes from an upstream the sandbox chose
//
// HTTP/1.x response-head reader and chunked-body decoder for plain-HTTP forwarding (plain-http.ts,
// and the answer to a pinned Upgrade request). What the proxy frames a body by is what it passes on,
// so any head two parsers could read differently is rejected rather than interpreted (response
// splitting / smuggling, RFC 9112 §11.2):
//   - never throws; every input gives 'incomplete', 'invalid' (with a reason) or a response;
//   - looks at no more than `maxBytes` bytes, and says 'invalid' once that many arrived without an end;
//   - rejects NUL, bare CR, obs-fold (continuation lines), whitespace before ":", non-token header
//     names, control characters in values, Content-Length with Transfer-Encoding, two Content-Length
//     or Transfer-Encoding headers, a Content-Length that is not plain digits, and a
//     Transfer-Encoding whose last coding is not chunked;
//   - accepts LF-only line ends (as Node, curl and nginx do).
// Request heads are parsed by Node's own (strict) HTTP parser, every request of a connection, and
// pinned to the decided host by pin.ts; a second request parser of our own was removed (it never ran).
// Header bytes are decoded as latin1, so every byte maps to one character and nothing is lost or merged.

export const MAX_HEAD_BYTES = 16 * 1024;

export type HttpBody =
  | { kind: 'none' }
  | { kind: 'length'; bytes: number }
  /** Transfer-Encoding whose final coding is chunked. */
  | { kind: 'chunked' };

const TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;
/** Field value characters: HTAB, SP, VCHAR, obs-text. Everything else (controls, DEL) is rejected. */
const FIELD_VALUE = /^[\t\x20-\x7e\x80-\xff]*$/;

const LF = 0x0a;
const CR = 0x0d;

function parseHeaderLine(line: string): { field: [string, string] } | { reason: string } {
  if (line.startsWith(' ') || line.startsWith('\t')) {
    return { reason: 'obsolete line folding (a header line starting with whitespace)' };
  }
  const colon = line.indexOf(':');
  if (colon < 0) return { reason: 'header line without ":"' };
  const name = line.slice(0, colon);
  if (!TOKEN.test(name)) {
    return { reason: 'malformed header name (whitespace before ":" or a character that is not allowed)' };
  }
  const value = trimOws(line.slice(colon + 1));
  if (!FIELD_VALUE.test(value)) return { reason: `header ${name} contains a control character` };
  return { field: [name, value] };
}

/** Strip spaces and tabs only (String.prototype.trim would also eat \v, \f and latin1 NBSP). */
function trimOws(s: string): string {
  let start = 0;
  let end = s.length;
  while (start < end && (s[start] === ' ' || s[start] === '\t')) start++;
  while (end > start && (s[end - 1] === ' ' || s[end - 1] === '\t')) end--;
  return s.slice(start, end);
}

// ---- responses (from the upstream of a forwarded plain-HTTP request) ------------------------------

/** Header lines per response (Set-Cookie lists can be long); more is treated as a broken upstream. */
export const MAX_RESPONSE_HEADER_COUNT = 256;

export interface HttpResponseHead {
  kind: 'response';
  version: 'HTTP/1.0' | 'HTTP/1.1';
  status: number;
  reason: string;
  /** In order, names as sent (case preserved), values without surrounding spaces/tabs. */
  headers: Array<[name: string, value: string]>;
  /** Offset in the buffer of the first byte after the head. */
  headEnd: number;
  /**
   * How the body is framed (RFC 9112 §6.3), once the request method is known: 'none' for a HEAD
   * request and for 1xx/204/304; 'close' when neither Content-Length nor Transfer-Encoding is sent
   * (the body ends when the upstream closes).
   */
  body: HttpBody | { kind: 'close' };
}

export type ResponseHeadResult =
  { kind: 'incomplete' } | { kind: 'invalid'; reason: string } | HttpResponseHead;

const STATUS_LINE = /^HTTP\/1\.([01]) ([1-9][0-9]{2})(?: ([\t\x20-\x7e\x80-\xff]*))?$/;

/**
 * Parse the response head at the start of `buf`, for a request with method `method`. What the proxy frames the body by is what it passes on, so a head two parsers
 * could read differently (Content-Length with Transfer-Encoding, two lengths, obs-fold, bare CR, a
 * Transfer-Encoding not ending in chunked) is 'invalid' and the request fails with 502.
 */
export function parseResponseHead(
  buf: Buffer,
  method: string,
  maxBytes: number = MAX_HEAD_BYTES,
): ResponseHeadResult {
  const limit = Math.min(buf.length, Math.max(0, maxBytes));
  // (NUL is looked for line by line: the bytes after the head are the body, where NUL is fine.)
  let line0: { version: 'HTTP/1.0' | 'HTTP/1.1'; status: number; reason: string } | undefined;
  const headers: Array<[string, string]> = [];
  let pos = 0;
  for (;;) {
    const lf = buf.indexOf(LF, pos);
    if (lf < 0 || lf >= limit) break;
    const end = lf > pos && buf[lf - 1] === CR ? lf - 1 : lf;
    const line = buf.toString('latin1', pos, end);
    pos = lf + 1;
    if (line.includes('\r')) return { kind: 'invalid', reason: 'bare CR in the response head' };
    if (line.includes('\0')) return { kind: 'invalid', reason: 'NUL byte in the response head' };
    if (line0 === undefined) {
      const m = STATUS_LINE.exec(line);
      if (!m) return { kind: 'invalid', reason: 'malformed status line' };
      line0 = { version: m[1] === '1' ? 'HTTP/1.1' : 'HTTP/1.0', status: Number(m[2]), reason: m[3] ?? '' };
      continue;
    }
    if (line === '') return finishResponse(line0, headers, pos, method);
    if (headers.length >= MAX_RESPONSE_HEADER_COUNT) {
      return { kind: 'invalid', reason: `more than ${MAX_RESPONSE_HEADER_COUNT} header lines` };
    }
    const header = parseHeaderLine(line);
    if ('reason' in header) return { kind: 'invalid', reason: header.reason };
    headers.push(header.field);
  }
  const cr = buf.indexOf(CR, pos);
  if (cr >= 0 && cr + 1 < limit && buf[cr + 1] !== LF) {
    return { kind: 'invalid', reason: 'bare CR in the response head' };
  }
  const nul = buf.indexOf(0, pos);
  if (nul >= 0 && nul < limit) return { kind: 'invalid', reason: 'NUL byte in the response head' };
  if (buf.length >= maxBytes)
    return { kind: 'invalid', reason: `response head is larger than ${maxBytes} bytes` };
  return { kind: 'incomplete' };
}

function finishResponse(
  line: { version: 'HTTP/1.0' | 'HTTP/1.1'; status: number; reason: string },
  headers: Array<[string, string]>,
  headEnd: number,
  method: string,
): ResponseHeadResult {
  const named = (n: string): string[] => headers.filter(([k]) => k.toLowerCase() === n).map(([, v]) => v);
  const lengths = named('content-length');
  const encodings = named('transfer-encoding');
  const bad = (reason: string): ResponseHeadResult => ({ kind: 'invalid', reason });
  if (lengths.length > 1) return bad('more than one Content-Length header');
  if (encodings.length > 1) return bad('more than one Transfer-Encoding header');
  if (lengths.length > 0 && encodings.length > 0) {
    return bad('both Content-Length and Transfer-Encoding (ambiguous body length)');
  }
  const [length] = lengths;
  if (length !== undefined && !/^[0-9]{1,15}$/.test(length))
    return bad('Content-Length is not a decimal number');
  const [encoding] = encodings;
  if (encoding !== undefined) {
    const codings = encoding.split(',').map((c) => trimOws(c).toLowerCase());
    if (codings.some((c) => !TOKEN.test(c)) || codings.indexOf('chunked') !== codings.length - 1) {
      return bad('Transfer-Encoding must end with chunked, exactly once');
    }
  }
  const s = line.status;
  const body: HttpResponseHead['body'] =
    method === 'HEAD' || s < 200 || s === 204 || s === 304
      ? { kind: 'none' }
      : encoding !== undefined
        ? { kind: 'chunked' }
        : length !== undefined
          ? { kind: 'length', bytes: Number(length) }
          : { kind: 'close' };
  return { kind: 'response', ...line, headers, headEnd, body };
}

// ---- chunked bodies ----------------------------------------------------------------------------------

/** A chunk-size line (size, extensions) or a trailer line longer than this is an attack, not framing. */
const MAX_CHUNK_LINE_BYTES = 4096;
const MAX_TRAILER_BYTES = 16 * 1024;

/**
 * Streaming decoder of a chunked body (RFC 9112 §7.1). push() returns the data bytes found in `buf`
 * (slices of it), whether the body ended (last chunk and trailers read; bytes after it are in `rest`),
 * or an error for anything malformed. Trailers are read and dropped. Never throws.
 */
export class ChunkedDecoder {
  private state: 'size' | 'data' | 'data-crlf' | 'trailer' | 'done' = 'size';
  private line = '';
  private left = 0;
  private trailerBytes = 0;

  push(buf: Buffer): { data: Buffer[]; done: boolean; rest?: Buffer } | { error: string } {
    const data: Buffer[] = [];
    let i = 0;
    while (i < buf.length && this.state !== 'done') {
      if (this.state === 'data') {
        const n = Math.min(this.left, buf.length - i);
        data.push(buf.subarray(i, i + n));
        i += n;
        this.left -= n;
        if (this.left === 0) this.state = 'data-crlf';
        continue;
      }
      // A line: size line, the CRLF after data, or a trailer line.
      const lf = buf.indexOf(LF, i);
      const end = lf < 0 ? buf.length : lf;
      this.line += buf.toString('latin1', i, end);
      if (this.line.length > MAX_CHUNK_LINE_BYTES) return { error: 'chunk line too long' };
      if (lf < 0) break;
      i = lf + 1;
      let line = this.line;
      this.line = '';
      if (line.endsWith('\r')) line = line.slice(0, -1);
      if (line.includes('\r')) return { error: 'bare CR in chunk framing' };
      if (this.state === 'data-crlf') {
        if (line !== '') return { error: 'chunk data longer than its size' };
        this.state = 'size';
      } else if (this.state === 'size') {
        const m = /^([0-9A-Fa-f]{1,12})[ \t]*(?:;[\t\x20-\x7e\x80-\xff]*)?$/.exec(line);
        if (!m) return { error: 'malformed chunk size' };
        this.left = parseInt(m[1]!, 16);
        this.state = this.left === 0 ? 'trailer' : 'data';
      } else {
        this.trailerBytes += line.length + 2;
        if (this.trailerBytes > MAX_TRAILER_BYTES) return { error: 'trailers too large' };
        if (line === '') this.state = 'done';
        else if ('reason' in parseHeaderLine(line)) return { error: 'malformed trailer' };
      }
    }
    const done = this.state === 'done';
    return done && i < buf.length ? { data, done, rest: buf.subarray(i) } : { data, done };
  }
}
