// What a vetted tunnel carries (src/egress/sniff.ts), over real loopback sockets: the client's first
// bytes however they are split, a server that speaks first, a client that trickles a request line and
// then stops (decided as HTTP at the deadline, never "other"), a ClientHello split across writes, and
// every byte read kept for the path that takes the connection.
import { connect, createServer, type Server, type Socket } from 'node:net';
import { connect as tlsConnect } from 'node:tls';
import { afterEach, describe, expect, it } from 'vitest';
import { sniffTunnel } from '../../src/egress/sniff.js';

const open: Array<Socket | Server> = [];
afterEach(() => {
  for (const s of open.splice(0)) {
    if ('destroy' in s) s.destroy();
    else s.close();
  }
});

/** A connected pair on loopback: [the client's end, the gateway's end]. */
function pair(): Promise<[Socket, Socket]> {
  return new Promise((resolve) => {
    const server = createServer((accepted) => {
      accepted.pause();
      open.push(accepted);
      resolve([client, accepted]);
    });
    open.push(server);
    let client: Socket;
    server.listen(0, '127.0.0.1', () => {
      client = connect((server.address() as { port: number }).port, '127.0.0.1');
      open.push(client);
    });
  });
}

/** Write `parts` one after the other, each once the previous one has been flushed. */
async function writeParts(s: Socket, parts: readonly (string | Buffer)[]): Promise<void> {
  for (const p of parts)
    await new Promise<void>((r) =>
      s.write(typeof p === 'string' ? Buffer.from(p, 'latin1') : p, () => setImmediate(r)),
    );
}

describe('sniffTunnel', () => {
  it('classifies HTTP and other protocols from bytes split anywhere, and keeps every byte', async () => {
    const cases: Array<[string[], 'http' | 'other']> = [
      [['GET / HTTP/1.1\r\nHost: a\r\n\r\n'], 'http'],
      [['G', 'ET / HT', 'TP/1.1\r\n'], 'http'],
      [['\r\n', '\r\n', 'GET /x HTTP/1.0\r\n\r\n'], 'http'],
      [['SSH-2.0-OpenSSH_9.6 Ubuntu\r\n'], 'other'],
      [['SSH-2.0-', 'OpenSSH\r\n'], 'other'],
      [['\x00\x00\x00\x08\x04\xd2\x16\x2f'], 'other'],
    ];
    for (const [parts, kind] of cases) {
      const [client, gw] = await pair();
      const sniffed = sniffTunnel(gw, undefined, Buffer.alloc(0), 10_000);
      await writeParts(client, parts);
      const s = await sniffed;
      expect(s, JSON.stringify(parts)).toMatchObject({ from: 'client', kind });
      if (s.from === 'client') expect(s.bytes.toString('latin1')).toBe(parts.join(''));
    }
  });

  it('a partial request line is HTTP once the deadline passes (waiting cannot buy a raw relay)', async () => {
    const [client, gw] = await pair();
    const sniffed = sniffTunnel(gw, undefined, Buffer.alloc(0), 200);
    await writeParts(client, ['GET']);
    expect(await sniffed).toMatchObject({ from: 'client', kind: 'http' });
  });

  it('bytes already read (the CONNECT head, SOCKS early data) count, and decide at once', async () => {
    const [, gw] = await pair();
    const s = await sniffTunnel(gw, undefined, Buffer.from('GET / HTTP/1.1\r\n'), 10_000);
    expect(s).toMatchObject({ from: 'client', kind: 'http' });
  });

  it('a server that speaks first is relayed: its bytes are put back, the client has sent nothing', async () => {
    const [client, gw] = await pair();
    const [server, up] = await pair();
    const sniffed = sniffTunnel(gw, up, Buffer.alloc(0), 10_000);
    await writeParts(server, ['SSH-2.0-server\r\n']);
    expect(await sniffed).toEqual({ from: 'upstream' });
    expect(up.read()?.toString()).toBe('SSH-2.0-server\r\n');
    void client;
  });

  it('a ClientHello split across writes is read whole, with its server name', async () => {
    const hello = await new Promise<Buffer>((resolve) => {
      const srv = createServer((s) => s.once('data', (d: Buffer) => (resolve(d), s.destroy())));
      open.push(srv);
      srv.listen(0, '127.0.0.1', () => {
        const t = tlsConnect({
          port: (srv.address() as { port: number }).port,
          host: '127.0.0.1',
          servername: 'denied.test',
        });
        t.on('error', () => {});
        open.push(t);
      });
    });
    const [client, gw] = await pair();
    const sniffed = sniffTunnel(gw, undefined, Buffer.alloc(0), 10_000);
    await writeParts(client, [hello.subarray(0, 7), hello.subarray(7, 100), hello.subarray(100)]);
    const s = await sniffed;
    expect(s).toMatchObject({
      from: 'client',
      kind: 'tls',
      hello: { kind: 'tls', serverName: 'denied.test' },
    });
  });

  it('a client that closes before deciding anything', async () => {
    const [client, gw] = await pair();
    const sniffed = sniffTunnel(gw, undefined, Buffer.alloc(0), 10_000);
    client.end();
    expect(await sniffed).toEqual({ from: 'none' });
  });
});
