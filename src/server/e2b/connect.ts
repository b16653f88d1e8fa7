// The Connect protocol (JSON flavour), server side, as far as the e2b SDK uses it: unary calls
// (application/json in and out) and server streams (one enveloped request, enveloped messages back,
// then an end-stream frame). Our own small implementation of the published protocol.
//
// An envelope is a 5-byte prefix, 1 flag byte then a 4-byte big-endian length, and that many bytes.
// Flag 0x02 marks the end-stream frame, whose JSON is {} or {"error": {"code", "message"}}. Stream
// errors always travel in that frame with HTTP 200: the client maps a non-200 stream status to a
// code of its own choosing, which would lose ours.
import type { Context } from 'hono';
import type { z } from 'zod';
import { AirlockError } from '../../core/errors.js';
import { readBodyCapped } from '../streams.js';

/** The Connect error codes we answer with (the protocol's snake_case names). */
export type ConnectCode =
  | 'canceled'
  | 'unknown'
  | 'invalid_argument'
  | 'deadline_exceeded'
  | 'not_found'
  | 'already_exists'
  | 'permission_denied'
  | 'resource_exhausted'
  | 'failed_precondition'
  | 'unimplemented'
  | 'internal'
  | 'unavailable'
  | 'unauthenticated';

const HTTP_FOR: Record<ConnectCode, number> = {
  canceled: 499,
  unknown: 500,
  invalid_argument: 400,
  deadline_exceeded: 504,
  not_found: 404,
  already_exists: 409,
  permission_denied: 403,
  resource_exhausted: 429,
  failed_precondition: 400,
  unimplemented: 501,
  internal: 500,
  unavailable: 503,
  unauthenticated: 401,
};

/** An error to answer on the envd API: a Connect code (RPC) and the HTTP status (plain routes). */
export class EnvdError extends Error {
  constructor(
    readonly code: ConnectCode,
    message: string,
    readonly httpStatus: number = HTTP_FOR[code],
  ) {
    super(message);
    this.name = 'EnvdError';
  }
}

/** Translate anything thrown by a SandboxApi call into the error the e2b SDK understands. */
export function envdErrorFrom(e: unknown, sandboxId: string): EnvdError {
  if (e instanceof EnvdError) return e;
  if (!AirlockError.isInstance(e)) return new EnvdError('internal', 'internal error in the Airlock server');
  const msg = e.message;
  switch (e.code) {
    case 'SANDBOX_NOT_FOUND':
    case 'SANDBOX_GONE':
      // E2B answers a dead sandbox's envd with 502 (HTTP) / unavailable (RPC): the SDK then reports
      // a sandbox timeout, and its health probe says "not running".
      return new EnvdError(
        'unavailable',
        `sandbox ${sandboxId} is not running (killed, expired or unknown)`,
        502,
      );
    case 'SANDBOX_PAUSED':
      return new EnvdError(
        'failed_precondition',
        `sandbox ${sandboxId} is paused: resume it with Sandbox.connect() first`,
        409,
      );
    case 'FILE_NOT_FOUND':
    case 'PROCESS_NOT_FOUND':
      return new EnvdError('not_found', msg);
    case 'INVALID_ARGUMENT':
    case 'INVALID_SPEC':
      return new EnvdError('invalid_argument', e.field ? `${e.field}: ${msg}` : msg);
    case 'FILE_TOO_LARGE':
    case 'REQUEST_TOO_LARGE':
      return new EnvdError('resource_exhausted', msg, 413);
    case 'DISK_FULL':
      return new EnvdError('resource_exhausted', msg, 507);
    case 'PERMISSION_DENIED':
      return new EnvdError('permission_denied', msg);
    case 'UNAUTHORIZED':
      return new EnvdError('unauthenticated', msg);
    case 'ABORTED':
      return new EnvdError('canceled', msg);
    // Not `unavailable`: the SDK reads that as "the sandbox is gone" (a sandbox-timeout error).
    case 'CAPACITY_EXHAUSTED':
      return new EnvdError('resource_exhausted', msg, 429);
    case 'BACKEND_UNAVAILABLE':
      return new EnvdError('internal', msg, 503);
    default:
      return new EnvdError('internal', msg);
  }
}

/** The deadline the client gave the call (Connect-Timeout-Ms), if any. */
export function connectTimeoutMs(c: Context): number | undefined {
  const raw = c.req.header('connect-timeout-ms');
  if (raw === undefined) return undefined;
  if (!/^[0-9]{1,10}$/.test(raw))
    throw new EnvdError('invalid_argument', 'Connect-Timeout-Ms must be 1-10 digits');
  const n = Number(raw);
  return n > 0 ? n : undefined;
}

function parseJson(text: string): unknown {
  try {
    return JSON.parse(text) as unknown;
  } catch {
    throw new EnvdError('invalid_argument', 'the request body is not valid JSON');
  }
}

function validate<S extends z.ZodType>(schema: S, value: unknown): z.infer<S> {
  const r = schema.safeParse(value);
  if (r.success) return r.data;
  const issue = r.error.issues[0]!;
  const path = issue.path.map(String).join('.');
  throw new EnvdError('invalid_argument', `${path === '' ? 'request' : path}: ${issue.message}`);
}

/** Read a body of at most `maxBytes` (counted as it streams; never buffered past the cap). */
export function readCapped(c: Context, maxBytes: number): Promise<Uint8Array> {
  return readBodyCapped(
    c,
    maxBytes,
    () => new EnvdError('resource_exhausted', `the request body is over ${maxBytes} bytes`, 413),
  );
}

const MAX_RPC_BODY = 1024 * 1024;

function unaryError(err: EnvdError): Response {
  return new Response(JSON.stringify({ code: err.code, message: err.message }), {
    status: HTTP_FOR[err.code],
    headers: { 'content-type': 'application/json' },
  });
}

/** A unary Connect handler: validated JSON in, JSON out, errors as Connect error JSON. */
export function unary<S extends z.ZodType>(
  schema: S,
  handle: (req: z.infer<S>, c: Context) => Promise<unknown>,
  onError: (e: unknown, c: Context) => EnvdError,
): (c: Context) => Promise<Response> {
  return async (c) => {
    try {
      const type = c.req.header('content-type') ?? '';
      if (!type.startsWith('application/json')) {
        throw new EnvdError(
          'unimplemented',
          `content type ${JSON.stringify(type)}: only Connect JSON is supported`,
        );
      }
      const body = await readCapped(c, MAX_RPC_BODY);
      const req = validate(schema, parseJson(new TextDecoder().decode(body) || '{}'));
      const out = await handle(req, c);
      return new Response(JSON.stringify(out ?? {}), {
        status: 200,
        headers: { 'content-type': 'application/json' },
      });
    } catch (e) {
      return unaryError(onError(e, c));
    }
  };
}

function frame(flags: number, json: unknown): Uint8Array {
  const payload = Buffer.from(JSON.stringify(json));
  const out = Buffer.alloc(5 + payload.length);
  out.writeUInt8(flags, 0);
  out.writeUInt32BE(payload.length, 1);
  payload.copy(out, 5);
  return out;
}

/** Decode the one enveloped request message of a server-stream call. */
function unenvelope(bytes: Uint8Array): unknown {
  if (bytes.length < 5) throw new EnvdError('invalid_argument', 'the stream request has no envelope');
  const buf = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const flags = buf.readUInt8(0);
  const len = buf.readUInt32BE(1);
  if (flags !== 0) throw new EnvdError('unimplemented', 'compressed stream messages are not supported');
  if (len !== buf.length - 5)
    throw new EnvdError('invalid_argument', 'the stream request must be exactly one message');
  return parseJson(buf.subarray(5).toString('utf8') || '{}');
}

/** What a server-stream handler gets: its request, the client's deadline, and an abort signal. */
export interface StreamCall<T> {
  readonly req: T;
  readonly timeoutMs: number | undefined;
  /** Aborted when the client goes away (or the stream ends). */
  readonly signal: AbortSignal;
  readonly c: Context;
}

/** Messages a stream queues for a client that has not read them yet. */
const STREAM_QUEUE = 16;

/** Seconds between keepalive messages: the client's Keepalive-Ping-Interval, bounded. */
function keepaliveMs(c: Context): number {
  const n = Number(c.req.header('keepalive-ping-interval') ?? '50');
  return Math.min(Math.max(Number.isFinite(n) ? n : 50, 5), 300) * 1000;
}

/**
 * A server-stream Connect handler. `handle` yields response messages; an error thrown before the
 * first message or later ends the stream with an end-stream frame carrying it. `keepalive` is the
 * message sent while the stream is idle, so proxies keep the connection open.
 */
export function serverStream<S extends z.ZodType>(
  schema: S,
  handle: (call: StreamCall<z.infer<S>>) => AsyncIterable<unknown>,
  onError: (e: unknown, c: Context) => EnvdError,
  keepalive: unknown,
): (c: Context) => Promise<Response> {
  return async (c) => {
    const ac = new AbortController();
    const onAbort = (): void => ac.abort();
    c.req.raw.signal.addEventListener('abort', onAbort, { once: true });
    let iterator: AsyncIterator<unknown> | undefined;
    let timer: NodeJS.Timeout | undefined;
    /** `abort`: the client left or the stream failed, so stop the source (a clean end needs no abort). */
    const cleanup = (abort: boolean): void => {
      clearInterval(timer);
      c.req.raw.signal.removeEventListener('abort', onAbort);
      if (abort) ac.abort();
      void iterator?.return?.().catch(() => undefined);
    };
    let first: IteratorResult<unknown> | undefined;
    let early: EnvdError | undefined;
    try {
      const type = c.req.header('content-type') ?? '';
      if (!type.startsWith('application/connect+json')) {
        throw new EnvdError(
          'unimplemented',
          `content type ${JSON.stringify(type)}: only Connect JSON is supported`,
        );
      }
      const req = validate(schema, unenvelope(await readCapped(c, MAX_RPC_BODY)));
      iterator = handle({ req, timeoutMs: connectTimeoutMs(c), signal: ac.signal, c })[
        Symbol.asyncIterator
      ]();
      // The first message (e.g. the process's start event) is awaited before the response begins, so
      // that an error here (unknown sandbox, bad path) is the stream's only frame.
      first = await iterator.next();
    } catch (e) {
      early = onError(e, c);
    }
    const it = iterator;
    // Pull-based: a message is taken from the source only when the client has read the ones before
    // (at most STREAM_QUEUE queued), so a slow reader slows the source instead of filling memory.
    const stream = new ReadableStream<Uint8Array>(
      {
        start(ctl) {
          if (early !== undefined) {
            ctl.enqueue(frame(2, { error: { code: early.code, message: early.message } }));
            ctl.close();
            cleanup(false);
            return;
          }
          if (first?.done) {
            ctl.enqueue(frame(2, {}));
            ctl.close();
            cleanup(false);
            return;
          }
          if (first) ctl.enqueue(frame(0, first.value));
          timer = setInterval(() => {
            try {
              if ((ctl.desiredSize ?? 0) > 0) ctl.enqueue(frame(0, keepalive));
            } catch {
              clearInterval(timer);
            }
          }, keepaliveMs(c));
        },
        async pull(ctl) {
          let end: unknown;
          try {
            const r = await it!.next();
            if (!r.done) {
              ctl.enqueue(frame(0, r.value));
              return;
            }
            end = {};
          } catch (e) {
            if (ac.signal.aborted) return; // the client left: nobody to tell
            const err = onError(e, c);
            end = { error: { code: err.code, message: err.message } };
          }
          try {
            ctl.enqueue(frame(2, end));
            ctl.close();
          } catch {
            // the client cancelled the response meanwhile
          }
          // A failed stream (e.g. its key revoked) stops its source too: nothing follows for nobody.
          cleanup(end !== undefined && Object.keys(end as object).length > 0);
        },
        cancel() {
          cleanup(true);
        },
      },
      { highWaterMark: STREAM_QUEUE },
    );
    return new Response(stream, { status: 200, headers: { 'content-type': 'application/connect+json' } });
  };
}
