// A real Airlock server for the Python SDK's tests (python/tests/conftest.py starts it): the native
// REST API (nativeRoutes over a LocalSandboxApi, so real sandboxes) on 127.0.0.1:<free port>, behind
// a bearer key made for this run. It prints one line, {"url","key"}, and runs until its stdin closes
// (the test process exiting closes it too), then kills every sandbox it made and exits.
//
//   tsx scripts/test-server.ts            (state dir and uid range: AIRLOCK_TEST_STATE_DIR,
//                                          AIRLOCK_TEST_UID_FIRST, as the vitest suites use)
import { randomBytes, timingSafeEqual } from 'node:crypto';
import { serve } from '@hono/node-server';
import { Hono } from 'hono';
import { Airlock } from '../src/index.js';
import { LocalSandboxApi } from '../src/server/local.js';
import { nativeRoutes } from '../src/server/routes.js';

/** Small caps, so the tests can reach them (the defaults are far larger). */
export const TEST_SERVER_LIMITS = { maxBodyBytes: 256 * 1024, maxUploadBytes: 8 * 1024 * 1024 } as const;

async function main(): Promise<void> {
  const airlock = new Airlock({
    stateDir: process.env.AIRLOCK_TEST_STATE_DIR ?? '/var/tmp/airlock-test',
    uidRange: { first: Number(process.env.AIRLOCK_TEST_UID_FIRST ?? 3_900_000), count: 4096 },
  });
  const key = randomBytes(24).toString('base64url');
  const expected = Buffer.from(`Bearer ${key}`);
  const app = new Hono();
  app.use('/v1/*', async (c, next) => {
    const got = Buffer.from(c.req.header('authorization') ?? '');
    if (got.length !== expected.length || !timingSafeEqual(got, expected)) {
      return c.json({ error: { code: 'UNAUTHORIZED', message: 'missing or wrong API key' } }, 401);
    }
    await next();
  });
  app.route('/', nativeRoutes(new LocalSandboxApi(airlock), TEST_SERVER_LIMITS));

  const server = serve({ fetch: app.fetch, hostname: '127.0.0.1', port: 0 });
  await new Promise<void>((resolve) => server.once('listening', resolve));
  const addr = server.address();
  if (addr === null || typeof addr === 'string') throw new Error('no TCP address');
  process.stdout.write(JSON.stringify({ url: `http://127.0.0.1:${addr.port}`, key }) + '\n');

  let stopping = false;
  const stop = async (): Promise<void> => {
    if (stopping) return;
    stopping = true;
    server.close();
    (server as { closeAllConnections?: () => void }).closeAllConnections?.();
    await airlock.close();
    process.exit(0);
  };
  process.stdin.on('end', () => void stop());
  process.stdin.on('close', () => void stop());
  process.stdin.resume();
  process.on('SIGTERM', () => void stop());
  process.on('SIGINT', () => void stop());
}

await main();
