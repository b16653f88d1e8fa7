// SECURITY-CRITICAL: parses bytes from inside the sandbox
//
// The in-sandbox DNS responder's pure logic (the UDP/TCP socket around it lives elsewhere). It never
// forwards a query anywhere, so DNS is not an exfiltration channel: an allowed name gets a synthetic
// IPv4 address from a pool inside an always-blocked range (198.18.0.0/15 by default), every other name
// gets NXDOMAIN. A connection to a synthetic address can only go through transparent interception, which
// asks nameFor() which name it meant and then decides and resolves that name itself; nothing can dial a
// synthetic address directly, because the SSRF guard blocks the whole range.
//
// Input handling: queries larger than MAX_QUERY_BYTES, responses and packets without a full header are
// dropped (undefined); a header followed by garbage gets FORMERR; dns-packet decodes inside try/catch,
// and the question name must re-encode to exactly the bytes on the wire (no compression pointer, no "."
// inside a label, valid UTF-8), so the name judged is the name asked. Memory is bounded per responder
// (one per sandbox) by `maxNames`: one entry per handed-out address, never recycled (a recycled address
// could be read as another name); once the table is full a NEW name gets REFUSED (names already in it
// keep their address), so a sandbox resolving endless allowed names (under a wildcard) cannot grow
// Airlock's memory, and other sandboxes' tables are their own.
import type DnsPacket from 'dns-packet';
import ipaddr from 'ipaddr.js';
import { AirlockError } from '../core/errors.js';
import { lazyRequire } from '../core/lazy.js';
import { blockedRange, canonicalHost } from '../core/address.js';

const dnsPacket = lazyRequire<typeof DnsPacket>('dns-packet');

export const DEFAULT_SYNTHETIC_POOL = '198.18.0.0/15';
export const SYNTHETIC_TTL_SECONDS = 5;
/** Bigger than any honest query (one question plus an EDNS option record); larger packets are dropped. */
export const MAX_QUERY_BYTES = 4096;
/** Names one responder hands addresses to (a name is at most 253 bytes: about 2 MiB at most). */
export const DEFAULT_MAX_NAMES = 4096;

const RCODE = { NOERROR: 0, FORMERR: 1, SERVFAIL: 2, NXDOMAIN: 3, NOTIMP: 4, REFUSED: 5 } as const;
const QR = 0x8000;
const AA = 0x0400;
const RD = 0x0100;
const RA = 0x0080;
const TYPE_A = 1;
const CLASS_IN = 1;

export interface FakeDnsOptions {
  /** Whether the sandbox may reach `name` (canonical: lower-case, punycode, no trailing dot). */
  allows(name: string): boolean;
  /** An IPv4 CIDR inside one always-blocked range; default 198.18.0.0/15. */
  pool?: string;
  /** Distinct names this responder hands addresses to; more get REFUSED. Default DEFAULT_MAX_NAMES. */
  maxNames?: number;
  /** Called when a new name is refused because the table is full (the gateway reports it). */
  onTableFull?(name: string): void;
}

interface Pool {
  /** First usable address (the network address + 1) as a 32-bit number. */
  readonly first: number;
  /** Usable addresses: the network and broadcast addresses are never handed out. */
  readonly size: number;
}

/** Pools already checked, by their CIDR text (every sandbox's DNS uses the same one). */
const pools = new Map<string, Pool>();

function parsePool(pool: string): Pool {
  let parsed = pools.get(pool);
  if (!parsed) pools.set(pool, (parsed = Object.freeze(checkPool(pool))));
  return parsed;
}

function checkPool(pool: string): Pool {
  let cidr: [ipaddr.IPv4, number];
  try {
    cidr = ipaddr.IPv4.parseCIDR(pool);
  } catch (e) {
    throw new AirlockError(
      'INVALID_ARGUMENT',
      `DNS pool "${pool}" is not an IPv4 CIDR such as 198.18.0.0/15`,
      {
        cause: e,
      },
    );
  }
  const [address, bits] = cidr;
  if (bits > 30) throw new AirlockError('INVALID_ARGUMENT', `DNS pool "${pool}" is smaller than a /30`);
  const network = toNumber(address) & mask(bits);
  const last = network + 2 ** (32 - bits) - 1;
  const range = blockedRange(toDotted(network));
  if (range === undefined || blockedRange(toDotted(last)) !== range) {
    throw new AirlockError(
      'INVALID_ARGUMENT',
      `DNS pool "${pool}" must lie inside one always-blocked range (such as 198.18.0.0/15), so that no ` +
        'synthetic address can ever be dialled directly',
    );
  }
  return { first: network + 1, size: 2 ** (32 - bits) - 2 };
}

const mask = (bits: number): number => (bits === 0 ? 0 : (0xffffffff << (32 - bits)) >>> 0);
const toNumber = (a: ipaddr.IPv4): number => a.octets.reduce((n, o) => n * 256 + o, 0);
const toDotted = (n: number): string => [24, 16, 8, 0].map((s) => (n >>> s) & 0xff).join('.');

/** True when `address` is inside `pool` (an IPv4 CIDR); false for anything unparseable. */
export function isSyntheticAddress(address: string, pool: string = DEFAULT_SYNTHETIC_POOL): boolean {
  const c = canonicalHost(address);
  if (c.kind !== 'ip' || c.family !== 4) return false;
  try {
    return ipaddr.IPv4.parse(c.address).match(ipaddr.IPv4.parseCIDR(pool));
  } catch {
    return false;
  }
}

/** The DNS responder's decisions: allowed names → stable synthetic addresses, the rest → NXDOMAIN. */
export class FakeDns {
  readonly #allows: (name: string) => boolean;
  readonly #pool: Pool;
  readonly #maxNames: number;
  readonly #onTableFull: ((name: string) => void) | undefined;
  readonly #addressByName = new Map<string, string>();
  readonly #nameByAddress = new Map<string, string>();

  /**
   * @throws AirlockError INVALID_ARGUMENT when the pool is not an IPv4 CIDR inside one blocked range, or
   * maxNames is not a positive integer.
   */
  constructor(opts: FakeDnsOptions) {
    this.#allows = opts.allows;
    this.#pool = parsePool(opts.pool ?? DEFAULT_SYNTHETIC_POOL);
    const max = opts.maxNames ?? DEFAULT_MAX_NAMES;
    if (!Number.isSafeInteger(max) || max < 1) {
      throw new AirlockError(
        'INVALID_ARGUMENT',
        `DNS maxNames must be a positive integer, not ${String(max)}`,
        {
          field: 'maxNames',
        },
      );
    }
    this.#maxNames = max;
    this.#onTableFull = opts.onTableFull;
  }

  /** How many names have an address (at most maxNames). */
  get size(): number {
    return this.#addressByName.size;
  }

  /** The name `address` was handed out for, or undefined (not synthetic, or never handed out). */
  nameFor(address: string): string | undefined {
    const c = canonicalHost(address);
    return c.kind === 'ip' && c.family === 4 ? this.#nameByAddress.get(c.address) : undefined;
  }

  /**
   * The response to one query packet, or undefined when it must be dropped (too short to carry a header,
   * too large, or itself a response). Never throws.
   */
  answer(query: Buffer): Buffer | undefined {
    if (!Buffer.isBuffer(query) || query.length < 12 || query.length > MAX_QUERY_BYTES) return undefined;
    const flags = query.readUInt16BE(2);
    if ((flags & QR) !== 0) return undefined; // never answer a response (no reflection loops)
    const id = query.readUInt16BE(0);
    const opcode = (flags >> 11) & 0xf;
    const base = (opcode << 11) | (flags & RD) | RA;
    const bare = (rcode: number): Buffer => bareResponse(id, base | rcode);

    if (opcode !== 0) return bare(RCODE.NOTIMP);
    const [qdcount, ancount, nscount] = [4, 6, 8].map((o) => query.readUInt16BE(o));
    // One question, as every stub resolver sends (RFC 9619); answers or authorities make no sense in a query.
    if (qdcount !== 1 || ancount !== 0 || nscount !== 0) return bare(RCODE.FORMERR);

    let packet: DnsPacket.DecodedPacket;
    try {
      packet = dnsPacket().decode(query);
    } catch {
      return bare(RCODE.FORMERR);
    }
    const question = packet.questions?.[0];
    if (question === undefined || typeof question.name !== 'string') return bare(RCODE.FORMERR);
    const wire = encodeName(question.name);
    const nameEnd = 12 + (wire?.length ?? 0);
    if (wire === undefined || nameEnd + 4 > query.length || !wire.equals(query.subarray(12, nameEnd))) {
      return bare(RCODE.FORMERR);
    }
    const qtype = query.readUInt16BE(nameEnd);
    const qclass = query.readUInt16BE(nameEnd + 2);

    const respond = (rcode: number, answers: DnsPacket.Answer[] = []): Buffer => {
      try {
        return dnsPacket().encode({
          type: 'response',
          id,
          flags: base | AA | rcode,
          questions: [question],
          answers,
        });
      } catch {
        return bare(RCODE.SERVFAIL);
      }
    };

    if (qclass !== CLASS_IN) return bare(RCODE.REFUSED); // CHAOS, ANY…: nothing to say
    const c = canonicalHost(question.name);
    if (c.kind !== 'name') return respond(RCODE.NXDOMAIN);
    let allowed: boolean;
    try {
      allowed = this.#allows(c.name) === true;
    } catch {
      return respond(RCODE.SERVFAIL);
    }
    if (!allowed) return respond(RCODE.NXDOMAIN);
    if (qtype !== TYPE_A) return respond(RCODE.NOERROR); // AAAA, HTTPS, MX…: no data; clients use A
    const address = this.#addressFor(c.name);
    if (address === 'full') {
      try {
        this.#onTableFull?.(c.name);
      } catch {
        /* a reporter's bug never breaks the responder */
      }
      return respond(RCODE.REFUSED);
    }
    if (address === undefined) return respond(RCODE.SERVFAIL); // pool exhausted
    return respond(RCODE.NOERROR, [
      { type: 'A', name: question.name, class: 'IN', ttl: SYNTHETIC_TTL_SECONDS, data: address },
    ]);
  }

  #addressFor(name: string): string | 'full' | undefined {
    const known = this.#addressByName.get(name);
    if (known !== undefined) return known;
    const index = this.#addressByName.size;
    if (index >= this.#maxNames) return 'full';
    if (index >= this.#pool.size) return undefined;
    const address = toDotted(this.#pool.first + index);
    this.#addressByName.set(name, address);
    this.#nameByAddress.set(address, name);
    return address;
  }
}

/**
 * The wire form of a name as dns-packet decoded it: one length-prefixed label per "."-separated part.
 * Undefined when no wire form gives back this string (a label over 63 bytes, an empty label).
 */
function encodeName(name: string): Buffer | undefined {
  if (name === '.') return Buffer.from([0]);
  const parts: Buffer[] = [];
  for (const label of name.split('.')) {
    const bytes = Buffer.from(label, 'utf8');
    if (bytes.length === 0 || bytes.length > 63) return undefined;
    parts.push(Buffer.from([bytes.length]), bytes);
  }
  parts.push(Buffer.from([0]));
  return Buffer.concat(parts);
}

/** A response carrying only a header (no question echoed): for queries whose question cannot be trusted. */
function bareResponse(id: number, flags: number): Buffer {
  const out = Buffer.alloc(12);
  out.writeUInt16BE(id, 0);
  out.writeUInt16BE((QR | flags) & 0xffff, 2);
  return out;
}
