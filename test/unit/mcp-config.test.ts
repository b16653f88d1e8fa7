// The gateway config file: Claude Desktop / Cursor / Cline `mcpServers` JSON accepted as-is, remote
// servers refused, per-server airlock blocks (reusing the sandbox and egress schemas), the gateway block
// (tenants, listen, Host/Origin), boundaries and budgets, and errors naming the file and the field.
import { chmodSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { AirlockError } from '../../src/core/errors.js';
import {
  effectiveBoundary,
  effectiveBudgets,
  loadGatewayConfig,
  parseGatewayConfig,
  parseMcpSandboxOptions,
  requireTenants,
  resolveTenants,
} from '../../src/mcp/config.js';

const dir = mkdtempSync(join(tmpdir(), 'airlock-mcp-config-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const TOKEN_A = 'a3f1c9e07b5d24688e1f0a9c3b7d5e21f4a6c8e0b2d4f6a8c0e2b4d6f8a0c2e4';
const TOKEN_B = '0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c';

function write(name: string, text: string, mode = 0o600): string {
  const path = join(dir, name);
  writeFileSync(path, text, { mode });
  chmodSync(path, mode);
  return path;
}

/** The MCP_INVALID_CONFIG error an input produces. */
function configError(input: unknown): AirlockError {
  try {
    parseGatewayConfig(input);
  } catch (e) {
    if (AirlockError.is(e, 'MCP_INVALID_CONFIG')) return e;
    throw e;
  }
  throw new Error(`expected MCP_INVALID_CONFIG for ${JSON.stringify(input)}`);
}

const server = (airlock: unknown = undefined) => ({
  mcpServers: { fs: { command: 'npx', args: ['-y', 'server'], ...(airlock ? { airlock } : {}) } },
});

// The example from the MCP "connect local servers" guide, plus a typical second entry, byte for byte.
const CLAUDE_DESKTOP = `{
  "mcpServers": {
    "filesystem": {
      "command": "npx",
      "args": [
        "-y",
        "@modelcontextprotocol/server-filesystem",
        "/Users/username/Desktop",
        "/Users/username/Downloads"
      ]
    },
    "github": {
      "command": "npx",
      "args": ["-y", "@modelcontextprotocol/server-github"],
      "env": {
        "GITHUB_PERSONAL_ACCESS_TOKEN": "<YOUR_TOKEN>"
      }
    }
  },
  "globalShortcut": "Ctrl+Space"
}
`;

// Cursor / Cline style: type, disabled, autoApprove, alwaysAllow, timeout, cwd, and a remote entry.
const CURSOR_CLINE = {
  mcpServers: {
    memory: {
      type: 'stdio',
      command: 'npx',
      args: ['-y', '@modelcontextprotocol/server-memory'],
      autoApprove: ['read_graph'],
      alwaysAllow: ['search_nodes'],
      timeout: 60,
      disabled: false,
      cwd: '/home/me/project',
    },
    old: { command: 'node', args: ['old.js'], disabled: true, airlock: { boundary: 'nonsense' } },
    linear: { url: 'https://mcp.linear.app/sse', disabled: true },
  },
};

describe('Claude Desktop / Cursor configs as-is', () => {
  it('accepts a Claude Desktop config file unchanged', () => {
    const c = loadGatewayConfig(write('claude_desktop_config.json', CLAUDE_DESKTOP));
    expect(Object.keys(c.mcpServers)).toEqual(['filesystem', 'github']);
    expect(c.mcpServers['filesystem']).toMatchObject({
      name: 'filesystem',
      command: 'npx',
      args: [
        '-y',
        '@modelcontextprotocol/server-filesystem',
        '/Users/username/Desktop',
        '/Users/username/Downloads',
      ],
      env: {},
      airlock: { namespace: 'filesystem', secrets: [], scan: { quarantine: 'high', warn: [] } },
    });
    expect(c.mcpServers['github']!.env).toEqual({ GITHUB_PERSONAL_ACCESS_TOKEN: '<YOUR_TOKEN>' });
    expect(c.mcpServers['github']!.airlock.boundary).toBeUndefined();
    expect(c.airlock).toMatchObject({
      tenants: [],
      listen: { host: '127.0.0.1', port: 8787 },
      allowNonLoopback: false,
      allowedHosts: ['127.0.0.1:8787', 'localhost:8787'],
      allowedOrigins: [],
      relistIntervalMs: 30_000,
      budgets: {},
      lockfile: join(dir, 'airlock.lock.json'),
    });
    expect(c.source).toBe(join(dir, 'claude_desktop_config.json'));
  });

  it('accepts Cursor / Cline keys, honours disabled and cwd', () => {
    const c = parseGatewayConfig(CURSOR_CLINE);
    expect(Object.keys(c.mcpServers)).toEqual(['memory']);
    expect(c.disabledServers).toEqual(['old', 'linear']);
    expect(c.mcpServers['memory']).toEqual({
      name: 'memory',
      command: 'npx',
      args: ['-y', '@modelcontextprotocol/server-memory'],
      env: {},
      cwd: '/home/me/project',
      airlock: expect.objectContaining({ namespace: 'memory' }),
    });
    // Ignored client keys do not leak into the parsed server.
    expect(c.mcpServers['memory']).not.toHaveProperty('autoApprove');
  });

  it('refuses remote servers with a clear message', () => {
    for (const [entry, key] of [
      [{ url: 'https://mcp.example.com/mcp' }, 'url'],
      [{ type: 'sse', url: 'https://x.example/sse' }, 'url'],
      [{ type: 'http', command: 'x' }, 'type'],
      [{ type: 'streamable-http', command: 'x' }, 'type'],
      [{ serverUrl: 'https://x.example/mcp' }, 'serverUrl'],
      [{ transportType: 'sse', command: 'x' }, 'transportType'],
    ] as const) {
      const e = configError({ mcpServers: { notion: entry } });
      expect(e.field).toBe(`mcpServers.notion.${key}`);
      expect(e.message).toContain('remote MCP server');
      expect(e.message).toContain('does not run or proxy remote servers');
    }
  });

  it('refuses envFile and entries without a command', () => {
    expect(configError({ mcpServers: { a: { command: 'x', envFile: '.env' } } }).field).toBe(
      'mcpServers.a.envFile',
    );
    expect(configError({ mcpServers: { a: { args: [] } } }).field).toBe('mcpServers.a.command');
    expect(configError({ mcpServers: { a: { command: '' } } }).message).toContain('command is empty');
    expect(configError({ mcpServers: { a: { command: 'x', type: 'ws2' } } }).field).toBe('mcpServers.a.type');
    expect(configError({ mcpServers: { a: { command: 'x', cwd: 'rel' } } }).field).toBe('mcpServers.a.cwd');
  });

  it('needs at least one enabled server with a valid name', () => {
    expect(configError({ mcpServers: {} }).message).toContain('no enabled server');
    expect(configError({ mcpServers: { a: { command: 'x', disabled: true } } }).field).toBe('mcpServers');
    expect(configError({}).field).toBe('mcpServers');
    expect(configError({ mcpServers: { 'my server': { command: 'x' } } }).message).toContain(
      'server name must be 1-64 letters, digits, _ or -',
    );
  });
});

describe('per-server airlock block', () => {
  it('reuses the sandbox and egress schemas', () => {
    const c = parseGatewayConfig(
      server({
        boundary: 'per-call',
        namespace: false,
        network: { allow: ['api.github.com'] },
        secrets: [{ name: 'GH_TOKEN', value: { fromEnv: 'GH_TOKEN' }, hosts: ['api.github.com'] }],
        workspace: { hostDir: '/srv/data', mode: 'ro' },
        limits: { memoryBytes: 256 * 1024 * 1024 },
        ttlMs: 60_000,
        tools: { allow: ['read_*'], deny: ['read_secret'] },
        budgets: { maxCalls: 50 },
        scan: { quarantine: 'medium' },
        output: { maxTextBytes: 64_000 },
      }),
    );
    const a = c.mcpServers['fs']!.airlock;
    expect(a).toMatchObject({
      boundary: 'per-call',
      namespace: false,
      network: { allow: ['api.github.com'], deny: [], transparent: true, allowPrivate: [] },
      workspace: { hostDir: '/srv/data', mode: 'ro' },
      limits: { memoryBytes: 256 * 1024 * 1024, cpus: 1 },
      tools: { allow: ['read_*'], deny: ['read_secret'], arguments: {} },
      budgets: { maxCalls: 50 },
      scan: { quarantine: 'medium', warn: [] },
      output: { maxTextBytes: 64_000 },
    });
    expect(a.secrets[0]).toMatchObject({ name: 'GH_TOKEN', hosts: ['api.github.com'] });
  });

  it('names the offending field', () => {
    const field = (airlock: unknown) => configError(server(airlock)).field;
    expect(field({ boundary: 'per-request' })).toBe('mcpServers.fs.airlock.boundary');
    expect(field({ namespace: 'has space' })).toBe('mcpServers.fs.airlock.namespace');
    expect(field({ limits: { memoryBytes: 1 } })).toBe('mcpServers.fs.airlock.limits.memoryBytes');
    expect(field({ workspace: { hostDir: '/proc', mode: 'ro' } })).toBe(
      'mcpServers.fs.airlock.workspace.hostDir',
    );
    expect(field({ network: { allow: ['*'] } })).toBe('mcpServers.fs.airlock.network.allow.0');
    expect(field({ tools: { allow: ['!x'] } })).toBe('mcpServers.fs.airlock.tools.allow.0');
    expect(field({ tools: { arguments: { w: { schema: { type: 'nope' } } } } })).toBe(
      'mcpServers.fs.airlock.tools.arguments.w.schema',
    );
    expect(field({ budgets: { maxCalls: 0 } })).toBe('mcpServers.fs.airlock.budgets.maxCalls');
    expect(field({ scan: { quarantine: 'severe' } })).toBe('mcpServers.fs.airlock.scan.quarantine');
    expect(field({ output: { maxTextBytes: 1 } })).toBe('mcpServers.fs.airlock.output.maxTextBytes');
    expect(field({ boundry: 'per-call' })).toBe('mcpServers.fs.airlock.boundry');
    expect(field({ secrets: [{ name: 'T', value: { fromEnv: 'T' }, hosts: ['api.github.com'] }] })).toBe(
      'mcpServers.fs.airlock.secrets',
    );
    expect(
      field({
        network: { allow: ['example.com'] },
        secrets: [{ name: 'T', value: { fromEnv: 'T' }, hosts: ['api.github.com'] }],
      }),
    ).toBe('mcpServers.fs.airlock.secrets.0.hosts.0');
  });

  it('keeps namespaces unique (ignoring case); false opts out', () => {
    const e = configError({
      mcpServers: {
        a: { command: 'x', airlock: { namespace: 'Files' } },
        b: { command: 'y', airlock: { namespace: 'files' } },
      },
    });
    expect(e.field).toBe('mcpServers.b.airlock.namespace');
    expect(e.message).toContain('already used by server a');
    expect(
      configError({ mcpServers: { a: { command: 'x' }, b: { command: 'y', airlock: { namespace: 'a' } } } })
        .field,
    ).toBe('mcpServers.b.airlock.namespace');
    const ok = parseGatewayConfig({
      mcpServers: {
        a: { command: 'x', airlock: { namespace: false } },
        b: { command: 'y', airlock: { namespace: false } },
      },
    });
    expect(ok.mcpServers['a']!.airlock.namespace).toBe(false);
  });

  it('McpSandboxOptions parse on their own (airlock mcp flags)', () => {
    expect(parseMcpSandboxOptions({ network: { allow: ['pypi.org'] }, backend: 'gvisor' })).toMatchObject({
      backend: 'gvisor',
      network: { allow: ['pypi.org'] },
      secrets: [],
    });
    expect(() => parseMcpSandboxOptions({ tools: {} })).toThrow(
      expect.objectContaining({ code: 'MCP_INVALID_CONFIG' }),
    );
  });
});

describe('boundaries and budgets', () => {
  it('effectiveBoundary: own, else the gateway default, else per-session (HTTP) / per-server (stdio)', () => {
    const plain = parseGatewayConfig(server()).mcpServers['fs']!;
    expect(effectiveBoundary(plain, 'http')).toBe('per-session');
    expect(effectiveBoundary(plain, 'stdio')).toBe('per-server');
    expect(effectiveBoundary(plain, 'http', { defaultBoundary: 'per-tenant' })).toBe('per-tenant');
    const own = parseGatewayConfig(server({ boundary: 'per-call' })).mcpServers['fs']!;
    expect(effectiveBoundary(own, 'stdio', { defaultBoundary: 'per-tenant' })).toBe('per-call');
  });

  it('effectiveBudgets: gateway defaults overridden field by field', () => {
    const c = parseGatewayConfig({
      ...server({ budgets: { maxCalls: 5 } }),
      airlock: { budgets: { maxCalls: 50, maxOutputTokens: 1000 } },
    });
    expect(effectiveBudgets(c.mcpServers['fs']!, c.airlock)).toEqual({ maxCalls: 5, maxOutputTokens: 1000 });
  });
});

describe('gateway block', () => {
  it('derives allowed hosts from listen, binds loopback unless told otherwise', () => {
    const at = (listen: string, extra: object = {}) =>
      parseGatewayConfig({ ...server(), airlock: { listen, ...extra } }).airlock;
    expect(at('localhost:9000')).toMatchObject({
      listen: { host: 'localhost', port: 9000 },
      allowedHosts: ['localhost:9000', '127.0.0.1:9000'],
    });
    expect(at('[::1]:9000').allowedHosts).toEqual(['[::1]:9000', 'localhost:9000', '127.0.0.1:9000']);
    expect(at('127.0.0.2:1').listen).toEqual({ host: '127.0.0.2', port: 1 });
    expect(
      at('0.0.0.0:8787', { allowNonLoopback: true, allowedHosts: ['Gateway.Example.com:8787'] }),
    ).toMatchObject({
      listen: { host: '0.0.0.0', port: 8787 },
      allowedHosts: ['gateway.example.com:8787'],
    });
    const field = (airlock: unknown) => configError({ ...server(), airlock }).field;
    expect(configError({ ...server(), airlock: { listen: '0.0.0.0:8787' } }).message).toContain(
      'allowNonLoopback',
    );
    expect(field({ listen: '[::]:8787' })).toBe('airlock.listen');
    expect(field({ listen: 'gateway.example.com:8787' })).toBe('airlock.listen');
    expect(field({ listen: '8787' })).toBe('airlock.listen');
    expect(field({ listen: '127.0.0.1:0' })).toBe('airlock.listen');
    expect(field({ listen: '127.0.0.1:70000' })).toBe('airlock.listen');
    expect(field({ allowedHosts: ['*.example.com'] })).toBe('airlock.allowedHosts.0');
  });

  it('validates origins', () => {
    const a = parseGatewayConfig({
      ...server(),
      airlock: { allowedOrigins: ['https://App.Example.com', 'http://localhost:3000/'] },
    });
    expect(a.airlock.allowedOrigins).toEqual(['https://app.example.com', 'http://localhost:3000']);
    for (const o of ['*', 'null', 'https://x.example/path', 'ftp://x.example', 'not a url']) {
      expect(configError({ ...server(), airlock: { allowedOrigins: [o] } }).field).toBe(
        'airlock.allowedOrigins.0',
      );
    }
  });

  it('checks tenants: one token source each, long and distinct tokens, unique names', () => {
    const field = (tenants: unknown) => configError({ ...server(), airlock: { tenants } }).field;
    const short = configError({ ...server(), airlock: { tenants: [{ name: 'a', token: 'abc' }] } });
    expect(short.field).toBe('airlock.tenants.0.token');
    expect(short.message).toContain('openssl rand -hex 32');
    expect(field([{ name: 'a', token: 'x'.repeat(40) }])).toBe('airlock.tenants.0.token');
    expect(field([{ name: 'a' }])).toBe('airlock.tenants.0');
    expect(field([{ name: 'a', token: TOKEN_A, tokenEnv: 'X' }])).toBe('airlock.tenants.0');
    expect(field([{ name: 'a', tokenFile: 'relative' }])).toBe('airlock.tenants.0.tokenFile');
    expect(field([{ name: 'a b', token: TOKEN_A }])).toBe('airlock.tenants.0.name');
    expect(
      field([
        { name: 'a', token: TOKEN_A },
        { name: 'b', token: TOKEN_A },
      ]),
    ).toBe('airlock.tenants.1.token');
    expect(
      field([
        { name: 'a', token: TOKEN_A },
        { name: 'a', token: TOKEN_B },
      ]),
    ).toBe('airlock.tenants.1.name');
  });

  it('requireTenants refuses an HTTP gateway without tenants, saying how to add one', () => {
    const none = parseGatewayConfig(server());
    expect(() => requireTenants(none)).toThrow(
      expect.objectContaining({ code: 'MCP_INVALID_CONFIG', field: 'airlock.tenants' }),
    );
    expect(() => requireTenants(none)).toThrow(/openssl rand -hex 32/);
    const some = parseGatewayConfig({
      ...server(),
      airlock: { tenants: [{ name: 'alice', token: TOKEN_A }] },
    });
    expect(() => requireTenants(some)).not.toThrow();
  });

  it('resolveTenants reads inline tokens, the environment and token files', () => {
    const file = write('bob.token', `${TOKEN_B}\n`);
    const c = parseGatewayConfig({
      ...server(),
      airlock: {
        tenants: [
          { name: 'alice', token: TOKEN_A },
          { name: 'carol', tokenEnv: 'CAROL_TOKEN' },
          { name: 'bob', tokenFile: file },
        ],
      },
    });
    const carol = 'c'.repeat(8) + '0123456789abcdef0123456789abcdef';
    expect(resolveTenants(c, { CAROL_TOKEN: carol })).toEqual([
      { name: 'alice', token: TOKEN_A },
      { name: 'carol', token: carol },
      { name: 'bob', token: TOKEN_B },
    ]);
    const err = (env: Record<string, string>) => {
      try {
        resolveTenants(c, env);
      } catch (e) {
        return e as AirlockError;
      }
      throw new Error('expected an error');
    };
    expect(err({})).toMatchObject({ code: 'MCP_INVALID_CONFIG', field: 'airlock.tenants.1.tokenEnv' });
    expect(err({}).message).toContain('CAROL_TOKEN is not set');
    expect(err({ CAROL_TOKEN: 'short' }).field).toBe('airlock.tenants.1.tokenEnv');
    expect(err({ CAROL_TOKEN: TOKEN_A }).message).toContain('same token as tenant alice');
  });

  it('refuses token files other users can read, and missing ones', () => {
    const open = write('open.token', TOKEN_B, 0o644);
    const tenants = (tokenFile: string) =>
      parseGatewayConfig({ ...server(), airlock: { tenants: [{ name: 'bob', tokenFile }] } });
    expect(() => resolveTenants(tenants(open), {})).toThrow(/chmod 600/);
    expect(() => resolveTenants(tenants(join(dir, 'missing.token')), {})).toThrow(
      expect.objectContaining({ code: 'FILE_NOT_FOUND' }),
    );
  });
});

describe('loadGatewayConfig', () => {
  it('reads YAML by extension, resolving the lockfile next to the config', () => {
    const path = write(
      'gateway.yaml',
      [
        'mcpServers:',
        '  fs:',
        '    command: npx',
        '    args: [-y, "@modelcontextprotocol/server-filesystem", /data]',
        '    airlock:',
        '      boundary: per-session',
        '      tools: { allow: [read_*] }',
        'airlock:',
        '  lockfile: locks/airlock.lock.json',
        `  tenants: [{ name: alice, token: "${TOKEN_A}" }]`,
        '',
      ].join('\n'),
    );
    const c = loadGatewayConfig(path);
    expect(c.mcpServers['fs']!.airlock.boundary).toBe('per-session');
    expect(c.airlock.lockfile).toBe(join(dir, 'locks/airlock.lock.json'));
    expect(c.airlock.tenants).toEqual([{ name: 'alice', token: TOKEN_A }]);
  });

  it('names the file and the field in errors', () => {
    const path = write('bad.json', JSON.stringify(server({ boundary: 'sometimes' })));
    try {
      loadGatewayConfig(path);
      expect.unreachable();
    } catch (e) {
      expect(e).toMatchObject({ code: 'MCP_INVALID_CONFIG', field: 'mcpServers.fs.airlock.boundary' });
      expect((e as Error).message).toContain(
        `invalid gateway config ${path} at mcpServers.fs.airlock.boundary`,
      );
    }
  });

  it('reports unreadable, malformed and missing files', () => {
    expect(() => loadGatewayConfig(write('broken.json', '{ "mcpServers": '))).toThrow(
      expect.objectContaining({
        code: 'MCP_INVALID_CONFIG',
        message: expect.stringContaining('not valid JSON'),
      }),
    );
    expect(() => loadGatewayConfig(write('dup.yaml', 'mcpServers: {}\nmcpServers: {}\n'))).toThrow(
      expect.objectContaining({ code: 'MCP_INVALID_CONFIG' }),
    );
    expect(() => loadGatewayConfig(write('list.json', '[]'))).toThrow(/expected an object/);
    expect(() => loadGatewayConfig(join(dir, 'nope.json'))).toThrow(
      expect.objectContaining({ code: 'FILE_NOT_FOUND' }),
    );
  });
});
