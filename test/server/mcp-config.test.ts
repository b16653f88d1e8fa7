// `airlock serve --mcp-config FILE`: the gateway's own config file, with what only the stand-alone
// gateway may say (its tenants and their tokens, its listen address) refused with what to do instead.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { AirlockError } from '../../src/core/errors.js';
import { loadServeMcpConfig } from '../../src/server/mcp.js';
import { runCli } from '../helpers.js';

const dir = mkdtempSync(join(tmpdir(), 'airlock-mcp-config-'));
let n = 0;
const file = (data: unknown, ext = 'json'): string => {
  const p = join(dir, `c${n++}.${ext}`);
  writeFileSync(p, typeof data === 'string' ? data : JSON.stringify(data));
  return p;
};
const SERVERS = { mem: { command: 'npx', args: ['-y', '@modelcontextprotocol/server-memory'] } };

function refusal(f: () => unknown): AirlockError {
  try {
    f();
  } catch (e) {
    if (AirlockError.isInstance(e)) return e;
    throw e;
  }
  return expect.fail('expected an AirlockError');
}

describe('loadServeMcpConfig', () => {
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it('takes a Claude Desktop style mcpServers file, YAML too', () => {
    const c = loadServeMcpConfig(file({ mcpServers: SERVERS, globalShortcut: 'x' }));
    expect(Object.keys(c.gateway.mcpServers)).toEqual(['mem']);
    expect(c.allowedHosts).toBeUndefined();
    const y = loadServeMcpConfig(file('mcpServers:\n  mem:\n    command: npx\n', 'yaml'));
    expect(y.gateway.mcpServers.mem?.command).toBe('npx');
  });

  it('keeps explicit allowedHosts (else the listen address of the server decides)', () => {
    const c = loadServeMcpConfig(
      file({ mcpServers: SERVERS, airlock: { allowedHosts: ['Airlock.example.com'] } }),
    );
    expect(c.allowedHosts).toEqual(['airlock.example.com']);
  });

  it('refuses a tenants block: /mcp takes the server API keys', () => {
    const e = refusal(() =>
      loadServeMcpConfig(
        file({
          mcpServers: SERVERS,
          airlock: { tenants: [{ name: 'me', token: 'a1b2c3d4e5f6g7h8i9j0k1l2m3n4o5p6q7' }] },
        }),
      ),
    );
    expect(e.code).toBe('MCP_INVALID_CONFIG');
    expect(e.field).toBe('airlock.tenants');
    expect(e.message).toMatch(/airlock keys create --tenant/);
  });

  it("refuses the stand-alone gateway's listen address and allowNonLoopback", () => {
    for (const [k, v] of [
      ['listen', '127.0.0.1:8787'],
      ['allowNonLoopback', false],
    ] as const) {
      const e = refusal(() => loadServeMcpConfig(file({ mcpServers: SERVERS, airlock: { [k]: v } })));
      expect(e.code).toBe('MCP_INVALID_CONFIG');
      expect(e.field).toBe(`airlock.${k}`);
      expect(e.message).toMatch(/--listen/);
    }
  });

  it("keeps the gateway's own validation: remote servers, no servers, a missing file", () => {
    expect(
      refusal(() => loadServeMcpConfig(file({ mcpServers: { r: { url: 'https://mcp.example.com' } } }))).code,
    ).toBe('MCP_INVALID_CONFIG');
    expect(refusal(() => loadServeMcpConfig(file({ mcpServers: {} }))).message).toMatch(/no enabled server/);
    expect(refusal(() => loadServeMcpConfig(file({ servers: SERVERS }))).message).toMatch(/rename "servers"/);
    expect(refusal(() => loadServeMcpConfig(join(dir, 'absent.json'))).code).toMatch(/NOT_FOUND|INVALID/);
  });

  it('airlock serve refuses such a file before it starts anything (exit 2, the field named)', async () => {
    const bad = file({ mcpServers: SERVERS, airlock: { listen: '0.0.0.0:8787' } });
    const r = await runCli(['serve', '--listen', '127.0.0.1:0', '--state-dir', dir, '--mcp-config', bad], {
      timeoutMs: 60_000,
    });
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/airlock\.listen/);
    expect(r.stdout).not.toMatch(/listening/);
  }, 60_000);
});
