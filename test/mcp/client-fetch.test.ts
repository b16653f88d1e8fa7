// gatewayFetch (src/mcp/client-fetch.ts): the MCP SDK's own client, over its Streamable HTTP
// transport with this fetch, against a real gateway and the hostile fixture in a real sandbox (quick
// calls answered as JSON, a slow one as an event stream, calls in parallel, the session's end); and
// the fetch's own contract against a loopback server of the test: aborts before and after the
// response head (no listener left on the signal), connection errors as fetch's TypeError,
// redirects returned and not followed, bodiless statuses, and what it hands to the global fetch.
import { getEventListeners } from 'node:events';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import type { CallToolResult } from '@modelcontextprotocol/sdk/types.js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { gatewayFetch, type GatewayFetch } from '../../src/index.js';
import type { Airlock } from '../../src/sandbox/airlock.js';
import { canRunNamespaces, NO_RESIDUE, settledResidue, testAirlock } from '../helpers.js';
import { FIXTURE, startGateway, type TestGateway } from './harness.js';

const [NODE, ...HOSTILE_ARGS] = FIXTURE('hostile-server.ts');
const text = (r: unknown): string =>
  (r as CallToolResult).content.map((c) => (c.type === 'text' ? c.text : '')).join('');

describe.skipIf(!canRunNamespaces)('gatewayFetch with the SDK client and a real gateway', () => {
  let airlock: Airlock;
  let gw: TestGateway;
  let f: GatewayFetch;
  let client: Client;
  let transport: StreamableHTTPClientTransport;

  beforeAll(async () => {
    airlock = testAirlock();
    gw = await startGateway(airlock, {
      h: { command: NODE, args: HOSTILE_ARGS, airlock: { boundary: 'per-server', namespace: false } },
    });
    f = gatewayFetch();
    client = new Client({ name: 'test', version: '1' });
    transport = new StreamableHTTPClientTransport(new URL(gw.url), {
      requestInit: { headers: { authorization: `Bearer ${gw.tokens.alice!}` } },
      fetch: f,
    });
    await client.connect(transport);
  }, 120_000);

  afterAll(async () => {
    await client?.close();
    f?.close();
    await gw?.close();
    await airlock?.killAll();
    expect(await settledResidue()).toEqual(NO_RESIDUE);
  }, 60_000);

  it('lists, calls (JSON and event-stream answers, many in parallel) and ends its session', async () => {
    const { tools } = await client.listTools();
    expect(tools.map((t) => t.name)).toContain('echo');
    expect(text(await client.callTool({ name: 'echo', arguments: { text: 'hi there' } }))).toBe('hi there');
    // Over the gateway's 1 s JSON window: answered as an event stream.
    expect(text(await client.callTool({ name: 'sleep', arguments: { ms: 1500 } }))).toBe('slept 1500 ms');
    const many = await Promise.all(
      Array.from({ length: 40 }, (_, i) => client.callTool({ name: 'echo', arguments: { text: `n${i}` } })),
    );
    expect(many.map(text)).toEqual(Array.from({ length: 40 }, (_, i) => `n${i}`));
    const calls = gw.events.filter((e) => e.kind === 'mcp' && e.method === 'tools/call');
    expect(calls).toHaveLength(42);
    // The session's end (DELETE): the gateway forgets it.
    const id = transport.sessionId!;
    await transport.terminateSession();
    expect(transport.sessionId).toBeUndefined();
    const after = await f(gw.url, {
      method: 'POST',
      headers: {
        authorization: `Bearer ${gw.tokens.alice!}`,
        'content-type': 'application/json',
        accept: 'application/json, text/event-stream',
        'mcp-session-id': id,
        'mcp-protocol-version': '2025-11-25',
      },
      body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' }),
    });
    expect(after.status).toBe(404);
  }, 60_000);
});

describe('gatewayFetch', () => {
  let server: Server;
  let base: string;
  const f = gatewayFetch();
  /** Requests the server saw end before it answered them (the client went away). */
  const gone: string[] = [];

  beforeAll(async () => {
    server = createServer((req: IncomingMessage, res: ServerResponse) => {
      const path = req.url ?? '/';
      let body = '';
      req.setEncoding('utf8');
      req.on('data', (c: string) => (body += c));
      req.on('end', () => {
        if (path === '/echo') {
          res.setHeader('content-type', 'application/json');
          res.setHeader('set-cookie', ['a=1', 'b=2']);
          return void res.end(
            JSON.stringify({ method: req.method, body, auth: req.headers.authorization ?? null }),
          );
        }
        if (path === '/never') return void res.once('close', () => gone.push(path));
        if (path === '/stream') {
          res.writeHead(200, { 'content-type': 'text/event-stream' });
          res.write('data: one\n\n');
          return void res.once('close', () => gone.push(path));
        }
        if (path === '/moved') return void res.writeHead(302, { location: '/echo' }).end();
        if (path === '/empty') return void res.writeHead(204).end();
        res.writeHead(404).end('no such path');
      });
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });

  afterAll(async () => {
    f.close();
    server.closeAllConnections();
    await new Promise((r) => server.close(r));
  });

  it('sends method, headers and body, and reads status, headers and body', async () => {
    const signal = new AbortController().signal;
    const r = await f(`${base}/echo`, {
      method: 'POST',
      headers: { authorization: 'Bearer t', 'content-type': 'application/json' },
      body: '{"x":1}',
      signal,
    });
    expect(r.status).toBe(200);
    expect(r.ok).toBe(true);
    expect(r.headers.get('content-type')).toBe('application/json');
    expect(r.headers.getSetCookie()).toEqual(['a=1', 'b=2']);
    expect(await r.json()).toEqual({ method: 'POST', body: '{"x":1}', auth: 'Bearer t' });
    // Nothing stays on the caller's signal once the body is read (the SDK shares one across calls).
    expect(getEventListeners(signal, 'abort')).toHaveLength(0);
    const bytes = await f(`${base}/echo`, { method: 'PUT', body: new TextEncoder().encode('raw') });
    expect(await bytes.json()).toMatchObject({ method: 'PUT', body: 'raw' });
    const missing = await f(`${base}/nope`);
    expect([missing.status, missing.ok, await missing.text()]).toEqual([404, false, 'no such path']);
  });

  it('rejects with the abort reason, before or after the response head, and closes the request', async () => {
    const early = new AbortController();
    early.abort();
    await expect(f(`${base}/echo`, { signal: early.signal })).rejects.toMatchObject({ name: 'AbortError' });

    const waiting = new AbortController();
    const pending = f(`${base}/never`, { signal: waiting.signal });
    await new Promise((r) => setTimeout(r, 50));
    waiting.abort();
    await expect(pending).rejects.toMatchObject({ name: 'AbortError' });
    await expect.poll(() => gone.includes('/never')).toBe(true);
    expect(getEventListeners(waiting.signal, 'abort')).toHaveLength(0);

    // Many requests on one signal (the SDK gives all of a transport's requests the same one): one
    // listener for them all (a listener each trips Node's MaxListenersExceededWarning at 11), and
    // aborting it ends every one.
    const shared = new AbortController();
    const many = Array.from({ length: 20 }, () => f(`${base}/never`, { signal: shared.signal }));
    await new Promise((r) => setTimeout(r, 50));
    expect(getEventListeners(shared.signal, 'abort')).toHaveLength(1);
    shared.abort();
    const settled = await Promise.allSettled(many);
    expect(settled.map((x) => x.status === 'rejected' && (x.reason as Error).name)).toEqual(
      Array(20).fill('AbortError'),
    );
    expect(getEventListeners(shared.signal, 'abort')).toHaveLength(0);

    // An event stream is handed over as it comes; aborting ends it with an error.
    const streaming = new AbortController();
    const r = await f(`${base}/stream`, { signal: streaming.signal });
    const reader = r.body!.getReader();
    expect(new TextDecoder().decode((await reader.read()).value)).toBe('data: one\n\n');
    streaming.abort(new Error('caller gave up'));
    await expect(reader.read()).rejects.toThrow('caller gave up');
    await expect.poll(() => gone.includes('/stream')).toBe(true);
  });

  it("fails like fetch where nothing answers, returns redirects unfollowed, and honours redirect: 'error'", async () => {
    const closed = createServer();
    await new Promise<void>((r) => closed.listen(0, '127.0.0.1', r));
    const port = (closed.address() as AddressInfo).port;
    await new Promise((r) => closed.close(r));
    const refused = await f(`http://127.0.0.1:${port}/`).catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(TypeError);
    expect((refused as Error).message).toBe('fetch failed');
    expect((refused as { cause: { code: string } }).cause.code).toBe('ECONNREFUSED');

    const moved = await f(`${base}/moved`);
    expect([moved.status, moved.headers.get('location')]).toEqual([302, '/echo']);
    await expect(f(`${base}/moved`, { redirect: 'error' })).rejects.toThrow(TypeError);
    const empty = await f(`${base}/empty`);
    expect([empty.status, empty.body]).toEqual([204, null]);
    const head = await f(`${base}/echo`, { method: 'HEAD' });
    expect([head.status, head.body]).toEqual([200, null]);
  });

  it('hands what it does not handle itself to the global fetch', async () => {
    expect(await (await f('data:text/plain,plain%20data')).text()).toBe('plain data');
    // Not a URL: a rejected promise, as from fetch (not an exception thrown at the call).
    await expect(f('not a url')).rejects.toThrow(TypeError);
    const viaRequest = await f(new Request(`${base}/echo`, { method: 'POST', body: 'in a Request' }));
    expect(await viaRequest.json()).toMatchObject({ body: 'in a Request' });
    const blob = await f(`${base}/echo`, { method: 'POST', body: new Blob(['a blob']) });
    expect(await blob.json()).toMatchObject({ body: 'a blob' });
  });
});
