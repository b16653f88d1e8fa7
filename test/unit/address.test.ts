// The SSRF address guard: every blocked range at its edges, every spelling of the addresses an attacker
// aims at (loopback and the metadata service), and inputs that must never pass as a host name. Expected
// values are written out by hand; the WHATWG URL parser in node:url serves as an independent oracle.
import { describe, expect, it } from 'vitest';
import {
  blockedRange,
  canonicalHost,
  exceptionAddressProblem,
  exceptionMatches,
  isPublicAddress,
  parseAddressPort,
} from '../../src/core/address.js';

describe('canonicalHost: names', () => {
  it.each([
    ['example.com', 'example.com'],
    ['Example.COM', 'example.com'],
    ['example.com.', 'example.com'],
    ['API.GitHub.com.', 'api.github.com'],
    ['_dmarc.example.com', '_dmarc.example.com'],
    ['a-b.example.com', 'a-b.example.com'],
    ['localhost', 'localhost'],
    ['bücher.de', 'xn--bcher-kva.de'],
    ['BÜCHER.DE.', 'xn--bcher-kva.de'],
    ['ｅｘａｍｐｌｅ.com', 'example.com'],
    ['xn--bcher-kva.de', 'xn--bcher-kva.de'],
    ['1.2.3.example', '1.2.3.example'],
    ['0x7f.example.com', '0x7f.example.com'],
    [`${'a'.repeat(63)}.com`, `${'a'.repeat(63)}.com`],
    [`${'abcdefghi.'.repeat(25)}com`, `${'abcdefghi.'.repeat(25)}com`], // 253 characters, the limit
  ])('%s → name %s', (raw, name) => {
    expect(canonicalHost(raw)).toEqual({ kind: 'name', name });
  });
});

const LOOPBACK_SPELLINGS = [
  '127.0.0.1',
  '2130706433', // decimal
  '0x7f000001', // hex
  '0X7F000001',
  '0177.0.0.1', // octal
  '0177.0000.0000.0001',
  '0x7f.0.0.1',
  '0x7f.1', // mixed, short
  '0x7f.0x0.0x0.0x1',
  '127.1', // short forms
  '127.0.1',
  '127.0.0.1.', // trailing dot
  '0x7f000001.',
  '１２７.０.０.１', // full-width digits, mapped by IDNA before the IPv4 parser (as browsers do)
  '127。0。0。1', // ideographic full stops
];

const METADATA_SPELLINGS = [
  '169.254.169.254',
  '2852039166',
  '0xa9fea9fe',
  '0251.0376.0251.0376',
  '0xa9.0xfe.0xa9.0xfe',
  '0xa9.254.0251.0xfe',
  '169.254.43518',
  '169.16689662',
  '0xa9.16689662',
  '169.254.169.254.',
];

describe('canonicalHost: numeric IPv4 spellings', () => {
  it.each(LOOPBACK_SPELLINGS)('%s → 127.0.0.1', (raw) => {
    expect(canonicalHost(raw)).toEqual({ kind: 'ip', address: '127.0.0.1', family: 4 });
  });

  it.each(METADATA_SPELLINGS)('%s → 169.254.169.254', (raw) => {
    expect(canonicalHost(raw)).toEqual({ kind: 'ip', address: '169.254.169.254', family: 4 });
  });

  it.each([
    ['0', '0.0.0.0'],
    ['0x', '0.0.0.0'],
    ['4294967295', '255.255.255.255'],
    ['0xffffffff', '255.255.255.255'],
    ['037777777777', '255.255.255.255'],
    ['1.0xffffff', '1.255.255.255'],
    ['1.2.0xffff', '1.2.255.255'],
    ['00000000000000127.0.0.1', '87.0.0.1'], // leading zeros: octal 127
    ['1.1.1.1', '1.1.1.1'],
    ['16843009', '1.1.1.1'],
  ])('%s → %s', (raw, address) => {
    expect(canonicalHost(raw)).toEqual({ kind: 'ip', address, family: 4 });
  });

  it('agrees with the WHATWG URL parser on every numeric spelling above', () => {
    for (const raw of [...LOOPBACK_SPELLINGS, ...METADATA_SPELLINGS]) {
      const c = canonicalHost(raw);
      expect(c.kind === 'ip' && c.address).toBe(new URL(`http://${raw}/`).hostname);
    }
  });

  it('agrees with the WHATWG URL parser on generated numeric-looking hosts', () => {
    // Deterministic generator (no Math.random): strings over the alphabet that numeric hosts use.
    let seed = 0x2545f491;
    const next = (n: number): number => {
      seed = (Math.imul(seed, 1103515245) + 12345) >>> 0;
      return (seed >>> 8) % n;
    };
    const alphabet = '0123456789.xabcdefg';
    let ips = 0;
    for (let i = 0; i < 20_000; i++) {
      const raw = Array.from({ length: 1 + next(14) }, () => alphabet[next(alphabet.length)]).join('');
      let oracle: string | undefined;
      try {
        oracle = new URL(`http://${raw}/`).hostname;
      } catch {
        oracle = undefined;
      }
      const oracleIsIPv4 = oracle !== undefined && /^\d+\.\d+\.\d+\.\d+$/.test(oracle);
      const c = canonicalHost(raw);
      if (oracleIsIPv4) {
        ips++;
        expect(c, raw).toEqual({ kind: 'ip', address: oracle, family: 4 });
      } else {
        // Never an address the browser would not dial; a name only where the URL parser also sees a name.
        expect(c.kind, raw).not.toBe('ip');
        if (c.kind === 'name') expect(oracle?.replace(/\.$/, ''), raw).toBe(c.name);
      }
    }
    expect(ips).toBeGreaterThan(1000);
  });
});

describe('canonicalHost: IPv6', () => {
  it.each([
    ['[::1]', '::1'],
    ['::1', '::1'],
    ['0:0:0:0:0:0:0:1', '::1'],
    ['[0000:0000:0000:0000:0000:0000:0000:0001]', '::1'],
    ['::', '::'],
    ['[::]', '::'],
    ['::ffff:127.0.0.1', '::ffff:7f00:1'],
    ['[::ffff:7f00:1]', '::ffff:7f00:1'],
    ['::FFFF:7F00:1', '::ffff:7f00:1'],
    ['::127.0.0.1', '::7f00:1'], // IPv4-compatible stays compatible (ipaddr.js alone would say mapped)
    ['64:ff9b::169.254.169.254', '64:ff9b::a9fe:a9fe'],
    ['2002:7f00:0001::', '2002:7f00:1::'],
    ['2606:4700:0:0:0:0:0:1111', '2606:4700::1111'],
    ['[2606:4700::1111]', '2606:4700::1111'],
  ])('%s → %s', (raw, address) => {
    expect(canonicalHost(raw)).toEqual({ kind: 'ip', address, family: 6 });
  });
});

describe('canonicalHost: invalid (never a name)', () => {
  it.each([
    '',
    ' ',
    '127.0.0.1 ',
    ' example.com',
    'exa mple.com',
    'example.com:443',
    'http://example.com',
    'user@example.com',
    'example.com/path',
    'exa%6dple.com',
    'ü%41.com', // percent-escapes are never decoded
    'back\\slash.com',
    'nul\0.com',
    '.example.com',
    'example..com',
    'example.com..',
    '-example.com',
    'example-.com',
    `${'a'.repeat(64)}.com`,
    `${'abcdefghi.'.repeat(26)}com`, // 263 characters (253 is the limit)
    'xn--zz.com', // invalid punycode
    // numeric-looking but not an address
    '256.0.0.1',
    '1.2.3.256',
    '1.2.65536',
    '1.16777216',
    '4294967296',
    '0x100000000',
    '08.0.0.1',
    '1.2.3.09',
    '0x7g.1',
    '1.2.3.4.5',
    '0.0.0.0.0',
    'foo.123',
    'example.0x1',
    '1..2.3',
    // IPv6
    '[::1',
    '::1]',
    '[1.2.3.4]',
    '[example.com]',
    'fe80::1%eth0',
    '[fe80::1%25eth0]',
    '[fe80::1%eth0]',
    '1::2::3',
    '::ffff:127.1',
    '::ffff:0177.0.0.1',
    '::ffff:127.000.0.1',
    '12345::1',
    '[::1]:443',
  ])('%j is invalid', (raw) => {
    const c = canonicalHost(raw);
    expect(c.kind).toBe('invalid');
    if (c.kind === 'invalid') expect(c.reason.length).toBeGreaterThan(0);
  });
});

// [address, expected range name or undefined]. Edges: first and last address inside, neighbours outside.
const RANGES: [string, string | undefined][] = [
  ['0.0.0.0', 'this network 0.0.0.0/8'],
  ['0.255.255.255', 'this network 0.0.0.0/8'],
  ['1.0.0.0', undefined],
  ['126.255.255.255', undefined],
  ['127.0.0.0', 'loopback 127.0.0.0/8'],
  ['127.0.0.1', 'loopback 127.0.0.0/8'],
  ['127.255.255.255', 'loopback 127.0.0.0/8'],
  ['128.0.0.0', undefined],
  ['9.255.255.255', undefined],
  ['10.0.0.0', 'private 10.0.0.0/8'],
  ['10.255.255.255', 'private 10.0.0.0/8'],
  ['11.0.0.0', undefined],
  ['172.15.255.255', undefined],
  ['172.16.0.0', 'private 172.16.0.0/12'],
  ['172.31.255.255', 'private 172.16.0.0/12'],
  ['172.32.0.0', undefined],
  ['192.167.255.255', undefined],
  ['192.168.0.0', 'private 192.168.0.0/16'],
  ['192.168.255.255', 'private 192.168.0.0/16'],
  ['192.169.0.0', undefined],
  ['169.253.255.255', undefined],
  ['169.254.0.0', 'link-local 169.254.0.0/16'],
  ['169.254.169.254', 'link-local 169.254.0.0/16'],
  ['169.254.255.255', 'link-local 169.254.0.0/16'],
  ['169.255.0.0', undefined],
  ['100.63.255.255', undefined],
  ['100.64.0.0', 'carrier-grade NAT 100.64.0.0/10'],
  ['100.64.0.1', 'carrier-grade NAT 100.64.0.0/10'],
  ['100.127.255.255', 'carrier-grade NAT 100.64.0.0/10'],
  ['100.128.0.0', undefined],
  ['191.255.255.255', undefined],
  ['192.0.0.0', 'IETF protocol assignments 192.0.0.0/24'],
  ['192.0.0.255', 'IETF protocol assignments 192.0.0.0/24'],
  ['192.0.1.0', undefined],
  ['198.17.255.255', undefined],
  ['198.18.0.0', 'benchmarking 198.18.0.0/15'],
  ['198.19.255.255', 'benchmarking 198.18.0.0/15'],
  ['198.20.0.0', undefined],
  ['223.255.255.255', undefined],
  ['224.0.0.0', 'multicast 224.0.0.0/4'],
  ['239.255.255.255', 'multicast 224.0.0.0/4'],
  ['240.0.0.0', 'reserved 240.0.0.0/4'],
  ['255.255.255.254', 'reserved 240.0.0.0/4'],
  ['255.255.255.255', 'broadcast 255.255.255.255/32'],
  // public, including TEST-NET-3 (the e2e tests' "public" addresses), which is deliberately NOT blocked
  ['203.0.113.10', undefined],
  ['192.0.2.1', undefined],
  ['1.1.1.1', undefined],
  ['8.8.8.8', undefined],
  // IPv6, blocked outright
  ['::', 'unspecified ::/128'],
  ['::1', 'loopback ::1/128'],
  ['fbff:ffff:ffff:ffff:ffff:ffff:ffff:ffff', undefined],
  ['fc00::', 'unique local fc00::/7'],
  ['fd00::1', 'unique local fc00::/7'],
  ['fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff', 'unique local fc00::/7'],
  ['fe7f:ffff:ffff:ffff:ffff:ffff:ffff:ffff', undefined],
  ['fe80::', 'link-local fe80::/10'],
  ['fe80::1', 'link-local fe80::/10'],
  ['febf:ffff:ffff:ffff:ffff:ffff:ffff:ffff', 'link-local fe80::/10'],
  ['fec0::1', 'site-local (deprecated) fec0::/10'],
  ['ff00::', 'multicast ff00::/8'],
  ['ff02::1', 'multicast ff00::/8'],
  ['ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff', 'multicast ff00::/8'],
  ['64:ff9b:1::1', 'local-use NAT64 64:ff9b:1::/48'],
  // IPv4-mapped and -compatible: blocked whatever they embed, naming the embedded range when there is one
  ['::ffff:127.0.0.1', 'IPv4-mapped ::ffff:0:0/96 embedding 127.0.0.1, loopback 127.0.0.0/8'],
  ['::ffff:7f00:1', 'IPv4-mapped ::ffff:0:0/96 embedding 127.0.0.1, loopback 127.0.0.0/8'],
  ['::ffff:a9fe:a9fe', 'IPv4-mapped ::ffff:0:0/96 embedding 169.254.169.254, link-local 169.254.0.0/16'],
  ['::ffff:0:0', 'IPv4-mapped ::ffff:0:0/96 embedding 0.0.0.0, this network 0.0.0.0/8'],
  ['::ffff:1.1.1.1', 'IPv4-mapped ::ffff:0:0/96 (dial the IPv4 address 1.1.1.1 instead)'],
  ['::ffff:203.0.113.10', 'IPv4-mapped ::ffff:0:0/96 (dial the IPv4 address 203.0.113.10 instead)'],
  ['::127.0.0.1', 'IPv4-compatible ::/96 embedding 127.0.0.1, loopback 127.0.0.0/8'],
  ['::a9fe:a9fe', 'IPv4-compatible ::/96 embedding 169.254.169.254, link-local 169.254.0.0/16'],
  ['::1.1.1.1', 'IPv4-compatible ::/96 (dial the IPv4 address 1.1.1.1 instead)'],
  [
    '::ffff:0:a9fe:a9fe',
    'IPv4-translated ::ffff:0:0:0/96 embedding 169.254.169.254, link-local 169.254.0.0/16',
  ],
  // NAT64: blocked only when the embedded IPv4 is
  ['64:ff9b::a9fe:a9fe', 'NAT64 64:ff9b::/96 embedding 169.254.169.254, link-local 169.254.0.0/16'],
  ['64:ff9b::7f00:1', 'NAT64 64:ff9b::/96 embedding 127.0.0.1, loopback 127.0.0.0/8'],
  ['64:ff9b::a00:1', 'NAT64 64:ff9b::/96 embedding 10.0.0.1, private 10.0.0.0/8'],
  ['64:ff9b::101:101', undefined],
  ['64:ff9b::cb00:710a', undefined],
  // 6to4: embedded IPv4 in bits 16-48
  ['2002:7f00:0001::', '6to4 2002::/16 embedding 127.0.0.1, loopback 127.0.0.0/8'],
  ['2002:a9fe:a9fe::1', '6to4 2002::/16 embedding 169.254.169.254, link-local 169.254.0.0/16'],
  ['2002:c0a8:101:1::1', '6to4 2002::/16 embedding 192.168.1.1, private 192.168.0.0/16'],
  ['2002:101:101::1', undefined],
  // Teredo: server in bits 32-64, client = last 32 bits XOR 0xffffffff
  ['2001:0:101:101:0:0:80ff:fffe', 'Teredo 2001::/32 embedding client 127.0.0.1, loopback 127.0.0.0/8'],
  [
    '2001:0:101:101:8000:0:5601:5601',
    'Teredo 2001::/32 embedding client 169.254.169.254, link-local 169.254.0.0/16',
  ],
  [
    '2001:0:a9fe:a9fe::fefe:fefe',
    'Teredo 2001::/32 embedding server 169.254.169.254, link-local 169.254.0.0/16',
  ],
  ['2001:0:4136:e378:8000:63bf:3fff:fdd2', undefined], // RFC 4380 example: server 65.54.227.120, client 192.0.2.45
  // public IPv6
  ['2606:4700::1111', undefined],
  ['2001:4860:4860::8888', undefined],
  ['2001:db8::1', undefined],
  ['2a00:1450:4001::1', undefined],
];

describe('blockedRange', () => {
  it.each(RANGES)('%s → %s', (address, range) => {
    expect(blockedRange(address)).toBe(range);
    expect(isPublicAddress(address)).toBe(range === undefined);
  });

  it.each([
    ...LOOPBACK_SPELLINGS,
    '[::1]',
    '::ffff:127.0.0.1',
    '::ffff:7f00:1',
    '::127.0.0.1',
    '2002:7f00:0001::',
  ])('loopback spelled %s is blocked', (raw) => {
    expect(blockedRange(raw)).toMatch(/loopback/);
    expect(isPublicAddress(raw)).toBe(false);
  });

  it.each([
    ...METADATA_SPELLINGS,
    '::ffff:169.254.169.254',
    '64:ff9b::a9fe:a9fe',
    '[64:ff9b::169.254.169.254]',
  ])('metadata service spelled %s is blocked', (raw) => {
    expect(blockedRange(raw)).toMatch(/link-local 169\.254\.0\.0\/16/);
  });

  it('fails closed on anything that is not an address', () => {
    for (const raw of ['example.com', '', '1.2.3.256', 'fe80::1%eth0', 'localhost']) {
      expect(blockedRange(raw)).toBe('not an IP address');
      expect(isPublicAddress(raw)).toBe(false);
    }
  });
});

describe('operator exceptions', () => {
  const exceptions = ['10.0.0.5:5432', '[fd00::1]:443', 'db.internal:5432', '10.0.0.0/8:80', '*:22', 'junk'];

  it('match exactly one address and port, in any spelling of the address', () => {
    expect(exceptionMatches(exceptions, '10.0.0.5', 5432)).toBe(true);
    expect(exceptionMatches(exceptions, '012.0.0.5', 5432)).toBe(true);
    expect(exceptionMatches(exceptions, 'fd00::1', 443)).toBe(true);
    expect(exceptionMatches(exceptions, '[fd00:0:0::1]', 443)).toBe(true);
  });

  it('do not match another port, address, family or a name', () => {
    expect(exceptionMatches(exceptions, '10.0.0.5', 5433)).toBe(false);
    expect(exceptionMatches(exceptions, '10.0.0.6', 5432)).toBe(false);
    expect(exceptionMatches(exceptions, '::ffff:10.0.0.5', 5432)).toBe(false);
    expect(exceptionMatches(exceptions, 'fd00::1', 80)).toBe(false);
    expect(exceptionMatches(exceptions, 'db.internal', 5432)).toBe(false);
    expect(exceptionMatches(exceptions, '10.1.2.3', 80)).toBe(false); // no CIDRs
    expect(exceptionMatches(exceptions, '10.0.0.5', 22)).toBe(false); // no wildcards
    expect(exceptionMatches([], '10.0.0.5', 5432)).toBe(false);
  });

  it('parseAddressPort accepts ADDRESS:PORT only', () => {
    expect(parseAddressPort('10.0.0.5:5432')).toEqual({ address: '10.0.0.5', family: 4, port: 5432 });
    expect(parseAddressPort('[FD00::1]:443')).toEqual({ address: 'fd00::1', family: 6, port: 443 });
    for (const bad of [
      '10.0.0.5',
      '10.0.0.5:0',
      '10.0.0.5:65536',
      '10.0.0.5:x',
      'fd00::1:443',
      '[1.2.3.4]:80',
    ]) {
      expect(parseAddressPort(bad), bad).toHaveProperty('error');
    }
    expect(parseAddressPort('db.internal:5432')).toEqual({
      error: '"db.internal" is a name; exceptions take an exact IP address',
    });
  });

  it('exceptionAddressProblem explains what cannot be an exception', () => {
    expect(exceptionAddressProblem('10.0.0.5')).toBeUndefined();
    expect(exceptionAddressProblem('169.254.169.254')).toBeUndefined(); // the operator's explicit call
    expect(exceptionAddressProblem('fd00::1')).toBeUndefined();
    expect(exceptionAddressProblem('1.1.1.1')).toMatch(/public address/);
    expect(exceptionAddressProblem('0.0.0.0')).toMatch(/not a single host/);
    expect(exceptionAddressProblem('224.0.0.1')).toMatch(/not a single host/);
    expect(exceptionAddressProblem('255.255.255.255')).toMatch(/not a single host/);
    expect(exceptionAddressProblem('::')).toMatch(/not a single host/);
    expect(exceptionAddressProblem('ff02::1')).toMatch(/not a single host/);
    expect(exceptionAddressProblem('::ffff:10.0.0.5')).toMatch(/write the IPv4 address/);
    expect(exceptionAddressProblem('db.internal')).toMatch(/not an IP address/);
  });
});
