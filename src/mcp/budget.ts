// Per-session budgets for MCP tool calls: how many calls, how much tool output (real o200k_base tokens
// and bytes), how much total call wall time, and a sliding-window rate. Mechanism with its own small
// verdict: the gateway asks beforeCall() before forwarding a tools/call (after policy allowed it) and
// reports afterCall() when the result is back. Budgets are checked against what was used BEFORE the
// call: the call that crosses a line completes (its output is shaped by the output guard), the next one
// is refused. No sleeping, no timers: the clock is injected.
import type * as O200k from 'gpt-tokenizer/encoding/o200k_base';
import { z } from 'zod';
import { AirlockError } from '../core/errors.js';
import { parseOrThrow } from '../core/validate.js';
import { lazyRequire } from '../core/lazy.js';

/** The o200k_base tokenizer (≈0.2 s to load): loaded when a session budget is made. */
const tokenizer = lazyRequire<typeof O200k>('gpt-tokenizer/encoding/o200k_base');

const positiveInt = (what: string) =>
  z.number().int(`${what} must be a whole number`).positive(`${what} must be positive`);

export const BudgetsSchema = z
  .object({
    maxCalls: positiveInt('maxCalls').optional().describe('Tool calls per session.'),
    maxOutputTokens: positiveInt('maxOutputTokens')
      .optional()
      .describe('Tokens (o200k_base) of tool output returned to the model per session.'),
    maxOutputBytes: positiveInt('maxOutputBytes')
      .optional()
      .describe('Bytes of tool output returned to the model per session.'),
    maxWallTimeMs: positiveInt('maxWallTimeMs')
      .optional()
      .describe('Total wall time of the tool calls of a session, in milliseconds.'),
    rate: z
      .object({
        calls: positiveInt('rate.calls'),
        perMs: positiveInt('rate.perMs'),
      })
      .strict()
      .optional()
      .describe('At most `calls` tool calls started in any window of `perMs` milliseconds.'),
  })
  .strict()
  .describe('Per-session budgets; an absent field is unlimited.');

export type BudgetsInput = z.input<typeof BudgetsSchema>;
export type Budgets = z.output<typeof BudgetsSchema>;

export type BudgetDenyCode =
  'budget_calls' | 'budget_tokens' | 'budget_bytes' | 'budget_wall_time' | 'rate_limited';

export type BudgetVerdict =
  { action: 'allow' } | { action: 'deny'; code: BudgetDenyCode; reason: string; retryAfterMs?: number };

export interface CallResult {
  /** The text returned to the model (what its tokens are counted on). */
  text: string;
  /** Bytes of output returned to the model. */
  bytes: number;
  /** How long the call took. */
  durationMs: number;
}

export interface BudgetUsage {
  /** Calls allowed so far (including those still running). */
  calls: number;
  inFlight: number;
  outputTokens: number;
  outputBytes: number;
  wallTimeMs: number;
  /** What is left of each configured budget (absent = unlimited). */
  remaining: {
    calls?: number;
    outputTokens?: number;
    outputBytes?: number;
    wallTimeMs?: number;
  };
}

/** Tokens of `text` in the o200k_base encoding; special-token text counts as ordinary text, never throws. */
export function countOutputTokens(text: string): number {
  return tokenizer().countTokens(text, { disallowedSpecial: new Set() });
}

/** Validate budgets (e.g. from a CLI flag); failures are MCP_INVALID_CONFIG naming the field. */
export function parseBudgets(input: unknown, what = 'budgets'): Budgets {
  try {
    return parseOrThrow(BudgetsSchema, input ?? {}, what);
  } catch (e) {
    if (!AirlockError.isInstance(e)) throw e;
    throw new AirlockError('MCP_INVALID_CONFIG', e.message, { field: e.field, cause: e });
  }
}

const EXHAUSTED = 'Airlock budget exhausted: ';
const ADVICE = 'start a new session or ask the operator to raise it';

export class SessionBudget {
  private readonly budgets: Budgets;
  private readonly now: () => number;
  private calls = 0;
  private inFlight = 0;
  private outputTokens = 0;
  private outputBytes = 0;
  private wallTimeMs = 0;
  /** Start times of the calls inside the current rate window, oldest first. */
  private readonly window: number[] = [];

  constructor(budgets: Budgets, opts: { now?: () => number } = {}) {
    this.budgets = parseBudgets(budgets);
    this.now = opts.now ?? (() => performance.now());
    tokenizer(); // loaded with the session, not by (and on the latency of) its first tool call
  }

  /** Whether one more call may start; on allow the call is counted (reserved) right away. */
  beforeCall(): BudgetVerdict {
    const b = this.budgets;
    if (b.maxCalls !== undefined && this.calls >= b.maxCalls) {
      return this.exhausted('budget_calls', `maxCalls ${b.maxCalls} reached for this session`);
    }
    if (b.maxOutputTokens !== undefined && this.outputTokens >= b.maxOutputTokens) {
      return this.exhausted(
        'budget_tokens',
        `maxOutputTokens ${b.maxOutputTokens} reached for this session (${this.outputTokens} tokens of tool output so far)`,
      );
    }
    if (b.maxOutputBytes !== undefined && this.outputBytes >= b.maxOutputBytes) {
      return this.exhausted(
        'budget_bytes',
        `maxOutputBytes ${b.maxOutputBytes} reached for this session (${this.outputBytes} bytes of tool output so far)`,
      );
    }
    if (b.maxWallTimeMs !== undefined && this.wallTimeMs >= b.maxWallTimeMs) {
      return this.exhausted(
        'budget_wall_time',
        `maxWallTimeMs ${b.maxWallTimeMs} reached for this session (${Math.round(this.wallTimeMs)} ms of tool calls so far)`,
      );
    }
    const now = this.now();
    if (b.rate !== undefined) {
      while (this.window.length > 0 && this.window[0]! <= now - b.rate.perMs) this.window.shift();
      if (this.window.length >= b.rate.calls) {
        const retryAfterMs = Math.max(1, Math.ceil(this.window[0]! + b.rate.perMs - now));
        return {
          action: 'deny',
          code: 'rate_limited',
          reason: `Airlock rate limit: at most ${b.rate.calls} calls per ${b.rate.perMs} ms for this session; retry in ${retryAfterMs} ms`,
          retryAfterMs,
        };
      }
      this.window.push(now);
    }
    this.calls++;
    this.inFlight++;
    return { action: 'allow' };
  }

  /** Account for a call that beforeCall() allowed (also for calls that failed: pass what came back). */
  afterCall(result: CallResult): void {
    if (this.inFlight === 0) {
      throw new AirlockError('INTERNAL', 'SessionBudget.afterCall() without a matching allowed beforeCall()');
    }
    const { text, bytes, durationMs } = result;
    if (typeof text !== 'string' || !Number.isFinite(bytes) || bytes < 0) {
      throw new AirlockError('INVALID_ARGUMENT', 'afterCall needs text (string) and bytes (>= 0)');
    }
    if (!Number.isFinite(durationMs) || durationMs < 0) {
      throw new AirlockError('INVALID_ARGUMENT', 'afterCall needs durationMs (>= 0)');
    }
    this.inFlight--;
    this.outputTokens += countOutputTokens(text);
    this.outputBytes += bytes;
    this.wallTimeMs += durationMs;
  }

  usage(): BudgetUsage {
    const b = this.budgets;
    const left = (max: number | undefined, used: number) =>
      max === undefined ? undefined : Math.max(0, max - used);
    const remaining: BudgetUsage['remaining'] = {};
    const calls = left(b.maxCalls, this.calls);
    const outputTokens = left(b.maxOutputTokens, this.outputTokens);
    const outputBytes = left(b.maxOutputBytes, this.outputBytes);
    const wallTimeMs = left(b.maxWallTimeMs, this.wallTimeMs);
    if (calls !== undefined) remaining.calls = calls;
    if (outputTokens !== undefined) remaining.outputTokens = outputTokens;
    if (outputBytes !== undefined) remaining.outputBytes = outputBytes;
    if (wallTimeMs !== undefined) remaining.wallTimeMs = wallTimeMs;
    return {
      calls: this.calls,
      inFlight: this.inFlight,
      outputTokens: this.outputTokens,
      outputBytes: this.outputBytes,
      wallTimeMs: this.wallTimeMs,
      remaining,
    };
  }

  private exhausted(code: BudgetDenyCode, what: string): BudgetVerdict {
    return { action: 'deny', code, reason: `${EXHAUSTED}${what}; ${ADVICE}` };
  }
}
