// What a snapshot is, as stored beside its layer (`snapshot.json`) and as the library reports it.
// Parsed with zod when read back: the file lives in Airlock's root-only state dir, but a truncated or
// hand-edited record must fail with a clear message, never half-load.
import { z } from 'zod';
import { BACKEND_NAMES, DigestSchema, MAX_LAYERS, type BackendName, type SandboxSpec } from './spec.js';

export const SNAPSHOT_RECORD_VERSION = 1;

/** What a snapshot's layer lies on: earlier snapshot layers (nearest first), then the workspace base. */
export const SnapshotParentSchema = z
  .object({
    layers: z.array(DigestSchema).max(MAX_LAYERS - 1),
    workspace: z.object({ mode: z.enum(['cow', 'ro', 'empty']), hostDir: z.string().optional() }).strict(),
  })
  .strict();

/** Process state kept with a snapshot (gVisor): how many processes, how big, or why none. */
export const MemoryRecordSchema = z
  .object({
    /** Checkpointed processes (one per exec that was running); a fork restores each. */
    processes: z.number().int().nonnegative(),
    bytes: z.number().int().nonnegative(),
    /** Why running processes were not captured (the snapshot is then filesystem-only). */
    skipped: z.string().optional(),
  })
  .strict();
export type MemoryRecord = z.output<typeof MemoryRecordSchema>;

export const SnapshotRecordSchema = z
  .object({
    version: z.literal(SNAPSHOT_RECORD_VERSION),
    digest: DigestSchema,
    backend: z.enum(BACKEND_NAMES),
    createdAt: z.iso.datetime(),
    parent: SnapshotParentSchema,
    /** Bytes of file content in this layer (not counting the layers below). */
    sizeBytes: z.number().int().nonnegative(),
    /** Bytes the layer takes on the host disk (allocated blocks of its files and dirs). */
    diskBytes: z.number().int().nonnegative(),
    /** Paths in the layer: files, dirs, symlinks, FIFOs and whiteouts (deletions). */
    entries: z.number().int().nonnegative(),
    /** The sandbox it was taken from. */
    source: z.string().min(1),
    /** The source sandbox's validated spec: forks start from it (see Snapshot.fork). */
    spec: z.record(z.string(), z.unknown()),
    memory: MemoryRecordSchema.optional(),
  })
  .strict();

/** What a snapshot lies on: earlier snapshot layers (nearest first), then the workspace base. */
export type SnapshotParent = z.output<typeof SnapshotParentSchema>;

/** A stored snapshot's bookkeeping: digest, parent, size, backend. */
export interface SnapshotRecord {
  readonly version: typeof SNAPSHOT_RECORD_VERSION;
  readonly digest: string;
  readonly backend: BackendName;
  readonly createdAt: string;
  readonly parent: SnapshotParent;
  readonly sizeBytes: number;
  readonly diskBytes: number;
  readonly entries: number;
  readonly source: string;
  readonly spec: Readonly<Record<string, unknown>> | SandboxSpec;
  readonly memory?: MemoryRecord;
}
