// SECURITY-CRITICAL (privileged: FFI). The fd relay for egress tunnels that need no inspection.
//
// When a CONNECT, SOCKS5 or transparent TLS/TCP connection has been vetted and dialled and the gateway
// has nothing left to look for in its bytes (the sandbox has no secrets or canaries, and the host is
// not intercepted), the gateway hands both sockets here and a worker thread moves the bytes with plain
// read(2)/write(2) on the raw fds, off Node's streams and main loop (relay-worker.privileged.ts says
// why not splice(2)). Its libc calls come from the one binding table, core/libc.privileged.ts, in
// both threads; the worker is a real module file (relay-worker.privileged.ts). One worker thread per
// runtime runs a non-blocking epoll loop for every tunnel: nothing blocks the main loop.
//
// Ownership of file descriptors:
//   - take() (main thread) dups each socket's fd (close-on-exec), destroys the Node sockets (their own
//     fds close; the connections live on in the dups), and hands the two fds to the worker. Bytes
//     Node had already read but nobody consumed go first, in order (the "prefix").
//   - From then on only the worker closes them: when both directions have ended, on any socket error,
//     after idleMs without a byte moved, or when the main thread closes the tunnel (the sandbox's egress
//     closes: lease end, kill). It then reports the bytes delivered in each direction.
//   - Half-close: EOF from one side becomes shutdown(SHUT_WR) on the other (after the bytes read before
//     it were written);
//     the other direction keeps flowing until it ends too.
//   - If the worker ever dies, the main thread closes the fds of every tunnel it had not reported ended.
//
// copy() is the one-way variant for a plain-HTTP response body of known length: the upstream socket is
// taken over as above, the client socket is only dup'd (Node keeps it: the connection lives on for the
// next request), and the worker moves exactly the announced number of bytes, then closes its dups
// without shutting the client's socket down. While a copy runs, Node must not write to the client.
import type { Socket } from 'node:net';
import { TLSSocket } from 'node:tls';
import { MessageChannel, type MessagePort, type Worker } from 'node:worker_threads';
import type { Logger } from '../core/backend.js';
import { libc, type Libc } from '../core/libc.privileged.js';
import { closeGate } from '../core/native-gate.js';
import { moduleWorker } from '../core/worker.js';
import type { Command, EndMessage, RelayInit } from './relay-protocol.js';

export interface RelayResult {
  /** Bytes delivered to the upstream / to the client (prefixes included). */
  readonly bytesUp: number;
  readonly bytesDown: number;
  /** Why the tunnel ended, when not by both sides closing ('idle', 'closed', an errno name). */
  readonly error?: string;
}

export interface RelayedTunnel {
  /** Settles (never rejects) once every fd of the tunnel is closed. */
  readonly done: Promise<RelayResult>;
  /** End the tunnel now (both connections close); `done` settles when the worker has done it. */
  close(): void;
}

/**
 * The most one read takes (the worker's scratch buffer). Large reads matter on fast links: socat on
 * loopback moved 495-823 MiB/s with its default 8 KiB buffer, 1,356-2,313 with 1 MiB. What
 * a slow receiver has not taken waits in the worker's memory, outside the kernel's TCP memory
 * accounting, so the worker reads in large steps only while all tunnels together hold less than
 * RELAY_BUDGET_BYTES, and in SMALL_READ_BYTES steps beyond.
 */
const READ_BYTES = 1024 * 1024;
const SMALL_READ_BYTES = 64 * 1024;
const RELAY_BUDGET_BYTES = 64 * 1024 * 1024;
/** How long an exiting process waits for the worker to leave its loop (it wakes at once). */
const EXIT_GATE_MS = 2_000;
/** How long the worker may take to close a tunnel before it is considered broken and stopped. */
const CLOSE_TIMEOUT_MS = 5_000;
/** File descriptors one relayed tunnel holds: its two sockets. */
export const RELAY_FDS = 2;

// Linux constants (same on x86_64 and aarch64).
const O_NONBLOCK = 0o4000;
const O_CLOEXEC = 0o2000000;
const F_GETFL = 3;
const F_SETFL = 4;
const F_DUPFD_CLOEXEC = 1030;
const EFD_NONBLOCK = O_NONBLOCK;
const EFD_CLOEXEC = O_CLOEXEC;

interface Live {
  readonly worker: Worker;
  readonly port: MessagePort;
  readonly eventFd: number;
  readonly stop: Int32Array;
  readonly onProcessExit: () => void;
  /** At process exit: stop and wake, then wait (bounded) until the worker is out of koffi. */
  readonly atExit: () => void;
  readonly exited: Promise<void>;
}

interface Pending {
  readonly live: Live;
  readonly fds: readonly number[];
  readonly resolve: (r: RelayResult) => void;
}

/** Main-thread side: hands socket pairs to the worker and reports when each tunnel ends. */
export class FdRelay {
  private live: Live | undefined;
  private readonly pending = new Map<number, Pending>();
  private nextId = 1;
  private readonly one = Buffer.from([1, 0, 0, 0, 0, 0, 0, 0]); // an eventfd increment (u64 1)

  private constructor(
    private readonly c: Libc,
    private readonly logger: Logger,
  ) {}

  /** The relay, or undefined where splice(2) through koffi is not available (streams are used then). */
  static create(logger: Logger): FdRelay | undefined {
    if (process.platform !== 'linux' || (process.arch !== 'x64' && process.arch !== 'arm64'))
      return undefined;
    try {
      return new FdRelay(libc(), logger);
    } catch (e) {
      logger.warn({ err: (e as Error).message }, 'egress: fd relay unavailable; using streams');
      return undefined;
    }
  }

  /** Tunnels handed over and not yet ended (two connections each). */
  get size(): number {
    return this.pending.size;
  }

  /** Start the worker ahead of the first tunnel (it takes tens of ms to start). */
  warm(): void {
    try {
      this.start();
    } catch (e) {
      this.logger.warn({ err: (e as Error).message }, 'egress: fd relay did not start');
    }
  }

  /**
   * Take over client <-> upstream. Returns undefined (nothing taken, nothing consumed; use streams)
   * when a socket is not a plain fd-backed socket in a clean state, or when an fd cannot be made.
   * Callers must have let pending writes finish (see `flushed`).
   */
  take(
    client: Socket,
    upstream: Socket,
    o: { upPrefix?: Buffer; idleMs: number },
  ): RelayedTunnel | undefined {
    const fa = handoffFd(client);
    const fb = handoffFd(upstream);
    if (fa === undefined || fb === undefined) return undefined;
    const fds: number[] = [];
    let live: Live;
    try {
      live = this.start();
      fds.push(this.dup(fa), this.dup(fb));
    } catch (e) {
      for (const fd of fds) this.c.close(fd);
      this.logger.warn({ err: (e as Error).message }, 'egress: relay hand-off failed; using streams');
      return undefined;
    }
    // Nothing below can fail. Bytes Node read but nobody consumed go first; then Node lets go.
    const upPrefix = Buffer.concat([o.upPrefix ?? Buffer.alloc(0), ...unread(client)]);
    const downPrefix = Buffer.concat(unread(upstream));
    client.destroy();
    upstream.destroy();
    return this.register(live, fds, { op: 'add', id: 0, fds, upPrefix, downPrefix, idleMs: o.idleMs });
  }

  /** Hand `fds` (already made) to the worker with command `m` (its id is assigned here). */
  private register(live: Live, fds: number[], m: Exclude<Command, { op: 'close' }>): RelayedTunnel {
    const id = this.nextId++;
    let resolve!: (r: RelayResult) => void;
    const done = new Promise<RelayResult>((r) => (resolve = r));
    this.pending.set(id, { live, fds, resolve });
    live.worker.ref(); // a live tunnel keeps the process alive, as its sockets did
    this.send(live, { ...m, id });
    return {
      done,
      close: () => {
        const p = this.pending.get(id);
        if (!p) return;
        this.send(p.live, { op: 'close', id });
        // The worker answers within one loop turn. If it does not, it is broken: stop it (its exit
        // closes every fd it held), so a sandbox's tunnels can never outlive it.
        setTimeout(() => {
          if (!this.pending.has(id)) return;
          this.logger.error({ tunnel: id }, 'egress: fd relay did not close a tunnel; stopping it');
          void p.live.worker.terminate();
        }, CLOSE_TIMEOUT_MS).unref();
      },
    };
  }

  /**
   * Move exactly `bytes` bytes from `from` to `to` (after `prefix` and what Node had read from `from`
   * but nobody consumed, together at most `bytes`). `from` is taken over and destroyed; `to` stays
   * Node's, which must not write to it until `done` settles. bytesDown counts what reached `to`; an
   * `error` means fewer did ('truncated': `from` closed early). Undefined: nothing taken (use streams).
   */
  copy(
    from: Socket,
    to: Socket,
    o: { prefix?: Buffer; bytes: number; idleMs: number },
  ): RelayedTunnel | undefined {
    const fa = handoffFd(from);
    const fb = handoffFd(to);
    if (fa === undefined || fb === undefined) return undefined;
    const fds: number[] = [];
    let live: Live;
    try {
      live = this.start();
      fds.push(this.dup(fa), this.dup(fb));
    } catch (e) {
      for (const fd of fds) this.c.close(fd);
      this.logger.warn({ err: (e as Error).message }, 'egress: relay hand-off failed; using streams');
      return undefined;
    }
    let prefix = Buffer.concat([o.prefix ?? Buffer.alloc(0), ...unread(from)]);
    if (prefix.length > o.bytes) prefix = prefix.subarray(0, o.bytes); // beyond the body: not sent
    from.destroy();
    return this.register(live, fds, {
      op: 'copy',
      id: 0,
      fds,
      prefix,
      bytes: o.bytes - prefix.length,
      idleMs: o.idleMs,
    });
  }

  /** End every tunnel (each `done` settles) and stop the worker. */
  async close(): Promise<void> {
    const live = this.live;
    if (!live) return;
    live.worker.ref(); // until it has exited
    live.onProcessExit(); // stop flag + wake-up: the worker ends every tunnel and returns
    await live.exited;
  }

  private start(): Live {
    if (this.live) return this.live;
    const eventFd = this.c.eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (eventFd < 0) throw new Error(`eventfd: errno ${this.c.errno()}`);
    const { port1, port2 } = new MessageChannel();
    port1.unref(); // commands only go out on it; the worker's ref/unref decides what stays alive
    const stop = new Int32Array(new SharedArrayBuffer(8)); // [0]: stop flag, [1]: native gate
    const x64 = process.arch === 'x64';
    let worker: Worker;
    try {
      worker = moduleWorker(import.meta.url, './relay-worker.privileged', {
        workerData: {
          port: port2,
          eventFd,
          stop: stop.buffer,
          epollEventSize: x64 ? 12 : 16,
          epollDataOffset: x64 ? 4 : 8,
          bigReadBytes: READ_BYTES,
          smallReadBytes: SMALL_READ_BYTES,
          budgetBytes: RELAY_BUDGET_BYTES,
        } satisfies RelayInit,
        transferList: [port2],
      });
    } catch (e) {
      this.c.close(eventFd);
      port1.close();
      throw e;
    }
    // The worker blocks in epoll_wait; on exit Node joins it, so wake it and tell it to stop first.
    const onProcessExit = (): void => {
      Atomics.store(stop, 0, 1);
      this.c.write(eventFd, this.one, 8);
    };
    // Node then terminates the worker: not while it is inside koffi (core/native-gate.ts).
    const atExit = (): void => {
      onProcessExit();
      closeGate(stop, 1, EXIT_GATE_MS);
    };
    const exited = new Promise<void>((r) => worker.once('exit', () => r()));
    const live: Live = { worker, port: port1, eventFd, stop, onProcessExit, atExit, exited };
    atProcessExit.add(atExit);
    if (atProcessExit.size === 1) process.once('exit', runAtProcessExit);
    worker.on('message', (m: EndMessage) => this.onEnd(m));
    worker.on('error', (e) => this.logger.error({ err: e.message }, 'egress: fd relay failed'));
    worker.on('exit', () => this.onWorkerExit(live));
    worker.unref(); // ref'd only while it carries a tunnel
    this.live = live;
    return live;
  }

  private send(live: Live, m: Command): void {
    live.port.postMessage(m);
    this.c.write(live.eventFd, this.one, 8); // wake the worker: it reads every queued command
  }

  private onEnd(m: EndMessage): void {
    const p = this.pending.get(m.id);
    if (!p) return;
    this.pending.delete(m.id);
    if (this.pending.size === 0) p.live.worker.unref();
    p.resolve({ bytesUp: m.bytesUp, bytesDown: m.bytesDown, ...(m.error ? { error: m.error } : {}) });
  }

  /** The worker is gone (stopped, or a bug): close what it still held; the next tunnel starts a new one. */
  private onWorkerExit(live: Live): void {
    atProcessExit.delete(live.atExit);
    if (atProcessExit.size === 0) process.removeListener('exit', runAtProcessExit);
    for (const [id, p] of this.pending) {
      if (p.live !== live) continue;
      this.pending.delete(id);
      for (const fd of p.fds) this.c.close(fd);
      p.resolve({ bytesUp: 0, bytesDown: 0, error: 'relay worker exited' });
    }
    this.c.close(live.eventFd);
    live.port.close();
    if (this.live === live) this.live = undefined;
  }

  private dup(fd: number): number {
    const d = this.c.fcntl(fd, F_DUPFD_CLOEXEC, 3);
    if (d < 0) throw new Error(`dup: errno ${this.c.errno()}`);
    // libuv made the socket non-blocking; the relay depends on it, so make sure.
    const fl = this.c.fcntl(d, F_GETFL, 0);
    if (fl < 0 || (!(fl & O_NONBLOCK) && this.c.fcntl(d, F_SETFL, fl | O_NONBLOCK) < 0)) {
      this.c.close(d);
      throw new Error(`fcntl: errno ${this.c.errno()}`);
    }
    return d;
  }
}

/**
 * Stop-and-wake functions of every running relay worker in this process. At exit Node joins worker
 * threads, and a worker blocked in epoll_wait would hold the exit up: one 'exit' listener wakes them
 * all (one listener, however many runtimes the process has).
 */
const atProcessExit = new Set<() => void>();
const runAtProcessExit = (): void => atProcessExit.forEach((f) => f());

/** Resolves once everything written to `s` so far has reached the kernel (or `s` failed). */
export function flushed(s: Socket): Promise<void> {
  if (s.destroyed || s.writableLength === 0) return Promise.resolve();
  return new Promise((resolve) => s.write(Buffer.alloc(0), () => resolve()));
}

/** The fd of a plain (not TLS) connected socket that Node is done writing to, or undefined. */
function handoffFd(s: Socket): number | undefined {
  if (s instanceof TLSSocket || s.destroyed || s.connecting || s.writableEnded || s.readableEnded) return;
  if (s.writableLength > 0) return;
  const fd = (s as unknown as { _handle?: { fd?: unknown } })._handle?.fd;
  return typeof fd === 'number' && fd >= 0 ? fd : undefined;
}

/** What Node has buffered from `s` that no one has read (it precedes what is still in the kernel). */
function unread(s: Socket): Buffer[] {
  const parts: Buffer[] = [];
  while (s.readableLength > 0) {
    const chunk = s.read() as Buffer | string | null;
    if (chunk === null) break;
    parts.push(typeof chunk === 'string' ? Buffer.from(chunk, 'latin1') : chunk);
  }
  return parts;
}
