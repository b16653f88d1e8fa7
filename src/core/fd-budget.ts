// The file-descriptor budget of Airlock's process. Every fd a sandbox can make Airlock open (an
// egress connection holds its client socket and an upstream one) is admitted against it first, so a
// few sandboxes opening thousands of connections get a denial of their own, while a reserve stays
// free for what every sandbox needs (exec pipes and pidfds, a create's mounts, netns and listeners).
//
// It counts the process's real open fds (not Airlock's idea of them): an estimate between counts
// (the last count plus what was admitted since), recounted when the estimate comes near the limit
// or a quarter of the headroom has been admitted. Pure accounting: the count is injected.

/** A denial: the reason (for the sandbox's response and its egress event) and a stable code. */
export type FdAdmission =
  { readonly ok: true } | { readonly ok: false; readonly code: 'fd_budget'; readonly reason: string };

export interface FdBudgetOptions {
  /** The most fds Airlock's process may hold (default: its soft RLIMIT_NOFILE, see maxOpenFds). */
  readonly maxFds?: number;
  /** Kept free for exec, create and everything else: egress never takes these (default max(256, maxFds / 8)). */
  readonly reserveFds?: number;
  /** The most fds one sandbox's egress may hold (default a quarter of the rest, at most 4096). */
  readonly perSandboxMaxFds?: number;
}

/** What admit() may wait before counting again while it denies (a count reads /proc/self/fd). */
const RECOUNT_MIN_MS = 5;

export class FdBudget {
  readonly maxFds: number;
  readonly reserveFds: number;
  readonly perSandboxMaxFds: number;
  private lastCount: number;
  private lastCountAt = 0;
  /** Fds admitted since lastCount (counted as still open: the estimate is an upper bound). */
  private admittedSince = 0;
  private deniedCount = 0;

  constructor(
    opts: FdBudgetOptions & { readonly maxFds: number },
    private readonly countOpenFds: () => number,
  ) {
    this.maxFds = opts.maxFds;
    this.reserveFds = Math.min(opts.reserveFds ?? Math.max(256, Math.floor(opts.maxFds / 8)), opts.maxFds);
    const rest = Math.max(0, this.maxFds - this.reserveFds);
    this.perSandboxMaxFds = opts.perSandboxMaxFds ?? Math.min(4096, Math.max(16, Math.floor(rest / 4)));
    this.lastCount = countOpenFds();
    this.lastCountAt = Date.now();
  }

  /**
   * May a sandboxed client that already holds `sandboxFds` fds of Airlock's make it open `needFds`
   * more? Checked on each connection it makes, before anything else of it is read.
   */
  admit(sandboxFds: number, needFds: number): FdAdmission {
    if (sandboxFds + needFds > this.perSandboxMaxFds) {
      return this.deny(
        `this sandbox holds ${sandboxFds} of Airlock's file descriptors, its share of ${this.perSandboxMaxFds}: close connections it no longer uses`,
      );
    }
    const ceiling = this.maxFds - this.reserveFds;
    // Recount once a quarter of the headroom seen at the last count has been admitted: a connection
    // may really hold more fds than `needFds` (relay duplicates, TLS), and this bounds the overshoot.
    if (
      this.lastCount + this.admittedSince + needFds > ceiling ||
      this.admittedSince * 4 >= ceiling - this.lastCount
    ) {
      const now = Date.now();
      if (this.admittedSince > 0 || now - this.lastCountAt >= RECOUNT_MIN_MS) {
        this.lastCount = this.countOpenFds();
        this.lastCountAt = now;
        this.admittedSince = 0;
      }
      if (this.lastCount + needFds > ceiling) {
        return this.deny(
          `Airlock's process is near its file-descriptor limit (${this.lastCount} of ${this.maxFds} open, ${this.reserveFds} kept for exec and create): new connections are refused until others close`,
        );
      }
    }
    this.admittedSince += needFds;
    return { ok: true };
  }

  /** Connections refused so far (for diagnostics). */
  get denied(): number {
    return this.deniedCount;
  }

  private deny(reason: string): FdAdmission {
    this.deniedCount++;
    return { ok: false, code: 'fd_budget', reason };
  }
}
