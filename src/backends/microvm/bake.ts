// Baked boot snapshots: a create of the microVM tier restores a VM saved once, right after its agent
// said hello and before any sandbox identity was given to it, instead of booting a guest kernel (as
// Firecracker-based services do). One per machine shape: the kernel, the initramfs (agent), the rootfs,
// the RAM, vCPUs, the disk (the guest's tmpfs size is fixed at boot), whether it has a NIC, the QEMU
// version and the accelerator — a QEMU stream only restores into the same machine.
//
// Lazy: the first create of a shape boots cold and saves its VM before it becomes that sandbox (it
// costs that one create a migration; a separate bake VM would cost a whole extra boot, which TCG
// makes the dearer of the two). Stored root-only (dir 0700, files 0600) in <stateDir>/microvm-boot/
// <key>/{ram,vm.json}, written in a temp dir and renamed into place: two creates racing make one
// snapshot (in one process only one claims the bake; across processes the second rename loses and
// its copy is dropped). A snapshot QEMU refuses is discarded by the caller, which boots cold and
// bakes again (index.ts). The writable disk is the guest's tmpfs, so it lives in the saved RAM:
// every restore gets its own copy of it.
//
// Stale snapshots (prune): each key records the shape it was baked from (shape.json). A key is removed
// when its inputs no longer give that key (the kernel, initramfs or rootfs gone or replaced, an older
// BAKE_FORMAT, no shape record: an older Airlock's), and after a bake, when it is an older version of
// the same machine (same RAM, vCPUs, disk, NIC, rootfs, QEMU and accelerator; another kernel, agent or
// QEMU version), which no create of this Airlock restores again. Race-safe with a restore: find() opens
// the stream before it returns, and an open file stays readable after its unlink; prune renames a key
// out of the way before deleting it, so a reader sees a whole snapshot or none (and boots cold).
import { createHash, randomBytes } from 'node:crypto';
import {
  closeSync,
  existsSync,
  mkdirSync,
  openSync,
  readdirSync,
  readFileSync,
  renameSync,
  rmSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import { join } from 'node:path';
import { z } from 'zod';
import { AirlockError } from '../../core/errors.js';
import { Qmp } from './qmp.js';
import { RAM_FILE, VM_FILE, readVmRecord, type VmRecord } from './snapshot.js';

/** Bumped when what a baked VM holds changes (the agent's boot steps, the record's shape). */
const BAKE_FORMAT = 'microvm-boot-v5';
/** The shape a key was baked from (beside ram and vm.json), read back by prune(). */
const SHAPE_FILE = 'shape.json';
/** A key being removed (renamed out of the way first): never a key, removed by the next prune. */
const TRASH_PREFIX = '.trash-';

/** Everything a restore must match: a change to any of these makes another snapshot. */
export interface BootShape {
  readonly kernel: string;
  readonly initramfs: string;
  readonly rootfs: string;
  readonly memoryBytes: number;
  readonly vcpus: number;
  readonly diskBytes: number;
  readonly net: boolean;
  readonly qemu: string;
  readonly qemuVersion: string;
  readonly accel: string;
}

const BootShapeSchema = z
  .object({
    format: z.literal(BAKE_FORMAT),
    kernel: z.string(),
    initramfs: z.string(),
    rootfs: z.string(),
    memoryBytes: z.number(),
    vcpus: z.number(),
    diskBytes: z.number(),
    net: z.boolean(),
    qemu: z.string(),
    qemuVersion: z.string(),
    accel: z.string(),
  })
  .strict();

/** The machine a shape describes, as QEMU is given it: whatever kernel, agent and QEMU version. */
function machineParts(s: BootShape): string[] {
  return [
    s.rootfs,
    String(Math.floor(s.memoryBytes)),
    String(Math.max(1, Math.ceil(s.vcpus))),
    String(Math.floor(s.diskBytes)),
    String(s.net),
    s.qemu,
    s.accel,
  ];
}

/** Whether two shapes are the same machine (a newer bake of it replaces the older). */
function sameMachine(a: BootShape, b: BootShape): boolean {
  return machineParts(a).join('\0') === machineParts(b).join('\0');
}

/** The snapshot's key: a digest of the shape (the kernel also by size and mtime: setup may replace it). */
export function bootKey(s: BootShape): string {
  const k = statSync(s.kernel);
  const parts = [
    BAKE_FORMAT,
    s.kernel,
    String(k.size),
    String(k.mtimeMs),
    s.initramfs,
    s.qemuVersion,
    ...machineParts(s),
  ];
  return createHash('sha256').update(parts.join('\0')).digest('hex').slice(0, 32);
}

/** A bake in progress: fill `dir` (ram, vm.json), then commit or abort. */
export interface BakeClaim {
  readonly dir: string;
  commit(): void;
  abort(): void;
}

export class BootSnapshots {
  private readonly claimed = new Set<string>();

  /**
   * `root`: <stateDir>/microvm-boot. `tmpDir` names a temp dir for a bake: the layer store's root
   * and its capture naming, so its reaper removes a bake Airlock died in (same filesystem: rename).
   */
  constructor(
    readonly root: string,
    private readonly tmpDir: () => string,
  ) {}

  /**
   * The baked VM of `key` with its stream already open (`ramFd`, the caller closes it: a prune
   * meanwhile cannot take it away), or undefined (a damaged record is discarded here).
   */
  find(key: string): { memoryDir: string; vm: VmRecord; ramFd: number } | undefined {
    const memoryDir = join(this.root, key);
    let ramFd: number;
    try {
      ramFd = openSync(join(memoryDir, RAM_FILE), 'r');
    } catch {
      return undefined; // not baked (or pruned just now)
    }
    try {
      return { memoryDir, vm: readVmRecord(memoryDir), ramFd };
    } catch {
      closeSync(ramFd);
      if (existsSync(memoryDir)) this.discard(key);
      return undefined;
    }
  }

  /** Drop a snapshot QEMU refused (or whose record is damaged): the next cold boot bakes it again. */
  discard(key: string): void {
    rmSync(join(this.root, key), { recursive: true, force: true });
  }

  /**
   * Claim the bake of `key` (the digest of `shape`), unless it exists or this process is baking it
   * already. A committed bake prunes the older versions of its machine.
   */
  claim(key: string, shape: BootShape): BakeClaim | undefined {
    if (this.claimed.has(key) || existsSync(join(this.root, key))) return undefined;
    this.claimed.add(key);
    const dir = this.tmpDir();
    mkdirSync(dir, { recursive: true, mode: 0o700 });
    const record: z.input<typeof BootShapeSchema> = { format: BAKE_FORMAT, ...shape };
    writeFileSync(join(dir, SHAPE_FILE), JSON.stringify(BootShapeSchema.parse(record)), { mode: 0o600 });
    const done = (): void => {
      this.claimed.delete(key);
      rmSync(dir, { recursive: true, force: true });
    };
    return {
      dir,
      commit: () => {
        try {
          if (!existsSync(join(dir, RAM_FILE)) || !existsSync(join(dir, VM_FILE)))
            throw new AirlockError('INTERNAL', 'a baked boot snapshot was committed half-written');
          mkdirSync(this.root, { recursive: true, mode: 0o700 });
          // Fails (ENOTEMPTY/EEXIST) when another process renamed its copy first: keep theirs.
          renameSync(dir, join(this.root, key));
          this.prune(shape);
        } catch (e) {
          const code = (e as NodeJS.ErrnoException).code;
          if (code !== 'ENOTEMPTY' && code !== 'EEXIST') throw e;
        } finally {
          done();
        }
      },
      abort: done,
    };
  }

  /**
   * Remove stale snapshots (see the top of this file): keys whose inputs no longer give that key,
   * and, given the shape just baked, the other keys of the same machine. Returns the keys removed.
   */
  prune(baked?: BootShape): string[] {
    let names: string[];
    try {
      names = readdirSync(this.root);
    } catch {
      return []; // nothing baked yet
    }
    const current = baked && bootKey(baked);
    const removed: string[] = [];
    for (const name of names) {
      const path = join(this.root, name);
      if (name.startsWith(TRASH_PREFIX)) {
        rmSync(path, { recursive: true, force: true }); // a prune that died half-way
        continue;
      }
      if (name === current || !this.stale(name, baked)) continue;
      // Renamed first: a reader opens the whole snapshot's stream before this, or finds no key.
      const trash = join(this.root, `${TRASH_PREFIX}${randomBytes(6).toString('hex')}`);
      try {
        renameSync(path, trash);
      } catch {
        continue; // removed meanwhile (another process's prune, a discard)
      }
      rmSync(trash, { recursive: true, force: true });
      removed.push(name);
    }
    return removed;
  }

  private stale(key: string, baked?: BootShape): boolean {
    let shape: BootShape;
    try {
      shape = BootShapeSchema.parse(JSON.parse(readFileSync(join(this.root, key, SHAPE_FILE), 'utf8')));
    } catch {
      return true; // no record of its shape: an older Airlock's, or damaged
    }
    if (![shape.initramfs, shape.rootfs, shape.qemu].every((f) => existsSync(f))) return true;
    try {
      if (bootKey(shape) !== key) return true; // the kernel was replaced
    } catch {
      return true; // the kernel is gone
    }
    return baked !== undefined && sameMachine(shape, baked);
  }
}

/**
 * Save a just-booted VM (agent ready, no identity yet) into `claim`: QMP `stop`, `save` (the stream
 * and record into the claim's dir), commit, and `cont` whatever happened. A failure only aborts the
 * claim: the create goes on, and the next create of the shape boots and tries again.
 */
export async function bakeVm(
  claim: BakeClaim,
  qmpSocket: string,
  streamFile: string,
  save: (qmp: Qmp, dir: string) => Promise<unknown>,
  signal?: AbortSignal,
): Promise<void> {
  let qmp: Qmp | undefined;
  try {
    qmp = await Qmp.open(qmpSocket, 10_000, signal);
    await qmp.execute('stop');
    await save(qmp, claim.dir);
    claim.commit();
  } catch {
    claim.abort();
  } finally {
    rmSync(streamFile, { force: true });
    try {
      await qmp?.execute('cont');
    } finally {
      qmp?.close();
    }
  }
}
