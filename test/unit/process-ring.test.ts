// The output ring of a background process keeps the newest bytes of each stream within its cap,
// whatever the sizes of the reads that filled it.
import { describe, expect, it } from 'vitest';
import { keepNewest } from '../../src/server/local-processes.js';

type Ev = { type: 'stdout' | 'stderr'; data: string };
const b64 = (s: string): string => Buffer.from(s).toString('base64');
const raw = (ring: Ev[], type: Ev['type']): string =>
  Buffer.concat(ring.filter((e) => e.type === type).map((e) => Buffer.from(e.data, 'base64'))).toString();

function fill(chunks: Ev[], max: number): { ring: Ev[]; bytes: { stdout: number; stderr: number } } {
  const ring: Ev[] = [];
  const bytes = { stdout: 0, stderr: 0 };
  for (const c of chunks) keepNewest(ring, bytes, c, max);
  return { ring, bytes };
}

describe('process output ring', () => {
  it('keeps the tail of a single read bigger than the cap (it used to drop it whole)', () => {
    const big = 'a'.repeat(100_000) + '\nEND\n';
    const { ring, bytes } = fill([{ type: 'stdout', data: b64(big) }], 1024);
    const kept = raw(ring, 'stdout');
    expect(kept.endsWith('END\n')).toBe(true);
    expect(big.endsWith(kept)).toBe(true);
    expect(bytes.stdout).toBeLessThanOrEqual(1024);
    expect(bytes.stdout).toBeGreaterThan(1024 - 8);
    expect(bytes.stdout).toBe(ring.reduce((n, e) => n + e.data.length, 0));
  });

  it('trims the oldest event of the stream, and keeps the other stream untouched', () => {
    const chunks: Ev[] = [];
    let all = '';
    for (let i = 0; i < 200; i++) {
      const s = `line ${i} ${'x'.repeat(i % 37)}\n`;
      all += s;
      chunks.push({ type: 'stdout', data: b64(s) });
      if (i % 50 === 0) chunks.push({ type: 'stderr', data: b64(`err ${i}\n`) });
    }
    const { ring, bytes } = fill(chunks, 500);
    const kept = raw(ring, 'stdout');
    expect(all.endsWith(kept)).toBe(true);
    expect(kept.endsWith('line 199 ' + 'x'.repeat(199 % 37) + '\n')).toBe(true);
    expect(bytes.stdout).toBeLessThanOrEqual(500);
    expect(bytes.stdout).toBeGreaterThan(500 - 60); // only the straddling event lost whole groups
    expect(raw(ring, 'stderr')).toBe('err 0\nerr 50\nerr 100\nerr 150\n');
    // Events stay in arrival order across streams.
    expect(ring.at(-1)!.type).toBe('stdout');
  });

  it('handles padded base64 (lengths that are not a multiple of 3) without reading past the start', () => {
    for (let n = 1; n < 40; n++) {
      const s = 'b'.repeat(n) + 'Z';
      const { ring, bytes } = fill([{ type: 'stderr', data: b64(s) }], 8);
      const kept = raw(ring, 'stderr');
      expect(s.endsWith(kept)).toBe(true);
      expect(bytes.stderr).toBeLessThanOrEqual(8);
      if (kept.length > 0) expect(kept.endsWith('Z')).toBe(true);
    }
  });
});
