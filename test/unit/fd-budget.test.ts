// The fd budget's accounting (core/fd-budget.ts) against a simulated process: a flood is stopped at
// its share and at the ceiling (max - reserve), even when each connection really holds more fds than
// it asked for; closes free the budget again; and the raised RLIMIT_NOFILE is what Node reports.
import { describe, expect, it } from 'vitest';
import { FdBudget } from '../../src/core/fd-budget.js';
import {
  countOpenFds,
  openFileLimit,
  raiseOpenFileLimit,
} from '../../src/backends/host/nofile.privileged.js';

/** A process holding `open` fds; each admitted connection really opens `perConn`. */
function world(open: number, perConn: number) {
  const w = { open, counts: 0 };
  const budget = (o: ConstructorParameters<typeof FdBudget>[0]) =>
    new FdBudget(o, () => (w.counts++, w.open));
  return { w, budget, perConn };
}

describe('FdBudget', () => {
  it('stops one sandbox at its share, with a reason that names it', () => {
    const { w, budget } = world(100, 2);
    const b = budget({ maxFds: 10_000, reserveFds: 1000, perSandboxMaxFds: 300 });
    let held = 0;
    for (let i = 0; i < 1000; i++) {
      const r = b.admit(held, 2);
      if (!r.ok) {
        expect(r.code).toBe('fd_budget');
        expect(r.reason).toMatch(/this sandbox holds 300 .* its share of 300/);
        break;
      }
      held += 2;
      w.open += 2;
    }
    expect(held).toBe(300);
  });

  for (const perConn of [2, 3, 5, 8]) {
    it(`never lets egress into the reserve, though each connection holds ${perConn} fds`, () => {
      const { w, budget } = world(200, perConn);
      const b = budget({ maxFds: 5000, reserveFds: 600, perSandboxMaxFds: 4096 });
      // Many sandboxes, each within its share: only the process-wide ceiling stops them.
      let denied = 0;
      for (let i = 0; i < 10_000; i++) {
        const r = b.admit(0, 2);
        if (r.ok) w.open += perConn;
        else {
          denied++;
          expect(r.reason).toMatch(
            /near its file-descriptor limit \(\d+ of 5000 open, 600 kept for exec and create\)/,
          );
        }
      }
      expect(denied).toBeGreaterThan(0);
      // At most one admission's worth past the ceiling: the reserve stays for exec and create.
      expect(w.open).toBeLessThanOrEqual(5000 - 600 + perConn);
      expect(b.denied).toBe(denied);
    });
  }

  it('admits again once connections close (a recount sees them gone)', () => {
    const { w, budget } = world(100, 2);
    const b = budget({ maxFds: 1000, reserveFds: 200, perSandboxMaxFds: 1000 });
    while (b.admit(0, 2).ok) w.open += 2;
    w.open = 100; // every connection closed
    // Denials recount at most every few ms; a later admission sees the truth.
    const start = Date.now();
    let ok = false;
    while (!ok && Date.now() - start < 1000) ok = b.admit(0, 2).ok;
    expect(ok).toBe(true);
  });

  it('defaults: a reserve of max(256, 1/8) and a share of a quarter of the rest, at most 4096', () => {
    const b = new FdBudget({ maxFds: 1024 }, () => 0);
    expect([b.reserveFds, b.perSandboxMaxFds]).toEqual([256, 192]);
    const big = new FdBudget({ maxFds: 1_048_576 }, () => 0);
    expect([big.reserveFds, big.perSandboxMaxFds]).toEqual([131_072, 4096]);
  });
});

describe('RLIMIT_NOFILE', () => {
  it('the soft limit is raised to the hard one, and open fds are counted', () => {
    const r = raiseOpenFileLimit();
    expect(r.soft).toBe(r.hard);
    expect(openFileLimit()).toEqual(r);
    expect(countOpenFds()).toBeGreaterThan(2);
  });
});
