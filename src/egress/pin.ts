// SECURITY-CRITICAL: parses bytes from inside the sandbox
//
// Request target and Host pinning (issue 30, class 3). Once a connection has been decided for one
// host and port (a CONNECT or SOCKS5 target, an intercepted TLS connection's name, a transparent
// connection's DNS name or Host), every HTTP request on it must mean that host: a shared front end
// routes by the request target and Host, so a request naming another (policy-denied) virtual host
// behind the allowed address must never reach the upstream. Two pure pieces:
//   - pinRequest(): the request-target (origin-, absolute- or asterisk-form) and the Host header(s)
//     of one request, checked against the decided host:port. Absolute-form is rewritten to origin-form
//     (RFC 9112 §3.2.2: an origin server would prefer the URL's authority over Host); userinfo, another
//     host or port, two Host headers, or a Host that is not a host[:port] is refused with a reason.
//   - classifyFirstBytes(): what a tunnelled or intercepted connection carries, from the client's first
//     bytes: TLS (a handshake record), HTTP (anything an HTTP server could read as a request line), or
//     something else. In doubt it says HTTP: that path is strict (Node's parser, then pinRequest), the
//     other one is a raw relay.
import { canonicalHost, parsePort } from '../core/address.js';

/** The host and port a connection was decided (vetted) for. `host` is canonical (canonicalHost). */
export interface PinnedTarget {
  readonly host: string;
  readonly port: number;
  /** The scheme of the connection's requests: https inside intercepted TLS, http otherwise. */
  readonly scheme: 'http' | 'https';
}

export type PinResult = { ok: true; path: string } | { ok: false; reason: string };

/** A request as Node's server parsed it (rawHeaders keeps duplicates, unlike `headers`). */
export interface PinRequest {
  readonly url: string;
  readonly rawHeaders: readonly string[];
}

const DEFAULT_PORTS: Readonly<Record<string, number>> = { http: 80, https: 443 };

/**
 * Check one request against the host:port its connection was decided for; on success, the
 * origin-form path to send upstream (Host is then set by the caller to the pinned host).
 */
export function pinRequest(req: PinRequest, t: PinnedTarget): PinResult {
  const refuse = (why: string): PinResult => ({
    ok: false,
    reason: `blocked by Airlock egress policy: ${why}; this connection may only carry requests for ${formatAuthority(t.host, t.port)}`,
  });
  const hosts: string[] = [];
  for (let i = 0; i + 1 < req.rawHeaders.length; i += 2)
    if (req.rawHeaders[i]!.toLowerCase() === 'host') hosts.push(req.rawHeaders[i + 1]!);
  if (hosts.length > 1) return refuse('the request has more than one Host header');
  const hostHeader = hosts[0]?.trim();
  if (hostHeader) {
    const a = parseAuthority(hostHeader);
    if (!a) return refuse(`the Host header ${JSON.stringify(hostHeader.slice(0, 100))} is not host[:port]`);
    // A Host without a port means the scheme's default; a client on another port always writes it.
    const port = a.port ?? DEFAULT_PORTS[t.scheme]!;
    if (!sameHost(a.host, t.host) || (a.port !== undefined && port !== t.port))
      return refuse(`the Host header names ${JSON.stringify(hostHeader.slice(0, 100))}`);
  }

  const url = req.url;
  if (url === '*' || (url.startsWith('/') && !url.startsWith('//'))) return { ok: true, path: url };
  if (url.startsWith('//')) return refuse('the request target starts with "//" (a scheme-relative URL)');
  const m = /^([A-Za-z][A-Za-z0-9+.-]*):\/\/([^/?#]*)([/?#].*)?$/.exec(url);
  if (!m) return refuse('the request target is neither a path nor an http(s) URL');
  const [, scheme, authority, rest = ''] = m as unknown as [string, string, string, string | undefined];
  const defaultPort = DEFAULT_PORTS[scheme.toLowerCase()];
  if (defaultPort === undefined) return refuse(`the request target has the scheme ${scheme}`);
  if (authority.includes('@')) return refuse('the request target carries userinfo (user@host)');
  const a = parseAuthority(authority);
  if (!a)
    return refuse(
      `the request target's authority ${JSON.stringify(authority.slice(0, 100))} is not host[:port]`,
    );
  if (!sameHost(a.host, t.host) || (a.port ?? defaultPort) !== t.port)
    return refuse(`the request target names ${JSON.stringify(authority.slice(0, 100))}`);
  const hash = rest.indexOf('#');
  const path = hash >= 0 ? rest.slice(0, hash) : rest;
  return { ok: true, path: path === '' ? '/' : path.startsWith('?') ? `/${path}` : path };
}

/** `host`, `host:port`, `[v6]` or `[v6]:port`; undefined for userinfo, empty parts, bare IPv6. */
export function parseAuthority(s: string): { host: string; port?: number } | undefined {
  if (s === '' || s.includes('@')) return undefined;
  let host: string;
  let portText: string | undefined;
  if (s.startsWith('[')) {
    const close = s.indexOf(']');
    if (close < 0) return undefined;
    host = s.slice(0, close + 1);
    const rest = s.slice(close + 1);
    if (rest !== '') {
      if (!rest.startsWith(':')) return undefined;
      portText = rest.slice(1);
    }
  } else {
    const parts = s.split(':');
    if (parts.length > 2) return undefined;
    [host, portText] = parts as [string, string | undefined];
  }
  if (canonicalHost(host).kind === 'invalid') return undefined;
  if (portText === undefined) return { host };
  const port = parsePort(portText);
  return port === undefined ? undefined : { host, port };
}

/** Both spellings canonicalise to the same name or address (case, trailing dot, IPv6 forms). */
export function sameHost(a: string, b: string): boolean {
  const key = (h: string): string | undefined => {
    const c = canonicalHost(h);
    return c.kind === 'ip' ? `ip:${c.address}` : c.kind === 'name' ? `name:${c.name}` : undefined;
  };
  const ka = key(a);
  return ka !== undefined && ka === key(b);
}

function formatAuthority(host: string, port: number): string {
  return `${host.includes(':') ? `[${host}]` : host}:${port}`;
}

// ---- what a connection carries -----------------------------------------------------------------------

export type FirstBytesKind = 'tls' | 'http' | 'other' | 'incomplete';

/** More than this without a line end: decided on what has arrived. */
export const MAX_SNIFF_BYTES = 16 * 1024;
const TCHAR = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]$/;
/** Bytes no request line contains (controls but HTAB and CR); HTTP servers refuse such a line. */
// eslint-disable-next-line no-control-regex
const NOT_IN_REQUEST_LINE = /[\x00-\x08\x0a-\x0c\x0e-\x1f\x7f]/;

/**
 * What the client's first bytes on a connection are. `final`: no more bytes will be waited for (a
 * deadline passed or the client stopped sending): then a prefix that could still become an HTTP
 * request line counts as HTTP, never as "other" (waiting out a deadline must not buy a raw relay).
 *   - 'tls': a TLS handshake record (0x16).
 *   - 'http': a request line that an HTTP server could act on: a token, whitespace, and then a
 *     version ("HTTP/"), a path, "*" or a URL. Empty lines before it are skipped, as servers do.
 *   - 'other': not HTTP for any server (binary protocols, banners such as "SSH-2.0-x y").
 *   - 'incomplete': not decidable yet (no line end), and not `final`.
 */
export function classifyFirstBytes(buf: Buffer, final = false): FirstBytesKind {
  if (buf.length > 0 && buf[0] === 0x16) return 'tls';
  let start = 0;
  while (start < buf.length && (buf[start] === 0x0d || buf[start] === 0x0a)) start++;
  if (start === buf.length) return final ? 'http' : 'incomplete';
  if (!TCHAR.test(String.fromCharCode(buf[start]!))) return 'other';
  const lf = buf.indexOf(0x0a, start);
  const decided = lf >= 0 || final || buf.length - start >= MAX_SNIFF_BYTES;
  const line = buf.toString('latin1', start, lf >= 0 ? lf : Math.min(buf.length, start + MAX_SNIFF_BYTES));
  if (NOT_IN_REQUEST_LINE.test(line)) return 'other';
  if (!decided) return 'incomplete';
  if (lf < 0) return 'http'; // a token that never ended its line: still an HTTP request line to a server
  const m = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+[ \t]+([^ \t\r]*)/.exec(line.replace(/\r$/, ''));
  if (!m) return 'other';
  const target = m[1]!;
  const looksHttp =
    /http\//i.test(line) || target.startsWith('/') || target === '*' || target.includes('://');
  return looksHttp ? 'http' : 'other';
}
