// A real native REST server for tests: nativeRoutes(new LocalSandboxApi(airlock)) on @hono/node-server,
// on 127.0.0.1:0 or on a unix socket, driven through RemoteSandboxApi.
import { mkdtempSync, rmSync } from 'node:fs';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Server } from 'node:http';
import { createAdaptorServer } from '@hono/node-server';
import type { Airlock } from '../../src/index.js';
import type { ExecEvent } from '../../src/server/contract.js';
import { RemoteSandboxApi } from '../../src/server/client.js';
import { LocalSandboxApi, type LocalSandboxApiOptions } from '../../src/server/local.js';
import { nativeRoutes, type NativeRoutesOptions } from '../../src/server/routes.js';

export interface TestServer {
  readonly api: RemoteSandboxApi;
  readonly local: LocalSandboxApi;
  /** http://127.0.0.1:PORT (TCP servers only). */
  readonly url: string | undefined;
  readonly socketPath: string | undefined;
  close(): Promise<void>;
}

export async function startServer(
  airlock: Airlock,
  o: { unix?: boolean; routes?: NativeRoutesOptions; local?: LocalSandboxApiOptions } = {},
): Promise<TestServer> {
  const local = new LocalSandboxApi(airlock, o.local);
  const app = nativeRoutes(local, o.routes);
  const server = createAdaptorServer({ fetch: app.fetch }) as Server;
  let dir: string | undefined;
  let socketPath: string | undefined;
  if (o.unix) {
    dir = mkdtempSync(join(tmpdir(), 'airlock-native-'));
    socketPath = join(dir, 'api.sock');
    await new Promise<void>((r) => server.listen(socketPath, r));
  } else {
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  }
  const url = o.unix ? undefined : `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  const api = new RemoteSandboxApi(socketPath ? { socketPath } : { baseUrl: url! });
  return {
    api,
    local,
    url,
    socketPath,
    close: async () => {
      api.close();
      server.closeAllConnections();
      await new Promise<void>((r) => server.close(() => r()));
      if (dir) rmSync(dir, { recursive: true, force: true });
    },
  };
}

export const CALLER = { tenant: 'default' } as const;

/** Every event of a stream, with stdout/stderr decoded and joined. */
export async function collectExec(events: AsyncIterable<ExecEvent>): Promise<{
  events: ExecEvent[];
  stdout: Buffer;
  stderr: Buffer;
  exit: Extract<ExecEvent, { type: 'exit' }> | undefined;
}> {
  const all: ExecEvent[] = [];
  const out: Buffer[] = [];
  const err: Buffer[] = [];
  for await (const e of events) {
    all.push(e);
    if (e.type === 'stdout') out.push(Buffer.from(e.data, 'base64'));
    if (e.type === 'stderr') err.push(Buffer.from(e.data, 'base64'));
  }
  const exit = all.find((e): e is Extract<ExecEvent, { type: 'exit' }> => e.type === 'exit');
  return { events: all, stdout: Buffer.concat(out), stderr: Buffer.concat(err), exit };
}

export function streamOf(...chunks: Uint8Array[]): ReadableStream<Uint8Array> {
  return new ReadableStream({
    start(c) {
      for (const x of chunks) c.enqueue(x);
      c.close();
    },
  });
}

export async function bytesOf(s: ReadableStream<Uint8Array>): Promise<Buffer> {
  const parts: Uint8Array[] = [];
  for await (const c of s as unknown as AsyncIterable<Uint8Array>) parts.push(c);
  return Buffer.concat(parts);
}
