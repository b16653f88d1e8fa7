// The E2B-compatible API: e2bRoutes(api, opts) serves E2B's control REST API at its root and the
// in-sandbox "envd" API under /envd, both over any SandboxApi. Mount it at, say, /e2b and point the
// official SDK at it with E2B_API_URL=<server>/e2b and E2B_SANDBOX_URL=<server>/e2b/envd (the SDK then
// names the sandbox in an E2b-Sandbox-Id header). docs/e2b.md is the compatibility reference.
import { randomBytes } from 'node:crypto';
import { Hono, type Context } from 'hono';
import type { SandboxApi } from '../contract.js';
import { mountControl } from './control.js';
import { mountFiles } from './files.js';
import { mountFilesystem } from './filesystem.js';
import { mountProcess } from './process.js';
import type { KeyedCaller } from './token.js';

export { ENVD_VERSION } from './envd.js';
export type { KeyedCaller } from './token.js';

export interface E2bRoutesOptions {
  /**
   * The caller an API key (the X-API-Key header) stands for, with the key's id, or undefined to
   * answer 401. The envd tokens handed to it are bound to that key id.
   */
  caller(c: Context): KeyedCaller | undefined;
  /**
   * Whether API key `keyId` of `tenant` exists and is not revoked. Asked on every envd request
   * (keep it a cheap lookup, and cache nothing a revoke would not clear): a revoked key's envd
   * tokens answer 401 from then on.
   */
  keyActive(keyId: string, tenant: string): boolean;
  /**
   * The preview domain given to the SDK: getHost(port) is `<port>-<id>.<domain>` (a function: known
   * only once the server listens, e.g. "localhost:<port>").
   */
  domain: string | (() => string);
  /**
   * Key of the envd access tokens (HMAC-SHA256). Keep it across restarts (with the server's state)
   * or every SDK client must reconnect (Sandbox.connect) after one. Default: random per process.
   */
  tokenSecret?: Uint8Array;
  /** Sandbox timeout when the SDK gives none (default 300 000 ms, as E2B). */
  defaultTimeoutMs?: number;
  /** Largest streamed upload (default 1 GiB) and largest multipart upload (default 64 MiB). */
  maxUploadBytes?: number;
  maxMultipartBytes?: number;
}

export function e2bRoutes(api: SandboxApi, opts: E2bRoutesOptions): Hono {
  const secret = opts.tokenSecret ?? randomBytes(32);
  if (secret.byteLength < 16) throw new TypeError('e2bRoutes: tokenSecret must be at least 16 bytes');
  const deps = { api, secret, keyActive: (id: string, tenant: string) => opts.keyActive(id, tenant) };

  const envd = new Hono();
  mountFiles(envd, deps, {
    maxUploadBytes: opts.maxUploadBytes ?? 1024 * 1024 * 1024,
    maxMultipartBytes: opts.maxMultipartBytes ?? 64 * 1024 * 1024,
  });
  mountProcess(envd, deps);
  mountFilesystem(envd, deps);
  envd.all('*', (c) =>
    c.json(
      {
        code: 'unimplemented',
        message: `${c.req.method} ${new URL(c.req.url).pathname} is not supported by Airlock's envd API`,
      },
      501,
    ),
  );

  const app = new Hono();
  app.route('/envd', envd);
  mountControl(app, api, {
    caller: (c) => opts.caller(c),
    domain: opts.domain,
    secret,
    defaultTimeoutMs: opts.defaultTimeoutMs ?? 300_000,
  });
  app.all('*', (c) =>
    c.json(
      {
        code: 501,
        message: `${c.req.method} ${new URL(c.req.url).pathname} is not supported by Airlock's E2B API`,
      },
      501,
    ),
  );
  return app;
}
