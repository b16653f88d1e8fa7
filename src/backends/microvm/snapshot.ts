// A microVM snapshot's memory: QEMU's migration stream of the stopped VM (guest RAM, which holds the
// whole writable filesystem since the overlay's upper layer is a tmpfs in the guest, plus device
// state) in the mapped-ram format (qemu.ts: each page at its offset, zero pages as holes, so the file
// is sparse and stays so when copied), and a record of the VM it restores into (vm.json). Both sit in the snapshot layer's
// `memory/` dir, root-only (0700 dir, 0600 files), like gVisor's checkpoint images.
//
// SECURITY: QEMU runs as the sandbox's uid and writes the stream into the VM dir, which that uid owns.
// Root takes it from there as untrusted data: opened without following a link, refused unless it is a
// regular file of that uid with one link and a bounded size, and COPIED (never renamed or linked) into
// a root-owned file, so the layer holds no inode the sandbox's uid can reach or change later.
import { createHash } from 'node:crypto';
import {
  closeSync,
  constants,
  fstatSync,
  ftruncateSync,
  openSync,
  readFileSync,
  readSync,
  rmSync,
  writeFileSync,
  writeSync,
} from 'node:fs';
import { join } from 'node:path';
import { z } from 'zod';
import { AirlockError } from '../../core/errors.js';
import { GUEST_KERNEL_BYTES, JAILED } from './qemu.js';
import type { Qmp } from './qmp.js';

/** The migration stream's file name in a snapshot's memory dir. */
export const RAM_FILE = 'ram';
/** The VM record's file name in a snapshot's memory dir. */
export const VM_FILE = 'vm.json';
/** Migration stream bytes beyond the guest's RAM (device state, headers) a snapshot may hold. */
const STREAM_SLACK_BYTES = 64 * 1024 * 1024;
const CHUNK = 4 * 1024 * 1024;
const ZEROS = Buffer.alloc(CHUNK);
/** How long saving a stopped VM's state to its stream may take (TCG, a loaded host, GiBs of RAM). */
export const MIGRATE_TIMEOUT_MS = 300_000;

/** What a restore must reproduce exactly: QEMU refuses a stream whose machine differs. */
export const VmRecordSchema = z
  .object({
    /**
     * 4: the guest agent's STARTED and EXIT frames carry the limit counters (3: an agent whose
     * frames this host refuses; 2: a plain stream, which a QEMU started for mapped-ram refuses;
     * 1: also an agent that cannot take the IDENTITY frame a restore sends).
     */
    version: z.literal(4),
    /** The sandbox memory limit the VM was booted with (its RAM is this plus GUEST_KERNEL_BYTES). */
    memoryBytes: z.number().int().positive(),
    vcpus: z.number().positive(),
    pids: z.number().int().positive(),
    diskBytes: z.number().int().positive(),
    /** Whether the VM has its NIC (a sandbox with a network policy). */
    net: z.boolean(),
    kernel: z.string(),
    initramfs: z.string(),
    rootfs: z.string(),
    /** The agent connection's next request id: ids below it may still be live in the guest. */
    nextId: z.number().int().positive(),
    /** Execs running in the guest when it was saved (they carry on in every fork). */
    processes: z.number().int().nonnegative(),
  })
  .strict();
export type VmRecord = z.output<typeof VmRecordSchema>;

/**
 * Copy QEMU's stream at `vmDir/<name>` into `destDir/ram` (root, 0600) and hash it; the source is
 * removed. `uid` is the sandbox's uid (the only owner the source may have), `ramBytes` the guest's RAM.
 */
export function takeStream(
  vmDir: string,
  name: string,
  uid: number,
  ramBytes: number,
  destDir: string,
  hash: ReturnType<typeof createHash>,
): number {
  const src = join(vmDir, name);
  let fd: number;
  try {
    fd = openSync(src, constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK);
  } catch (e) {
    throw new AirlockError('INTERNAL', `the VM's snapshot stream is missing: ${(e as Error).message}`);
  }
  let out: number | undefined;
  try {
    const st = fstatSync(fd);
    if (!st.isFile() || st.uid !== uid || st.nlink !== 1 || st.size > ramBytes + STREAM_SLACK_BYTES)
      throw new AirlockError('INTERNAL', "the VM's snapshot stream is not a plain file of its own size");
    out = openSync(join(destDir, RAM_FILE), 'wx', 0o600);
    const buf = Buffer.allocUnsafe(CHUNK);
    let total = 0;
    for (;;) {
      const n = readSync(fd, buf, 0, CHUNK, null);
      if (n <= 0) break;
      // Bounded by what was read, not by the size stat said: the file may grow meanwhile.
      if (total + n > ramBytes + STREAM_SLACK_BYTES)
        throw new AirlockError('INTERNAL', "the VM's snapshot stream is larger than its RAM");
      // A chunk of zeros (mapped-ram's holes: the guest's untouched RAM) stays a hole in the copy;
      // the hash frames each chunk by kind and length, so it is a function of the content alone.
      const chunk = buf.subarray(0, n);
      const zero = chunk.equals(ZEROS.subarray(0, n));
      hash.update(`${zero ? 'Z' : 'D'}${n}\0`);
      if (!zero) {
        hash.update(chunk);
        writeSync(out, chunk, 0, n, total);
      }
      total += n;
    }
    ftruncateSync(out, total);
    return total;
  } finally {
    closeSync(fd);
    if (out !== undefined) closeSync(out);
    rmSync(src, { force: true });
  }
}

/** The VM record of a snapshot's memory dir, checked. */
export function readVmRecord(memoryDir: string): VmRecord {
  let raw: unknown;
  try {
    raw = JSON.parse(readFileSync(join(memoryDir, VM_FILE), 'utf8'));
  } catch {
    raw = undefined;
  }
  // A snapshot of an older Airlock holds a guest agent that does not know the IDENTITY frame every
  // restored VM is given (it would power off) or speaks an older frame format, or a plain stream:
  // refused here, before any QEMU starts.
  const version = (raw as { version?: unknown } | undefined)?.version;
  if (version === 1 || version === 2 || version === 3)
    throw new AirlockError(
      'INVALID_SPEC',
      `layers.0: the microVM snapshot in ${memoryDir} was taken by an older Airlock whose guest agent cannot be restored by this one; take the snapshot again`,
      { field: 'layers.0' },
    );
  try {
    return VmRecordSchema.parse(raw);
  } catch (e) {
    throw new AirlockError(
      'INVALID_SPEC',
      `layers.0: the microVM snapshot's VM record in ${memoryDir} is missing or damaged (${(e as Error).message}); take the snapshot again`,
      { field: 'layers.0' },
    );
  }
}

/**
 * Migrate a stopped VM to its spill dir (QEMU writes JAILED.snapshotFile, which is `spillDir`/snapshot
 * outside the jail) and copy the stream out as root into `dir` (RAM_FILE, hashed), with the VM's
 * record beside it (VM_FILE). The VM stays stopped. `gone` says why to stop if the sandbox was killed.
 */
export async function saveStream(
  qmp: Qmp,
  o: {
    readonly spillDir: string;
    readonly uid: number;
    readonly vm: VmRecord;
    readonly dir: string;
    readonly gone: () => string | undefined;
    readonly signal?: AbortSignal;
  },
): Promise<{ bytes: number; hash: string; vm: VmRecord }> {
  await qmp.execute('migrate', { uri: `file:${JAILED.snapshotFile}` });
  await qmp.migrated(MIGRATE_TIMEOUT_MS, o.signal);
  const gone = o.gone();
  if (gone) throw new AirlockError('SANDBOX_GONE', gone);
  const hash = createHash('sha256');
  const ramBytes = o.vm.memoryBytes + GUEST_KERNEL_BYTES;
  const bytes = takeStream(o.spillDir, 'snapshot', o.uid, ramBytes, o.dir, hash);
  const vmJson = JSON.stringify(o.vm);
  hash.update(`\0${vmJson}`);
  writeFileSync(join(o.dir, VM_FILE), vmJson, { mode: 0o600 });
  return { bytes, hash: hash.digest('hex'), vm: o.vm };
}
