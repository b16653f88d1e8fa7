// SECURITY-CRITICAL: parses bytes from inside the sandbox
//
// SOCKS5 (RFC 1928) server side, as pure functions over the bytes a client has sent so far: the proxy
// keeps a buffer, calls socks5Greeting and then socks5Request, and on 'incomplete' waits for more. Both
// readers never throw, never read past the bytes they were given, and need at most
// SOCKS5_MAX_MESSAGE_BYTES (a greeting: 2 + 255; a request: 4 + 1 + 255 + 2), so the caller's buffer
// is bounded. Only "no authentication" (0x00) and CONNECT are supported; IPv4 and IPv6 addresses come
// back canonical, domain names come back as sent (decideHost canonicalises and judges them).
import ipaddr from 'ipaddr.js';
import { canonicalHost } from '../core/address.js';

/** Neither message ever needs more bytes than this. */
export const SOCKS5_MAX_MESSAGE_BYTES = 262;

// ---- reply codes (RFC 1928 §6) ------------------------------------------------------------------

export const SUCCEEDED = 0x00;
export const GENERAL_FAILURE = 0x01;
/** Connection not allowed by ruleset: the reply for an egress policy deny. */
export const NOT_ALLOWED = 0x02;
export const NETWORK_UNREACHABLE = 0x03;
export const HOST_UNREACHABLE = 0x04;
export const CONNECTION_REFUSED = 0x05;
export const TTL_EXPIRED = 0x06;
export const COMMAND_NOT_SUPPORTED = 0x07;
export const ADDRESS_TYPE_NOT_SUPPORTED = 0x08;

export const SOCKS5_REPLY = {
  SUCCEEDED,
  GENERAL_FAILURE,
  NOT_ALLOWED,
  NETWORK_UNREACHABLE,
  HOST_UNREACHABLE,
  CONNECTION_REFUSED,
  TTL_EXPIRED,
  COMMAND_NOT_SUPPORTED,
  ADDRESS_TYPE_NOT_SUPPORTED,
} as const;

export type Socks5ReplyCode = (typeof SOCKS5_REPLY)[keyof typeof SOCKS5_REPLY];

// ---- method negotiation -------------------------------------------------------------------------

export const SOCKS5_VERSION = 0x05;
/** The only authentication method Airlock offers: the proxy is reachable only from its own sandbox. */
export const METHOD_NO_AUTH = 0x00;
export const METHOD_NO_ACCEPTABLE = 0xff;
export const CMD_CONNECT = 0x01;

export type Socks5GreetingResult =
  | { kind: 'incomplete' }
  | { kind: 'invalid'; reason: string }
  /** `consumed` bytes form the greeting; anything after them is the client's next message. */
  | { kind: 'greeting'; methods: number[]; consumed: number };

/** Read the client's greeting: VER=5, NMETHODS ≥ 1, METHODS. */
export function socks5Greeting(buf: Buffer): Socks5GreetingResult {
  if (buf.length < 1) return { kind: 'incomplete' };
  if (buf[0] !== SOCKS5_VERSION) return { kind: 'invalid', reason: versionReason(buf[0]!) };
  if (buf.length < 2) return { kind: 'incomplete' };
  const count = buf[1]!;
  if (count === 0) return { kind: 'invalid', reason: 'SOCKS5 greeting offers no authentication method' };
  if (buf.length < 2 + count) return { kind: 'incomplete' };
  return { kind: 'greeting', methods: [...buf.subarray(2, 2 + count)], consumed: 2 + count };
}

/** The method the server picks from the client's list: no-auth, or "no acceptable methods" (0xff). */
export function selectSocks5Method(methods: readonly number[]): number {
  return methods.includes(METHOD_NO_AUTH) ? METHOD_NO_AUTH : METHOD_NO_ACCEPTABLE;
}

/** The method-selection message: VER=5, METHOD. After 0xff the server closes the connection. */
export function socks5MethodReply(method: number): Buffer {
  return Buffer.from([SOCKS5_VERSION, method & 0xff]);
}

// ---- the request --------------------------------------------------------------------------------

export type Socks5Request = {
  kind: 'request';
  cmd: typeof CMD_CONNECT;
  /** A dotted-quad or RFC 5952 IPv6 address (canonical), or a domain name exactly as sent. */
  host: string;
  addressType: 'ipv4' | 'domain' | 'ipv6';
  /** 0–65535 as sent; decideHost rejects 0. */
  port: number;
  /** Bytes of the request; anything after them is early data for the tunnel. */
  consumed: number;
};

export type Socks5RequestResult =
  | { kind: 'incomplete' }
  /** Send socks5Reply(reply) and close. */
  | { kind: 'invalid'; reason: string; reply: Socks5ReplyCode }
  | Socks5Request;

const ATYP_IPV4 = 0x01;
const ATYP_DOMAIN = 0x03;
const ATYP_IPV6 = 0x04;
const utf8 = new TextDecoder('utf-8', { fatal: true });

/** Read the client's request: VER=5, CMD, RSV=0, ATYP, DST.ADDR, DST.PORT. */
export function socks5Request(buf: Buffer): Socks5RequestResult {
  const fail = (reason: string, reply: Socks5ReplyCode = GENERAL_FAILURE): Socks5RequestResult => ({
    kind: 'invalid',
    reason,
    reply,
  });
  if (buf.length < 1) return { kind: 'incomplete' };
  if (buf[0] !== SOCKS5_VERSION) return fail(versionReason(buf[0]!));
  if (buf.length < 2) return { kind: 'incomplete' };
  const cmd = buf[1]!;
  if (cmd !== CMD_CONNECT) {
    const name = cmd === 0x02 ? 'BIND' : cmd === 0x03 ? 'UDP ASSOCIATE' : `command ${cmd}`;
    return fail(`SOCKS5 ${name} is not supported (only CONNECT)`, COMMAND_NOT_SUPPORTED);
  }
  if (buf.length < 3) return { kind: 'incomplete' };
  if (buf[2] !== 0x00) return fail('SOCKS5 request has a non-zero reserved byte');
  if (buf.length < 4) return { kind: 'incomplete' };

  const atyp = buf[3]!;
  let host: string;
  let addressType: Socks5Request['addressType'];
  let addrEnd: number;
  if (atyp === ATYP_IPV4) {
    addrEnd = 8;
    if (buf.length < addrEnd + 2) return { kind: 'incomplete' };
    host = [...buf.subarray(4, 8)].join('.');
    addressType = 'ipv4';
  } else if (atyp === ATYP_IPV6) {
    addrEnd = 20;
    if (buf.length < addrEnd + 2) return { kind: 'incomplete' };
    const groups: string[] = [];
    for (let i = 4; i < 20; i += 2) groups.push(buf.readUInt16BE(i).toString(16));
    const c = canonicalHost(groups.join(':'));
    if (c.kind !== 'ip') return fail('malformed SOCKS5 IPv6 address', ADDRESS_TYPE_NOT_SUPPORTED);
    host = c.address;
    addressType = 'ipv6';
  } else if (atyp === ATYP_DOMAIN) {
    if (buf.length < 5) return { kind: 'incomplete' };
    const length = buf[4]!;
    if (length === 0) return fail('SOCKS5 request has an empty domain name', HOST_UNREACHABLE);
    addrEnd = 5 + length;
    if (buf.length < addrEnd + 2) return { kind: 'incomplete' };
    const name = decodeName(buf.subarray(5, addrEnd));
    if (name === undefined) {
      return fail('SOCKS5 domain name is not valid UTF-8 or has control characters', HOST_UNREACHABLE);
    }
    host = name;
    addressType = 'domain';
  } else {
    return fail(`SOCKS5 address type ${atyp} is not supported`, ADDRESS_TYPE_NOT_SUPPORTED);
  }
  const port = buf.readUInt16BE(addrEnd);
  return { kind: 'request', cmd: CMD_CONNECT, host, addressType, port, consumed: addrEnd + 2 };
}

function decodeName(bytes: Buffer): string | undefined {
  let name: string;
  try {
    name = utf8.decode(bytes);
  } catch {
    return undefined;
  }
  // eslint-disable-next-line no-control-regex
  return /[\x00-\x20\x7f]/.test(name) ? undefined : name;
}

function versionReason(version: number): string {
  return version === 0x04
    ? 'SOCKS4 is not supported; use SOCKS5 (e.g. socks5h://)'
    : `not a SOCKS5 message (version byte ${version})`;
}

/**
 * The reply to a request: VER=5, REP, RSV=0, ATYP, BND.ADDR, BND.PORT. `bind` defaults to 0.0.0.0:0
 * (clients ignore it for CONNECT, and it need not reveal the proxy's outbound address); one that is not
 * an IP address also becomes 0.0.0.0:0.
 */
export function socks5Reply(code: Socks5ReplyCode, bind?: { address: string; port: number }): Buffer {
  const c = bind === undefined ? undefined : canonicalHost(bind.address);
  const portOk = bind !== undefined && Number.isInteger(bind.port) && bind.port >= 0 && bind.port <= 65_535;
  if (c?.kind !== 'ip' || !portOk)
    return Buffer.from([SOCKS5_VERSION, code, 0x00, ATYP_IPV4, 0, 0, 0, 0, 0, 0]);
  const address = ipaddr.parse(c.address).toByteArray();
  const out = Buffer.alloc(6 + address.length);
  out.set([SOCKS5_VERSION, code, 0x00, c.family === 4 ? ATYP_IPV4 : ATYP_IPV6, ...address]);
  out.writeUInt16BE(bind.port, 4 + address.length);
  return out;
}
