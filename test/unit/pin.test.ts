// Request target and Host pinning (src/egress/pin.ts): every spelling that names the decided host is
// accepted (absolute-form rewritten to origin-form); every one that names another host, or that two
// parsers could read differently, is refused with a reason. And the first-bytes classifier that decides
// whether a tunnel's bytes go to the pinned HTTP path or the raw relay.
import { describe, expect, it } from 'vitest';
import { classifyFirstBytes, MAX_SNIFF_BYTES, pinRequest, type PinnedTarget } from '../../src/egress/pin.js';

const T: PinnedTarget = { host: 'allowed.test', port: 80, scheme: 'http' };
const TLS: PinnedTarget = { host: 'allowed.test', port: 443, scheme: 'https' };
const V6: PinnedTarget = { host: '2001:db8::1', port: 8080, scheme: 'http' };
const pin = (url: string, headers: string[] = [], t: PinnedTarget = T) =>
  pinRequest({ url, rawHeaders: headers }, t);

describe('pinRequest: accepted, with the path to send', () => {
  it.each<[string, string[], PinnedTarget, string]>([
    ['/x?y=1', ['Host', 'allowed.test'], T, '/x?y=1'],
    ['/x', ['Host', 'ALLOWED.TEST.'], T, '/x'],
    ['/x', ['Host', 'allowed.test:80'], T, '/x'],
    ['/x', [], T, '/x'], // HTTP/1.0 without Host: the caller pins it
    ['/x', ['Host', ''], T, '/x'],
    ['*', ['Host', 'allowed.test'], T, '*'],
    ['http://allowed.test/a/b?c', ['Host', 'allowed.test'], T, '/a/b?c'],
    ['HTTP://Allowed.Test.:80', [], T, '/'],
    ['http://allowed.test?q', [], T, '/?q'],
    ['http://allowed.test/p#frag', [], T, '/p'],
    ['https://allowed.test/s', ['host', 'allowed.test'], TLS, '/s'],
    ['https://allowed.test:443/s', ['host', 'allowed.test:443'], TLS, '/s'],
    ['/v6', ['Host', '[2001:DB8:0::1]:8080'], V6, '/v6'],
    ['http://[2001:db8::1]:8080/v6', [], V6, '/v6'],
  ])('%s %j', (url, headers, t, path) => {
    expect(pin(url, headers, t)).toEqual({ ok: true, path });
  });
});

describe('pinRequest: refused, with a reason', () => {
  it.each<[string, string[], PinnedTarget, RegExp]>([
    ['/x', ['Host', 'denied.test'], T, /Host header names "denied\.test"/],
    ['/x', ['Host', 'allowed.test', 'host', 'denied.test'], T, /more than one Host header/],
    ['/x', ['Host', 'allowed.test', 'HOST', 'allowed.test'], T, /more than one Host header/],
    ['/x', ['Host', 'allowed.test:8080'], T, /Host header names/],
    ['/x', ['Host', 'allowed.test.evil'], T, /Host header names/],
    ['/x', ['Host', 'allowed.test denied.test'], T, /is not host\[:port\]/],
    ['/x', ['Host', 'user@allowed.test'], T, /is not host\[:port\]/],
    ['/x', ['Host', '2001:db8::1'], V6, /is not host\[:port\]/], // IPv6 needs brackets
    ['/x', ['Host', '[2001:db8::2]:8080'], V6, /Host header names/],
    ['http://denied.test/', [], T, /request target names "denied\.test"/],
    ['http://denied.test/', ['Host', 'allowed.test'], T, /request target names/],
    ['http://allowed.test:81/', [], T, /request target names/],
    ['https://allowed.test/', [], T, /request target names/], // 443 is not this connection's port
    ['http://allowed.test/', [], TLS, /request target names/],
    ['http://user@allowed.test/', [], T, /userinfo/],
    ['http://allowed.test@denied.test/', [], T, /userinfo/],
    ['http://denied.test\\@allowed.test/', [], T, /userinfo/],
    ['//denied.test/x', ['Host', 'allowed.test'], T, /scheme-relative/],
    ['ftp://allowed.test/', [], T, /scheme ftp/],
    ['allowed.test:80', [], T, /neither a path nor an http\(s\) URL/],
    ['http:///x', [], T, /not host\[:port\]/],
    ['http://[2001:db8::2]:8080/', [], V6, /request target names/],
  ])('%s %j', (url, headers, t, reason) => {
    const r = pin(url, headers, t);
    expect(r.ok).toBe(false);
    if (!r.ok) {
      expect(r.reason).toMatch(reason);
      expect(r.reason).toMatch(/^blocked by Airlock egress policy: .*may only carry requests for /);
    }
  });
});

describe('classifyFirstBytes', () => {
  const c = (s: string, final = false) => classifyFirstBytes(Buffer.from(s, 'latin1'), final);
  it('TLS, HTTP request lines (any version, lenient spellings), and other protocols', () => {
    expect(c('\x16\x03\x01\x02\x00')).toBe('tls');
    for (const line of [
      'GET / HTTP/1.1\r\n',
      'GET http://denied.test/ HTTP/1.1\r\n',
      'get / http/1.1\r\n',
      'GET\t/\tHTTP/1.0\n',
      'OPTIONS * HTTP/1.1\r\n',
      'GET /\r\n', // HTTP/0.9
      'GET http://denied.test/\r\n',
      'BREW denied.test HTTP/1.1\r\n',
      '\r\n\r\nGET / HTTP/1.1\r\n', // empty lines first, as servers skip them
      'PRI * HTTP/2.0\r\n',
    ])
      expect(c(line), JSON.stringify(line)).toBe('http');
    for (const line of [
      'SSH-2.0-OpenSSH_9.6 Ubuntu\r\n',
      'SET a b\r\n',
      'get key\r\n',
      '*1\r\n$4\r\nPING\r\n',
      '\x00\x00\x00\x08\x04\xd2\x16\x2f',
      'GET / HTTP/1.1\x00\r\n',
      'EHLO x\r\n',
    ])
      expect(c(line), JSON.stringify(line)).toBe('other');
  });

  it('waits for a line end, and then never lets a possible request line through as "other"', () => {
    for (const part of ['G', 'GET', 'GET / HTTP/1.1', '\r\n', 'GET /x'])
      expect(c(part), JSON.stringify(part)).toBe('incomplete');
    // A deadline passed (or the client stopped): what could still be HTTP is HTTP.
    for (const part of ['G', 'GET', 'GET / HTTP/1.1', '\r\n', 'SSH-2.0-x'])
      expect(c(part, true), JSON.stringify(part)).toBe('http');
    // ... and a line longer than the sniff limit is decided without waiting.
    expect(c(`GET /${'a'.repeat(MAX_SNIFF_BYTES)}`)).toBe('http');
    expect(c('\x01abc')).toBe('other');
  });
});
