// The server both E2B test files drive: e2bRoutes on a real Hono server on 127.0.0.1, over a
// LocalSandboxApi with real sandboxes (at /e2b), over a RemoteSandboxApi that reaches nativeRoutes
// over HTTP (at /e2b-remote, the production shape), and with small upload caps (at /small). The API
// under the routes is the real one, observed: the tenant of every call and the abort signal of every
// stream it serves are recorded. Network safety: the SDK's domain is an unresolvable `.invalid` name
// and every HTTP request the process makes is observed (undici's diagnostics channel, used by global
// fetch and the undici package alike) so a test can assert all went to 127.0.0.1.
import diagnostics from 'node:diagnostics_channel';
import type { AddressInfo } from 'node:net';
import { serve, type ServerType } from '@hono/node-server';
import { Hono, type Context } from 'hono';
import type { Airlock } from '../../src/index.js';
import { RemoteSandboxApi } from '../../src/server/client.js';
import { e2bRoutes } from '../../src/server/e2b/index.js';
import { LocalSandboxApi } from '../../src/server/local.js';
import { nativeRoutes } from '../../src/server/routes.js';
import { testAirlock } from '../helpers.js';

export const KEY = 'e2b-test-key-1';
export const KEY2 = 'e2b-test-key-2';
export const SECRET = new Uint8Array(32).fill(7);
export const DOMAIN = 'airlock-e2b.invalid';

export interface E2bHarness {
  readonly airlock: Airlock;
  readonly base: string;
  /** Origins of every HTTP request this process made (undici). */
  readonly origins: Set<string>;
  /** Requests the test server answered. */
  readonly served: () => number;
  readonly streamSignals: AbortSignal[];
  /** `method:tenant` of every SandboxApi call the E2B routes made. */
  readonly callers: string[];
  close(): Promise<void>;
}

export async function startE2bHarness(): Promise<E2bHarness> {
  const airlock = testAirlock();
  const origins = new Set<string>();
  const onRequest = (m: unknown): void => {
    origins.add(String((m as { request: { origin: string | URL } }).request.origin));
  };
  diagnostics.subscribe('undici:request:create', onRequest);
  const streamSignals: AbortSignal[] = [];
  const callers: string[] = [];
  let served = 0;
  const observed = <T extends object>(inner: T): T =>
    new Proxy(inner, {
      get(t, p, r) {
        const v = Reflect.get(t, p, r) as unknown;
        if (typeof v !== 'function') return v;
        return (...args: unknown[]) => {
          for (const a of args) {
            if (typeof a === 'object' && a !== null && 'tenant' in a) {
              callers.push(`${String(p)}:${String(a.tenant)}`);
            }
          }
          const sig = args.at(-1);
          if (
            (p === 'watch' || p === 'connectProcess' || p === 'startAndFollow') &&
            sig instanceof AbortSignal
          )
            streamSignals.push(sig);
          return (v as (...a: unknown[]) => unknown).apply(t, args);
        };
      },
    });
  const local = new LocalSandboxApi(airlock, { watchIntervalMs: 100 });
  const native = serve({ fetch: nativeRoutes(local).fetch, hostname: '127.0.0.1', port: 0 });
  await new Promise<void>((r) => native.once('listening', () => r()));
  const remote = new RemoteSandboxApi({
    baseUrl: `http://127.0.0.1:${(native.address() as AddressInfo).port}`,
  });
  const opts = {
    caller: (c: Context) => {
      const key = c.req.header('x-api-key');
      return key === KEY
        ? { tenant: 't1', keyId: 'k1' }
        : key === KEY2
          ? { tenant: 't2', keyId: 'k2' }
          : undefined;
    },
    keyActive: (keyId: string, tenant: string) =>
      (keyId === 'k1' && tenant === 't1') || (keyId === 'k2' && tenant === 't2'),
    domain: DOMAIN,
    tokenSecret: SECRET,
  };
  const app = new Hono();
  app.use('*', async (_c, next) => {
    served++;
    await next();
  });
  app.route('/e2b', e2bRoutes(observed(local), opts));
  app.route('/e2b-remote', e2bRoutes(observed(remote), opts));
  app.route('/small', e2bRoutes(observed(local), { ...opts, maxUploadBytes: 4096, maxMultipartBytes: 4096 }));
  const server: ServerType = serve({ fetch: app.fetch, hostname: '127.0.0.1', port: 0 });
  await new Promise<void>((r) => server.once('listening', () => r()));
  const base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  process.env.E2B_API_KEY = KEY;
  process.env.E2B_DOMAIN = DOMAIN;
  process.env.E2B_API_URL = `${base}/e2b`;
  process.env.E2B_SANDBOX_URL = `${base}/e2b/envd`;
  return {
    airlock,
    base,
    origins,
    served: () => served,
    streamSignals,
    callers,
    async close() {
      diagnostics.unsubscribe('undici:request:create', onRequest);
      await airlock.close();
      await new Promise<void>((r) => server.close(() => r()));
      await new Promise<void>((r) => native.close(() => r()));
    },
  };
}

/** The envd access token the SDK holds for a sandbox. */
export function accessToken(sbx: object): string {
  return (sbx as { envdAccessToken: string }).envdAccessToken;
}

/** Text received so far, and a promise for when a predicate on it holds. */
export function collector(): {
  text: () => string;
  push: (s: string) => void;
  until: (p: (t: string) => boolean) => Promise<void>;
} {
  let acc = '';
  const waiters: { p: (t: string) => boolean; r: () => void }[] = [];
  return {
    text: () => acc,
    push: (s) => {
      acc += s;
      for (const w of [...waiters]) {
        if (!w.p(acc)) continue;
        waiters.splice(waiters.indexOf(w), 1);
        w.r();
      }
    },
    until: (p) => (p(acc) ? Promise.resolve() : new Promise((r) => waiters.push({ p, r }))),
  };
}
