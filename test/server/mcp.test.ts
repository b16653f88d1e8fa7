// The MCP gateway at /mcp of a real `airlock serve` (--mcp-config): real sandboxed MCP servers (the
// in-repo hostile fixture, @modelcontextprotocol/server-memory from npm) in the supervisor's
// sandboxes, spoken to with the official SDK client over Streamable HTTP with API keys. Attacks: no
// key, unknown and revoked keys, another tenant's session id, a foreign Host, poisoned definitions,
// a tenant without quota; /metrics counts the calls; nothing is left once sessions and server end.
import { request } from 'node:http';
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { McpError, type CallToolResult } from '@modelcontextprotocol/sdk/types.js';
import { Store } from '../../src/server/store.js';
import { RemoteSandboxApi } from '../../src/server/client.js';
import { supervisorPaths } from '../../src/server/supervisor-client.js';
import { canRunNamespaces, NO_RESIDUE, settledResidue, SKIP_REASON, TEST_STATE_DIR } from '../helpers.js';
import { FIXTURE, ROOT } from '../mcp/harness.js';
import {
  call,
  newKey,
  startServe,
  stopServe,
  stopSupervisor,
  waitFor,
  type Served,
} from './serve-helpers.js';

const [NODE, ...HOSTILE_ARGS] = FIXTURE('hostile-server.ts');
const SUPERVISOR = { tenant: 'supervisor' };
// A credential the `sec` server uses without seeing it (read by the front server from its env).
const REAL = ['ghp', '_', 'R3alV4lue', 'x'.repeat(27)].join('');
const INIT = JSON.stringify({
  jsonrpc: '2.0',
  id: 1,
  method: 'initialize',
  params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'raw', version: '1' } },
});

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

/** A raw POST to /mcp (headers under the test's control). */
function raw(
  url: string,
  headers: Record<string, string>,
  body = INIT,
): Promise<{ status: number; body: string; headers: Record<string, unknown> }> {
  const u = new URL(url);
  return new Promise((resolve, reject) => {
    const req = request(
      {
        host: u.hostname,
        port: u.port,
        path: '/mcp',
        method: 'POST',
        headers: {
          host: u.host,
          'content-type': 'application/json',
          accept: 'application/json, text/event-stream',
          ...headers,
        },
      },
      (res) => {
        let b = '';
        res.on('data', (c: Buffer) => (b += c.toString()));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, body: b, headers: res.headers }));
      },
    );
    req.on('error', reject);
    req.end(body);
  });
}

describe.skipIf(!canRunNamespaces)(`airlock serve: the MCP gateway at /mcp (${SKIP_REASON})`, () => {
  let s: Served;
  let alice: { id: string; key: string };
  let bob: { id: string; key: string };
  let carol: { id: string; key: string };
  const clients: Client[] = [];
  let supervisor: RemoteSandboxApi;

  async function connect(key: string): Promise<{ client: Client; transport: StreamableHTTPClientTransport }> {
    const client = new Client({ name: 'test', version: '1' }, { capabilities: {} });
    const transport = new StreamableHTTPClientTransport(new URL(`${s.url}/mcp`), {
      requestInit: { headers: { authorization: `Bearer ${key}` } },
    });
    await client.connect(transport);
    clients.push(client);
    return { client, transport };
  }

  /** The MCP server sandboxes the supervisor runs now. */
  const mcpSandboxes = async (): Promise<Array<{ id: string; metadata: Record<string, string> }>> =>
    (await supervisor.list({}, SUPERVISOR)).filter((v) => v.metadata.mcpServer !== undefined);

  beforeAll(async () => {
    await stopSupervisor();
    mkdirSync(TEST_STATE_DIR, { recursive: true, mode: 0o711 });
    const mcpPath = join(TEST_STATE_DIR, 'mcp-servers.json');
    writeFileSync(
      mcpPath,
      JSON.stringify({
        mcpServers: {
          // per-session (the HTTP default): the hostile fixture, poisoned definitions and all
          h: { command: NODE, args: HOSTILE_ARGS, cwd: ROOT },
          // per-server: one instance for every tenant, with a secret from the server's environment
          sec: {
            command: NODE,
            args: HOSTILE_ARGS,
            cwd: ROOT,
            airlock: {
              boundary: 'per-server',
              network: { allow: ['api.example.com'] },
              secrets: [
                {
                  name: 'EXAMPLE_TOKEN',
                  value: { fromEnv: 'AIRLOCK_TEST_MCP_SECRET' },
                  hosts: ['api.example.com'],
                },
              ],
            },
          },
          mem: {
            command: 'npx',
            args: ['-y', '@modelcontextprotocol/server-memory'],
            cwd: ROOT,
            airlock: { boundary: 'per-tenant' },
          },
        },
        airlock: { lockfile: join(TEST_STATE_DIR, 'no-such-dir', 'airlock.lock.json') },
      }),
    );
    process.env.AIRLOCK_TEST_MCP_SECRET = REAL;
    s = await startServe({ tenants: { carol: { maxSandboxes: 0 } }, defaultQueueTimeoutMs: 0 }, [
      '--mcp-config',
      mcpPath,
    ]);
    alice = newKey('alice');
    bob = newKey('bob');
    carol = newKey('carol');
    supervisor = new RemoteSandboxApi({ socketPath: supervisorPaths(TEST_STATE_DIR).socket });
  }, 120_000);

  afterAll(async () => {
    await Promise.allSettled(clients.map((c) => c.close()));
    supervisor?.close();
    delete process.env.AIRLOCK_TEST_MCP_SECRET;
    if (s) expect(await stopServe(s)).toBe(0);
    await stopSupervisor();
    expect(await settledResidue(5000)).toEqual(NO_RESIDUE);
  }, 120_000);

  it('lists the tools and calls one with an API key; poisoned definitions stay quarantined', async () => {
    const { client } = await connect(alice.key);
    const names = (await client.listTools()).tools.map((t) => t.name);
    expect(names).toContain('h__echo');
    expect(names).toContain('mem__read_graph');
    // The poisoned description and the tag-character one never show.
    expect(names).not.toContain('h__add');
    expect(names).not.toContain('h__translate');
    expect(
      text(await client.callTool({ name: 'h__echo', arguments: { text: 'hello from /mcp' } })),
    ).toContain('hello from /mcp');
    const e = await rpcError(client.callTool({ name: 'h__add', arguments: { a: 1, b: 2, sidenote: 'x' } }));
    expect(e.code).toBe(-32010);
    expect(e.data).toEqual({ airlock: { code: 'quarantined' } });
  }, 120_000);

  it("runs the servers in the supervisor's sandboxes, out of every tenant's sandbox list", async () => {
    const all = await mcpSandboxes();
    expect(all.map((b) => b.metadata.mcpServer).sort()).toEqual(['h', 'mem', 'sec']);
    // The per-server instance serves everyone and counts against no tenant; the others are alice's.
    expect(all.find((b) => b.metadata.mcpServer === 'sec')!.metadata['airlock.mcpTenant']).toBeUndefined();
    const boxes = all.filter((b) => b.metadata.mcpServer !== 'sec');
    expect(boxes.every((b) => b.metadata['airlock.mcpTenant'] === 'alice')).toBe(true);
    // Not an API sandbox of alice's: she cannot list, exec in or kill it through the API.
    const list = (await (await call(s.url, alice.key, 'GET', '/v1/sandboxes')).json()) as unknown[];
    expect(list).toEqual([]);
    const r = await call(s.url, alice.key, 'DELETE', `/v1/sandboxes/${boxes[0]!.id}`);
    expect(r.status).toBe(404);
  });

  it('refuses no key, an unknown key and a revoked key (401), before any MCP processing', async () => {
    expect((await raw(s.url, {})).status).toBe(401);
    const unknown = await raw(s.url, { authorization: `Bearer ${'x'.repeat(64)}` });
    expect(unknown.status).toBe(401);
    expect(unknown.body).toMatch(/API key/);
    // A session of a key that is then revoked: its next request is refused at once.
    const dave = newKey('dave');
    const { client } = await connect(dave.key);
    expect((await client.listTools()).tools.length).toBeGreaterThan(0);
    const store = new Store(join(TEST_STATE_DIR, 'server.db'));
    try {
      store.revokeKey(dave.id);
    } finally {
      store.close();
    }
    expect((await raw(s.url, { authorization: `Bearer ${dave.key}` })).status).toBe(401);
    await expect(client.listTools()).rejects.toThrow(/401|unauthorized/i);
  }, 120_000);

  it("answers another tenant's session id exactly as an unknown one (404)", async () => {
    const { transport } = await connect(alice.key);
    const sid = transport.sessionId!;
    expect(sid).toBeTruthy();
    const list = JSON.stringify({ jsonrpc: '2.0', id: 2, method: 'tools/list' });
    const asBob = await raw(s.url, { authorization: `Bearer ${bob.key}`, 'mcp-session-id': sid }, list);
    const unknown = await raw(
      s.url,
      { authorization: `Bearer ${bob.key}`, 'mcp-session-id': '00000000-0000-4000-8000-000000000000' },
      list,
    );
    expect(asBob.status).toBe(404);
    expect(asBob.body).toBe(unknown.body);
    expect(unknown.status).toBe(404);
  }, 60_000);

  it('refuses a foreign Host or Origin (DNS rebinding) even with a valid key', async () => {
    const auth = { authorization: `Bearer ${alice.key}` };
    expect((await raw(s.url, { ...auth, host: 'evil.example.com' })).status).toBe(403);
    expect((await raw(s.url, { ...auth, origin: 'http://evil.example.com' })).status).toBe(403);
  });

  it("counts MCP servers' sandboxes against the tenant's quota", async () => {
    const { client } = await connect(carol.key);
    // carol may have no live sandbox: her per-session instance of h cannot start.
    const e = await rpcError(client.callTool({ name: 'h__echo', arguments: { text: 'x' } }));
    expect(e.message).toMatch(/quota/i);
    expect((await mcpSandboxes()).some((b) => b.metadata['airlock.mcpTenant'] === 'carol')).toBe(false);
  }, 60_000);

  it('shows the calls in /metrics by tenant, server and outcome', async () => {
    // A call of a tool no server offers is counted too, under server "*", its name in no label.
    const { client } = await connect(alice.key);
    const unknown = await rpcError(client.callTool({ name: 'no_such_tool_xq7', arguments: {} }));
    expect(unknown.message).toMatch(/unknown tool/);
    const m = await (await fetch(`${s.url}/metrics`)).text();
    const value = (labels: string): number =>
      Number(new RegExp(`^airlock_mcp_calls_total\\{${labels}\\} (\\d+)`, 'm').exec(m)?.[1] ?? 0);
    expect(value('tenant="alice",server="h",outcome="allowed"')).toBeGreaterThanOrEqual(1);
    expect(value('tenant="alice",server="h",outcome="denied"')).toBeGreaterThanOrEqual(1);
    expect(value('tenant="alice",server="\\*",outcome="denied"')).toBeGreaterThanOrEqual(1);
    // carol's call that found no instance (her quota refused its sandbox) is an error; the tools
    // could not be listed, so no server is known for it.
    expect(value('tenant="carol",server="\\*",outcome="error"')).toBeGreaterThanOrEqual(1);
    expect(m).not.toContain('no_such_tool_xq7');
    expect(Number(/^airlock_mcp_sandboxes (\d+)/m.exec(m)?.[1])).toBeGreaterThanOrEqual(1);
    // No tool name from the wire in any label.
    expect(m).not.toMatch(/airlock_mcp_calls_total\{[^}]*(echo|add)/);
  });

  it("kills a session's server sandboxes when the session ends", async () => {
    const { client, transport } = await connect(bob.key);
    await client.callTool({ name: 'h__echo', arguments: { text: 'bye' } });
    const mine = (await mcpSandboxes()).filter(
      (b) => b.metadata['airlock.mcpTenant'] === 'bob' && b.metadata.mcpServer === 'h',
    );
    expect(mine.length).toBe(1);
    await transport.terminateSession();
    await waitFor(
      async () => !(await mcpSandboxes()).some((b) => b.id === mine[0]!.id) || undefined,
      "bob's per-session sandbox to be killed",
    );
  }, 120_000);

  it('hands a server a sentinel, never the real secret, and scrubs both from what the client sees', async () => {
    const { client } = await connect(bob.key);
    const r = await client.callTool({
      name: 'sec__leak_secret',
      arguments: { name: 'EXAMPLE_TOKEN', literal: REAL },
    });
    const out = text(r);
    expect(out).not.toContain(REAL);
    expect(out).not.toMatch(/airlock_sentinel_/);
    expect(out).toContain('EXAMPLE_TOKEN=[REDACTED:sentinel:EXAMPLE_TOKEN]');
    expect(out).toContain('literal=[REDACTED:secret:EXAMPLE_TOKEN]');
    // Inside its sandbox (in the supervisor) the variable holds only the sentinel.
    const sec = (await mcpSandboxes()).find((b) => b.metadata.mcpServer === 'sec')!;
    let env = '';
    for await (const e of supervisor.exec(sec.id, { cmd: 'printenv EXAMPLE_TOKEN' }, SUPERVISOR)) {
      if (e.type === 'stdout') env += Buffer.from(e.data, 'base64').toString('utf8');
    }
    expect(env).toMatch(/^airlock_sentinel_/);
    expect(env).not.toContain(REAL);
  }, 120_000);

  it('lists /mcp in /openapi.json beside the native API', async () => {
    const doc = (await (await fetch(`${s.url}/openapi.json`)).json()) as {
      paths: Record<string, Record<string, unknown>>;
    };
    expect(Object.keys(doc.paths['/mcp'] ?? {}).sort()).toEqual(['delete', 'get', 'post']);
    expect(doc.paths['/v1/sandboxes']).toBeDefined();
  });

  it('leaves no MCP sandbox behind when the front server stops (SIGTERM) or dies (kill -9)', async () => {
    const { client } = await connect(alice.key);
    await client.callTool({ name: 'h__echo', arguments: { text: 'before' } });
    expect((await mcpSandboxes()).length).toBeGreaterThan(0);
    // SIGTERM: the gateway closes its sessions and kills its servers' sandboxes before exiting.
    expect(await stopServe(s)).toBe(0);
    expect(await mcpSandboxes()).toEqual([]);
    // kill -9: nothing closes them, but the next front server kills what it did not record.
    const mcpPath = join(TEST_STATE_DIR, 'mcp-servers.json');
    s = await startServe({}, ['--mcp-config', mcpPath]);
    const again = await connect(alice.key);
    await again.client.callTool({ name: 'h__echo', arguments: { text: 'again' } });
    const orphans = (await mcpSandboxes()).map((b) => b.id);
    expect(orphans.length).toBeGreaterThan(0);
    await stopServe(s, 'SIGKILL');
    s = await startServe({}, ['--mcp-config', mcpPath]);
    const left = (await mcpSandboxes()).map((b) => b.id);
    expect(left.filter((id) => orphans.includes(id))).toEqual([]);
  }, 240_000);
});
