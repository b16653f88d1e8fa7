// A push queue read as an async iterator: producers push (from stream and process callbacks), one
// consumer iterates. It wakes on `signal` (a client that went away) as well as on new items, so a
// consumer waiting for output stops at once instead of at the next item (an async generator's
// return() waits for its pending await; the signal does not).
import { AirlockError } from '../core/errors.js';

export class PushQueue<T> {
  private readonly items: T[] = [];
  private done = false;
  private failure: unknown;
  private wake: (() => void) | undefined;
  /** Sum of `weigh(item)` over queued items (e.g. bytes), for back-pressure. */
  private queuedWeight = 0;

  constructor(
    private readonly opts: {
      signal?: AbortSignal | undefined;
      weigh?: (item: T) => number;
      /** Called when the queued weight crosses `highWater` upwards (true) or drops to 0 (false). */
      onPressure?: (high: boolean) => void;
      highWater?: number;
    } = {},
  ) {
    opts.signal?.addEventListener('abort', () => this.wake?.(), { once: true });
  }

  get weight(): number {
    return this.queuedWeight;
  }

  get ended(): boolean {
    return this.done;
  }

  push(item: T): void {
    if (this.done) return;
    this.items.push(item);
    const before = this.queuedWeight;
    this.queuedWeight += this.opts.weigh?.(item) ?? 0;
    const hw = this.opts.highWater ?? Infinity;
    if (before <= hw && this.queuedWeight > hw) this.opts.onPressure?.(true);
    this.wake?.();
  }

  /** No more items; the consumer gets what is queued, then the end (or `error`, thrown). */
  end(error?: unknown): void {
    if (this.done) return;
    this.done = true;
    this.failure = error;
    this.wake?.();
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<T> {
    for (;;) {
      if (this.opts.signal?.aborted) throw new AirlockError('ABORTED', 'the stream was cancelled');
      const item = this.items.shift();
      if (item !== undefined) {
        const w = this.opts.weigh?.(item) ?? 0;
        this.queuedWeight -= w;
        if (w > 0 && this.queuedWeight === 0) this.opts.onPressure?.(false);
        yield item;
        continue;
      }
      if (this.done) {
        if (this.failure !== undefined) throw this.failure;
        return;
      }
      await new Promise<void>((r) => (this.wake = r));
      this.wake = undefined;
    }
  }
}
