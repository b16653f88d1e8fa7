// envd's plain-HTTP routes: GET/POST /files (download, upload) and GET /health.
//
// Uploads come as application/octet-stream (streamed through, gzip allowed) or multipart/form-data
// (the SDK's default for strings and buffers; parsed in memory, so capped lower). Every byte count is
// checked as it streams, and a gzip body is capped after decompression (no zip bombs).
import { posix } from 'node:path';
import type { Context, Hono } from 'hono';
import { EnvdError } from './connect.js';
import { checkUser, e2bPath, envdError, isRunning, target, type EnvdDeps } from './envd.js';

export interface FileLimits {
  /** Largest streamed (octet-stream) upload, after decompression. */
  readonly maxUploadBytes: number;
  /** Largest multipart upload (it is parsed in memory). */
  readonly maxMultipartBytes: number;
}

function httpError(c: Context, e: unknown): Response {
  const err = envdError(e, c);
  return c.json({ code: err.httpStatus, message: err.message }, err.httpStatus as 400);
}

/** Pass `body` through, failing the stream once more than `max` bytes went by. */
function capped(body: ReadableStream<Uint8Array>, max: number): ReadableStream<Uint8Array> {
  let total = 0;
  return body.pipeThrough(
    new TransformStream<Uint8Array, Uint8Array>({
      transform(chunk, ctl) {
        total += chunk.byteLength;
        if (total > max)
          ctl.error(new EnvdError('resource_exhausted', `the upload is over ${max} bytes`, 413));
        else ctl.enqueue(chunk);
      },
    }),
  );
}

function writeInfo(path: string): { name: string; type: 'file'; path: string } {
  return { name: posix.basename(path), type: 'file', path };
}

export function mountFiles(app: Hono, deps: EnvdDeps, limits: FileLimits): void {
  app.get('/health', async (c) => {
    try {
      return (await isRunning(deps, target(c, deps))) ? c.body(null, 204) : c.body(null, 502);
    } catch (e) {
      return httpError(c, e);
    }
  });

  app.get('/files', async (c) => {
    try {
      const t = target(c, deps);
      checkUser(c.req.query('username'));
      if (c.req.query('signature') !== undefined) {
        throw new EnvdError('unimplemented', 'signed file URLs are not supported by Airlock');
      }
      // The client's leaving aborts the request's signal, which stops the reader in the sandbox.
      const body = await deps.api.readFile(t.id, e2bPath(c.req.query('path')), t.caller, c.req.raw.signal);
      return new Response(body, { status: 200, headers: { 'content-type': 'application/octet-stream' } });
    } catch (e) {
      return httpError(c, e);
    }
  });

  app.post('/files', async (c) => {
    try {
      const t = target(c, deps);
      checkUser(c.req.query('username'));
      if (c.req.query('signature') !== undefined) {
        throw new EnvdError('unimplemented', 'signed file URLs are not supported by Airlock');
      }
      for (const name of Object.keys(c.req.header())) {
        if (name.toLowerCase().startsWith('x-metadata-')) {
          throw new EnvdError(
            'unimplemented',
            'file metadata (X-Metadata-* headers) is not supported by Airlock',
          );
        }
      }
      const type = c.req.header('content-type') ?? '';
      const encoding = (c.req.header('content-encoding') ?? 'identity').toLowerCase();
      const raw = c.req.raw.body;
      if (!raw) throw new EnvdError('invalid_argument', 'the upload has no body');
      const query = c.req.query('path');

      if (type.startsWith('application/octet-stream')) {
        if (encoding !== 'identity' && encoding !== 'gzip') {
          throw new EnvdError(
            'invalid_argument',
            `Content-Encoding ${JSON.stringify(encoding)}: only gzip is supported`,
          );
        }
        const path = e2bPath(query);
        const plain =
          encoding === 'gzip'
            ? raw.pipeThrough(
                new DecompressionStream('gzip') as unknown as TransformStream<Uint8Array, Uint8Array>,
              )
            : raw;
        await deps.api.writeFile(t.id, path, capped(plain, limits.maxUploadBytes), t.caller);
        return c.json([writeInfo(path)]);
      }

      if (type.startsWith('multipart/form-data')) {
        if (encoding !== 'identity')
          throw new EnvdError('invalid_argument', 'a multipart upload cannot be compressed');
        const declared = Number(c.req.header('content-length') ?? '0');
        if (declared > limits.maxMultipartBytes) {
          throw new EnvdError(
            'resource_exhausted',
            `the upload is over ${limits.maxMultipartBytes} bytes: stream it (useOctetStream)`,
            413,
          );
        }
        const form = await new Request('http://e2b.invalid/', {
          method: 'POST',
          headers: { 'content-type': type },
          body: capped(raw, limits.maxMultipartBytes),
          duplex: 'half',
        } as RequestInit).formData();
        const files = form.getAll('file').filter((f) => typeof f !== 'string') as unknown as (Blob & {
          readonly name: string;
        })[];
        if (files.length === 0)
          throw new EnvdError('invalid_argument', 'file: the upload has no "file" part');
        const out = [];
        for (const f of files) {
          // One file goes to ?path=; several each go to their part's file name (E2B's rule).
          const path = e2bPath(files.length === 1 && query ? query : f.name);
          await deps.api.writeFile(t.id, path, f.stream() as ReadableStream<Uint8Array>, t.caller);
          out.push(writeInfo(path));
        }
        return c.json(out);
      }
      throw new EnvdError(
        'invalid_argument',
        `Content-Type ${JSON.stringify(type)}: send octet-stream or multipart`,
      );
    } catch (e) {
      const cause = e instanceof TypeError && e.cause instanceof EnvdError ? e.cause : e;
      return httpError(c, cause);
    }
  });
}
