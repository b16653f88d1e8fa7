// MCP side channels and tenant routing, end to end (issue 30, classes 4 and 5): real gateways (HTTP in
// process, and the `airlock mcp` CLI over stdio) in front of real sandboxed servers (the side-channel
// fixture and @modelcontextprotocol/server-everything), spoken to with the official SDK client.
// - Every server→client message passes the output guard: logging, progress, resources/updated,
//   resources/read (text and blob), prompts/get, completion, sampling and elicitation requests; the
//   fixture hides a real secret, its sentinel and credential shapes in each (soft hyphens, zero-width
//   and tag characters, full-width letters, split over two items, base64 blobs), and none may arrive.
// - Listings of resources, templates and prompts are scanned and gated like tools.
// - A message goes only to the session whose request caused it, never across tenants, and no request
//   that is not a tools/call shares an instance across tenants (per-call: a fresh one each time).
import { randomBytes } from 'node:crypto';
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import {
  CreateMessageRequestSchema,
  ElicitRequestSchema,
  LoggingMessageNotificationSchema,
  McpError,
  ResourceUpdatedNotificationSchema,
  type CallToolResult,
} from '@modelcontextprotocol/sdk/types.js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { AuditEvent } from '../../src/mcp/audit.js';
import { Airlock } from '../../src/sandbox/airlock.js';
import {
  canRunNamespaces,
  NO_RESIDUE,
  settledResidue,
  SKIP_REASON,
  TEST_STATE_DIR,
  TEST_UID_RANGE,
  testAirlock,
} from '../helpers.js';
import { FIXTURE, startCli, startGateway, type TestGateway } from './harness.js';

const [NODE, ...SIDE_ARGS] = FIXTURE('sidechannel-server.ts');
const side = (airlock: Record<string, unknown> = {}, env: Record<string, string> = {}) => ({
  command: NODE,
  args: SIDE_ARGS,
  env,
  airlock,
});
const EVERYTHING = { command: 'npx', args: ['-y', '@modelcontextprotocol/server-everything'] };

/** What the fixture hides besides the real value (see sidechannel-server.ts). */
const AWS_ID = 'AKIAAIRLOCKFAKEKEY02';
const AWS_SECRET = 'airlockFAKE/secret/Key/0123456789abcdefB';
/** The fixture's own real value when none is given (shaped like a GitHub token). */
const DEFAULT_REAL = ['ghp', '_', 'SideChannelRealValue', '0'.repeat(16)].join('');

const text = (r: unknown): string =>
  ((r as CallToolResult).content ?? []).map((c) => (c.type === 'text' ? c.text : '')).join('');

const strip = (s: string): string =>
  s.replace(/[\u00ad\u200b-\u200f\u2060-\u206f\ufeff]|[\u{e0000}-\u{e007f}]/gu, '').normalize('NFKC');
/** Every string of a JSON tree (keys too), base64-looking ones also decoded. */
function strings(v: unknown, out: string[] = []): string[] {
  if (typeof v === 'string') {
    out.push(v);
    if (/^[A-Za-z0-9+/]{8,}={0,2}$/.test(v)) out.push(Buffer.from(v, 'base64').toString('latin1'));
  } else if (Array.isArray(v)) v.forEach((x) => strings(x, out));
  else if (v && typeof v === 'object')
    for (const [k, x] of Object.entries(v)) {
      out.push(k);
      strings(x, out);
    }
  return out;
}
/** The needles that show anywhere in `v`: in a string, across strings, after normalising. */
function leaked(v: unknown, needles: readonly string[]): string[] {
  const all = strings(v);
  const forms = [...all, all.join(''), ...all.map(strip), strip(all.join(''))];
  return needles.filter((n) => forms.some((f) => f.includes(n)));
}

/** The JSON-RPC error a request fails with (fails the test if it succeeds). */
async function rpcError(p: Promise<unknown>): Promise<McpError> {
  try {
    await p;
  } catch (e) {
    if (e instanceof McpError) return e;
    throw e;
  }
  return expect.fail('expected an MCP error');
}

interface Recorder {
  readonly c: Client;
  readonly logs: unknown[];
  readonly updated: unknown[];
  readonly sampling: unknown[];
  readonly elicit: unknown[];
  /** Everything this client received from servers, as one string. */
  seen(): string;
}

/** A client that answers sampling and elicitation and records every message it gets. */
function record(c: Client, me: string): Recorder {
  const r: Recorder = {
    c,
    logs: [],
    updated: [],
    sampling: [],
    elicit: [],
    seen: () => JSON.stringify([r.logs, r.updated, r.sampling, r.elicit]),
  };
  c.setNotificationHandler(LoggingMessageNotificationSchema, (n) => void r.logs.push(n.params));
  c.setNotificationHandler(ResourceUpdatedNotificationSchema, (n) => void r.updated.push(n.params));
  c.setRequestHandler(CreateMessageRequestSchema, async (req) => {
    r.sampling.push(req.params);
    return { role: 'assistant', content: { type: 'text', text: `answer-for-${me}` }, model: 'test' };
  });
  c.setRequestHandler(ElicitRequestSchema, async (req) => {
    r.elicit.push(req.params);
    return { action: 'decline' };
  });
  return r;
}

const CAPS = { sampling: {}, elicitation: {} };
const recorder = async (gw: TestGateway, tenant: string, me = tenant): Promise<Recorder> =>
  record(await gw.client(tenant, { capabilities: CAPS }), me);

if (!canRunNamespaces) {
  describe('mcp side channels', () => {
    it.skip(`the whole suite [skipped: ${SKIP_REASON}]`, () => {});
  });
} else {
  describe('mcp side channels: every server→client message passes the guard (http)', () => {
    const REAL = `rv-${randomBytes(12).toString('hex')}-real`;
    let airlock: Airlock;
    let gw: TestGateway;
    let r: Recorder;
    let needles: string[];

    beforeAll(async () => {
      airlock = new Airlock({
        stateDir: TEST_STATE_DIR,
        uidRange: TEST_UID_RANGE,
        secretEnv: { AIRLOCK_TEST_M1_GH: REAL },
      });
      gw = await startGateway(airlock, {
        g: side(
          {
            boundary: 'per-session',
            network: { allow: ['api.github.com'] },
            secrets: [
              { name: 'GITHUB_TOKEN', value: { fromEnv: 'AIRLOCK_TEST_M1_GH' }, hosts: ['api.github.com'] },
            ],
          },
          // The server learned the real value some other way (e.g. an upstream reflected it).
          { LEAK_REAL: REAL },
        ),
      });
      r = await recorder(gw, 'alice');
      await r.c.listTools();
      const [up] = await gw.core.instances('g');
      const sentinel = (await up!.sandbox.exec('printenv GITHUB_TOKEN')).stdout.trim();
      expect(sentinel).toMatch(/^airlock_sentinel_/);
      needles = [REAL, sentinel, AWS_ID, AWS_SECRET];
    }, 120_000);

    afterAll(async () => {
      await gw?.close();
      await airlock?.killAll();
      expect(await settledResidue()).toEqual(NO_RESIDUE);
    }, 60_000);

    const audited = (method: string): AuditEvent[] =>
      gw.events.filter((e) => e.kind === 'mcp' && e.method === method);

    it('logging, progress and resources/updated notifications', async () => {
      await r.c.subscribeResource({ uri: 'leak://text' });
      const progress: unknown[] = [];
      const res = await r.c.callTool(
        { name: 'g__leak_notes', arguments: { uri: 'leak://text' } },
        undefined,
        {
          onprogress: (p) => void progress.push(p),
        },
      );
      expect(text(res)).toBe('done');
      // All of them arrived (the guard redacts; it does not swallow), none with a leak.
      expect(r.logs.length).toBeGreaterThanOrEqual(10);
      expect(progress.length).toBeGreaterThanOrEqual(8);
      expect(r.updated).toHaveLength(1);
      expect(r.updated[0]).toMatchObject({ uri: 'leak://text' });
      expect(leaked([r.logs, progress, r.updated], needles)).toEqual([]);
      expect(JSON.stringify(r.logs)).toContain('[REDACTED:secret:GITHUB_TOKEN]');
      expect(JSON.stringify(r.logs)).toContain('[REDACTED:sentinel:GITHUB_TOKEN]');
      expect(JSON.stringify(r.logs)).toContain('found split across text fields');
      expect(JSON.stringify(progress)).toContain('[REDACTED:');
      for (const m of ['notifications/message', 'notifications/progress', 'notifications/resources/updated'])
        expect(audited(m).some((e) => e.kind === 'mcp' && (e.redactions ?? 0) > 0)).toBe(true);
    });

    it('sampling and elicitation requests from the server', async () => {
      const res = await r.c.callTool({ name: 'g__ask', arguments: {} });
      expect(text(res)).toBe('sampled=assistant elicited=decline');
      expect(r.sampling).toHaveLength(1);
      expect(r.elicit).toHaveLength(1);
      expect(leaked([r.sampling, r.elicit], needles)).toEqual([]);
      expect(JSON.stringify(r.sampling)).toContain('[REDACTED:');
      expect(JSON.stringify(r.elicit)).toContain('[REDACTED:secret:GITHUB_TOKEN]');
      for (const m of ['sampling/createMessage', 'elicitation/create'])
        expect(audited(m).some((e) => e.kind === 'mcp' && (e.redactions ?? 0) > 0)).toBe(true);
    });

    it('resources/read: text, a text blob, a binary blob, a secret split over two contents', async () => {
      const read = async (uri: string) => r.c.readResource({ uri });
      const t = await read('leak://text');
      expect(leaked(t, needles)).toEqual([]);
      expect(t._meta?.['airlock/provenance']).toMatchObject({ server: 'g', redacted: true });
      const blob = await read('leak://blob');
      const decoded = Buffer.from((blob.contents[0] as { blob: string }).blob, 'base64').toString();
      expect(decoded).toContain('[REDACTED:secret:GITHUB_TOKEN]');
      expect(leaked(blob, needles)).toEqual([]);
      const bin = await read('leak://binblob');
      expect(bin.contents[0]).toMatchObject({ uri: 'leak://binblob' });
      expect((bin.contents[0] as { text?: string }).text).toMatch(/withheld: holds \[REDACTED:secret/);
      expect(leaked(bin, needles)).toEqual([]);
      const split = await read('leak://split');
      expect(leaked(split, needles)).toEqual([]);
      expect(JSON.stringify(split)).toContain('found split across text fields');
      const reads = audited('resources/read');
      expect(reads.filter((e) => e.kind === 'mcp' && e.decision === 'allow').length).toBeGreaterThanOrEqual(
        4,
      );
    });

    it('resources/read is truncated like a tool result', async () => {
      const flood = await r.c.readResource({ uri: 'leak://flood' });
      const t = (flood.contents[0] as { text: string }).text;
      expect(Buffer.byteLength(t)).toBeLessThanOrEqual(64_000);
      expect(t).toMatch(/bytes truncated/);
      expect(flood._meta?.['airlock/provenance']).toMatchObject({ truncated: true });
    });

    it('prompts/get (text, images, an embedded blob) and completion', async () => {
      const p = await r.c.getPrompt({ name: 'g__leaky', arguments: { who: 'x' } });
      expect(p.messages.length).toBeGreaterThanOrEqual(10);
      expect(leaked(p, needles)).toEqual([]);
      expect(p.messages.map((m) => m.role)).toContain('assistant');
      const c = await r.c.complete({
        ref: { type: 'ref/prompt', name: 'g__leaky' },
        argument: { name: 'who', value: 'a' },
      });
      expect(c.completion.values.length).toBeGreaterThan(0);
      expect(leaked(c, needles)).toEqual([]);
      expect(audited('prompts/get').some((e) => e.kind === 'mcp' && (e.redactions ?? 0) > 0)).toBe(true);
      expect(audited('completion/complete').some((e) => e.kind === 'mcp' && (e.redactions ?? 0) > 0)).toBe(
        true,
      );
    });

    it('resource, template and prompt listings are scanned and gated like tools', async () => {
      const prompts = (await r.c.listPrompts()).prompts.map((p) => p.name);
      expect(prompts).toContain('g__leaky');
      expect(prompts).not.toContain('g__poisoned');
      expect(prompts).not.toContain('g__drifting'); // changed after the session pinned it
      const resources = (await r.c.listResources()).resources.map((x) => x.uri);
      expect(resources).toContain('leak://text');
      expect(resources).not.toContain('leak://poison');
      expect(resources).not.toContain('leak://drift');
      const templates = (await r.c.listResourceTemplates()).resourceTemplates.map((x) => x.uriTemplate);
      expect(templates).toContain('state://set/{value}');
      expect(templates).not.toContain('leak://evil/{x}');
      expect(templates).not.toContain('leak://item/{id}');
      // What is shown is redacted: the server's descriptions carry the real value.
      const listings = [
        await r.c.listTools(),
        await r.c.listPrompts(),
        await r.c.listResources(),
        await r.c.listResourceTemplates(),
      ];
      expect(leaked(listings, needles)).toEqual([]);
      expect(
        JSON.stringify(listings).match(/\[REDACTED:secret:GITHUB_TOKEN\]/g)?.length,
      ).toBeGreaterThanOrEqual(4);
      const e = await rpcError(r.c.readResource({ uri: 'leak://poison' }));
      expect(e.data).toEqual({ airlock: { code: 'quarantined' } });
      const findings = gw.events.flatMap((x) =>
        x.kind === 'mcp' ? (x.findings ?? []).map((f) => `${f.ruleId} ${f.location}`) : [],
      );
      expect(findings).toEqual(
        expect.arrayContaining([
          expect.stringMatching(/^definition-changed prompts\[drifting\]/),
          expect.stringMatching(/^definition-changed resources\[leak:\/\/drift\]/),
          expect.stringMatching(/^definition-changed resourceTemplates\[leak:\/\/item\/\{id\}\]/),
        ]),
      );
    });
  });

  describe('mcp side channels: budgets count resources/read like a tool call', () => {
    it('a read over maxOutputBytes completes; the next read and the next call are refused', async () => {
      const airlock = testAirlock();
      const gw = await startGateway(airlock, {
        b: side({ boundary: 'per-server', budgets: { maxOutputBytes: 100_000 } }),
      });
      try {
        const c = await gw.client('alice');
        const first = await c.readResource({ uri: 'leak://flood' });
        expect(first._meta?.['airlock/provenance']).toMatchObject({ truncated: true });
        const e = await rpcError(c.readResource({ uri: 'leak://text' }));
        expect(e.data).toEqual({ airlock: { code: 'budget_bytes' } });
        const e2 = await rpcError(c.callTool({ name: 'b__remember', arguments: { value: 'x' } }));
        expect(e2.data).toEqual({ airlock: { code: 'budget_bytes' } });
      } finally {
        await gw.close();
        await airlock.killAll();
      }
    }, 120_000);
  });

  describe('mcp routing: a resource URI two servers both list', () => {
    it('is routed to neither (never by listing order); a read is refused with the reason', async () => {
      const airlock = testAirlock();
      const gw = await startGateway(airlock, {
        one: side({ boundary: 'per-server' }),
        two: side({ boundary: 'per-server' }),
      });
      try {
        const c = await gw.client('alice');
        const uris = (await c.listResources()).resources.map((x) => x.uri);
        expect(uris).not.toContain('leak://text');
        const e = await rpcError(c.readResource({ uri: 'leak://text' }));
        expect(e.data).toEqual({ airlock: { code: 'quarantined' } });
        expect(e.message).toMatch(/offered by several servers \(one, two\)/);
      } finally {
        await gw.close();
        await airlock.killAll();
      }
    }, 120_000);
  });

  describe('mcp routing: a message goes only to the session whose request caused it', () => {
    let airlock: Airlock;
    const gws: Record<string, TestGateway> = {};

    beforeAll(async () => {
      airlock = testAirlock();
      // One server per gateway, so templated resource URIs resolve (a single server takes them).
      const [pc, pt, ps] = await Promise.all([
        startGateway(airlock, { x: side({ boundary: 'per-call' }) }),
        startGateway(airlock, { x: side({ boundary: 'per-tenant' }) }),
        startGateway(airlock, { x: side({ boundary: 'per-server' }) }),
      ]);
      Object.assign(gws, { 'per-call': pc, 'per-tenant': pt, 'per-server': ps });
    }, 180_000);

    afterAll(async () => {
      await Promise.allSettled(Object.values(gws).map((g) => g.close()));
      await airlock?.killAll();
      expect(await settledResidue()).toEqual(NO_RESIDUE);
    }, 60_000);

    const whoami = (rec: Recorder, tag: string) =>
      rec.c.callTool({ name: 'x__whoami', arguments: { tag, ms: 300 } });

    it.each(['per-call', 'per-tenant', 'per-server'])(
      '%s: two tenants calling at once each get only their own log lines and sampling requests',
      async (boundary) => {
        const gw = gws[boundary]!;
        const a = await recorder(gw, 'alice');
        const b = await recorder(gw, 'bob');
        const ta = `tag-a-${randomBytes(4).toString('hex')}`;
        const tb = `tag-b-${randomBytes(4).toString('hex')}`;
        const [ra, rb] = await Promise.allSettled([whoami(a, ta), whoami(b, tb)]);
        expect(a.seen()).not.toContain(tb);
        expect(b.seen()).not.toContain(ta);
        if (boundary !== 'per-server') {
          // Their own instance (per-call, per-tenant): everything is delivered, to the right client.
          expect(ra).toMatchObject({ status: 'fulfilled' });
          expect(rb).toMatchObject({ status: 'fulfilled' });
          expect(text((ra as PromiseFulfilledResult<unknown>).value)).toBe(
            `tag=${ta} answer=answer-for-alice`,
          );
          expect(text((rb as PromiseFulfilledResult<unknown>).value)).toBe(`tag=${tb} answer=answer-for-bob`);
          expect(a.seen()).toContain(`log ${ta}`);
          expect(b.seen()).toContain(`sample ${tb}`);
        } else {
          // One shared instance: a message while both calls run cannot be attributed and is dropped
          // (a sampling request is refused), never handed to the wrong client.
          const dropped = gw.events.filter((e) => e.kind === 'mcp' && e.code === 'unrouted');
          const delivered = [a.seen().includes(ta), b.seen().includes(tb)];
          expect(dropped.length > 0 || delivered.every(Boolean)).toBe(true);
        }
      },
      60_000,
    );

    it("per-tenant: two sessions of one tenant calling at once never get each other's messages", async () => {
      const gw = gws['per-tenant']!;
      const a1 = await recorder(gw, 'alice', 'alice-1');
      const a2 = await recorder(gw, 'alice', 'alice-2');
      const t1 = `tag-1-${randomBytes(4).toString('hex')}`;
      const t2 = `tag-2-${randomBytes(4).toString('hex')}`;
      const [r1, r2] = await Promise.allSettled([whoami(a1, t1), whoami(a2, t2)]);
      expect(a1.seen()).not.toContain(t2);
      expect(a2.seen()).not.toContain(t1);
      if (r1.status === 'fulfilled') expect(text(r1.value)).toBe(`tag=${t1} answer=answer-for-alice-1`);
      if (r2.status === 'fulfilled') expect(text(r2.value)).toBe(`tag=${t2} answer=answer-for-alice-2`);
    }, 60_000);

    it('per-server: resources/updated goes only to sessions that subscribed to that resource', async () => {
      const gw = gws['per-server']!;
      const a = await recorder(gw, 'alice');
      const b = await recorder(gw, 'bob');
      await a.c.subscribeResource({ uri: 'leak://text' });
      expect(text(await b.c.callTool({ name: 'x__touch', arguments: { uri: 'leak://text' } }))).toBe(
        'touched',
      );
      // alice's update is delivered before her next answer on the same instance.
      for (let i = 0; i < 50 && a.updated.length === 0; i++)
        await a.c.ping().then(() => new Promise((res) => setImmediate(res)));
      expect(a.updated).toEqual([expect.objectContaining({ uri: 'leak://text' })]);
      expect(b.updated).toEqual([]);
    }, 60_000);

    it.each(['per-call', 'per-tenant'])(
      "%s: resources/read, prompts/get and completion never run on another tenant's instance",
      async (boundary) => {
        const gw = gws[boundary]!;
        const a = await recorder(gw, 'alice');
        const a2 = await recorder(gw, 'alice');
        const b = await recorder(gw, 'bob');
        const mark = `alice-private-${randomBytes(4).toString('hex')}`;
        // Reading this URI makes the instance that serves it keep `mark`.
        expect(await a.c.readResource({ uri: `state://set/${mark}` })).toMatchObject({
          contents: [expect.objectContaining({ text: 'set' })],
        });
        const everything = async (rec: Recorder) => {
          await rec.c.listPrompts();
          return [
            await rec.c.readResource({ uri: 'state://last' }),
            await rec.c.getPrompt({ name: 'x__recall' }),
            await rec.c.complete({
              ref: { type: 'ref/prompt', name: 'x__recall' },
              argument: { name: 'q', value: '' },
            }),
          ];
        };
        const bobs = await everything(b);
        expect(JSON.stringify(bobs)).toContain('state=');
        expect(JSON.stringify(bobs)).not.toContain(mark);
        const alices = JSON.stringify(await everything(a2));
        if (boundary === 'per-tenant')
          expect(alices).toContain(mark); // the tenant's own instance
        else expect(alices).not.toContain(mark); // per-call: a fresh instance every time
      },
      120_000,
    );

    it.each(['per-call', 'per-tenant'])(
      '%s: every request type the SDK client sends, by two tenants, shares nothing',
      async (boundary) => {
        const gw = gws[boundary]!;
        const results = async (rec: Recorder, who: string) => {
          const c = rec.c;
          const out: unknown[] = [];
          out.push(await c.ping());
          out.push(await c.listTools());
          out.push(await c.callTool({ name: 'x__remember', arguments: { value: `${who}-via-call` } }));
          out.push(await c.listPrompts());
          out.push(await c.getPrompt({ name: 'x__recall' }));
          out.push(await c.listResources());
          out.push(await c.listResourceTemplates());
          out.push(await c.readResource({ uri: `state://set/${who}-via-read` }));
          out.push(await c.readResource({ uri: 'state://last' }));
          out.push(await c.subscribeResource({ uri: 'state://last' }));
          out.push(await c.unsubscribeResource({ uri: 'state://last' }));
          out.push(await c.setLoggingLevel('debug'));
          out.push(
            await c.complete({
              ref: { type: 'ref/prompt', name: 'x__recall' },
              argument: { name: 'q', value: '' },
            }),
          );
          out.push(await c.callTool({ name: 'x__whoami', arguments: { tag: `${who}-tag`, ms: 0 } }));
          return JSON.stringify(out) + rec.seen();
        };
        const ma = `alice${randomBytes(3).toString('hex')}`;
        const mb = `bob${randomBytes(3).toString('hex')}`;
        const a = await recorder(gw, 'alice');
        const b = await recorder(gw, 'bob');
        const [ra, rb] = await Promise.all([results(a, ma), results(b, mb)]);
        expect(ra).not.toContain(mb);
        expect(rb).not.toContain(ma);
        expect(ra).toContain(`${ma}-tag`);
        expect(rb).toContain(`${mb}-tag`);
      },
      180_000,
    );
  });

  describe('mcp side channels over stdio (`airlock mcp`)', () => {
    it('guards notifications, reads, prompts, completion and sampling in single mode', async () => {
      const cli = await startCli(['--', ...FIXTURE('sidechannel-server.ts')], { capabilities: CAPS });
      try {
        const r = record(cli.client, 'stdio');
        const needles = [DEFAULT_REAL, AWS_ID, AWS_SECRET];
        const progress: unknown[] = [];
        await cli.client.callTool({ name: 'leak_notes', arguments: {} }, undefined, {
          onprogress: (p) => void progress.push(p),
        });
        await cli.client.callTool({ name: 'ask', arguments: {} });
        const got = [
          await cli.client.readResource({ uri: 'leak://text' }),
          await cli.client.readResource({ uri: 'leak://blob' }),
          await cli.client.readResource({ uri: 'leak://binblob' }),
          await cli.client.readResource({ uri: 'leak://split' }),
          await cli.client.getPrompt({ name: 'leaky' }),
          await cli.client.complete({
            ref: { type: 'ref/prompt', name: 'leaky' },
            argument: { name: 'who', value: '' },
          }),
        ];
        expect(r.logs.length).toBeGreaterThanOrEqual(10);
        expect(r.sampling).toHaveLength(1);
        expect(r.elicit).toHaveLength(1);
        expect(leaked([r.logs, progress, r.sampling, r.elicit, got], needles)).toEqual([]);
        expect(JSON.stringify(r.logs)).toContain('[REDACTED:credential:');
      } finally {
        await cli.close();
      }
    }, 120_000);
  });

  describe('@modelcontextprotocol/server-everything behind the gateway, two tenants', () => {
    it('sampling goes to the tenant that asked; blobs, prompts and completion pass intact', async () => {
      const airlock = testAirlock();
      const gw = await startGateway(airlock, { ev: { ...EVERYTHING, airlock: { boundary: 'per-tenant' } } });
      try {
        const a = await recorder(gw, 'alice');
        const b = await recorder(gw, 'bob');
        const call = (rec: Recorder, prompt: string) =>
          rec.c.callTool({ name: 'ev__trigger-sampling-request', arguments: { prompt, maxTokens: 5 } });
        const [ra, rb] = await Promise.all([call(a, 'from-alice-ev'), call(b, 'from-bob-ev')]);
        expect(text(ra)).toContain('answer-for-alice');
        expect(text(rb)).toContain('answer-for-bob');
        expect(a.seen()).toContain('from-alice-ev');
        expect(a.seen()).not.toContain('from-bob-ev');
        expect(b.seen()).not.toContain('from-alice-ev');
        const blob = await a.c.readResource({ uri: 'demo://resource/dynamic/blob/1' });
        const data = (blob.contents[0] as { blob?: string }).blob;
        expect(data && Buffer.from(data, 'base64').length).toBeGreaterThan(0);
        const p = await a.c.getPrompt({ name: 'ev__simple-prompt' });
        expect(p.messages.length).toBeGreaterThan(0);
        const c = await b.c.complete({
          ref: { type: 'ref/prompt', name: 'ev__completable-prompt' },
          argument: { name: 'department', value: 'Eng' },
        });
        expect(c.completion.values).toEqual(['Engineering']);
      } finally {
        await gw.close();
        await airlock.killAll();
      }
      expect(await settledResidue()).toEqual(NO_RESIDUE);
    }, 180_000);
  });
}
