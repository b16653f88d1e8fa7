// SECURITY-CRITICAL: parses bytes from inside the sandbox (tests for src/egress/sni.ts)
//
// Real ClientHellos come from Node's own TLS stack (tls.connect to a plain TCP server on 127.0.0.1 that
// keeps the first record and hangs up); crafted ones cover what a hostile client could send instead.
import net from 'node:net';
import tls from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { looksLikeTls, MAX_CLIENT_HELLO_BYTES, parseClientHello } from '../../src/egress/sni.js';

let server: net.Server;
let port = 0;
const captured: Array<(b: Buffer) => void> = [];

beforeAll(async () => {
  server = net.createServer((sock) => {
    let buf = Buffer.alloc(0);
    sock.on('error', () => {});
    sock.on('data', (d) => {
      buf = Buffer.concat([buf, d]);
      // Keep exactly the first record (read by its header, independently of the code under test).
      if (buf.length >= 5 && buf.length >= 5 + buf.readUInt16BE(3)) {
        captured.shift()?.(buf.subarray(0, 5 + buf.readUInt16BE(3)));
        sock.destroy();
      }
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  port = (server.address() as net.AddressInfo).port;
});

afterAll(async () => {
  await new Promise((resolve) => server.close(resolve));
});

function captureHello(opts: tls.ConnectionOptions): Promise<Buffer> {
  return new Promise((resolve) => {
    captured.push(resolve);
    const client = tls.connect({ host: '127.0.0.1', port, rejectUnauthorized: false, ...opts });
    client.on('error', () => {}); // the server hangs up mid-handshake on purpose
  });
}

// ---- crafted ClientHellos -------------------------------------------------------------------------

const u16 = (n: number): Buffer => Buffer.from([n >> 8, n & 0xff]);
const u24 = (n: number): Buffer => Buffer.from([n >> 16, (n >> 8) & 0xff, n & 0xff]);
const vec16 = (b: Buffer): Buffer => Buffer.concat([u16(b.length), b]);
const ext = (type: number, data: Buffer): Buffer => Buffer.concat([u16(type), vec16(data)]);
const sniEntry = (name: string | Buffer, type = 0): Buffer =>
  Buffer.concat([Buffer.from([type]), vec16(Buffer.isBuffer(name) ? name : Buffer.from(name, 'latin1'))]);
const sni = (...entries: Buffer[]): Buffer => ext(0, vec16(Buffer.concat(entries)));

/** A ClientHello body: version, random, session id, one cipher suite, null compression, extensions. */
function helloBody(extensions: Buffer[] | undefined, opts: { trailing?: Buffer } = {}): Buffer {
  return Buffer.concat([
    Buffer.from([0x03, 0x03]),
    Buffer.alloc(32, 7),
    Buffer.from([0]),
    vec16(Buffer.from([0x13, 0x01])),
    Buffer.from([1, 0]),
    extensions === undefined ? Buffer.alloc(0) : vec16(Buffer.concat(extensions)),
    opts.trailing ?? Buffer.alloc(0),
  ]);
}
const handshake = (body: Buffer, type = 1): Buffer =>
  Buffer.concat([Buffer.from([type]), u24(body.length), body]);
const record = (fragment: Buffer, type = 0x16): Buffer =>
  Buffer.concat([Buffer.from([type, 0x03, 0x01]), u16(fragment.length), fragment]);
const clientHello = (extensions: Buffer[] | undefined): Buffer => record(handshake(helloBody(extensions)));

/** Split the handshake bytes of a one-record ClientHello into records of `size` bytes. */
function resplit(hello: Buffer, size: number): Buffer {
  const hs = hello.subarray(5, 5 + hello.readUInt16BE(3));
  const records: Buffer[] = [];
  for (let i = 0; i < hs.length; i += size) records.push(record(hs.subarray(i, i + size)));
  return Buffer.concat(records);
}

// ---- tests ---------------------------------------------------------------------------------------

describe('parseClientHello: ClientHellos from Node', () => {
  it('reads the server name of a TLS 1.3 ClientHello', async () => {
    const hello = await captureHello({ servername: 'example.test' });
    expect(parseClientHello(hello)).toEqual({ kind: 'tls', serverName: 'example.test', ech: false });
  });

  it('lower-cases the server name', async () => {
    const hello = await captureHello({ servername: 'API.Example.TEST' });
    expect(parseClientHello(hello)).toEqual({ kind: 'tls', serverName: 'api.example.test', ech: false });
  });

  it('reads a TLS 1.2-only ClientHello with ALPN', async () => {
    const hello = await captureHello({
      servername: 'example.test',
      maxVersion: 'TLSv1.2',
      ALPNProtocols: ['h2', 'http/1.1'],
    });
    expect(parseClientHello(hello)).toEqual({ kind: 'tls', serverName: 'example.test', ech: false });
  });

  it('reports no server name when the client sends none', async () => {
    const hello = await captureHello({}); // Node sends no SNI when connecting to an IP address
    expect(parseClientHello(hello)).toEqual({ kind: 'tls', ech: false });
  });

  it('says incomplete for every proper prefix, and ignores bytes after the ClientHello', async () => {
    const hello = await captureHello({ servername: 'example.test' });
    for (let n = 0; n < hello.length; n++) {
      expect(parseClientHello(hello.subarray(0, n)), `prefix of ${n} bytes`).toEqual({ kind: 'incomplete' });
    }
    const more = Buffer.concat([hello, Buffer.from([0x14, 0x03, 0x03, 0x00, 0x01, 0x01])]);
    expect(parseClientHello(more)).toMatchObject({ kind: 'tls', serverName: 'example.test' });
  });

  it('reassembles a ClientHello split across several records, prefix by prefix', async () => {
    const hello = await captureHello({ servername: 'example.test' });
    for (const size of [1, 3, 100, 512]) {
      const split = resplit(hello, size);
      expect(parseClientHello(split), `records of ${size} bytes`).toEqual({
        kind: 'tls',
        serverName: 'example.test',
        ech: false,
      });
    }
    const split = resplit(hello, 100);
    for (let n = 0; n < split.length; n++) {
      expect(parseClientHello(split.subarray(0, n))).toEqual({ kind: 'incomplete' });
    }
  });

  it('never throws on a mutated ClientHello', async () => {
    const hello = await captureHello({ servername: 'example.test' });
    let seed = 42;
    const rand = (n: number): number => {
      seed = (seed * 1_103_515_245 + 12_345) % 2 ** 31;
      return seed % n;
    };
    const kinds = new Set<string>();
    for (let i = 0; i < 3000; i++) {
      const copy = Buffer.from(hello);
      for (let flips = 1 + rand(4); flips > 0; flips--) copy[rand(copy.length)] = rand(256);
      const cut = rand(4) === 0 ? copy.subarray(0, rand(copy.length)) : copy;
      const result = parseClientHello(cut);
      expect(['tls', 'incomplete', 'not-tls', 'invalid']).toContain(result.kind);
      if (result.kind === 'tls' && result.serverName !== undefined) {
        expect(result.serverName).toMatch(/^[a-z0-9._-]+$/);
      }
      kinds.add(result.kind);
    }
    expect(kinds.has('invalid')).toBe(true);
  });
});

describe('parseClientHello: crafted input', () => {
  it('accepts a minimal ClientHello', () => {
    expect(parseClientHello(clientHello([sni(sniEntry('a.example'))]))).toEqual({
      kind: 'tls',
      serverName: 'a.example',
      ech: false,
    });
  });

  it('accepts a ClientHello without extensions, and one with an empty server_name extension', () => {
    expect(parseClientHello(clientHello(undefined))).toEqual({ kind: 'tls', ech: false });
    expect(parseClientHello(clientHello([ext(0, Buffer.alloc(0))]))).toEqual({ kind: 'tls', ech: false });
  });

  it('flags Encrypted Client Hello (the server name is then only the public name)', () => {
    const hello = clientHello([sni(sniEntry('public.example')), ext(0xfe0d, Buffer.from([0, 1, 2]))]);
    expect(parseClientHello(hello)).toEqual({ kind: 'tls', serverName: 'public.example', ech: true });
  });

  it('skips server_name entries of an unknown name type', () => {
    const hello = clientHello([sni(sniEntry('x', 7), sniEntry('b.example'))]);
    expect(parseClientHello(hello)).toMatchObject({ kind: 'tls', serverName: 'b.example' });
  });

  it.each<[string, Buffer]>([
    ['two server_name extensions', clientHello([sni(sniEntry('a.example')), sni(sniEntry('evil.example'))])],
    ['two host_names', clientHello([sni(sniEntry('a.example'), sniEntry('evil.example'))])],
    ['a NUL in the name', clientHello([sni(sniEntry('allowed.example\0.evil.example'))])],
    ['a "/" in the name', clientHello([sni(sniEntry('evil.example/allowed.example'))])],
    ['a non-ASCII name', clientHello([sni(sniEntry(Buffer.from('bücher.de', 'utf8')))])],
    ['an empty name', clientHello([sni(sniEntry(''))])],
    ['an empty server_name list', clientHello([ext(0, vec16(Buffer.alloc(0)))])],
    ['a name overrunning its list', clientHello([ext(0, vec16(Buffer.from([0, 0, 50, 0x61])))])],
    ['an extension overrunning the block', clientHello([Buffer.from([0, 0, 0, 99, 1])])],
    ['bytes after the extensions', record(handshake(helloBody([], { trailing: Buffer.from([1]) })))],
    ['a handshake that is not a ClientHello', record(handshake(helloBody([]), 2))],
    [
      'a session id longer than 32 bytes',
      record(
        handshake(
          Buffer.concat([Buffer.from([3, 3]), Buffer.alloc(32), Buffer.from([33]), Buffer.alloc(40)]),
        ),
      ),
    ],
    ['a truncated body', record(handshake(Buffer.from([3, 3, 1, 2])))],
    ['an empty record', Buffer.from([0x16, 3, 1, 0, 0])],
    ['a record over 2^14 bytes', Buffer.from([0x16, 3, 1, 0x40, 0x01])],
    ['an SSL 2-style version', Buffer.from([0x16, 2, 0])],
    [
      'an alert between the fragments',
      Buffer.concat([record(Buffer.from([1, 0, 0, 60])), record(Buffer.from([2, 0]), 0x15)]),
    ],
    ['a ClientHello declared over 16 KiB', record(Buffer.from([1, 0, 0x40, 0x00]))],
  ])('rejects %s', (_what, input) => {
    expect(parseClientHello(input)).toMatchObject({ kind: 'invalid' });
  });

  it('rejects a ClientHello whose records would exceed 16 KiB in total', () => {
    // 4-byte handshake header declaring 9,000 bytes, then 1-byte records: 6 wire bytes per byte.
    const records = [record(Buffer.from([1, 0, 0x23, 0x28]))];
    for (let i = 0; i < 3000; i++) records.push(record(Buffer.from([0])));
    const input = Buffer.concat(records);
    expect(input.length).toBeGreaterThan(MAX_CLIENT_HELLO_BYTES);
    expect(parseClientHello(input)).toMatchObject({ kind: 'invalid' });
    // …and still says incomplete while below the cap.
    expect(parseClientHello(input.subarray(0, 6000))).toEqual({ kind: 'incomplete' });
  });

  it('says not-tls for other protocols, incomplete for nothing', () => {
    expect(parseClientHello(Buffer.from('GET / HTTP/1.1\r\n'))).toEqual({ kind: 'not-tls' });
    expect(parseClientHello(Buffer.from([0x05, 0x01, 0x00]))).toEqual({ kind: 'not-tls' });
    expect(parseClientHello(Buffer.alloc(0))).toEqual({ kind: 'incomplete' });
    expect(parseClientHello(Buffer.from([0x16]))).toEqual({ kind: 'incomplete' });
    expect(parseClientHello(Buffer.from([0x16, 3, 1, 0, 10, 1]))).toEqual({ kind: 'incomplete' });
  });

  it('rejects garbage as early as the first bad byte', () => {
    expect(parseClientHello(Buffer.from([0x16, 3, 1, 0, 10, 2]))).toMatchObject({ kind: 'invalid' });
  });
});

describe('looksLikeTls', () => {
  it('is true only for a handshake record byte', () => {
    expect(looksLikeTls(0x16)).toBe(true);
    for (const b of [0x00, 0x15, 0x17, 0x47 /* G */, 0x43 /* C */, 0x05, 0x80])
      expect(looksLikeTls(b)).toBe(false);
  });
});
