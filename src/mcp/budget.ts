// Per-session budgets for MCP tool calls: how many calls, how much tool output (real o200k_base tokens
// and bytes), how much total call wall time, a sliding-window rate, and a hard cap on one call's wall
// time. Mechanism with its own small verdict: the gateway asks beforeCall() before forwarding a
// tools/call (after policy allowed it) and reports afterCall() when the result is back.
// Calls in flight count at admission (reserve, then settle): an allowed call is counted at once and,
// when the budget knows the most one call can use (`perCall`: the output guard's cap, the hard wall-time
// cap), it reserves that much of what is left of each output and wall-time budget. The gateway holds the
// call to its reservation (output cut to it, the call cancelled at it), so 20 concurrent calls cannot
// spend more than the budget: calls beyond what is left unreserved are refused. afterCall() releases the
// reservation and adds what was really used. No sleeping, no timers: the clock is injected.
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
    maxCallMs: positiveInt('maxCallMs')
      .optional()
      .describe(
        'Hard wall-time cap of one tool call, in milliseconds: the call is cancelled then, however much progress it reports.',
      ),
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

/** What one admitted call may use at most (absent: not limited by a budget). */
export interface Reservation {
  readonly id: number;
  readonly outputTokens?: number;
  readonly outputBytes?: number;
  readonly wallTimeMs?: number;
}

export type BudgetVerdict =
  | { action: 'allow'; reservation?: Reservation }
  | { action: 'deny'; code: BudgetDenyCode; reason: string; retryAfterMs?: number };

/** The most one call can use, when the caller enforces it (enables reservations). */
export interface PerCallLimits {
  /** Output bytes one call can return (the output guard's cap). Tokens are never more than bytes. */
  readonly maxOutputBytes?: number;
  /** Wall time one call can take (its hard cap). */
  readonly maxWallTimeMs?: number;
}

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
/**
 * The smallest output reservation worth a call: below it, the output guard's truncation notice alone
 * could overrun what is left, so the rest of an output budget is not handed out.
 */
const MIN_OUTPUT_GRANT_BYTES = 1024;
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
  private readonly perCall: PerCallLimits;
  /** Reservations of the calls in flight, oldest first (Map keeps insertion order). */
  private readonly reservations = new Map<number, Reservation>();
  private reservationSeq = 0;

  constructor(budgets: Budgets, opts: { now?: () => number; perCall?: PerCallLimits } = {}) {
    this.budgets = parseBudgets(budgets);
    this.now = opts.now ?? (() => performance.now());
    this.perCall = opts.perCall ?? {};
    tokenizer(); // loaded with the session, not by (and on the latency of) its first tool call
  }

  /** Totals reserved by the calls in flight. */
  reserved(): { outputTokens: number; outputBytes: number; wallTimeMs: number; calls: number } {
    const out = { outputTokens: 0, outputBytes: 0, wallTimeMs: 0, calls: this.reservations.size };
    for (const r of this.reservations.values()) {
      out.outputTokens += r.outputTokens ?? 0;
      out.outputBytes += r.outputBytes ?? 0;
      out.wallTimeMs += r.wallTimeMs ?? 0;
    }
    return out;
  }

  /** Whether one more call may start; on allow the call is counted and its reservation made at once. */
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
    // What is left once the calls in flight have their reservations: nothing left is a refusal too.
    const held = this.reserved();
    const perCallBytes = this.perCall.maxOutputBytes;
    const perCallWall = Math.min(this.perCall.maxWallTimeMs ?? Infinity, b.maxCallMs ?? Infinity);
    const grant: { outputTokens?: number; outputBytes?: number; wallTimeMs?: number } = {};
    const dims = [
      [
        'outputTokens',
        'budget_tokens',
        'maxOutputTokens',
        b.maxOutputTokens,
        this.outputTokens,
        perCallBytes,
      ],
      ['outputBytes', 'budget_bytes', 'maxOutputBytes', b.maxOutputBytes, this.outputBytes, perCallBytes],
      ['wallTimeMs', 'budget_wall_time', 'maxWallTimeMs', b.maxWallTimeMs, this.wallTimeMs, perCallWall],
    ] as const;
    for (const [key, code, name, max, used, perCall] of dims) {
      if (max === undefined || perCall === undefined || perCall === Infinity) continue;
      const left = max - used - held[key];
      const floor = key === 'wallTimeMs' ? 1 : Math.min(MIN_OUTPUT_GRANT_BYTES, perCall, max);
      if (left < floor && held.calls === 0) {
        return this.exhausted(
          code,
          `${name} ${max} reached for this session (${Math.max(0, Math.floor(left))} left, less than one call's ${floor})`,
        );
      }
      if (left < floor) {
        return {
          action: 'deny',
          code,
          reason: `Airlock budget held by calls in flight: what is left of ${name} ${max} for this session is reserved by ${held.calls} call(s) still running; retry when one finishes`,
        };
      }
      grant[key] = Math.min(perCall, left);
    }
    if (grant.wallTimeMs === undefined && perCallWall !== Infinity) grant.wallTimeMs = perCallWall;
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
    if (Object.keys(grant).length === 0) return { action: 'allow' };
    const reservation: Reservation = { id: ++this.reservationSeq, ...grant };
    this.reservations.set(reservation.id, reservation);
    return { action: 'allow', reservation };
  }

  /**
   * Account for a call that beforeCall() allowed (also for calls that failed: pass what came back),
   * releasing its reservation (the one given, else the oldest still held).
   */
  afterCall(result: CallResult, reservation?: Reservation): void {
    if (this.inFlight === 0) {
      throw new AirlockError('INTERNAL', 'SessionBudget.afterCall() without a matching allowed beforeCall()');
    }
    if (reservation !== undefined && !this.reservations.has(reservation.id)) {
      throw new AirlockError('INTERNAL', 'SessionBudget.afterCall(): that reservation was already settled');
    }
    const { text, bytes, durationMs } = result;
    if (typeof text !== 'string' || !Number.isFinite(bytes) || bytes < 0) {
      throw new AirlockError('INVALID_ARGUMENT', 'afterCall needs text (string) and bytes (>= 0)');
    }
    if (!Number.isFinite(durationMs) || durationMs < 0) {
      throw new AirlockError('INVALID_ARGUMENT', 'afterCall needs durationMs (>= 0)');
    }
    this.inFlight--;
    const id = reservation?.id ?? this.reservations.keys().next().value;
    if (id !== undefined) this.reservations.delete(id);
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
