// A real native-API server for the remote SDK and CLI tests: nativeRoutes over a LocalSandboxApi (the
// library, on the test state dir) served by @hono/node-server on 127.0.0.1:0 in the test process.
import { readFileSync, readdirSync } from 'node:fs';
import type { AddressInfo } from 'node:net';
import { serve, type ServerType } from '@hono/node-server';
import { Airlock } from '../../src/index.js';
import { LocalSandboxApi } from '../../src/server/local.js';
import { nativeRoutes } from '../../src/server/routes.js';
import { TEST_STATE_DIR, TEST_UID_RANGE } from '../helpers.js';

export interface TestServer {
  readonly url: string;
  /** The server's own runtime (its sandboxes are the server's, whoever created them). */
  readonly airlock: Airlock;
  close(): Promise<void>;
}

export async function startTestServer(opts: { maxUploadBytes?: number } = {}): Promise<TestServer> {
  // No warm slot: what the server holds is exactly what its clients made (the residue checks see it).
  const airlock = new Airlock({ stateDir: TEST_STATE_DIR, uidRange: TEST_UID_RANGE, warmPool: 0 });
  const app = nativeRoutes(new LocalSandboxApi(airlock), opts);
  const server = await new Promise<ServerType>((resolve) => {
    const s = serve({ fetch: app.fetch, hostname: '127.0.0.1', port: 0 }, () => resolve(s));
  });
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    airlock,
    close: async () => {
      await airlock.killAll();
      (server as { closeAllConnections?: () => void }).closeAllConnections?.();
      await new Promise<void>((r) => server.close(() => r()));
    },
  };
}

/** Host processes whose command line contains `marker` (a sandbox's processes are host processes). */
export function hostProcesses(marker: string): string[] {
  const found: string[] = [];
  for (const pid of readdirSync('/proc')) {
    if (!/^\d+$/.test(pid) || pid === String(process.pid)) continue;
    try {
      const cmd = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').join(' ');
      if (cmd.includes(marker)) found.push(`${pid} ${cmd}`);
    } catch {
      /* exited meanwhile */
    }
  }
  return found;
}

/** Waits (bounded) until `f()` is true; returns its last value. */
export async function until(f: () => boolean, maxWaitMs = 10_000): Promise<boolean> {
  for (let waited = 0; waited < maxWaitMs && !f(); waited += 50) await new Promise((r) => setTimeout(r, 50));
  return f();
}
