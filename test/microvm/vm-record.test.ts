// The record beside a microVM snapshot's memory (vm.json) is read strictly: a damaged record and a
// record of an older Airlock (whose guest agent cannot take the IDENTITY frame a restore sends) are
// typed refusals before any QEMU starts. No VM needed.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { VM_FILE, readVmRecord } from '../../src/backends/microvm/snapshot.js';

const dir = mkdtempSync(join(tmpdir(), 'airlock-vm-record-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const record = {
  version: 2,
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

  it('refuses a record of an older Airlock (version 1) with a message saying to take it again', () => {
    write({ ...record, version: 1 });
    expect(() => readVmRecord(dir)).toThrow(
      expect.objectContaining({
        code: 'INVALID_SPEC',
        message: expect.stringMatching(/older Airlock.*take the snapshot again/),
      }),
    );
  });

  it('refuses damaged, unknown-field and unknown-version records', () => {
    for (const bad of [
      '{',
      '',
      'null',
      { ...record, version: 3 },
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
