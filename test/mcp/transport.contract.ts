// The contract every MCP transport of the gateway must pass (STYLE.md habit 13): ONE suite of framing,
// malformed JSON-RPC and guard cases, run by test/mcp/transport-stdio.test.ts (the real `airlock mcp`
// CLI) and test/mcp/transport-http.test.ts (the Streamable HTTP gateway). A transport reaches the
// suite through a `TransportUnderTest`: raw bytes in, the JSON-RPC messages answered for them out, and
// an official SDK client on the same transport for the guard cases. Servers are real (the hostile
// fixture in a real sandbox); expectations for broken bytes come from parseMessage, the one parser
// both entry points use, and every byte answered is checked with JSON.parse.
import { setTimeout as sleep } from 'node:timers/promises';
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { McpError, type CallToolResult } from '@modelcontextprotocol/sdk/types.js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { FRAME_LIMITS, parseMessage, type JsonRpcId } from '../../src/mcp/frame.js';
import { NO_RESIDUE, settledResidue } from '../helpers.js';

/** One JSON-RPC message the gateway wrote back, as JSON.parse reads it (never the gateway's parser). */
export interface WireMessage {
  jsonrpc?: unknown;
  id?: unknown;
  method?: string;
  result?: Record<string, unknown>;
  error?: { code: number; message: string; data?: unknown };
}

export interface WireAnswer {
  /** HTTP status of each request (HTTP only; empty over stdio). */
  statuses: number[];
  /** Every message the gateway wrote for the frames sent (never the transport's own fence). */
  messages: WireMessage[];
}

/** Findings the gateway audited (rule id and location), for the quarantine case. */
export interface AuditedFinding {
  tool?: string;
  decision: string;
  code?: string;
  findings: string[];
}

export interface TransportUnderTest {
  /**
   * Send ONE frame whose bytes arrive in `chunks`, each its own write (stdio: a line, the newline added
   * after the last chunk; HTTP: one POST body). Resolves once the gateway has handled it (stdio: a
   * fence ping after it was answered) and every id in `waitFor` was answered.
   */
  send(chunks: readonly Buffer[], waitFor?: readonly JsonRpcId[]): Promise<WireAnswer>;
  /** Several frames in a single write (stdio: lines in one write; HTTP: pipelined POSTs in one write). */
  sendTogether(frames: readonly Buffer[], waitFor: readonly JsonRpcId[]): Promise<WireAnswer>;
  /** The frame-error codes audited so far (`frame_<code>`), oldest first. */
  frameCodes(): string[];
  /** Audited events of the `tools/call` and definitions kind, for the quarantine case. */
  audited(): AuditedFinding[];
  /**
   * HTTP statuses this transport answers with (absent over stdio, which has none): a broken frame, a
   * frame over the size cap, a valid message that needs no answer (a response or a notification).
   */
  readonly statuses?: { broken: number; oversized: number; accepted: number };
  /** An official SDK client on this transport (fronting the hostile fixture). */
  readonly client: Client;
  /** A fixture tool's name as this transport's client sees it. */
  tool(name: string): string;
  close(): Promise<void>;
}

/** JSON-RPC 2.0: text that is no JSON value is a Parse error; a JSON value that is no message, Invalid Request. */
const INVALID_REQUEST_FRAME_CODES = ['not_object', 'batch_unsupported', 'invalid_jsonrpc'];
const expectedRpcCode = (frameCode: string): number =>
  INVALID_REQUEST_FRAME_CODES.includes(frameCode) ? -32600 : -32700;
const DENIED = -32010;

const b = (s: string): Buffer => Buffer.from(s);
const text = (r: unknown): string =>
  ((r as CallToolResult).content ?? []).map((c) => (c.type === 'text' ? c.text : '')).join('\n');
const provenance = (r: unknown): Record<string, unknown> =>
  ((r as CallToolResult)._meta?.['airlock/provenance'] ?? {}) as Record<string, unknown>;

async function rpcError(p: Promise<unknown>): Promise<McpError> {
  const e: unknown = await p.then(
    (r) => new Error(`expected an MCP error, got a result: ${JSON.stringify(r).slice(0, 500)}`),
    (err: unknown) => err,
  );
  if (!(e instanceof McpError)) throw e;
  return e;
}

/** Poll `read` until `ok` (the gateway audits after it answers); the last value either way. */
async function waitFor<T>(read: () => T, ok: (v: T) => boolean, timeoutMs = 10_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let v = read();
  while (!ok(v) && Date.now() < deadline) {
    await sleep(25);
    v = read();
  }
  return v;
}

/** Broken requests that carry an id: each must come back as an error with that id (issue 30, 9b). */
export const BROKEN_REQUESTS_WITH_ID: Array<[string, (id: string) => Buffer]> = [
  [
    'duplicate key',
    (id) => b(`{"jsonrpc":"2.0","id":"${id}","method":"tools/call","params":{"name":"echo","name":"steal"}}`),
  ],
  [
    'case-variant key',
    (id) => b(`{"jsonrpc":"2.0","id":"${id}","method":"tools/list","params":{"cursor":"a","Cursor":"b"}}`),
  ],
  [
    '__proto__',
    (id) => b(`{"jsonrpc":"2.0","id":"${id}","method":"tools/call","params":{"__proto__":{"x":1}}}`),
  ],
  ['lone surrogate', (id) => b(`{"jsonrpc":"2.0","method":"ping","params":{"s":"\\udfff"},"id":"${id}"}`)],
  ['number out of range', (id) => b(`{"jsonrpc":"2.0","id":"${id}","method":"ping","params":{"n":-1e400}}`)],
  [
    'too deep',
    (id) =>
      b(
        `{"jsonrpc":"2.0","id":"${id}","method":"ping","params":{"d":${'{"d":'.repeat(70)}1${'}'.repeat(70)}}}`,
      ),
  ],
  [
    'invalid UTF-8',
    (id) =>
      Buffer.concat([
        b(`{"jsonrpc":"2.0","id":"${id}","method":"ping","params":{"s":"`),
        Buffer.from([0xed, 0xa0, 0x80]),
        b('"}}'),
      ]),
  ],
  ['cut short', (id) => b(`{"jsonrpc":"2.0","id":"${id}","method":"tools/list","params":{"cursor":`)],
];

/** Malformed JSON-RPC, per message type; what each must get is computed from parseMessage. */
export const MALFORMED_MESSAGES: Array<[string, Buffer]> = [
  ['non-JSON line', b('this is not JSON at all')],
  ['invalid UTF-8 without an id', Buffer.from([0x7b, 0xff, 0xfe, 0x7d])],
  [
    'JSON-RPC batch',
    b('[{"jsonrpc":"2.0","id":"b1","method":"ping"},{"jsonrpc":"2.0","id":"b2","method":"ping"}]'),
  ],
  ['request without method', b('{"jsonrpc":"2.0","id":"no-method","params":{}}')],
  ['request with an empty method', b('{"jsonrpc":"2.0","id":"empty-method","method":""}')],
  ['request without jsonrpc', b('{"id":"no-version","method":"ping"}')],
  ['notification with a null id', b('{"jsonrpc":"2.0","method":"notifications/initialized","id":null}')],
  [
    'notification with a case-variant Id',
    b('{"jsonrpc":"2.0","method":"notifications/initialized","Id":"n1"}'),
  ],
  ['response to an unknown id', b('{"jsonrpc":"2.0","id":"nobody-asked","result":{}}')],
  [
    'error response to an unknown id',
    b('{"jsonrpc":"2.0","id":"nobody-asked-2","error":{"code":-1,"message":"x"}}'),
  ],
  ['error object with a string code', b('{"jsonrpc":"2.0","id":"e1","error":{"code":"x","message":"m"}}')],
  ['error object without a message', b('{"jsonrpc":"2.0","id":"e2","error":{"code":-32000}}')],
  ['error object that is a string', b('{"jsonrpc":"2.0","id":"e3","error":"oops"}')],
  ['both result and error', b('{"jsonrpc":"2.0","id":"e4","result":{},"error":{"code":1,"message":"m"}}')],
  ['object id', b('{"jsonrpc":"2.0","id":{"a":1},"method":"ping"}')],
  ['array id', b('{"jsonrpc":"2.0","id":[1],"method":"ping"}')],
  ['float id', b('{"jsonrpc":"2.0","id":1.5,"method":"ping"}')],
  ['boolean id', b('{"jsonrpc":"2.0","id":true,"method":"ping"}')],
];

const isRequest = (m: object): m is { id: JsonRpcId; method: string } => 'method' in m && 'id' in m;
const key = (id: unknown): string => JSON.stringify(id);

export function transportContract(name: string, connect: () => Promise<TransportUnderTest>): void {
  describe(`mcp transport contract: ${name}`, () => {
    let t: TransportUnderTest;
    let fence = 0;

    beforeAll(async () => {
      t = await connect();
    }, 120_000);
    afterAll(async () => {
      await t?.close();
      expect(await settledResidue(10_000)).toEqual(NO_RESIDUE);
    }, 60_000);

    /** The session still answers a request (checked after every broken frame). */
    const expectAlive = async (): Promise<void> => {
      const id = `alive-${++fence}`;
      const a = await t.send([b(`{"jsonrpc":"2.0","id":"${id}","method":"ping"}`)], [id]);
      expect(a.messages, JSON.stringify(a)).toEqual([{ jsonrpc: '2.0', id, result: {} }]);
    };

    /**
     * One frame the gateway must refuse or drop: never a result; an error with the frame's id when the
     * parser recovered one (and no other id); one audited frame error with the parser's code; the
     * session goes on.
     */
    const expectRefused = async (what: string, chunks: readonly Buffer[]): Promise<void> => {
      const bytes = Buffer.concat(chunks);
      const oversized = bytes.length > FRAME_LIMITS.maxFrameBytes;
      const parsed = oversized ? undefined : parseMessage(bytes);
      const id =
        parsed && !parsed.ok
          ? parsed.id
          : parsed?.ok && isRequest(parsed.message)
            ? parsed.message.id
            : undefined;
      const framesBefore = t.frameCodes().length;
      const a = await t.send(chunks, id === undefined ? [] : [id]);
      expect(
        a.messages.filter((m) => m.result !== undefined),
        `${what}: no result`,
      ).toEqual([]);
      for (const m of a.messages) {
        expect(m.jsonrpc, what).toBe('2.0');
        expect(m.error?.message, what).toEqual(expect.stringMatching(/./));
        if (parsed && !parsed.ok) expect(m.error?.code, what).toBe(expectedRpcCode(parsed.code));
      }
      if (t.statuses) {
        const want = oversized ? t.statuses.oversized : parsed?.ok ? t.statuses.accepted : t.statuses.broken;
        expect(a.statuses, `${what}: HTTP status`).toEqual([want]);
      }
      if (id !== undefined) {
        const mine = a.messages.filter((m) => key(m.id) === key(id));
        expect(mine, `${what}: one error with its own id`).toHaveLength(1);
      } else {
        expect(
          a.messages.filter((m) => m.id !== null && m.id !== undefined),
          `${what}: an answer only ever with id null`,
        ).toEqual([]);
      }
      const expected = oversized ? ['frame_oversized'] : parsed && !parsed.ok ? [`frame_${parsed.code}`] : [];
      const codes = await waitFor(
        () => t.frameCodes().slice(framesBefore),
        (c) => c.length >= expected.length,
      );
      expect(codes, `${what}: audited frame errors`).toEqual(expected);
      await expectAlive();
    };

    describe('framing', () => {
      it('a request split across writes (inside a multi-byte character) is answered whole', async () => {
        const frame = b('{"jsonrpc":"2.0","id":"split","method":"ping","params":{"_meta":{"s":"é€😀"}}}');
        const cut = frame.indexOf(b('😀')) + 2; // inside the 4-byte character
        const a = await t.send(
          [frame.subarray(0, 7), frame.subarray(7, cut), frame.subarray(cut)],
          ['split'],
        );
        expect(a.messages).toEqual([{ jsonrpc: '2.0', id: 'split', result: {} }]);
      });

      it('several messages in one write are each answered', async () => {
        const ids = ['one', 'two', 'three'];
        const a = await t.sendTogether(
          ids.map((id) => b(`{"jsonrpc":"2.0","id":"${id}","method":"ping"}`)),
          ids,
        );
        expect(a.messages.map((m) => m.id).sort()).toEqual([...ids].sort());
        for (const m of a.messages) expect(m.result).toEqual({});
      });

      it('a broken frame between good ones in the same write spoils neither neighbour', async () => {
        const framesBefore = t.frameCodes().length;
        const a = await t.sendTogether(
          [
            b('{"jsonrpc":"2.0","id":"before","method":"ping"}'),
            b('{"jsonrpc":'),
            b('{"jsonrpc":"2.0","id":"after","method":"ping"}'),
          ],
          ['before', 'after'],
        );
        expect(
          a.messages
            .filter((m) => m.result !== undefined)
            .map((m) => m.id)
            .sort(),
        ).toEqual(['after', 'before']);
        // The broken one gets at most an error without an id (it has none to recover).
        expect(a.messages.filter((m) => m.result === undefined)).toEqual(
          a.messages.filter((m) => m.result === undefined && m.id === null && m.error?.code === -32700),
        );
        expect(
          await waitFor(
            () => t.frameCodes().slice(framesBefore),
            (c) => c.length > 0,
          ),
        ).toEqual(['frame_not_json']);
      });

      it('a frame over the size cap is refused, audited, and the session survives', async () => {
        const head = b('{"jsonrpc":"2.0","id":"huge","method":"ping","params":{"s":"');
        const tail = b('"}}');
        const fill = Buffer.alloc(FRAME_LIMITS.maxFrameBytes + 1 - head.length - tail.length, 0x61);
        await expectRefused('oversized', [head, fill, tail]);
      }, 60_000);

      it('a frame exactly at the size cap is still read', async () => {
        const head = b('{"jsonrpc":"2.0","id":"at-cap","method":"ping","params":{"_meta":{"s":"');
        const tail = b('"}}}');
        const fill = Buffer.alloc(FRAME_LIMITS.maxFrameBytes - head.length - tail.length, 0x61);
        const a = await t.send([head, fill, tail], ['at-cap']);
        expect(a.messages).toEqual([{ jsonrpc: '2.0', id: 'at-cap', result: {} }]);
      }, 60_000);

      for (const [what, bytes] of MALFORMED_MESSAGES.filter(([w]) =>
        ['non-JSON line', 'invalid UTF-8 without an id', 'JSON-RPC batch'].includes(w),
      ))
        it(`${what}: refused with the reason, the session goes on`, () => expectRefused(what, [bytes]));

      it('a broken frame split across writes is refused like a whole one', async () => {
        const bytes = BROKEN_REQUESTS_WITH_ID[6]![1]('split-broken'); // invalid UTF-8 with an id
        await expectRefused('split invalid UTF-8', [bytes.subarray(0, 30), bytes.subarray(30)]);
      });
    });

    describe('malformed JSON-RPC', () => {
      for (const [what, bytes] of MALFORMED_MESSAGES.filter(
        ([w]) => !['non-JSON line', 'invalid UTF-8 without an id', 'JSON-RPC batch'].includes(w),
      ))
        it(`${what}: never a result, an error only with a usable id`, () => expectRefused(what, [bytes]));

      it('each broken request with an id is answered with an error carrying that id', async () => {
        for (const [kind, make] of BROKEN_REQUESTS_WITH_ID) {
          const id = `req-${kind.replace(/\W/g, '-')}`;
          const parsed = parseMessage(make(id));
          expect(parsed.ok, kind).toBe(false);
          expect(!parsed.ok && parsed.id, kind).toBe(id);
          await expectRefused(kind, [make(id)]);
        }
        // After them all, a real request reaches the server.
        const after = await t.send([b('{"jsonrpc":"2.0","id":"after","method":"tools/list"}')], ['after']);
        expect(JSON.stringify(after.messages[0]?.result)).toContain(t.tool('echo'));
      });
    });

    describe('guard', () => {
      it('a secret-looking value in a tool result is redacted', async () => {
        // Fake, built at run time so no token-shaped literal sits in the source.
        const fake = ['gh', 'p_', 'A1b2C3d4'.repeat(5).slice(0, 36)].join('');
        const awsKeyId = ['AKIA', 'AIRLOCK', 'FAKEKEY01'].join('');
        const r = await t.client.callTool({ name: t.tool('leak_secret'), arguments: { literal: fake } });
        const out = text(r);
        expect(out).not.toContain(fake);
        expect(out).not.toContain(awsKeyId);
        expect(out).toContain('literal=[REDACTED:credential:github-token]');
        expect(out).toMatch(/aws_access_key_id = \[REDACTED:credential:/);
        expect(provenance(r)).toMatchObject({ redacted: true, tool: 'leak_secret' });
        expect(Number(provenance(r).redactions)).toBeGreaterThanOrEqual(3);
      });

      it('injected instructions in a result are marked, not altered', async () => {
        const r = await t.client.callTool({ name: t.tool('inject'), arguments: {} });
        expect(text(r)).toContain('Ignore all previous instructions');
        expect(provenance(r)).toMatchObject({ flagged: true, truncated: false, tool: 'inject' });
      });

      it('a tool that changed after it was pinned (rug pull) is hidden and refused as quarantined', async () => {
        // The fixture changes `weather` from its second tools/list on; the gateway pinned the first. A
        // client listing (or the list_changed the call causes) makes the gateway see the change.
        const weather = t.tool('weather');
        await t.client.callTool({ name: weather, arguments: { city: 'Oslo' } }).catch(() => undefined);
        let listed = (await t.client.listTools()).tools.map((x) => x.name);
        const deadline = Date.now() + 15_000;
        while (listed.includes(weather) && Date.now() < deadline) {
          await sleep(50);
          listed = (await t.client.listTools()).tools.map((x) => x.name);
        }
        expect(listed).toContain(t.tool('echo'));
        expect(listed).not.toContain(weather);
        // The renamed fetch_data (now fetch_data_v2) was not in the pin: never listed, never callable.
        expect(listed).not.toContain(t.tool('fetch_data_v2'));
        const renamed = await rpcError(
          t.client.callTool({ name: t.tool('fetch_data_v2'), arguments: { key: 'k' } }),
        );
        expect(renamed.code).toBe(DENIED);
        expect(renamed.data).toEqual({ airlock: { code: 'quarantined' } });
        const e = await rpcError(t.client.callTool({ name: weather, arguments: { city: 'Oslo' } }));
        expect(e.code).toBe(DENIED);
        expect(e.data).toEqual({ airlock: { code: 'quarantined' } });
        expect(e.message).toMatch(/tool weather of server \S+ is quarantined/);
        const events = await waitFor(
          () => t.audited(),
          (a) => a.some((x) => x.tool === 'weather' && x.decision === 'deny'),
        );
        expect(events).toEqual(
          expect.arrayContaining([
            expect.objectContaining({ tool: 'weather', decision: 'deny', code: 'quarantined' }),
          ]),
        );
        expect(events.flatMap((x) => x.findings)).toEqual(
          expect.arrayContaining([
            expect.stringMatching(/^definition-changed tools\[weather\]/),
            expect.stringMatching(/^schema-widened tools\[weather\]/),
          ]),
        );
      }, 60_000);
    });
  });
}
