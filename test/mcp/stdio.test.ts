// `airlock mcp` end to end: the real CLI as a child process (test/mcp/harness.ts startCli), an MCP
// client on its stdio, and real servers behind it in real sandboxes: the npm reference servers
// (filesystem, everything, memory, from ./node_modules) and the hostile fixture. Then `mcp scan|pin|diff`
// and bad input as plain child processes, and finally no residue on the host.
import { spawn } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import {
  chmodSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  readdirSync,
  rmSync,
  statSync,
  unlinkSync,
  writeFileSync,
} from 'node:fs';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import {
  McpError,
  ToolListChangedNotificationSchema,
  type CallToolResult,
} from '@modelcontextprotocol/sdk/types.js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import {
  NO_RESIDUE,
  SKIP_REASON,
  TEST_STATE_DIR,
  TEST_UID_RANGE,
  canRunGvisor,
  canRunNamespaces,
  residue,
  type Residue,
} from '../helpers.js';
import { MountSchema } from '../../src/core/spec.js';
import { RELOCATED_MOUNTS_ROOT } from '../../src/mcp/command.js';
import { FIXTURE, ROOT, startCli } from './harness.js';

/** Where this checkout's files appear in a server's sandbox (relocated when it lives under /tmp or /home). */
const ROOT_INSIDE = MountSchema.safeParse({ hostPath: ROOT, path: ROOT }).success
  ? ROOT
  : `${RELOCATED_MOUNTS_ROOT}/0${ROOT}`;

type Cli = Awaited<ReturnType<typeof startCli>>;

const FILESYSTEM = ['npx', '-y', '@modelcontextprotocol/server-filesystem'];
const EVERYTHING = ['npx', '-y', '@modelcontextprotocol/server-everything'];
const MEMORY = ['npx', '-y', '@modelcontextprotocol/server-memory'];
const HOSTILE = FIXTURE('hostile-server.ts');
/** The fixture's homoglyph tool: `read_file` with a Cyrillic a (U+0430). */
const HOMOGLYPH_READ_FILE = 're\u0430d_file';
/** JSON-RPC code of Airlock's own refusals (src/mcp/session.ts AIRLOCK_RPC_ERRORS.denied). */
const DENIED = -32010;

/** All text items of a result, joined. */
function text(r: CallToolResult | Awaited<ReturnType<Client['callTool']>>): string {
  const content = (r as CallToolResult).content ?? [];
  return content.map((c) => (c.type === 'text' ? c.text : '')).join('\n');
}

function provenance(r: Awaited<ReturnType<Client['callTool']>>): Record<string, unknown> {
  return (r._meta?.['airlock/provenance'] ?? {}) as Record<string, unknown>;
}

/** The McpError a call was refused with (fails the test if it was not refused). */
async function rpcError(p: Promise<unknown>): Promise<McpError> {
  const e: unknown = await p.then(
    (r) => new Error(`expected an MCP error, got a result: ${JSON.stringify(r).slice(0, 500)}`),
    (err: unknown) => err,
  );
  if (!(e instanceof McpError)) throw e;
  return e;
}

async function waitFor<T>(read: () => T, ok: (v: T) => boolean, timeoutMs = 10_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let v = read();
  while (!ok(v) && Date.now() < deadline) {
    await sleep(25);
    v = read();
  }
  return v;
}

/** Every file and dir under `dir`: relative path, mode and (files) size and sha256 of the bytes. */
function snapshot(dir: string): string[] {
  const out: string[] = [];
  const walk = (rel: string): void => {
    for (const name of readdirSync(join(dir, rel)).sort()) {
      const p = join(rel, name);
      const st = statSync(join(dir, p));
      const mode = (st.mode & 0o7777).toString(8);
      if (st.isDirectory()) {
        out.push(`${p}/ ${mode}`);
        walk(p);
      } else {
        const sha = createHash('sha256')
          .update(readFileSync(join(dir, p)))
          .digest('hex');
        out.push(`${p} ${mode} ${st.size} ${sha}`);
      }
    }
  };
  walk('');
  return out;
}

/** A host dir the sandbox uid can read (mkdtemp makes 0700), under /var/tmp: /tmp is the sandbox's own. */
function hostDir(tag: string): string {
  const dir = mkdtempSync(`/var/tmp/airlock-stdio-${tag}-`);
  chmodSync(dir, 0o755);
  return dir;
}

interface CliResult {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** `airlock <args>` as a child process on the test state dir and uid range, stdin closed. */
function airlock(args: string[], timeoutMs = 45_000): Promise<CliResult> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ['--import', 'tsx', `${ROOT}/src/cli/main.ts`, ...args], {
      cwd: ROOT,
      env: {
        PATH: process.env.PATH ?? '/usr/bin:/bin',
        HOME: process.env.HOME ?? '/root',
        AIRLOCK_STATE_DIR: TEST_STATE_DIR,
        AIRLOCK_UID_RANGE: `${TEST_UID_RANGE.first}:${TEST_UID_RANGE.count}`,
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (t: string) => (stdout += t));
    child.stderr.setEncoding('utf8').on('data', (t: string) => (stderr += t));
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`airlock ${args.join(' ')} did not exit within ${timeoutMs} ms; stderr: ${stderr}`));
    }, timeoutMs);
    child.on('error', reject);
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
  });
}

/** The hostile fixture's `steal` report (hostile data: parsed, not trusted). */
const StealReport = z.object({
  files: z.array(
    z.object({
      path: z.string(),
      ok: z.boolean(),
      kind: z.enum(['file', 'dir']).optional(),
      entries: z.array(z.string()).optional(),
      preview: z.string().optional(),
      error: z.string().optional(),
    }),
  ),
  env: z.array(z.object({ name: z.string(), value: z.string() })),
  network: z.object({
    skipped: z.boolean(),
    attempts: z.array(
      z.object({
        url: z.string(),
        ok: z.boolean(),
        status: z.number().optional(),
        error: z.string().optional(),
      }),
    ),
  }),
});

/** One line of `--audit-log` (the fields asserted here). */
const AuditLine = z.object({
  kind: z.enum(['mcp', 'egress']),
  method: z.string().optional(),
  tool: z.string().optional(),
  decision: z.string(),
  code: z.string().optional(),
  reason: z.string(),
  bytesUp: z.number(),
  bytesDown: z.number(),
  durationMs: z.number(),
  findings: z.array(z.object({ ruleId: z.string(), location: z.string() })).optional(),
});

if (canRunNamespaces) {
  describe('airlock mcp over stdio: the real CLI, real servers, real sandboxes', () => {
    describe('@modelcontextprotocol/server-filesystem with --workspace DIR:cow', () => {
      let dir: string;
      let before: string[];
      let cli: Cli;

      beforeAll(async () => {
        dir = hostDir('fs');
        writeFileSync(join(dir, 'hello.txt'), 'hello from the host\n');
        mkdirSync(join(dir, 'sub'), { mode: 0o755 });
        writeFileSync(join(dir, 'sub', 'data.bin'), randomBytes(4096));
        before = snapshot(dir);
        cli = await startCli(['--workspace', `${dir}:cow`, '--', ...FILESYSTEM, '/workspace']);
      });
      afterAll(async () => {
        await cli?.close();
        if (dir) rmSync(dir, { recursive: true, force: true });
      });

      it('lists the server’s tools, each result carrying Airlock provenance', async () => {
        const names = (await cli.client.listTools()).tools.map((t) => t.name);
        expect(names).toEqual(
          expect.arrayContaining(['read_text_file', 'write_file', 'list_directory', 'create_directory']),
        );
        const r = await cli.client.callTool({ name: 'list_allowed_directories', arguments: {} });
        expect(text(r)).toContain('/workspace');
        expect(provenance(r)).toMatchObject({
          server: 'server-filesystem',
          tool: 'list_allowed_directories',
          truncated: false,
          redacted: false,
          flagged: false,
        });
        expect(provenance(r).sandboxId).toMatch(/^sbx-/);
      });

      it('reads a host file through /workspace', async () => {
        const r = await cli.client.callTool({
          name: 'read_text_file',
          arguments: { path: '/workspace/hello.txt' },
        });
        expect(r.isError).toBeFalsy();
        expect(text(r)).toBe('hello from the host\n');
      });

      it('writes (new files, an overwrite, a dir) and reads them back; the host dir stays byte-for-byte the same', async () => {
        const call = (name: string, args: Record<string, unknown>) =>
          cli.client.callTool({ name, arguments: args });
        for (const r of [
          await call('write_file', { path: '/workspace/new.txt', content: 'written in the sandbox' }),
          await call('write_file', { path: '/workspace/hello.txt', content: 'overwritten' }),
          await call('create_directory', { path: '/workspace/made/here' }),
          await call('write_file', { path: '/workspace/made/here/x.txt', content: 'deep' }),
        ])
          expect(r.isError, text(r)).toBeFalsy();

        expect(text(await call('read_text_file', { path: '/workspace/new.txt' }))).toBe(
          'written in the sandbox',
        );
        expect(text(await call('read_text_file', { path: '/workspace/hello.txt' }))).toBe('overwritten');
        expect(text(await call('read_text_file', { path: '/workspace/made/here/x.txt' }))).toBe('deep');
        const listing = text(await call('list_directory', { path: '/workspace' }));
        expect(listing).toContain('[FILE] new.txt');
        expect(listing).toContain('[DIR] made');

        // Copy-on-write: every change stayed in the sandbox.
        expect(snapshot(dir)).toEqual(before);
        expect(readFileSync(join(dir, 'hello.txt'), 'utf8')).toBe('hello from the host\n');
        expect(existsSync(join(dir, 'new.txt'))).toBe(false);
      });
    });

    describe('@modelcontextprotocol/server-filesystem allowed to read `/`', () => {
      let cli: Cli;
      let hostOnly: string;
      const call = async (name: string, path: string) => cli.client.callTool({ name, arguments: { path } });

      beforeAll(async () => {
        hostOnly = hostDir('secret');
        writeFileSync(join(hostOnly, 'host-only.txt'), `host only ${randomBytes(8).toString('hex')}\n`);
        chmodSync(join(hostOnly, 'host-only.txt'), 0o644);
        cli = await startCli(['--', ...FILESYSTEM, '/']);
      });
      afterAll(async () => {
        await cli?.close();
        if (hostOnly) rmSync(hostOnly, { recursive: true, force: true });
      });

      it('`/` is the sandbox layout, not the host’s', async () => {
        const r = await call('list_directory', '/');
        expect(r.isError).toBeFalsy();
        const entries = text(r)
          .split('\n')
          .map((l) => l.replace(/^\[(FILE|DIR)\] /, ''));
        expect(entries).toEqual(expect.arrayContaining(['usr', 'tmp', 'proc', 'workspace']));
        for (const hostOnlyDir of ['root', 'var', 'boot', 'srv', 'mnt', 'media', 'run', 'sys', 'lost+found'])
          expect(entries).not.toContain(hostOnlyDir);
        // Nothing else: the layout, plus the top of the path where the package tree is mounted (read-only).
        const layout = [
          'bin',
          'dev',
          'etc',
          'home',
          'lib',
          'lib32',
          'lib64',
          'libx32',
          'opt',
          'proc',
          'sbin',
        ];
        const allowed = [...layout, 'tmp', 'usr', 'workspace', ROOT_INSIDE.split('/')[1]];
        expect(entries.filter((e) => !allowed.includes(e))).toEqual([]);
      });

      it('host secrets and host files outside the sandbox are not there', async () => {
        for (const path of [
          '/etc/shadow',
          '/root/.bash_history',
          '/root/.ssh/id_rsa',
          join(hostOnly, 'host-only.txt'),
        ]) {
          const r = await call('read_text_file', path);
          expect(r.isError, `${path}: ${text(r)}`).toBe(true);
          expect(text(r)).toMatch(/ENOENT|not found|no such file/i);
        }
        for (const path of ['/root', '/var', '/var/tmp', hostOnly]) {
          const r = await call('list_directory', path);
          expect(r.isError, `${path}: ${text(r)}`).toBe(true);
        }
        // The package's own tree is mounted, nothing else of the project around it.
        expect(text(await call('list_directory', ROOT_INSIDE))).toBe('[DIR] node_modules');
      });

      it('/proc shows only the sandbox’s own processes', async () => {
        const r = await call('list_directory', '/proc');
        expect(r.isError).toBeFalsy();
        const pids = text(r)
          .split('\n')
          .map((l) => l.replace(/^\[(FILE|DIR)\] /, ''))
          .filter((e) => /^\d+$/.test(e));
        const hostPids = readdirSync('/proc').filter((e) => /^\d+$/.test(e));
        expect(pids.length).toBeGreaterThan(0);
        expect(pids.length).toBeLessThanOrEqual(8);
        expect(hostPids.length).toBeGreaterThan(pids.length);
        // Each one is the sandbox's init or this server (none of the host's: no vitest, no shell, no init).
        for (const pid of pids) {
          const cmdline = text(await call('read_text_file', `/proc/${pid}/cmdline`));
          expect(cmdline, `pid ${pid}`).toMatch(/^\/usr\/bin\/(bwrap|node)\0/);
          expect(cmdline, `pid ${pid}`).toContain('server-filesystem');
        }
      });

      it('writes land in the sandbox’s private /tmp (not the host’s) and the package tree is read-only', async () => {
        const name = `airlock-stdio-probe-${randomBytes(6).toString('hex')}`;
        const w = await cli.client.callTool({
          name: 'write_file',
          arguments: { path: `/tmp/${name}`, content: 'probe' },
        });
        expect(w.isError, text(w)).toBeFalsy();
        expect(text(await call('read_text_file', `/tmp/${name}`))).toBe('probe');
        expect(existsSync(`/tmp/${name}`)).toBe(false);
        const ro = await cli.client.callTool({
          name: 'write_file',
          arguments: { path: `${ROOT_INSIDE}/node_modules/${name}`, content: 'x' },
        });
        expect(ro.isError).toBe(true);
        expect(existsSync(`${ROOT}/node_modules/${name}`)).toBe(false);
      });
    });

    describe('@modelcontextprotocol/server-everything (default stdio mode)', () => {
      let cli: Cli;
      const hostCanary = `host-canary-${randomBytes(8).toString('hex')}`;

      beforeAll(async () => {
        cli = await startCli(['-e', 'GREETING=hello-from-flag', '--', ...EVERYTHING], {
          env: { AIRLOCK_STDIO_HOST_CANARY: hostCanary },
        });
      });
      afterAll(() => cli?.close());

      it('mirrors the server (info, instructions) and lists its tools', async () => {
        expect(cli.client.getServerVersion()?.title).toMatch(/\(via Airlock\)$/);
        const names = (await cli.client.listTools()).tools.map((t) => t.name);
        expect(names).toEqual(
          expect.arrayContaining(['echo', 'get-sum', 'get-env', 'get-structured-content']),
        );
      });

      it('echo, get-sum and get-structured-content work through the gateway', async () => {
        const echo = await cli.client.callTool({ name: 'echo', arguments: { message: 'through airlock' } });
        expect(text(echo)).toBe('Echo: through airlock');
        expect(provenance(echo)).toMatchObject({ server: 'server-everything', tool: 'echo' });
        const sum = await cli.client.callTool({ name: 'get-sum', arguments: { a: 2, b: 40 } });
        expect(text(sum)).toMatch(/\b42\b/);
        const sc = await cli.client.callTool({
          name: 'get-structured-content',
          arguments: { location: 'Chicago' },
        });
        expect(sc.structuredContent).toEqual(
          expect.objectContaining({ temperature: expect.any(Number), conditions: expect.any(String) }),
        );
      });

      it('the server sees its -e variables and nothing of the host env', async () => {
        const env = z
          .record(z.string(), z.string())
          .parse(JSON.parse(text(await cli.client.callTool({ name: 'get-env', arguments: {} }))));
        expect(env.GREETING).toBe('hello-from-flag');
        expect(JSON.stringify(env)).not.toContain(hostCanary);
        expect(Object.keys(env).filter((k) => k.startsWith('AIRLOCK_'))).toEqual([]);
        expect(env.HOME).not.toBe(process.env.HOME);
      });
    });

    describe.skipIf(!canRunGvisor)('an MCP server on the gVisor tier (--backend gvisor)', () => {
      it('server-memory runs under gVisor: tools work and its package is mounted read-only', async () => {
        // Its own package is read-only in the sandbox: the default memory file next to it cannot be written.
        const ro = await startCli(['--backend', 'gvisor', '--', ...MEMORY]);
        try {
          const denied = await ro.client.callTool({
            name: 'create_entities',
            arguments: { entities: [{ name: 'X', entityType: 't', observations: [] }] },
          });
          expect(text(denied)).toMatch(/EACCES|EROFS|read-only/);
        } finally {
          await ro.close();
        }
        const cli = await startCli([
          '--backend',
          'gvisor',
          '-e',
          'MEMORY_FILE_PATH=/workspace/memory.jsonl',
          '--',
          ...MEMORY,
        ]);
        try {
          const created = await cli.client.callTool({
            name: 'create_entities',
            arguments: {
              entities: [{ name: 'Gv', entityType: 'tier', observations: ['user-space kernel'] }],
            },
          });
          expect(created.isError, text(created)).toBeFalsy();
          const graph = await cli.client.callTool({ name: 'read_graph', arguments: {} });
          expect(graph.structuredContent).toMatchObject({
            entities: [expect.objectContaining({ name: 'Gv', entityType: 'tier' })],
          });
        } finally {
          await cli.close();
        }
      }, 60_000);
    });

    describe('@modelcontextprotocol/server-memory with MEMORY_FILE_PATH in /workspace', () => {
      let dir: string;
      const args = (): string[] => [
        '--workspace',
        `${dir}:cow`,
        '-e',
        'MEMORY_FILE_PATH=/workspace/memory.jsonl',
        '--',
        ...MEMORY,
      ];

      beforeAll(() => {
        dir = hostDir('mem');
      });
      afterAll(() => {
        if (dir) rmSync(dir, { recursive: true, force: true });
      });

      it('create_entities then read_graph returns them; the memory file never reaches the host', async () => {
        const before = snapshot(dir);
        const cli = await startCli(args());
        try {
          const created = await cli.client.callTool({
            name: 'create_entities',
            arguments: {
              entities: [
                { name: 'Ada', entityType: 'person', observations: ['wrote the first program'] },
                { name: 'Airlock', entityType: 'tool', observations: ['sandboxes MCP servers'] },
              ],
            },
          });
          expect(created.isError, text(created)).toBeFalsy();
          await cli.client.callTool({
            name: 'create_relations',
            arguments: { relations: [{ from: 'Ada', to: 'Airlock', relationType: 'would have liked' }] },
          });
          // The server re-reads its file on every call: this comes from /workspace/memory.jsonl.
          const graph = await cli.client.callTool({ name: 'read_graph', arguments: {} });
          expect(graph.structuredContent).toMatchObject({
            entities: expect.arrayContaining([
              expect.objectContaining({ name: 'Ada', observations: ['wrote the first program'] }),
              expect.objectContaining({ name: 'Airlock', entityType: 'tool' }),
            ]),
            relations: [{ from: 'Ada', to: 'Airlock', relationType: 'would have liked' }],
          });
          expect(snapshot(dir)).toEqual(before);
          expect(existsSync(join(dir, 'memory.jsonl'))).toBe(false);
        } finally {
          await cli.close();
        }
        expect(snapshot(dir)).toEqual(before);
        expect(existsSync(`${ROOT}/node_modules/@modelcontextprotocol/server-memory/dist/memory.jsonl`)).toBe(
          false,
        );
        // A new sandbox starts from the host dir again: the graph went with the old one.
        const again = await startCli(args());
        try {
          const graph = await again.client.callTool({ name: 'read_graph', arguments: {} });
          expect(graph.structuredContent).toEqual({ entities: [], relations: [] });
        } finally {
          await again.close();
        }
      });
    });

    describe('hostile fixture: rug pull, rename and the audit log', () => {
      let cli: Cli;
      let logDir: string;
      let auditLog: string;
      const audit = (): Array<z.infer<typeof AuditLine>> =>
        existsSync(auditLog)
          ? readFileSync(auditLog, 'utf8')
              .split('\n')
              .filter((l) => l !== '')
              .map((l) => AuditLine.parse(JSON.parse(l)))
          : [];

      beforeAll(async () => {
        logDir = hostDir('audit');
        auditLog = join(logDir, 'audit.jsonl');
        cli = await startCli(['--audit-log', auditLog, '--', ...HOSTILE]);
      });
      afterAll(async () => {
        await cli?.close();
        if (logDir) rmSync(logDir, { recursive: true, force: true });
      });

      it('weather is allowed once, then (list_changed) it is gone and refused as quarantined', async () => {
        // The gateway lists at session start and pins what it saw (the fixture's innocent list #1). The
        // client calls weather before listing (its own tools/list would be the fixture's changed #2).
        const listed = await waitFor(audit, (a) => a.some((e) => e.method === 'tools/list'));
        expect(listed.length).toBeGreaterThan(0);
        let listChanged = false;
        cli.client.setNotificationHandler(ToolListChangedNotificationSchema, () => void (listChanged = true));

        const first = await cli.client.callTool({ name: 'weather', arguments: { city: 'Oslo' } });
        expect(text(first)).toBe('Sunny, 21°C in Oslo');
        expect(provenance(first)).toMatchObject({ server: 'hostile-server', tool: 'weather' });

        // During that call the server announced a changed list; the gateway re-listed and told us.
        expect(await waitFor(() => listChanged, Boolean, 15_000)).toBe(true);
        const names = (await cli.client.listTools()).tools.map((t) => t.name);
        expect(names).toContain('echo');
        expect(names).not.toContain('weather');
        expect(names).not.toContain('fetch_data');
        expect(names).not.toContain('fetch_data_v2');

        const e = await rpcError(cli.client.callTool({ name: 'weather', arguments: { city: 'Oslo' } }));
        expect(e.code).toBe(DENIED);
        expect(e.data).toEqual({ airlock: { code: 'quarantined' } });
        expect(e.message).toMatch(/blocked by Airlock: tool weather of server hostile-server is quarantined/);
        const ruleIds = audit().flatMap((x) =>
          (x.findings ?? []).filter((f) => f.location.includes('weather')).map((f) => f.ruleId),
        );
        expect(ruleIds).toEqual(expect.arrayContaining(['definition-changed', 'schema-widened']));
      });

      it('the renamed fetch_data_v2 never becomes callable', async () => {
        const e = await rpcError(cli.client.callTool({ name: 'fetch_data_v2', arguments: { key: 'k' } }));
        expect(e.code).toBe(DENIED);
        expect(e.data).toEqual({ airlock: { code: 'quarantined' } });
        expect(e.message).toMatch(/fetch_data_v2.*fetch_data.*renamed/);
        expect((await cli.client.listTools()).tools.map((t) => t.name)).not.toContain('fetch_data_v2');
        // The old name is gone from the server: an unknown tool, not a call to the new one.
        const old = await rpcError(cli.client.callTool({ name: 'fetch_data', arguments: { key: 'k' } }));
        expect(old.code).toBe(-32602);
      });

      it('the JSONL audit log has quarantine and deny verdicts, and calls with bytes and durations', async () => {
        await cli.client.callTool({ name: 'echo', arguments: { text: 'for the audit log' } });
        const events = await waitFor(audit, (a) =>
          a.some((e) => e.method === 'tools/call' && e.tool === 'echo' && e.decision === 'allow'),
        );
        const quarantines = events.filter((e) => e.kind === 'mcp' && e.decision === 'quarantine');
        expect(quarantines.map((e) => e.code)).toEqual(
          expect.arrayContaining([
            'hidden-instruction',
            'invisible-unicode',
            'homoglyph-name',
            'definition-changed',
            'definition-renamed',
          ]),
        );
        const denies = events.filter((e) => e.method === 'tools/call' && e.decision === 'deny');
        expect(denies).toEqual(
          expect.arrayContaining([
            expect.objectContaining({ tool: 'weather', code: 'quarantined' }),
            expect.objectContaining({ tool: 'fetch_data_v2', code: 'quarantined' }),
          ]),
        );
        const calls = events.filter((e) => e.method === 'tools/call' && e.decision === 'allow');
        expect(calls.map((e) => e.tool)).toEqual(['weather', 'echo']);
        for (const c of calls) {
          expect(c.bytesUp).toBeGreaterThan(0);
          expect(c.bytesDown).toBeGreaterThan(0);
          expect(c.durationMs).toBeGreaterThan(0);
        }
      });
    });

    describe('hostile fixture: quarantine, containment and the output guard', () => {
      let cli: Cli;
      let dir: string;
      let hostFile: string;
      // Present in the CLI's own env: the sandboxed server must never see it.
      const hostToken = ['host', 'token', randomBytes(12).toString('hex')].join('-');

      beforeAll(async () => {
        dir = hostDir('hostile');
        hostFile = join(dir, 'host-secret.txt');
        writeFileSync(hostFile, 'host secret\n', { mode: 0o644 });
        cli = await startCli(['--', ...HOSTILE], {
          env: { GITHUB_TOKEN: hostToken, AWS_SECRET_KEY: hostToken },
        });
      });
      afterAll(async () => {
        await cli?.close();
        if (dir) rmSync(dir, { recursive: true, force: true });
      });

      it('hides the poisoned, tag-character and homoglyph tools (and the already changed weather)', async () => {
        const names = (await cli.client.listTools()).tools.map((t) => t.name);
        expect(names).toEqual(expect.arrayContaining(['echo', 'steal', 'flood', 'leak_secret', 'inject']));
        for (const hidden of ['add', 'translate', HOMOGLYPH_READ_FILE, 'weather', 'fetch_data_v2'])
          expect(names).not.toContain(hidden);
      });

      it('refuses calls to them with -32010 quarantined and the reason', async () => {
        const cases: Array<[string, Record<string, unknown>, RegExp]> = [
          [
            'add',
            { a: 1, b: 2, sidenote: 'x' },
            /tool add .*quarantined: (hidden-instruction|secrecy|sensitive-path|exfiltration|instruction-override)/,
          ],
          // Scanner v2 also decodes the hidden text and finds what it asks for (exfiltration).
          [
            'translate',
            { text: 'x' },
            /tool translate .*quarantined: (invisible-unicode|exfiltration|instruction-override|secrecy)/,
          ],
          [HOMOGLYPH_READ_FILE, { path: '/etc/passwd' }, /quarantined: homoglyph-name .*read_file/],
        ];
        for (const [name, args, reason] of cases) {
          const e = await rpcError(cli.client.callTool({ name, arguments: args }));
          expect(e.code, name).toBe(DENIED);
          expect(e.data, name).toEqual({ airlock: { code: 'quarantined' } });
          expect(e.message, name).toMatch(reason);
        }
      });

      it('echo works', async () => {
        const r = await cli.client.callTool({ name: 'echo', arguments: { text: 'plain and simple' } });
        expect(text(r)).toBe('plain and simple');
        expect(r.isError).toBeFalsy();
      });

      it('steal: no host secret is readable and every network attempt fails (no network at all)', async () => {
        // A listener on the host's loopback: the sandbox's 127.0.0.1 is its own, so this stays unreached.
        let hits = 0;
        const listener = createServer((_req, res) => {
          hits++;
          res.end('reached the host');
        });
        await new Promise<void>((resolve) => listener.listen(0, '127.0.0.1', resolve));
        const port = (listener.address() as AddressInfo).port;
        let r: Awaited<ReturnType<Client['callTool']>>;
        try {
          r = await cli.client.callTool({
            name: 'steal',
            arguments: {
              paths: [hostFile, dir, '/var/tmp', '/root', '/etc/shadow', '/proc'],
              urls: ['http://1.1.1.1/', 'https://example.com/', `http://127.0.0.1:${port}/`],
              timeout_ms: 5_000,
            },
          });
        } finally {
          listener.closeAllConnections();
          await new Promise((resolve) => listener.close(resolve));
        }
        expect(hits).toBe(0);
        const report = StealReport.parse(JSON.parse(text(r)));
        const file = (p: string) => report.files.find((f) => f.path === p);
        for (const p of [hostFile, dir, '/var/tmp', '/root', '/etc/shadow', '/root/.ssh/id_rsa'])
          expect(file(p), p).toMatchObject({ ok: false, error: expect.stringMatching(/^ENOENT/) });
        for (const f of report.files.filter((x) => x.path.includes('.ssh'))) expect(f.ok, f.path).toBe(false);
        // (The fixture's own project dir is mounted read-only to run it, so its package.json is readable.)
        // /proc is the sandbox's: a handful of pids, and pid 1's environ holds no host variable.
        const pids = (file('/proc')?.entries ?? []).filter((e) => /^\d+$/.test(e));
        expect(pids.length).toBeGreaterThan(0);
        expect(pids.length).toBeLessThanOrEqual(8);
        expect(JSON.stringify(report)).not.toContain(hostToken);
        expect(report.env).toEqual([]);

        expect(report.network.skipped).toBe(false);
        expect(report.network.attempts).toHaveLength(6);
        for (const a of report.network.attempts) {
          expect(a.ok, a.url).toBe(false);
          expect(a.status, a.url).toBeUndefined();
          // No route and no resolver: it fails at once, not by timing out somewhere.
          expect(a.error, a.url).toMatch(/ENETUNREACH|EAI_AGAIN|ENOTFOUND|ECONNREFUSED/);
        }
      });

      it('flood: a 3 MB result comes back cut to 64 KB with the marker, provenance.truncated and the full spill', async () => {
        const bytes = 3_000_000;
        const r = await cli.client.callTool({ name: 'flood', arguments: { bytes } });
        const out = text(r);
        expect(Buffer.byteLength(out)).toBeLessThanOrEqual(64_000);
        expect(Buffer.byteLength(out)).toBeGreaterThan(60_000);
        expect(out.startsWith('flood line 0000000000 ')).toBe(true);
        const marker = /…\[airlock: (\d+) bytes truncated; full output kept in audit spill (\S+)\]…/.exec(
          out,
        );
        expect(marker).not.toBeNull();
        expect(Number(marker![1])).toBeGreaterThan(bytes - 64_000);
        const p = provenance(r);
        expect(p).toMatchObject({
          server: 'hostile-server',
          tool: 'flood',
          truncated: true,
          spillRef: marker![2],
        });
        const spill = String(p.spillRef);
        try {
          expect(statSync(spill).size).toBe(bytes);
          expect(statSync(spill).mode & 0o777).toBe(0o600);
        } finally {
          if (existsSync(spill)) unlinkSync(spill);
        }
      });

      it('flood: the fixture default of 5 MiB in one text item comes back truncated', async () => {
        const r = await cli.client.callTool({ name: 'flood', arguments: {} }, undefined, { timeout: 30_000 });
        expect(Buffer.byteLength(text(r))).toBeLessThanOrEqual(64_000);
        expect(text(r)).toMatch(/…\[airlock: \d+ bytes truncated; full output kept in audit spill (\S+)\]…/);
        expect(provenance(r)).toMatchObject({ tool: 'flood', truncated: true });
        const spill = String(provenance(r).spillRef);
        expect(statSync(spill).size).toBe(5 * 1024 * 1024);
        unlinkSync(spill);
      });

      it('leak_secret: a GitHub-shaped token and the AWS-shaped pair are redacted; the host token never got in', async () => {
        // Fake, built at run time so no token-shaped literal sits in the source.
        const fake = ['gh', 'p_', randomBytes(18).toString('hex').slice(0, 36)].join('');
        const awsKeyId = ['AKIA', 'AIRLOCK', 'FAKEKEY01'].join('');
        const r = await cli.client.callTool({ name: 'leak_secret', arguments: { literal: fake } });
        const out = text(r);
        expect(out).not.toContain(fake);
        expect(out).not.toContain(awsKeyId);
        expect(out).toContain('literal=[REDACTED:credential:github-token]');
        expect(out).toMatch(/aws_access_key_id = \[REDACTED:credential:/);
        expect(out).toContain('GITHUB_TOKEN=(unset)');
        expect(out).not.toContain(hostToken);
        expect(provenance(r)).toMatchObject({ redacted: true, tool: 'leak_secret' });
        expect(Number(provenance(r).redactions)).toBeGreaterThanOrEqual(3);
      });

      // inject (instruction-like text flagged, not altered): test/mcp/transport.contract.ts, both transports.
    });

    describe('hostile fixture with --junk-stdout', () => {
      let cli: Cli;
      beforeAll(async () => {
        cli = await startCli(['--', ...HOSTILE, '--junk-stdout']);
      });
      afterAll(() => cli?.close());

      it('the session works and the CLI’s stderr names the dropped broken frames', async () => {
        expect((await cli.client.listTools()).tools.map((t) => t.name)).toContain('echo');
        expect(text(await cli.client.callTool({ name: 'echo', arguments: { text: 'still here' } }))).toBe(
          'still here',
        );
        const dropped = (s: string) =>
          s.split('\n').filter((l) => l.includes('[airlock] dropped a broken frame from the server'));
        // Two junk lines before initialization and two after it.
        const lines = dropped(await waitFor(cli.stderr, (s) => dropped(s).length >= 4));
        expect(lines.length).toBeGreaterThanOrEqual(4);
        expect(lines.every((l) => l.startsWith('[hostile-server] '))).toBe(true);
      });
    });

    describe('airlock mcp scan | pin | diff', () => {
      let dir: string;
      beforeAll(() => {
        dir = hostDir('lock');
      });
      afterAll(() => {
        if (dir) rmSync(dir, { recursive: true, force: true });
      });

      it('scan --json on the hostile fixture exits 1 with high findings and their rule ids', async () => {
        const r = await airlock(['mcp', 'scan', '--json', '--', ...HOSTILE]);
        expect(r.code, r.stderr).toBe(1);
        const report = z
          .object({
            server: z.string(),
            tools: z.number(),
            findings: z.array(z.object({ ruleId: z.string(), severity: z.string(), location: z.string() })),
          })
          .parse(JSON.parse(r.stdout));
        expect(report.server).toBe('hostile-server');
        const high = report.findings.filter((f) => f.severity === 'high');
        expect(high.map((f) => `${f.ruleId} ${f.location}`)).toEqual(
          expect.arrayContaining([
            'hidden-instruction tools[add].description',
            'invisible-unicode tools[translate].description',
            `homoglyph-name tools[${HOMOGLYPH_READ_FILE}].name`,
            'secrecy instructions',
          ]),
        );
      });

      it('scan on server-memory exits 0 with no findings', async () => {
        const r = await airlock(['mcp', 'scan', '--json', '--', ...MEMORY]);
        expect(r.code, r.stderr).toBe(0);
        expect(JSON.parse(r.stdout)).toMatchObject({ server: 'server-memory', tools: 9, findings: [] });
      });

      it('pin writes a lockfile; diff against the same server exits 0, against another exits 1 with the changes', async () => {
        const lock = join(dir, 'airlock.lock.json');
        const pin = await airlock(['mcp', 'pin', '--lockfile', lock, '--name', 'mem', '--', ...MEMORY]);
        expect(pin.code, pin.stderr).toBe(0);
        expect(pin.stderr).toMatch(/pinned 9 tools, 0 prompts of mem in /);
        const written = z
          .object({
            servers: z.record(
              z.string(),
              z.object({ pin: z.object({ tools: z.record(z.string(), z.unknown()) }) }),
            ),
          })
          .parse(JSON.parse(readFileSync(lock, 'utf8')));
        expect(Object.keys(written.servers.mem!.pin.tools)).toEqual(
          expect.arrayContaining(['create_entities', 'read_graph']),
        );

        const same = await airlock(['mcp', 'diff', '--lockfile', lock, '--name', 'mem', '--', ...MEMORY]);
        expect(same.code, same.stderr).toBe(0);
        expect(same.stdout).toMatch(/Server "mem": matches the pin/);

        const other = await airlock([
          'mcp',
          'diff',
          '--lockfile',
          lock,
          '--name',
          'mem',
          '--',
          ...EVERYTHING,
        ]);
        expect(other.code, other.stderr).toBe(1);
        expect(other.stdout).toMatch(/Server "mem": differs from the pin/);
        expect(other.stdout).toContain('tool "echo" added');
        expect(other.stdout).toMatch(/tool "create_entities" removed/);
      });
    });

    describe('bad input', () => {
      it('an unsupported launcher (uvx) exits 2 with one line naming what is supported', async () => {
        const r = await airlock(['mcp', '--', 'uvx', 'something']);
        expect(r.code).toBe(2);
        expect(r.stdout).toBe('');
        const lines = r.stderr.split('\n').filter((l) => l !== '');
        expect(lines).toHaveLength(1);
        expect(lines[0]).toMatch(/^airlock: .*`uvx` is not supported/);
        expect(lines[0]).toMatch(/Supported: `npx`.*`node <script>`/);
      });

      it('an npm package that is not installed exits 2 with the "not installed" error', async () => {
        const r = await airlock(['mcp', '--', 'npx', '-y', '@airlock-test/not-an-installed-server']);
        expect(r.code).toBe(2);
        expect(r.stdout).toBe('');
        expect(r.stderr).toMatch(/@airlock-test\/not-an-installed-server is not installed/);
        expect(r.stderr.trim().split('\n')).toHaveLength(1);
      });

      it('a --policy file with an unknown key exits 2 naming the key', async () => {
        const dir = hostDir('policy');
        try {
          const policy = join(dir, 'policy.yaml');
          writeFileSync(policy, 'tools:\n  deny: [steal]\nnetwrok:\n  allow: [example.com]\n');
          const r = await airlock(['mcp', '--policy', policy, '--', ...MEMORY]);
          expect(r.code).toBe(2);
          expect(r.stdout).toBe('');
          expect(r.stderr).toMatch(/unknown field\(s\) "netwrok"/);
          expect(r.stderr.trim().split('\n')).toHaveLength(1);
        } finally {
          rmSync(dir, { recursive: true, force: true });
        }
      });
    });

    describe('afterwards', () => {
      it('leaves no residue on the host (mounts, cgroups, processes, sandbox dirs, uid leases)', async () => {
        const r = await waitFor<Residue>(
          () => residue(),
          (v) => JSON.stringify(v) === JSON.stringify(NO_RESIDUE),
          10_000,
        );
        expect(r).toEqual(NO_RESIDUE);
      });
    });
  });
} else {
  describe('airlock mcp over stdio', () => {
    it.skip(`the whole suite [skipped: ${SKIP_REASON}]`, () => {});
  });
}
