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
import { canonicalHost, parsePort } from './address.js';

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
