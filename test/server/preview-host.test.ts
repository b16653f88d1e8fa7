// The pure pieces of preview URLs: which Host headers are preview hosts (exactly `<port>-<id>.<domain>`
// with an optional :port), the preview domain's check, tokens (random, compared as whole strings)
// and the per-sandbox access table. No sandbox needed.
import { describe, expect, it } from 'vitest';
import { AirlockError } from '../../src/core/errors.js';
import {
  PreviewAccessTable,
  checkPreviewDomain,
  newPreviewAccess,
  parsePreviewHost,
  previewHost,
  tokenMatches,
} from '../../src/server/preview.js';

const ID = 'sbx-0123456789abcdef';

describe('parsePreviewHost', () => {
  it.each([
    [`8000-${ID}.localhost`, 8000],
    [`8000-${ID}.localhost:7000`, 8000],
    [`1-${ID}.localhost`, 1],
    [`65535-${ID}.localhost`, 65535],
  ])('routes %s', (host, port) => {
    expect(parsePreviewHost(host)).toEqual({ port, id: ID });
  });

  it('round-trips previewHost, for any domain', () => {
    for (const d of ['localhost', 'preview.example.com', 'a.b.c.example.com']) {
      expect(parsePreviewHost(previewHost(3000, ID, d), d)).toEqual({ port: 3000, id: ID });
      expect(parsePreviewHost(`${previewHost(3000, ID, d)}:443`, d)).toEqual({ port: 3000, id: ID });
    }
  });

  it.each([
    undefined,
    '',
    `8000-${ID.toUpperCase()}.localhost`,
    `8000-${ID}.LOCALHOST`,
    `8000-${ID}.localhost.`,
    `x.8000-${ID}.localhost`,
    `8000-${ID}.x.localhost`,
    `08000-${ID}.localhost`,
    `00-${ID}.localhost`,
    `0-${ID}.localhost`,
    `65536-${ID}.localhost`,
    `100000-${ID}.localhost`,
    `-1-${ID}.localhost`,
    `8000-.localhost`,
    `8000--${ID}.localhost`,
    `8000-${ID}-.localhost`,
    `8000-sbx_01.localhost`,
    `8000-sbx%2e01.localhost`,
    `8000-${ID}.localhost:`,
    `8000-${ID}.localhost:123456`,
    `8000-${ID}.localhost:80:80`,
    `8000-${ID}.localhost/x`,
    `8000-${ID}.localhost@evil.example.com`,
    `8000-${ID}.localhost evil`,
    `[::1]`,
    `８０００-${ID}.localhost`,
    `8000-${ID}.locälhost`,
    `8000-sbx-ä.localhost`,
    `8000-${ID}.localhost\u0000`,
    `8000-${'a'.repeat(60)}.localhost`, // a label longer than DNS allows
    `8000-${ID}.example.com`, // another domain
    `8000-${ID}.evil-localhost`,
    `8000-${ID}.localhost.example.com`,
    'x'.repeat(400),
  ])('does not route %j', (host) => {
    expect(parsePreviewHost(host)).toBeUndefined();
  });

  it('matches the configured domain only', () => {
    expect(parsePreviewHost(`8000-${ID}.localhost`, 'preview.example.com')).toBeUndefined();
    expect(parsePreviewHost(`8000-${ID}.preview.example.com`, 'preview.example.com')).toEqual({
      port: 8000,
      id: ID,
    });
    expect(parsePreviewHost(`8000-${ID}.x.preview.example.com`, 'preview.example.com')).toBeUndefined();
  });
});

describe('checkPreviewDomain', () => {
  it.each(['localhost', 'preview.example.com', 'a-b.example.com'])('accepts %s', (d) => {
    expect(checkPreviewDomain(d)).toBe(d);
  });
  it.each([
    '',
    'Localhost',
    '.localhost',
    'localhost.',
    'a..b',
    '-a.com',
    'a-.com',
    'ä.com',
    'a_b.com',
    'a:80',
  ])('refuses %j with INVALID_ARGUMENT naming the field', (d) => {
    const e = (() => {
      try {
        checkPreviewDomain(d);
      } catch (x) {
        return x;
      }
    })();
    expect(AirlockError.is(e, 'INVALID_ARGUMENT')).toBe(true);
    expect((e as AirlockError).field).toBe('previewDomain');
  });
});

describe('traffic tokens', () => {
  it('are random, 256 bits, url-safe, and absent for public ports', () => {
    const a = newPreviewAccess();
    const b = newPreviewAccess(false);
    expect(a.publicPorts).toBe(false);
    expect(a.trafficToken).toMatch(/^[A-Za-z0-9_-]{43}$/);
    expect(a.trafficToken).not.toBe(b.trafficToken);
    expect(newPreviewAccess(true)).toEqual({ publicPorts: true });
  });

  it('match only the whole token', () => {
    const t = newPreviewAccess().trafficToken!;
    expect(tokenMatches(t, t)).toBe(true);
    for (const bad of [
      undefined,
      '',
      t.slice(1),
      t + 'x',
      t.toUpperCase() === t ? t.toLowerCase() : t.toUpperCase(),
      ` ${t}`,
    ]) {
      expect(tokenMatches(bad, t)).toBe(false);
    }
    expect(tokenMatches(t, undefined)).toBe(false);
    expect(tokenMatches('', '')).toBe(false); // an empty expected token never opens anything
  });

  it('the table keeps one access per sandbox object and is private by default', () => {
    const table = new PreviewAccessTable();
    const s1 = {};
    const s2 = {};
    const a1 = table.issue(s1, false);
    expect(table.of(s1)).toBe(a1);
    expect(table.issue(s1, true)).toBe(a1); // issued once
    expect(table.issue(s2, true)).toEqual({ publicPorts: true });
    const s3 = {};
    expect(table.of(s3).publicPorts).toBe(false);
    expect(table.of(s3).trafficToken).toBeDefined();
  });
});
