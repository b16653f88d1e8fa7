// Per-tenant quotas with a bounded wait queue (issue 36). A create asks for a reservation: if the
// tenant's live sandboxes, memory, CPU and creates-per-minute all leave room, it gets one at once;
// otherwise it waits, first come first served, until room frees up or its queueTimeoutMs runs out,
// and then fails with QUOTA_EXCEEDED (429) and a Retry-After. A queue that is already full refuses
// at once. Never a silent hang: every wait has a deadline.
import { AirlockError } from '../core/errors.js';
import type { Quota } from './store.js';

/** What one sandbox takes from its tenant's quota. */
export interface Usage {
  readonly memoryBytes: number;
  readonly cpus: number;
}

/** The library's defaults, which a sandbox without limits gets (for the quota's sums). */
export const DEFAULT_MEMORY_BYTES = 512 * 1024 ** 2;
export const DEFAULT_CPUS = 1;

/** What a sandbox with these limits takes from its tenant's quota (API creates, builds, MCP servers). */
export function usageOf(limits: { memoryBytes?: number; cpus?: number } | undefined): Usage {
  return {
    memoryBytes: limits?.memoryBytes ?? DEFAULT_MEMORY_BYTES,
    cpus: limits?.cpus ?? DEFAULT_CPUS,
  };
}

/** A QUOTA_EXCEEDED error with when to retry (the front server sends it as Retry-After). */
export class QuotaError extends AirlockError {
  constructor(
    message: string,
    readonly retryAfterSeconds: number,
  ) {
    super('QUOTA_EXCEEDED', message);
  }
}

export interface QuotaSource {
  /** The tenant's effective quota. */
  quota(tenant: string): Quota;
  /** What the tenant's live sandboxes take now (the store's view). */
  usage(tenant: string): { sandboxes: number; memoryBytes: number; cpus: number };
}

interface Waiter {
  readonly tenant: string;
  readonly want: Usage;
  readonly wake: () => void;
}

const WINDOW_MS = 60_000;

export class Quotas {
  /** Reservations granted but not yet turned into stored sandboxes (a create in flight). */
  private readonly pending = new Map<string, Usage[]>();
  private readonly recentCreates = new Map<string, number[]>();
  private readonly waiters: Waiter[] = [];
  private readonly timers = new Set<NodeJS.Timeout>();
  /** Creates inside reserve()'s wait loop (asleep or looking again): what maxQueue bounds. */
  private inQueue = 0;

  constructor(
    private readonly source: QuotaSource,
    /** Creates that may wait at once, all tenants together. */
    private readonly maxQueue = 64,
    private readonly now: () => number = Date.now,
  ) {}

  /** Creates waiting right now (for /metrics and tests). */
  get queued(): number {
    return this.inQueue;
  }

  /**
   * Wait (up to timeoutMs) until `want` fits the tenant's quota, then reserve it. The returned
   * release() must be called once the create has ended (stored or failed). `signal` (the client
   * went away) leaves the queue at once.
   */
  async reserve(tenant: string, want: Usage, timeoutMs: number, signal?: AbortSignal): Promise<() => void> {
    const deadline = this.now() + timeoutMs;
    let queued = false;
    try {
      for (;;) {
        // Strict FIFO: a newcomer does not overtake tenants' creates already waiting.
        const ahead = this.waiters.some((w) => w.tenant === tenant);
        const verdict =
          ahead && !queued
            ? { ok: false as const, retryMs: 1000, why: 'earlier creates are queued' }
            : this.fits(tenant, want);
        if (verdict.ok) return this.grant(tenant, want);
        const left = deadline - this.now();
        if (left <= 0)
          throw new QuotaError(
            this.message(tenant, verdict.why, timeoutMs),
            Math.max(1, Math.ceil(verdict.retryMs / 1000)),
          );
        if (!queued && this.inQueue >= this.maxQueue) {
          throw new QuotaError(
            `the create queue is full (${this.maxQueue} waiting): ${verdict.why}; retry later`,
            Math.max(1, Math.ceil(verdict.retryMs / 1000)),
          );
        }
        if (!queued) this.inQueue++;
        queued = true;
        await this.wait(tenant, want, Math.min(left, verdict.retryMs), signal);
        if (signal?.aborted)
          throw new AirlockError('ABORTED', 'the client went away while its create was queued');
      }
    } finally {
      if (queued) {
        this.inQueue--;
        this.wakeAll(); // our place in line is free: let the next one look again
      }
    }
  }

  /** Something freed room (a sandbox ended): waiters look again. */
  wakeAll(): void {
    for (const w of this.waiters.splice(0)) w.wake();
  }

  close(): void {
    for (const t of this.timers) clearTimeout(t);
    this.timers.clear();
    this.wakeAll();
  }

  private fits(tenant: string, want: Usage): { ok: true } | { ok: false; retryMs: number; why: string } {
    const q = this.source.quota(tenant);
    const used = this.source.usage(tenant);
    for (const p of this.pending.get(tenant) ?? []) {
      used.sandboxes++;
      used.memoryBytes += p.memoryBytes;
      used.cpus += p.cpus;
    }
    const now = this.now();
    const recent = (this.recentCreates.get(tenant) ?? []).filter((t) => t > now - WINDOW_MS);
    this.recentCreates.set(tenant, recent);
    // A request bigger than the whole quota can never fit: say so at once instead of queueing.
    if (want.memoryBytes > q.maxMemoryBytes || want.cpus > q.maxCpus) {
      throw new QuotaError(
        `this sandbox asks for ${want.memoryBytes} bytes of memory and ${want.cpus} CPUs, more than tenant "${tenant}"'s whole quota (${q.maxMemoryBytes} bytes, ${q.maxCpus} CPUs): ask for less`,
        60,
      );
    }
    if (used.sandboxes + 1 > q.maxSandboxes)
      return {
        ok: false,
        retryMs: 1000,
        why: `tenant "${tenant}" has ${used.sandboxes} of ${q.maxSandboxes} live sandboxes`,
      };
    if (used.memoryBytes + want.memoryBytes > q.maxMemoryBytes)
      return {
        ok: false,
        retryMs: 1000,
        why: `tenant "${tenant}" would exceed its memory quota (${q.maxMemoryBytes} bytes)`,
      };
    if (used.cpus + want.cpus > q.maxCpus + 1e-9)
      return {
        ok: false,
        retryMs: 1000,
        why: `tenant "${tenant}" would exceed its CPU quota (${q.maxCpus})`,
      };
    if (recent.length >= q.createsPerMinute) {
      return {
        ok: false,
        retryMs: Math.max(1, recent[0]! + WINDOW_MS - now),
        why: `tenant "${tenant}" made ${recent.length} creates in the last minute (quota ${q.createsPerMinute})`,
      };
    }
    return { ok: true };
  }

  private grant(tenant: string, want: Usage): () => void {
    const list = this.pending.get(tenant) ?? [];
    list.push(want);
    this.pending.set(tenant, list);
    this.recentCreates.get(tenant)?.push(this.now());
    let released = false;
    return () => {
      if (released) return;
      released = true;
      const at = list.indexOf(want);
      if (at >= 0) list.splice(at, 1);
      this.wakeAll();
    };
  }

  private wait(tenant: string, want: Usage, ms: number, signal?: AbortSignal): Promise<void> {
    return new Promise((resolve) => {
      const done = (): void => {
        clearTimeout(t);
        this.timers.delete(t);
        signal?.removeEventListener('abort', done);
        const at = this.waiters.indexOf(w);
        if (at >= 0) this.waiters.splice(at, 1);
        resolve();
      };
      const w: Waiter = { tenant, want, wake: done };
      const t = setTimeout(done, Math.max(1, ms));
      this.timers.add(t);
      signal?.addEventListener('abort', done, { once: true });
      this.waiters.push(w);
    });
  }

  private message(tenant: string, why: string, timeoutMs: number): string {
    return `quota full for tenant "${tenant}": ${why}, and no room freed up within queueTimeoutMs ${timeoutMs}; kill a sandbox or retry after the Retry-After header`;
  }
}
