// Human units ("256m", "30s") parse strictly: a typo is an INVALID_ARGUMENT naming the field, never 0.
import { describe, expect, it } from 'vitest';
import { AirlockError } from '../../src/core/errors.js';
import { formatBytes, parseBytes, parseDurationMs } from '../../src/core/units.js';

const KiB = 1024;
const MiB = 1024 * KiB;
const GiB = 1024 * MiB;
const TiB = 1024 * GiB;

function thrown(f: () => unknown): AirlockError {
  try {
    f();
  } catch (e) {
    if (AirlockError.isInstance(e)) return e;
    throw e;
  }
  return expect.fail('expected an AirlockError');
}

describe('parseBytes', () => {
  it.each([
    ['0', 0],
    ['512', 512],
    ['512b', 512],
    ['1k', KiB],
    ['1K', KiB],
    ['1kb', KiB],
    ['1KiB', KiB],
    ['1.5m', 1.5 * MiB],
    ['256m', 256 * MiB],
    ['256MB', 256 * MiB],
    ['256 MiB', 256 * MiB],
    [' 2g ', 2 * GiB],
    ['2GiB', 2 * GiB],
    ['1t', TiB],
    ['1tib', TiB],
    ['0.5k', 512],
    ['1.0001k', 1024], // whole bytes, rounded down
  ])('%j → %d', (text, bytes) => {
    expect(parseBytes(text)).toBe(bytes);
  });

  it.each([
    '',
    ' ',
    'abc',
    'm',
    '-1',
    '-1m',
    '1x',
    '1 m b',
    '1e3',
    '1.5.3',
    '.5m',
    '1,5m',
    '1pb',
    '0x10',
    '1m!',
  ])('rejects %j', (text) => {
    const e = thrown(() => parseBytes(text));
    expect(e.code).toBe('INVALID_ARGUMENT');
    expect(e.field).toBe('size');
    expect(e.message).toContain(`"${text}"`);
  });

  it('names the field it was given', () => {
    const e = thrown(() => parseBytes('lots', '--memory'));
    expect(e.field).toBe('--memory');
    expect(e.message).toMatch(/^--memory: /);
    expect(e.message).toMatch(/256m/); // says what a valid value looks like
  });
});

describe('parseDurationMs', () => {
  it.each([
    ['0s', 0],
    ['500ms', 500],
    ['500MS', 500],
    ['30s', 30_000],
    ['1.5s', 1500],
    ['2m', 120_000],
    ['2M', 120_000],
    ['1h', 3_600_000],
    [' 10 s ', 10_000],
    ['0.5ms', 0],
    ['1.0005s', 1000],
  ])('%j → %d ms', (text, ms) => {
    expect(parseDurationMs(text)).toBe(ms);
  });

  it.each(['', 'abc', 's', '1d', '1sec', '-1s', '1 h m', '1e3ms', '1.2.3s', 'ms10', '1,5s', '10min'])(
    'rejects %j',
    (text) => {
      const e = thrown(() => parseDurationMs(text));
      expect(e.code).toBe('INVALID_ARGUMENT');
      expect(e.field).toBe('duration');
      expect(e.message).toContain(`"${text}"`);
    },
  );

  it.each([
    ['30', 'write 30s or 30000ms'],
    ['0', 'write 0s or 0ms'],
    [' 5 ', 'write 5s or 5000ms'],
    ['1.5', 'write 1.5s or 1500ms'],
  ])('refuses %j (no unit) and says what to write', (text, hint) => {
    const e = thrown(() => parseDurationMs(text, '--timeout'));
    expect(e.code).toBe('INVALID_ARGUMENT');
    expect(e.field).toBe('--timeout');
    expect(e.message).toContain(hint);
  });

  it('names the field it was given', () => {
    const e = thrown(() => parseDurationMs('forever', '--ttl'));
    expect(e.field).toBe('--ttl');
    expect(e.message).toMatch(/^--ttl: /);
  });
});

describe('formatBytes', () => {
  it.each([
    [0, '0 B'],
    [1023, '1023 B'],
    [1024, '1.0 KiB'],
    [1536, '1.5 KiB'],
    [10 * KiB, '10 KiB'],
    [64 * MiB, '64 MiB'],
    [1.25 * GiB, '1.3 GiB'],
    [5 * GiB, '5.0 GiB'],
    [2048 * TiB, '2048 TiB'],
  ])('%d → %j', (n, text) => {
    expect(formatBytes(n)).toBe(text);
  });

  it('round-trips through parseBytes for whole units', () => {
    for (const n of [10 * KiB, 512 * MiB, 16 * GiB]) {
      expect(parseBytes(formatBytes(n).replace(' ', ''))).toBe(n);
    }
  });
});
