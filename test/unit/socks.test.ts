// SECURITY-CRITICAL: parses bytes from inside the sandbox (tests for src/egress/socks.ts)
//
// Byte sequences as curl/ssh/git send them to a SOCKS5 proxy (RFC 1928), every prefix of them, and the
// malformed and unsupported messages a hostile client could send instead.
import { describe, expect, it } from 'vitest';
import {
  ADDRESS_TYPE_NOT_SUPPORTED,
  COMMAND_NOT_SUPPORTED,
  CONNECTION_REFUSED,
  GENERAL_FAILURE,
  HOST_UNREACHABLE,
  METHOD_NO_ACCEPTABLE,
  METHOD_NO_AUTH,
  NETWORK_UNREACHABLE,
  NOT_ALLOWED,
  selectSocks5Method,
  SOCKS5_MAX_MESSAGE_BYTES,
  SOCKS5_REPLY,
  socks5Greeting,
  socks5MethodReply,
  socks5Reply,
  socks5Request,
  SUCCEEDED,
  TTL_EXPIRED,
} from '../../src/egress/socks.js';

const bytes = (...b: Array<number | number[] | Buffer>): Buffer =>
  Buffer.concat(b.map((x) => (Buffer.isBuffer(x) ? x : Buffer.from(typeof x === 'number' ? [x] : x))));

const connectDomain = (name: string | Buffer, port: number): Buffer => {
  const n = Buffer.isBuffer(name) ? name : Buffer.from(name, 'utf8');
  return bytes(5, 1, 0, 3, n.length, n, [port >> 8, port & 0xff]);
};

describe('reply codes', () => {
  it('have the RFC 1928 values', () => {
    expect(SOCKS5_REPLY).toEqual({
      SUCCEEDED: 0,
      GENERAL_FAILURE: 1,
      NOT_ALLOWED: 2,
      NETWORK_UNREACHABLE: 3,
      HOST_UNREACHABLE: 4,
      CONNECTION_REFUSED: 5,
      TTL_EXPIRED: 6,
      COMMAND_NOT_SUPPORTED: 7,
      ADDRESS_TYPE_NOT_SUPPORTED: 8,
    });
    expect([SUCCEEDED, NOT_ALLOWED, NETWORK_UNREACHABLE, CONNECTION_REFUSED, TTL_EXPIRED]).toEqual([
      0, 2, 3, 5, 6,
    ]);
  });
});

describe('socks5Greeting', () => {
  it('reads the methods a client offers', () => {
    expect(socks5Greeting(bytes(5, 1, 0))).toEqual({ kind: 'greeting', methods: [0], consumed: 3 });
    expect(socks5Greeting(bytes(5, 2, 0, 2, 5, 1))).toEqual({
      kind: 'greeting',
      methods: [0, 2],
      consumed: 4,
    });
  });

  it('says incomplete for every prefix', () => {
    const greeting = bytes(5, 3, 0, 1, 2);
    for (let n = 0; n < greeting.length; n++) {
      expect(socks5Greeting(greeting.subarray(0, n))).toEqual({ kind: 'incomplete' });
    }
  });

  it('handles the largest greeting within the message bound', () => {
    const greeting = bytes(5, 255, Buffer.alloc(255, 0x80));
    expect(greeting.length).toBeLessThanOrEqual(SOCKS5_MAX_MESSAGE_BYTES);
    expect(socks5Greeting(greeting)).toMatchObject({ kind: 'greeting', consumed: 257 });
  });

  it.each([
    ['SOCKS4', bytes(4, 1, 0, 80, 127, 0, 0, 1, 0)],
    ['HTTP', Buffer.from('GET / HTTP/1.1\r\n')],
    ['TLS', bytes(0x16, 3, 1)],
    ['zero methods', bytes(5, 0)],
  ])('rejects %s', (_what, input) => {
    expect(socks5Greeting(input)).toMatchObject({ kind: 'invalid' });
  });

  it('selects no-auth, or "no acceptable methods"', () => {
    expect(selectSocks5Method([2, 0])).toBe(METHOD_NO_AUTH);
    expect(selectSocks5Method([2])).toBe(METHOD_NO_ACCEPTABLE);
    expect(socks5MethodReply(METHOD_NO_AUTH)).toEqual(bytes(5, 0));
    expect(socks5MethodReply(METHOD_NO_ACCEPTABLE)).toEqual(bytes(5, 0xff));
  });
});

describe('socks5Request', () => {
  it('reads a CONNECT to a domain name', () => {
    expect(socks5Request(connectDomain('example.com', 443))).toEqual({
      kind: 'request',
      cmd: 1,
      host: 'example.com',
      addressType: 'domain',
      port: 443,
      consumed: 18,
    });
  });

  it('reads a CONNECT to an IPv4 address', () => {
    expect(socks5Request(bytes(5, 1, 0, 1, [93, 184, 215, 14], [0, 80]))).toEqual({
      kind: 'request',
      cmd: 1,
      host: '93.184.215.14',
      addressType: 'ipv4',
      port: 80,
      consumed: 10,
    });
  });

  it('reads a CONNECT to an IPv6 address, canonical (RFC 5952)', () => {
    const v6 = Buffer.from('26064700000000000000000000001111', 'hex');
    expect(socks5Request(bytes(5, 1, 0, 4, v6, [0x01, 0xbb]))).toEqual({
      kind: 'request',
      cmd: 1,
      host: '2606:4700::1111',
      addressType: 'ipv6',
      port: 443,
      consumed: 22,
    });
    const loopback = bytes(5, 1, 0, 4, Buffer.alloc(15), 1, [0, 22]);
    expect(socks5Request(loopback)).toMatchObject({ host: '::1', port: 22 });
    const mapped = bytes(5, 1, 0, 4, Buffer.alloc(10), [0xff, 0xff, 127, 0, 0, 1], [0, 22]);
    expect(socks5Request(mapped)).toMatchObject({ host: '::ffff:7f00:1' });
  });

  it('returns domain names as sent, UTF-8 included (decideHost canonicalises them)', () => {
    expect(socks5Request(connectDomain('Bücher.DE', 443))).toMatchObject({ host: 'Bücher.DE' });
    expect(socks5Request(connectDomain('127.1', 22))).toMatchObject({ host: '127.1', addressType: 'domain' });
  });

  it('reports the bytes it consumed, leaving early data to the caller', () => {
    const req = bytes(connectDomain('example.com', 443), Buffer.from('\x16\x03\x01'));
    expect(socks5Request(req)).toMatchObject({ kind: 'request', consumed: 18 });
  });

  it('says incomplete for every prefix of each address type', () => {
    const requests = [
      connectDomain('example.com', 443),
      connectDomain('x'.repeat(255), 443),
      bytes(5, 1, 0, 1, [1, 2, 3, 4], [0, 80]),
      bytes(5, 1, 0, 4, Buffer.alloc(16, 0x20), [0, 80]),
    ];
    for (const req of requests) {
      expect(req.length).toBeLessThanOrEqual(SOCKS5_MAX_MESSAGE_BYTES);
      for (let n = 0; n < req.length; n++) {
        expect(socks5Request(req.subarray(0, n)), `prefix ${n} of ${req.toString('hex')}`).toEqual({
          kind: 'incomplete',
        });
      }
      expect(socks5Request(req).kind).toBe('request');
    }
  });

  it.each([
    ['a bad version', bytes(4, 1, 0, 1, [1, 2, 3, 4], [0, 80]), GENERAL_FAILURE],
    ['a non-zero reserved byte', bytes(5, 1, 1, 1, [1, 2, 3, 4], [0, 80]), GENERAL_FAILURE],
    ['BIND', bytes(5, 2), COMMAND_NOT_SUPPORTED],
    ['UDP ASSOCIATE', bytes(5, 3, 0, 1, [0, 0, 0, 0], [0, 0]), COMMAND_NOT_SUPPORTED],
    ['an unknown command', bytes(5, 9), COMMAND_NOT_SUPPORTED],
    ['an unknown address type', bytes(5, 1, 0, 2, [1, 2, 3, 4], [0, 80]), ADDRESS_TYPE_NOT_SUPPORTED],
    ['an empty domain name', bytes(5, 1, 0, 3, 0, [0, 80]), HOST_UNREACHABLE],
    ['a NUL in the domain name', connectDomain('allowed.example\0.evil', 443), HOST_UNREACHABLE],
    ['a space in the domain name', connectDomain('a b', 443), HOST_UNREACHABLE],
    [
      'invalid UTF-8 in the domain name',
      connectDomain(Buffer.from([0x61, 0xff, 0x62]), 443),
      HOST_UNREACHABLE,
    ],
  ])('rejects %s, with the reply to send', (_what, input, reply) => {
    expect(socks5Request(input)).toMatchObject({ kind: 'invalid', reply });
  });

  it('never throws on random bytes', () => {
    let seed = 7;
    const rand = (n: number): number => {
      seed = (seed * 1_103_515_245 + 12_345) % 2 ** 31;
      return seed % n;
    };
    for (let i = 0; i < 3000; i++) {
      const buf = Buffer.from(Array.from({ length: rand(40) }, () => rand(256)));
      if (rand(2) === 0) buf[0] = 5;
      if (rand(2) === 0 && buf.length > 1) buf[1] = 1;
      expect(['incomplete', 'invalid', 'greeting']).toContain(socks5Greeting(buf).kind);
      expect(['incomplete', 'invalid', 'request']).toContain(socks5Request(buf).kind);
    }
  });
});

describe('socks5Reply', () => {
  it('defaults the bound address to 0.0.0.0:0', () => {
    expect(socks5Reply(SUCCEEDED)).toEqual(bytes(5, 0, 0, 1, [0, 0, 0, 0], [0, 0]));
    expect(socks5Reply(NOT_ALLOWED)).toEqual(bytes(5, 2, 0, 1, [0, 0, 0, 0], [0, 0]));
  });

  it('encodes an IPv4 or IPv6 bound address', () => {
    expect(socks5Reply(SUCCEEDED, { address: '203.0.113.5', port: 4321 })).toEqual(
      bytes(5, 0, 0, 1, [203, 0, 113, 5], [0x10, 0xe1]),
    );
    expect(socks5Reply(SUCCEEDED, { address: '2001:db8::1', port: 443 })).toEqual(
      bytes(5, 0, 0, 4, Buffer.from('20010db8000000000000000000000001', 'hex'), [0x01, 0xbb]),
    );
  });

  it('falls back to 0.0.0.0:0 for a bound address that is not an IP address', () => {
    const fallback = bytes(5, 4, 0, 1, [0, 0, 0, 0], [0, 0]);
    expect(socks5Reply(HOST_UNREACHABLE, { address: 'example.com', port: 80 })).toEqual(fallback);
    expect(socks5Reply(HOST_UNREACHABLE, { address: '1.2.3.4', port: 70_000 })).toEqual(fallback);
  });
});
