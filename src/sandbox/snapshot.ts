// `Snapshot`: an immutable filesystem state taken from a sandbox, that new sandboxes start from.
// `snap.fork()` is `Sandbox.create` with the snapshot's layers under the workspace and home.
import { AirlockError } from '../core/errors.js';
import type { MemoryRecord, SnapshotParent, SnapshotRecord } from '../core/snapshot.js';
import type { BackendName, SandboxSpecInput } from '../core/spec.js';

/** At most this many sandboxes per fork({ count }) call. */
export const MAX_FORK_COUNT = 64;

/** A snapshot's public facts: id, size, parent, backend. */
export interface SnapshotInfo {
  /** The snapshot's id: its layer's content digest ("sha256:…"). */
  readonly id: string;
  readonly digest: string;
  readonly backend: BackendName;
  readonly createdAt: Date;
  /** What it lies on: earlier snapshot layers (nearest first), then the workspace base. */
  readonly parent: SnapshotParent;
  /** Bytes of file content in this layer (the layers below not counted). */
  readonly sizeBytes: number;
  /** Bytes its layer takes on the host disk. */
  readonly diskBytes: number;
  /** Entries in the layer: files, dirs, symlinks, FIFOs, and deletions (whiteouts). */
  readonly entries: number;
  /** The sandbox it was taken from. */
  readonly source: string;
  /**
   * gVisor: the processes that were running, checkpointed with their memory (a fork restores them
   * and they carry on), or why they could not be. Absent when nothing was running or on a tier
   * without memory snapshots.
   */
  readonly memory?: MemoryRecord;
}

/**
 * Spec fields for a fork. Not given: limits, mounts, env, metadata, network, secrets and canaries
 * come from the snapshotted sandbox's spec (a field given replaces that field whole); ttlMs and
 * persistent do not (a fork is a new session: default TTL unless given). The workspace is always
 * the snapshot's.
 */
export type ForkOptions = Omit<SandboxSpecInput, 'backend' | 'workspace' | 'layers' | 'template'>;

/**
 * What a Snapshot needs from its runtime (narrow, so that it does not depend on Airlock): `S` is
 * what a fork gives (the public Sandbox: see airlock.ts, where `Snapshot` is this with S = Sandbox).
 */
export interface SnapshotRuntime<S> {
  create(spec: SandboxSpecInput): Promise<S>;
  exists(backend: BackendName, digest: string): Promise<boolean>;
  users(backend: BackendName, digest: string): Promise<string[]>;
  remove(backend: BackendName, digest: string): Promise<void>;
}

const INHERITED = ['limits', 'mounts', 'env', 'metadata', 'network', 'secrets', 'canaries'] as const;

/** A snapshot whose forks are `S` (generic so that this file needs no import of the Sandbox class). */
export class SnapshotBase<S extends { kill(): Promise<unknown> }> implements SnapshotInfo {
  readonly id: string;
  readonly digest: string;
  readonly backend: BackendName;
  readonly createdAt: Date;
  readonly parent: SnapshotParent;
  readonly sizeBytes: number;
  readonly diskBytes: number;
  readonly entries: number;
  readonly source: string;
  readonly memory?: MemoryRecord;

  constructor(
    private readonly runtime: SnapshotRuntime<S>,
    private readonly record: SnapshotRecord,
  ) {
    this.id = record.digest;
    this.digest = record.digest;
    this.backend = record.backend;
    this.createdAt = new Date(record.createdAt);
    this.parent = record.parent;
    this.sizeBytes = record.sizeBytes;
    this.diskBytes = record.diskBytes;
    this.entries = record.entries;
    this.source = record.source;
    if (record.memory) this.memory = record.memory;
  }

  /** The layers a fork runs on, top first: this snapshot, then its parents. */
  get layers(): readonly string[] {
    return [this.digest, ...this.parent.layers];
  }

  /**
   * Start a new, independent sandbox whose workspace and home begin as this snapshot (its own
   * copy-on-write upper on its own disk: nothing it does reaches the snapshot, its parent or its
   * siblings). With `count`, start that many at once (all or none: if one fails the others are
   * killed and the error is thrown).
   */
  fork(opts: ForkOptions & { count: number }): Promise<S[]>;
  fork(opts?: ForkOptions & { count?: undefined }): Promise<S>;
  async fork(opts: ForkOptions & { count?: number } = {}): Promise<S | S[]> {
    const { count, ...rest } = opts;
    for (const key of ['workspace', 'layers', 'backend', 'template']) {
      if (key in rest) {
        throw new AirlockError(
          'INVALID_ARGUMENT',
          `a fork keeps its snapshot's ${key}; leave ${key} out of the fork options`,
          { field: key },
        );
      }
    }
    if (count !== undefined && (!Number.isInteger(count) || count < 1 || count > MAX_FORK_COUNT)) {
      throw new AirlockError(
        'INVALID_ARGUMENT',
        `count must be an integer from 1 to ${MAX_FORK_COUNT}, got ${String(count)}`,
        { field: 'count' },
      );
    }
    if (!(await this.runtime.exists(this.backend, this.digest))) {
      throw new AirlockError('SNAPSHOT_NOT_FOUND', `snapshot ${this.digest} was removed`, { field: 'id' });
    }
    const spec = this.forkSpec(rest);
    if (count === undefined) return this.runtime.create(spec);
    const settled = await Promise.allSettled(Array.from({ length: count }, () => this.runtime.create(spec)));
    const made = settled.flatMap((r) => (r.status === 'fulfilled' ? [r.value] : []));
    const failed = settled.find((r): r is PromiseRejectedResult => r.status === 'rejected');
    if (failed) {
      await Promise.allSettled(made.map((s) => s.kill()));
      throw failed.reason;
    }
    return made;
  }

  private forkSpec(opts: ForkOptions): SandboxSpecInput {
    const base = this.record.spec as Record<string, unknown>;
    const inherited: Record<string, unknown> = {};
    for (const k of INHERITED) if (base[k] !== undefined) inherited[k] = base[k];
    return {
      ...(inherited as SandboxSpecInput),
      ...opts,
      backend: this.backend,
      workspace: this.parent.workspace,
      layers: [...this.layers],
    };
  }

  /** Ids of live sandboxes (of any process on this state dir) running on this snapshot. */
  users(): Promise<string[]> {
    return this.runtime.users(this.backend, this.digest);
  }

  /**
   * Delete the snapshot and free its disk. SNAPSHOT_IN_USE while a live fork runs on it or a later
   * snapshot is built on it.
   */
  remove(): Promise<void> {
    return this.runtime.remove(this.backend, this.digest);
  }

  toJSON(): Omit<SnapshotInfo, 'createdAt'> & { createdAt: string } {
    return {
      id: this.id,
      digest: this.digest,
      backend: this.backend,
      createdAt: this.record.createdAt,
      parent: this.parent,
      sizeBytes: this.sizeBytes,
      diskBytes: this.diskBytes,
      entries: this.entries,
      source: this.source,
      ...(this.memory ? { memory: this.memory } : {}),
    };
  }
}
