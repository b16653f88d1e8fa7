// A sandbox port on this host's loopback: a TCP listener on 127.0.0.1:<ephemeral> whose every
// connection is carried to `port` on the sandbox's own loopback (the library's sbx.connectPort, or a
// server's port route for a remote sandbox). Only this host's processes can reach the listener; it
// is closed with the session, and its open connections with it.
import { createServer, type Server, type Socket } from 'node:net';
import type { AddressInfo } from 'node:net';
import type { Duplex } from 'node:stream';

/** Opens one raw connection to a port inside the sandbox. */
export type PortConnector = (port: number, signal?: AbortSignal) => Promise<Duplex>;

/** Loopback listeners for a sandbox's ports, one per port, made on first use. */
export class PortForwards {
  private readonly listeners = new Map<number, Promise<{ server: Server; url: string }>>();
  private readonly open = new Set<Socket | Duplex>();
  private closed = false;

  constructor(private readonly connect: PortConnector) {}

  /** The ports forwarded so far. */
  get ports(): number[] {
    return [...this.listeners.keys()].sort((a, b) => a - b);
  }

  /** `http://127.0.0.1:<p>` reaching `port` in the sandbox (the listener starts on first use). */
  async url(port: number): Promise<string> {
    let l = this.listeners.get(port);
    if (!l) {
      l = this.listen(port);
      this.listeners.set(port, l);
      l.catch(() => this.listeners.delete(port));
    }
    return (await l).url;
  }

  private async listen(port: number): Promise<{ server: Server; url: string }> {
    const server = createServer((client) => this.carry(client, port));
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(0, '127.0.0.1', () => resolve());
    });
    if (this.closed) {
      await new Promise<void>((r) => server.close(() => r()));
      throw new Error('the session was stopped');
    }
    return { server, url: `http://127.0.0.1:${(server.address() as AddressInfo).port}` };
  }

  private carry(client: Socket, port: number): void {
    this.open.add(client);
    client.on('error', () => {});
    const ac = new AbortController();
    client.once('close', () => {
      this.open.delete(client);
      ac.abort();
    });
    this.connect(port, ac.signal).then(
      (upstream) => {
        if (client.destroyed) {
          upstream.destroy();
          return;
        }
        this.open.add(upstream);
        upstream.on('error', () => client.destroy());
        upstream.once('close', () => {
          this.open.delete(upstream);
          client.destroy();
        });
        client.once('close', () => upstream.destroy());
        client.pipe(upstream).pipe(client);
      },
      // Nothing listens there (PORT_UNREACHABLE), or the sandbox is gone: the visitor sees a reset.
      () => client.destroy(),
    );
  }

  /** Stop every listener and drop every carried connection. */
  async close(): Promise<void> {
    this.closed = true;
    const all = [...this.listeners.values()];
    this.listeners.clear();
    for (const s of this.open) s.destroy();
    this.open.clear();
    await Promise.allSettled(
      all.map(async (l) => {
        const { server } = await l;
        await new Promise<void>((r) => server.close(() => r()));
      }),
    );
  }
}
