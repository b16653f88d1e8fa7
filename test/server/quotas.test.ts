// Quotas with a bounded wait queue: fit at once, wait for room, give up at the deadline with a
// Retry-After, refuse at once when the queue is full or the request exceeds the whole quota. The
// usage source is a plain object (the layer above Quotas: the store); the clock is injected.
import { describe, expect, it } from 'vitest';
import { AirlockError } from '../../src/core/errors.js';
import { QuotaError, Quotas } from '../../src/server/quotas.js';
import type { Quota } from '../../src/server/store.js';

const small = (over: Partial<Quota> = {}): Quota => ({
  maxSandboxes: 1,
  maxMemoryBytes: 1000,
  maxCpus: 2,
  createsPerMinute: 100,
  ...over,
});

function setup(q: Quota, maxQueue = 8): { quotas: Quotas; live: { n: number }; clock: { t: number } } {
  const live = { n: 0 };
  const clock = { t: 0 }; // an offset on the real clock: tests jump ahead by adding to it
  const quotas = new Quotas(
    { quota: () => q, usage: () => ({ sandboxes: live.n, memoryBytes: live.n * 100, cpus: live.n }) },
    maxQueue,
    () => Date.now() + clock.t,
  );
  return { quotas, live, clock };
}

const one = { memoryBytes: 100, cpus: 1 };

describe('Quotas', () => {
  it('grants at once when there is room; a granted but unreleased create counts against the quota', async () => {
    const { quotas } = setup(small());
    const release = await quotas.reserve('a', one, 0);
    // The first reservation is still in flight: a second create of the same tenant has no room.
    await expect(quotas.reserve('a', one, 0)).rejects.toSatisfy((e) => AirlockError.is(e, 'QUOTA_EXCEEDED'));
    // Another tenant is not affected.
    (await quotas.reserve('b', one, 0))();
    release();
    (await quotas.reserve('a', one, 0))();
  });

  it('a queued create gets the room another frees, before its deadline', async () => {
    const { quotas, live } = setup(small());
    live.n = 1;
    const waiting = quotas.reserve('a', one, 30_000);
    await new Promise((r) => setImmediate(r));
    expect(quotas.queued).toBe(1);
    live.n = 0;
    quotas.wakeAll(); // a sandbox ended
    const release = await waiting;
    expect(quotas.queued).toBe(0);
    release();
  });

  it('gives up at the deadline with QUOTA_EXCEEDED (429) and a Retry-After of at least 1 s', async () => {
    const { quotas, live } = setup(small());
    live.n = 1;
    const err = await quotas.reserve('a', one, 20).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(QuotaError);
    expect((err as QuotaError).code).toBe('QUOTA_EXCEEDED');
    expect((err as QuotaError).retryAfterSeconds).toBeGreaterThanOrEqual(1);
    expect((err as QuotaError).message).toMatch(/1 of 1 live sandboxes.*queueTimeoutMs 20/);
    expect(quotas.queued).toBe(0);
  });

  it('refuses at once when the queue is full (bounded: never an unbounded pile of waiters)', async () => {
    const { quotas, live } = setup(small(), 2);
    live.n = 1;
    const waiters = [quotas.reserve('a', one, 60_000), quotas.reserve('b', one, 60_000)].map((p) =>
      p.catch((e: unknown) => e),
    );
    await new Promise((r) => setImmediate(r));
    const err = await quotas.reserve('c', one, 60_000).catch((e: unknown) => e);
    expect(AirlockError.is(err, 'QUOTA_EXCEEDED') && err.message).toMatch(/queue is full \(2 waiting\)/);
    live.n = 0; // room frees up: both queued creates get it
    quotas.wakeAll();
    for (const w of await Promise.all(waiters)) expect(typeof w).toBe('function');
  });

  it('the bound holds while queued creates are awake and looking again', async () => {
    const { quotas, live } = setup(small(), 2);
    live.n = 1;
    const waiters = [quotas.reserve('a', one, 60_000), quotas.reserve('b', one, 60_000)].map((p) =>
      p.catch((e: unknown) => e),
    );
    await new Promise((r) => setImmediate(r));
    quotas.wakeAll(); // both wake, find no room, and will wait again: they still hold their places
    const err = await quotas.reserve('c', one, 60_000).catch((e: unknown) => e);
    expect(AirlockError.is(err, 'QUOTA_EXCEEDED') && err.message).toMatch(/queue is full/);
    expect(quotas.queued).toBe(2);
    live.n = 0;
    quotas.wakeAll();
    for (const w of await Promise.all(waiters)) expect(typeof w).toBe('function');
    expect(quotas.queued).toBe(0);
  });

  it('creates per minute: the Retry-After is when the oldest create leaves the window', async () => {
    const { quotas, clock } = setup(
      small({ maxSandboxes: 100, maxMemoryBytes: 1e9, maxCpus: 100, createsPerMinute: 2 }),
    );
    (await quotas.reserve('a', one, 0))();
    clock.t += 15_000;
    (await quotas.reserve('a', one, 0))();
    const err = (await quotas.reserve('a', one, 0).catch((e: unknown) => e)) as QuotaError;
    expect(err.code).toBe('QUOTA_EXCEEDED');
    expect(err.retryAfterSeconds).toBe(45);
    clock.t += 45_001;
    (await quotas.reserve('a', one, 0))();
  });

  it('a request larger than the whole quota fails at once, saying to ask for less', async () => {
    const { quotas } = setup(small());
    const err = await quotas.reserve('a', { memoryBytes: 5000, cpus: 1 }, 60_000).catch((e: unknown) => e);
    expect(AirlockError.is(err, 'QUOTA_EXCEEDED') && err.message).toMatch(
      /more than tenant "a"'s whole quota.*ask for less/,
    );
    expect(quotas.queued).toBe(0);
  });

  it('an aborted wait (the client went away) leaves the queue at once', async () => {
    const { quotas, live } = setup(small());
    live.n = 1;
    const ac = new AbortController();
    const p = quotas.reserve('a', one, 60_000, ac.signal).catch((e: unknown) => e);
    await new Promise((r) => setImmediate(r));
    expect(quotas.queued).toBe(1);
    ac.abort();
    expect(AirlockError.is(await p, 'ABORTED')).toBe(true);
    expect(quotas.queued).toBe(0);
  });
});
