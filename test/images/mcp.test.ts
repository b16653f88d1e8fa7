// MCP servers from images: a real stdio MCP server (Python, standard library only) baked into an
// image pushed to the loopback registry, run through the gateway (`image` in a server's airlock
// block) and through `airlock mcp --image REF -- uvx …` (the image's own launcher: the host has
// none). The image is Python's allowlist closure from this host plus a layer with the server.
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildExecutableRoot, CLOSURE_MANIFEST } from '../../src/images/closure.js';
import { Airlock } from '../../src/sandbox/airlock.js';
import {
  canRunNamespaces,
  NO_RESIDUE,
  runCli,
  settledResidue,
  SKIP_REASON,
  TEST_STATE_DIR,
  TEST_UID_RANGE,
} from '../helpers.js';
import { ROOT, startCli, startGateway } from '../mcp/harness.js';
import { imageOf, layerOf, pushImage, tarOf } from './build.js';
import { canRunRegistry, startRegistry, type TestRegistry } from './registry.js';

const UVX_SHIM =
  "#!/usr/bin/python3\n# the image's uvx: runs the tool it has installed, downloads nothing\nimport os\nos.execv('/usr/bin/python3', ['python3', '/srv/mcp/server.py'])\n";

const textOf = (r: unknown): string =>
  ((r as { content: Array<{ type: string; text: string }> }).content[0]?.text ?? '').trim();

describe.skipIf(!canRunNamespaces || !canRunRegistry)(
  `MCP servers from images (${SKIP_REASON}; and docker-registry)`,
  () => {
    let reg: TestRegistry;
    let ref: string;
    let scratch: string;
    beforeAll(async () => {
      reg = await startRegistry();
      scratch = mkdtempSync(`${TEST_STATE_DIR}-mcp-img-`);
      const py = join(scratch, 'py');
      await buildExecutableRoot({ sourceLayers: ['/'], executables: ['python3'], destDir: py });
      const names = readdirSync(py).filter((n) => n !== CLOSURE_MANIFEST);
      const base = execFileSync('tar', ['-C', py, '--numeric-owner', '-cf', '-', ...names], {
        maxBuffer: 512 * 1024 ** 2,
      });
      const server = await tarOf([
        { name: 'etc/', type: 'directory' },
        { name: 'etc/image-marker', content: 'image-mcp\n' },
        { name: 'srv/', type: 'directory' },
        { name: 'srv/mcp/', type: 'directory' },
        { name: 'srv/mcp/server.py', content: readFileSync(`${ROOT}/test/fixtures/mcp/stdlib_server.py`) },
        { name: 'usr/local/', type: 'directory' },
        { name: 'usr/local/bin/', type: 'directory' },
        { name: 'usr/local/bin/uvx', content: UVX_SHIM, mode: 0o755 },
      ]);
      const img = imageOf([layerOf(base, 'none'), layerOf(server)], {
        config: { Env: ['PATH=/usr/local/bin:/usr/bin:/bin'], WorkingDir: '/srv/mcp' },
      });
      await pushImage(reg.host, 'team/mcp-py', '1', img);
      ref = `${reg.host}/team/mcp-py:1`;
    }, 180_000);
    afterAll(async () => {
      await reg?.close();
      if (scratch) rmSync(scratch, { recursive: true, force: true });
      expect(await settledResidue(5000)).toEqual(NO_RESIDUE);
    }, 60_000);

    it('the gateway runs a server with `image` on the image root; it has no network', async () => {
      const airlock = new Airlock({ stateDir: TEST_STATE_DIR, uidRange: TEST_UID_RANGE });
      const gw = await startGateway(airlock, {
        py: { command: 'python3', args: ['/srv/mcp/server.py'], airlock: { image: ref } },
      });
      try {
        const c = await gw.client('alice');
        const tools = (await c.listTools()).tools.map((t) => t.name).sort();
        expect(tools).toEqual(['py__download', 'py__where']);
        // the image's marker and python, its working dir, and no host /usr/bin/node
        expect(textOf(await c.callTool({ name: 'py__where', arguments: {} }))).toBe(
          'image-mcp 3.11 /srv/mcp False',
        );
        expect(textOf(await c.callTool({ name: 'py__download', arguments: {} }))).toMatch(/^no network: /);
      } finally {
        await gw.close();
        await airlock.close();
      }
    }, 120_000);

    it("airlock mcp --image REF -- uvx …: the image's launcher runs the server", async () => {
      const cli = await startCli(['--image', ref, '--', 'uvx', 'stdlib-server']);
      try {
        const r = await cli.client.callTool({ name: 'where', arguments: {} });
        expect(textOf(r)).toBe('image-mcp 3.11 /srv/mcp False');
      } finally {
        await cli.close();
      }
    }, 120_000);

    it('without --image, uvx is refused on the host root (the host has no such environment)', async () => {
      const r = await runCli(['mcp', '--', 'uvx', 'stdlib-server'], { timeoutMs: 60_000 });
      expect(r.code).not.toBe(0);
      expect(r.stderr).toMatch(/uvx/);
      expect(r.stderr).toMatch(/downloads Python packages/);
    }, 60_000);
  },
);
