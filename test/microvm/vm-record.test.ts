// The record beside a microVM snapshot's memory (vm.json) is read strictly: a damaged record and a
// record of an older Airlock (whose guest agent cannot take the IDENTITY frame a restore sends) are
// typed refusals before any QEMU starts. No VM needed.
import { createHash } from 'node:crypto';
import {
  closeSync,
  mkdtempSync,
  openSync,
  readFileSync,
  rmSync,
  statSync,
  writeFileSync,
  writeSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { RAM_FILE, VM_FILE, readVmRecord, takeStream } from '../../src/backends/microvm/snapshot.js';

const dir = mkdtempSync(join(tmpdir(), 'airlock-vm-record-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const record = {
  version: 4,
  memoryBytes: 256 << 20,
  vcpus: 1,
  pids: 256,
  diskBytes: 64 << 20,
  net: false,
  kernel: '/k',
  initramfs: '/i',
  rootfs: '/r',
  nextId: 7,
  processes: 0,
};
const write = (v: unknown): void =>
  writeFileSync(join(dir, VM_FILE), typeof v === 'string' ? v : JSON.stringify(v));

describe('microVM snapshot record', () => {
  it('reads a current record', () => {
    write(record);
    expect(readVmRecord(dir)).toEqual(record);
  });

  it('refuses a record of an older Airlock (version 1: no IDENTITY; 2: a plain stream; 3: older STARTED and EXIT frames) with a message saying to take it again', () => {
    for (const version of [1, 2, 3]) {
      write({ ...record, version });
      expect(() => readVmRecord(dir)).toThrow(
        expect.objectContaining({
          code: 'INVALID_SPEC',
          message: expect.stringMatching(/older Airlock.*take the snapshot again/),
        }),
      );
    }
  });

  it('refuses damaged, unknown-field and unknown-version records', () => {
    for (const bad of [
      '{',
      '',
      'null',
      { ...record, version: 5 },
      { ...record, extra: 1 },
      { ...record, vcpus: -1 },
    ]) {
      write(bad);
      expect(() => readVmRecord(dir)).toThrow(
        expect.objectContaining({
          code: 'INVALID_SPEC',
          message: expect.stringMatching(/missing or damaged/),
        }),
      );
    }
    rmSync(join(dir, VM_FILE));
    expect(() => readVmRecord(dir)).toThrow(expect.objectContaining({ code: 'INVALID_SPEC' }));
  });
});

describe('microVM snapshot stream copy', () => {
  const MiB = 1 << 20;
  /** A stream as QEMU's mapped-ram writes it: some pages, holes between, `size` bytes long. */
  const stream = (name: string, size: number, sparse: boolean): string => {
    const src = join(dir, name);
    const fd = openSync(src, 'wx', 0o600);
    if (!sparse) writeSync(fd, Buffer.alloc(size), 0, size, 0);
    writeSync(fd, Buffer.from('header'), 0, 6, 0);
    writeSync(fd, Buffer.alloc(4096, 7), 0, 4096, 12 * MiB + 123);
    if (sparse) writeSync(fd, Buffer.alloc(1), 0, 1, size - 1); // the size, zero at the end
    closeSync(fd);
    return name;
  };
  const take = (name: string): { dest: string; bytes: number; hash: string } => {
    const dest = mkdtempSync(join(dir, 'dest-'));
    const h = createHash('sha256');
    const bytes = takeStream(dir, name, process.getuid!(), 64 * MiB, dest, h);
    return { dest: join(dest, RAM_FILE), bytes, hash: h.digest('hex') };
  };

  it('keeps the holes of a mapped-ram stream, its content and its size; the hash depends on the content only', () => {
    const size = 20 * MiB + 5;
    const sparse = take(stream('sparse', size, true));
    const dense = take(stream('dense', size, false));
    expect(sparse.bytes).toBe(size);
    expect(statSync(sparse.dest).size).toBe(size);
    // Only the written 4 MiB chunks take disk blocks (the header's and the page's).
    expect(statSync(sparse.dest).blocks * 512).toBeLessThanOrEqual(8 * MiB);
    expect(readFileSync(sparse.dest).equals(readFileSync(dense.dest))).toBe(true);
    expect(sparse.hash).toBe(dense.hash);
    const other = take(stream('other', size + 1, true));
    expect(other.hash).not.toBe(sparse.hash);
  });

  it('refuses a stream larger than the RAM it may hold, counting its holes', () => {
    expect(() => take(stream('huge', 200 * MiB, true))).toThrow(
      expect.objectContaining({ code: 'INTERNAL' }),
    );
  });
});
