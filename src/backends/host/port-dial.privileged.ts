// SECURITY-CRITICAL (privileged): a TCP connection from Airlock to a port on a sandbox's loopback
// (preview URLs, issue 36). The connection must reach the sandbox's own network namespace and
// nothing else:
//   - the socket is made INSIDE the sandbox's netns by the launcher's worker thread (setns there,
//     socket(2), setns back: launcher-worker.privileged.ts). A socket belongs to the namespace it was
//     made in for life, so no thread the rest of the process uses (the main thread, libuv's pool)
//     ever enters the namespace;
//   - the main thread then connects it to 127.0.0.1:<port> and nowhere else (the address is a
//     constant here, the port an integer 1-65535). Inside the netns, 127.0.0.1 is the sandbox's own
//     `lo`: the host's loopback and every other network are not in that namespace at all.
// The caller owns the returned socket (destroying it closes the fd).
import { closeSync } from 'node:fs';
import { Socket } from 'node:net';
import { AirlockError } from '../../core/errors.js';
import { Launcher } from './launcher.privileged.js';
import type { NetnsHandle } from './netns.privileged.js';

/**
 * Connections one sandbox's ports may have open at once (each holds an fd of this process: a visitor
 * of a public port must not be able to use up the server's file descriptors).
 */
export const MAX_PORT_CONNECTIONS = 256;

/** How long a connect may take (a listener whose backlog is full drops the SYN and never answers). */
export const PORT_CONNECT_TIMEOUT_MS = 10_000;

/** INVALID_ARGUMENT unless `port` is a TCP port (an integer 1-65535). */
export function checkPort(port: unknown): number {
  if (typeof port !== 'number' || !Number.isInteger(port) || port < 1 || port > 65535) {
    throw new AirlockError(
      'INVALID_ARGUMENT',
      `port must be an integer from 1 to 65535, not ${String(port)}`,
      {
        field: 'port',
      },
    );
  }
  return port;
}

export interface DialOptions {
  /** The process's launcher, if the tier already has it (else it is started here). */
  readonly launcher?: Launcher;
  readonly signal?: AbortSignal;
  /** The sandbox's id, for messages. */
  readonly id: string;
  /**
   * The address to connect to inside the netns: 127.0.0.1 (the default), or, for the microVM tier,
   * the guest's fixed address on its tap (which exists only in that netns). Never caller input.
   */
  readonly address?: '127.0.0.1' | '10.0.2.2';
}

/**
 * A connected socket to 127.0.0.1:`port` inside the network namespace `netns`. PORT_UNREACHABLE when
 * nothing listens there (or it does not accept in time); BACKEND_UNAVAILABLE without a launcher thread.
 */
export async function dialInNetns(netns: NetnsHandle, port: number, o: DialOptions): Promise<Socket> {
  checkPort(port);
  if (o.signal?.aborted) throw new AirlockError('ABORTED', 'connect aborted before it started');
  const launcher = o.launcher ?? Launcher.get();
  if (!(launcher instanceof Launcher)) {
    throw new AirlockError(
      'BACKEND_UNAVAILABLE',
      `connecting to a sandbox's port needs Airlock's launcher thread, which could not start: ${launcher.failed}`,
    );
  }
  const fd = await launcher.tcpSocketIn(netns.fd);
  let s: Socket;
  try {
    // An unconnected socket: connect() below, in the same tick (nothing reads it before).
    s = new Socket({ fd });
  } catch (e) {
    closeSync(fd);
    throw new AirlockError('INTERNAL', `wrapping the sandbox socket failed: ${(e as Error).message}`, {
      cause: e,
    });
  }
  return new Promise<Socket>((resolve, reject) => {
    const fail = (e: AirlockError): void => {
      cleanup();
      s.destroy();
      reject(e);
    };
    const onError = (e: NodeJS.ErrnoException): void =>
      fail(
        new AirlockError(
          'PORT_UNREACHABLE',
          e.code === 'ECONNREFUSED'
            ? `nothing listens on port ${port} inside sandbox ${o.id}: start a server on that port (${o.address === undefined ? 'any address: 0.0.0.0 or 127.0.0.1' : `address 0.0.0.0 or ${o.address}`})`
            : `connecting to port ${port} inside sandbox ${o.id} failed: ${e.code ?? e.message}`,
          { cause: e },
        ),
      );
    const onAbort = (): void => fail(new AirlockError('ABORTED', `connect to port ${port} aborted`));
    const timer = setTimeout(
      () =>
        fail(
          new AirlockError(
            'PORT_UNREACHABLE',
            `port ${port} inside sandbox ${o.id} did not accept a connection within ${PORT_CONNECT_TIMEOUT_MS} ms (is its server overloaded?)`,
          ),
        ),
      PORT_CONNECT_TIMEOUT_MS,
    );
    const cleanup = (): void => {
      clearTimeout(timer);
      s.off('error', onError);
      o.signal?.removeEventListener('abort', onAbort);
    };
    s.once('error', onError);
    o.signal?.addEventListener('abort', onAbort, { once: true });
    s.connect({ host: o.address ?? '127.0.0.1', port }, () => {
      cleanup();
      resolve(s);
    });
  });
}
