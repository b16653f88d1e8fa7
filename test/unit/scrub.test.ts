// The response scrubber (secrets/scrub.ts) and the lease's side of credential reflection and cleartext:
// every value Airlock inserted (real values, whole header values, the Basic token it re-encoded) is
// found in each encoding a client can trivially undo, in one text and in a stream cut at every offset;
// text without a value passes through byte for byte. The encoders here are written independently of
// the scrubber's decoders.
import { randomBytes } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { Scrubber, type ScrubValue } from '../../src/secrets/scrub.js';
import { SecretLease } from '../../src/secrets/sentinels.js';
import { ENCODINGS } from '../encodings.js';

const nonce = randomBytes(6).toString('hex');
/** Characters every escaping scheme treats differently: + / = & " \ and a non-ASCII one. */
const VALUE = `Tok+en/=&"\\é-${nonce}-Zq9`;
const SENTINEL = `airlock_sentinel_api_token_${'a'.repeat(24)}`;
const VALUES: ScrubValue[] = [{ name: 'API_TOKEN', value: VALUE, replacement: SENTINEL }];

const utf8 = (s: string): Buffer => Buffer.from(s, 'utf8');

/** Asserts the scrubbed text holds neither the value nor its encoding, and does hold a marker or sentinel. */
function expectScrubbed(out: string, encoded: string, label: string): void {
  expect(out, label).not.toContain(encoded);
  expect(out, label).not.toContain(VALUE);
  expect(out.includes('airlock_redacted_api_token') || out.includes(SENTINEL), label).toBe(true);
}

function streamed(s: Scrubber, pieces: Buffer[]): Buffer {
  const st = s.stream();
  return Buffer.concat([...pieces.map((p) => st.push(p)), st.end()]);
}

describe('Scrubber: every trivially undone encoding of an inserted value', () => {
  const s = new Scrubber(VALUES);
  for (const [name, enc] of Object.entries(ENCODINGS)) {
    it(`${name}: in one text`, () => {
      const encoded = enc(VALUE);
      const text = `{"echo":"${encoded}","n":1}`;
      const out = Buffer.from(s.scrubText(Buffer.from(text, 'utf8').toString('latin1')), 'latin1').toString(
        'utf8',
      );
      expectScrubbed(out, encoded, name);
    });

    it(`${name}: streamed, split at every offset and byte by byte`, () => {
      const encoded = enc(VALUE);
      const body = utf8(`<p>reflected: ${encoded}</p>\n`);
      for (let i = 0; i <= body.length; i++) {
        const out = streamed(s, [body.subarray(0, i), body.subarray(i)]).toString('utf8');
        expectScrubbed(out, encoded, `${name} split at ${i}`);
      }
      const bytes = [...body].map((b) => Buffer.from([b]));
      expectScrubbed(streamed(s, bytes).toString('utf8'), encoded, `${name} byte by byte`);
    });
  }

  it('a verbatim reflection reads back as the sentinel; an encoded one as the marker', () => {
    expect(s.scrubText(`a ${Buffer.from(VALUE).toString('latin1')} b`)).toBe(`a ${SENTINEL} b`);
    expect(s.scrubText(utf8(VALUE).toString('hex'))).toBe('airlock_redacted_api_token');
  });

  it('text without a value passes through unchanged, whatever the chunking', () => {
    const text = utf8(
      `plain ${'%41=3D&amp;\\u0041 '.repeat(50)} ${randomBytes(300).toString('base64')} ${VALUE.slice(0, 10)}é`,
    );
    expect(Buffer.from(s.scrubText(text.toString('latin1')), 'latin1').equals(text)).toBe(true);
    for (let i = 0; i <= text.length; i += 7) {
      expect(streamed(s, [text.subarray(0, i), text.subarray(i)]).equals(text)).toBe(true);
    }
  });

  it('many reflections in one long stream, in 1000-byte chunks', () => {
    const parts = Object.values(ENCODINGS).map((e) => `${randomBytes(700).toString('hex')}${e(VALUE)}`);
    const body = utf8(parts.join('|'));
    const chunks: Buffer[] = [];
    for (let i = 0; i < body.length; i += 1000) chunks.push(body.subarray(i, i + 1000));
    const out = streamed(s, chunks).toString('utf8');
    for (const e of Object.values(ENCODINGS)) expect(out).not.toContain(e(VALUE));
    expect(
      out.split('airlock_redacted_api_token').length + out.split(SENTINEL).length - 2,
    ).toBeGreaterThanOrEqual(Object.keys(ENCODINGS).length);
  });
});

describe('SecretLease: the exact values it inserts, and plain HTTP', () => {
  const make = (insecureHttp?: boolean): Promise<SecretLease> =>
    SecretLease.create(
      [
        {
          name: 'API_TOKEN',
          value: { fromEnv: 'SRC' },
          hosts: ['api.example.test'],
          ...(insecureHttp === undefined ? {} : { insecureHttp }),
        },
      ],
      { env: { SRC: VALUE } },
    );

  it('a Basic header Airlock re-encoded: its token and the whole header are known and scrubbed', async () => {
    const lease = await make();
    const sentinel = lease.env().API_TOKEN!;
    const sent = `Basic ${Buffer.from(`user:${sentinel}`).toString('base64')}`;
    const r = lease.swapHeaders('api.example.test', [['Authorization', sent]]);
    const outValue = r.headers[0]![1];
    const token = outValue.slice('Basic '.length);
    expect(Buffer.from(token, 'base64').toString('utf8')).toBe(`user:${VALUE}`);
    const s = new Scrubber([...lease.scrubValuesFor('api.example.test'), ...r.inserted]);
    // The header echoed verbatim reads back as the header the sandbox sent.
    expect(s.scrubText(outValue)).toBe(sent);
    // Its token alone, too; and encoded once more, a marker.
    expect(s.scrubText(`{"auth":"${token}"}`)).toBe(`{"auth":"${sent.slice('Basic '.length)}"}`);
    for (const enc of [
      ENCODINGS['hex lower']!,
      ENCODINGS['base64 offset 1']!,
      ENCODINGS['JSON \\u every char']!,
    ]) {
      const out = s.scrubText(Buffer.from(enc(outValue)).toString('latin1'));
      expect(out).not.toContain(enc(outValue));
      expect(out).toContain('airlock_redacted_api_token');
    }
  });

  it('a secret is swapped only over TLS unless it opts into plain HTTP', async () => {
    const lease = await make();
    const sentinel = lease.env().API_TOKEN!;
    const headers: Array<[string, string]> = [['Authorization', `Bearer ${sentinel}`]];
    const tls = lease.swapHeaders('api.example.test', headers, 'tls');
    expect(tls.swapped).toEqual(['API_TOKEN']);
    const plain = lease.swapHeaders('api.example.test', headers, 'plain');
    expect(plain.swapped).toEqual([]);
    expect(plain.cleartext).toEqual(['API_TOKEN']);
    expect(plain.unbound).toEqual([]);
    expect(JSON.stringify(plain.headers)).not.toContain(VALUE);
    // Basic, base64-wrapped: also refused, not swapped.
    const basic = lease.swapHeaders(
      'api.example.test',
      [['Authorization', `Basic ${Buffer.from(`u:${sentinel}`).toString('base64')}`]],
      'plain',
    );
    expect(basic.cleartext).toEqual(['API_TOKEN']);
    expect(basic.swapped).toEqual([]);
    expect(lease.secretsForHost('api.example.test', 'plain')).toEqual([]);
    // Another host: still exfiltration, not cleartext.
    const away = lease.swapHeaders('other.test', headers, 'plain');
    expect(away.unbound).toEqual(['API_TOKEN']);
    expect(away.cleartext).toEqual([]);

    const opted = await make(true);
    const o = opted.swapHeaders(
      'api.example.test',
      [['Authorization', `Bearer ${opted.env().API_TOKEN}`]],
      'plain',
    );
    expect(o.swapped).toEqual(['API_TOKEN']);
    expect(o.cleartext).toEqual([]);
    expect(o.headers[0]![1]).toBe(`Bearer ${VALUE}`);
  });
});

describe('Scrubber: base64 at an unknown alignment', () => {
  it('a value base64-encoded among unknown bytes leaves none of its bytes in the partial groups', () => {
    const s = new Scrubber(VALUES);
    for (const prefix of ['', 'u', 'us', 'user:', 'user:x']) {
      const b64 = utf8(`${prefix}${VALUE}`).toString('base64');
      const out = s.scrubText(`${b64}.`);
      // Every 4-character group that encodes a byte of the value is gone; groups of the prefix alone may stay.
      const m = /^([A-Za-z0-9+/]*)airlock_redacted_api_token\.$/.exec(out);
      expect(m, `${prefix}: ${out}`).not.toBeNull();
      expect(b64.startsWith(m![1]!)).toBe(true);
      expect(m![1]!.length).toBeLessThanOrEqual(Math.floor(prefix.length / 3) * 4);
    }
  });
});

describe('Scrubber: what it holds back between chunks is bounded', () => {
  it('a long whitespace run is passed on, not held back waiting for a match', () => {
    const st = new Scrubber(VALUES).stream();
    const spaces = Buffer.alloc(300_000, 0x20);
    let emitted = st.push(spaces).length;
    for (let i = 0; i < 1000; i++) emitted += st.push(Buffer.from(' ')).length;
    // Held back: at most the longest needle and a margin, each canonical character a few bytes.
    expect(301_000 - emitted).toBeLessThan(4096);
    expect(emitted + st.end().length).toBe(301_000);
  });

  it('nine whitespace characters inside a base64 value break the match (documented limit)', () => {
    const b64 = utf8(VALUE).toString('base64');
    const split = `${b64.slice(0, 12)}${' '.repeat(9)}${b64.slice(12)}`;
    expect(new Scrubber(VALUES).scrubText(split)).not.toContain('airlock_redacted');
  });
});

describe('Scrubber: UTF-16 bodies', () => {
  for (const order of ['utf16le', 'utf16be'] as const) {
    it(`${order}: in a stream split at every offset`, () => {
      const s = new Scrubber(VALUES);
      const le = Buffer.from(`{"echo": "${VALUE}"}`, 'utf16le');
      const body = order === 'utf16le' ? le : Buffer.from(le).swap16();
      const valueBytes =
        order === 'utf16le' ? Buffer.from(VALUE, 'utf16le') : Buffer.from(VALUE, 'utf16le').swap16();
      for (let i = 0; i <= body.length; i++) {
        const out = streamed(s, [body.subarray(0, i), body.subarray(i)]);
        expect(out.includes(valueBytes), `split at ${i}`).toBe(false);
        expect(out.toString('latin1')).toContain('airlock_redacted_api_token');
      }
    });
  }
});
