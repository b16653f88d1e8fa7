// Byte and NDJSON streams of the REST API: request bodies counted as they arrive and cut at a cap
// (never buffered whole first), and NDJSON responses that stop feeding, and abort their source, when
// the client goes away.
import { IncomingMessage } from 'node:http';
import type { Context } from 'hono';
import { errorBody, tooLarge } from './http-errors.js';

/** The whole body, at most `max` bytes (REQUEST_TOO_LARGE past that, checked as it streams). */
export function readCapped(req: Request, max: number, what: string): Promise<Uint8Array> {
  return readWebCapped(req, max, () => tooLarge(what, max));
}

/**
 * The request body of a Hono context, at most `max` bytes (`tooBig()` is thrown past that: at once
 * for a larger Content-Length, else as it streams). On @hono/node-server it reads the node:http
 * request itself: asking for `c.req.raw.body` there builds a whole fetch Request and a web stream
 * over the socket first, which cost more than the rest of a small JSON request's handling (profiles
 * of the front server and the supervisor, issue 36). Elsewhere (app.request() in tests) the web body.
 */
export async function readBodyCapped(c: Context, max: number, tooBig: () => Error): Promise<Uint8Array> {
  const incoming = (c.env as { incoming?: unknown } | undefined)?.incoming;
  if (!(incoming instanceof IncomingMessage) || incoming.readableDidRead) {
    return readWebCapped(c.req.raw, max, tooBig);
  }
  if (Number(incoming.headers['content-length'] ?? NaN) > max) throw tooBig();
  const parts: Buffer[] = [];
  let n = 0;
  // Leaving the loop early (too big) destroys the request, as cancelling its web stream does.
  for await (const chunk of incoming as AsyncIterable<Buffer>) {
    n += chunk.length;
    if (n > max) throw tooBig();
    parts.push(chunk);
  }
  return parts.length === 1 ? parts[0]! : Buffer.concat(parts);
}

async function readWebCapped(req: Request, max: number, tooBig: () => Error): Promise<Uint8Array> {
  const declared = Number(req.headers.get('content-length') ?? NaN);
  if (declared > max) throw tooBig();
  if (!req.body) return new Uint8Array(0);
  const parts: Uint8Array[] = [];
  let n = 0;
  const reader = req.body.getReader();
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    n += value.length;
    if (n > max) {
      await reader.cancel().catch(() => {});
      throw tooBig();
    }
    parts.push(value);
  }
  return Buffer.concat(parts);
}

/** `src` passed through, erroring with REQUEST_TOO_LARGE once more than `max` bytes went by. */
export function cappedStream(
  src: ReadableStream<Uint8Array>,
  max: number,
  what: string,
): ReadableStream<Uint8Array> {
  let n = 0;
  return src.pipeThrough(
    new TransformStream<Uint8Array, Uint8Array>({
      transform(chunk, controller) {
        n += chunk.length;
        if (n > max) controller.error(tooLarge(what, max));
        else controller.enqueue(chunk);
      },
    }),
  );
}

const enc = new TextEncoder();
const line = (v: unknown): Uint8Array => enc.encode(`${JSON.stringify(v)}\n`);
const isExit = (kind: 'exec' | 'plain', v: unknown): boolean =>
  kind === 'exec' && (v as { type?: unknown } | null)?.type === 'exit';

/**
 * An NDJSON response from an async iterable. `exec` streams end an error with an ExecEvent line
 * {type:"error",code,message}; `plain` streams with {error:{code,message}}. With firstBeforeHeaders
 * the first item is awaited before the response starts, so an error before any output (an unknown
 * sandbox, a failed spawn) is an ordinary error response with its status. Cancelling (the client
 * went away) aborts `ctl`, which the source was given, and returns the iterator.
 */
export async function ndjsonResponse<T>(
  source: AsyncIterable<T>,
  ctl: AbortController,
  kind: 'exec' | 'plain',
  o: { firstBeforeHeaders?: boolean; holdFirstMs?: number } = {},
): Promise<Response> {
  const it = source[Symbol.asyncIterator]();
  /** Items already at hand: the next pull sends them all as one chunk. */
  const ready: Array<IteratorResult<T>> = [];
  /** A next() begun by the hold and not yet used (it may reject: the pull that takes it reports it). */
  let pending: Promise<IteratorResult<T>> | undefined;
  if (o.firstBeforeHeaders) {
    let first: IteratorResult<T>;
    try {
      first = await it.next();
    } catch (e) {
      ctl.abort();
      throw e;
    }
    ready.push(first);
    if (o.holdFirstMs !== undefined && !first.done && !isExit(kind, first.value)) {
      // The first item waits (at most holdFirstMs) for the next one: a short command's start and exit
      // then leave as one chunk, so the whole response is one write with a Content-Length instead of a
      // chunked stream of three. Only that first item waits: whatever comes next goes at once with it.
      const next = it.next();
      pending = next;
      next.catch(() => {});
      let timer: NodeJS.Timeout | undefined;
      const arrived = await Promise.race([
        next.then(
          () => true,
          () => false,
        ),
        new Promise<false>((r) => (timer = setTimeout(() => r(false), o.holdFirstMs))),
      ]);
      clearTimeout(timer);
      if (arrived) {
        ready.push(await next);
        pending = undefined;
      }
    }
  }
  const headers = { 'content-type': 'application/x-ndjson', 'cache-control': 'no-store' };
  // Everything at hand already ends the stream (a short command's start and exit): one plain body,
  // which the server writes at once with its Content-Length (a stream body is chunked).
  const last = ready.at(-1);
  if (last && (last.done || isExit(kind, last.value))) {
    void it.return?.()?.catch(() => {});
    const body = Buffer.concat(ready.flatMap((r) => (r.done ? [] : [line(r.value)])));
    return new Response(body, { headers });
  }
  const take = (): Promise<IteratorResult<T>> => {
    const p = pending ?? it.next();
    pending = undefined;
    return p;
  };
  const errorLine = (e: unknown): Uint8Array => {
    const body = errorBody(e).error;
    return line(
      kind === 'exec'
        ? {
            type: 'error',
            code: body.code,
            message: body.message,
            ...(body.field !== undefined ? { field: body.field } : {}),
          }
        : { error: body },
    );
  };
  const stream = new ReadableStream<Uint8Array>({
    async pull(controller) {
      try {
        const batch = ready.length > 0 ? ready.splice(0) : [await take()];
        const lines: Uint8Array[] = [];
        let end = false;
        for (const r of batch) {
          if (r.done) {
            end = true;
            break;
          }
          lines.push(line(r.value));
          // An exec's `exit` is its last event: end the response with it (one write, not two), and
          // let the source finish on its own time (e.g. a proxied stream's own end).
          if (isExit(kind, r.value)) {
            end = true;
            void it.return?.()?.catch(() => {});
            break;
          }
        }
        if (lines.length > 0) controller.enqueue(lines.length === 1 ? lines[0]! : Buffer.concat(lines));
        if (end) controller.close();
      } catch (e) {
        // The client's own abort ends the stream quietly (there is no one to tell).
        if (!ctl.signal.aborted) controller.enqueue(errorLine(e));
        controller.close();
        ctl.abort();
      }
    },
    async cancel() {
      ctl.abort();
      await it.return?.();
    },
  });
  return new Response(stream, { headers });
}
