// Budgets hold under concurrency (issue 30, class 7): calls in flight count at admission (reserve, then
// settle), so a client firing 20 calls at once gets no more than its budget of calls, output bytes,
// output tokens or wall time; and a call has a hard wall-time cap that progress cannot extend (a server
// reporting progress forever is cancelled at the cap). Real gateway, real SDK client, real sandboxed
// server (test/fixtures/mcp/pressure-server.ts).
import { randomBytes } from 'node:crypto';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { McpError, type CallToolResult } from '@modelcontextprotocol/sdk/types.js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { countOutputTokens } from '../../src/mcp/budget.js';
import { parseGatewayConfig } from '../../src/mcp/config.js';
import { GatewayCore } from '../../src/mcp/gateway.js';
import { HttpFront } from '../../src/mcp/http.js';
import type { AuditEvent } from '../../src/mcp/audit.js';
import { gatewaySetups } from '../../src/mcp/setup.js';
import type { Airlock } from '../../src/sandbox/airlock.js';
import { canRunNamespaces, NO_RESIDUE, settledResidue, SKIP_REASON, testAirlock } from '../helpers.js';
import { FIXTURE, newToken } from './harness.js';

const [NODE, ...PRESSURE_ARGS] = FIXTURE('pressure-server.ts');
const pressure = (airlock: Record<string, unknown> = {}) => ({ command: NODE, args: PRESSURE_ARGS, airlock });
const BUDGET = -32011;
const text = (r: unknown): string =>
  ((r as CallToolResult).content ?? []).map((c) => (c.type === 'text' ? c.text : '')).join('');

interface Gw {
  events: AuditEvent[];
  stderr: string[];
  client(): Promise<Client>;
  close(): Promise<void>;
}

/** A gateway over HTTP with a chosen per-call hard cap (the harness's has the default). */
async function gateway(
  airlock: Airlock,
  mcpServers: Record<string, unknown>,
  callHardCapMs?: number,
): Promise<Gw> {
  const token = newToken();
  const config = parseGatewayConfig({
    mcpServers,
    airlock: {
      tenants: [{ name: 'alice', token }],
      lockfile: `/nonexistent-${randomBytes(4).toString('hex')}/airlock.lock.json`,
    },
  });
  const events: AuditEvent[] = [];
  const stderr: string[] = [];
  const core = new GatewayCore({
    airlock,
    mode: 'multi',
    servers: gatewaySetups(config, 'http'),
    audit: (e) => events.push(e),
    onServerStderr: (_s, l) => stderr.push(l),
    ...(callHardCapMs !== undefined ? { callHardCapMs } : {}),
  });
  await core.start();
  const front = new HttpFront(core, { host: '127.0.0.1', port: 0, tenants: [{ name: 'alice', token }] });
  const where = await front.listen();
  const clients: Client[] = [];
  return {
    events,
    stderr,
    async client() {
      const c = new Client({ name: 'test', version: '1' });
      await c.connect(
        new StreamableHTTPClientTransport(new URL(where.url), {
          requestInit: { headers: { authorization: `Bearer ${token}` } },
        }),
      );
      clients.push(c);
      return c;
    },
    async close() {
      await Promise.allSettled(clients.map((c) => c.close()));
      await front.close();
      await core.close();
    },
  };
}

/** Settle 20 calls started together; the fulfilled results and the Airlock codes of the refusals. */
async function burst(
  c: Client,
  n: number,
  call: (i: number) => Promise<unknown>,
): Promise<{ ok: unknown[]; codes: string[]; errors: McpError[] }> {
  await c.listTools();
  const settled = await Promise.allSettled(Array.from({ length: n }, (_, i) => call(i)));
  const ok: unknown[] = [];
  const codes: string[] = [];
  const errors: McpError[] = [];
  for (const s of settled) {
    if (s.status === 'fulfilled') ok.push(s.value);
    else {
      expect(s.reason).toBeInstanceOf(McpError);
      errors.push(s.reason as McpError);
      codes.push(
        String((s.reason as McpError & { data?: { airlock?: { code?: string } } }).data?.airlock?.code),
      );
    }
  }
  return { ok, codes, errors };
}

if (!canRunNamespaces) {
  describe('budgets under concurrency', () => {
    it.skip(`the whole suite [skipped: ${SKIP_REASON}]`, () => {});
  });
} else {
  describe('budgets under concurrency (http gateway)', () => {
    let airlock: Airlock;
    let gw: Gw;

    beforeAll(async () => {
      airlock = testAirlock();
      gw = await gateway(airlock, {
        calls: pressure({ budgets: { maxCalls: 5 } }),
        bytes: pressure({ budgets: { maxOutputBytes: 120_000 }, output: { maxTextBytes: 50_000 } }),
        tokens: pressure({ budgets: { maxOutputTokens: 2_000 }, output: { maxTextBytes: 50_000 } }),
        wall: pressure({ budgets: { maxWallTimeMs: 3_000, maxCallMs: 1_000 } }),
        cap: pressure({ budgets: { maxCallMs: 1_500 } }),
      });
    }, 120_000);

    afterAll(async () => {
      await gw?.close();
      await airlock?.killAll();
      expect(await settledResidue()).toEqual(NO_RESIDUE);
    }, 60_000);

    it('20 concurrent calls against maxCalls 5: exactly 5 admitted, 15 refused budget_calls', async () => {
      const c = await gw.client();
      const r = await burst(c, 20, (i) => c.callTool({ name: 'calls__sleep', arguments: { ms: 200 + i } }));
      expect(r.ok).toHaveLength(5);
      expect(r.codes).toEqual(Array(15).fill('budget_calls'));
      for (const e of r.errors) expect(e.code).toBe(BUDGET);
    });

    it('20 concurrent 60 kB results against maxOutputBytes 120,000: what comes back stays within it', async () => {
      const c = await gw.client();
      const big = 'b'.repeat(60_000);
      const r = await burst(c, 20, () => c.callTool({ name: 'bytes__echo', arguments: { text: big } }));
      const returned = r.ok.reduce<number>((n, x) => n + Buffer.byteLength(text(x)), 0);
      expect(returned).toBeLessThanOrEqual(120_000);
      expect(r.ok.length).toBeGreaterThanOrEqual(2); // 50,000 + 50,000 + the 20,000 left
      expect(r.ok.length).toBeLessThanOrEqual(3);
      expect(new Set(r.codes)).toEqual(new Set(['budget_bytes']));
      // Once they settle (each counted at its full 60 kB), the budget is spent: the next call is refused.
      const after = await c
        .callTool({ name: 'bytes__echo', arguments: { text: 'x' } })
        .catch((e: unknown) => e);
      expect(after).toBeInstanceOf(McpError);
      expect((after as McpError).message).toMatch(/maxOutputBytes 120000 reached/);
    });

    it('20 concurrent calls against maxOutputTokens 2,000: the tokens returned stay within it', async () => {
      const c = await gw.client();
      const words = Array.from({ length: 8_000 }, (_, i) => `w${i}`).join(' ');
      const r = await burst(c, 20, () => c.callTool({ name: 'tokens__echo', arguments: { text: words } }));
      const tokens = r.ok.reduce<number>((n, x) => n + countOutputTokens(text(x)), 0);
      expect(r.ok.length).toBeGreaterThanOrEqual(1);
      expect(tokens).toBeLessThanOrEqual(2_000);
      expect(new Set(r.codes)).toEqual(new Set(['budget_tokens']));
    });

    it('20 concurrent hour-long calls against maxWallTimeMs 3,000 (maxCallMs 1,000): 3 admitted, each stopped at its cap', async () => {
      const c = await gw.client();
      const r = await burst(c, 20, () =>
        c.callTool({ name: 'wall__sleep', arguments: { ms: 3_600_000 } }, undefined, { timeout: 60_000 }),
      );
      expect(r.ok).toHaveLength(0);
      const capped = r.codes.filter((x) => x === 'call_time_cap');
      expect(capped).toHaveLength(3);
      expect(r.codes.filter((x) => x === 'budget_wall_time')).toHaveLength(17);
      const capError = r.errors.find((e) => /wall-time cap/.test(e.message))!;
      expect(capError.code).toBe(BUDGET);
      expect(capError.message).toMatch(/budgets\.maxCallMs 1000 ms\); progress does not extend it/);
    }, 60_000);

    it('a server reporting progress forever is cancelled at maxCallMs; the client saw the progress', async () => {
      const c = await gw.client();
      let progress = 0;
      const err = await c
        .callTool({ name: 'cap__progress_forever', arguments: {} }, undefined, {
          onprogress: () => void progress++,
          resetTimeoutOnProgress: true,
          timeout: 60_000,
        })
        .catch((e: unknown) => e);
      expect(err).toBeInstanceOf(McpError);
      expect((err as McpError).code).toBe(BUDGET);
      expect((err as McpError & { data?: unknown }).data).toEqual({ airlock: { code: 'call_time_cap' } });
      expect(progress).toBeGreaterThan(0);
      // The server was told to stop (notifications/cancelled), and the audit says why.
      for (let i = 0; i < 100 && !gw.stderr.some((l) => /progress_forever .* cancelled/.test(l)); i++)
        await new Promise((r) => setTimeout(r, 50));
      expect(gw.stderr.some((l) => /progress_forever .* cancelled/.test(l))).toBe(true);
      expect(
        gw.events.some((e) => e.kind === 'mcp' && e.code === 'call_time_cap' && e.server === 'cap'),
      ).toBe(true);
      // The same session goes on.
      expect(text(await c.callTool({ name: 'cap__echo', arguments: { text: 'next' } }))).toBe('next');
    }, 60_000);
  });

  describe("the gateway's own per-call cap (no budgets)", () => {
    it('progress forever ends at callHardCapMs with a reason naming it', async () => {
      const airlock = testAirlock();
      const gw = await gateway(airlock, { p: pressure() }, 1_200);
      try {
        const c = await gw.client();
        const err = await c
          .callTool({ name: 'p__progress_forever', arguments: {} }, undefined, {
            onprogress: () => {},
            resetTimeoutOnProgress: true,
            timeout: 60_000,
          })
          .catch((e: unknown) => e);
        expect(err).toBeInstanceOf(McpError);
        expect((err as McpError).message).toMatch(/the gateway's per-call cap of 1200 ms/);
        expect(text(await c.callTool({ name: 'p__echo', arguments: { text: 'ok' } }))).toBe('ok');
      } finally {
        await gw.close();
        await airlock.killAll();
      }
      expect(await settledResidue()).toEqual(NO_RESIDUE);
    }, 60_000);
  });
}
