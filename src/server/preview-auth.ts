// SECURITY-CRITICAL: how a visitor of a private preview host proves it may enter, and what of that
// proof is removed before the request reaches the sandbox (server/preview.ts uses these).
//
// Three credentials, tried in this order: the traffic token in a header (X-Airlock-Traffic-Token,
// or E2B's e2b-traffic-access-token); the token in the query parameter `airlock_token` (what a
// browser can carry: a GET answers 302 to the same URL without it and sets the cookie); the preview
// cookie. The cookie never holds the token: its value is HMAC(token, "airlock-preview-cookie/1", id,
// port), so it opens exactly one sandbox port (a cookie for sandbox X or port P verifies for no
// other), and it is host-only (no Domain attribute), HttpOnly, SameSite=Lax, Path=/, and Secure with
// the __Host- prefix when the server has TLS. A cookie is honoured only for requests that carry no
// Origin header or the preview host's own (so a page on another preview host, which is same-site
// under the shared domain, cannot ride it). Header, parameter and cookie are all stripped from what
// is forwarded: the sandbox's code never sees any of them.
import type { IncomingMessage } from 'node:http';
import { macFields } from './mac.js';

/** The query parameter of a preview link that carries the traffic token. */
export const TOKEN_PARAM = 'airlock_token';
/** The preview cookie's name; with TLS, SECURE_COOKIE (the __Host- prefix: Secure, Path=/, no Domain). */
export const PREVIEW_COOKIE = 'airlock_preview';
export const SECURE_COOKIE = `__Host-${PREVIEW_COOKIE}`;
const COOKIE_NAMES: ReadonlySet<string> = new Set([PREVIEW_COOKIE, SECURE_COOKIE]);

/** The cookie value that opens port `port` of sandbox `id` whose traffic token is `token`. */
export function previewCookieValue(token: string, id: string, port: number): string {
  return macFields(token, ['airlock-preview-cookie/1', id, String(port)]).toString('base64url');
}

/** The Set-Cookie header value for a verified visitor. */
export function setPreviewCookie(value: string, secure: boolean): string {
  const attrs = 'Path=/; HttpOnly; SameSite=Lax';
  return secure ? `${SECURE_COOKIE}=${value}; ${attrs}; Secure` : `${PREVIEW_COOKIE}=${value}; ${attrs}`;
}

/** Decoded name of one `name=value` query piece ('+' is a space), or undefined if it does not decode. */
function pieceName(piece: string): string | undefined {
  const eq = piece.indexOf('=');
  try {
    return decodeURIComponent((eq < 0 ? piece : piece.slice(0, eq)).replace(/\+/g, ' '));
  } catch {
    return undefined;
  }
}

function pieceValue(piece: string): string {
  const eq = piece.indexOf('=');
  if (eq < 0) return '';
  try {
    return decodeURIComponent(piece.slice(eq + 1).replace(/\+/g, ' '));
  } catch {
    return piece.slice(eq + 1);
  }
}

/**
 * `url` (origin-form) without any `airlock_token` parameter (however its name is percent-encoded),
 * the rest of the query kept byte for byte, and the values that were removed.
 */
export function stripTokenParam(url: string): { url: string; tokens: string[] } {
  const q = url.indexOf('?');
  if (q < 0) return { url, tokens: [] };
  const tokens: string[] = [];
  const kept: string[] = [];
  for (const piece of url.slice(q + 1).split('&')) {
    if (pieceName(piece) === TOKEN_PARAM) tokens.push(pieceValue(piece));
    else kept.push(piece);
  }
  if (tokens.length === 0) return { url, tokens };
  const rest = kept.filter((p) => p !== '');
  return { url: url.slice(0, q) + (rest.length ? `?${rest.join('&')}` : ''), tokens };
}

/** The preview cookie values a Cookie header value carries. */
function cookieValues(header: string): string[] {
  const out: string[] = [];
  for (const part of header.split(';')) {
    const eq = part.indexOf('=');
    if (eq >= 0 && COOKIE_NAMES.has(part.slice(0, eq).trim())) out.push(part.slice(eq + 1).trim());
  }
  return out;
}

/** A Cookie header value without the preview cookies ('' when none is left). */
export function stripPreviewCookies(header: string): string {
  return header
    .split(';')
    .map((p) => p.trim())
    .filter((p) => {
      const eq = p.indexOf('=');
      return p !== '' && !(eq >= 0 && COOKIE_NAMES.has(p.slice(0, eq).trim()));
    })
    .join('; ');
}

/** The preview cookie values the request carries (every Cookie header). */
export function presentedCookies(req: IncomingMessage): string[] {
  const out: string[] = [];
  const raw = req.rawHeaders;
  for (let i = 0; i < raw.length; i += 2) {
    if (raw[i]!.toLowerCase() === 'cookie') out.push(...cookieValues(raw[i + 1]!));
  }
  return out;
}

/**
 * Whether a cookie may authenticate this request: no Origin header (a navigation, or a same-origin
 * GET), or an Origin whose host is this very preview host.
 */
export function cookieOriginOk(req: IncomingMessage): boolean {
  const origin = req.headers.origin;
  if (origin === undefined) return true;
  try {
    return new URL(origin).host === (req.headers.host ?? '').toLowerCase();
  } catch {
    return false;
  }
}

/**
 * A Location for the redirect to `url` (origin-form, same host): a path starting with `//` or `/\`
 * would be read by a browser as another host, so it is anchored with `/.` (same path once resolved).
 */
export function sameHostLocation(url: string): string {
  return /^\/[/\\]/.test(url) ? `/.${url}` : url;
}
