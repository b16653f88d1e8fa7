// Per-session MCP budgets: each budget exhausted with its exact code and a reason naming the numbers,
// the sliding rate window on an injected clock (no sleeping), real o200k_base token counts, usage, and
// schema validation.
import { encode } from 'gpt-tokenizer/encoding/o200k_base';
import { describe, expect, it } from 'vitest';
import {
  BudgetsSchema,
  SessionBudget,
  countOutputTokens,
  parseBudgets,
  type BudgetVerdict,
  type BudgetsInput,
} from '../../src/mcp/budget.js';

function budget(input: BudgetsInput, now?: () => number): SessionBudget {
  return new SessionBudget(BudgetsSchema.parse(input), now ? { now } : {});
}

function denied(v: BudgetVerdict) {
  if (v.action !== 'deny') throw new Error(`expected deny, got ${JSON.stringify(v)}`);
  return v;
}

const done = (text = '', bytes = Buffer.byteLength(text), durationMs = 1) => ({ text, bytes, durationMs });

describe('token counting', () => {
  it('uses the o200k_base encoding', () => {
    // o200k_base: "hello" = 24912, " world" = 2375.
    expect(encode('hello world')).toEqual([24912, 2375]);
    expect(countOutputTokens('hello world')).toBe(2);
    expect(countOutputTokens('')).toBe(0);
  });

  it('agrees with a full encode on mixed text', () => {
    const text = 'Résumé: 12 files in /data — ✓ done.\n{"ok": true, "items": [1, 2, 3]}\n日本語のテキスト';
    expect(countOutputTokens(text)).toBe(encode(text).length);
    expect(countOutputTokens(text)).toBeGreaterThan(10);
  });

  it('counts special-token text as ordinary text instead of throwing', () => {
    const text = 'a <|endoftext|> b';
    expect(countOutputTokens(text)).toBe(encode(text, { disallowedSpecial: new Set() }).length);
    expect(countOutputTokens(text)).toBeGreaterThan(3);
  });
});

describe('SessionBudget', () => {
  it('allows everything when no budget is set', () => {
    const b = budget({});
    for (let i = 0; i < 100; i++) {
      expect(b.beforeCall()).toEqual({ action: 'allow' });
      b.afterCall(done('x'.repeat(1000), 1000, 1000));
    }
    expect(b.usage()).toMatchObject({ calls: 100, inFlight: 0, outputBytes: 100_000, remaining: {} });
  });

  it('maxCalls: budget_calls once the calls are used, counting calls still running', () => {
    const b = budget({ maxCalls: 2 });
    expect(b.beforeCall().action).toBe('allow');
    expect(b.beforeCall().action).toBe('allow');
    const v = denied(b.beforeCall());
    expect(v.code).toBe('budget_calls');
    expect(v.reason).toBe(
      'Airlock budget exhausted: maxCalls 2 reached for this session; start a new session or ask the operator to raise it',
    );
    b.afterCall(done());
    b.afterCall(done());
    expect(denied(b.beforeCall()).code).toBe('budget_calls');
    expect(b.usage().remaining).toEqual({ calls: 0 });
  });

  it('maxOutputTokens: budget_tokens after the output crossed it', () => {
    const b = budget({ maxOutputTokens: 5 });
    expect(b.beforeCall().action).toBe('allow');
    b.afterCall(done('hello world')); // 2 tokens
    expect(b.beforeCall().action).toBe('allow');
    b.afterCall(done('hello world hello world')); // 4 more: 6 >= 5
    const v = denied(b.beforeCall());
    expect(v.code).toBe('budget_tokens');
    expect(v.reason).toContain('maxOutputTokens 5 reached for this session (6 tokens of tool output so far)');
    expect(b.usage()).toMatchObject({ outputTokens: 6, remaining: { outputTokens: 0 } });
  });

  it('maxOutputBytes: budget_bytes', () => {
    const b = budget({ maxOutputBytes: 100 });
    expect(b.beforeCall().action).toBe('allow');
    b.afterCall(done('x', 99));
    expect(b.beforeCall().action).toBe('allow');
    b.afterCall(done('x', 1));
    const v = denied(b.beforeCall());
    expect(v.code).toBe('budget_bytes');
    expect(v.reason).toContain('maxOutputBytes 100 reached for this session (100 bytes');
  });

  it('maxWallTimeMs: budget_wall_time', () => {
    const b = budget({ maxWallTimeMs: 1000 });
    expect(b.beforeCall().action).toBe('allow');
    b.afterCall(done('', 0, 600));
    expect(b.beforeCall().action).toBe('allow');
    b.afterCall(done('', 0, 400));
    const v = denied(b.beforeCall());
    expect(v.code).toBe('budget_wall_time');
    expect(v.reason).toContain('maxWallTimeMs 1000 reached for this session (1000 ms of tool calls so far)');
  });

  it('rate: a sliding window on the injected clock, with retryAfterMs', () => {
    let now = 10_000;
    const b = budget({ rate: { calls: 2, perMs: 1000 } }, () => now);
    expect(b.beforeCall().action).toBe('allow'); // t=10000
    now += 400;
    expect(b.beforeCall().action).toBe('allow'); // t=10400
    now += 100;
    const v = denied(b.beforeCall()); // t=10500: the first call leaves the window at 11000
    expect(v.code).toBe('rate_limited');
    expect(v.retryAfterMs).toBe(500);
    expect(v.reason).toBe(
      'Airlock rate limit: at most 2 calls per 1000 ms for this session; retry in 500 ms',
    );
    now = 10_999;
    expect(denied(b.beforeCall()).retryAfterMs).toBe(1);
    now = 11_000;
    expect(b.beforeCall().action).toBe('allow'); // the first call left the window
    expect(denied(b.beforeCall()).retryAfterMs).toBe(400);
    now = 12_500;
    expect(b.beforeCall().action).toBe('allow');
    expect(b.beforeCall().action).toBe('allow');
    expect(b.usage().calls).toBe(5); // refused calls are not counted
  });

  it('checks hard budgets before the rate window', () => {
    let now = 0;
    const b = budget({ maxCalls: 1, rate: { calls: 1, perMs: 1000 } }, () => now);
    expect(b.beforeCall().action).toBe('allow');
    expect(denied(b.beforeCall()).code).toBe('budget_calls');
    now = 5000;
    expect(denied(b.beforeCall()).code).toBe('budget_calls');
  });

  it('reports usage and what is left', () => {
    const b = budget({ maxCalls: 10, maxOutputTokens: 100, maxOutputBytes: 1000, maxWallTimeMs: 5000 });
    b.beforeCall();
    b.beforeCall();
    b.afterCall(done('hello world', 11, 250));
    expect(b.usage()).toEqual({
      calls: 2,
      inFlight: 1,
      outputTokens: 2,
      outputBytes: 11,
      wallTimeMs: 250,
      remaining: { calls: 8, outputTokens: 98, outputBytes: 989, wallTimeMs: 4750 },
    });
  });

  it('refuses afterCall without a reserved call, and nonsense results', () => {
    const b = budget({});
    expect(() => b.afterCall(done())).toThrow(expect.objectContaining({ code: 'INTERNAL' }));
    b.beforeCall();
    expect(() => b.afterCall({ text: 'x', bytes: -1, durationMs: 0 })).toThrow(
      expect.objectContaining({ code: 'INVALID_ARGUMENT' }),
    );
    expect(() => b.afterCall({ text: 'x', bytes: 1, durationMs: Number.NaN })).toThrow(
      expect.objectContaining({ code: 'INVALID_ARGUMENT' }),
    );
    expect(() => b.afterCall(done())).not.toThrow();
  });
});

describe('SessionBudget: reserve at admission, settle after (concurrency)', () => {
  const perCall = (input: BudgetsInput, limits: { maxOutputBytes?: number; maxWallTimeMs?: number }) =>
    new SessionBudget(BudgetsSchema.parse(input), { perCall: limits });

  it('20 calls started together against maxCalls 5: exactly 5 admitted', () => {
    const b = budget({ maxCalls: 5 });
    const verdicts = Array.from({ length: 20 }, () => b.beforeCall());
    expect(verdicts.filter((v) => v.action === 'allow')).toHaveLength(5);
    expect(new Set(verdicts.slice(5).map((v) => denied(v).code))).toEqual(new Set(['budget_calls']));
    expect(b.usage()).toMatchObject({ calls: 5, inFlight: 5 });
  });

  it('output bytes: each call in flight holds what it may return; the rest is refused until one settles', () => {
    const b = perCall({ maxOutputBytes: 100_000 }, { maxOutputBytes: 64_000 });
    const first = b.beforeCall();
    const second = b.beforeCall();
    expect(first).toMatchObject({ action: 'allow', reservation: { outputBytes: 64_000 } });
    expect(second).toMatchObject({ action: 'allow', reservation: { outputBytes: 36_000 } });
    const third = denied(b.beforeCall());
    expect(third.code).toBe('budget_bytes');
    expect(third.reason).toMatch(/maxOutputBytes 100000 .* reserved by 2 call\(s\) still running; retry/);
    expect(b.reserved()).toMatchObject({ outputBytes: 100_000, calls: 2 });
    // Settling the first with 10 bytes used frees the rest of its reservation.
    b.afterCall(done('0123456789'), first.action === 'allow' ? first.reservation : undefined);
    const fourth = b.beforeCall();
    expect(fourth).toMatchObject({ action: 'allow', reservation: { outputBytes: 63_990 } });
    // The sum of what admitted calls may return never exceeds the budget.
    expect(b.reserved().outputBytes + b.usage().outputBytes).toBeLessThanOrEqual(100_000);
  });

  it('output tokens: reserved as bytes (a token is at least one byte)', () => {
    const b = perCall({ maxOutputTokens: 1000 }, { maxOutputBytes: 64_000 });
    expect(b.beforeCall()).toMatchObject({ action: 'allow', reservation: { outputTokens: 1000 } });
    expect(denied(b.beforeCall()).code).toBe('budget_tokens');
  });

  it('wall time: each call holds its hard cap (lowered by maxCallMs); 20 together against 3000 ms: 3 admitted', () => {
    const b = perCall({ maxWallTimeMs: 3000 }, { maxWallTimeMs: 1000 });
    const verdicts = Array.from({ length: 20 }, () => b.beforeCall());
    const allowed = verdicts.filter((v) => v.action === 'allow');
    expect(allowed).toHaveLength(3);
    for (const v of allowed) expect(v).toMatchObject({ reservation: { wallTimeMs: 1000 } });
    expect(new Set(verdicts.slice(3).map((v) => denied(v).code))).toEqual(new Set(['budget_wall_time']));

    const capped = perCall({ maxWallTimeMs: 3000, maxCallMs: 400 }, { maxWallTimeMs: 1000 });
    const n = Array.from({ length: 20 }, () => capped.beforeCall()).filter((v) => v.action === 'allow');
    expect(n).toHaveLength(8); // 7 x 400 + one holding the last 200
    expect(n[7]).toMatchObject({ reservation: { wallTimeMs: 200 } });
  });

  it('a hard cap is granted even without a wall-time budget; a reservation settles once', () => {
    const b = perCall({ maxCallMs: 250 }, { maxWallTimeMs: 1000 });
    const v = b.beforeCall();
    expect(v).toMatchObject({ action: 'allow', reservation: { wallTimeMs: 250 } });
    const r = v.action === 'allow' ? v.reservation : undefined;
    b.beforeCall();
    b.afterCall(done(), r);
    expect(() => b.afterCall(done(), r)).toThrow(expect.objectContaining({ code: 'INTERNAL' }));
  });
});

describe('BudgetsSchema', () => {
  it('accepts positive whole numbers; absent means unlimited', () => {
    expect(BudgetsSchema.parse({})).toEqual({});
    expect(BudgetsSchema.parse({ maxCalls: 50, rate: { calls: 5, perMs: 1000 } })).toEqual({
      maxCalls: 50,
      rate: { calls: 5, perMs: 1000 },
    });
  });

  it('rejects zero, negatives, fractions and unknown fields with the field named', () => {
    const field = (input: unknown) => {
      try {
        parseBudgets(input);
      } catch (e) {
        expect(e).toMatchObject({ code: 'MCP_INVALID_CONFIG' });
        return (e as { field?: string }).field;
      }
      throw new Error('expected an error');
    };
    expect(field({ maxCalls: 0 })).toBe('maxCalls');
    expect(field({ maxOutputTokens: -1 })).toBe('maxOutputTokens');
    expect(field({ maxOutputBytes: 1.5 })).toBe('maxOutputBytes');
    expect(field({ rate: { calls: 1 } })).toBe('rate.perMs');
    expect(field({ maxcalls: 3 })).toBe('maxcalls');
    expect(() => new SessionBudget({ maxCalls: 0 })).toThrow(
      expect.objectContaining({ code: 'MCP_INVALID_CONFIG' }),
    );
  });
});
