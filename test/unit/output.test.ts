// OutputCapture on synthetic streams: bounded head + tail in memory, the full stream in a spill file,
// the producer paused while the spill file catches up. No sandboxes, no timing assertions.
import { createHash } from 'node:crypto';
import { existsSync, mkdtempSync, readFileSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { collectBytes, OutputCapture, type CaptureOptions } from '../../src/sandbox/output.js';

const MiB = 1024 * 1024;

let dir: string;
let n = 0;
beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), 'airlock-output-test-'));
});
afterAll(() => {
  rmSync(dir, { recursive: true, force: true });
});

function lines(count: number): string {
  let s = '';
  for (let i = 1; i <= count; i++) s += `line ${i}\n`;
  return s;
}

/** `data` cut into chunks of `size` bytes (the last one shorter). */
function chunked(data: Buffer, size: number): Buffer[] {
  const out: Buffer[] = [];
  for (let i = 0; i < data.length; i += size) out.push(Buffer.from(data.subarray(i, i + size)));
  return out;
}

function source(chunks: Buffer[]): Readable {
  return Readable.from(chunks, { objectMode: false });
}

interface Run {
  capture: OutputCapture;
  spillCalls: number;
  spillFile: string;
  texts: string[];
}

function start(src: Readable, o: Partial<CaptureOptions> = {}): Run {
  const spillFile = join(dir, `spill-${++n}`);
  const run: Run = { capture: undefined as unknown as OutputCapture, spillCalls: 0, spillFile, texts: [] };
  run.capture = new OutputCapture(src, {
    maxBytes: 100,
    maxSpillBytes: 1024 * MiB,
    name: 'stdout',
    spillPath: () => {
      run.spillCalls++;
      return spillFile;
    },
    onText: (t) => run.texts.push(t),
    ...o,
  });
  return run;
}

describe('OutputCapture below the limit', () => {
  it('keeps everything and spills nothing', async () => {
    const run = start(source([Buffer.from('hello '), Buffer.from('world\n')]), { maxBytes: 64 });
    const r = await run.capture.finish();
    expect(r).toEqual({ text: 'hello world\n', truncated: false, totalBytes: 12 });
    expect(run.spillCalls).toBe(0);
    expect(existsSync(run.spillFile)).toBe(false);
  });

  it('is not truncated at exactly the limit', async () => {
    const data = Buffer.alloc(100, 'a');
    const r = await start(source(chunked(data, 33))).capture.finish();
    expect(r).toEqual({ text: data.toString(), truncated: false, totalBytes: 100 });
  });

  it('handles an empty stream', async () => {
    const run = start(source([]));
    expect(await run.capture.finish()).toEqual({ text: '', truncated: false, totalBytes: 0 });
    expect(run.texts).toEqual([]);
  });

  it('finishes on a stream that ended and closed before it was attached (no hang)', async () => {
    // A pipe whose process was killed while starting reaches EOF before anyone listens.
    const src = new Readable({ read: () => src.push(null) });
    src.resume();
    await new Promise((r) => src.once('close', r));
    expect(src.readableEnded && src.destroyed).toBe(true);
    const r = await start(src).capture.finish();
    expect(r).toEqual({ text: '', truncated: false, totalBytes: 0 });
  });
});

describe('OutputCapture above the limit', () => {
  const input = Buffer.from(lines(2000));

  it.each([1, 7, 50, 99, 100, 101, 4096, input.length])(
    'keeps head and tail, marks the cut, spills everything (chunks of %d)',
    async (size) => {
      const run = start(source(chunked(input, size)), { maxBytes: 100 });
      const r = await run.capture.finish();
      expect(r.truncated).toBe(true);
      expect(r.totalBytes).toBe(input.length);
      expect(r.spillPath).toBe(run.spillFile);
      expect(run.spillCalls).toBe(1);
      const text = input.toString();
      expect(r.text.startsWith(text.slice(0, 50))).toBe(true);
      expect(r.text.endsWith(text.slice(-50))).toBe(true);
      const marker = r.text.slice(50, -50);
      expect(marker).toContain(`${input.length - 100} bytes of stdout omitted (${input.length} total)`);
      expect(marker).toContain(`full output in ${run.spillFile}`);
      expect(marker).not.toContain('line 1000\n');
      expect(readFileSync(run.spillFile).equals(input)).toBe(true);
      expect(run.texts.join('')).toBe(text);
    },
  );

  it('splits an odd limit into head and tail that add up to it', async () => {
    const r = await start(source(chunked(input, 10)), { maxBytes: 101 }).capture.finish();
    const text = input.toString();
    expect(r.text.startsWith(text.slice(0, 50))).toBe(true);
    expect(r.text.endsWith(text.slice(-51))).toBe(true);
    expect(r.text).toContain(`${input.length - 101} bytes of stdout omitted`);
  });

  it('truncates at one byte over the limit', async () => {
    const data = Buffer.alloc(101, 'b');
    const run = start(source([data]), { maxBytes: 100 });
    const r = await run.capture.finish();
    expect(r.truncated).toBe(true);
    expect(r.text).toContain('1 bytes of stdout omitted (101 total)');
    expect(readFileSync(run.spillFile).equals(data)).toBe(true);
  });

  it('names the stream in the marker', async () => {
    const r = await start(source([input]), { name: 'stderr' }).capture.finish();
    expect(r.text).toContain('bytes of stderr omitted');
  });

  it('caps the spill file at maxSpillBytes', async () => {
    const data = Buffer.from(lines(5000));
    const run = start(source(chunked(data, 333)), { maxBytes: 100, maxSpillBytes: 1000 });
    const r = await run.capture.finish();
    expect(r.truncated).toBe(true);
    expect(r.totalBytes).toBe(data.length);
    expect(readFileSync(run.spillFile).equals(data.subarray(0, 1000))).toBe(true);
    expect(r.text).toContain(`first 1000 bytes in ${run.spillFile}`);
    expect(r.text.endsWith(data.toString().slice(-50))).toBe(true);
  });

  it('caps the spill file even below maxBytes', async () => {
    const run = start(source(chunked(input, 64)), { maxBytes: 100, maxSpillBytes: 10 });
    const r = await run.capture.finish();
    expect(readFileSync(run.spillFile).equals(input.subarray(0, 10))).toBe(true);
    expect(r.text).toContain('first 10 bytes in');
  });

  it('says so when the spill file cannot be written, without hanging', async () => {
    const run = start(source(chunked(input, 500)), { spillPath: () => join(dir, 'no-such-dir', 'spill') });
    const r = await run.capture.finish();
    expect(r.truncated).toBe(true);
    expect(r.spillPath).toBeUndefined();
    expect(r.text).toContain('could not be written');
    expect(r.text.startsWith(input.toString().slice(0, 50))).toBe(true);
  }, 10_000);
});

describe('OutputCapture and UTF-8', () => {
  const text = '€😀ab'.repeat(300) + 'é';
  const data = Buffer.from(text);

  it('reassembles characters split across chunks', async () => {
    const run = start(source(chunked(data, 1)), { maxBytes: 64_000 });
    const r = await run.capture.finish();
    expect(r.text).toBe(text);
    expect(run.texts.join('')).toBe(text);
  });

  it.each([1, 2, 3, 5, 7])(
    'does not throw when a cut falls inside a character (chunks of %d)',
    async (size) => {
      for (const maxBytes of [64, 65, 66, 67, 100, 101]) {
        const run = start(source(chunked(data, size)), { maxBytes });
        const r = await run.capture.finish();
        expect(r.truncated).toBe(true);
        expect(typeof r.text).toBe('string');
        expect(r.text.startsWith('€😀ab€😀ab')).toBe(true);
        expect(r.text.endsWith('€😀abé')).toBe(true);
        expect(run.texts.join('')).toBe(text);
        expect(readFileSync(run.spillFile).equals(data)).toBe(true);
      }
    },
  );

  it('flushes an incomplete character at the end of the stream', async () => {
    const cut = Buffer.concat([Buffer.from('ok'), Buffer.from('😀').subarray(0, 2)]);
    const run = start(source([cut]), { maxBytes: 1000 });
    const r = await run.capture.finish();
    expect(r.text.startsWith('ok')).toBe(true);
    expect(run.texts.join('')).toBe(cut.toString('utf8'));
  });
});

describe('OutputCapture and a throwing callback', () => {
  it('keeps the exception out of the stream and keeps the output', async () => {
    // On a real pipe an exception thrown from a 'data' listener is an uncaught exception: it would
    // take the whole host process down because a caller's onStdout had a bug.
    const src = new Readable({ read() {} });
    const run = start(src, {
      maxBytes: 1000,
      onText: () => {
        throw new Error('bug in the caller');
      },
    });
    await new Promise((r) => setImmediate(r)); // flowing: push() now emits 'data' synchronously
    let escaped: unknown;
    try {
      src.push(Buffer.from('hello\n'));
    } catch (e) {
      escaped = e;
    }
    src.push(null);
    const r = await run.capture.finish();
    expect(escaped).toBeUndefined();
    expect(r.text).toBe('hello\n');
  });
});

describe('OutputCapture and a failing source', () => {
  it('finishes with what arrived before the error', async () => {
    let sent = false;
    const src = new Readable({
      read() {
        if (!sent) {
          sent = true;
          this.push(Buffer.from('partial\n'));
        } else {
          this.destroy(new Error('source broke'));
        }
      },
    });
    const r = await start(src, { maxBytes: 1000 }).capture.finish();
    expect(r.text).toBe('partial\n');
    expect(r.truncated).toBe(false);
  });
});

describe('OutputCapture backpressure', () => {
  it('streams 50 MB with bounded memory and an exact spill file', async () => {
    const total = 50 * MiB;
    const chunkSize = 64 * 1024;
    const hash = createHash('sha256');
    let produced = 0;
    let maxInFlight = 0;
    let spillFile = '';
    let seed = 0;
    const src = new Readable({
      read() {
        if (produced >= total) {
          this.push(null);
          return;
        }
        // Bytes produced but not yet on disk: what a missing backpressure would pile up in memory.
        const onDisk = spillFile && existsSync(spillFile) ? statSync(spillFile).size : 0;
        maxInFlight = Math.max(maxInFlight, produced - onDisk);
        const chunk = Buffer.alloc(chunkSize, (seed++ % 251) + 1);
        chunk.writeUInt32BE(seed, 0);
        hash.update(chunk);
        produced += chunk.length;
        this.push(chunk);
      },
    });
    const run = start(src, { maxBytes: 64_000, onText: undefined });
    spillFile = run.spillFile;
    const r = await run.capture.finish();
    expect(r.truncated).toBe(true);
    expect(r.totalBytes).toBe(total);
    expect(statSync(spillFile).size).toBe(total);
    expect(createHash('sha256').update(readFileSync(spillFile)).digest('hex')).toBe(hash.digest('hex'));
    expect(r.text.length).toBeLessThan(64_000 + 400);
    expect(maxInFlight).toBeLessThan(8 * MiB);
    rmSync(spillFile, { force: true });
  }, 60_000);
});

describe('OutputCapture backpressure, many chunks at once', () => {
  it('waits for one drain at a time when the spill file starts with many chunks (no listener pile-up)', async () => {
    // 16 chunks of 64 KiB are kept in memory up to maxBytes, then written to the spill file at once:
    // each write past the file stream's buffer says "wait for drain"; one wait is enough.
    const warnings: Error[] = [];
    const onWarning = (w: Error): void => void warnings.push(w);
    process.on('warning', onWarning);
    try {
      const data = Buffer.alloc(4 * MiB);
      for (let i = 0; i < data.length; i += 4) data.writeUInt32BE(i, i);
      const run = start(source(chunked(data, 64 * 1024)), { maxBytes: MiB, onText: undefined });
      const r = await run.capture.finish();
      expect(r.truncated).toBe(true);
      expect(readFileSync(run.spillFile).equals(data)).toBe(true);
      await new Promise((resolve) => setImmediate(resolve)); // warnings are emitted on the next tick
      expect(warnings.map((w) => `${w.name}: ${w.message}`)).toEqual([]);
    } finally {
      process.off('warning', onWarning);
    }
  });
});

describe('collectBytes', () => {
  it('collects up to the cap, inclusive', async () => {
    const data = Buffer.from('0123456789');
    expect((await collectBytes(source(chunked(data, 3)), 10))?.equals(data)).toBe(true);
    expect((await collectBytes(source(chunked(data, 3)), 100))?.equals(data)).toBe(true);
    expect((await collectBytes(source([]), 0))?.length).toBe(0);
  });

  it('returns undefined past the cap, after draining the source', async () => {
    let ended = false;
    const src = source(chunked(Buffer.alloc(10_000, 1), 100));
    src.on('end', () => (ended = true));
    expect(await collectBytes(src, 9_999)).toBeUndefined();
    expect(ended).toBe(true);
  });
});
