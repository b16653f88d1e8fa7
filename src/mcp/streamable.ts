// SECURITY-CRITICAL: the server side of one MCP Streamable HTTP session (spec 2025-11-25, "Streamable
// HTTP"), on node:http directly. It replaces the MCP SDK's StreamableHTTPServerTransport, which turns
// every POST into a WHATWG Request/Response pair through @hono/node-server and answers each request
// with an SSE stream (a ReadableStream, a TextEncoder, a keep-alive timer and an event-store write per
// call): most of the gateway's CPU per tools/call, and the SSE answer is also what makes the SDK's
// client slow (a TextDecoderStream and an event-source parser per call). Same rules as the SDK's
// transport (1.32.2), checked in the same order with the same status codes:
//   POST   Accept must list application/json and text/event-stream (406), Content-Type must be JSON
//          (415); initialize opens the session once (400 on a second one); any other message needs
//          the session id (400 without, 404 for another) and a supported MCP-Protocol-Version (400).
//          Notifications and responses: 202. A request: its answer (below).
//   GET    the session's one standalone SSE stream (409 for a second), or a resumption with
//          Last-Event-ID (replayed from the event store).
//   DELETE ends the session.
// How a request is answered (the spec lets the server pick per request: the client accepts both):
// a client whose Accept lists text/event-stream first gets an SSE stream at once; otherwise the
// answer waits up to `jsonWindowMs` for the response. If the response comes first and nothing
// else was sent for the request, it goes out as one application/json body. As soon as anything else
// is sent for the request (progress, a log message, a sampling or elicitation request), or the window
// passes, the answer turns into an SSE stream exactly like the SDK's: headers, a priming event with an
// event id (when the session negotiated 2025-11-25 or later: resumable from then on), every message stored in the event store
// before it is written, keep-alive comments. A request id is in flight from its POST until its
// response is sent; a second request with the same id meanwhile is refused (it would take over the
// first one's answer).
import { randomUUID } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { EventStore } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { isJsonContentType } from '@modelcontextprotocol/sdk/shared/mediaType.js';
import type { Transport, TransportSendOptions } from '@modelcontextprotocol/sdk/shared/transport.js';
import {
  DEFAULT_NEGOTIATED_PROTOCOL_VERSION,
  SUPPORTED_PROTOCOL_VERSIONS,
  type JSONRPCMessage,
  type MessageExtraInfo,
  type RequestId,
} from '@modelcontextprotocol/sdk/types.js';

export interface StreamableOptions {
  /** The session id handed to the client on initialize. */
  readonly sessionIdGenerator: () => string;
  /** Events kept for resumption (Last-Event-ID); without it, streams are not resumable. */
  readonly eventStore?: EventStore;
  readonly onsessioninitialized?: (sessionId: string) => void;
  readonly onsessionclosed?: (sessionId: string) => void;
  /** How long a request's answer may wait for its response as plain JSON before it turns into SSE. */
  readonly jsonWindowMs?: number;
  /** Interval of SSE keep-alive comments. */
  readonly keepAliveMs?: number;
  /** `retry` field of priming events (ms), if set. */
  readonly retryIntervalMs?: number;
  /**
   * Most bytes of this session's answers and events written but not yet taken by the client, over all
   * its open streams (default 32 MiB). A client that stops reading while a server keeps sending does
   * not grow the gateway's memory past it: the session is closed (streams destroyed) after
   * `onoverflow`. One message always fits when nothing is waiting.
   */
  readonly maxBufferedBytes?: number;
  readonly onoverflow?: (info: { bufferedBytes: number; maxBufferedBytes: number }) => void;
}

const DEFAULT_MAX_BUFFERED_BYTES = 32 * 1024 * 1024;

/**
 * Long enough that a call which only waited in a queue (64 calls in flight on a loaded host spend
 * ~100 ms in the gateway) still gets the cheap JSON answer: SSE answers cost both sides more CPU, so
 * a short window tips a busy gateway into answering everything as SSE. Short enough that a really
 * long call is soon resumable, and far below any client's header timeout (the SDK's request timeout
 * is 60 s, undici's header timeout 300 s).
 */
const DEFAULT_JSON_WINDOW_MS = 1000;
const DEFAULT_KEEP_ALIVE_MS = 15_000;
const STANDALONE = '_GET_stream';
const SSE_HEADERS = {
  'content-type': 'text/event-stream',
  'cache-control': 'no-cache, no-transform',
  connection: 'keep-alive',
  'x-accel-buffering': 'no',
} as const;

/** One open HTTP answer: a request's (pending JSON, then maybe SSE) or the standalone/replayed stream. */
interface Stream {
  readonly id: string;
  readonly res: ServerResponse;
  mode: 'pending' | 'sse' | 'done';
  /** Client protocol version (decides the priming event). */
  readonly proto: string;
  /** The pending window, then the keep-alive interval. */
  timer?: NodeJS.Timeout;
  /** Resolves once the SSE headers and priming event are out (messages are written after it). */
  ready?: Promise<void>;
  /** Events a resumption already replayed on this stream (not written twice). */
  replayed?: Set<string>;
}

const isResponse = (m: JSONRPCMessage): m is JSONRPCMessage & { id: RequestId } =>
  !('method' in m) && ('result' in m || 'error' in m);

export class NodeStreamableTransport implements Transport {
  sessionId?: string;
  onclose?: () => void;
  onerror?: (error: Error) => void;
  onmessage?: (message: JSONRPCMessage, extra?: MessageExtraInfo) => void;

  private started = false;
  private initialized = false;
  private closed = false;
  private readonly streams = new Map<string, Stream>();
  /** Request id → the stream its answer goes to (from its POST until its response is sent). */
  private readonly requestStream = new Map<RequestId, string>();
  /** Streams whose client holds a Last-Event-ID cursor (an id-bearing event went out on them). */
  private readonly resumable = new Set<string>();
  private readonly jsonWindowMs: number;
  /** The initialize request's id, and the protocol version the server answered it with. */
  private initRequestId?: RequestId;
  private negotiated?: string;
  private readonly keepAliveMs: number;

  constructor(private readonly opts: StreamableOptions) {
    this.jsonWindowMs = opts.jsonWindowMs ?? DEFAULT_JSON_WINDOW_MS;
    this.keepAliveMs = opts.keepAliveMs ?? DEFAULT_KEEP_ALIVE_MS;
  }

  async start(): Promise<void> {
    if (this.started) throw new Error('Transport already started');
    this.started = true;
  }

  /** One HTTP request of this session; `body` is the POST body, already through the canonical parser. */
  async handleRequest(req: IncomingMessage, res: ServerResponse, body?: JSONRPCMessage): Promise<void> {
    if (this.closed) return this.fail(res, 404, -32001, 'Session not found', false);
    switch (req.method) {
      case 'POST':
        return this.post(req, res, body);
      case 'GET':
        return this.get(req, res);
      case 'DELETE':
        return this.delete(req, res);
      default:
        this.onerror?.(new Error('Method not allowed.'));
        res.writeHead(405, { allow: 'GET, POST, DELETE', 'content-type': 'application/json' });
        res.end(
          JSON.stringify({
            jsonrpc: '2.0',
            error: { code: -32000, message: 'Method not allowed.' },
            id: null,
          }),
        );
    }
  }

  private fail(res: ServerResponse, status: number, code: number, message: string, report = true): void {
    if (report) this.onerror?.(new Error(message));
    if (res.headersSent) {
      res.end();
      return;
    }
    res.writeHead(status, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ jsonrpc: '2.0', error: { code, message }, id: null }));
  }

  /** The session and protocol-version checks of every request after initialize; false: answered. */
  private checkSession(req: IncomingMessage, res: ServerResponse): boolean {
    if (!this.initialized) {
      this.fail(res, 400, -32000, 'Bad Request: Server not initialized');
      return false;
    }
    const sid = req.headers['mcp-session-id'];
    if (!sid) {
      this.fail(res, 400, -32000, 'Bad Request: Mcp-Session-Id header is required');
      return false;
    }
    if (sid !== this.sessionId) {
      this.fail(res, 404, -32001, 'Session not found');
      return false;
    }
    const v = req.headers['mcp-protocol-version'];
    if (v !== undefined && !SUPPORTED_PROTOCOL_VERSIONS.includes(String(v))) {
      this.fail(
        res,
        400,
        -32000,
        `Bad Request: Unsupported protocol version: ${String(v)} (supported versions: ${SUPPORTED_PROTOCOL_VERSIONS.join(', ')})`,
      );
      return false;
    }
    return true;
  }

  private async post(req: IncomingMessage, res: ServerResponse, message?: JSONRPCMessage): Promise<void> {
    const accept = req.headers.accept;
    if (!accept?.includes('application/json') || !accept.includes('text/event-stream')) {
      return this.fail(
        res,
        406,
        -32000,
        'Not Acceptable: Client must accept both application/json and text/event-stream',
      );
    }
    if (!isJsonContentType(req.headers['content-type'])) {
      return this.fail(res, 415, -32000, 'Unsupported Media Type: Content-Type must be application/json');
    }
    if (message === undefined) return this.fail(res, 400, -32700, 'Parse error: Invalid JSON');
    const isRequest = 'method' in message && 'id' in message;
    const isInit = isRequest && message.method === 'initialize';
    if (isInit) {
      if (this.initialized) return this.fail(res, 400, -32600, 'Invalid Request: Server already initialized');
      this.sessionId = this.opts.sessionIdGenerator();
      this.initialized = true;
      this.opts.onsessioninitialized?.(this.sessionId);
    } else if (!this.checkSession(req, res)) return;
    if (this.closed) return this.fail(res, 404, -32001, 'Session not found', false);

    const requestInfo = { headers: req.headers };
    if (!isRequest) {
      // Notifications and responses (to sampling, elicitation, roots): accepted, nothing to answer.
      this.onmessage?.(message, { requestInfo });
      res.writeHead(202);
      res.end();
      return;
    }
    const id = message.id;
    if (this.requestStream.has(id)) {
      return this.fail(res, 400, -32600, 'invalid request: this id is in use by a request in flight');
    }
    // The protocol version decides whether the client can take a priming event (empty data; from
    // 2025-11-25 on). The version the session negotiated counts, not a request header that says
    // otherwise: the client committed to it at initialize.
    if (isInit) this.initRequestId = id;
    const proto = isInit
      ? String((message.params as { protocolVersion?: unknown } | undefined)?.protocolVersion ?? '')
      : (this.negotiated ??
        String(req.headers['mcp-protocol-version'] ?? DEFAULT_NEGOTIATED_PROTOCOL_VERSION));
    const stream: Stream = { id: randomUUID(), res, mode: 'pending', proto };
    this.streams.set(stream.id, stream);
    this.requestStream.set(id, stream.id);
    res.once('close', () => this.gone(stream));
    // A client that lists text/event-stream before application/json asks for SSE: it gets the stream
    // (and its priming event) from the start, as from the SDK's transport.
    if (accept.indexOf('text/event-stream') < accept.indexOf('application/json')) void this.toSse(stream);
    else stream.timer = setTimeout(() => void this.toSse(stream), this.jsonWindowMs);
    const resumableByClient = this.opts.eventStore !== undefined && proto >= '2025-11-25';
    this.onmessage?.(message, {
      requestInfo,
      ...(resumableByClient
        ? {
            closeSSEStream: () => this.closeSSEStream(id),
            closeStandaloneSSEStream: () => this.closeStandaloneSSEStream(),
          }
        : {}),
    });
  }

  /** The client went away (or the answer ended): forget the stream; its request may still be replayed. */
  private gone(stream: Stream): void {
    if (stream.timer) clearTimeout(stream.timer);
    stream.mode = 'done';
    if (this.streams.get(stream.id) === stream) this.streams.delete(stream.id);
  }

  /** Turn a pending answer into an SSE stream: headers, priming event, keep-alive. */
  private toSse(stream: Stream): Promise<void> {
    if (stream.mode !== 'pending') return stream.ready ?? Promise.resolve();
    clearTimeout(stream.timer);
    stream.mode = 'sse';
    stream.ready = this.openSse(stream);
    return stream.ready;
  }

  private async openSse(stream: Stream): Promise<void> {
    const res = stream.res;
    this.writeSseHead(res);
    this.keepAlive(stream);
    const store = this.opts.eventStore;
    // Priming events carry empty data, which clients before 2025-11-25 cannot handle.
    if (!store || stream.proto < '2025-11-25') return;
    const eventId = await store.storeEvent(stream.id, {} as JSONRPCMessage);
    const retry = this.opts.retryIntervalMs;
    if (stream.mode === 'sse') {
      res.write(`id: ${eventId}\n${retry !== undefined ? `retry: ${retry}\n` : ''}data: \n\n`);
      this.resumable.add(stream.id);
    }
  }

  private keepAlive(stream: Stream): void {
    if (this.closed || !(this.keepAliveMs >= 1)) return;
    stream.timer = setInterval(
      () => {
        if (stream.mode === 'sse' && !stream.res.writableEnded) stream.res.write(': keepalive\n\n');
        else clearInterval(stream.timer);
      },
      Math.min(this.keepAliveMs, 2 ** 31 - 1),
    );
    stream.timer.unref();
  }

  /** Bytes written to this session's open streams that the client has not taken yet. */
  get bufferedBytes(): number {
    let n = 0;
    for (const s of this.streams.values()) n += s.res.writableLength;
    return n;
  }

  /**
   * Whether `bytes` more may be written: false (and the session closed) when the client is not reading
   * what is already waiting. The bound on this session's memory, whatever its servers send.
   */
  private admit(bytes: number): boolean {
    if (this.closed) return false;
    const max = this.opts.maxBufferedBytes ?? DEFAULT_MAX_BUFFERED_BYTES;
    const waiting = this.bufferedBytes;
    if (waiting === 0 || waiting + bytes <= max) return true;
    this.opts.onoverflow?.({ bufferedBytes: waiting, maxBufferedBytes: max });
    // Destroyed, not ended: an ended response still holds its unread bytes until the socket goes.
    for (const st of this.streams.values()) st.res.destroy();
    void this.close();
    return false;
  }

  private writeEvent(stream: Stream, message: JSONRPCMessage, eventId?: string): boolean {
    if (stream.mode !== 'sse' || stream.res.writableEnded) return false;
    const event = `event: message\n${eventId ? `id: ${eventId}\n` : ''}data: ${JSON.stringify(message)}\n\n`;
    if (!this.admit(Buffer.byteLength(event))) return false;
    stream.res.write(event);
    return true;
  }

  /** End a stream's answer (SSE: close the stream; pending: an empty SSE stream, as the SDK's does). */
  private end(stream: Stream): void {
    if (stream.mode === 'pending') {
      clearTimeout(stream.timer);
      stream.mode = 'sse';
      if (!stream.res.headersSent) this.writeSseHead(stream.res);
    }
    this.gone(stream);
    stream.res.end();
  }

  private async get(req: IncomingMessage, res: ServerResponse): Promise<void> {
    if (!req.headers.accept?.includes('text/event-stream')) {
      return this.fail(res, 406, -32000, 'Not Acceptable: Client must accept text/event-stream');
    }
    if (!this.checkSession(req, res)) return;
    const last = req.headers['last-event-id'];
    if (this.opts.eventStore && typeof last === 'string' && last) return this.replay(last, res);
    if (this.streams.has(STANDALONE)) {
      return this.fail(res, 409, -32000, 'Conflict: Only one SSE stream is allowed per session');
    }
    const stream: Stream = { id: STANDALONE, res, mode: 'sse', proto: '' };
    this.streams.set(STANDALONE, stream);
    res.once('close', () => this.gone(stream));
    this.writeSseHead(res);
    this.keepAlive(stream);
  }

  /** A client resumes a stream: replay what it missed, then the stream goes on here. */
  private async replay(lastEventId: string, res: ServerResponse): Promise<void> {
    const store = this.opts.eventStore!;
    try {
      if (store.getStreamIdForEventId) {
        const known = await store.getStreamIdForEventId(lastEventId);
        if (!known) return this.fail(res, 400, -32000, 'Invalid event ID format');
        if (this.streams.has(known)) {
          return this.fail(res, 409, -32000, 'Conflict: Stream already has an active connection');
        }
      }
      const replayed = new Set<string>();
      // Written to while replaying; registered under the stream id the store names once it is done.
      const during: Stream = { id: '', res, mode: 'sse', proto: '', replayed };
      const after: { live?: Stream } = {};
      res.once('close', () => {
        during.mode = 'done';
        if (after.live) this.gone(after.live);
      });
      this.writeSseHead(res);
      const streamId = await store.replayEventsAfter(lastEventId, {
        send: async (eventId, message) => {
          if (this.writeEvent(during, message, eventId)) replayed.add(eventId);
        },
      });
      if (this.closed || during.mode === 'done') {
        res.end();
        return;
      }
      // A reconnect takes over the stream id: the predecessor (if any) is closed.
      const prior = this.streams.get(streamId);
      if (prior) this.end(prior);
      const live: Stream = { id: streamId, res, mode: 'sse', proto: '', replayed };
      after.live = live;
      this.streams.set(streamId, live);
      this.resumable.add(streamId);
      this.keepAlive(live);
    } catch (e) {
      this.onerror?.(e as Error);
      this.fail(res, 500, -32000, 'Error replaying events', false);
    }
  }

  private writeSseHead(res: ServerResponse): void {
    res.writeHead(
      200,
      this.sessionId !== undefined ? { ...SSE_HEADERS, 'mcp-session-id': this.sessionId } : SSE_HEADERS,
    );
    res.flushHeaders();
  }

  private async delete(req: IncomingMessage, res: ServerResponse): Promise<void> {
    if (!this.checkSession(req, res)) return;
    try {
      this.opts.onsessionclosed?.(this.sessionId!);
      res.writeHead(200);
      res.end();
    } finally {
      await this.close();
    }
  }

  /** Close a request's SSE stream (the client resumes with Last-Event-ID: SEP-1699 polling). */
  closeSSEStream(requestId: RequestId): void {
    const streamId = this.requestStream.get(requestId);
    const stream = streamId !== undefined ? this.streams.get(streamId) : undefined;
    if (!stream) return;
    // A pending answer first becomes SSE, so the client holds an event id to resume from.
    void this.toSse(stream).then(() => this.end(stream));
  }

  /** Hand a message made by the gateway itself (never a peer's bytes) to the session, as if received. */
  receiveLocal(message: JSONRPCMessage): void {
    if (!this.closed) this.onmessage?.(message);
  }

  closeStandaloneSSEStream(): void {
    const s = this.streams.get(STANDALONE);
    if (s) this.end(s);
  }

  async send(message: JSONRPCMessage, options?: TransportSendOptions): Promise<void> {
    const response = isResponse(message);
    const requestId = response ? message.id : options?.relatedRequestId;
    const store = this.opts.eventStore;
    if (requestId === undefined) {
      if (response) {
        throw new Error(
          'Cannot send a response on a standalone SSE stream unless resuming a previous client request',
        );
      }
      const eventId = store ? await store.storeEvent(STANDALONE, message) : undefined;
      const s = this.streams.get(STANDALONE);
      if (s && (eventId === undefined || !s.replayed?.has(eventId))) this.writeEvent(s, message, eventId);
      return;
    }
    if (response && requestId === this.initRequestId && 'result' in message) {
      const v = (message.result as { protocolVersion?: unknown }).protocolVersion;
      if (typeof v === 'string') this.negotiated = v;
      this.initRequestId = undefined; // the id may be reused by later requests
    }
    const streamId = this.requestStream.get(requestId);
    if (streamId === undefined)
      throw new Error(`No connection established for request ID: ${String(requestId)}`);
    let stream = this.streams.get(streamId);
    if (response && stream?.mode === 'pending') {
      // The fast path: nothing else went out for this request: one JSON body.
      this.requestStream.delete(requestId);
      clearTimeout(stream.timer);
      stream.mode = 'done';
      this.streams.delete(streamId);
      const json = JSON.stringify(message);
      if (!this.admit(json.length)) return;
      // With a length (not chunked), headers and body leave in one write.
      const headers: Record<string, string | number> = {
        'content-type': 'application/json',
        'content-length': Buffer.byteLength(json),
      };
      if (this.sessionId !== undefined) headers['mcp-session-id'] = this.sessionId;
      stream.res.writeHead(200, headers);
      stream.res.end(json);
      return;
    }
    if (stream) await this.toSse(stream);
    let eventId: string | undefined;
    if (store) {
      eventId = await store.storeEvent(streamId, message);
      // A resumption may have replaced the stream meanwhile: write to the live one.
      stream = this.streams.get(streamId);
    }
    if (stream && (eventId === undefined || !stream.replayed?.has(eventId))) {
      if (this.writeEvent(stream, message, eventId) && eventId !== undefined) this.resumable.add(streamId);
    }
    if (!response) return;
    this.requestStream.delete(requestId);
    if (stream) {
      this.resumable.delete(streamId);
      this.end(stream);
      return;
    }
    if (this.closed) return;
    if (store && this.resumable.delete(streamId)) return; // kept for replay on resume
    throw new Error(`No connection established for request ID: ${String(requestId)}`);
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    for (const s of [...this.streams.values()]) this.end(s);
    this.streams.clear();
    this.requestStream.clear();
    this.resumable.clear();
    this.onclose?.();
  }
}
