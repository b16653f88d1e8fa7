// `airlock gateway` as users run it: a config file in Claude Desktop format, the real CLI process,
// an SDK client over Streamable HTTP (and over --stdio), SIGTERM at the end, nothing left behind.
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { describe, expect, it } from 'vitest';
import {
  canRunNamespaces,
  NO_RESIDUE,
  settledResidue,
  SKIP_REASON,
  TEST_STATE_DIR,
  TEST_UID_RANGE,
} from '../helpers.js';
import { FIXTURE, ROOT } from './harness.js';

const ENV = {
  PATH: process.env.PATH ?? '/usr/bin:/bin',
  HOME: process.env.HOME ?? '/root',
  AIRLOCK_STATE_DIR: TEST_STATE_DIR,
  AIRLOCK_UID_RANGE: `${TEST_UID_RANGE.first}:${TEST_UID_RANGE.count}`,
};

function writeConfig(dir: string, token: string): string {
  const [cmd, ...args] = FIXTURE('hostile-server.ts');
  const path = join(dir, 'claude_desktop_config.json');
  writeFileSync(
    path,
    JSON.stringify({
      globalShortcut: 'Ctrl+Space', // the rest of a Claude Desktop file is not ours and is ignored
      mcpServers: {
        hostile: { command: cmd, args, airlock: { boundary: 'per-session' } },
        memory: {
          command: 'npx',
          args: ['-y', '@modelcontextprotocol/server-memory'],
          env: { MEMORY_FILE_PATH: '/workspace/memory.jsonl' },
          cwd: ROOT,
        },
        remote: { url: 'https://example.com/mcp', disabled: true },
      },
      airlock: { tenants: [{ name: 'me', token }], listen: '127.0.0.1:18787' },
    }),
  );
  return path;
}

async function waitForUrl(child: ChildProcess, stderr: { text: string }): Promise<string> {
  for (let i = 0; i < 600; i++) {
    const m = /at (http:\/\/\S+\/mcp)/.exec(stderr.text);
    if (m) return m[1]!;
    if (child.exitCode !== null) break;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`airlock gateway did not start:\n${stderr.text}`);
}

/** Run `airlock gateway --stdio --config <file>` for a config that must be refused before anything starts. */
function gatewayRefuses(name: string, text: string): { status: number | null; stderr: string; path: string } {
  const dir = mkdtempSync('/var/tmp/airlock-gw-cfg-');
  const path = join(dir, name);
  writeFileSync(path, text);
  try {
    const r = spawnSync(
      process.execPath,
      ['--import', 'tsx', `${ROOT}/src/cli/main.ts`, 'gateway', '--stdio', '--config', path],
      { cwd: ROOT, env: ENV, encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] },
    );
    return { status: r.status, stderr: r.stderr, path };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

// Config errors are refused by the real CLI before any sandbox exists (no namespaces needed).
describe('airlock gateway --config: errors exit 2 and say what to write', () => {
  it('a VS Code style "servers" key gets a hint to rename it to "mcpServers"', () => {
    const vscode = { servers: { fs: { type: 'stdio', command: 'npx', args: ['-y', 'x'] } }, inputs: [] };
    const r = gatewayRefuses('mcp.json', JSON.stringify(vscode));
    expect(r.status).toBe(2);
    expect(r.stderr).toContain(`invalid gateway config ${r.path} at mcpServers`);
    expect(r.stderr).toContain('VS Code');
    expect(r.stderr).toContain('rename "servers" to "mcpServers"');
    expect(r.stderr.trim().split('\n')).toHaveLength(1);
  });

  it('VS Code settings ("mcp.servers") and files with no servers at all say what Airlock expects', () => {
    const settings = gatewayRefuses('settings.json', JSON.stringify({ mcp: { servers: {} } }));
    expect(settings.status).toBe(2);
    expect(settings.stderr).toContain('move that object to a top-level "mcpServers"');
    const none = gatewayRefuses('empty.yaml', 'globalShortcut: Ctrl+Space\n');
    expect(none.status).toBe(2);
    expect(none.stderr).toContain('Airlock expects a top-level "mcpServers" object');
  });

  it('names the file and the full path of a misspelt or mistyped key', () => {
    const typo = { mcpServers: { fs: { command: 'npx', airlock: { boundry: 'per-call' } } } };
    const t = gatewayRefuses('claude_desktop_config.json', JSON.stringify(typo));
    expect(t.status).toBe(2);
    expect(t.stderr).toMatch(
      /^airlock: invalid gateway config \S+claude_desktop_config\.json at mcpServers\.fs\.airlock\.boundry: unknown field\(s\) "boundry"/,
    );
    const bad = { mcpServers: { fs: { command: 'npx', airlock: { boundary: 'sometimes' } } } };
    const b = gatewayRefuses('gw.json', JSON.stringify(bad));
    expect(b.status).toBe(2);
    expect(b.stderr).toContain(`${b.path} at mcpServers.fs.airlock.boundary:`);
    expect(b.stderr).toContain('per-session');
  });

  it('a broken file names the file and the format it was read as', () => {
    const r = gatewayRefuses('broken.json', '{ "mcpServers": ');
    expect(r.status).toBe(2);
    expect(r.stderr).toContain(`invalid gateway config ${r.path}: not valid JSON`);
    const y = gatewayRefuses('gw.yaml', 'mcpServers: {}\nmcpServers: {}\n');
    expect(y.status).toBe(2);
    expect(y.stderr).toContain(`invalid gateway config ${y.path}`);
  });
});

if (!canRunNamespaces) {
  describe('airlock gateway (CLI)', () => {
    it.skip(`the whole suite [skipped: ${SKIP_REASON}]`, () => {});
  });
} else {
  describe('airlock gateway (CLI)', () => {
    it('serves a Claude Desktop config over HTTP, with auth, and exits cleanly on SIGTERM', async () => {
      const dir = mkdtempSync('/var/tmp/airlock-gw-cli-');
      const token = randomBytes(32).toString('hex');
      const config = writeConfig(dir, token);
      const stderr = { text: '' };
      const child = spawn(
        process.execPath,
        ['--import', 'tsx', `${ROOT}/src/cli/main.ts`, 'gateway', '--config', config],
        {
          cwd: ROOT,
          env: ENV,
          stdio: ['ignore', 'pipe', 'pipe'],
        },
      );
      child.stderr!.on('data', (b: Buffer) => (stderr.text += b.toString()));
      try {
        const url = await waitForUrl(child, stderr);
        expect(url).toBe('http://127.0.0.1:18787/mcp');
        const noAuth = await fetch(url, {
          method: 'POST',
          body: '{}',
          headers: { 'content-type': 'application/json' },
        });
        expect(noAuth.status).toBe(401);
        const c = new Client({ name: 'test', version: '1' });
        await c.connect(
          new StreamableHTTPClientTransport(new URL(url), {
            requestInit: { headers: { authorization: `Bearer ${token}` } },
          }),
        );
        const names = (await c.listTools()).tools.map((t) => t.name);
        expect(names).toEqual(expect.arrayContaining(['hostile__echo', 'memory__read_graph']));
        expect(names).not.toContain('hostile__add');
        const r = await c.callTool({ name: 'hostile__echo', arguments: { text: 'via the CLI gateway' } });
        expect(JSON.stringify(r.content)).toContain('via the CLI gateway');
        await c.close();
      } finally {
        child.kill('SIGTERM');
        await new Promise((r) => child.once('exit', r));
        rmSync(dir, { recursive: true, force: true });
      }
      expect(child.exitCode ?? 128 + 15).toBe(143);
      expect(stderr.text).toMatch(/SIGTERM received/);
      expect(await settledResidue()).toEqual(NO_RESIDUE);
    }, 120_000);

    it('serves the same config to one client over --stdio', async () => {
      const dir = mkdtempSync('/var/tmp/airlock-gw-cli-');
      const config = writeConfig(dir, randomBytes(32).toString('hex'));
      const transport = new StdioClientTransport({
        command: process.execPath,
        args: ['--import', 'tsx', `${ROOT}/src/cli/main.ts`, 'gateway', '--stdio', '--config', config],
        cwd: ROOT,
        env: ENV,
        stderr: 'pipe',
      });
      const c = new Client({ name: 'test', version: '1' });
      try {
        await c.connect(transport);
        const r = await c.callTool({ name: 'memory__read_graph', arguments: {} });
        expect(r.isError ?? false).toBe(false);
        expect(JSON.stringify(r.content)).toContain('entities');
      } finally {
        await c.close();
        rmSync(dir, { recursive: true, force: true });
      }
      // The CLI tears its sandboxes down after the client closed its stdin.
      expect(await settledResidue(10_000)).toEqual(NO_RESIDUE);
    }, 120_000);
  });
}
