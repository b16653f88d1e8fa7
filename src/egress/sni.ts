// SECURITY-CRITICAL: parses bytes from inside the sandbox
//
// TLS ClientHello reader for transparent interception: the proxy decides an intercepted HTTPS connection
// by the server_name (SNI) the client sends, before any byte goes upstream. Input is whatever sandboxed
// code wrote to a socket, so this file:
//   - never throws, and returns a typed result for every input (garbage → not-tls / invalid);
//   - never reads past a length it has checked against the bytes it was given;
//   - caps what it will ever ask the caller to buffer at MAX_CLIENT_HELLO_BYTES (more → invalid);
//   - rejects every ambiguity instead of picking one reading: duplicate extensions, two host names,
//     trailing bytes, a record of another type between the fragments of the ClientHello.
// The ClientHello may span several TLS records (RFC 8446 §5.1); the fragments are reassembled up to the
// cap. Wire format: RFC 8446 §4.1.2 (ClientHello), RFC 6066 §3 (server_name).

/** The most bytes (TLS record headers included) the caller ever needs to buffer for one ClientHello. */
export const MAX_CLIENT_HELLO_BYTES = 16 * 1024;

export type ClientHelloResult =
  /**
   * A well-formed ClientHello. `serverName` is the host_name, lower-cased, absent when the client sent
   * none. `ech` is true when the client offered Encrypted Client Hello: `serverName` is then only the
   * outer (public) name, and the name the client really wants is encrypted.
   */
  | { kind: 'tls'; serverName?: string; ech: boolean }
  /** A prefix of a ClientHello: read more bytes (the total never needs to exceed MAX_CLIENT_HELLO_BYTES). */
  | { kind: 'incomplete' }
  /** Not a TLS handshake record at all (first byte is not 0x16). */
  | { kind: 'not-tls' }
  | { kind: 'invalid'; reason: string };

const CONTENT_TYPE_HANDSHAKE = 0x16;
const HANDSHAKE_CLIENT_HELLO = 0x01;
const RECORD_HEADER = 5;
const HANDSHAKE_HEADER = 4;
/** RFC 8446 §5.1: a plaintext record fragment is at most 2^14 bytes. */
const MAX_RECORD_FRAGMENT = 16_384;
const EXT_SERVER_NAME = 0x0000;
const EXT_ENCRYPTED_CLIENT_HELLO = 0xfe0d;
const NAME_TYPE_HOST_NAME = 0;
/** RFC 6066: a host_name is ASCII; we also require host characters (no NUL, space, "/", "%", "@"…). */
const SNI_HOST = /^[A-Za-z0-9._-]{1,255}$/;

/** True when `firstByte` opens a TLS handshake record: the cheap test that routes a connection to SNI. */
export function looksLikeTls(firstByte: number): boolean {
  return firstByte === CONTENT_TYPE_HANDSHAKE;
}

const INCOMPLETE: ClientHelloResult = { kind: 'incomplete' };
const invalid = (reason: string): ClientHelloResult => ({ kind: 'invalid', reason });

/**
 * Read the ClientHello at the start of `buf` (the first bytes a client sent). Bytes after the
 * ClientHello are ignored; the caller forwards the whole buffer once it has decided.
 */
export function parseClientHello(buf: Buffer): ClientHelloResult {
  if (buf.length === 0) return INCOMPLETE;
  if (!looksLikeTls(buf[0]!)) return { kind: 'not-tls' };

  // Reassemble the handshake message from consecutive handshake records into one bounded buffer,
  // checking each header as soon as its bytes are present so garbage is rejected without waiting.
  const message = Buffer.alloc(Math.min(buf.length, MAX_CLIENT_HELLO_BYTES));
  let have = 0; // handshake bytes collected into `message`
  let offset = 0; // start of the current record in `buf`
  for (;;) {
    if (offset + RECORD_HEADER > MAX_CLIENT_HELLO_BYTES) return invalid('ClientHello is larger than 16 KiB');
    const header = checkRecordHeader(buf, offset);
    if (header !== undefined) return header;
    if (buf.length < offset + RECORD_HEADER) return INCOMPLETE;
    const length = buf.readUInt16BE(offset + 3);
    if (length === 0) return invalid('empty TLS handshake record');
    if (length > MAX_RECORD_FRAGMENT) return invalid('TLS record is longer than 2^14 bytes');
    const end = offset + RECORD_HEADER + length;
    if (end > MAX_CLIENT_HELLO_BYTES) return invalid('ClientHello is larger than 16 KiB');

    have += buf.copy(message, have, offset + RECORD_HEADER, Math.min(end, buf.length));
    if (have > 0 && message[0] !== HANDSHAKE_CLIENT_HELLO) {
      return invalid('first handshake message is not a ClientHello');
    }
    if (have >= HANDSHAKE_HEADER) {
      const need = HANDSHAKE_HEADER + message.readUIntBE(1, 3);
      if (need > MAX_CLIENT_HELLO_BYTES) return invalid('ClientHello is larger than 16 KiB');
      if (have >= need) return parseHello(message.subarray(HANDSHAKE_HEADER, need));
    }
    if (end > buf.length) return INCOMPLETE;
    offset = end;
  }
}

/** Reject a record header as early as its bytes are present; undefined when it is fine so far. */
function checkRecordHeader(buf: Buffer, offset: number): ClientHelloResult | undefined {
  if (buf.length > offset && buf[offset] !== CONTENT_TYPE_HANDSHAKE) {
    return invalid('a non-handshake TLS record interrupts the ClientHello');
  }
  if (buf.length > offset + 1 && buf[offset + 1] !== 0x03) return invalid('unsupported TLS record version');
  return undefined;
}

/** A bounds-checked reader over one buffer; every read returns undefined instead of running off the end. */
class Reader {
  private pos = 0;
  constructor(private readonly buf: Buffer) {}
  get remaining(): number {
    return this.buf.length - this.pos;
  }
  u8(): number | undefined {
    return this.remaining >= 1 ? this.buf[this.pos++] : undefined;
  }
  u16(): number | undefined {
    if (this.remaining < 2) return undefined;
    const v = this.buf.readUInt16BE(this.pos);
    this.pos += 2;
    return v;
  }
  bytes(n: number): Buffer | undefined {
    if (this.remaining < n) return undefined;
    const b = this.buf.subarray(this.pos, this.pos + n);
    this.pos += n;
    return b;
  }
  /** A length-prefixed vector (prefix of 1 or 2 bytes). */
  vector(prefix: 1 | 2): Buffer | undefined {
    const n = prefix === 1 ? this.u8() : this.u16();
    return n === undefined ? undefined : this.bytes(n);
  }
}

function parseHello(body: Buffer): ClientHelloResult {
  const r = new Reader(body);
  const major = r.u8();
  if (major === undefined || r.u8() === undefined) return invalid('truncated ClientHello');
  if (major !== 0x03) return invalid('unsupported ClientHello version');
  if (r.bytes(32) === undefined) return invalid('truncated ClientHello random');
  const sessionId = r.vector(1);
  if (sessionId === undefined) return invalid('truncated ClientHello session id');
  if (sessionId.length > 32) return invalid('ClientHello session id is longer than 32 bytes');
  const suites = r.vector(2);
  if (suites === undefined) return invalid('truncated ClientHello cipher suites');
  if (suites.length === 0 || suites.length % 2 !== 0) return invalid('malformed ClientHello cipher suites');
  const compression = r.vector(1);
  if (compression === undefined) return invalid('truncated ClientHello compression methods');
  if (compression.length === 0) return invalid('ClientHello lists no compression method');
  if (r.remaining === 0) return { kind: 'tls', ech: false }; // no extensions (TLS 1.0-era client)

  const extensions = r.vector(2);
  if (extensions === undefined) return invalid('truncated ClientHello extensions');
  if (r.remaining !== 0) return invalid('trailing bytes after the ClientHello extensions');

  const ext = new Reader(extensions);
  const seen = new Set<number>();
  let serverName: string | undefined;
  let ech = false;
  while (ext.remaining > 0) {
    const type = ext.u16();
    const data = ext.vector(2);
    if (type === undefined || data === undefined) return invalid('truncated ClientHello extension');
    if (seen.has(type)) return invalid(`duplicate ClientHello extension ${type}`);
    seen.add(type);
    if (type === EXT_ENCRYPTED_CLIENT_HELLO) ech = true;
    if (type !== EXT_SERVER_NAME) continue;
    const sni = parseServerName(data);
    if (typeof sni !== 'string' && sni !== undefined) return sni;
    serverName = sni;
  }
  return serverName === undefined ? { kind: 'tls', ech } : { kind: 'tls', serverName, ech };
}

/** The host_name of a server_name extension body, undefined when it holds none, or an invalid result. */
function parseServerName(data: Buffer): string | undefined | ClientHelloResult {
  if (data.length === 0) return undefined; // a server's empty acknowledgement; tolerated from a client
  const r = new Reader(data);
  const list = r.vector(2);
  if (list === undefined || r.remaining !== 0) return invalid('malformed server_name extension');
  if (list.length === 0) return invalid('empty server_name list');
  const names = new Reader(list);
  let host: string | undefined;
  while (names.remaining > 0) {
    const nameType = names.u8();
    const name = names.vector(2);
    if (nameType === undefined || name === undefined) return invalid('truncated server_name entry');
    if (nameType !== NAME_TYPE_HOST_NAME) continue;
    if (host !== undefined) return invalid('server_name lists more than one host_name');
    const text = name.toString('latin1');
    if (!SNI_HOST.test(text)) return invalid('server_name is not an ASCII host name');
    host = text.toLowerCase();
  }
  return host;
}
