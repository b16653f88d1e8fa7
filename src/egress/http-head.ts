// SECURITY-CRITICAL: parses bytes from inside the sandbox
//
// HTTP/1.x request-head reader for the egress proxy (absolute-form requests, CONNECT) and for transparent
// interception of plain HTTP (origin-form + Host). The proxy decides on what this file says the request
// is, and the upstream server acts on the bytes the proxy forwards, so any head two parsers could read
// differently is rejected rather than interpreted (request smuggling, RFC 9112 §11.2):
//   - never throws; every input gives 'incomplete', 'invalid' (with a reason) or a request;
//   - looks at no more than `maxBytes` bytes, and says 'invalid' once that many arrived without an end;
//   - rejects NUL, bare CR, obs-fold (continuation lines), whitespace before ":", non-token header
//     names, control characters in values, two Host headers, Content-Length with Transfer-Encoding,
//     two Content-Length or Transfer-Encoding headers, a Content-Length that is not plain digits, and a
//     Transfer-Encoding whose last coding is not chunked (or any Transfer-Encoding in HTTP/1.0);
//   - accepts LF-only line ends (as Node, curl and nginx do) and skips empty lines before the request line
//     (RFC 9112 §2.2).
// Header bytes are decoded as latin1, so every byte maps to one character and nothing is lost or merged.
import { canonicalHost, parsePort } from '../core/address.js';

export const MAX_HEAD_BYTES = 16 * 1024;
/** Header lines per request; more is treated as an attack, not a request. */
export const MAX_HEADER_COUNT = 100;
const MAX_METHOD_LENGTH = 32;

export type HttpBody =
  | { kind: 'none' }
  | { kind: 'length'; bytes: number }
  /** Transfer-Encoding whose final coding is chunked. */
  | { kind: 'chunked' };

export interface HttpRequestHead {
  kind: 'request';
  method: string;
  target: string;
  version: 'HTTP/1.0' | 'HTTP/1.1';
  /** In order, names as sent (case preserved), values without surrounding spaces/tabs. */
  headers: Array<[name: string, value: string]>;
  /** Offset in the buffer of the first byte after the head (the body or the next request). */
  headEnd: number;
  /** How the body is framed, from the (validated) Content-Length / Transfer-Encoding headers. */
  body: HttpBody;
}

export type RequestHeadResult =
  { kind: 'incomplete' } | { kind: 'invalid'; reason: string } | HttpRequestHead;

const TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;
const REQUEST_LINE = /^([^ ]+) ([^ ]+) ([^ ]+)$/;
/** Visible ASCII: a request-target never contains spaces, controls or raw non-ASCII bytes. */
const TARGET = /^[\x21-\x7e]+$/;
/** Field value characters: HTAB, SP, VCHAR, obs-text. Everything else (controls, DEL) is rejected. */
const FIELD_VALUE = /^[\t\x20-\x7e\x80-\xff]*$/;

const LF = 0x0a;
const CR = 0x0d;

const INCOMPLETE: RequestHeadResult = { kind: 'incomplete' };
const invalid = (reason: string): RequestHeadResult => ({ kind: 'invalid', reason });

/**
 * Parse the request head at the start of `buf`. Call again with more bytes on 'incomplete'; a head
 * that has not ended within `maxBytes` bytes is 'invalid'. A complete line that is malformed makes the
 * result 'invalid' at once, before the rest of the head arrives.
 */
export function parseRequestHead(buf: Buffer, maxBytes: number = MAX_HEAD_BYTES): RequestHeadResult {
  const limit = Math.min(buf.length, Math.max(0, maxBytes));
  const nul = buf.indexOf(0);
  if (nul >= 0 && nul < limit) return invalid('NUL byte in the request head');

  let requestLine: { method: string; target: string; version: 'HTTP/1.0' | 'HTTP/1.1' } | undefined;
  const headers: Array<[string, string]> = [];
  let pos = 0;
  for (;;) {
    const lf = buf.indexOf(LF, pos);
    if (lf < 0 || lf >= limit) break;
    const end = lf > pos && buf[lf - 1] === CR ? lf - 1 : lf;
    const line = buf.toString('latin1', pos, end);
    pos = lf + 1;
    if (line.includes('\r')) return invalid('bare CR in the request head');

    if (requestLine === undefined) {
      if (line === '') continue; // empty lines before the request line are ignored (RFC 9112 §2.2)
      const parsed = parseRequestLine(line);
      if ('reason' in parsed) return invalid(parsed.reason);
      requestLine = parsed;
      continue;
    }
    if (line === '') return finish(requestLine, headers, pos);
    if (headers.length >= MAX_HEADER_COUNT) return invalid(`more than ${MAX_HEADER_COUNT} header lines`);
    const header = parseHeaderLine(line);
    if ('reason' in header) return invalid(header.reason);
    headers.push(header.field);
  }

  // No end yet. A CR inside the unterminated tail must be followed by the LF that ends its line.
  const cr = buf.indexOf(CR, pos);
  if (cr >= 0 && cr + 1 < limit && buf[cr + 1] !== LF) return invalid('bare CR in the request head');
  if (buf.length >= maxBytes) return invalid(`request head is larger than ${maxBytes} bytes`);
  return INCOMPLETE;
}

function parseRequestLine(
  line: string,
): { method: string; target: string; version: 'HTTP/1.0' | 'HTTP/1.1' } | { reason: string } {
  const m = REQUEST_LINE.exec(line);
  if (!m) return { reason: 'malformed request line (expected "METHOD TARGET HTTP/1.x" with single spaces)' };
  const [, method, target, version] = m as unknown as [string, string, string, string];
  if (!TOKEN.test(method) || method.length > MAX_METHOD_LENGTH) return { reason: 'malformed request method' };
  if (!TARGET.test(target)) return { reason: 'request target contains characters that are not allowed' };
  if (version !== 'HTTP/1.1' && version !== 'HTTP/1.0') {
    return { reason: `unsupported protocol version ${JSON.stringify(version.slice(0, 20))}` };
  }
  return { method, target, version };
}

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

function finish(
  line: { method: string; target: string; version: 'HTTP/1.0' | 'HTTP/1.1' },
  headers: Array<[string, string]>,
  headEnd: number,
): RequestHeadResult {
  const named = (n: string): string[] => headers.filter(([k]) => k.toLowerCase() === n).map(([, v]) => v);
  if (named('host').length > 1) return invalid('more than one Host header');

  const lengths = named('content-length');
  const encodings = named('transfer-encoding');
  if (lengths.length > 1) return invalid('more than one Content-Length header');
  if (encodings.length > 1) return invalid('more than one Transfer-Encoding header');
  if (lengths.length > 0 && encodings.length > 0) {
    return invalid('both Content-Length and Transfer-Encoding (ambiguous body length)');
  }

  let body: HttpBody = { kind: 'none' };
  const [length] = lengths;
  if (length !== undefined) {
    if (!/^[0-9]{1,15}$/.test(length)) return invalid('Content-Length is not a decimal number');
    body = { kind: 'length', bytes: Number(length) };
  }
  const [encoding] = encodings;
  if (encoding !== undefined) {
    if (line.version === 'HTTP/1.0') return invalid('Transfer-Encoding in an HTTP/1.0 request');
    const codings = encoding.split(',').map((c) => trimOws(c).toLowerCase());
    if (codings.some((c) => !TOKEN.test(c))) return invalid('malformed Transfer-Encoding');
    if (codings.indexOf('chunked') !== codings.length - 1) {
      return invalid('Transfer-Encoding must end with chunked, exactly once');
    }
    body = { kind: 'chunked' };
  }
  return { kind: 'request', ...line, headers, headEnd, body };
}

// ---- where a request goes -----------------------------------------------------------------------

export interface RequestDestination {
  /** As written (IPv6 without brackets); not canonical yet: pass it to decideHost. */
  host: string;
  /** Absent when the request named no port (origin-form Host without one): the caller knows the default. */
  port?: number;
  /** absolute-form (`GET http://h/x`), authority-form (`CONNECT h:443`), origin-form (`GET /x` + Host). */
  form: 'absolute' | 'authority' | 'origin';
}

/** The value of the first header called `name` (case-insensitive), or undefined. */
export function headerValue(req: Pick<HttpRequestHead, 'headers'>, name: string): string | undefined {
  const wanted = name.toLowerCase();
  return req.headers.find(([k]) => k.toLowerCase() === wanted)?.[1];
}

const DEFAULT_PORTS: Readonly<Record<string, number>> = { http: 80, https: 443 };

/**
 * Where the client asked to go: the CONNECT target, the authority of an absolute-form URL (http or
 * https; its scheme's default port when none is written), or the Host header of an origin-form request.
 * Undefined when that cannot be said without guessing: a malformed authority, userinfo in the URL
 * (`http://a@b/`), a path starting with "//", an unknown scheme, a CONNECT without a port, no Host for
 * origin-form, or an absolute-form URL whose Host header names a different host or port. The last one
 * matters: a shared front end routes by Host, so the proxy must never dial one host and send another's
 * name (a forwarder should still rewrite Host from the URL, as RFC 9112 §3.2.2 asks).
 */
export function hostFromRequest(
  req: Pick<HttpRequestHead, 'method' | 'target' | 'headers'>,
): RequestDestination | undefined {
  const hostHeader = headerValue(req, 'host');
  if (req.method === 'CONNECT') {
    const a = parseAuthority(req.target);
    return a?.port === undefined ? undefined : { host: a.host, port: a.port, form: 'authority' };
  }
  // A target starting with "//" is a valid path, but reads as a scheme-relative URL to a careless server.
  if ((req.target.startsWith('/') && !req.target.startsWith('//')) || req.target === '*') {
    if (hostHeader === undefined) return undefined;
    const a = parseAuthority(hostHeader);
    if (a === undefined) return undefined;
    return a.port === undefined ? { host: a.host, form: 'origin' } : { ...a, form: 'origin' };
  }

  const m = /^([A-Za-z][A-Za-z0-9+.-]*):\/\/([^/?#]*)(?:[/?#].*)?$/.exec(req.target);
  if (!m) return undefined;
  const [, scheme, authority] = m as unknown as [string, string, string];
  const defaultPort = DEFAULT_PORTS[scheme.toLowerCase()];
  if (defaultPort === undefined) return undefined;
  const a = parseAuthority(authority);
  if (a === undefined) return undefined;
  const port = a.port ?? defaultPort;
  if (hostHeader !== undefined) {
    const h = parseAuthority(hostHeader);
    if (h === undefined || sameHost(h.host, a.host) === false || (h.port ?? defaultPort) !== port) {
      return undefined;
    }
  }
  return { host: a.host, port, form: 'absolute' };
}

/** `host`, `host:port`, `[v6]` or `[v6]:port`; no userinfo, no empty port, IPv6 only in brackets. */
function parseAuthority(s: string): { host: string; port?: number } | undefined {
  if (s === '' || s.includes('@')) return undefined;
  let host: string;
  let portText: string | undefined;
  if (s.startsWith('[')) {
    const close = s.indexOf(']');
    if (close < 0) return undefined;
    host = s.slice(1, close);
    const rest = s.slice(close + 1);
    if (rest !== '') {
      if (!rest.startsWith(':')) return undefined;
      portText = rest.slice(1);
    }
    if (!host.includes(':')) return undefined; // brackets are for IPv6 only
  } else {
    const parts = s.split(':');
    if (parts.length > 2) return undefined;
    [host, portText] = parts as [string, string | undefined];
  }
  if (host === '') return undefined;
  if (portText === undefined) return { host };
  const port = parsePort(portText);
  return port === undefined ? undefined : { host, port };
}

function sameHost(a: string, b: string): boolean {
  const key = (h: string): string => {
    const c = canonicalHost(h);
    return c.kind === 'ip' ? `ip:${c.address}` : c.kind === 'name' ? `name:${c.name}` : `raw:${h}`;
  };
  return key(a) === key(b);
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
 * Parse the response head at the start of `buf`, for a request with method `method`. The same strictness
 * as parseRequestHead: what the proxy frames the body by is what it passes on, so a head two parsers
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
