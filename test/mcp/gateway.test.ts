// The HTTP gateway end to end: real sandboxed servers (the in-repo hostile fixture, server-memory from
// npm) behind one Streamable HTTP endpoint, spoken to with the official SDK client. Proves the
// front door (Host, Origin, bearer token, session ownership), namespacing and collisions, the
// boundaries (per-session, per-tenant, per-call, per-server), tool rules and budgets, and no leaks.
import { request } from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  McpError,
  ToolListChangedNotificationSchema,
  type CallToolResult,
} from '@modelcontextprotocol/sdk/types.js';
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import {
  canRunNamespaces,
  NO_RESIDUE,
  settledResidue,
  SKIP_REASON,
  TEST_STATE_DIR,
  TEST_UID_RANGE,
  testAirlock,
} from '../helpers.js';
import type { Airlock } from '../../src/sandbox/airlock.js';
import { FIXTURE, startGateway, type TestGateway } from './harness.js';

const [NODE, ...HOSTILE_ARGS] = FIXTURE('hostile-server.ts');
const hostile = (airlock: Record<string, unknown> = {}) => ({ command: NODE, args: HOSTILE_ARGS, airlock });

const text = (r: unknown): string =>
  ((r as CallToolResult).content ?? []).map((c) => (c.type === 'text' ? c.text : '')).join('');

/** The JSON-RPC error a call fails with (fails the test if it succeeds). */
async function rpcError(p: Promise<unknown>): Promise<McpError> {
  try {
    await p;
  } catch (e) {
    if (e instanceof McpError) return e;
    throw e;
  }
  return expect.fail('expected an MCP error');
}

/** A raw HTTP exchange with the gateway (headers under the test's control). */
function raw(
  port: number,
  headers: Record<string, string>,
  body = JSON.stringify({
    jsonrpc: '2.0',
    id: 1,
    method: 'initialize',
    params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'raw', version: '1' } },
  }),
): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = request(
      {
        host: '127.0.0.1',
        port,
        path: '/mcp',
        method: 'POST',
        headers: {
          'content-type': 'application/json',
          accept: 'application/json, text/event-stream',
          ...headers,
        },
      },
      (res) => {
        let b = '';
        res.on('data', (c: Buffer) => (b += c.toString()));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, body: b }));
      },
    );
    req.on('error', reject);
    req.end(body);
  });
}

if (!canRunNamespaces) {
  describe('mcp gateway (http)', () => {
    it.skip(`the whole suite [skipped: ${SKIP_REASON}]`, () => {});
  });
} else {
  describe('mcp gateway (http)', () => {
    let airlock: Airlock;
    let gw: TestGateway;

    beforeAll(async () => {
      airlock = testAirlock();
      gw = await startGateway(airlock, {
        // per-session (the HTTP default), namespaced as h__<tool>
        h: hostile({
          tools: {
            deny: ['steal'],
            arguments: {
              write_file: { schema: { type: 'object', properties: { content: { maxLength: 20 } } } },
            },
          },
        }),
        pc: hostile({ boundary: 'per-call' }),
        pt: hostile({ boundary: 'per-tenant' }),
        ps: hostile({ boundary: 'per-server', budgets: { maxCalls: 3 } }),
      });
    }, 120_000);

    afterAll(async () => {
      await gw?.close();
      await airlock?.killAll();
      expect(await settledResidue()).toEqual(NO_RESIDUE);
    }, 60_000);

    describe('front door', () => {
      it('refuses a request without a valid bearer token (401), before any MCP processing', async () => {
        const host = `127.0.0.1:${gw.port}`;
        expect((await raw(gw.port, { host })).status).toBe(401);
        const wrong = await raw(gw.port, { host, authorization: `Bearer ${'x'.repeat(64)}` });
        expect(wrong.status).toBe(401);
        expect(wrong.body).toContain('Bearer');
        expect((await raw(gw.port, { host, authorization: `Bearer ${gw.tokens.alice}` })).status).toBe(200);
      });

      it('refuses a foreign Host or Origin (DNS rebinding), even with a valid token', async () => {
        const auth = { authorization: `Bearer ${gw.tokens.alice}` };
        expect((await raw(gw.port, { ...auth, host: 'evil.example.com' })).status).toBe(403);
        expect((await raw(gw.port, { ...auth, host: `evil.example.com:${gw.port}` })).status).toBe(403);
        const origin = await raw(gw.port, {
          ...auth,
          host: `127.0.0.1:${gw.port}`,
          origin: 'http://evil.example.com',
        });
        expect(origin.status).toBe(403);
        const same = await raw(gw.port, {
          ...auth,
          host: `localhost:${gw.port}`,
          origin: `http://localhost:${gw.port}`,
        });
        expect(same.status).toBe(200);
        const denied = gw.events.filter((e) => e.kind === 'mcp' && e.method === 'http').map((e) => e.code);
        expect(denied).toEqual(expect.arrayContaining(['unauthorized', 'host_rejected', 'origin_rejected']));
      });

      it('refuses a broken body with a JSON-RPC error, not a crash', async () => {
        const h = { host: `127.0.0.1:${gw.port}`, authorization: `Bearer ${gw.tokens.alice}` };
        const dup = await raw(
          gw.port,
          h,
          '{"jsonrpc":"2.0","id":1,"method":"initialize","method":"tools/call"}',
        );
        expect(dup.status).toBe(400);
        const body = JSON.parse(dup.body) as { error: { code: number; message: string } };
        expect(body).toMatchObject({ jsonrpc: '2.0', error: { code: -32700 } });
        expect(body.error.message).toMatch(/duplicate/i);
        const noMethod = await raw(gw.port, h, '{"jsonrpc":"2.0","id":5,"method":7}');
        expect(JSON.parse(noMethod.body)).toMatchObject({ id: 5, error: { code: -32600 } });
        const junk = await raw(gw.port, h, 'not json');
        expect(JSON.parse(junk.body)).toMatchObject({ error: { code: -32700 } });
      });

      it("a session belongs to its tenant: another tenant's token cannot use its id", async () => {
        const h = { host: `127.0.0.1:${gw.port}` };
        const init = await raw(gw.port, {
          ...h,
          authorization: `Bearer ${gw.tokens.alice}`,
          accept: 'application/json, text/event-stream',
        });
        expect(init.status).toBe(200);
        const c = await gw.client('alice');
        const transport = c.transport as unknown as { sessionId?: string };
        const sid = transport.sessionId!;
        expect(sid).toBeTruthy();
        const ping = JSON.stringify({ jsonrpc: '2.0', id: 7, method: 'ping' });
        const asBob = await raw(
          gw.port,
          {
            ...h,
            authorization: `Bearer ${gw.tokens.bob}`,
            'mcp-session-id': sid,
            'mcp-protocol-version': '2025-06-18',
          },
          ping,
        );
        expect(asBob.status).toBe(404);
        const asAlice = await raw(
          gw.port,
          {
            ...h,
            authorization: `Bearer ${gw.tokens.alice}`,
            'mcp-session-id': sid,
            'mcp-protocol-version': '2025-06-18',
          },
          ping,
        );
        expect(asAlice.status).toBe(200);
        expect(asAlice.body).toContain('"id":7');
      });
    });

    describe('definitions', () => {
      let c: Client;
      beforeAll(async () => {
        c = await gw.client('alice');
      }, 60_000);

      it("namespaces every server's tools and hides quarantined ones", async () => {
        const names = (await c.listTools()).tools.map((t) => t.name);
        for (const ns of ['h', 'pc', 'pt', 'ps']) {
          expect(names).toContain(`${ns}__echo`);
          expect(names).toContain(`${ns}__write_file`);
          // The poisoned description, the tag-character one and the homoglyph name never show.
          expect(names).not.toContain(`${ns}__add`);
          expect(names).not.toContain(`${ns}__translate`);
          expect(names.filter((n) => n.startsWith(`${ns}__re`) && n !== `${ns}__read_file`)).toEqual([]);
        }
        expect(names.some((n) => !/^(h|pc|pt|ps)__/.test(n))).toBe(false);
      });

      it('refuses a call to a quarantined tool with the reason', async () => {
        const e = await rpcError(c.callTool({ name: 'h__add', arguments: { a: 1, b: 2, sidenote: 'x' } }));
        expect(e.code).toBe(-32010);
        expect(e.data).toEqual({ airlock: { code: 'quarantined' } });
        expect(e.message).toMatch(
          /quarantined: hidden-instruction|quarantined: .*sensitive-path|quarantined/,
        );
        const audit = gw.events.find((x) => x.kind === 'mcp' && x.tool === 'add' && x.decision === 'deny');
        expect(audit).toMatchObject({ code: 'quarantined', server: 'h' });
      });

      it('quarantines a tool that changes after the session pinned it (rug pull, rename)', async () => {
        // The fixture changes `weather` (and renames fetch_data) from its second tools/list on. The
        // gateway lists at session start and pins what it saw, so the client never sees the new one.
        const fresh = await gw.client('alice');
        const names = (await fresh.listTools()).tools.map((t) => t.name);
        expect(names).not.toContain('h__weather');
        expect(names).not.toContain('h__fetch_data_v2'); // new to the pin: not trusted
        const e = await rpcError(fresh.callTool({ name: 'h__weather', arguments: { city: 'Oslo' } }));
        expect(e.data).toEqual({ airlock: { code: 'quarantined' } });
        const pinFindings = gw.events.flatMap((x) =>
          x.kind === 'mcp' && x.server === 'h'
            ? (x.findings ?? []).map((f) => `${f.ruleId} ${f.location}`)
            : [],
        );
        expect(pinFindings).toEqual(
          expect.arrayContaining([
            expect.stringMatching(/^definition-changed tools\[weather\]/),
            expect.stringMatching(/^schema-widened tools\[weather\]\.inputSchema/),
            expect.stringMatching(/^definition-(renamed|added) tools\[fetch_data_v2\]/),
          ]),
        );
      });
    });

    describe('calls', () => {
      it('applies tool rules: a denied tool and an argument schema', async () => {
        const c = await gw.client('alice');
        const denied = await rpcError(c.callTool({ name: 'h__steal', arguments: {} }));
        expect(denied.data).toEqual({ airlock: { code: 'tool_denied' } });
        expect(denied.message).toMatch(/blocked by Airlock MCP policy/);
        const long = await rpcError(
          c.callTool({ name: 'h__write_file', arguments: { content: 'x'.repeat(21) } }),
        );
        expect(long.data).toEqual({ airlock: { code: 'arguments_schema' } });
        expect(text(await c.callTool({ name: 'h__write_file', arguments: { content: 'short' } }))).toMatch(
          /wrote 5 bytes/,
        );
      });

      it('stops a session at its budget with an error that names the budget', async () => {
        const c = await gw.client('bob');
        for (let i = 0; i < 3; i++)
          expect(text(await c.callTool({ name: 'ps__echo', arguments: { text: `${i}` } }))).toContain(`${i}`);
        const e = await rpcError(c.callTool({ name: 'ps__echo', arguments: { text: 'again' } }));
        expect(e.code).toBe(-32011);
        expect(e.data).toEqual({ airlock: { code: 'budget_calls' } });
        expect(e.message).toMatch(/maxCalls/);
        // Budgets are per session: a new session of the same tenant starts afresh.
        const c2 = await gw.client('bob');
        expect(text(await c2.callTool({ name: 'ps__echo', arguments: { text: 'fresh' } }))).toContain(
          'fresh',
        );
      });

      it('guards results: truncation and provenance', async () => {
        const c = await gw.client('alice');
        const r = await c.callTool({ name: 'h__flood', arguments: { bytes: 2_000_000 } });
        const out = text(r);
        expect(Buffer.byteLength(out)).toBeLessThanOrEqual(64_000);
        expect(out).toMatch(/truncated/);
        expect(r._meta?.['airlock/provenance']).toMatchObject({
          server: 'h',
          tool: 'flood',
          truncated: true,
        });
      });
    });

    describe('calls in flight', () => {
      it('keeps 24 calls in flight on one server without a MaxListenersExceededWarning', async () => {
        const warnings: string[] = [];
        const onWarning = (w: Error): void => void warnings.push(`${w.name}: ${w.message}`);
        process.on('warning', onWarning);
        try {
          const c = await gw.client('alice');
          // One server per session (h is per-session): all 24 sleep there at once.
          const rs = await Promise.all(
            Array.from({ length: 24 }, () => c.callTool({ name: 'h__sleep', arguments: { ms: 1000 } })),
          );
          expect(rs.map(text)).toEqual(Array.from({ length: 24 }, () => 'slept 1000 ms'));
          await new Promise((r) => setImmediate(r)); // warnings are emitted on the next tick
          expect(warnings).toEqual([]);
        } finally {
          process.off('warning', onWarning);
        }
      });

      it('fails the calls in flight at once when the server sends a message too large to read, then serves the next', async () => {
        // A gateway of its own: the fixture needs ~0.75 GB to make a 68 MB answer (over the 512 MiB default).
        const big = await startGateway(airlock, {
          b: hostile({ limits: { memoryBytes: 2048 * 1024 * 1024 } }),
        });
        try {
          const c = await big.client('alice');
          const sleeps = Array.from({ length: 3 }, () =>
            rpcError(
              c.callTool({ name: 'b__sleep', arguments: { ms: 600_000 } }, undefined, { timeout: 120_000 }),
            ),
          );
          // Sent after the sleeps: once it is answered, they have reached the server.
          expect(text(await c.callTool({ name: 'b__echo', arguments: { text: 'before' } }))).toContain(
            'before',
          );
          // 68 MB of text in one JSON-RPC line: over the 64 MiB a server's message may have.
          const flood = await rpcError(c.callTool({ name: 'b__flood', arguments: { bytes: 68_000_000 } }));
          const lost = /MCP server b sent a message Airlock cannot read .*pending requests failed/;
          expect(flood.message).toMatch(lost);
          for (const e of await Promise.all(sleeps)) expect(e.message).toMatch(lost);
          // The server itself lives on: the next call is answered.
          expect(text(await c.callTool({ name: 'b__echo', arguments: { text: 'after' } }))).toContain(
            'after',
          );
        } finally {
          await big.close();
        }
      }, 90_000);
    });

    describe('boundaries', () => {
      it('per-session: session B does not see what session A wrote', async () => {
        const a = await gw.client('alice');
        const b = await gw.client('alice');
        expect(text(await a.callTool({ name: 'h__write_file', arguments: { content: 'from A' } }))).toMatch(
          /wrote/,
        );
        expect(text(await a.callTool({ name: 'h__read_file', arguments: {} }))).toBe('from A');
        const rb = await b.callTool({ name: 'h__read_file', arguments: {} });
        expect(text(rb)).not.toContain('from A');
        expect(rb.isError).toBe(true); // no state file in B's own sandbox
      });

      it('per-session: closing the session kills its sandbox', async () => {
        const c = await gw.client('alice');
        await c.callTool({ name: 'h__echo', arguments: { text: 'x' } });
        const before = await gw.core.instances('h');
        await (c.transport as unknown as { terminateSession(): Promise<void> }).terminateSession();
        await c.close();
        for (let i = 0; i < 100 && (await gw.core.instances('h')).length >= before.length; i++)
          await new Promise((r) => setTimeout(r, 50));
        expect((await gw.core.instances('h')).length).toBe(before.length - 1);
      });

      it('per-call: every call gets a fresh sandbox and leaves no state behind', async () => {
        const c = await gw.client('alice');
        expect(
          text(await c.callTool({ name: 'pc__write_file', arguments: { content: 'leftover' } })),
        ).toMatch(/wrote/);
        const r = await c.callTool({ name: 'pc__read_file', arguments: {} });
        expect(text(r)).not.toContain('leftover');
        const ids = gw.events
          .filter((e) => e.kind === 'mcp' && e.server === 'pc' && e.method === 'tools/call')
          .map((e) => e.sandboxId);
        expect(ids.length).toBeGreaterThanOrEqual(2);
        expect(new Set(ids).size).toBe(ids.length);
      });

      it('per-tenant: sessions of one tenant share state, other tenants do not see it', async () => {
        const a1 = await gw.client('alice');
        const a2 = await gw.client('alice');
        const b = await gw.client('bob');
        await a1.callTool({ name: 'pt__write_file', arguments: { content: 'alice data' } });
        expect(text(await a2.callTool({ name: 'pt__read_file', arguments: {} }))).toBe('alice data');
        expect(text(await b.callTool({ name: 'pt__read_file', arguments: {} }))).not.toContain('alice data');
      });
    });
  });

  describe('mcp gateway: secrets', () => {
    it('a server uses a sentinel, never the real value, and neither reaches the client', async () => {
      // Nothing is sent anywhere: the policy only exists so the secret can be bound to a host.
      const real = ['ghp', '_', 'R3alV4lue', 'x'.repeat(27)].join('');
      const airlock = new (await import('../../src/sandbox/airlock.js')).Airlock({
        stateDir: TEST_STATE_DIR,
        uidRange: TEST_UID_RANGE,
        secretEnv: { AIRLOCK_TEST_GH: real },
      });
      const gw = await startGateway(airlock, {
        sec: hostile({
          boundary: 'per-server',
          network: { allow: ['api.github.com'] },
          secrets: [
            { name: 'GITHUB_TOKEN', value: { fromEnv: 'AIRLOCK_TEST_GH' }, hosts: ['api.github.com'] },
          ],
        }),
      });
      try {
        const c = await gw.client('alice');
        const r = await c.callTool({
          name: 'sec__leak_secret',
          arguments: { name: 'GITHUB_TOKEN', literal: real },
        });
        const out = text(r);
        expect(out).not.toContain(real);
        expect(out).not.toMatch(/airlock_sentinel_/);
        expect(out).toContain('GITHUB_TOKEN=[REDACTED:sentinel:GITHUB_TOKEN]');
        expect(out).toContain('literal=[REDACTED:secret:GITHUB_TOKEN]');
        expect(out).toMatch(/\[REDACTED:credential:aws/); // the fixture's fake AWS key pair
        expect(r._meta?.['airlock/provenance']).toMatchObject({ redacted: true });
        // Inside the sandbox the variable holds only the sentinel.
        const [up] = await gw.core.instances('sec');
        const env = await up!.sandbox.exec('printenv GITHUB_TOKEN');
        expect(env.stdout).toMatch(/^airlock_sentinel_/);
        expect(env.stdout).not.toContain(real);
      } finally {
        await gw.close();
        await airlock.killAll();
      }
    }, 120_000);
  });

  describe('mcp gateway: re-listing on a timer', () => {
    it('catches a change without any client request and tells the client (list_changed)', async () => {
      const airlock = testAirlock();
      const gw = await startGateway(
        airlock,
        { h: hostile({ boundary: 'per-session' }) },
        { relistIntervalMs: 1000 },
      );
      try {
        const c = await gw.client('alice');
        let changed = 0;
        c.setNotificationHandler(ToolListChangedNotificationSchema, () => void changed++);
        // The session-start listing pinned the first definitions; the timer's listing sees the
        // fixture's second ones (weather changed, fetch_data renamed) and quarantines them.
        for (let i = 0; i < 100 && changed === 0; i++) await new Promise((r) => setTimeout(r, 100));
        expect(changed).toBeGreaterThan(0);
        const names = (await c.listTools()).tools.map((t) => t.name);
        expect(names).toContain('h__echo');
        expect(names).not.toContain('h__weather');
      } finally {
        await gw.close();
        await airlock.killAll();
      }
    }, 120_000);
  });

  describe('mcp gateway: name collisions', () => {
    it('never merges two servers that offer the same tool name', async () => {
      const airlock = testAirlock();
      const gw = await startGateway(airlock, {
        one: hostile({ namespace: false, boundary: 'per-server' }),
        two: hostile({ namespace: false, boundary: 'per-server' }),
      });
      try {
        const c = await gw.client('alice');
        const names = (await c.listTools()).tools.map((t) => t.name);
        expect(names).not.toContain('echo');
        const e = await rpcError(c.callTool({ name: 'echo', arguments: { text: 'x' } }));
        expect(e.data).toEqual({ airlock: { code: 'name_collision' } });
        expect(e.message).toMatch(/one, two/);
      } finally {
        await gw.close();
        await airlock.killAll();
      }
      expect(await settledResidue()).toEqual(NO_RESIDUE);
    }, 120_000);
  });
}
