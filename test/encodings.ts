// Encoders of a value, as a reflecting upstream might send it back: every encoding a client can
// trivially undo that the response scrubber (src/secrets/scrub.ts) covers. Written independently of the
// scrubber's decoders; shared by test/unit/scrub.test.ts and test/egress/reflection.test.ts.
const utf8 = (s: string): Buffer => Buffer.from(s, 'utf8');
const hexBytes = (s: string, f: (h: string) => string): string =>
  [...utf8(s)].map((b) => f(b.toString(16).padStart(2, '0'))).join('');
const wrap = (s: string, width: number, nl = '\r\n'): string =>
  s.replace(new RegExp(`(.{${width}})`, 'g'), `$1${nl}`);

/** name → encoder of a value, as an upstream might reflect it. */
export const ENCODINGS: Record<string, (v: string) => string> = {
  verbatim: (v) => v,
  // Case folding is for ASCII letters (tokens are ASCII; a non-ASCII letter changes its UTF-8 bytes).
  'upper case': (v) => v.replace(/[a-z]+/g, (m) => m.toUpperCase()),
  'lower case': (v) => v.replace(/[A-Z]+/g, (m) => m.toLowerCase()),
  reversed: (v) => [...v].reverse().join(''),
  'hex lower': (v) => utf8(v).toString('hex'),
  'hex upper': (v) => utf8(v).toString('hex').toUpperCase(),
  'base64 offset 0': (v) => utf8(v).toString('base64'),
  'base64 offset 1': (v) => utf8(`x${v}`).toString('base64'),
  'base64 offset 2': (v) => utf8(`xy${v}`).toString('base64'),
  'base64 no padding': (v) => utf8(v).toString('base64').replace(/=+$/, ''),
  'base64url offset 1': (v) => utf8(`x${v}`).toString('base64url'),
  'base64 MIME-wrapped (76)': (v) => wrap(utf8(`p${v}${v}${v}`).toString('base64'), 76),
  'base64 wrapped every 7, LF': (v) => wrap(utf8(`pq${v}`).toString('base64'), 7, '\n'),
  'base64 wrapped every 9, CRLF and a 6-space indent': (v) =>
    wrap(utf8(`pqr${v}`).toString('base64'), 9, '\r\n      '),
  'base64 inside JSON (\\/ escapes)': (v) => JSON.stringify(utf8(v).toString('base64')).replace(/\//g, '\\/'),
  'base64 percent-encoded': (v) => encodeURIComponent(utf8(v).toString('base64')),
  'percent every byte (upper)': (v) => hexBytes(v, (h) => `%${h.toUpperCase()}`),
  'percent every byte (lower)': (v) => hexBytes(v, (h) => `%${h}`),
  encodeURIComponent: (v) => encodeURIComponent(v),
  'percent twice (%25XX)': (v) => encodeURIComponent(encodeURIComponent(v)),
  'JSON.stringify': (v) => JSON.stringify(v),
  'JSON \\u every char': (v) =>
    [...v].map((c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`).join(''),
  'JS \\x escapes': (v) => hexBytes(v, (h) => `\\x${h}`),
  'HTML decimal entities': (v) => [...v].map((c) => `&#${c.codePointAt(0)};`).join(''),
  'HTML hex entities': (v) => [...v].map((c) => `&#x${c.codePointAt(0)!.toString(16)};`).join(''),
  'HTML escaped (named)': (v) =>
    v.replace(/&/g, '&amp;').replace(/"/g, '&quot;').replace(/</g, '&lt;').replace(/>/g, '&gt;'),
  'quoted-printable': (v) => hexBytes(v, (h) => `=${h.toUpperCase()}`),
  'quoted-printable with soft breaks': (v) =>
    [...utf8(v)]
      .map((b) =>
        b > 32 && b < 127 && b !== 61 ? String.fromCharCode(b) : `=${b.toString(16).toUpperCase()}`,
      )
      .map((t, i) => (i % 4 === 3 ? `${t}=\r\n` : t))
      .join(''),
};
