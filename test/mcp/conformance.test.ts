// The MCP conformance suite (npm @modelcontextprotocol/conformance 0.1.13, pinned: later versions need
// Node 22), run offline against the gateway over Streamable HTTP, fronting the in-repo conformance
// fixture server in a sandbox (per-session boundary). All 32 server scenarios (`--suite all`, which
// includes the pending json-schema-2020-12 and server-sse-polling) must pass: the expected-failures
// baseline (conformance-baseline.yaml) is empty. The runner cannot send an Authorization header, so a
// small reverse proxy in front adds the tenant's token (see harness.authProxy).
import { spawn } from 'node:child_process';
import { describe, expect, it } from 'vitest';
import { canRunNamespaces, NO_RESIDUE, settledResidue, SKIP_REASON, testAirlock } from '../helpers.js';
import { authProxy, FIXTURE, ROOT, startGateway } from './harness.js';

if (!canRunNamespaces) {
  describe('mcp conformance', () => {
    it.skip(`the whole suite [skipped: ${SKIP_REASON}]`, () => {});
  });
} else {
  describe('mcp conformance', () => {
    it('passes every server scenario of @modelcontextprotocol/conformance 0.1.13 through the gateway', async () => {
      const airlock = testAirlock();
      const [cmd, ...args] = FIXTURE('conformance-server.ts');
      const gw = await startGateway(airlock, { conf: { command: cmd, args, airlock: { namespace: false } } });
      const proxy = await authProxy(gw.port, gw.tokens.alice!);
      let out = '';
      let code: number | null = null;
      try {
        const child = spawn(
          process.execPath,
          [
            `${ROOT}/node_modules/@modelcontextprotocol/conformance/dist/index.js`,
            'server',
            '--url',
            proxy.url,
            '--suite',
            'all',
            '--expected-failures',
            `${ROOT}/test/mcp/conformance-baseline.yaml`,
          ],
          { stdio: ['ignore', 'pipe', 'pipe'] },
        );
        child.stdout.on('data', (b: Buffer) => (out += b.toString()));
        child.stderr.on('data', (b: Buffer) => (out += b.toString()));
        code = await new Promise<number | null>((r) => child.on('exit', (c) => r(c)));
      } finally {
        await proxy.close();
        await gw.close();
        await airlock.killAll();
      }
      const plain = out.replace(/\x1b\[[0-9;]*m/g, ''); // eslint-disable-line no-control-regex
      expect(plain, plain.slice(-4000)).toMatch(/Running all suite \(32 scenarios\)/);
      const total = /Total: (\d+) passed, (\d+) failed/.exec(plain);
      expect(total, plain.slice(-4000)).not.toBeNull();
      expect(Number(total![2]), plain.slice(-4000)).toBe(0);
      expect(Number(total![1])).toBeGreaterThanOrEqual(44);
      expect(code, plain.slice(-4000)).toBe(0);
      expect(await settledResidue()).toEqual(NO_RESIDUE);
    }, 600_000);
  });
}
