// A frame the canonical parser drops that carries an id gets a JSON-RPC error answer (issue 30, class
// 9b), whatever broke it, in every direction: a server's broken request to its client (the gateway),
// and a broken ANSWER from a server, which fails the call it belonged to at once with the reason
// instead of leaving it to its timeout. A client's broken request to the gateway is a transport case:
// test/mcp/transport.contract.ts (BROKEN_REQUESTS_WITH_ID) runs it on stdio and on HTTP.
import { McpError, type CallToolResult } from '@modelcontextprotocol/sdk/types.js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Airlock } from '../../src/sandbox/airlock.js';
import { canRunNamespaces, NO_RESIDUE, settledResidue, SKIP_REASON, testAirlock } from '../helpers.js';
import { FIXTURE, startGateway, type TestGateway } from './harness.js';

const [NODE, ...PRESSURE_ARGS] = FIXTURE('pressure-server.ts');
const pressure = (airlock: Record<string, unknown> = {}) => ({ command: NODE, args: PRESSURE_ARGS, airlock });
const text = (r: unknown): string =>
  ((r as CallToolResult).content ?? []).map((c) => (c.type === 'text' ? c.text : '')).join('');

if (!canRunNamespaces) {
  describe('broken frames with an id are answered', () => {
    it.skip(`the whole suite [skipped: ${SKIP_REASON}]`, () => {});
  });
} else {
  describe('broken frames with an id are answered (http gateway)', () => {
    let airlock: Airlock;
    let gw: TestGateway;

    beforeAll(async () => {
      airlock = testAirlock();
      gw = await startGateway(airlock, { p: pressure() });
    }, 120_000);

    afterAll(async () => {
      await gw?.close();
      await airlock?.killAll();
      expect(await settledResidue()).toEqual(NO_RESIDUE);
    }, 60_000);

    it("server → gateway: the server's broken requests (7 kinds) are each answered with an error", async () => {
      const c = await gw.client('alice');
      const r = await c.callTool({ name: 'p__probe_client', arguments: {} });
      const answers = JSON.parse(text(r)) as Record<string, { code?: number; message?: string } | string>;
      expect(Object.keys(answers).sort()).toEqual(
        [
          'bad_utf8',
          'case_variant',
          'dup_key',
          'forbidden_key',
          'lone_surrogate',
          'number_out_of_range',
          'too_deep',
        ].sort(),
      );
      for (const [kind, a] of Object.entries(answers)) {
        expect(a, kind).not.toBe('no answer');
        expect(
          typeof a === 'object' && [-32700, -32600].includes(a.code ?? 0),
          `${kind}: ${JSON.stringify(a)}`,
        ).toBe(true);
      }
    }, 60_000);

    it("a server's broken answer fails its call at once with the reason (not the 120 s timeout)", async () => {
      const c = await gw.client('bob');
      for (const kind of ['dup_key', 'case_variant', 'lone_surrogate', 'bad_utf8']) {
        let err: unknown;
        try {
          await c.callTool({ name: 'p__broken_answer', arguments: { kind } });
        } catch (e) {
          err = e;
        }
        expect(err, kind).toBeInstanceOf(McpError);
        expect((err as McpError).message, kind).toMatch(/Airlock dropped the peer's answer/);
      }
      // Later calls on the same server instance are unaffected.
      expect(text(await c.callTool({ name: 'p__echo', arguments: { text: 'fine' } }))).toBe('fine');
    }, 30_000);
  });
}
