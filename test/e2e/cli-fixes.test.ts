// CLI fixes from a newcomer's trial: --backend lists only the tiers that exist, durations need a
// unit, `airlock run --template`, and the example in `airlock mcp --help` runs as written.
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Airlock } from '../../src/sandbox/airlock.js';
import {
  GVISOR_SKIP_REASON,
  SKIP_REASON,
  TEST_STATE_DIR,
  TEST_UID_RANGE,
  canRunGvisor,
  canRunNamespaces,
  testAirlock,
} from '../helpers.js';
import { ROOT, airlockCli } from './cli-support.js';

/** Every command that takes --backend. */
const BACKEND_COMMANDS = [
  ['run'],
  ['diff'],
  ['mcp'],
  ['mcp', 'scan'],
  ['mcp', 'pin'],
  ['mcp', 'diff'],
  ['template', 'build'],
];

describe('--backend lists only the tiers that exist', () => {
  it.each(BACKEND_COMMANDS)(
    'airlock %s --help offers namespaces, gvisor, microvm and wasm, nothing else',
    async (...cmd) => {
      const r = await airlockCli([...cmd, '--help']);
      expect(r.code).toBe(0);
      const backendLine = r.stdout.slice(r.stdout.indexOf('--backend'), r.stdout.indexOf('--backend') + 400);
      expect(backendLine.replace(/\s+/g, ' ')).toContain(
        '(choices: "namespaces", "gvisor", "microvm", "wasm")',
      );
      expect(r.stdout).not.toMatch(/firecracker/i);
    },
  );

  it.each(BACKEND_COMMANDS)(
    'airlock %s --backend firecracker exits 2 naming only real tiers',
    async (...cmd) => {
      const r = await airlockCli([...cmd, '--backend', 'firecracker', '--', 'true']);
      expect(r.code).toBe(2);
      expect(r.stderr).toContain('Allowed choices are namespaces, gvisor, microvm, wasm');
      expect(r.stderr).not.toMatch(/firecracker.*firecracker/); // the refused value only, never offered
    },
  );
});

describe('a duration without a unit is refused', () => {
  it.each([
    [['run', '--timeout', '30', '--', 'true'], '--timeout: "30" has no unit; write 30s or 30000ms'],
    [['run', '--ttl', '5', '--', 'true'], '--ttl: "5" has no unit; write 5s or 5000ms'],
    [['diff', '--timeout', '2', '--', 'true'], '--timeout: "2" has no unit; write 2s or 2000ms'],
    [['mcp', '--ttl', '5', '--', 'true'], '--ttl: "5" has no unit; write 5s or 5000ms'],
  ])('airlock %j exits 2 saying what to write', async (args, msg) => {
    const r = await airlockCli(args);
    expect(r.code).toBe(2);
    expect(r.stderr).toBe(`airlock: ${msg} (units: ms, s, m, h)\n`);
  });
});

describe('airlock run --template', () => {
  it('an unknown name or digest exits 2 naming --template and where to look', async () => {
    const name = `nope-${randomBytes(4).toString('hex')}`;
    const byName = await airlockCli(['run', '--template', name, '--', 'true']);
    expect(byName.code).toBe(2);
    expect(byName.stderr).toContain(`--template: no template ${name}`);
    expect(byName.stderr).toContain('airlock template ls');
    const digest = `sha256:${'0'.repeat(64)}`;
    const byDigest = await airlockCli(['run', '--template', digest, '--', 'true']);
    expect(byDigest.code).toBe(2);
    expect(byDigest.stderr).toContain(`--template: no template or snapshot ${digest}`);
    const bad = await airlockCli(['run', '--template', 'Not A Name', '--', 'true']);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toMatch(/^airlock: --template: /);
  });

  describe.skipIf(!canRunNamespaces)(`from built templates (${SKIP_REASON})`, () => {
    let airlock: Airlock;
    const nsName = `cli-ns-${randomBytes(4).toString('hex')}`;
    const gvName = `cli-gv-${randomBytes(4).toString('hex')}`;
    let nsDigest = '';
    beforeAll(async () => {
      airlock = testAirlock();
      const t = await airlock.templates.build({
        name: nsName,
        files: [{ path: 'hello.txt', content: 'from the template\n' }],
        steps: [{ run: 'echo built > step.txt' }],
      });
      nsDigest = t.digest;
      if (canRunGvisor) {
        // Built through the CLI on the gVisor tier (templates are not namespaces-only).
        const dir = mkdtempSync(join(tmpdir(), 'airlock-cli-tpl-'));
        const file = join(dir, 'template.yaml');
        writeFileSync(file, `name: ${gvName}\nsteps:\n  - run: uname -r > kernel.txt\n`);
        const built = await airlockCli(['template', 'build', '--backend', 'gvisor', file], {
          timeoutMs: 300_000,
        });
        rmSync(dir, { recursive: true, force: true });
        expect(built.code, built.stderr).toBe(0);
        expect(built.stdout).toMatch(new RegExp(`^${gvName} sha256:[0-9a-f]{64}\n$`));
      }
    }, 300_000);
    afterAll(async () => {
      await airlock.templates.remove(nsName).catch(() => {});
      await airlock.templates.remove(gvName).catch(() => {});
      await airlock.close();
    });

    it('by name and by digest, the command sees the template files', async () => {
      for (const ref of [nsName, nsDigest]) {
        const r = await airlockCli([
          'run',
          '--template',
          ref,
          '--',
          'cat /workspace/hello.txt /workspace/step.txt',
        ]);
        expect({ code: r.code, stdout: r.stdout, stderr: r.stderr }).toEqual({
          code: 0,
          stdout: 'from the template\nbuilt\n',
          stderr: '',
        });
      }
    });

    it.skipIf(!canRunGvisor)(
      `a namespaces-built template runs on gVisor too, and a gVisor-built one on its own tier (${GVISOR_SKIP_REASON})`,
      async () => {
        // gVisor reports its own kernel version, never the host's (namespaces share the host kernel).
        const host = await airlockCli(['run', '--', 'uname -r']);
        const hostKernel = host.stdout.trim();
        expect(hostKernel).not.toBe('');
        const onGv = await airlockCli([
          'run',
          '--backend',
          'gvisor',
          '--template',
          nsName,
          '--',
          'cat /workspace/hello.txt; uname -r',
        ]);
        expect(onGv.code).toBe(0);
        const [text, gvKernel] = onGv.stdout.trim().split('\n');
        expect(text).toBe('from the template');
        expect(gvKernel).not.toBe(hostKernel);
        // No --backend: the tier the template was built on.
        const gv = await airlockCli([
          'run',
          '--template',
          gvName,
          '--',
          'cat /workspace/kernel.txt; uname -r',
        ]);
        expect(gv.code).toBe(0);
        const [built, now] = gv.stdout.trim().split('\n');
        expect([built, now]).toEqual([gvKernel, gvKernel]);
      },
      300_000,
    );
  });
});

describe.skipIf(!canRunNamespaces)(
  `the example in airlock mcp --help works as written (${SKIP_REASON})`,
  () => {
    it('runs the "with" entry through the real CLI and the npm filesystem server', async () => {
      const help = await airlockCli(['mcp', '--help']);
      expect(help.code).toBe(0);
      const line = help.stdout.split('\n').find((l) => l.includes('"command": "airlock"'));
      expect(line, help.stdout).toBeDefined();
      const entry = JSON.parse(`{${line!.trim()}}`) as { command: string; args: string[] };
      expect(entry.args.slice(0, 1)).toEqual(['mcp']);
      expect(entry.args).toContain('@modelcontextprotocol/server-filesystem');
      // Exactly the entry's args, with "airlock" being this checkout's CLI, run from this checkout.
      const transport = new StdioClientTransport({
        command: process.execPath,
        args: ['--import', 'tsx', `${ROOT}/src/cli/main.ts`, ...entry.args],
        cwd: ROOT,
        env: {
          PATH: process.env.PATH ?? '/usr/bin:/bin',
          HOME: process.env.HOME ?? '/root',
          AIRLOCK_STATE_DIR: TEST_STATE_DIR,
          AIRLOCK_UID_RANGE: `${TEST_UID_RANGE.first}:${TEST_UID_RANGE.count}`,
        },
        stderr: 'pipe',
      });
      const client = new Client({ name: 'help-example', version: '1' }, { capabilities: {} });
      await client.connect(transport);
      try {
        const tools = (await client.listTools()).tools.map((t) => t.name);
        expect(tools).toEqual(expect.arrayContaining(['read_text_file', 'list_allowed_directories']));
        const r = await client.callTool({
          name: 'read_text_file',
          arguments: { path: '/workspace/package.json' },
        });
        expect(r.isError).toBeFalsy();
        const content = r.content as Array<{ type: string; text?: string }>;
        expect(content[0]?.text).toContain('"name": "airlock-sandbox"');
      } finally {
        await client.close();
      }
    }, 120_000);
  },
);
