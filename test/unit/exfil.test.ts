// Exfiltration scanning (src/secrets/exfil.ts), on a real SecretLease: what a request head, a buffered
// body and a streamed body may carry to a host, and the verdicts the egress gateway acts on.
import { describe, expect, it } from 'vitest';
import {
  bodySecretsFor,
  scanBufferedBody,
  scanRequestHead,
  SCAN_OVERLAP_BYTES,
  StreamScanner,
} from '../../src/secrets/exfil.js';
import { SecretLease } from '../../src/secrets/sentinels.js';

const lease = await SecretLease.create(
  [
    { name: 'API_TOKEN', value: { fromEnv: 'API_TOKEN' }, hosts: ['api.example.com'] },
    { name: 'OTHER_TOKEN', value: { fromEnv: 'OTHER_TOKEN' }, hosts: ['other.example.com'] },
  ],
  { env: { API_TOKEN: 'real-api-value', OTHER_TOKEN: 'real-other-value' } },
);
const sentinel = lease.env().API_TOKEN!;
const other = lease.env().OTHER_TOKEN!;

describe('scanRequestHead', () => {
  it('swaps a bound sentinel into a credential header over TLS, asks for identity, and scrubs it back', () => {
    const r = scanRequestHead(
      lease,
      'api.example.com',
      '/',
      [
        ['Host', 'api.example.com'],
        ['Authorization', `Bearer ${sentinel}`],
        ['X-Echo', sentinel],
      ],
      'tls',
    );
    expect(r.ok).toBe(true);
    if (!r.ok) return;
    expect(r.headers).toContainEqual(['Authorization', 'Bearer real-api-value']);
    expect(r.headers).toContainEqual(['X-Echo', sentinel]); // not a credential header: never swapped
    expect(r.headers).toContainEqual(['Accept-Encoding', 'identity']);
    expect(r.swapped).toEqual(['API_TOKEN']);
    expect(r.scrub.map((s) => s.value)).toContain('real-api-value');
  });

  it("refuses the bound sentinel over plain HTTP, and another host's sentinel anywhere (path too)", () => {
    expect(
      scanRequestHead(lease, 'api.example.com', '/', [['Authorization', `Bearer ${sentinel}`]], 'plain'),
    ).toMatchObject({ ok: false, code: 'cleartext_secret' });
    expect(
      scanRequestHead(lease, 'api.example.com', '/', [['Authorization', `Bearer ${other}`]], 'tls'),
    ).toMatchObject({ ok: false, code: 'sentinel', alert: 'sentinel' });
    expect(scanRequestHead(lease, 'api.example.com', `/?t=${sentinel}`, [], 'tls')).toMatchObject({
      ok: false,
      code: 'sentinel',
    });
  });
});

describe('scanBufferedBody', () => {
  const secrets = bodySecretsFor(lease, 'api.example.com', 'tls', new Set(['API_TOKEN']));
  it('swaps a body secret in, and refuses a body carrying another sentinel', () => {
    const ok = scanBufferedBody(lease, 'api.example.com', Buffer.from(`{"t":"${sentinel}"}`), secrets);
    expect(ok).toMatchObject({ ok: true, swapped: true });
    if (ok.ok) expect(ok.body.toString()).toBe('{"t":"real-api-value"}');
    expect(scanBufferedBody(lease, 'api.example.com', Buffer.from(other), secrets)).toMatchObject({
      ok: false,
      code: 'sentinel',
    });
  });
});

describe('StreamScanner', () => {
  it('finds a sentinel split across two chunks (the overlap), and nothing in clean chunks', () => {
    const s = new StreamScanner(lease, 'api.example.com');
    expect(s.push(Buffer.from('x'.repeat(SCAN_OVERLAP_BYTES * 2)))).toBeUndefined();
    const cut = Math.floor(other.length / 2);
    expect(s.push(Buffer.from(`abc${other.slice(0, cut)}`))).toBeUndefined();
    expect(s.push(Buffer.from(`${other.slice(cut)}def`))).toEqual({ leaked: ['OTHER_TOKEN'], canaries: [] });
  });

  it("lets the host's own sentinel through (it is swapped or refused elsewhere, not exfiltration)", () => {
    expect(new StreamScanner(lease, 'api.example.com').push(Buffer.from(sentinel))).toBeUndefined();
  });
});
