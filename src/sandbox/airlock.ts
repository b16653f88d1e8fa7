// The Airlock runtime: which backends exist, where host state lives, and the live sandboxes of this
// process. No hidden global: `Sandbox.create` without an explicit runtime uses one created on first
// use with defaults (state dir from AIRLOCK_STATE_DIR or /var/lib/airlock).
import { mkdirSync, readdirSync, rmSync, statSync } from 'node:fs';
import { join } from 'node:path';
import type { BackendProbe, BackendV1, Logger } from '../core/backend.js';
import { silentLogger } from '../core/backend.js';
import { AirlockError } from '../core/errors.js';
import { parseSandboxSpec, type BackendName, type SandboxSpecInput } from '../core/spec.js';
import { NamespacesBackend } from '../backends/namespaces/index.js';
import type { UidRange } from '../backends/namespaces/state.js';
import { Sandbox } from './index.js';

export interface AirlockOptions {
  readonly stateDir?: string;
  readonly logger?: Logger;
  /** Host uids handed to sandboxes, one per live sandbox (default 3000000, 65536 of them). */
  readonly uidRange?: UidRange;
  /** Sandboxes prepared ahead of time so `create` is cheap (default 1; 0 for one-shot tools). */
  readonly warmPool?: number;
  /** Host-wide directory of uid leases, shared by every runtime on the host (default /run/airlock/uid-leases). */
  readonly uidLeaseDir?: string;
  /** All spill files of one sandbox together are cut at this size (default 2 GiB). */
  readonly maxSpillBytes?: number;
  /** Spill files older than this are deleted by the reaper (default 24 h). */
  readonly spillRetentionMs?: number;
}

export const DEFAULT_STATE_DIR = '/var/lib/airlock';

export class Airlock {
  readonly stateDir: string;
  readonly logger: Logger;
  private readonly backends: Partial<Record<BackendName, BackendV1>> = {};
  private readonly live = new Map<string, Sandbox>();
  private reaped: Promise<void> | undefined;
  private readonly maxSpillBytes: number;
  private readonly spillRetentionMs: number;

  constructor(opts: AirlockOptions = {}) {
    this.stateDir = opts.stateDir ?? process.env.AIRLOCK_STATE_DIR ?? DEFAULT_STATE_DIR;
    this.logger = opts.logger ?? silentLogger;
    this.maxSpillBytes = opts.maxSpillBytes ?? 2 * 1024 ** 3;
    this.spillRetentionMs = opts.spillRetentionMs ?? 24 * 3_600_000;
    const ctx = { stateDir: this.stateDir, logger: this.logger };
    this.backends.namespaces = new NamespacesBackend(ctx, {
      ...(opts.uidRange ? { uidRange: opts.uidRange } : {}),
      ...(opts.uidLeaseDir ? { uidLeaseDir: opts.uidLeaseDir } : {}),
      ...(opts.warmPool !== undefined ? { warmPool: opts.warmPool } : {}),
    });
  }

  private backend(name: BackendName): BackendV1 {
    const b = this.backends[name];
    if (!b) {
      throw new AirlockError(
        'BACKEND_UNAVAILABLE',
        `backend "${name}" is not available in this version of Airlock; use backend: "namespaces"`,
        { field: 'backend' },
      );
    }
    return b;
  }

  async probe(name: BackendName): Promise<BackendProbe> {
    const b = this.backends[name];
    return b
      ? b.probe()
      : { available: false, reason: `backend "${name}" is not implemented yet`, checks: [] };
  }

  /** Remove what crashed Airlock processes left behind. Runs once per runtime, before the first create. */
  reapOrphans(): Promise<void> {
    this.reaped ??= (async () => {
      for (const b of Object.values(this.backends)) {
        const r = await b.reapOrphans();
        if (r.sandboxes)
          this.logger.info({ reaped: r.sandboxes, backend: b.name }, 'reaped orphaned sandboxes');
      }
      this.pruneSpills();
    })();
    return this.reaped;
  }

  async create(input: SandboxSpecInput = {}): Promise<Sandbox> {
    const spec = parseSandboxSpec(input);
    const backend = this.backend(spec.backend);
    await this.reapOrphans();
    const bs = await backend.create(spec);
    const id = bs.id;
    const spillDir = join(this.stateDir, 'spill');
    mkdirSync(spillDir, { recursive: true, mode: 0o700 });
    const sbx = new Sandbox(bs, spec, {
      spillDir,
      maxSpillBytes: this.maxSpillBytes,
      onGone: (gone) => this.live.delete(gone),
    });
    this.live.set(id, sbx);
    return sbx;
  }

  get(id: string): Sandbox {
    const s = this.live.get(id);
    if (!s)
      throw new AirlockError('SANDBOX_NOT_FOUND', `no live sandbox with id "${id}" in this process`, {
        field: 'id',
      });
    return s;
  }

  list(): Sandbox[] {
    return [...this.live.values()];
  }

  /** Kill every live sandbox of this runtime and release prepared (warm) ones, e.g. on shutdown. */
  async killAll(): Promise<void> {
    await Promise.allSettled([...this.live.values()].map((s) => s.kill()));
    await Promise.allSettled(Object.values(this.backends).map((b) => b.close()));
  }

  /** Same as killAll: after it, this runtime holds nothing on the host (it can still create again). */
  close(): Promise<void> {
    return this.killAll();
  }

  private pruneSpills(): void {
    const dir = join(this.stateDir, 'spill');
    let names: string[] = [];
    try {
      names = readdirSync(dir);
    } catch {
      return;
    }
    const cutoff = Date.now() - this.spillRetentionMs;
    for (const n of names) {
      const p = join(dir, n);
      try {
        if (statSync(p).mtimeMs < cutoff) rmSync(p, { force: true });
      } catch {
        /* raced with another reaper */
      }
    }
  }
}
