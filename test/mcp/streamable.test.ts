// The gateway's own Streamable HTTP transport (src/mcp/streamable.ts) on the wire, with raw node:http
// requests against a real gateway and the hostile fixture in a real sandbox: a quick call answered as
// one JSON body, a slow one (over the 1 s JSON window) as an SSE stream with a priming event, the slow one resumed with
// Last-Event-ID after its connection dropped, and the refusals the SDK's transport gives (same status
// codes). Every answered call is audited once.
import { request, type IncomingHttpHeaders, type IncomingMessage } from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { canRunNamespaces, NO_RESIDUE, settledResidue, SKIP_REASON, testAirlock } from '../helpers.js';
import type { Airlock } from '../../src/sandbox/airlock.js';
import { FIXTURE, startGateway, type TestGateway } from './harness.js';

const [NODE, ...HOSTILE_ARGS] = FIXTURE('hostile-server.ts');
const PROTOCOL = '2025-11-25';

interface Answer {
  status: number;
  headers: IncomingHttpHeaders;
  body: string;
}

/** Send one request; `onResponse` may take over the response (streams), else its body is read. */
function send(
  port: number,
  method: string,
  headers: Record<string, string>,
  body?: unknown,
  onResponse?: (res: IncomingMessage) => void,
): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const req = request(
      {
        host: '127.0.0.1',
        port,
        path: '/mcp',
        method,
        headers: {
          host: `127.0.0.1:${port}`,
          accept: 'application/json, text/event-stream',
          ...(body !== undefined ? { 'content-type': 'application/json' } : {}),
          ...headers,
        },
      },
      (res) => {
        if (onResponse) {
          onResponse(res);
          resolve({ status: res.statusCode ?? 0, headers: res.headers, body: '' });
          return;
        }
        let b = '';
        res.setEncoding('utf8');
        res.on('data', (c: string) => (b += c));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: b }));
      },
    );
    req.on('error', reject);
    req.end(body === undefined ? undefined : typeof body === 'string' ? body : JSON.stringify(body));
  });
}

interface SseEvent {
  id?: string;
  data: string;
}

function parseSse(text: string): SseEvent[] {
  return text
    .split('\n\n')
    .filter((block) => block.trim() && !block.startsWith(':'))
    .map((block) => {
      const e: SseEvent = { data: '' };
      for (const line of block.split('\n')) {
        if (line.startsWith('id: ')) e.id = line.slice(4);
        if (line.startsWith('data:')) e.data += line.slice(5).trim();
      }
      return e;
    });
}

const resultText = (data: string): string =>
  (JSON.parse(data) as { result: { content: Array<{ text: string }> } }).result.content
    .map((c) => c.text)
    .join('');

if (!canRunNamespaces) {
  describe('mcp streamable http transport', () => {
    it.skip(`the whole suite [skipped: ${SKIP_REASON}]`, () => {});
  });
} else {
  describe('mcp streamable http transport', () => {
    let airlock: Airlock;
    let gw: TestGateway;
    let auth: Record<string, string>;
    let session: Record<string, string>;
    let nextId = 1;
    const call = (name: string, args: Record<string, unknown>) => ({
      jsonrpc: '2.0',
      id: nextId++,
      method: 'tools/call',
      params: { name, arguments: args },
    });

    beforeAll(async () => {
      airlock = testAirlock();
      gw = await startGateway(airlock, {
        h: { command: NODE, args: HOSTILE_ARGS, airlock: { boundary: 'per-server', namespace: false } },
      });
      auth = { authorization: `Bearer ${gw.tokens.alice!}` };
      const init = await send(gw.port, 'POST', auth, {
        jsonrpc: '2.0',
        id: 0,
        method: 'initialize',
        params: { protocolVersion: PROTOCOL, capabilities: {}, clientInfo: { name: 'raw', version: '1' } },
      });
      expect(init.status, init.body).toBe(200);
      session = {
        ...auth,
        'mcp-session-id': String(init.headers['mcp-session-id']),
        'mcp-protocol-version': PROTOCOL,
      };
      const note = await send(gw.port, 'POST', session, {
        jsonrpc: '2.0',
        method: 'notifications/initialized',
      });
      expect(note.status).toBe(202);
    }, 120_000);

    afterAll(async () => {
      await gw?.close();
      await airlock?.killAll();
      expect(await settledResidue()).toEqual(NO_RESIDUE);
    }, 60_000);

    it('answers a quick call with one JSON body, a slow one (or one that asks) with an SSE stream, and audits each once', async () => {
      const before = gw.events.filter((e) => e.kind === 'mcp' && e.method === 'tools/call').length;
      const quick = await send(gw.port, 'POST', session, call('echo', { text: 'hi there' }));
      expect(quick.status, quick.body).toBe(200);
      expect(quick.headers['content-type']).toBe('application/json');
      expect(Number(quick.headers['content-length'])).toBe(Buffer.byteLength(quick.body));
      expect(quick.headers['mcp-session-id']).toBe(session['mcp-session-id']);
      expect(resultText(quick.body)).toBe('hi there');

      const slow = await send(gw.port, 'POST', session, call('sleep', { ms: 1500 }));
      expect(slow.status, slow.body).toBe(200);
      expect(slow.headers['content-type']).toBe('text/event-stream');
      const events = parseSse(slow.body);
      // A priming event (an id, no data) first: the client can resume from it.
      expect(events[0]?.id).toBeTruthy();
      expect(events[0]?.data).toBe('');
      expect(events).toHaveLength(2);
      expect(events[1]!.id).toBeTruthy();
      expect(resultText(events[1]!.data)).toBe('slept 1500 ms');

      // A client that lists text/event-stream first gets a stream even for a quick call.
      const asked = await send(
        gw.port,
        'POST',
        { ...session, accept: 'text/event-stream, application/json' },
        call('echo', { text: 'streamed' }),
      );
      expect(asked.headers['content-type']).toBe('text/event-stream');
      const askedEvents = parseSse(asked.body);
      expect(askedEvents[0]?.data).toBe('');
      expect(resultText(askedEvents[1]!.data)).toBe('streamed');

      const audited = gw.events.filter((e) => e.kind === 'mcp' && e.method === 'tools/call');
      expect(audited.length - before).toBe(3);
    }, 60_000);

    it('lets a client resume a slow call with Last-Event-ID after its connection dropped', async () => {
      const primed = new Promise<string>((resolve, reject) => {
        void send(gw.port, 'POST', session, call('sleep', { ms: 2000 }), (res) => {
          expect(res.headers['content-type']).toBe('text/event-stream');
          let b = '';
          res.setEncoding('utf8');
          res.on('data', (c: string) => {
            b += c;
            const first = parseSse(b)[0];
            if (first?.id) {
              res.destroy(); // the connection drops before the result
              resolve(first.id);
            }
          });
          res.on('error', () => {});
        }).catch(reject);
      });
      const lastEventId = await primed;
      const resumed = await send(gw.port, 'GET', { ...session, 'last-event-id': lastEventId });
      expect(resumed.status, resumed.body).toBe(200);
      const events = parseSse(resumed.body).filter((e) => e.data);
      expect(events.map((e) => resultText(e.data))).toEqual(['slept 2000 ms']);
    }, 60_000);

    it('refuses what the SDK transport refuses, with the same status codes', async () => {
      const echo = () => call('echo', { text: 'x' });
      // Accept must list both media types; the body must be JSON.
      expect((await send(gw.port, 'POST', { ...session, accept: 'application/json' }, echo())).status).toBe(
        406,
      );
      expect((await send(gw.port, 'POST', { ...session, 'content-type': 'text/plain' }, echo())).status).toBe(
        415,
      );
      // A protocol version nobody negotiated; a second initialize in the session.
      expect(
        (await send(gw.port, 'POST', { ...session, 'mcp-protocol-version': '1999-01-01' }, echo())).status,
      ).toBe(400);
      const reinit = await send(gw.port, 'POST', session, {
        jsonrpc: '2.0',
        id: nextId++,
        method: 'initialize',
        params: { protocolVersion: PROTOCOL, capabilities: {}, clientInfo: { name: 'raw', version: '1' } },
      });
      expect(reinit.status, reinit.body).toBe(400);
      // One standalone stream per session: a second GET is a conflict.
      const first = await new Promise<IncomingMessage>((resolve, reject) => {
        void send(gw.port, 'GET', { ...session, accept: 'text/event-stream' }, undefined, resolve).catch(
          reject,
        );
      });
      expect(first.statusCode).toBe(200);
      expect(first.headers['content-type']).toBe('text/event-stream');
      expect((await send(gw.port, 'GET', { ...session, accept: 'text/event-stream' })).status).toBe(409);
      first.destroy();
      // The calls above were refused before any server saw them; the session still works.
      const ok = await send(gw.port, 'POST', session, echo());
      expect(resultText(ok.body)).toBe('x');
      // DELETE ends the session: its id is unknown afterwards.
      expect((await send(gw.port, 'DELETE', session)).status).toBe(200);
      expect((await send(gw.port, 'POST', session, echo())).status).toBe(404);
    }, 60_000);
  });
}
