// Stale baked boot snapshots are removed (src/backends/microvm/bake.ts prune): an older version of a
// machine after a new bake of it, keys whose kernel, initramfs or rootfs is gone or replaced, keys
// an older Airlock baked (no shape record); and never from under a restore that found its snapshot
// (its stream is open: it reads the whole of it). Real files, no VM needed.
import {
  closeSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  readdirSync,
  rmSync,
  utimesSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { BootSnapshots, bootKey, type BootShape } from '../../src/backends/microvm/bake.js';
import { RAM_FILE, VM_FILE } from '../../src/backends/microvm/snapshot.js';

const base = mkdtempSync(join(tmpdir(), 'airlock-boot-prune-'));
afterAll(() => rmSync(base, { recursive: true, force: true }));

const file = (name: string, text = name): string => {
  const p = join(base, name);
  writeFileSync(p, text);
  return p;
};
const kernel = file('vmlinuz');
const [agent1, agent2, rootfs] = [file('initramfs-1'), file('initramfs-2'), file('rootfs')];
const machine: BootShape = {
  kernel,
  initramfs: agent1,
  rootfs,
  memoryBytes: 512 << 20,
  vcpus: 1,
  diskBytes: 512 << 20,
  net: false,
  qemu: file('qemu'),
  qemuVersion: '10.0.2',
  accel: 'tcg',
};
const RAM = Buffer.alloc(3 << 20, 0x42);

let n = 0;
const boots = new BootSnapshots(join(base, 'microvm-boot'), () => join(base, `tmp-${n++}`));
const keys = (): string[] => readdirSync(boots.root).sort();

/** Bake `shape` as the backend does: claim, fill the temp dir, commit. */
function bake(shape: BootShape): string {
  const key = bootKey(shape);
  const claim = boots.claim(key, shape)!;
  writeFileSync(join(claim.dir, RAM_FILE), RAM, { mode: 0o600 });
  const { kernel, initramfs, rootfs, memoryBytes, vcpus, diskBytes, net } = shape;
  const vm = { version: 4, kernel, initramfs, rootfs, memoryBytes, vcpus, diskBytes, net };
  Object.assign(vm, { pids: 256, nextId: 1, processes: 0 });
  writeFileSync(join(claim.dir, VM_FILE), JSON.stringify(vm), { mode: 0o600 });
  claim.commit();
  return key;
}

describe('microVM baked boot snapshots: stale ones are removed', () => {
  it('a bake removes the older versions of its machine and keeps the other machines', () => {
    const old = bake(machine);
    const other = bake({ ...machine, memoryBytes: 256 << 20 });
    const withNic = bake({ ...machine, net: true });
    expect(keys()).toEqual([old, other, withNic].sort());
    // A new agent (initramfs): same machine, another key. Its bake removes the old one only.
    const fresh = bake({ ...machine, initramfs: agent2 });
    expect(keys()).toEqual([fresh, other, withNic].sort());
    // So does a QEMU upgrade (the old stream would never be restored again).
    const upgraded = bake({ ...machine, initramfs: agent2, qemuVersion: '10.1.0' });
    expect(keys()).toEqual([upgraded, other, withNic].sort());
    expect(boots.prune()).toEqual([]); // all current
  });

  it('keys whose inputs are gone or replaced, or that an older Airlock baked, are removed', () => {
    const before = keys();
    // A key of a rootfs that is gone.
    const gone = file('rootfs-gone');
    const lost = bake({ ...machine, rootfs: gone });
    rmSync(gone);
    // An older Airlock's key: no shape record. And a prune that died half-way.
    mkdirSync(join(boots.root, 'a'.repeat(32)));
    writeFileSync(join(boots.root, 'a'.repeat(32), RAM_FILE), RAM);
    mkdirSync(join(boots.root, '.trash-0123456789ab'));
    expect(boots.prune().sort()).toEqual(['a'.repeat(32), lost].sort());
    expect(keys()).toEqual(before);
    // setup.sh replaced the kernel (same path, another mtime): every key of it is stale.
    utimesSync(kernel, new Date(), new Date(Date.now() + 60_000));
    expect(boots.prune().sort()).toEqual(before);
    expect(keys()).toEqual([]);
  });

  it('a restore that found its snapshot reads all of it even when it is pruned meanwhile', () => {
    const key = bake(machine);
    const found = boots.find(key)!;
    expect(found.vm.nextId).toBe(1);
    const newer = bake({ ...machine, initramfs: agent2 }); // prunes `key` from under the restore
    expect(keys()).toEqual([newer]);
    try {
      expect(readFileSync(found.ramFd).equals(RAM)).toBe(true);
    } finally {
      closeSync(found.ramFd);
    }
    // A restore that comes after the prune finds nothing (and boots cold).
    expect(boots.find(key)).toBeUndefined();
  });
});
