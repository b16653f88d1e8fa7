// Small HTTP helpers shared by the egress paths: answers to the sandbox, header pairs, authorities.
import type { IncomingMessage, ServerResponse } from 'node:http';
import { canonicalHost } from '../core/address.js';
import { parseAuthority as parseHostHeader } from './pin.js';

/** A name or address in its canonical spelling (lower-case, punycode; RFC 5952 IPv6), else lower-cased. */
export function canonicalName(n: string): string {
  const c = canonicalHost(n);
  return c.kind === 'name' ? c.name : c.kind === 'ip' ? c.address : n.toLowerCase();
}

/** host:port of a CONNECT target ([v6]:port for IPv6), or undefined. */
export function parseAuthority(a: string): { host: string; port: number } | undefined {
  const m = /^\[([0-9a-fA-F:.]+)\]:(\d{1,5})$/.exec(a) ?? /^([^:[\]]+):(\d{1,5})$/.exec(a);
  if (!m) return undefined;
  const port = Number(m[2]);
  return port >= 1 && port <= 65535 ? { host: m[1]!, port } : undefined;
}

/** The host of a request's Host header (canonical), when there is exactly one and it is host[:port]. */
export function firstHost(req: IncomingMessage): string | undefined {
  const values: string[] = [];
  for (let i = 0; i + 1 < req.rawHeaders.length; i += 2)
    if (req.rawHeaders[i]!.toLowerCase() === 'host') values.push(req.rawHeaders[i + 1]!);
  const a = values.length === 1 ? parseHostHeader(values[0]!.trim()) : undefined;
  return a ? canonicalName(a.host) : undefined;
}

/** Host header value for host:port (IPv6 in brackets, the scheme's default port left out). */
export function hostHeaderFor(host: string, port: number, defaultPort: number): string {
  const c = canonicalHost(host);
  const key = c.kind === 'name' ? c.name : c.kind === 'ip' ? c.address : host;
  return `${c.kind === 'ip' && c.family === 6 ? `[${key}]` : key}${port === defaultPort ? '' : `:${port}`}`;
}

export async function readBounded(req: IncomingMessage, max: number): Promise<Buffer | undefined> {
  const parts: Buffer[] = [];
  let n = 0;
  for await (const chunk of req as AsyncIterable<Buffer>) {
    n += chunk.length;
    if (n > max) return undefined;
    parts.push(chunk);
  }
  return Buffer.concat(parts);
}

export function rawHeaderPairs(m: IncomingMessage): Array<[string, string]> {
  const out: Array<[string, string]> = [];
  for (let i = 0; i + 1 < m.rawHeaders.length; i += 2) out.push([m.rawHeaders[i]!, m.rawHeaders[i + 1]!]);
  return out;
}

/** A whole 403 response (for a raw socket), closing the connection. */
export function forbidden(reason: string): string {
  const body = `${reason}\n`;
  return `HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`;
}

export function sendText(res: ServerResponse, status: number, text: string): void {
  if (res.headersSent) return void res.destroy();
  const body = `${text}\n`;
  res.writeHead(status, {
    'content-type': 'text/plain; charset=utf-8',
    'content-length': Buffer.byteLength(body),
    connection: 'close',
  });
  res.end(body);
}
