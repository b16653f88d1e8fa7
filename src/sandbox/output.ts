// Output shaping for one stream of one exec: keep a head and a tail in memory (bounded), spill the
// full stream to a file once it exceeds the limit. An unbounded tool output therefore never sits
// whole in the caller's memory; the producer is paused while the spill file catches up.
import { createWriteStream, type WriteStream } from 'node:fs';
import type { Readable } from 'node:stream';
import { StringDecoder } from 'node:string_decoder';

export interface CapturedStream {
  readonly text: string;
  readonly truncated: boolean;
  readonly totalBytes: number;
  readonly spillPath?: string;
}

export interface CaptureOptions {
  readonly maxBytes: number;
  /** Bytes kept in the spill file; beyond this the stream is drained and dropped. */
  readonly maxSpillBytes: number;
  /** Shared by every stream of a sandbox: its spill files together never exceed the budget. */
  readonly budget?: { left: number };
  readonly spillPath: () => string;
  readonly name: 'stdout' | 'stderr';
  readonly onText?: (text: string) => void;
}

export class OutputCapture {
  private readonly headMax: number;
  private readonly tailMax: number;
  private head: Buffer[] = [];
  private headBytes = 0;
  /** Everything seen while total <= maxBytes, so the spill file can start from byte 0. */
  private early: Buffer[] = [];
  private tail: Buffer[] = [];
  private tailBytes = 0;
  private total = 0;
  private spill: WriteStream | undefined;
  private spillFile: string | undefined;
  private spilled = 0;
  private spillError: Error | undefined;
  private awaitingDrain = false;
  private readonly decoder = new StringDecoder('utf8');
  private readonly done: Promise<void>;

  constructor(
    private readonly source: Readable,
    private readonly opts: CaptureOptions,
  ) {
    this.headMax = Math.floor(opts.maxBytes / 2);
    this.tailMax = opts.maxBytes - this.headMax;
    this.done = new Promise((resolve) => {
      source.on('data', (chunk: Buffer) => this.onData(chunk));
      source.on('error', () => resolve());
      source.on('close', () => resolve());
      source.on('end', () => resolve());
      // A pipe that reached EOF before anyone listened (a process killed while it was starting)
      // has already emitted 'end' and 'close', with nothing left unread.
      if (source.readableEnded || source.destroyed) resolve();
    });
  }

  private onData(chunk: Buffer): void {
    this.record(chunk);
    if (this.opts.onText) {
      const t = this.decoder.write(chunk);
      // A throwing callback must neither lose output nor crash the process reading the pipe.
      if (t) this.callback(t);
    }
  }

  private callback(t: string): void {
    try {
      this.opts.onText!(t);
    } catch {
      /* the caller's bug; the captured output is unaffected */
    }
  }

  private record(chunk: Buffer): void {
    this.total += chunk.length;
    // head
    if (this.headBytes < this.headMax) {
      const take = chunk.subarray(0, this.headMax - this.headBytes);
      this.head.push(take);
      this.headBytes += take.length;
    }
    // tail ring: append, then drop whole chunks from the front while still over the limit
    this.tail.push(chunk);
    this.tailBytes += chunk.length;
    while (this.tail.length > 1 && this.tailBytes - this.tail[0]!.length >= this.tailMax) {
      this.tailBytes -= this.tail.shift()!.length;
    }
    if (this.spill === undefined && this.spillFile === undefined) {
      if (this.total <= this.opts.maxBytes) {
        this.early.push(chunk);
        return;
      }
      this.startSpill();
    }
    this.writeSpill(chunk);
  }

  private startSpill(): void {
    this.spillFile = this.opts.spillPath();
    this.spill = createWriteStream(this.spillFile, { mode: 0o600 });
    this.spill.on('error', (e) => {
      this.spillError = e;
      this.source.resume();
    });
    for (const b of this.early) this.writeSpill(b);
    this.early = [];
  }

  private writeSpill(chunk: Buffer): void {
    if (!this.spill || this.spillError) return;
    const room = Math.min(this.opts.maxSpillBytes - this.spilled, this.opts.budget?.left ?? Infinity);
    if (room <= 0) return;
    const part = chunk.length > room ? chunk.subarray(0, room) : chunk;
    this.spilled += part.length;
    if (this.opts.budget) this.opts.budget.left -= part.length;
    if (!this.spill.write(part) && !this.awaitingDrain) {
      // Backpressure: stop reading from the sandbox until the disk catches up. One wait at a time:
      // the early chunks are written at once, and a paused source may still deliver a chunk.
      this.awaitingDrain = true;
      this.source.pause();
      this.spill.once('drain', () => {
        this.awaitingDrain = false;
        this.source.resume();
      });
    }
  }

  async finish(): Promise<CapturedStream> {
    await this.done;
    if (this.opts.onText) {
      const t = this.decoder.end();
      if (t) this.callback(t);
    }
    if (this.spill) {
      const s = this.spill;
      await new Promise<void>((r) => s.end(() => r()));
    }
    if (this.total <= this.opts.maxBytes) {
      return { text: Buffer.concat(this.early).toString('utf8'), truncated: false, totalBytes: this.total };
    }
    const head = Buffer.concat(this.head);
    let tail = Buffer.concat(this.tail);
    if (tail.length > this.tailMax) tail = tail.subarray(tail.length - this.tailMax);
    const omitted = this.total - head.length - tail.length;
    const where = this.spillError
      ? `the spill file could not be written (${this.spillError.message})`
      : this.spilled < this.total
        ? `first ${this.spilled} bytes in ${this.spillFile}`
        : `full output in ${this.spillFile}`;
    const marker = `\n…[airlock: ${omitted} bytes of ${this.opts.name} omitted (${this.total} total); ${where}]…\n`;
    return {
      text: head.toString('utf8') + marker + tail.toString('utf8'),
      truncated: true,
      totalBytes: this.total,
      ...(this.spillFile && !this.spillError ? { spillPath: this.spillFile } : {}),
    };
  }
}

/** Collect a stream as raw bytes up to a cap; returns undefined if the cap was exceeded. */
export async function collectBytes(source: Readable, maxBytes: number): Promise<Buffer | undefined> {
  const parts: Buffer[] = [];
  let n = 0;
  let over = false;
  for await (const chunk of source as AsyncIterable<Buffer>) {
    if (over) continue;
    n += chunk.length;
    if (n > maxBytes) {
      over = true;
      parts.length = 0;
      continue;
    }
    parts.push(chunk);
  }
  return over ? undefined : Buffer.concat(parts);
}
