// Snapshot layers of the namespaces tier, on the host:
//
//   <stateDir>/layers/                      0700 root: no sandbox uid can even look inside
//   <stateDir>/layers/sha256:<hex>/fs/      the layer (workspace/ and home/ trees, overlayfs format)
//   <stateDir>/layers/sha256:<hex>/snapshot.json   its record (parent chain, sizes, source spec)
//   <stateDir>/layers/.tmp-<pid>-<start>-<rand>/   a capture in progress (reaped if its owner died)
//   <stateDir>/layers/.trash-<hex>-<rand>/         a removal in progress
//
// A layer is immutable: made once in a fresh dir and renamed into place, never written again, only
// ever mounted read-only (idmapped, nosuid, nodev) as an overlay lower of a fork. Which live
// sandboxes use a layer is recorded in each sandbox's owner.json (`layers`), written before the
// sandbox opens any layer; removal renames the layer away first and then checks those records, so a
// layer is never deleted from under a fork that is being created at the same moment.
import { randomBytes } from 'node:crypto';
import {
  closeSync,
  existsSync,
  lstatSync,
  mkdirSync,
  chmodSync,
  readdirSync,
  renameSync,
  rmSync,
  statfsSync,
  writeFileSync,
} from 'node:fs';
import { join } from 'node:path';
import { AirlockError } from '../../core/errors.js';
import { readRecordFile } from '../../core/validate.js';
import {
  SNAPSHOT_RECORD_VERSION,
  SnapshotRecordSchema,
  type MemoryRecord,
  type SnapshotParent,
  type SnapshotRecord,
} from '../../core/snapshot.js';
import { DIGEST_RE, type BackendName, type SandboxSpec } from '../../core/spec.js';
import { mountIdmappedAll } from './idmap.privileged.js';
import { LAYER_SELF_ID, captureLayer, type CaptureSource } from './layer-capture.privileged.js';
import { ownerAlive, selfOwner } from './state.js';

/** Host disk kept free beyond a snapshot's own size. */
const FREE_RESERVE_BYTES = 64 * 1024 * 1024;

export interface CaptureRequest {
  readonly sources: readonly CaptureSource[];
  readonly selfUid: number;
  readonly parent: SnapshotParent;
  readonly spec: SandboxSpec;
  readonly source: string;
  readonly checkpoint: () => void;
  /** Cap on file content copied (the sandbox's disk size). */
  readonly maxContentBytes: number;
  /** Bytes the sandbox's disk holds: the host must have this much free (plus a reserve). */
  readonly usedBytes: number;
  /** The tier taking the snapshot (recorded; forks start on it). */
  readonly backend: BackendName;
  /**
   * Process state captured beside the filesystem (gVisor checkpoint images): `dir` is moved into the
   * layer as `memory/`, and `hash` (over its files) enters the digest, so different memory never
   * shares a digest with other memory on the same filesystem content.
   */
  readonly memory?: { readonly dir?: string; readonly hash: string; readonly record: MemoryRecord };
}

export class LayerStore {
  readonly root: string;

  constructor(
    stateDir: string,
    /** Ids of live sandboxes (any process on this state dir) that run on `digest`. */
    private readonly usersOf: (digest: string) => string[],
  ) {
    this.root = join(stateDir, 'layers');
  }

  private ensure(): void {
    mkdirSync(this.root, { recursive: true, mode: 0o700 });
    chmodSync(this.root, 0o700);
  }

  dir(digest: string): string {
    return join(this.root, digest);
  }

  fsDir(digest: string): string {
    return join(this.dir(digest), 'fs');
  }

  /** The record of `digest`, or undefined if there is no such layer. */
  get(digest: string): SnapshotRecord | undefined {
    if (!DIGEST_RE.test(digest)) return undefined;
    const file = join(this.dir(digest), 'snapshot.json');
    const r = readRecordFile(SnapshotRecordSchema, file, 'snapshot record');
    if (r && r.digest !== digest) {
      throw new AirlockError('INTERNAL', `snapshot record ${file} is corrupt: digest mismatch`);
    }
    return r;
  }

  list(): SnapshotRecord[] {
    const out: SnapshotRecord[] = [];
    for (const name of readdirOr(this.root)) {
      if (!DIGEST_RE.test(name)) continue;
      const r = this.get(name);
      if (r) out.push(r);
    }
    return out.sort((a, b) => a.createdAt.localeCompare(b.createdAt) || a.digest.localeCompare(b.digest));
  }

  users(digest: string): string[] {
    return this.usersOf(digest);
  }

  /** Snapshots whose chain includes `digest` (they would break without it). */
  children(digest: string): string[] {
    return this.list()
      .filter((r) => r.parent.layers.includes(digest))
      .map((r) => r.digest);
  }

  /**
   * Copy the sandbox's (frozen) state into a new layer. The same content on the same parent gives
   * the same digest: then the existing layer is kept and its record returned.
   */
  async capture(req: CaptureRequest): Promise<SnapshotRecord> {
    this.ensure();
    const free = freeBytes(this.root);
    if (free < req.usedBytes + FREE_RESERVE_BYTES) {
      throw new AirlockError(
        'DISK_FULL',
        `not enough free space for a snapshot in ${this.root}: ${free} bytes free, the sandbox holds ${req.usedBytes}`,
      );
    }
    const owner = selfOwner();
    const tmp = join(this.root, `.tmp-${owner.pid}-${owner.startTicks}-${randomBytes(6).toString('hex')}`);
    mkdirSync(tmp, { mode: 0o700 });
    try {
      const fs = join(tmp, 'fs');
      mkdirSync(fs, { mode: 0o700 }); // root only, also through the forks' idmapped views
      const res = await captureLayer({
        sources: req.sources,
        dest: fs,
        selfUid: req.selfUid,
        // The tier is part of the digest (namespaces layers keep the digests they always had): a
        // gVisor snapshot never shares a layer, and so a record, with the same content taken on
        // another tier, whose fork would then start on that tier (a silent downgrade).
        header:
          parentHeader(req.parent) +
          (req.backend === 'namespaces' ? '' : `\0backend:${req.backend}`) +
          (req.memory ? `\0memory:${req.memory.hash}` : '') +
          // On an image root (or an allowlist root) the layer holds changes to that root: the same
          // changes over another root are another layer (its record names the root forks run on).
          (req.spec.rootfs
            ? `\0rootfs:${req.spec.rootfs.image?.digest ?? ''}:${req.spec.rootfs.layers.join('\0')}`
            : ''),
        checkpoint: req.checkpoint,
        maxContentBytes: req.maxContentBytes,
      });
      const existing = this.get(res.digest);
      if (existing && existing.backend !== req.backend) {
        throw new AirlockError(
          'INTERNAL',
          `snapshot ${res.digest} exists as a ${existing.backend} snapshot (taken before the tier was part of ` +
            `a snapshot's digest); remove it to snapshot the same content on the ${req.backend} tier`,
        );
      }
      if (existing) {
        rmSync(tmp, { recursive: true, force: true });
        if (req.memory?.dir) rmSync(req.memory.dir, { recursive: true, force: true });
        return existing;
      }
      if (req.memory?.dir) renameSync(req.memory.dir, join(tmp, 'memory'));
      const { layers: _layers, ...full } = req.spec;
      // A literal secret value is never written to disk: a fork of this snapshot that needs it passes
      // it again (the other sources are references, kept so that a fork resolves them anew).
      const spec = { ...full, secrets: full.secrets.filter((s) => !('literal' in s.value)) };
      const record: SnapshotRecord = {
        version: SNAPSHOT_RECORD_VERSION,
        digest: res.digest,
        backend: req.backend,
        createdAt: new Date().toISOString(),
        parent: req.parent,
        sizeBytes: res.sizeBytes,
        diskBytes: res.diskBytes,
        entries: res.entries,
        source: req.source,
        spec,
        ...(req.memory ? { memory: req.memory.record } : {}),
      };
      writeFileSync(join(tmp, 'snapshot.json'), JSON.stringify(record, null, 2) + '\n', { mode: 0o600 });
      try {
        renameSync(tmp, this.dir(res.digest));
      } catch (e) {
        const code = (e as NodeJS.ErrnoException).code;
        if (code !== 'ENOTEMPTY' && code !== 'EEXIST') throw e;
        // Another capture of the same content (and tier: see the header) won the race: keep theirs.
        rmSync(tmp, { recursive: true, force: true });
        return this.get(res.digest) ?? record;
      }
      return record;
    } catch (e) {
      rmSync(tmp, { recursive: true, force: true });
      throw e;
    }
  }

  /**
   * The record of the top of `layers` after checking that `layers` is exactly its chain and that
   * the workspace is the one it was taken over. Errors are INVALID_SPEC naming the field.
   */
  resolveChain(
    layers: readonly string[],
    workspace: SandboxSpec['workspace'],
    backend: BackendName = 'namespaces',
  ): SnapshotRecord {
    const top = this.get(layers[0]!);
    if (!top) {
      throw new AirlockError(
        'INVALID_SPEC',
        `layers.0: snapshot ${layers[0]} does not exist in ${this.root} (removed, or taken with another state dir)`,
        { field: 'layers.0' },
      );
    }
    // Filesystem layers are the same on every tier; process memory restores only where it was taken.
    if (top.backend !== backend && top.memory !== undefined) {
      throw new AirlockError(
        'INVALID_SPEC',
        `layers.0: snapshot ${top.digest} holds ${top.backend} process memory; fork it on the ${top.backend} tier`,
        {
          field: 'layers.0',
        },
      );
    }
    const chain = [top.digest, ...top.parent.layers];
    if (chain.length !== layers.length || chain.some((d, i) => d !== layers[i])) {
      throw new AirlockError(
        'INVALID_SPEC',
        `layers must be snapshot ${top.digest}'s whole chain, top first: [${chain.join(', ')}]; use snapshot.fork()`,
        { field: 'layers' },
      );
    }
    chain.forEach((d, i) => {
      if (!existsSync(this.fsDir(d))) {
        throw new AirlockError('INVALID_SPEC', `layers.${i}: snapshot ${d} does not exist in ${this.root}`, {
          field: `layers.${i}`,
        });
      }
    });
    const base = top.parent.workspace;
    if (base.mode !== workspace.mode || base.hostDir !== workspace.hostDir) {
      throw new AirlockError(
        'INVALID_SPEC',
        `workspace: a sandbox on snapshot ${top.digest} keeps the workspace it was taken over ` +
          `(mode ${base.mode}${base.hostDir ? `, hostDir ${base.hostDir}` : ''})`,
        { field: 'workspace' },
      );
    }
    return top;
  }

  /**
   * Idmapped, read-only views of the layers (0 → the sandbox's uid) at `<sandboxDir>/layer-<i>`,
   * top first; the caller's cleanup unmounts them.
   */
  async mountChain(
    layers: readonly string[],
    sandboxDir: string,
    hostUid: number,
    /** A mappingUserns(LAYER_SELF_ID → hostUid) fd made ahead of time (consumed). */
    usernsFd?: number,
  ): Promise<string[]> {
    const mounts = layers.map((d, i) => ({ source: this.fsDir(d), target: join(sandboxDir, `layer-${i}`) }));
    try {
      for (const m of mounts) mkdirSync(m.target, { mode: 0o755 });
    } catch (e) {
      if (usernsFd !== undefined) closeSync(usernsFd);
      throw e;
    }
    const self = { uid: LAYER_SELF_ID, gid: LAYER_SELF_ID };
    const failed = await mountIdmappedAll(mounts, self, hostUid, true, usernsFd);
    if (failed !== undefined) {
      if (!existsSync(failed)) {
        throw new AirlockError(
          'SNAPSHOT_NOT_FOUND',
          `a snapshot layer was removed while the sandbox was being created (${failed})`,
        );
      }
      throw new AirlockError(
        'BACKEND_UNAVAILABLE',
        `sandboxes on a snapshot need idmapped mounts of ${this.root} (Linux ≥ 5.12 and a filesystem that supports them)`,
      );
    }
    return mounts.map((m) => m.target);
  }

  /** Mode of an area's root in a layer (the fork's upper dir takes it, as overlayfs shows the upper's). */
  /** Where a layer's process memory (gVisor checkpoint images) lives, if it has any. */
  memoryDir(digest: string): string {
    return join(this.dir(digest), 'memory');
  }

  rootMode(digest: string, area: 'workspace' | 'home'): number {
    return lstatSync(join(this.fsDir(digest), area)).mode & 0o1777;
  }

  /**
   * Delete a layer and free its disk. Refused while another snapshot is built on it or a live sandbox
   * runs on it. `reap` first releases sandboxes whose owner died (their records would otherwise hold it).
   */
  async remove(digest: string, reap: () => Promise<void>): Promise<void> {
    if (!DIGEST_RE.test(digest)) {
      throw new AirlockError('INVALID_ARGUMENT', `"${digest}" is not a snapshot id (sha256:<64 hex>)`, {
        field: 'id',
      });
    }
    if (!existsSync(this.dir(digest))) throw notFound(digest);
    await reap();
    const children = this.children(digest);
    if (children.length) {
      throw new AirlockError(
        'SNAPSHOT_IN_USE',
        `snapshot ${digest} is the parent of snapshot(s) ${children.join(', ')}; remove those first`,
      );
    }
    const trash = join(this.root, `.trash-${digest.slice(7)}-${randomBytes(6).toString('hex')}`);
    try {
      renameSync(this.dir(digest), trash); // from here on no new sandbox can open it
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === 'ENOENT') throw notFound(digest);
      throw e;
    }
    const users = this.users(digest);
    if (users.length) {
      try {
        renameSync(trash, this.dir(digest));
      } catch {
        rmSync(trash, { recursive: true, force: true }); // the same content was captured again meanwhile
      }
      throw new AirlockError(
        'SNAPSHOT_IN_USE',
        `snapshot ${digest} is in use by live sandbox(es) ${users.join(', ')}; kill them first`,
      );
    }
    rmSync(trash, { recursive: true, force: true });
  }

  /**
   * Leftovers of crashed processes: captures whose owner died, removals cut short (put back if a
   * live sandbox uses the layer, else finished). Complete layers are never deleted here: a snapshot
   * outlives the process that took it, and only remove() deletes one.
   */
  reap(): void {
    for (const name of readdirOr(this.root)) {
      const p = join(this.root, name);
      const tmp = /^\.tmp-(\d+)-(\d+)-[0-9a-f]+$/.exec(name);
      if (tmp) {
        if (!ownerAlive({ pid: Number(tmp[1]), startTicks: tmp[2]! }))
          rmSync(p, { recursive: true, force: true });
        continue;
      }
      const trash = /^\.trash-([0-9a-f]{64})-[0-9a-f]+$/.exec(name);
      if (!trash) continue;
      const digest = `sha256:${trash[1]}`;
      if (!existsSync(this.dir(digest)) && this.users(digest).length) {
        try {
          renameSync(p, this.dir(digest));
          continue;
        } catch {
          /* fall through: remove */
        }
      }
      rmSync(p, { recursive: true, force: true });
    }
  }
}

function notFound(digest: string): AirlockError {
  return new AirlockError('SNAPSHOT_NOT_FOUND', `no snapshot ${digest}`, { field: 'id' });
}

/** What a layer lies on, canonically (part of its digest). */
function parentHeader(p: SnapshotParent): string {
  return JSON.stringify({
    layers: p.layers,
    workspace: { mode: p.workspace.mode, hostDir: p.workspace.hostDir ?? null },
  });
}

function freeBytes(dir: string): number {
  const s = statfsSync(dir);
  return s.bavail * s.bsize;
}

function readdirOr(dir: string): string[] {
  try {
    return readdirSync(dir);
  } catch {
    return [];
  }
}
