// An MCP transport over a pair of byte streams (a sandboxed server's stdout/stdin, or Airlock's own
// stdin/stdout when it is the server a client launched). Every incoming line goes through the one
// canonical parser (frame.ts): what the gateway checks is exactly what it forwards. A broken frame
// is reported through `onframeerror` and dropped; it never closes the session. When it carried a
// request id, the peer gets a JSON-RPC error answer (in both directions: a client's broken request to
// the gateway, a server's broken request to its client). When it was a response, the local side's
// pending request with that id fails at once with the reason instead of waiting for its timeout.
import type { Readable, Writable } from 'node:stream';
import type { Transport, TransportSendOptions } from '@modelcontextprotocol/sdk/shared/transport.js';
import type { JSONRPCMessage } from '@modelcontextprotocol/sdk/types.js';
import { AirlockError } from '../core/errors.js';
import { LineFramer, jsonRpcErrorFor, serializeMessage, type JsonRpcMessage } from './frame.js';

export interface FrameErrorInfo {
  readonly code: string;
  readonly reason: string;
  readonly id?: string | number;
  /** The id of a broken response (see ParseFailure.responseId). */
  readonly responseId?: string | number;
}

export interface StreamTransportOptions {
  /** Answer a broken request that carried an id with a JSON-RPC error. Default true (either peer). */
  readonly answerBrokenRequests?: boolean;
  readonly maxFrameBytes?: number;
  /** Longest string in a message (default: the parser's 4 MiB; a server's results may be larger). */
  readonly maxStringBytes?: number;
  /**
   * Most bytes written but not yet taken by the peer (default 32 MiB). A peer that stops reading while
   * the other side keeps sending (a fast server, a slow client) does not grow memory past it: the
   * transport closes instead, after `onoverflow`. One message always fits into an empty buffer.
   */
  readonly maxBufferedBytes?: number;
}

export const DEFAULT_MAX_BUFFERED_BYTES = 32 * 1024 * 1024;

export class StreamTransport implements Transport {
  onclose?: () => void;
  onerror?: (error: Error) => void;
  onmessage?: (message: JSONRPCMessage) => void;
  /** Sees every parsed message first; returning true consumes it (the SDK never sees it). */
  intercept?: (message: JSONRPCMessage) => boolean;
  /** Called for every frame the canonical parser rejected. */
  onframeerror?: (info: FrameErrorInfo) => void;
  /** The peer stopped reading: `bufferedBytes` waited for it when the transport gave up and closed. */
  onoverflow?: (info: { bufferedBytes: number; maxBufferedBytes: number }) => void;
  /** Bytes read and written so far (for audit). */
  bytesIn = 0;
  bytesOut = 0;
  private readonly framer: LineFramer;
  private started = false;
  private closed = false;
  private corked = false;
  private drainWaiters: Array<{ resolve: () => void; reject: (e: Error) => void }> = [];

  constructor(
    private readonly input: Readable,
    private readonly output: Writable,
    private readonly opts: StreamTransportOptions = {},
  ) {
    this.framer = new LineFramer({
      ...(opts.maxFrameBytes ? { maxFrameBytes: opts.maxFrameBytes } : {}),
      ...(opts.maxStringBytes ? { maxStringBytes: opts.maxStringBytes } : {}),
    });
  }

  async start(): Promise<void> {
    if (this.started) throw new Error('StreamTransport already started');
    this.started = true;
    this.input.on('data', this.onData);
    this.input.on('end', this.onEnd);
    this.input.on('error', this.onStreamError);
    this.output.on('error', this.onStreamError);
  }

  private readonly onData = (chunk: Buffer): void => {
    this.bytesIn += chunk.length;
    for (const ev of this.framer.push(chunk)) this.dispatch(ev);
  };

  private readonly onEnd = (): void => {
    for (const ev of this.framer.end()) this.dispatch(ev);
    void this.close();
  };

  private readonly onStreamError = (e: Error): void => {
    this.onerror?.(e);
  };

  private dispatch(ev: ReturnType<LineFramer['push']>[number]): void {
    if (ev.kind === 'message') {
      if (this.intercept?.(ev.message as JSONRPCMessage)) return;
      this.onmessage?.(ev.message as JSONRPCMessage);
      return;
    }
    this.onframeerror?.({
      code: ev.code,
      reason: ev.reason,
      ...(ev.id !== undefined ? { id: ev.id } : {}),
      ...(ev.responseId !== undefined ? { responseId: ev.responseId } : {}),
    });
    if (this.opts.answerBrokenRequests !== false && ev.id !== undefined) {
      this.writeLine(
        serializeMessage(jsonRpcErrorFor({ ok: false, code: ev.code, reason: ev.reason, id: ev.id })),
      ).catch(() => {}); // the transport closed first: nobody is left to answer
    }
    if (ev.responseId !== undefined) {
      // The peer's answer to one of our requests was unreadable: that request fails now, saying why.
      // (The peer could have sent a valid error response with that id just as well: no new power.)
      const { error } = jsonRpcErrorFor({ ok: false, code: ev.code, reason: ev.reason });
      this.onmessage?.({
        jsonrpc: '2.0',
        id: ev.responseId,
        error: { code: error.code, message: `Airlock dropped the peer's answer: ${error.message}` },
      });
    }
  }

  async send(message: JSONRPCMessage, _opts?: TransportSendOptions): Promise<void> {
    if (this.closed) throw new Error('transport closed');
    await this.writeLine(serializeMessage(message as JsonRpcMessage));
  }

  /** Bytes written to the output that the peer has not taken yet. */
  get bufferedBytes(): number {
    return this.output.writableLength;
  }

  private writeLine(line: string): Promise<void> {
    return new Promise((resolve, reject) => {
      if (this.output.destroyed || this.output.writableEnded) return resolve();
      const bytes = Buffer.byteLength(line);
      // Backpressure has a bound: sends wait for 'drain' below, but every sender's bytes are held until
      // the peer reads them. Past the cap the peer is not reading: close rather than grow.
      const max = this.opts.maxBufferedBytes ?? DEFAULT_MAX_BUFFERED_BYTES;
      const waiting = this.output.writableLength;
      if (waiting > 0 && waiting + bytes > max) {
        this.onoverflow?.({ bufferedBytes: waiting, maxBufferedBytes: max });
        reject(
          new AirlockError(
            'CAPACITY_EXHAUSTED',
            `the peer is not reading: ${waiting} bytes wait for it (cap ${max}); the transport is closed`,
          ),
        );
        void this.close();
        this.output.destroy();
        return;
      }
      this.bytesOut += bytes;
      // Lines written in the same turn of the event loop (many calls in flight) leave in one write
      // and wake the peer once; the stream is uncorked right after the turn's I/O callbacks.
      if (!this.corked) {
        this.corked = true;
        this.output.cork();
        setImmediate(this.uncork);
      }
      if (this.output.write(line)) resolve();
      // A slow peer: every send held up waits for the same 'drain' (one listener, however many).
      else if (this.drainWaiters.push({ resolve, reject }) === 1) this.output.once('drain', this.drained);
    });
  }

  private readonly drained = (): void => {
    const waiters = this.drainWaiters;
    this.drainWaiters = [];
    for (const w of waiters) w.resolve();
  };

  private readonly uncork = (): void => {
    this.corked = false;
    this.output.uncork();
  };

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.input.off('data', this.onData);
    this.input.off('end', this.onEnd);
    this.input.pause(); // stop reading (and let a process whose stdin this is exit)
    // Sends still waiting for the peer to read will not be read now: they fail instead of hanging.
    this.output.off('drain', this.drained);
    const waiters = this.drainWaiters;
    this.drainWaiters = [];
    for (const w of waiters) w.reject(new Error('transport closed'));
    this.onclose?.();
  }
}
