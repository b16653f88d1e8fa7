// The MCP transport contract against the Streamable HTTP gateway (GatewayCore + HttpFront) fronting
// the hostile fixture in a real sandbox. Raw bytes are POSTed in a session of tenant alice (a body
// written in the chunks the case gives; several frames as pipelined POSTs in one socket write); the
// guard cases use the official SDK client (tenant bob).
import { request } from 'node:http';
import { connect } from 'node:net';
import { describe, it } from 'vitest';
import type { JsonRpcId } from '../../src/mcp/frame.js';
import type { Airlock } from '../../src/sandbox/airlock.js';
import { canRunNamespaces, SKIP_REASON, testAirlock } from '../helpers.js';
import { FIXTURE, startGateway } from './harness.js';
import {
  transportContract,
  type TransportUnderTest,
  type WireAnswer,
  type WireMessage,
} from './transport.contract.js';

const [NODE, ...HOSTILE_ARGS] = FIXTURE('hostile-server.ts');
const PROTOCOL = '2025-06-18';

/** JSON-RPC messages in an HTTP body: a JSON body, or the data: lines of an SSE stream (JSON.parse). */
function messagesOf(contentType: string, body: string): WireMessage[] {
  const payloads = contentType.startsWith('text/event-stream')
    ? body
        .split('\n')
        .filter((l) => l.startsWith('data:'))
        .map((l) => l.slice(5).trim())
        .filter((l) => l.length > 0)
    : body.length > 0
      ? [body]
      : [];
  return payloads.map((p) => JSON.parse(p) as WireMessage);
}

/** POST one body, written in `chunks` (each its own write). */
function post(
  port: number,
  headers: Record<string, string>,
  chunks: readonly Buffer[],
): Promise<{ status: number; headers: Record<string, unknown>; messages: WireMessage[] }> {
  return new Promise((resolve, reject) => {
    const req = request(
      {
        host: '127.0.0.1',
        port,
        path: '/mcp',
        method: 'POST',
        headers: {
          host: `127.0.0.1:${port}`,
          'content-type': 'application/json',
          accept: 'application/json, text/event-stream',
          'content-length': String(chunks.reduce((n, c) => n + c.length, 0)),
          ...headers,
        },
      },
      (res) => {
        const parts: Buffer[] = [];
        res.on('data', (c: Buffer) => parts.push(c));
        res.on('error', reject);
        res.on('end', () => {
          try {
            resolve({
              status: res.statusCode ?? 0,
              headers: res.headers,
              messages: messagesOf(
                String(res.headers['content-type'] ?? ''),
                Buffer.concat(parts).toString('utf8'),
              ),
            });
          } catch (e) {
            reject(e as Error);
          }
        });
      },
    );
    req.on('error', reject);
    void (async () => {
      for (const c of chunks.slice(0, -1)) {
        req.write(c);
        await new Promise((r) => setImmediate(r)); // its own write (no sync depends on it)
      }
      req.end(chunks.at(-1));
    })();
  });
}

/** Read `count` HTTP/1.1 responses (content-length or chunked bodies) from a raw byte stream. */
function parseResponses(
  raw: Buffer,
  count: number,
): Array<{ status: number; contentType: string; body: string }> | undefined {
  const out: Array<{ status: number; contentType: string; body: string }> = [];
  let at = 0;
  while (out.length < count) {
    const end = raw.indexOf('\r\n\r\n', at);
    if (end === -1) return undefined;
    const head = raw.subarray(at, end).toString('latin1').split('\r\n');
    const status = Number(head[0]!.split(' ')[1]);
    const h = Object.fromEntries(
      head
        .slice(1)
        .map((l) => [l.slice(0, l.indexOf(':')).toLowerCase(), l.slice(l.indexOf(':') + 1).trim()]),
    );
    let p = end + 4;
    let body: Buffer;
    if (h['transfer-encoding'] === 'chunked') {
      const parts: Buffer[] = [];
      for (;;) {
        const le = raw.indexOf('\r\n', p);
        if (le === -1) return undefined;
        const size = parseInt(raw.subarray(p, le).toString('latin1'), 16);
        if (raw.length < le + 2 + size + 2) return undefined;
        parts.push(raw.subarray(le + 2, le + 2 + size));
        p = le + 2 + size + 2;
        if (size === 0) break;
      }
      body = Buffer.concat(parts);
    } else {
      const len = Number(h['content-length'] ?? 0);
      if (raw.length < p + len) return undefined;
      body = raw.subarray(p, p + len);
      p += len;
    }
    out.push({ status, contentType: h['content-type'] ?? '', body: body.toString('utf8') });
    at = p;
  }
  return out;
}

/** Several POSTs pipelined on one connection, all written in a single socket write. */
function pipelined(
  port: number,
  headers: Record<string, string>,
  frames: readonly Buffer[],
): Promise<WireAnswer> {
  const head = (f: Buffer): string =>
    `POST /mcp HTTP/1.1\r\nhost: 127.0.0.1:${port}\r\ncontent-type: application/json\r\n` +
    `accept: application/json, text/event-stream\r\ncontent-length: ${f.length}\r\n` +
    Object.entries(headers)
      .map(([k, v]) => `${k}: ${v}\r\n`)
      .join('') +
    '\r\n';
  const bytes = Buffer.concat(frames.flatMap((f) => [Buffer.from(head(f), 'latin1'), f]));
  return new Promise((resolve, reject) => {
    const sock = connect(port, '127.0.0.1');
    let raw = Buffer.alloc(0);
    const timer = setTimeout(() => {
      sock.destroy();
      reject(new Error(`pipelined answers incomplete: ${raw.toString('utf8').slice(0, 500)}`));
    }, 30_000);
    sock.on('connect', () => sock.write(bytes));
    sock.on('error', reject);
    sock.on('data', (c: Buffer) => {
      raw = Buffer.concat([raw, c]);
      const got = parseResponses(raw, frames.length);
      if (!got) return;
      clearTimeout(timer);
      sock.destroy();
      resolve({
        statuses: got.map((r) => r.status),
        messages: got.flatMap((r) => messagesOf(r.contentType, r.body)),
      });
    });
  });
}

async function connectHttp(): Promise<TransportUnderTest> {
  const airlock: Airlock = testAirlock();
  const gw = await startGateway(airlock, {
    // per-session (the HTTP default): each session pins its own server's first listing, as stdio does.
    h: { command: NODE, args: HOSTILE_ARGS, airlock: {} },
  });
  try {
    const auth = { authorization: `Bearer ${gw.tokens.alice!}` };
    const init = await post(gw.port, auth, [
      Buffer.from(
        JSON.stringify({
          jsonrpc: '2.0',
          id: 'init',
          method: 'initialize',
          params: { protocolVersion: PROTOCOL, capabilities: {}, clientInfo: { name: 'raw', version: '1' } },
        }),
      ),
    ]);
    if (init.status !== 200) throw new Error(`initialize: ${init.status} ${JSON.stringify(init.messages)}`);
    const session = {
      ...auth,
      'mcp-session-id': String(init.headers['mcp-session-id']),
      'mcp-protocol-version': PROTOCOL,
    };
    const note = await post(gw.port, session, [
      Buffer.from('{"jsonrpc":"2.0","method":"notifications/initialized"}'),
    ]);
    if (note.status !== 202) throw new Error(`initialized: ${note.status}`);
    const client = await gw.client('bob');
    return {
      client,
      tool: (name) => `h__${name}`,
      statuses: { broken: 400, oversized: 413, accepted: 202 },
      async send(chunks, _waitFor: readonly JsonRpcId[] = []) {
        // One POST is one frame: its answer is complete when the response ends.
        const r = await post(gw.port, session, chunks);
        return { statuses: [r.status], messages: r.messages };
      },
      sendTogether: (frames) => pipelined(gw.port, session, frames),
      frameCodes: () =>
        gw.events.flatMap((e) =>
          e.kind === 'mcp' && e.method === 'http' && e.code?.startsWith('frame_') ? [e.code] : [],
        ),
      audited: () =>
        gw.events.flatMap((e) =>
          e.kind === 'mcp'
            ? [
                {
                  ...(e.tool !== undefined ? { tool: e.tool } : {}),
                  decision: e.decision,
                  ...(e.code !== undefined ? { code: e.code } : {}),
                  findings: (e.findings ?? []).map((f) => `${f.ruleId} ${f.location}`),
                },
              ]
            : [],
        ),
      async close() {
        await gw.close();
        await airlock.killAll();
      },
    };
  } catch (e) {
    await gw.close();
    await airlock.killAll();
    throw e;
  }
}

if (!canRunNamespaces) {
  describe('mcp transport contract: http', () => {
    it.skip(`the whole suite [skipped: ${SKIP_REASON}]`, () => {});
  });
} else {
  transportContract('streamable http', connectHttp);
}
