// SECURITY-CRITICAL: parses bytes from inside the sandbox (tests for src/egress/http-head.ts)
//
// Request heads as curl, Node and Python send them through a proxy, then the ambiguous heads request
// smuggling is built from, which must be rejected rather than read one way.
import { describe, expect, it } from 'vitest';
import {
  headerValue,
  hostFromRequest,
  MAX_HEAD_BYTES,
  parseRequestHead,
  type HttpRequestHead,
} from '../../src/egress/http-head.js';

const head = (s: string): Buffer => Buffer.from(s, 'latin1');

function request(s: string): HttpRequestHead {
  const r = parseRequestHead(head(s));
  if (r.kind !== 'request') throw new Error(`expected a request, got ${JSON.stringify(r)}`);
  return r;
}

describe('parseRequestHead: requests', () => {
  it('parses an absolute-form proxy request as curl sends it', () => {
    const text =
      'GET http://example.com/path?q=1 HTTP/1.1\r\nHost: example.com\r\nUser-Agent: curl/8.5.0\r\n' +
      'Accept: */*\r\nProxy-Connection: Keep-Alive\r\n\r\n';
    const r = parseRequestHead(head(`${text}BODY`));
    expect(r).toEqual({
      kind: 'request',
      method: 'GET',
      target: 'http://example.com/path?q=1',
      version: 'HTTP/1.1',
      headers: [
        ['Host', 'example.com'],
        ['User-Agent', 'curl/8.5.0'],
        ['Accept', '*/*'],
        ['Proxy-Connection', 'Keep-Alive'],
      ],
      headEnd: text.length,
      body: { kind: 'none' },
    });
  });

  it('parses CONNECT', () => {
    const r = request('CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n');
    expect(r).toMatchObject({ method: 'CONNECT', target: 'example.com:443', version: 'HTTP/1.1' });
  });

  it('accepts LF-only line ends, trims spaces and tabs around values, keeps latin1 bytes', () => {
    const text = 'GET / HTTP/1.0\nHost:  a.example \t\nX-Name: caf\xe9\n\n';
    const r = request(text);
    expect(r.headers).toEqual([
      ['Host', 'a.example'],
      ['X-Name', 'caf\xe9'],
    ]);
    expect(r.headEnd).toBe(text.length);
  });

  it('keeps a non-breaking space (0xA0) that String.trim would have removed', () => {
    expect(request('GET / HTTP/1.1\r\nX: \xa0v\xa0\r\n\r\n').headers).toEqual([['X', '\xa0v\xa0']]);
  });

  it('skips empty lines before the request line', () => {
    expect(request('\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n').method).toBe('GET');
  });

  it('reports the body framing', () => {
    expect(request('POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 12\r\n\r\n').body).toEqual({
      kind: 'length',
      bytes: 12,
    });
    expect(request('POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, Chunked\r\n\r\n').body).toEqual({
      kind: 'chunked',
    });
  });

  it('finds headers case-insensitively', () => {
    const r = request('GET / HTTP/1.1\r\nhOsT: a.example\r\n\r\n');
    expect(headerValue(r, 'Host')).toBe('a.example');
    expect(headerValue(r, 'x-missing')).toBeUndefined();
  });
});

describe('parseRequestHead: incomplete and oversize', () => {
  it('says incomplete for every prefix of a valid head', () => {
    const text = 'GET http://example.com/ HTTP/1.1\r\nHost: example.com\r\nAccept: */*\r\n\r\n';
    for (let n = 0; n < text.length; n++) {
      expect(parseRequestHead(head(text.slice(0, n))), `prefix ${n}`).toEqual({ kind: 'incomplete' });
    }
    expect(parseRequestHead(head(text)).kind).toBe('request');
  });

  it('rejects a head that has not ended within maxBytes', () => {
    const long = `GET / HTTP/1.1\r\nX: ${'a'.repeat(MAX_HEAD_BYTES)}`;
    expect(parseRequestHead(head(long))).toMatchObject({ kind: 'invalid' });
    expect(parseRequestHead(head(long.slice(0, MAX_HEAD_BYTES - 1)))).toEqual({ kind: 'incomplete' });
    expect(parseRequestHead(head('GET / HTTP/1.1\r\nHost: a\r\n'), 20)).toMatchObject({ kind: 'invalid' });
    expect(parseRequestHead(head('GET / HTTP/1.1\r\nHost: a\r\n\r\n'), 27)).toMatchObject({
      kind: 'request',
    });
    expect(parseRequestHead(head('GET / HTTP/1.1\r\nHost: a\r\n\r\n'), 26)).toMatchObject({
      kind: 'invalid',
    });
  });

  it('rejects more than 100 header lines', () => {
    const many = `GET / HTTP/1.1\r\n${'X: y\r\n'.repeat(101)}\r\n`;
    expect(parseRequestHead(head(many))).toMatchObject({ kind: 'invalid' });
    expect(parseRequestHead(head(`GET / HTTP/1.1\r\n${'X: y\r\n'.repeat(100)}\r\n`)).kind).toBe('request');
  });

  it('rejects a malformed request line before the rest of the head arrives', () => {
    expect(parseRequestHead(head('\x16\x03\x01\x02\x00\x01\r\n'))).toMatchObject({ kind: 'invalid' });
    expect(parseRequestHead(head('GET /  HTTP/1.1\r\nHost: a'))).toMatchObject({ kind: 'invalid' });
  });

  it('handles long whitespace runs in linear time', () => {
    const text = `GET / HTTP/1.1\r\nX: a${' '.repeat(15_000)}b\r\n\r\n`;
    expect(request(text).headers[0]![1]).toHaveLength(15_002);
  });
});

describe('parseRequestHead: ambiguous heads are rejected', () => {
  it.each([
    ['a NUL byte', 'GET / HTTP/1.1\r\nX: a\0b\r\n\r\n'],
    ['a NUL byte in an unfinished head', 'GET /\0'],
    ['a bare CR', 'GET / HTTP/1.1\r\nX: a\rb\r\n\r\n'],
    ['a bare CR in an unfinished line', 'GET / HTTP/1.1\r\nX: a\rb'],
    ['obs-fold', 'GET / HTTP/1.1\r\nX: a\r\n b\r\n\r\n'],
    ['obs-fold with a tab', 'GET / HTTP/1.1\r\nHost: a\r\n\tevil\r\n\r\n'],
    ['whitespace before the colon', 'POST / HTTP/1.1\r\nHost: a\r\nContent-Length : 5\r\n\r\n'],
    ['a space in a header name', 'GET / HTTP/1.1\r\nX Y: z\r\n\r\n'],
    ['a header line without a colon', 'GET / HTTP/1.1\r\nHost a\r\n\r\n'],
    ['an empty header name', 'GET / HTTP/1.1\r\n: a\r\n\r\n'],
    ['a control character in a value', 'GET / HTTP/1.1\r\nX: a\x01b\r\n\r\n'],
    ['DEL in a value', 'GET / HTTP/1.1\r\nX: a\x7fb\r\n\r\n'],
    ['two Host headers', 'GET / HTTP/1.1\r\nHost: a.example\r\nhost: b.example\r\n\r\n'],
    [
      'Content-Length and Transfer-Encoding',
      'POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n',
    ],
    [
      'two Content-Length headers',
      'POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n',
    ],
    ['a Content-Length list', 'POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5, 5\r\n\r\n'],
    ['a signed Content-Length', 'POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +5\r\n\r\n'],
    ['a hex Content-Length', 'POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0x5\r\n\r\n'],
    ['an empty Content-Length', 'POST / HTTP/1.1\r\nHost: a\r\nContent-Length:\r\n\r\n'],
    ['a huge Content-Length', `POST / HTTP/1.1\r\nHost: a\r\nContent-Length: ${'9'.repeat(16)}\r\n\r\n`],
    [
      'two Transfer-Encoding headers',
      'POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n',
    ],
    [
      'Transfer-Encoding not ending in chunked',
      'POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, gzip\r\n\r\n',
    ],
    ['Transfer-Encoding: xchunked', 'POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: xchunked\r\n\r\n'],
    ['chunked twice', 'POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, chunked\r\n\r\n'],
    ['an empty coding', 'POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: , chunked\r\n\r\n'],
    ['Transfer-Encoding in HTTP/1.0', 'POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n'],
    ['HTTP/2', 'PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n'],
    ['HTTP/0.9', 'GET /\r\n\r\n'],
    ['a lower-case version', 'GET / http/1.1\r\n\r\n'],
    ['a tab in the request line', 'GET\t/ HTTP/1.1\r\n\r\n'],
    ['a non-ASCII target', 'GET /caf\xe9 HTTP/1.1\r\n\r\n'],
    ['a non-token method', 'G(T / HTTP/1.1\r\n\r\n'],
    ['an overlong method', `${'A'.repeat(33)} / HTTP/1.1\r\n\r\n`],
    ['TLS bytes', '\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03\n\n'],
  ])('rejects %s', (_what, text) => {
    expect(parseRequestHead(head(text))).toMatchObject({ kind: 'invalid' });
  });
});

describe('hostFromRequest', () => {
  const dest = (text: string) => hostFromRequest(request(text));

  it('reads absolute-form URLs, filling in the scheme default port', () => {
    expect(dest('GET http://example.com/x HTTP/1.1\r\nHost: example.com\r\n\r\n')).toEqual({
      host: 'example.com',
      port: 80,
      form: 'absolute',
    });
    expect(dest('GET http://Example.com:8080 HTTP/1.1\r\nHost: example.COM:8080\r\n\r\n')).toEqual({
      host: 'Example.com',
      port: 8080,
      form: 'absolute',
    });
    expect(dest('GET https://example.com?x HTTP/1.1\r\n\r\n')).toEqual({
      host: 'example.com',
      port: 443,
      form: 'absolute',
    });
    expect(dest('GET http://[2606:4700::1111]:81/ HTTP/1.1\r\nHost: [2606:4700:0::1111]:81\r\n\r\n')).toEqual(
      {
        host: '2606:4700::1111',
        port: 81,
        form: 'absolute',
      },
    );
    expect(dest('GET http://example.com:80/ HTTP/1.1\r\nHost: example.com\r\n\r\n')).toMatchObject({
      port: 80,
    });
  });

  it('reads CONNECT targets, IPv6 included, and requires a port', () => {
    expect(dest('CONNECT example.com:443 HTTP/1.1\r\n\r\n')).toEqual({
      host: 'example.com',
      port: 443,
      form: 'authority',
    });
    expect(dest('CONNECT [2606:4700::1111]:443 HTTP/1.1\r\n\r\n')).toEqual({
      host: '2606:4700::1111',
      port: 443,
      form: 'authority',
    });
    expect(dest('CONNECT example.com HTTP/1.1\r\n\r\n')).toBeUndefined();
    expect(dest('CONNECT example.com:0 HTTP/1.1\r\n\r\n')).toBeUndefined();
    expect(dest('CONNECT example.com:65536 HTTP/1.1\r\n\r\n')).toBeUndefined();
    expect(dest('CONNECT 2606:4700::1111:443 HTTP/1.1\r\n\r\n')).toBeUndefined();
    expect(dest('CONNECT http://example.com:443/ HTTP/1.1\r\n\r\n')).toBeUndefined();
  });

  it('reads the Host header for origin-form', () => {
    expect(dest('GET /x HTTP/1.1\r\nHost: example.com\r\n\r\n')).toEqual({
      host: 'example.com',
      form: 'origin',
    });
    expect(dest('GET /x HTTP/1.1\r\nHost: example.com:8443\r\n\r\n')).toEqual({
      host: 'example.com',
      port: 8443,
      form: 'origin',
    });
    expect(dest('OPTIONS * HTTP/1.1\r\nHost: [::1]\r\n\r\n')).toEqual({ host: '::1', form: 'origin' });
    expect(dest('GET /x HTTP/1.0\r\n\r\n')).toBeUndefined();
    expect(dest('GET /x HTTP/1.1\r\nHost:\r\n\r\n')).toBeUndefined();
  });

  it.each([
    [
      'a Host header naming another host',
      'GET http://allowed.example/ HTTP/1.1\r\nHost: evil.example\r\n\r\n',
    ],
    [
      'a Host header naming another port',
      'GET http://allowed.example/ HTTP/1.1\r\nHost: allowed.example:8080\r\n\r\n',
    ],
    ['userinfo', 'GET http://allowed.example@evil.example/ HTTP/1.1\r\n\r\n'],
    ['userinfo with a password', 'GET http://u:p@evil.example/ HTTP/1.1\r\n\r\n'],
    ['an unknown scheme', 'GET ftp://example.com/ HTTP/1.1\r\n\r\n'],
    ['a scheme-relative target', 'GET //example.com/ HTTP/1.1\r\nHost: example.com\r\n\r\n'],
    ['an empty authority', 'GET http:///x HTTP/1.1\r\nHost: example.com\r\n\r\n'],
    ['an unbracketed IPv6 host', 'GET http://::1/ HTTP/1.1\r\n\r\n'],
    ['brackets around a name', 'GET http://[example.com]/ HTTP/1.1\r\n\r\n'],
    ['an empty port', 'GET http://example.com:/ HTTP/1.1\r\n\r\n'],
    ['a non-numeric port', 'GET http://example.com:http/ HTTP/1.1\r\n\r\n'],
    ['an origin-form Host header with two colons', 'GET / HTTP/1.1\r\nHost: a:1:2\r\n\r\n'],
    ['an origin-form Host header with userinfo', 'GET / HTTP/1.1\r\nHost: a@b\r\n\r\n'],
    ['a relative target', 'GET x HTTP/1.1\r\nHost: example.com\r\n\r\n'],
  ])('is undefined for %s', (_what, text) => {
    expect(dest(text)).toBeUndefined();
  });

  it('compares hosts canonically, so equivalent spellings agree', () => {
    expect(dest('GET http://127.0.0.1/ HTTP/1.1\r\nHost: 2130706433\r\n\r\n')).toEqual({
      host: '127.0.0.1',
      port: 80,
      form: 'absolute',
    });
    expect(dest('GET http://example.com./ HTTP/1.1\r\nHost: EXAMPLE.com\r\n\r\n')).toMatchObject({
      host: 'example.com.',
    });
  });
});
