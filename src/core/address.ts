// SECURITY-CRITICAL: the SSRF address guard.
//
// Every egress path (HTTP proxy, CONNECT, SOCKS5, transparent interception, DNS responder) turns the
// host it was given into ONE canonical form here before any policy decision, and checks every address
// it is about to dial against the always-blocked ranges here. A bug in this file is a sandbox escape
// to the host's loopback, the cloud metadata service (169.254.169.254) or the private network, so:
//   - it is pure (no I/O, no DNS) and small, and every rule below has a row in test/unit/address.test.ts;
//   - it fails closed: anything that looks numeric but is not a valid address is `invalid`, never a
//     `name` (a resolver would otherwise read it with inet_aton and hand back 127.0.0.1);
//   - numeric IPv4 spellings follow the WHATWG URL host parser, which accepts what browsers and glibc's
//     inet_aton accept (decimal, 0x hex, 0-prefixed octal, 1–4 parts, the last filling the rest);
//   - IPv6 is validated by two parsers (node:net's strict syntax check, then ipaddr.js); zone ids are
//     rejected; the IPv4 tail of a transitional address must be strict dotted decimal.
// CIDR matching uses ipaddr.js; only the extraction of an IPv4 address embedded in an IPv6 one
// (mapped, compatible, NAT64, 6to4, Teredo) is written by hand.
import { isIPv4, isIPv6 } from 'node:net';
import { domainToASCII } from 'node:url';
import ipaddr from 'ipaddr.js';

export type CanonicalHost =
  | { kind: 'ip'; address: string; family: 4 | 6 }
  | { kind: 'name'; name: string }
  | { kind: 'invalid'; reason: string };

const MAX_RAW_HOST = 1024;
const MAX_NAME = 253;
const MAX_LABEL = 63;
/** LDH plus underscore (service labels such as `_dmarc`); no leading or trailing hyphen. */
const LABEL = /^[a-z0-9_](?:[a-z0-9_-]*[a-z0-9_])?$/;
/** ASCII characters a host may contain before IDNA; anything else ASCII (%, @, \, :, space…) is invalid. */
const ASCII_HOST_CHARS = /^[A-Za-z0-9._-]*$/;

const invalid = (reason: string): CanonicalHost => ({ kind: 'invalid', reason });

/**
 * Canonicalise a host as a client wrote it (URL host, Host header, CONNECT target, TLS SNI, SOCKS5
 * domain, resolver answer). Names come back lower-case, punycode, without a trailing dot; addresses
 * come back as dotted-quad IPv4 or RFC 5952 IPv6 (no brackets).
 */
export function canonicalHost(raw: string): CanonicalHost {
  if (typeof raw !== 'string' || raw.length === 0) return invalid('empty host');
  if (raw.length > MAX_RAW_HOST) return invalid('host is too long');

  if (raw.startsWith('[')) {
    if (!raw.endsWith(']')) return invalid('unterminated "[" in an IPv6 address');
    return parseIPv6(raw.slice(1, -1));
  }
  if (raw.includes(':')) return parseIPv6(raw);

  let host = raw;
  // eslint-disable-next-line no-control-regex
  if (/[^\x00-\x7f]/.test(host)) {
    // Only the non-ASCII characters go to IDNA: the ASCII part must already be host characters, so the
    // URL parser behind domainToASCII never percent-decodes or strips anything we did not look at.
    // eslint-disable-next-line no-control-regex
    if (!ASCII_HOST_CHARS.test(host.replace(/[^\x00-\x7f]/g, ''))) {
      return invalid('host contains characters that are not allowed in a host name');
    }
    // UTS 46 mapping may turn full-width digits and dots into an IPv4 address: checked below.
    host = domainToASCII(host);
    if (host === '') return invalid('not a valid internationalised domain name');
  }
  if (!ASCII_HOST_CHARS.test(host))
    return invalid('host contains characters that are not allowed in a host name');
  host = host.toLowerCase();

  if (host.endsWith('.')) host = host.slice(0, -1); // one trailing dot: the DNS root
  if (host === '') return invalid('empty host');
  const labels = host.split('.');
  if (labels.some((l) => l === '')) return invalid('empty label (two dots in a row, or a leading dot)');

  if (endsInNumber(labels)) return parseIPv4(labels);

  if (host.length > MAX_NAME) return invalid(`host name is longer than ${MAX_NAME} characters`);
  for (const label of labels) {
    if (label.length > MAX_LABEL) return invalid(`label "${label}" is longer than ${MAX_LABEL} characters`);
    if (!LABEL.test(label)) return invalid(`label "${label}" is not letters, digits, "-" and "_"`);
  }
  if (labels.some((l) => l.startsWith('xn--')) && domainToASCII(host) === '') {
    return invalid('not a valid punycode (xn--) name');
  }
  return { kind: 'name', name: host };
}

// ---- IPv4 (WHATWG URL "IPv4 parser") -----------------------------------------------------------

/** WHATWG "ends in a number": the last label is all digits or a 0x hex number. Such a host is an address or invalid. */
function endsInNumber(labels: readonly string[]): boolean {
  const last = labels[labels.length - 1]!;
  return /^[0-9]+$/.test(last) || /^0x[0-9a-f]*$/.test(last);
}

function ipv4Number(part: string): number | undefined {
  if (part.length > 64) return undefined; // far above 2^32 in any base; keeps Number exact where it matters
  if (/^0x[0-9a-f]*$/.test(part)) return part.length === 2 ? 0 : parseInt(part.slice(2), 16);
  if (/^0[0-7]+$/.test(part)) return parseInt(part.slice(1), 8);
  if (/^(?:0|[1-9][0-9]*)$/.test(part)) return parseInt(part, 10);
  return undefined; // "08", "1a", "0x1g"…
}

function parseIPv4(labels: readonly string[]): CanonicalHost {
  if (labels.length > 4) return invalid('looks like an IPv4 address but has more than 4 parts');
  const nums: number[] = [];
  for (const part of labels) {
    const n = ipv4Number(part);
    if (n === undefined) return invalid(`looks like an IPv4 address but "${part}" is not a number`);
    nums.push(n);
  }
  const last = nums.pop()!;
  if (nums.some((n) => n > 255)) return invalid('looks like an IPv4 address but a part is above 255');
  if (last >= 256 ** (4 - nums.length)) return invalid('looks like an IPv4 address but is out of range');
  let value = last;
  nums.forEach((n, i) => (value += n * 256 ** (3 - i)));
  const address = [24, 16, 8, 0].map((shift) => Math.floor(value / 2 ** shift) % 256).join('.');
  return { kind: 'ip', address, family: 4 };
}

// ---- IPv6 ---------------------------------------------------------------------------------------

function parseIPv6(s: string): CanonicalHost {
  if (s.includes('%')) return invalid('IPv6 zone identifiers (%…) are not allowed');
  if (!isIPv6(s)) return invalid('not a valid IPv6 address');
  let hex = s;
  const dotted = s.lastIndexOf(':');
  if (s.includes('.')) {
    // ipaddr.js reads "::a.b.c.d" as IPv4-MAPPED and accepts leading zeros: convert the tail ourselves.
    const tail = s.slice(dotted + 1);
    if (!isIPv4(tail)) return invalid('the IPv4 part of an IPv6 address must be dotted decimal');
    const o = tail.split('.').map(Number) as [number, number, number, number];
    hex = `${s.slice(0, dotted + 1)}${((o[0] << 8) | o[1]).toString(16)}:${((o[2] << 8) | o[3]).toString(16)}`;
  }
  let parsed: ipaddr.IPv6;
  try {
    parsed = ipaddr.IPv6.parse(hex);
  } catch {
    return invalid('not a valid IPv6 address');
  }
  return { kind: 'ip', address: parsed.toRFC5952String(), family: 6 };
}

// ---- always-blocked ranges ----------------------------------------------------------------------

type V4Range = readonly [name: string, cidr: [ipaddr.IPv4, number]];
type V6Range = readonly [name: string, cidr: [ipaddr.IPv6, number]];

const v4 = (name: string, cidr: string): V4Range => [`${name} ${cidr}`, ipaddr.IPv4.parseCIDR(cidr)];
const v6 = (name: string, cidr: string): V6Range => [`${name} ${cidr}`, ipaddr.IPv6.parseCIDR(cidr)];

/** Never reachable from a sandbox, whatever network.allow says (first match names the range). */
const BLOCKED_V4: readonly V4Range[] = [
  v4('this network', '0.0.0.0/8'),
  v4('loopback', '127.0.0.0/8'),
  v4('private', '10.0.0.0/8'),
  v4('private', '172.16.0.0/12'),
  v4('private', '192.168.0.0/16'),
  v4('link-local', '169.254.0.0/16'), // includes the cloud metadata service 169.254.169.254
  v4('carrier-grade NAT', '100.64.0.0/10'),
  v4('IETF protocol assignments', '192.0.0.0/24'),
  v4('benchmarking', '198.18.0.0/15'),
  v4('multicast', '224.0.0.0/4'),
  v4('broadcast', '255.255.255.255/32'), // inside 240/4; listed first for a clearer name
  v4('reserved', '240.0.0.0/4'),
];

/** IPv6 ranges blocked outright. */
const BLOCKED_V6: readonly V6Range[] = [
  v6('unspecified', '::/128'),
  v6('loopback', '::1/128'),
  v6('unique local', 'fc00::/7'),
  v6('link-local', 'fe80::/10'),
  v6('site-local (deprecated)', 'fec0::/10'),
  v6('multicast', 'ff00::/8'),
  v6('local-use NAT64', '64:ff9b:1::/48'), // RFC 8215: never global, embeds v4 at a prefix-dependent offset
];

/**
 * IPv6 ranges that carry an IPv4 address; the embedded address is always checked, and named when blocked.
 * `always: true` also blocks the rest of the range, whatever it embeds: a mapped address reaches the
 * IPv4 stack through a dual-stack socket, compatible (deprecated, RFC 4291) and translated (SIIT-only)
 * addresses are no legitimate destination, so none is ever dialled — the dialler uses the IPv4 address.
 * NAT64, 6to4 and Teredo are real global IPv6, blocked only when an embedded IPv4 address is blocked.
 */
const EMBEDDING_V6: readonly {
  range: V6Range;
  always: boolean;
  embedded: (p: number[]) => [string, number][];
}[] = [
  { range: v6('IPv4-mapped', '::ffff:0:0/96'), always: true, embedded: (p) => [['', low32(p)]] },
  { range: v6('IPv4-translated', '::ffff:0:0:0/96'), always: true, embedded: (p) => [['', low32(p)]] },
  { range: v6('IPv4-compatible', '::/96'), always: true, embedded: (p) => [['', low32(p)]] },
  { range: v6('NAT64', '64:ff9b::/96'), always: false, embedded: (p) => [['', low32(p)]] },
  { range: v6('6to4', '2002::/16'), always: false, embedded: (p) => [['', word32(p[1]!, p[2]!)]] },
  {
    range: v6('Teredo', '2001::/32'),
    always: false,
    embedded: (p) => [
      ['server ', word32(p[2]!, p[3]!)],
      ['client ', (low32(p) ^ 0xffffffff) >>> 0],
    ],
  },
];

const word32 = (hi: number, lo: number): number => ((hi << 16) | lo) >>> 0;
const low32 = (p: number[]): number => word32(p[6]!, p[7]!);
const dottedQuad = (n: number): string => [24, 16, 8, 0].map((s) => (n >>> s) & 0xff).join('.');

function blockedV4(a: ipaddr.IPv4): string | undefined {
  return BLOCKED_V4.find(([, cidr]) => a.match(cidr))?.[0];
}

/**
 * The name of the always-blocked range containing `address` (e.g. "link-local 169.254.0.0/16"), or
 * undefined for a public address. Fails closed: a string that is not an IP address is "blocked".
 */
export function blockedRange(address: string): string | undefined {
  const c = canonicalHost(address);
  if (c.kind !== 'ip') return 'not an IP address';
  if (c.family === 4) return blockedV4(ipaddr.IPv4.parse(c.address));

  const a = ipaddr.IPv6.parse(c.address);
  const direct = BLOCKED_V6.find(([, cidr]) => a.match(cidr));
  if (direct) return direct[0];
  for (const { range, always, embedded } of EMBEDDING_V6) {
    if (!a.match(range[1])) continue;
    for (const [role, n] of embedded(a.parts)) {
      const inner = dottedQuad(n);
      const why = blockedV4(ipaddr.IPv4.parse(inner));
      if (why) return `${range[0]} embedding ${role}${inner}, ${why}`;
    }
    if (always) return `${range[0]} (dial the IPv4 address ${dottedQuad(low32(a.parts))} instead)`;
    return undefined;
  }
  return undefined;
}

export function isPublicAddress(address: string): boolean {
  return blockedRange(address) === undefined;
}

// ---- operator exceptions ------------------------------------------------------------------------

export type AddressPort = { address: string; family: 4 | 6; port: number };

/** Parse a TCP port written in decimal, 1–65535. */
export function parsePort(s: string): number | undefined {
  if (!/^[1-9][0-9]{0,4}$/.test(s)) return undefined;
  const n = Number(s);
  return n <= 65_535 ? n : undefined;
}

/** Parse "10.0.0.5:5432" or "[fd00::1]:443" (an address and a port; never a name, CIDR or wildcard). */
export function parseAddressPort(entry: string): AddressPort | { error: string } {
  const m = /^\[([^\]]*)\]:([^:]*)$/.exec(entry) ?? /^([^:[\]]*):([^:]*)$/.exec(entry);
  if (!m)
    return { error: 'must be ADDRESS:PORT, with IPv6 in brackets, e.g. 10.0.0.5:5432 or [fd00::1]:443' };
  const [, host, portText] = m as unknown as [string, string, string];
  const port = parsePort(portText);
  if (port === undefined) return { error: `"${portText}" is not a TCP port (1-65535)` };
  const bracketed = entry.startsWith('[');
  const c = canonicalHost(bracketed ? `[${host}]` : host);
  if (c.kind === 'invalid') return { error: `"${host}" is not an IP address (${c.reason})` };
  if (c.kind === 'name') return { error: `"${host}" is a name; exceptions take an exact IP address` };
  return { address: c.address, family: c.family, port };
}

/** Blocked, but not one host an operator could mean: unspecified, multicast, broadcast, reserved. */
const NOT_A_HOST_V4 = ['0.0.0.0/8', '224.0.0.0/4', '240.0.0.0/4'].map((c) => ipaddr.IPv4.parseCIDR(c));
const NOT_A_HOST_V6 = ['::/128', 'ff00::/8'].map((c) => ipaddr.IPv6.parseCIDR(c));

/**
 * Why `address` cannot be an operator exception, or undefined. An exception opens one host in a
 * blocked range; a public address needs no exception, and a range that is not one host (0.0.0.0,
 * multicast, broadcast) or an IPv6 spelling of an IPv4 address (dialled as IPv4) cannot be one.
 */
export function exceptionAddressProblem(address: string): string | undefined {
  const c = canonicalHost(address);
  if (c.kind !== 'ip') return 'is not an IP address';
  const range = blockedRange(c.address);
  if (range === undefined) return 'is a public address: it needs no exception, list it in network.allow';
  if (c.family === 4) {
    const a = ipaddr.IPv4.parse(c.address);
    return NOT_A_HOST_V4.some((r) => a.match(r)) ? `is not a single host (${range})` : undefined;
  }
  const a = ipaddr.IPv6.parse(c.address);
  if (NOT_A_HOST_V6.some((r) => a.match(r))) return `is not a single host (${range})`;
  if (EMBEDDING_V6.some((e) => e.always && a.match(e.range[1]))) {
    return `is an IPv6 spelling of ${dottedQuad(low32(a.parts))}; write the IPv4 address instead`;
  }
  return undefined;
}

/** True when `address`:`port` is exactly one of the operator's exceptions (same address, same port). */
export function exceptionMatches(exceptions: readonly string[], address: string, port: number): boolean {
  const c = canonicalHost(address);
  if (c.kind !== 'ip') return false;
  return exceptions.some((e) => {
    const p = parseAddressPort(e);
    return !('error' in p) && p.address === c.address && p.port === port;
  });
}
