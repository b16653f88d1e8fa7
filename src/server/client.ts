import type { NetworkPolicyInput } from '../core/network-spec.js';
import { NetworkPolicyViewSchema, type NetworkPolicyView } from './network-wire.js';
import type { Duplex } from 'node:stream';
import { connectPortVia } from './port-client.js';
// RemoteSandboxApi: the SandboxApi over the native REST API, with node:http so that it reaches a
// server by URL or by unix socket (the supervisor's). Streams both ways (uploads and downloads are
// never buffered whole), an AbortSignal on every stream, and errors rebuilt as AirlockError with the
// server's code and field. Peer data is parsed with the contract's zod schemas, never trusted raw.
import http from 'node:http';
import https from 'node:https';
import { Readable } from 'node:stream';
import { z } from 'zod';
import { AirlockError, ERROR_CODES, type AirlockErrorCode } from '../core/errors.js';
import type { EgressEvent } from '../egress/events.js';
import {
  ErrorBodySchema,
  ExecEventSchema,
  FileEntrySchema,
  FsEventSchema,
  ProcessViewSchema,
  SandboxViewSchema,
  SnapshotViewSchema,
  TemplateEventSchema,
  TemplateViewSchema,
  type Caller,
  type CreateRequest,
  type ExecEvent,
  type ExecRequest,
  type FileEntryView,
  type FsEvent,
  type ProcessView,
  type SandboxApi,
  type SandboxView,
  type SnapshotView,
  type TemplateBuildRequest,
  type TemplateEvent,
  type TemplateView,
} from './contract.js';
import { EgressEventDocSchema } from './route-table.js';
import { CodeDeniedError, type CodeContextRef } from '../core/code.js';
import {
  CodeContextViewSchema,
  CodeEventSchema,
  CodeFindingSchema,
  type CodeEvent,
  type CreateCodeContextRequest,
  type RunCodeRequest,
} from './code-wire.js';

export interface RemoteSandboxApiOptions {
  /** http(s)://host:port of a server; or give socketPath. */
  readonly baseUrl?: string;
  /** A unix socket the server listens on (the supervisor's). */
  readonly socketPath?: string;
  /** Sent as `Authorization: Bearer <apiKey>`. */
  readonly apiKey?: string;
  /** Default: a keep-alive agent of this client. */
  readonly agent?: http.Agent;
}

/** Largest error body (or JSON response) read from the server. */
const MAX_JSON_BYTES = 64 * 1024 * 1024;
/** Largest NDJSON line accepted. */
const MAX_LINE_BYTES = 16 * 1024 * 1024;

type Body = { json: unknown } | { stream: ReadableStream<Uint8Array> } | { bytes: Uint8Array } | undefined;

/**
 * The whole response body, at most `max` bytes (INTERNAL past that: the response is destroyed). With
 * 'data'/'end' listeners, not `for await`: a stream's async iterator cost more than the rest of a
 * small JSON answer's reading (profiles of the front server and the SDK, issue 36).
 */
export function readAll(res: http.IncomingMessage, max: number): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const parts: Buffer[] = [];
    let n = 0;
    const onData = (c: Buffer): void => {
      n += c.length;
      if (n <= max) {
        parts.push(c);
        return;
      }
      res.off('data', onData);
      res.destroy();
      reject(new AirlockError('INTERNAL', `the server's response is larger than ${max} bytes`));
    };
    res.on('data', onData);
    res.once('end', () => resolve(parts.length === 1 ? parts[0]! : Buffer.concat(parts)));
    // A reset mid-body, or an abort: 'error' where the stream has one, else 'close' before 'end'.
    res.once('error', reject);
    res.once('close', () => {
      if (!res.complete)
        reject(new AirlockError('BACKEND_UNAVAILABLE', 'the server closed the response early'));
    });
  });
}

/** The server's error body → AirlockError (an unknown code stays visible in the message). */
export function errorFrom(status: number, text: string): AirlockError {
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    parsed = undefined;
  }
  const r = ErrorBodySchema.safeParse(parsed);
  if (!r.success) {
    return new AirlockError('INTERNAL', `the server answered HTTP ${status} without an error body`);
  }
  const { code, message, field } = r.data.error;
  if (code === 'CODE_DENIED') {
    // The analysis's findings travel in the error body: the caller gets them as the library gives them.
    const findings = z
      .object({ error: z.object({ findings: z.array(CodeFindingSchema).max(10_000) }) })
      .safeParse(parsed);
    if (findings.success) return new CodeDeniedError(findings.data.error.findings, message);
  }
  const known = Object.hasOwn(ERROR_CODES, code);
  return new AirlockError(
    known ? (code as AirlockErrorCode) : 'INTERNAL',
    known ? message : `${code}: ${message}`,
    {
      ...(field !== undefined ? { field } : {}),
    },
  );
}

/** Parse one peer JSON document with a schema; a mismatch is the server's fault (INTERNAL). */
export function parsePeer<S extends z.ZodType>(schema: S, text: string, what: string): z.output<S> {
  let v: unknown;
  try {
    v = JSON.parse(text);
  } catch {
    throw new AirlockError('INTERNAL', `the server sent ${what} that is not JSON`);
  }
  const r = schema.safeParse(v);
  if (!r.success) throw new AirlockError('INTERNAL', `the server sent a malformed ${what}`);
  return r.data;
}

const enc = encodeURIComponent;

const isExit = (e: ExecEvent): boolean => e.type === 'exit';
const isCodeEnd = (e: CodeEvent): boolean => e.type === 'end';

/** Each response's "stop listening to the caller's AbortSignal", for a response left to drain. */
const abortDetachers = new WeakMap<http.IncomingMessage, () => void>();

/** What may follow a stream's last item before the response is given up on (and closed). */
const DRAIN_MAX_BYTES = 64 * 1024;
const DRAIN_MAX_MS = 1000;

/**
 * Read what is left of a response whose last item was consumed, so that its connection can be
 * reused; a server that keeps sending (more than DRAIN_MAX_BYTES, or for longer than DRAIN_MAX_MS)
 * gets the connection closed instead.
 */
function drainRest(res: http.IncomingMessage): void {
  let n = 0;
  const timer = setTimeout(() => res.destroy(), DRAIN_MAX_MS);
  timer.unref();
  res.on('data', (c: Buffer) => {
    n += c.length;
    if (n > DRAIN_MAX_BYTES) res.destroy();
  });
  res.once('close', () => clearTimeout(timer));
  res.once('error', () => {});
  res.resume();
}

export class RemoteSandboxApi implements SandboxApi {
  private readonly base: URL;
  private readonly socketPath: string | undefined;
  private readonly agent: http.Agent;
  private readonly apiKey: string | undefined;

  constructor(opts: RemoteSandboxApiOptions) {
    if (!opts.baseUrl && !opts.socketPath) {
      throw new AirlockError('INVALID_ARGUMENT', 'give the server as baseUrl or socketPath', {
        field: 'baseUrl',
      });
    }
    this.base = new URL(opts.baseUrl ?? 'http://airlock.invalid');
    if (this.base.protocol !== 'http:' && this.base.protocol !== 'https:') {
      throw new AirlockError('INVALID_ARGUMENT', `baseUrl must be http(s)://…, not ${this.base.protocol}`, {
        field: 'baseUrl',
      });
    }
    this.socketPath = opts.socketPath;
    this.apiKey = opts.apiKey;
    this.agent =
      opts.agent ??
      new (this.base.protocol === 'https:' ? https.Agent : http.Agent)({ keepAlive: true, maxSockets: 64 });
  }

  connectPort(id: string, port: number, _caller: Caller, signal?: AbortSignal): Promise<Duplex> {
    return connectPortVia(
      { socketPath: this.socketPath, url: this.base.href, apiKey: this.apiKey },
      id,
      port,
      signal,
    );
  }

  /** Close idle keep-alive connections (streams in flight are unaffected). */
  close(): void {
    this.agent.destroy();
  }

  /**
   * One request; resolves with a 2xx response, or throws the server's error. A request whose pooled
   * keep-alive connection turned out closed by the server (reset before any answer) is sent once
   * more on a new one, as Node's documentation advises; a streamed body cannot be replayed.
   */
  private async request(
    method: string,
    path: string,
    body?: Body,
    signal?: AbortSignal,
  ): Promise<http.IncomingMessage> {
    try {
      return await this.attempt(method, path, body, signal);
    } catch (e) {
      const stale = AirlockError.isInstance(e) && (e as { staleSocket?: boolean }).staleSocket === true;
      if (!stale || (body && 'stream' in body)) throw e;
      return this.attempt(method, path, body, signal);
    }
  }

  private attempt(
    method: string,
    path: string,
    body: Body,
    signal: AbortSignal | undefined,
  ): Promise<http.IncomingMessage> {
    if (signal?.aborted) return Promise.reject(new AirlockError('ABORTED', `${method} ${path} aborted`));
    const url = new URL(path, this.base);
    const headers: Record<string, string> = { accept: 'application/json, application/x-ndjson' };
    if (this.apiKey) headers.authorization = `Bearer ${this.apiKey}`;
    let payload: Buffer | Uint8Array | undefined;
    if (body && 'json' in body) {
      payload = Buffer.from(JSON.stringify(body.json));
      headers['content-type'] = 'application/json';
    } else if (body && 'bytes' in body) {
      payload = body.bytes;
      headers['content-type'] = 'application/octet-stream';
    } else if (body && 'stream' in body) headers['content-type'] = 'application/octet-stream';
    if (payload) headers['content-length'] = String(payload.length);
    const mod = url.protocol === 'https:' ? https : http;
    return new Promise((resolve, reject) => {
      const req = mod.request({
        method,
        agent: this.agent,
        headers,
        path: url.pathname + url.search,
        ...(this.socketPath ? { socketPath: this.socketPath } : { host: url.hostname, port: url.port }),
        ...(url.protocol === 'https:' ? { servername: url.hostname } : {}),
      });
      let answered = false;
      const onAbort = (): void => {
        req.destroy(new AirlockError('ABORTED', `${method} ${path} aborted`));
      };
      signal?.addEventListener('abort', onAbort, { once: true });
      req.on('error', (e) => {
        signal?.removeEventListener('abort', onAbort);
        if (answered) return; // e.g. the server refused the rest of an upload after answering 413
        if (AirlockError.isInstance(e)) {
          reject(e);
          return;
        }
        const code = (e as NodeJS.ErrnoException).code;
        const err = new AirlockError(
          'BACKEND_UNAVAILABLE',
          `cannot reach the Airlock server at ${this.socketPath ?? this.base.origin}: ${code ?? e.message}`,
          { cause: e },
        );
        if (req.reusedSocket && (code === 'ECONNRESET' || code === 'EPIPE')) {
          Object.assign(err, { staleSocket: true });
        }
        reject(err);
      });
      req.on('response', (res) => {
        answered = true;
        const detach = (): void => signal?.removeEventListener('abort', onAbort);
        res.once('close', detach);
        abortDetachers.set(res, detach);
        const status = res.statusCode ?? 0;
        if (status >= 200 && status < 300) {
          resolve(res);
          return;
        }
        readAll(res, 1024 * 1024)
          .then(
            (b) => reject(errorFrom(status, b.toString('utf8'))),
            (e: unknown) => reject(e),
          )
          .finally(() => {
            // Refused before the whole body went (e.g. 413): stop sending, and never pool this
            // connection (the server closes it once it stops draining).
            if (body && !req.writableFinished) {
              src?.destroy();
              req.destroy();
            }
          });
      });
      let src: Readable | undefined;
      if (body && 'stream' in body) {
        src = Readable.fromWeb(body.stream as import('node:stream/web').ReadableStream<Uint8Array>);
        src.on('error', (e) => req.destroy(e));
        src.pipe(req);
      } else req.end(payload);
    });
  }

  private async json<S extends z.ZodType>(
    schema: S,
    method: string,
    path: string,
    body?: Body,
  ): Promise<z.output<S>> {
    const res = await this.request(method, path, body);
    const text = (await readAll(res, MAX_JSON_BYTES)).toString('utf8');
    return parsePeer(schema, text, 'response');
  }

  private async empty(method: string, path: string, body?: Body): Promise<void> {
    const res = await this.request(method, path, body);
    await readAll(res, MAX_JSON_BYTES);
  }

  /** An NDJSON stream, each line checked with `item`; error lines are thrown as AirlockError. */
  private async *lines<S extends z.ZodType>(
    item: S,
    method: string,
    path: string,
    body: Body,
    signal: AbortSignal | undefined,
    last?: (v: z.output<S>) => boolean,
  ): AsyncGenerator<z.output<S>> {
    const res = await this.request(method, path, body, signal);
    yield* this.parseLines(item, res, path, signal, last);
  }

  /**
   * `last` names the stream's final item (an exec's `exit`): a consumer that stops once it has it
   * lets the rest of the response (the end of the chunked body, already on its way) drain in the
   * background, so the keep-alive connection goes back to the pool instead of being torn down (and
   * the server seeing a disconnect). Anything else that stops early closes the connection.
   */
  private async *parseLines<S extends z.ZodType>(
    item: S,
    res: http.IncomingMessage,
    path: string,
    signal: AbortSignal | undefined,
    last?: (v: z.output<S>) => boolean,
  ): AsyncGenerator<z.output<S>> {
    let finished = false;
    let buf = '';
    const decoder = new TextDecoder();
    const one = (text: string): z.output<S> => {
      let v: unknown;
      try {
        v = JSON.parse(text);
      } catch {
        throw new AirlockError('INTERNAL', 'the server sent a stream line that is not JSON');
      }
      const o = v as { type?: unknown; code?: unknown; message?: unknown; error?: unknown; field?: unknown };
      if (o && o.type === 'error' && typeof o.code === 'string') {
        const field = typeof o.field === 'string' ? { field: o.field } : {};
        throw errorFrom(
          500,
          JSON.stringify({ error: { code: o.code, message: String(o.message ?? ''), ...field } }),
        );
      }
      if (o && typeof o.error === 'object') throw errorFrom(500, JSON.stringify(o));
      const r = item.safeParse(v);
      if (!r.success) throw new AirlockError('INTERNAL', 'the server sent a malformed stream line');
      return r.data;
    };
    try {
      // destroyOnReturn false: the finally below decides between draining and closing.
      for await (const chunk of res.iterator({ destroyOnReturn: false }) as AsyncIterable<Buffer>) {
        buf += decoder.decode(chunk, { stream: true });
        let nl: number;
        while ((nl = buf.indexOf('\n')) >= 0) {
          const text = buf.slice(0, nl);
          buf = buf.slice(nl + 1);
          if (text.trim() === '') continue;
          const v = one(text);
          finished = last?.(v) === true;
          yield v;
        }
        if (buf.length > MAX_LINE_BYTES)
          throw new AirlockError('INTERNAL', 'the server sent an overlong line');
      }
      if (signal?.aborted) throw new AirlockError('ABORTED', `${path} aborted`);
      if (buf.trim() !== '') yield one(buf);
    } catch (e) {
      if (signal?.aborted && !AirlockError.isInstance(e))
        throw new AirlockError('ABORTED', `${path} aborted`);
      throw e;
    } finally {
      // Stopping early closes the connection: the server stops (and kills) the source. A response
      // already whole (or past its last item) is read to its end instead: destroying an unread
      // response closes its socket even when nothing more can come.
      if ((finished || res.complete) && !signal?.aborted) {
        abortDetachers.get(res)?.(); // the caller is done with it: a later abort must not cut the drain
        drainRest(res);
      } else res.destroy();
    }
  }

  private sbx(id: string, rest = ''): string {
    return `/v1/sandboxes/${enc(id)}${rest}`;
  }

  private file(id: string, sub: string, path: string): string {
    return `${this.sbx(id, `/files${sub}`)}?path=${enc(path)}`;
  }

  create(req: CreateRequest, _caller?: Caller): Promise<SandboxView> {
    return this.json(SandboxViewSchema, 'POST', '/v1/sandboxes', { json: req });
  }

  get(id: string, _caller?: Caller): Promise<SandboxView> {
    return this.json(SandboxViewSchema, 'GET', this.sbx(id));
  }

  list(filter: { metadata?: Record<string, string> } = {}, _caller?: Caller): Promise<SandboxView[]> {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(filter.metadata ?? {})) q.append(`metadata.${k}`, v);
    const qs = q.toString();
    return this.json(z.array(SandboxViewSchema), 'GET', `/v1/sandboxes${qs ? `?${qs}` : ''}`);
  }

  setTimeout(id: string, ttlMs: number, _caller?: Caller): Promise<SandboxView> {
    return this.json(SandboxViewSchema, 'POST', this.sbx(id, '/timeout'), { json: { ttlMs } });
  }

  setNetworkPolicy(id: string, policy: NetworkPolicyInput, _caller?: Caller): Promise<NetworkPolicyView> {
    return this.json(NetworkPolicyViewSchema, 'PUT', this.sbx(id, '/network'), { json: policy });
  }

  pause(id: string, _caller?: Caller): Promise<SandboxView> {
    return this.json(SandboxViewSchema, 'POST', this.sbx(id, '/pause'));
  }

  resume(id: string, _caller?: Caller): Promise<SandboxView> {
    return this.json(SandboxViewSchema, 'POST', this.sbx(id, '/resume'));
  }

  kill(id: string, _caller?: Caller): Promise<void> {
    return this.empty('DELETE', this.sbx(id));
  }

  exec(id: string, req: ExecRequest, _caller?: Caller, signal?: AbortSignal): AsyncIterable<ExecEvent> {
    return this.lines(ExecEventSchema, 'POST', this.sbx(id, '/exec'), { json: req }, signal, isExit);
  }

  startProcess(id: string, req: ExecRequest, _caller?: Caller): Promise<ProcessView> {
    return this.json(ProcessViewSchema, 'POST', this.sbx(id, '/processes'), { json: req });
  }

  startAndFollow(
    id: string,
    req: ExecRequest,
    _caller?: Caller,
    signal?: AbortSignal,
  ): AsyncIterable<ExecEvent> {
    return this.lines(
      ExecEventSchema,
      'POST',
      this.sbx(id, '/processes/stream'),
      { json: req },
      signal,
      isExit,
    );
  }

  listProcesses(id: string, _caller?: Caller): Promise<ProcessView[]> {
    return this.json(z.array(ProcessViewSchema), 'GET', this.sbx(id, '/processes'));
  }

  connectProcess(id: string, pid: string, _caller?: Caller, signal?: AbortSignal): AsyncIterable<ExecEvent> {
    return this.lines(
      ExecEventSchema,
      'GET',
      this.sbx(id, `/processes/${enc(pid)}/stream`),
      undefined,
      signal,
      isExit,
    );
  }

  sendStdin(id: string, pid: string, data: Uint8Array, _caller?: Caller): Promise<void> {
    return this.empty('POST', this.sbx(id, `/processes/${enc(pid)}/stdin`), { bytes: data });
  }

  closeStdin(id: string, pid: string, _caller?: Caller): Promise<void> {
    return this.empty('DELETE', this.sbx(id, `/processes/${enc(pid)}/stdin`));
  }

  killProcess(id: string, pid: string, _caller?: Caller): Promise<void> {
    return this.empty('DELETE', this.sbx(id, `/processes/${enc(pid)}`));
  }

  async readFile(
    id: string,
    path: string,
    _caller?: Caller,
    signal?: AbortSignal,
  ): Promise<ReadableStream<Uint8Array>> {
    const res = await this.request('GET', this.file(id, '', path), undefined, signal);
    return Readable.toWeb(res) as unknown as ReadableStream<Uint8Array>;
  }

  writeFile(
    id: string,
    path: string,
    body: ReadableStream<Uint8Array> | Uint8Array,
    _caller?: Caller,
  ): Promise<FileEntryView> {
    return this.json(
      FileEntrySchema,
      'PUT',
      this.file(id, '', path),
      body instanceof Uint8Array ? { bytes: body } : { stream: body },
    );
  }

  listDir(id: string, path: string, _caller?: Caller): Promise<FileEntryView[]> {
    return this.json(z.array(FileEntrySchema), 'GET', this.file(id, '/list', path));
  }

  stat(id: string, path: string, _caller?: Caller): Promise<FileEntryView> {
    return this.json(FileEntrySchema, 'GET', this.file(id, '/stat', path));
  }

  remove(id: string, path: string, _caller?: Caller): Promise<void> {
    return this.empty('DELETE', this.file(id, '', path));
  }

  makeDir(id: string, path: string, _caller?: Caller): Promise<FileEntryView> {
    return this.json(FileEntrySchema, 'POST', this.file(id, '/mkdir', path));
  }

  /**
   * The request starts at once; `ready` resolves when the server has taken its first listing (a
   * change after that is reported), or rejects with the watch's error.
   */
  watch(
    id: string,
    path: string,
    _caller?: Caller,
    signal?: AbortSignal,
  ): AsyncIterable<FsEvent> & { ready: Promise<void> } {
    const url = this.file(id, '/watch', path);
    const res = this.request('GET', url, undefined, signal);
    const ready = res.then(() => {});
    ready.catch(() => {});
    const parse = (r: http.IncomingMessage): AsyncGenerator<FsEvent> =>
      this.parseLines(FsEventSchema, r, url, signal);
    return {
      ready,
      async *[Symbol.asyncIterator]() {
        yield* parse(await res);
      },
    };
  }

  snapshot(id: string, _caller?: Caller): Promise<SnapshotView> {
    return this.json(SnapshotViewSchema, 'POST', this.sbx(id, '/snapshot'));
  }

  listSnapshots(_caller?: Caller): Promise<SnapshotView[]> {
    return this.json(z.array(SnapshotViewSchema), 'GET', '/v1/snapshots');
  }

  removeSnapshot(snapshotId: string, _caller?: Caller): Promise<void> {
    return this.empty('DELETE', `/v1/snapshots/${enc(snapshotId)}`);
  }

  /** POST /v1/templates: the build's events; an `error` line is thrown as AirlockError. */
  buildTemplate(
    req: TemplateBuildRequest,
    _caller?: Caller,
    signal?: AbortSignal,
  ): AsyncIterable<TemplateEvent> {
    return this.lines(TemplateEventSchema, 'POST', '/v1/templates', { json: req }, signal);
  }

  listTemplates(_caller?: Caller): Promise<TemplateView[]> {
    return this.json(z.array(TemplateViewSchema), 'GET', '/v1/templates');
  }

  getTemplate(name: string, _caller?: Caller): Promise<TemplateView> {
    return this.json(TemplateViewSchema, 'GET', `/v1/templates/${enc(name)}`);
  }

  removeTemplate(name: string, _caller?: Caller): Promise<void> {
    return this.empty('DELETE', `/v1/templates/${enc(name)}`);
  }

  egressEvents(id: string, _caller?: Caller, signal?: AbortSignal): AsyncIterable<EgressEvent> {
    return this.lines(
      EgressEventDocSchema,
      'GET',
      this.sbx(id, '/egress'),
      undefined,
      signal,
    ) as AsyncIterable<EgressEvent>;
  }

  runCode(id: string, req: RunCodeRequest, _caller?: Caller, signal?: AbortSignal): AsyncIterable<CodeEvent> {
    return this.lines(CodeEventSchema, 'POST', this.sbx(id, '/code'), { json: req }, signal, isCodeEnd);
  }

  createCodeContext(id: string, req: CreateCodeContextRequest, _caller?: Caller): Promise<CodeContextRef> {
    return this.json(CodeContextViewSchema, 'POST', this.sbx(id, '/code/contexts'), { json: req });
  }

  listCodeContexts(id: string, _caller?: Caller): Promise<CodeContextRef[]> {
    return this.json(z.array(CodeContextViewSchema), 'GET', this.sbx(id, '/code/contexts'));
  }

  closeCodeContext(id: string, contextId: string, _caller?: Caller): Promise<void> {
    return this.empty('DELETE', this.sbx(id, `/code/contexts/${enc(contextId)}`));
  }
}
