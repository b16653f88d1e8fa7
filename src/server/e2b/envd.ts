// What every envd (in-sandbox API) request shares: which sandbox it is for (the E2b-Sandbox-Id header)
// and who is asking (the X-Access-Token the create answer handed out), E2B's path rules (relative to
// the user's home), and its `user` option (only the sandbox's one user exists on Airlock).
import { posix } from 'node:path';
import type { Context } from 'hono';
import type { SandboxApi } from '../contract.js';
import { EnvdError, envdErrorFrom } from './connect.js';
import { callerFromToken, type KeyedCaller } from './token.js';

/** The envd version Airlock claims: the newest whose features the SDK gates on (see docs/e2b.md). */
export const ENVD_VERSION = '0.6.4';
/** The sandbox's one user and its home, as in E2B's default template. */
export const SANDBOX_USER = 'user';
export const SANDBOX_HOME = '/home/user';

export interface EnvdDeps {
  readonly api: SandboxApi;
  readonly secret: Uint8Array;
  /** Whether API key `keyId` of `tenant` exists and is not revoked (asked on every request). */
  readonly keyActive: (keyId: string, tenant: string) => boolean;
}

export interface Target {
  readonly id: string;
  readonly caller: KeyedCaller;
}

const SANDBOX_ID = /^[A-Za-z0-9_-]{1,128}$/;

/** The sandbox and caller of an envd request, or an `unauthenticated` error (never says which part failed). */
export function target(c: Context, deps: EnvdDeps): Target {
  const id = c.req.header('e2b-sandbox-id');
  if (id === undefined || !SANDBOX_ID.test(id)) {
    throw new EnvdError(
      'invalid_argument',
      'the E2b-Sandbox-Id header is missing or malformed: set E2B_SANDBOX_URL',
    );
  }
  const caller = callerFromToken(deps.secret, c.req.header('x-access-token'), id);
  // The token is only as good as the API key that obtained it: a revoked key's tokens stop here.
  if (!caller || !deps.keyActive(caller.keyId, caller.tenant)) {
    throw new EnvdError('unauthenticated', `missing or wrong X-Access-Token for sandbox ${id}`);
  }
  return { id, caller };
}

/** How often an open stream re-checks the API key behind its token. */
const KEY_RECHECK_MS = 1000;

/**
 * `source`'s items while the API key behind `t`'s token stays valid: a stream that outlives a revoke
 * (a long command's output, a watch) ends with `unauthenticated` within KEY_RECHECK_MS of it. A
 * failing check (the store closing) counts as revoked: fail closed.
 */
export async function* whileKeyActive<T>(
  deps: EnvdDeps,
  t: Target,
  source: AsyncIterable<T>,
): AsyncGenerator<T> {
  const it = source[Symbol.asyncIterator]();
  let timer: NodeJS.Timeout | undefined;
  const revoked = new Promise<never>((_, reject) => {
    timer = setInterval(() => {
      let ok = false;
      try {
        ok = deps.keyActive(t.caller.keyId, t.caller.tenant);
      } catch {
        // fail closed
      }
      if (!ok) reject(new EnvdError('unauthenticated', `the API key behind this X-Access-Token was revoked`));
    }, KEY_RECHECK_MS);
    timer.unref();
  });
  revoked.catch(() => {});
  try {
    for (;;) {
      const next = it.next();
      next.catch(() => {}); // when the revoke wins the race, a later failure of this one is moot
      const r = await Promise.race([next, revoked]);
      if (r.done) return;
      yield r.value;
    }
  } finally {
    clearInterval(timer);
    void it.return?.()?.catch(() => {});
  }
}

/** Map any failure of an envd request to the error the SDK understands. */
export function envdError(e: unknown, c: Context): EnvdError {
  return envdErrorFrom(e, c.req.header('e2b-sandbox-id') ?? '?');
}

/**
 * E2B's `user` option: absent, or the sandbox's one user. It travels as `username` (files) or as
 * HTTP Basic `user:` (RPC). Any other user (root) cannot be honoured, so it is refused, not ignored.
 */
export function checkUser(username: string | undefined): void {
  if (username === undefined || username === '' || username === SANDBOX_USER) return;
  throw new EnvdError(
    'unimplemented',
    `user ${JSON.stringify(username.slice(0, 64))} is not supported: Airlock sandboxes have one unprivileged user, "${SANDBOX_USER}"`,
  );
}

/** The user named by an RPC's `Authorization: Basic base64(user:)` header, if any. */
export function rpcUser(c: Context): string | undefined {
  const auth = c.req.header('authorization');
  if (!auth?.startsWith('Basic ')) return undefined;
  const decoded = Buffer.from(auth.slice(6), 'base64').toString('utf8');
  const colon = decoded.indexOf(':');
  return colon < 0 ? decoded : decoded.slice(0, colon);
}

/** A path as E2B resolves it: relative to the home directory. */
export function e2bPath(p: string | undefined): string {
  if (p === undefined || p === '') throw new EnvdError('invalid_argument', 'path: give a path');
  if (p.includes('\0')) throw new EnvdError('invalid_argument', 'path: must not contain NUL bytes');
  return posix.resolve(SANDBOX_HOME, p);
}

/** Whether the sandbox is running (for GET /health: E2B answers 502 when it is not). */
export async function isRunning(deps: EnvdDeps, t: Target): Promise<boolean> {
  try {
    return (await deps.api.get(t.id, t.caller)).state === 'running';
  } catch (e) {
    const err = envdErrorFrom(e, t.id);
    if (err.httpStatus === 502) return false;
    throw err;
  }
}
