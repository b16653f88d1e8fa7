// readAll (server/client.ts), how RemoteSandboxApi and the front server read a whole JSON answer: a
// body in many chunks comes back whole, a body past the cap is refused (INTERNAL) and its connection
// closed, and a server that dies mid-body rejects the read instead of leaving it hanging. Real
// node:http server on loopback.
import http from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AirlockError } from '../../src/core/errors.js';
import { readAll } from '../../src/server/client.js';

describe('readAll', () => {
  let server: http.Server;
  let port: number;
  const sockets = new Set<Socket>();
  beforeAll(async () => {
    server = http.createServer((req, res) => {
      if (req.url === '/chunks') {
        // Three writes: the client sees (at least) as many chunks.
        res.writeHead(200, { 'content-type': 'text/plain' });
        res.write('a'.repeat(1000));
        setTimeout(() => res.write('b'.repeat(1000)), 5);
        setTimeout(() => res.end('c'.repeat(1000)), 10);
      } else if (req.url === '/big') {
        res.writeHead(200, { 'content-type': 'text/plain' });
        res.end('x'.repeat(64 * 1024));
      } else {
        // Promises 1000 bytes, sends 10, then the connection dies.
        res.writeHead(200, { 'content-length': '1000' });
        res.write('0123456789');
        setTimeout(() => res.socket?.destroy(), 10);
      }
    });
    server.on('connection', (s: Socket) => sockets.add(s));
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    port = (server.address() as AddressInfo).port;
  });
  afterAll(async () => {
    server.closeAllConnections();
    await new Promise<void>((r) => server.close(() => r()));
  });

  const get = (path: string): Promise<http.IncomingMessage> =>
    new Promise((resolve, reject) => {
      const req = http.request({ host: '127.0.0.1', port, path }, resolve);
      req.once('error', reject);
      req.end();
    });

  it('reassembles a body sent in several writes', async () => {
    const body = await readAll(await get('/chunks'), 1 << 20);
    expect(body.toString()).toBe('a'.repeat(1000) + 'b'.repeat(1000) + 'c'.repeat(1000));
  });

  it('refuses a body past the cap with INTERNAL and closes the response', async () => {
    const res = await get('/big');
    const err = await readAll(res, 1024).catch((e: unknown) => e);
    expect(AirlockError.is(err, 'INTERNAL')).toBe(true);
    expect((err as Error).message).toMatch(/larger than 1024 bytes/);
    expect(res.destroyed).toBe(true);
  });

  it('rejects (never hangs) when the server dies mid-body', async () => {
    const err = await readAll(await get('/cut'), 1 << 20).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(Error);
  });
});
