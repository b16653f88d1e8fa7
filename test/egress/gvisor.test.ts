// Egress on the gVisor tier: the same path as on the namespaces tier (the proxy, transparent
// interception and DNS listen in the sandbox's routeless netns; the sentry uses that netns's host
// stack), against test servers in this run's private network namespace.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Sandbox } from '../../src/index.js';
import { canRunGvisor } from '../helpers.js';
import { startEgressWorld, type EgressWorld } from './harness.js';
import { ALLOWED, assertPrivateNetns, DENIED, SECRET_HOST } from './net.js';

assertPrivateNetns();

let world: EgressWorld;

beforeAll(async () => {
  if (canRunGvisor) world = await startEgressWorld({ secretEnv: { TEST_TOKEN: 'real-secret-value-42' } });
});

afterAll(async () => {
  await world?.close();
});

const spec = {
  backend: 'gvisor' as const,
  network: { allow: [ALLOWED.name, SECRET_HOST.name] },
  secrets: [{ name: 'TEST_TOKEN', value: { fromEnv: 'TEST_TOKEN' }, hosts: [SECRET_HOST.name] }],
};

const withSandbox = <T>(f: (s: Sandbox) => Promise<T>): Promise<T> => world.withSandbox(spec, f);

describe.skipIf(!canRunGvisor)('egress on the gVisor tier', () => {
  it('the proxy allows the listed host and refuses another with a reason', async () => {
    await withSandbox(async (s) => {
      const ok = await s.exec(`curl -sS -m 10 http://${ALLOWED.name}/hello`);
      expect(ok.exitCode, ok.stderr).toBe(0);
      expect(JSON.parse(ok.stdout)).toMatchObject({ host: ALLOWED.name, url: '/hello' });
      const no = await s.exec(`curl -sS -m 10 -w '\\n%{http_code}' http://${DENIED.name}/`);
      expect(no.stdout).toMatch(
        /blocked by Airlock egress policy: host denied\.test is not in network\.allow[\s\S]*403$/,
      );
      expect(world.dialer.dials).not.toContain(`${DENIED.address}:80`);
    });
  }, 60_000);

  it('transparent interception: curl --noproxy reaches the allowed host by name; a raw address is refused', async () => {
    await withSandbox(async (s) => {
      const ok = await s.exec(`curl -sS -m 10 --noproxy '*' http://${ALLOWED.name}/direct`);
      expect(ok.exitCode, ok.stderr).toBe(0);
      expect(JSON.parse(ok.stdout)).toMatchObject({ url: '/direct' });
      const no = await s.exec(`curl -sS -m 10 --noproxy '*' -w '\\n%{http_code}' http://${DENIED.address}/`);
      expect(no.stdout).not.toMatch(/"url"/);
      expect(world.dialer.dials).not.toContain(`${DENIED.address}:80`);
    });
  }, 60_000);

  it('the sandbox sees only a sentinel; the bound host gets the real value; another host gets nothing', async () => {
    await withSandbox(async (s) => {
      const env = await s.exec('echo "$TEST_TOKEN"');
      expect(env.stdout).toMatch(/^airlock_sentinel_test_token_/);
      const r = await s.exec(
        `curl -sS -m 10 -H "Authorization: Bearer $TEST_TOKEN" https://${SECRET_HOST.name}/gv-api`,
      );
      expect(r.exitCode, r.stderr).toBe(0);
      expect(world.servers.seen.findLast((q) => q.url === '/gv-api')?.headers.authorization).toBe(
        'Bearer real-secret-value-42',
      );
      expect(r.stdout).not.toContain('real-secret-value-42');
      const leak = await s.exec(
        `curl -sS -m 10 -w '\\n%{http_code}' -H "Authorization: Bearer $TEST_TOKEN" http://${ALLOWED.name}/gv-steal`,
      );
      expect(leak.stdout).toMatch(/may only be sent to its bound host[\s\S]*403$/);
      expect(world.servers.seen.some((q) => q.url === '/gv-steal')).toBe(false);
    });
  }, 60_000);
});
