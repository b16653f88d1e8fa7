// SECURITY-CRITICAL: preview URLs (issue 36 part 7). A request whose Host is `<port>-<id>.<domain>`
// (e.g. 8000-sbx-0123456789abcdef.localhost:7000: *.localhost resolves to loopback with no DNS set-up)
// is proxied, HTTP or any upgrade (WebSocket), to 127.0.0.1:<port> inside sandbox <id>'s network
// namespace (SandboxApi.connectPort). Everything else falls through to the API untouched.
//
// Who may: whoever presents the sandbox's traffic token (header X-Airlock-Traffic-Token, or E2B's
// e2b-traffic-access-token), compared in constant time; a browser, with the token once in the
// `airlock_token` query parameter (302 to the URL without it, setting a host-only cookie that holds
// an HMAC of the token bound to the sandbox and port: preview-auth.ts); anyone, when the sandbox was
// created with publicPorts. The check happens BEFORE any connection into the sandbox is made. A
// wrong token for one sandbox is wrong for every other (each has its own random token); an unknown
// id and another tenant's id answer the same 404. The token headers, the parameter and the cookie
// are removed before the request reaches the sandbox (its code never learns its own token, or the
// cookie, from a visitor).
//
// Host parsing is exact: lowercase only, one label `<port>-<id>` then exactly the configured domain,
// an optional :port suffix; port 1-65535 without leading zeros. Anything else (uppercase, extra
// labels, unicode, a trailing dot) is not a preview host and goes to the API, which knows no such
// route.
import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';
import { request as httpRequest, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { Duplex } from 'node:stream';
import { AirlockError } from '../core/errors.js';
import type { Caller, SandboxApi, SandboxView } from './contract.js';
import {
  cookieOriginOk,
  presentedCookies,
  previewCookieValue,
  sameHostLocation,
  setPreviewCookie,
  stripPreviewCookies,
  stripTokenParam,
  TOKEN_PARAM,
} from './preview-auth.js';
import { claimRequests, rejectRaw, sendError, type Claimer } from './upgrade.js';

/** The default preview domain: *.localhost resolves to loopback without any DNS set-up. */
export const DEFAULT_PREVIEW_DOMAIN = 'localhost';
/** Where a visitor presents a sandbox's traffic token (Airlock's own name, and E2B's). */
export const TRAFFIC_TOKEN_HEADERS = ['x-airlock-traffic-token', 'e2b-traffic-access-token'] as const;

/** What a sandbox's views carry about preview access (SandboxView.publicPorts / trafficToken). */
export interface PreviewAccess {
  readonly publicPorts: boolean;
  /** Absent exactly when the ports are public. */
  readonly trafficToken?: string;
}

/** The access of a new sandbox: a fresh random token (256 bits) unless its ports are public. */
export function newPreviewAccess(publicPorts = false): PreviewAccess {
  return publicPorts
    ? { publicPorts: true }
    : { publicPorts: false, trafficToken: randomBytes(32).toString('base64url') };
}

/**
 * Preview access of each live sandbox, kept by the SandboxApi that creates them (LocalSandboxApi in
 * the supervisor: a token lives exactly as long as its sandbox, and a front server restart loses
 * nothing). Keyed by the Sandbox object itself, so nothing outlives it.
 */
export class PreviewAccessTable {
  private readonly access = new WeakMap<object, PreviewAccess>();

  /** Give a new sandbox its access (once; a second call returns the first). */
  issue(sandbox: object, publicPorts?: boolean): PreviewAccess {
    let a = this.access.get(sandbox);
    if (!a) this.access.set(sandbox, (a = newPreviewAccess(publicPorts === true)));
    return a;
  }

  /**
   * The fields its views carry (spread into a SandboxView). A sandbox never issued access (e.g. made
   * through the library directly) gets a private token now: never public by default.
   */
  of(sandbox: object): PreviewAccess {
    return this.issue(sandbox);
  }
}

/** Whether `presented` is `expected`, in time that depends on neither (both are hashed first). */
export function tokenMatches(presented: string | undefined, expected: string | undefined): boolean {
  if (presented === undefined || expected === undefined || expected === '') return false;
  const h = (s: string): Buffer => createHash('sha256').update(s, 'utf8').digest();
  return timingSafeEqual(h(presented), h(expected));
}

/** INVALID_ARGUMENT unless `domain` is a lowercase DNS name (labels of a-z, 0-9 and inner '-'). */
export function checkPreviewDomain(domain: string): string {
  const label = /^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$/;
  if (domain.length > 200 || !domain.split('.').every((l) => label.test(l))) {
    throw new AirlockError(
      'INVALID_ARGUMENT',
      `preview domain "${domain}" must be a lowercase DNS name such as "localhost" or "preview.example.com"`,
      { field: 'previewDomain' },
    );
  }
  return domain;
}

/** The preview host of `port` of sandbox `id` (what sbx.getHost(port) returns). */
export function previewHost(port: number, id: string, domain = DEFAULT_PREVIEW_DOMAIN): string {
  return `${port}-${id}.${domain}`;
}

/** `{ port, id }` when `host` (a Host header) is exactly `<port>-<id>.<domain>[:port]`; else undefined. */
export function parsePreviewHost(
  host: string | undefined,
  domain: string = DEFAULT_PREVIEW_DOMAIN,
): { port: number; id: string } | undefined {
  if (host === undefined || host.length > 300) return undefined;
  const m = /^([1-9][0-9]{0,4})-([a-z0-9](?:[a-z0-9-]{0,56}[a-z0-9])?)\.([a-z0-9.-]+?)(?::[0-9]{1,5})?$/.exec(
    host,
  );
  if (!m || m[3] !== domain) return undefined;
  const port = Number(m[1]);
  if (port > 65535) return undefined;
  return { port, id: m[2]! };
}

export interface PreviewOptions {
  /** Preview hosts are `<port>-<id>.<domain>` (default "localhost"). */
  readonly domain?: string;
  /**
   * Reaches the sandboxes (the supervisor's API, not a tenant's view: a visitor has no API key, the
   * token decides). get() must answer SANDBOX_NOT_FOUND for an id that is not there.
   */
  readonly api: Pick<SandboxApi, 'get' | 'connectPort'>;
  /** Who preview requests act as toward `api`. */
  readonly caller: Caller;
  /** The server has TLS: the preview cookie is then Secure, named with the __Host- prefix. */
  readonly secure?: boolean;
}

/**
 * Serve preview hosts on `server` (the front server's node:http server: one line after it is made).
 * Its other requests (the API) are untouched.
 */
export function attachPreview(server: Server, opts: PreviewOptions): void {
  claimRequests(server, previewClaimer(opts));
}

/** The claimer behind attachPreview (exported for servers that dispatch themselves). */
export function previewClaimer(opts: PreviewOptions): Claimer {
  const domain = checkPreviewDomain(opts.domain ?? DEFAULT_PREVIEW_DOMAIN);
  const target = (req: IncomingMessage): { port: number; id: string } | undefined =>
    parsePreviewHost(req.headers.host, domain);
  return {
    request: (req) => {
      const t = target(req);
      return t && ((r, res) => void proxyRequest(opts, t, r, res));
    },
    upgrade: (req) => {
      const t = target(req);
      return t && ((r, socket, head) => void proxyUpgrade(opts, t, r, socket, head));
    },
  };
}

/** The traffic token the request presents (the first header that has one). */
function presentedToken(req: IncomingMessage): string | undefined {
  for (const h of TRAFFIC_TOKEN_HEADERS) {
    const v = req.headers[h];
    if (typeof v === 'string') return v;
  }
  return undefined;
}

/** What a request presents: the header token, the query-parameter tokens, the preview cookies. */
interface Presented {
  readonly header: string | undefined;
  readonly params: readonly string[];
  readonly cookies: readonly string[];
  /** The request target without the token parameter (what is forwarded). */
  readonly url: string;
}

function presented(req: IncomingMessage): Presented {
  const { url, tokens } = stripTokenParam(req.url ?? '/');
  return {
    header: presentedToken(req),
    params: tokens,
    cookies: cookieOriginOk(req) ? presentedCookies(req) : [],
    url,
  };
}

/** The sandbox's view if `p` may reach port `t.port` of it; a typed error (401/403/404) otherwise. */
async function authorize(
  opts: PreviewOptions,
  t: { port: number; id: string },
  p: Presented,
): Promise<SandboxView> {
  const view: SandboxView = await opts.api.get(t.id, opts.caller);
  if (view.publicPorts) return view;
  const wrong = (how: string): AirlockError =>
    new AirlockError('PERMISSION_DENIED', `that is not sandbox ${t.id}'s traffic token (${how})`);
  if (p.header !== undefined) {
    if (!tokenMatches(p.header, view.trafficToken)) throw wrong('header');
    return view;
  }
  if (p.params.length > 0) {
    if (!p.params.every((v) => tokenMatches(v, view.trafficToken))) throw wrong(`${TOKEN_PARAM} parameter`);
    return view;
  }
  if (p.cookies.length > 0 && view.trafficToken !== undefined) {
    const want = previewCookieValue(view.trafficToken, t.id, t.port);
    if (p.cookies.some((v) => tokenMatches(v, want))) return view;
    throw new AirlockError(
      'PERMISSION_DENIED',
      `the preview cookie is not valid for port ${t.port} of sandbox ${t.id}: open its link with ?${TOKEN_PARAM}=<traffic token> again`,
    );
  }
  throw new AirlockError(
    'UNAUTHORIZED',
    `sandbox ${t.id}'s ports are private: send its traffic token in the X-Airlock-Traffic-Token header, or open the link once with ?${TOKEN_PARAM}=<traffic token> in a browser`,
  );
}

/** Check access, then connect: throws (typed) before any connection when access is refused. */
async function open(
  opts: PreviewOptions,
  t: { port: number; id: string },
  p: Presented,
  signal: AbortSignal,
): Promise<Duplex> {
  if (!opts.api.connectPort) {
    throw new AirlockError('BACKEND_UNAVAILABLE', 'this server cannot connect to sandbox ports');
  }
  const view = await authorize(opts, t, p);
  if (view.state !== 'running') {
    throw new AirlockError(
      view.state === 'paused' ? 'SANDBOX_PAUSED' : 'SANDBOX_GONE',
      `sandbox ${t.id} is ${view.state}: its ports cannot be reached`,
    );
  }
  return opts.api.connectPort(t.id, t.port, opts.caller, signal);
}

/**
 * A browser's token link (GET/HEAD with the token parameter): 302 to the same URL without it,
 * setting the preview cookie. Nothing is forwarded to the sandbox.
 */
async function redirectWithCookie(
  opts: PreviewOptions,
  t: { port: number; id: string },
  p: Presented,
  res: ServerResponse,
): Promise<void> {
  const view = await authorize(opts, t, p);
  const headers: Record<string, string> = {
    location: sameHostLocation(p.url),
    'cache-control': 'no-store',
    'referrer-policy': 'no-referrer', // the token link is never sent on as a Referer
    'content-length': '0',
  };
  if (view.trafficToken !== undefined) {
    headers['set-cookie'] = setPreviewCookie(
      previewCookieValue(view.trafficToken, t.id, t.port),
      opts.secure === true,
    );
  }
  res.writeHead(302, headers);
  res.end();
}

/** Hop-by-hop headers (RFC 9110 7.6.1) and the token headers: never forwarded. */
const DROP = new Set([
  'connection',
  'keep-alive',
  'proxy-connection',
  'proxy-authenticate',
  'proxy-authorization',
  'te',
  'trailer',
  'transfer-encoding',
  'upgrade',
  ...TRAFFIC_TOKEN_HEADERS,
]);

/**
 * The headers to forward: raw order and case kept; hop-by-hop ones (and those Connection names) and
 * the token headers dropped; the preview cookie cut out of Cookie.
 */
function forwardHeaders(raw: readonly string[], keepUpgrade: boolean): Array<[string, string]> {
  const named = new Set<string>();
  for (let i = 0; i < raw.length; i += 2) {
    if (raw[i]!.toLowerCase() === 'connection')
      for (const n of raw[i + 1]!.split(',')) named.add(n.trim().toLowerCase());
  }
  const out: Array<[string, string]> = [];
  for (let i = 0; i < raw.length; i += 2) {
    const k = raw[i]!.toLowerCase();
    const upgradePart = keepUpgrade && (k === 'upgrade' || k === 'connection');
    if (!upgradePart && (DROP.has(k) || named.has(k))) continue;
    if (k === 'cookie') {
      // The preview cookie is the server's, never the sandbox's: the app's own cookies go on.
      const rest = stripPreviewCookies(raw[i + 1]!);
      if (rest !== '') out.push([raw[i]!, rest]);
      continue;
    }
    out.push([raw[i]!, raw[i + 1]!]);
  }
  return out;
}

async function proxyRequest(
  opts: PreviewOptions,
  t: { port: number; id: string },
  req: IncomingMessage,
  res: ServerResponse,
): Promise<void> {
  // A visitor who goes away ends everything it started (the connect, the upstream connection).
  const gone = new AbortController();
  res.on('close', () => gone.abort());
  if (!req.url?.startsWith('/')) {
    sendError(
      res,
      new AirlockError('INVALID_ARGUMENT', 'a preview request must have an origin-form target (/path)'),
    );
    return;
  }
  const p = presented(req);
  let conn: Duplex;
  try {
    if (p.params.length > 0 && (req.method === 'GET' || req.method === 'HEAD')) {
      req.resume();
      await redirectWithCookie(opts, t, p, res);
      return;
    }
    conn = await open(opts, t, p, gone.signal);
  } catch (e) {
    req.resume();
    sendError(res, e);
    return;
  }
  if (gone.signal.aborted) {
    conn.destroy();
    return;
  }
  const headers = forwardHeaders(req.rawHeaders, false);
  headers.push(['connection', 'close']); // one connection per request: no pool into the sandbox
  const up = httpRequest({
    method: req.method,
    path: p.url,
    headers: headers.flat(),
    createConnection: () => conn as never,
    setHost: false,
  });
  const cut = (): void => {
    up.destroy();
    conn.destroy();
  };
  gone.signal.addEventListener('abort', cut, { once: true });
  up.on('error', (e) => {
    cut();
    sendError(
      res,
      new AirlockError(
        'PORT_UNREACHABLE',
        `port ${t.port} of sandbox ${t.id} broke the response: ${e.message}`,
      ),
    );
  });
  up.on('response', (r) => {
    const out = forwardHeaders(r.rawHeaders, false);
    res.writeHead(r.statusCode ?? 502, r.statusMessage, out.flat());
    res.flushHeaders();
    r.on('data', (d: Buffer) => {
      if (!res.write(d)) r.pause();
    });
    res.on('drain', () => r.resume());
    r.on('end', () => res.end());
    r.on('error', () => res.destroy());
  });
  req.pipe(up);
}

async function proxyUpgrade(
  opts: PreviewOptions,
  t: { port: number; id: string },
  req: IncomingMessage,
  socket: Duplex,
  head: Buffer,
): Promise<void> {
  const gone = new AbortController();
  socket.on('error', () => {});
  socket.on('close', () => gone.abort());
  if (!req.url?.startsWith('/')) {
    rejectRaw(
      socket,
      new AirlockError('INVALID_ARGUMENT', 'a preview request must have an origin-form target (/path)'),
    );
    return;
  }
  const p = presented(req);
  let conn: Duplex;
  try {
    conn = await open(opts, t, p, gone.signal);
  } catch (e) {
    rejectRaw(socket, e);
    return;
  }
  if (gone.signal.aborted) {
    conn.destroy();
    return;
  }
  // The request head as it came (minus the token and hop-by-hop headers, Upgrade/Connection kept),
  // then raw bytes both ways: the sandbox's server answers the upgrade itself (101 or an error).
  const lines = [`${req.method} ${p.url} HTTP/1.1`];
  for (const [k, v] of forwardHeaders(req.rawHeaders, true)) lines.push(`${k}: ${v}`);
  conn.write(`${lines.join('\r\n')}\r\n\r\n`);
  if (head.length) conn.write(head);
  const close = (): void => {
    conn.destroy();
    socket.destroy();
  };
  conn.on('error', close);
  conn.on('close', close);
  socket.on('close', close);
  socket.pipe(conn);
  conn.pipe(socket);
}
