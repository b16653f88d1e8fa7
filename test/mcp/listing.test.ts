// Least privilege in listings (issue 30, class 6): a tool the operator's tool rules deny is not shown in
// tools/list, over HTTP and stdio, namespaced and not, on every re-listing; calling it by name anyway gets
// the explained policy denial (-32010 with the rule that denied it), and the audit records it.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { McpError, type CallToolResult } from '@modelcontextprotocol/sdk/types.js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Airlock } from '../../src/sandbox/airlock.js';
import { canRunNamespaces, NO_RESIDUE, settledResidue, SKIP_REASON, testAirlock } from '../helpers.js';
import { FIXTURE, startCli, startGateway, type TestGateway } from './harness.js';

const [NODE, ...HOSTILE_ARGS] = FIXTURE('hostile-server.ts');
const hostile = (airlock: Record<string, unknown> = {}) => ({ command: NODE, args: HOSTILE_ARGS, airlock });
const DENIED = -32010;

const text = (r: unknown): string =>
  ((r as CallToolResult).content ?? []).map((c) => (c.type === 'text' ? c.text : '')).join('');

async function rpcError(p: Promise<unknown>): Promise<McpError> {
  try {
    await p;
  } catch (e) {
    if (e instanceof McpError) return e;
    throw e;
  }
  return expect.fail('expected an MCP error');
}

if (!canRunNamespaces) {
  describe('least privilege in listings', () => {
    it.skip(`the whole suite [skipped: ${SKIP_REASON}]`, () => {});
  });
} else {
  describe('least privilege in listings (http gateway)', () => {
    let airlock: Airlock;
    let gw: TestGateway;

    beforeAll(async () => {
      airlock = testAirlock();
      gw = await startGateway(airlock, {
        // deny globs ignore case: STEAL denies steal; flo* denies flood
        d: hostile({ tools: { deny: ['STEAL', 'flo*'] } }),
        // an allowlist: everything else is hidden
        a: hostile({ tools: { allow: ['echo', 'sleep'] }, boundary: 'per-tenant' }),
        // deny wins over allow
        w: hostile({ tools: { allow: ['echo', 'inject'], deny: ['inject'] }, boundary: 'per-server' }),
      });
    }, 120_000);

    afterAll(async () => {
      await gw?.close();
      await airlock?.killAll();
      expect(await settledResidue()).toEqual(NO_RESIDUE);
    }, 60_000);

    it('lists only what the rules allow, for every tenant and on every re-listing', async () => {
      for (const tenant of ['alice', 'bob']) {
        const c = await gw.client(tenant);
        for (let i = 0; i < 3; i++) {
          const names = (await c.listTools()).tools.map((t) => t.name);
          expect(names).toEqual(expect.arrayContaining(['d__echo', 'd__inject', 'a__echo', 'w__echo']));
          for (const hidden of ['d__steal', 'd__flood', 'w__inject'])
            expect(names, `${tenant} #${i}`).not.toContain(hidden);
          expect(names.filter((n) => n.startsWith('a__')).sort()).toEqual(['a__echo', 'a__sleep']);
        }
      }
    });

    it('a call to a hidden tool gets the explained denial, never "unknown tool", and is audited', async () => {
      const c = await gw.client('alice');
      const cases: Array<[string, string, RegExp]> = [
        ['d__steal', 'tool_denied', /tool "steal" is denied by tools\.deny entry "STEAL" for server d/],
        ['d__flood', 'tool_denied', /tool "flood" is denied by tools\.deny entry "flo\*" for server d/],
        ['a__inject', 'tool_not_allowed', /tool "inject" is not in tools\.allow for server a/],
        ['a__steal', 'tool_not_allowed', /tool "steal" is not in tools\.allow for server a/],
        ['w__inject', 'tool_denied', /denied by tools\.deny entry "inject" for server w/],
      ];
      // Before any listing in this session, and again after one.
      for (const round of [0, 1]) {
        if (round === 1) await c.listTools();
        for (const [name, code, reason] of cases) {
          const e = await rpcError(c.callTool({ name, arguments: {} }));
          expect(e.code, name).toBe(DENIED);
          expect(e.data, name).toEqual({ airlock: { code } });
          expect(e.message, name).toMatch(reason);
        }
      }
      const audited = gw.events.filter(
        (e) => e.kind === 'mcp' && e.method === 'tools/call' && e.decision === 'deny' && e.tool === 'flood',
      );
      expect(audited.length).toBeGreaterThanOrEqual(2);
      // The allowed tools keep working.
      expect(text(await c.callTool({ name: 'a__echo', arguments: { text: 'still here' } }))).toBe(
        'still here',
      );
    });

    it('a name that is not a tool at all is still "unknown tool" (no rule text leaks for it)', async () => {
      const c = await gw.client('bob');
      const e = await rpcError(c.callTool({ name: 'd__no_such_tool', arguments: {} }));
      expect(e.code).toBe(-32602);
      expect(e.message).toMatch(/unknown tool/);
    });
  });

  describe('least privilege in listings (airlock mcp, stdio)', () => {
    let dir: string;
    beforeAll(() => {
      dir = mkdtempSync('/var/tmp/airlock-mcp-listing-');
    });
    afterAll(() => rmSync(dir, { recursive: true, force: true }));

    it('a --policy tools.deny hides the tool from the one server it fronts; a call is refused with the reason', async () => {
      const policy = join(dir, 'policy.yaml');
      writeFileSync(policy, 'tools:\n  deny: [steal, "leak_*"]\n');
      const cli = await startCli(['--policy', policy, '--', ...FIXTURE('hostile-server.ts')]);
      try {
        const names = (await cli.client.listTools()).tools.map((t) => t.name);
        expect(names).toEqual(expect.arrayContaining(['echo', 'flood', 'inject']));
        expect(names).not.toContain('steal');
        expect(names).not.toContain('leak_secret');
        const e = await rpcError(cli.client.callTool({ name: 'leak_secret', arguments: {} }));
        expect(e.code).toBe(DENIED);
        expect(e.data).toEqual({ airlock: { code: 'tool_denied' } });
        expect(e.message).toMatch(/tool "leak_secret" is denied by tools\.deny entry "leak_\*"/);
      } finally {
        await cli.close();
      }
      expect(await settledResidue(10_000)).toEqual(NO_RESIDUE);
    }, 120_000);
  });
}
