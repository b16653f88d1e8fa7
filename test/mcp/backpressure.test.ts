// A fast server and a slow client must not grow the gateway's memory past a bound (issue 30, class 8b):
// the bytes waiting for a client to read them are capped per session; past the cap the session is
// closed with a clear reason (audit, stderr, exit code), and other sessions on the same server go on.
// Real CLI and real gateway, a real sandboxed server flooding progress notifications
// (test/fixtures/mcp/pressure-server.ts), clients that stop reading.
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { request, type IncomingMessage } from 'node:http';
import { readFileSync } from 'node:fs';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import type { CallToolResult } from '@modelcontextprotocol/sdk/types.js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { AuditEvent } from '../../src/mcp/audit.js';
import { parseGatewayConfig } from '../../src/mcp/config.js';
import { GatewayCore } from '../../src/mcp/gateway.js';
import { HttpFront } from '../../src/mcp/http.js';
import { gatewaySetups } from '../../src/mcp/setup.js';
import type { Airlock } from '../../src/sandbox/airlock.js';
import {
  canRunNamespaces,
  NO_RESIDUE,
  settledResidue,
  SKIP_REASON,
  TEST_STATE_DIR,
  TEST_UID_RANGE,
  testAirlock,
} from '../helpers.js';
import { FIXTURE, newToken, ROOT } from './harness.js';

const MIB = 1024 * 1024;
const [NODE, ...PRESSURE_ARGS] = FIXTURE('pressure-server.ts');
const text = (r: unknown): string =>
  ((r as CallToolResult).content ?? []).map((c) => (c.type === 'text' ? c.text : '')).join('');
const rssBytes = (pid: number): number =>
  1024 * Number(/^VmRSS:\s+(\d+)\s+kB/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1] ?? 0);
const INIT = {
  jsonrpc: '2.0',
  id: 0,
  method: 'initialize',
  params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'slow', version: '1' } },
};
/** 800 MB of progress notifications: far past any bound, if the gateway held them. */
const FLOOD = { count: 40_000, bytes: 20_000 };

if (!canRunNamespaces) {
  describe('backpressure', () => {
    it.skip(`the whole suite [skipped: ${SKIP_REASON}]`, () => {});
  });
} else {
  describe('backpressure: airlock mcp (stdio) and a client that stops reading', () => {
    it('closes the session at the cap with a clear reason (exit 5); its memory stays bounded', async () => {
      const child = spawn(
        process.execPath,
        ['--import', 'tsx', `${ROOT}/src/cli/main.ts`, 'mcp', '--', ...FIXTURE('pressure-server.ts')],
        {
          cwd: ROOT,
          env: {
            PATH: process.env.PATH ?? '/usr/bin:/bin',
            HOME: process.env.HOME ?? '/root',
            AIRLOCK_STATE_DIR: TEST_STATE_DIR,
            AIRLOCK_UID_RANGE: `${TEST_UID_RANGE.first}:${TEST_UID_RANGE.count}`,
          },
          stdio: ['pipe', 'pipe', 'pipe'],
        },
      );
      let stderr = '';
      child.stderr.setEncoding('utf8').on('data', (t: string) => (stderr += t));
      const exited = new Promise<number | null>((r) => child.once('close', (code) => r(code)));
      let out = '';
      const onOut = (b: Buffer): void => void (out += b.toString());
      child.stdout.on('data', onOut);
      child.stdin.write(`${JSON.stringify(INIT)}\n`);
      while (!out.includes('"id":0')) await new Promise((r) => setTimeout(r, 50));
      child.stdin.write('{"jsonrpc":"2.0","method":"notifications/initialized"}\n');
      // From here on the client reads nothing.
      child.stdout.off('data', onOut);
      child.stdout.pause();
      child.stdin.write(
        `${JSON.stringify({
          jsonrpc: '2.0',
          id: 1,
          method: 'tools/call',
          params: { name: 'flood_progress', arguments: FLOOD, _meta: { progressToken: 'p' } },
        })}\n`,
      );
      let peak = 0;
      let done = false;
      void exited.then(() => (done = true));
      while (!done) {
        try {
          peak = Math.max(peak, rssBytes(child.pid!));
        } catch {
          break; // gone between the check and the read
        }
        await new Promise((r) => setTimeout(r, 100));
      }
      expect(await exited).toBe(5);
      expect(stderr).toMatch(
        /\[airlock\] the client is not reading: \d+ bytes wait for it \(cap 33554432\); session closed/,
      );
      expect(peak).toBeGreaterThan(0);
      expect(peak).toBeLessThan(512 * MIB);
      expect(await settledResidue(10_000)).toEqual(NO_RESIDUE);
    }, 180_000);
  });

  describe('backpressure: http gateway, one slow session among others', () => {
    let airlock: Airlock;
    let core: GatewayCore;
    let front: HttpFront;
    let url: string;
    let port: number;
    const token = newToken();
    const events: AuditEvent[] = [];

    beforeAll(async () => {
      airlock = testAirlock();
      const config = parseGatewayConfig({
        // One instance for every session: the slow one must not stall or sink the others.
        mcpServers: { p: { command: NODE, args: PRESSURE_ARGS, airlock: { boundary: 'per-server' } } },
        airlock: {
          tenants: [{ name: 'alice', token }],
          lockfile: `/nonexistent-${randomBytes(4).toString('hex')}/airlock.lock.json`,
        },
      });
      core = new GatewayCore({
        airlock,
        mode: 'multi',
        servers: gatewaySetups(config, 'http'),
        audit: (e) => events.push(e),
        onServerStderr: () => {},
      });
      await core.start();
      front = new HttpFront(core, {
        host: '127.0.0.1',
        port: 0,
        tenants: [{ name: 'alice', token }],
        maxBufferedBytes: 4 * MIB,
      });
      ({ url, port } = await front.listen());
    }, 120_000);

    afterAll(async () => {
      await front?.close();
      await core?.close();
      await airlock?.killAll();
      expect(await settledResidue()).toEqual(NO_RESIDUE);
    }, 60_000);

    const post = (headers: Record<string, string>, body: unknown): Promise<IncomingMessage> =>
      new Promise((resolve, reject) => {
        const req = request(
          {
            host: '127.0.0.1',
            port,
            path: '/mcp',
            method: 'POST',
            headers: {
              host: `127.0.0.1:${port}`,
              authorization: `Bearer ${token}`,
              'content-type': 'application/json',
              accept: 'text/event-stream, application/json',
              ...headers,
            },
          },
          resolve,
        );
        req.on('error', reject);
        req.end(JSON.stringify(body));
      });

    it('the slow session is closed at its cap and audited; another session on the same server goes on', async () => {
      const other = new Client({ name: 'reader', version: '1' });
      await other.connect(
        new StreamableHTTPClientTransport(new URL(url), {
          requestInit: { headers: { authorization: `Bearer ${token}` } },
        }),
      );
      const init = await post({}, INIT);
      const sid = String(init.headers['mcp-session-id']);
      init.resume();
      const session = { 'mcp-session-id': sid, 'mcp-protocol-version': '2025-06-18' };
      (await post(session, { jsonrpc: '2.0', method: 'notifications/initialized' })).resume();
      const before = process.memoryUsage().rss;
      // The slow client: starts the flood and never reads its answer stream.
      const slow = await post(session, {
        jsonrpc: '2.0',
        id: 1,
        method: 'tools/call',
        params: { name: 'p__flood_progress', arguments: FLOOD, _meta: { progressToken: 'p' } },
      });
      slow.pause();
      let peak = before;
      for (let i = 0; i < 600 && !events.some((e) => e.kind === 'mcp' && e.code === 'client_overflow'); i++) {
        peak = Math.max(peak, process.memoryUsage().rss);
        // The reading session is served all along.
        if (i % 10 === 0)
          expect(text(await other.callTool({ name: 'p__echo', arguments: { text: `during ${i}` } }))).toBe(
            `during ${i}`,
          );
        await new Promise((r) => setTimeout(r, 100));
      }
      const overflow = events.find((e) => e.kind === 'mcp' && e.code === 'client_overflow');
      expect(overflow).toBeDefined();
      expect(overflow!.reason).toMatch(
        /the client is not reading: \d+ bytes wait for it \(cap 4194304\); session closed/,
      );
      expect(peak - before).toBeLessThan(256 * MIB);
      // The slow session is gone; the other one is not.
      const gone = await post(session, { jsonrpc: '2.0', id: 2, method: 'ping' });
      gone.resume();
      expect(gone.statusCode).toBe(404);
      expect(text(await other.callTool({ name: 'p__echo', arguments: { text: 'after' } }))).toBe('after');
      expect(front.sessionCount).toBe(1);
      slow.destroy();
      await other.close();
    }, 120_000);
  });
}
