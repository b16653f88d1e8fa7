// `airlock mcp-server`: the real CLI (src/cli/main.ts through tsx) as an MCP server, reached by the
// MCP SDK's client over stdio and over Streamable HTTP, and by the MCP Inspector CLI. The same
// session cases run on both transports: tools listed, exec/files/lifecycle in real sandboxes, bounded
// output, another session's sandbox id refused, and every sandbox of a session gone when it ends.
// HTTP alone: the bearer token, Host and Origin checks, and a session closed by DELETE.
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import type { CallToolResult } from '@modelcontextprotocol/sdk/types.js';
import { afterAll, beforeAll, describe, expect, it, onTestFinished } from 'vitest';
import { McpHttpServer } from '../../src/adapters/mcp-server/http.js';
import { expectError } from '../contract/support.js';
import {
  NO_RESIDUE,
  SKIP_REASON,
  TEST_STATE_DIR,
  TEST_UID_RANGE,
  canRunNamespaces,
  residue,
  settledResidue,
} from '../helpers.js';

const ROOT = join(import.meta.dirname, '..', '..');
const TSX = pathToFileURL(join(ROOT, 'node_modules', 'tsx', 'dist', 'loader.mjs')).href;
const MAIN = join(ROOT, 'src', 'cli', 'main.ts');
const CLI = ['--import', TSX, MAIN, 'mcp-server'];
const ENV: Record<string, string> = {
  ...(process.env as Record<string, string>),
  AIRLOCK_STATE_DIR: TEST_STATE_DIR,
  AIRLOCK_UID_RANGE: `${TEST_UID_RANGE.first}:${TEST_UID_RANGE.count}`,
};
const TOKEN = 'test-token-0123456789abcdef';

const TOOLS = [
  'exec',
  'list_files',
  'read_file',
  'run_code',
  'sandbox_create',
  'sandbox_kill',
  'sandbox_list',
  'write_file',
];

/** A tool's answer: the parsed JSON of its text, and whether it is an error. */
async function call(c: Client, name: string, args: Record<string, unknown> = {}) {
  const r = (await c.callTool({ name, arguments: args })) as CallToolResult;
  const text = r.content.map((p) => (p.type === 'text' ? p.text : '')).join('');
  let json: Record<string, unknown>;
  try {
    json = JSON.parse(text) as Record<string, unknown>;
  } catch {
    json = { text };
  }
  return { isError: r.isError === true, json, text };
}

/** Waits (bounded) until `f()` holds. */
async function until(f: () => boolean, maxWaitMs = 15_000): Promise<boolean> {
  for (let waited = 0; waited < maxWaitMs && !f(); waited += 50) await new Promise((r) => setTimeout(r, 50));
  return f();
}

const liveDirs = (): string[] => residue().sandboxDirs;

interface Transport {
  /** A connected client on a session of its own. */
  connect(): Promise<{ client: Client; end: () => Promise<void> }>;
}

/** The session cases, run on each transport. */
function sessionCases(name: string, transport: () => Transport): void {
  describe(name, () => {
    it('lists its tools and runs exec, files and lifecycle in real sandboxes', async () => {
      const { client, end } = await transport().connect();
      try {
        const tools = await client.listTools();
        expect(tools.tools.map((t) => t.name).sort()).toEqual(TOOLS);
        const exec = tools.tools.find((t) => t.name === 'exec')!;
        expect(exec.inputSchema.properties).toHaveProperty('command');
        expect(exec.inputSchema.properties).toHaveProperty('sandbox_id');

        // Without sandbox_id: the session's own sandbox, made on first use and kept.
        const a = await call(client, 'exec', { command: 'echo $((6*7)) > n; cat n; id -u' });
        expect(a.isError).toBe(false);
        expect(a.json.exitCode).toBe(0);
        expect(String(a.json.stdout).split('\n')[0]).toBe('42');
        expect(String(a.json.stdout).split('\n')[1]).not.toBe('0');
        expect((await call(client, 'read_file', { path: 'n' })).json).toEqual({
          content: '42\n',
          totalLines: 2,
        });

        const made = await call(client, 'sandbox_create', { ttlMs: 120_000 });
        const id = String(made.json.sandbox_id);
        expect(id).toMatch(/^sbx-/);
        expect(liveDirs()).toContain(id);
        expect(
          (await call(client, 'write_file', { sandbox_id: id, path: 'd/f.txt', content: 'x' })).json,
        ).toEqual({
          path: '/workspace/d/f.txt',
          bytes: 1,
        });
        // Files of one sandbox are not in the other.
        expect((await call(client, 'read_file', { path: 'd/f.txt' })).json).toMatchObject({
          error: { code: 'FILE_NOT_FOUND' },
        });
        expect((await call(client, 'list_files', { sandbox_id: id, path: 'd' })).json).toEqual({
          entries: [{ name: 'f.txt', type: 'file', size: 1 }],
        });
        const listed = (await call(client, 'sandbox_list')).json.sandboxes as Array<{ id: string }>;
        expect(listed.map((s) => s.id)).toContain(id);
        expect(listed).toHaveLength(2);

        // Bounded output: a large stdout comes back cut, with the cut named.
        const big = await call(client, 'exec', {
          sandbox_id: id,
          command: 'head -c 300000 /dev/zero | tr "\\0" z',
        });
        expect(big.text.length).toBeLessThan(20_000);
        expect(String(big.json.stdout)).toContain('characters cut');

        expect((await call(client, 'sandbox_kill', { sandbox_id: id })).json).toEqual({ killed: id });
        expect(await until(() => !liveDirs().includes(id))).toBe(true);
        const gone = await call(client, 'exec', { sandbox_id: id, command: 'true' });
        expect(gone.isError).toBe(true);
        expect(gone.json).toMatchObject({ error: { code: 'SANDBOX_NOT_FOUND' } });
      } finally {
        await end();
      }
    });

    it("refuses another session's sandbox id, input outside the schema, and more than the cap", async () => {
      const one = await transport().connect();
      const two = await transport().connect();
      try {
        const id = String((await call(one.client, 'sandbox_create')).json.sandbox_id);
        const attempts: Array<[string, Record<string, unknown>]> = [
          ['exec', { sandbox_id: id, command: 'touch /workspace/stolen' }],
          ['write_file', { sandbox_id: id, path: 'stolen', content: 'x' }],
          ['read_file', { sandbox_id: id, path: '/etc/hostname' }],
          ['list_files', { sandbox_id: id }],
          ['run_code', { sandbox_id: id, code: 'print(1)' }],
          ['sandbox_kill', { sandbox_id: id }],
        ];
        for (const [tool, args] of attempts) {
          const r = await call(two.client, tool, args);
          expect(r.isError, tool).toBe(true);
          expect(r.text, tool).toContain('SANDBOX_NOT_FOUND');
        }
        // The owner still has it, untouched.
        expect(
          (await call(one.client, 'exec', { sandbox_id: id, command: 'ls /workspace' })).json.stdout,
        ).toBe('');
        // Host paths and unknown spec fields are not part of the tool's schema.
        for (const bad of [
          { mounts: [{ host: '/', sandbox: '/host' }] },
          { workspace: { hostDir: '/etc' } },
          { backend: 'docker' },
          { ttlMs: 10 },
          { network: 'allowlist' },
          { allow: ['example.com'] },
          { ttlMs: 86_400_000 },
        ]) {
          const r = await call(one.client, 'sandbox_create', bad);
          expect(r.isError, JSON.stringify(bad)).toBe(true);
        }
        // The cap (4 per session): the one above plus three more, then a refusal.
        for (let i = 0; i < 3; i++) expect((await call(one.client, 'sandbox_create')).isError).toBe(false);
        const over = await call(one.client, 'sandbox_create');
        expect(over.json).toMatchObject({ error: { code: 'CAPACITY_EXHAUSTED' } });
        // Session two is not affected by one's cap.
        expect((await call(two.client, 'exec', { command: 'true' })).json.exitCode).toBe(0);
      } finally {
        await one.end();
        await two.end();
      }
    });

    it('kills every sandbox of a session when the session ends', async () => {
      const { client, end } = await transport().connect();
      const ids = [
        String((await call(client, 'sandbox_create')).json.sandbox_id),
        String((await call(client, 'sandbox_create')).json.sandbox_id),
      ];
      await call(client, 'exec', { command: 'sleep 1000 & echo started' });
      expect(liveDirs()).toEqual(expect.arrayContaining(ids));
      await end();
      expect(await until(() => ids.every((id) => !liveDirs().includes(id)))).toBe(true);
    });
  });
}

describe.skipIf(!canRunNamespaces)(`airlock mcp-server (${SKIP_REASON})`, () => {
  afterAll(async () => {
    expect(await settledResidue(10_000)).toEqual(NO_RESIDUE);
  });

  sessionCases('over stdio', () => ({
    async connect() {
      const t = new StdioClientTransport({ command: process.execPath, args: CLI, env: ENV, stderr: 'pipe' });
      const client = new Client({ name: 'test', version: '1' });
      await client.connect(t);
      const pid = t.pid!;
      return {
        client,
        // Closing stdin ends the session: the server kills its sandboxes and exits by itself.
        end: async () => {
          await client.close();
          await until(() => !alive(pid), 20_000);
        },
      };
    },
  }));

  describe('over Streamable HTTP', () => {
    let server: ChildProcess;
    let url: string;
    beforeAll(async () => {
      ({ child: server, url } = await startHttp());
    });
    afterAll(async () => {
      if (server?.exitCode === null) {
        server.kill('SIGTERM');
        await new Promise((r) => server.once('exit', r));
      }
    });

    sessionCases('sessions', () => ({
      async connect() {
        const t = new StreamableHTTPClientTransport(new URL(url), {
          requestInit: { headers: { authorization: `Bearer ${TOKEN}` } },
        });
        const client = new Client({ name: 'test', version: '1' });
        await client.connect(t);
        return {
          client,
          // DELETE /mcp ends the session (and its sandboxes).
          end: async () => {
            await t.terminateSession();
            await client.close();
          },
        };
      },
    }));

    it('checks the token, the Host and the Origin before anything else', async () => {
      const init = JSON.stringify({
        jsonrpc: '2.0',
        id: 1,
        method: 'initialize',
        params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'x', version: '1' } },
      });
      const headers = { 'content-type': 'application/json', accept: 'application/json, text/event-stream' };
      const post = (h: Record<string, string>, path = '/mcp') =>
        fetch(new URL(path, url), { method: 'POST', headers: { ...headers, ...h }, body: init });
      expect((await post({})).status).toBe(401);
      expect((await post({ authorization: 'Bearer wrong-token-0123456789' })).status).toBe(401);
      expect((await post({ authorization: `Basic ${TOKEN}` })).status).toBe(401);
      expect((await post({ authorization: `Bearer ${TOKEN}` }, '/other')).status).toBe(404);
      expect((await post({ authorization: `Bearer ${TOKEN}`, origin: 'http://evil.example' })).status).toBe(
        403,
      );
      // A DNS-rebinding page: the right address, but its own name in Host.
      const rebind = await rawStatus(url, 'evil.example:80', TOKEN, init);
      expect(rebind).toBe(403);
      // A made-up session id is "not found", with or without a valid token.
      const r = await fetch(url, {
        method: 'POST',
        headers: { ...headers, authorization: `Bearer ${TOKEN}`, 'mcp-session-id': 'not-a-session' },
        body: JSON.stringify({ jsonrpc: '2.0', id: 2, method: 'tools/list' }),
      });
      expect(r.status).toBe(404);
      // Not JSON at all.
      const broken = await fetch(url, {
        method: 'POST',
        headers: { ...headers, authorization: `Bearer ${TOKEN}` },
        body: '{"jsonrpc": "2.0", "id": 1, "method": "initialize", ',
      });
      expect(broken.status).toBe(400);
      // The right token and an allowed Origin: a session starts.
      const ok = await post({ authorization: `Bearer ${TOKEN}`, origin: new URL(url).origin });
      expect(ok.status).toBe(200);
      expect(ok.headers.get('mcp-session-id')).toBeTruthy();
      await fetch(url, {
        method: 'DELETE',
        headers: { authorization: `Bearer ${TOKEN}`, 'mcp-session-id': ok.headers.get('mcp-session-id')! },
      });
    });

    it('run_code runs a cell, returns its exception as the result, and refuses a denied cell as a tool error', async () => {
      const t = new StreamableHTTPClientTransport(new URL(url), {
        requestInit: { headers: { authorization: `Bearer ${TOKEN}` } },
      });
      const client = new Client({ name: 'test', version: '1' });
      await client.connect(t);
      try {
        const r = await call(client, 'run_code', { code: 'print("hi")\n6 * 7', language: 'python' });
        expect(r.isError).toBe(false);
        expect(r.json).toMatchObject({ stdout: 'hi\n', error: null });
        expect((r.json.results as Array<{ text?: string }>).map((x) => x.text)).toContain('42');
        // The code's own exception is the tool's result, not a tool error.
        const raised = await call(client, 'run_code', { code: '1 / 0', language: 'python' });
        expect(raised.isError).toBe(false);
        expect(raised.json).toMatchObject({ error: { name: 'ZeroDivisionError' } });
        // A run the analysis denies is a tool error, and names the rule.
        const denied = await call(client, 'run_code', {
          code: 'import base64\nexec(base64.b64decode("cHJpbnQoMSk="))',
          language: 'python',
        });
        expect(denied.isError).toBe(true);
        expect(denied.json).toMatchObject({ error: { code: 'CODE_DENIED' } });
        expect(denied.text).toContain('obfuscated-exec');
      } finally {
        await t.terminateSession();
        await client.close();
      }
    });

    it('run_code sends a PNG figure as image content, SVG as text, and leaves out what is over the bounds', async () => {
      const t = new StreamableHTTPClientTransport(new URL(url), {
        requestInit: { headers: { authorization: `Bearer ${TOKEN}` } },
      });
      const client = new Client({ name: 'test', version: '1' });
      await client.connect(t);
      try {
        const code = [
          'import matplotlib.pyplot as plt',
          'plt.plot([1, 2, 3])',
          'class Svg:',
          '    def _repr_svg_(self): return \'<svg xmlns="http://www.w3.org/2000/svg" width="4" height="4"/>\'',
          'class Fake:',
          "    def _repr_png_(self): return b'GIF89a not a png'",
          'class Big:',
          "    def _repr_png_(self): return b'\\x89PNG\\r\\n\\x1a\\n' + bytes(3 * 1024 * 1024)",
          'display(Svg()); display(Fake()); display(Big())',
        ].join('\n');
        const r = (await client.callTool(
          { name: 'run_code', arguments: { code, language: 'python', timeoutMs: 120_000 } },
          undefined,
          { timeout: 180_000 },
        )) as CallToolResult;
        expect(r.isError).not.toBe(true);
        const [first, ...rest] = r.content;
        // The JSON text names every image by size, whatever a client does with image blocks.
        const json = JSON.parse(first!.type === 'text' ? first!.text : '{}') as { results: unknown[] };
        expect(JSON.stringify(json.results)).toContain('[image/png,');
        const images = rest.filter((c) => c.type === 'image');
        expect(images.length).toBe(1); // the figure; not the fake, not the big one
        expect(images[0]).toMatchObject({ type: 'image', mimeType: 'image/png' });
        const png = Buffer.from((images[0] as { data: string }).data, 'base64');
        expect(png.subarray(0, 8)).toEqual(Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]));
        const texts = rest.filter((c) => c.type === 'text').map((c) => (c as { text: string }).text);
        expect(texts.some((x) => x.startsWith('<svg'))).toBe(true);
        const note = texts.find((x) => x.startsWith('Images left out'));
        expect(note).toMatch(/not a PNG/);
        expect(note).toMatch(/image\/png of 3145736 bytes is over/);
      } finally {
        await t.terminateSession();
        await client.close();
      }
    }, 240_000);

    it('stops on SIGTERM, killing the sandboxes of open sessions', async () => {
      const t = new StreamableHTTPClientTransport(new URL(url), {
        requestInit: { headers: { authorization: `Bearer ${TOKEN}` } },
      });
      const client = new Client({ name: 'test', version: '1' });
      await client.connect(t);
      const id = String((await call(client, 'sandbox_create')).json.sandbox_id);
      expect(liveDirs()).toContain(id);
      server.kill('SIGTERM');
      const code = await new Promise((r) => server.once('exit', (c) => r(c)));
      expect(code).toBe(143);
      expect(liveDirs()).not.toContain(id);
      await client.close().catch(() => {});
    });
  });

  it('refuses a non-loopback HTTP address and a short token (before listening)', async () => {
    const runtime = { create: () => Promise.reject(new Error('never called')) };
    for (const host of ['0.0.0.0', '::', '192.168.1.10', 'example.com', '127.0.0.1.example.com']) {
      await expectError(
        () => new McpHttpServer({ runtime, host, port: 0, token: TOKEN }),
        'INVALID_ARGUMENT',
        '--http',
      );
    }
    await expectError(
      () => new McpHttpServer({ runtime, host: '127.0.0.1', port: 0, token: 'short' }),
      'INVALID_ARGUMENT',
      'token',
    );
  });

  it('works with the MCP Inspector CLI: lists the tools and calls exec', async () => {
    const build = join(ROOT, 'node_modules', '@modelcontextprotocol', 'inspector-cli', 'build');
    const inspector = join(build, 'index.js');
    // It looks for its own package.json at ../package.json from the current directory.
    const inBuild = (args: string[]) => runNode(args, {}, build);
    // The Inspector takes the server as a command; a script keeps node's own flags out of its parser.
    const dir = mkdtempSync(join(tmpdir(), 'airlock-inspector-'));
    const script = join(dir, 'airlock-mcp-server');
    writeFileSync(script, `#!/bin/sh\nexec ${[process.execPath, ...CLI].map((a) => `'${a}'`).join(' ')}\n`, {
      mode: 0o755,
    });
    onTestFinished(() => rmSync(dir, { recursive: true, force: true }));
    const target = [script];
    const list = await inBuild([inspector, '--method', 'tools/list', ...target]);
    expect(list.code, list.stderr).toBe(0);
    const names = (JSON.parse(list.stdout) as { tools: Array<{ name: string }> }).tools.map((t) => t.name);
    expect(names.sort()).toEqual(TOOLS);
    // The target first: --tool-arg takes every word after it.
    const run = await inBuild([
      inspector,
      ...target,
      '--method',
      'tools/call',
      '--tool-name',
      'exec',
      '--tool-arg',
      'command=echo from-inspector; uname -s',
    ]);
    expect(run.code, run.stderr).toBe(0);
    const out = JSON.parse(run.stdout) as { content: Array<{ text: string }>; isError?: boolean };
    expect(out.isError ?? false).toBe(false);
    expect(JSON.parse(out.content[0]!.text)).toEqual({
      exitCode: 0,
      stdout: 'from-inspector\nLinux\n',
      stderr: '',
    });
  });
});

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

/** `airlock mcp-server --http 127.0.0.1:0`, once it has printed where it listens. */
async function startHttp(): Promise<{ child: ChildProcess; url: string }> {
  const child = spawn(process.execPath, [...CLI, '--http', '127.0.0.1:0'], {
    env: { ...ENV, AIRLOCK_MCP_TOKEN: TOKEN },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let err = '';
  const url = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`mcp-server did not start: ${err}`)), 60_000);
    child.stderr!.setEncoding('utf8').on('data', (t: string) => {
      err += t;
      const m = /airlock mcp-server: (http:\/\/\S+\/mcp)/.exec(err);
      if (m) {
        clearTimeout(timer);
        resolve(m[1]!);
      }
    });
    child.once('exit', (c) => reject(new Error(`mcp-server exited ${c}: ${err}`)));
  });
  // With AIRLOCK_MCP_TOKEN set, the token is never printed.
  expect(err).not.toContain(TOKEN);
  return { child, url };
}

/** One POST whose Host header is `host` (fetch would not let a test forge it). */
async function rawStatus(url: string, host: string, token: string, body: string): Promise<number> {
  const { request } = await import('node:http');
  const u = new URL(url);
  return new Promise((resolve, reject) => {
    const req = request(
      {
        host: u.hostname,
        port: u.port,
        path: u.pathname,
        method: 'POST',
        headers: {
          host,
          authorization: `Bearer ${token}`,
          'content-type': 'application/json',
          accept: 'application/json, text/event-stream',
        },
      },
      (res) => {
        res.resume();
        resolve(res.statusCode ?? 0);
      },
    );
    req.on('error', reject);
    req.end(body);
  });
}

function runNode(args: string[], env: Record<string, string> = {}, cwd = ROOT) {
  return new Promise<{ code: number | null; stdout: string; stderr: string }>((resolve, reject) => {
    const child = spawn(process.execPath, args, {
      cwd,
      env: { ...ENV, ...env },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (t: string) => (stdout += t));
    child.stderr.setEncoding('utf8').on('data', (t: string) => (stderr += t));
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`node ${args.join(' ')} did not exit in time: ${stderr}`));
    }, 90_000);
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
  });
}
