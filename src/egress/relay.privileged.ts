// SECURITY-CRITICAL (privileged: FFI). The zero-copy relay for egress tunnels that need no inspection.
//
// When a CONNECT, SOCKS5 or transparent TLS/TCP connection has been vetted and dialled and the gateway
// has nothing left to look for in its bytes (the sandbox has no secrets or canaries, and the host is
// not intercepted), the gateway hands both sockets here and the kernel moves the bytes: splice(2)
// socket → pipe → socket, one pipe per direction, so the data never enters user space. Node has no
// splice binding, so koffi (the FFI library libc.privileged.ts already uses) binds the few libc calls
// below, each with its exact C prototype. One worker thread per runtime runs a non-blocking epoll loop
// for every tunnel: nothing here ever blocks the main event loop.
//
// Ownership of file descriptors (the whole point of this file being small):
//   - take() (main thread) dups each socket's fd (close-on-exec) and makes the two pipes, destroys the
//     Node sockets (their own fds close; the connections live on in the dups), and hands the six fds to
//     the worker. Bytes Node had already read but nobody consumed go first, in order (the "prefix").
//   - From then on only the worker closes them: when both directions have ended, on any socket error,
//     after idleMs without a byte moved, or when the main thread closes the tunnel (the sandbox's egress
//     closes: lease end, kill). It then reports the bytes delivered in each direction.
//   - Half-close: EOF from one side becomes shutdown(SHUT_WR) on the other (after the pipe drained);
//     the other direction keeps flowing until it ends too.
//   - If the worker ever dies, the main thread closes the fds of every tunnel it had not reported ended.
import { createRequire } from 'node:module';
import type { Socket } from 'node:net';
import { TLSSocket } from 'node:tls';
import { MessageChannel, Worker, type MessagePort } from 'node:worker_threads';
import type * as WorkerThreads from 'node:worker_threads';
import type { Logger } from '../core/backend.js';

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
 * Pipe capacity per direction: the bytes one splice pair can move (1 MiB halves the CPU per byte
 * against the default 64 KiB). What sits in a pipe because the receiver is slow escapes the kernel's
 * TCP memory accounting, so the worker reads in large steps only while all tunnels together hold less
 * than RELAY_BUDGET_BYTES, and in SMALL_READ_BYTES steps beyond (as much as a default pipe holds).
 */
const PIPE_BYTES = 1024 * 1024;
const SMALL_READ_BYTES = 64 * 1024;
const RELAY_BUDGET_BYTES = 64 * 1024 * 1024;
/** File descriptors one relayed tunnel holds: two sockets and two pipes. */
export const RELAY_FDS = 6;

// Linux constants (same on x86_64 and aarch64).
const O_NONBLOCK = 0o4000;
const O_CLOEXEC = 0o2000000;
const F_GETFL = 3;
const F_SETFL = 4;
const F_DUPFD_CLOEXEC = 1030;
const F_SETPIPE_SZ = 1031;
const EFD_NONBLOCK = O_NONBLOCK;
const EFD_CLOEXEC = O_CLOEXEC;

interface Koffi {
  load(name: string): { func(sig: string): (...args: never[]) => number };
  errno(): number;
  readonly os?: { readonly errno?: Readonly<Record<string, number>> };
}

/** The libc calls of the relay. Bound in both threads (this function is also sent to the worker). */
function bindRelayLibc(koffi: Koffi) {
  const lib = koffi.load('libc.so.6');
  const f = <T>(sig: string): T => lib.func(sig) as unknown as T;
  return {
    splice: f<(fdIn: number, offIn: null, fdOut: number, offOut: null, len: number, flags: number) => number>(
      'intptr_t splice(int fd_in, void *off_in, int fd_out, void *off_out, size_t len, unsigned int flags)',
    ),
    write: f<(fd: number, buf: Uint8Array, n: number) => number>(
      'intptr_t write(int fd, const void *buf, size_t n)',
    ),
    read: f<(fd: number, buf: Uint8Array, n: number) => number>('intptr_t read(int fd, void *buf, size_t n)'),
    close: f<(fd: number) => number>('int close(int fd)'),
    shutdown: f<(fd: number, how: number) => number>('int shutdown(int fd, int how)'),
    /** fcntl is variadic: call as fcntl(fd, cmd, 'int', arg). */
    fcntl: f<(fd: number, cmd: number, type?: 'int', arg?: number) => number>('int fcntl(int fd, int cmd, ...)'),
    /** pipe2(int fds[2], flags): `fds` is an 8-byte buffer. */
    pipe2: f<(fds: Uint8Array, flags: number) => number>('int pipe2(void *fds, int flags)'),
    eventfd: f<(initval: number, flags: number) => number>('int eventfd(unsigned int initval, int flags)'),
    epollCreate1: f<(flags: number) => number>('int epoll_create1(int flags)'),
    epollCtl: f<(ep: number, op: number, fd: number, ev: Uint8Array) => number>(
      'int epoll_ctl(int epfd, int op, int fd, void *event)',
    ),
    epollWait: f<(ep: number, evs: Uint8Array, max: number, timeoutMs: number) => number>(
      'int epoll_wait(int epfd, void *events, int maxevents, int timeout)',
    ),
    errno: () => koffi.errno(),
  };
}
type RelayLibc = ReturnType<typeof bindRelayLibc>;

interface RelayInit {
  readonly port: MessagePort;
  readonly eventFd: number;
  readonly stop: SharedArrayBuffer;
  /** struct epoll_event: 12 bytes, data at 4 on x86_64 (packed); 16 bytes, data at 8 elsewhere. */
  readonly epollEventSize: number;
  readonly epollDataOffset: number;
  readonly bigReadBytes: number;
  readonly smallReadBytes: number;
  readonly budgetBytes: number;
}

type Command =
  | {
      readonly op: 'add';
      readonly id: number;
      /** client, upstream, up pipe (read, write), down pipe (read, write) */
      readonly fds: readonly number[];
      readonly upPrefix: Uint8Array;
      readonly downPrefix: Uint8Array;
      readonly idleMs: number;
    }
  | { readonly op: 'close'; readonly id: number };

export interface EndMessage {
  readonly op: 'end';
  readonly id: number;
  readonly bytesUp: number;
  readonly bytesDown: number;
  readonly error?: string;
}

/**
 * The worker: one epoll loop (level-triggered) over every tunnel. Runs in its own thread, from source
 * text (so no module loader is needed there): it must not refer to anything outside its parameters.
 */
function relayWorker(wt: typeof WorkerThreads, koffi: Koffi, bind: typeof bindRelayLibc): void {
  const init = wt.workerData as RelayInit;
  const c = bind(koffi);
  const stop = new Int32Array(init.stop);
  const EPOLLIN = 0x1;
  const EPOLLOUT = 0x4;
  const CTL_ADD = 1;
  const CTL_DEL = 2;
  const CTL_MOD = 3;
  const SPLICE_FLAGS = 0x1 | 0x2; // SPLICE_F_MOVE | SPLICE_F_NONBLOCK
  const EAGAIN = 11;
  const EINTR = 4;
  const SHUT_WR = 1;
  const EPOLL_CLOEXEC = 0o2000000;
  const MAX_EVENTS = 256;
  const STEPS = 16; // per direction per wake-up, so one busy tunnel cannot starve the others

  interface Dir {
    readonly from: number;
    readonly to: number;
    readonly pipeR: number;
    readonly pipeW: number;
    inPipe: number; // bytes spliced into the pipe, not yet out of it
    prefix: Buffer | undefined; // bytes Node had read before the hand-off, written first
    eof: boolean;
    shut: boolean; // EOF passed on: shutdown(to, SHUT_WR) done
    bytes: number; // delivered to `to`
  }
  interface Tunnel {
    readonly id: number;
    readonly fds: readonly number[];
    readonly up: Dir;
    readonly down: Dir;
    readonly idleMs: number;
    lastActive: number;
    readonly mask: Map<number, number>; // fd → epoll interest currently registered
  }
  let inFlight = 0; // bytes in all pipes (see RELAY_BUDGET_BYTES)
  const tunnels = new Map<number, Tunnel>();
  const byFd = new Map<number, Tunnel>();
  const ev = Buffer.alloc(init.epollEventSize);
  const events = Buffer.alloc(init.epollEventSize * MAX_EVENTS);
  const names = new Map(Object.entries(koffi.os?.errno ?? {}).map(([k, v]) => [v, k]));
  const errName = (e: number): string => names.get(e) ?? `errno ${e}`;

  const ep = c.epollCreate1(EPOLL_CLOEXEC);
  if (ep < 0) throw new Error(`epoll_create1: ${errName(c.errno())}`);
  const ctl = (op: number, fd: number, mask: number): void => {
    ev.fill(0);
    ev.writeUInt32LE(mask, 0);
    ev.writeInt32LE(fd, init.epollDataOffset);
    if (c.epollCtl(ep, op, fd, ev) < 0 && op !== CTL_DEL) throw new Error(`epoll_ctl: ${errName(c.errno())}`);
  };
  ctl(CTL_ADD, init.eventFd, EPOLLIN);

  const toBuffer = (u: Uint8Array): Buffer | undefined =>
    u.byteLength ? Buffer.from(u.buffer, u.byteOffset, u.byteLength) : undefined;

  const finish = (t: Tunnel, error?: string): void => {
    if (!tunnels.delete(t.id)) return;
    inFlight -= t.up.inPipe + t.down.inPipe;
    for (const [fd, m] of t.mask) if (m) ctl(CTL_DEL, fd, 0);
    for (const fd of t.fds) {
      byFd.delete(fd);
      c.close(fd);
    }
    const end: EndMessage = {
      op: 'end',
      id: t.id,
      bytesUp: t.up.bytes,
      bytesDown: t.down.bytes,
      ...(error ? { error } : {}),
    };
    wt.parentPort?.postMessage(end);
  };

  /** Move what can be moved in one direction now; throws on a socket error. */
  const pump = (t: Tunnel, d: Dir): void => {
    for (let i = 0; i < STEPS; i++) {
      if (d.prefix) {
        const n = c.write(d.to, d.prefix, d.prefix.length);
        if (n < 0) {
          const e = c.errno();
          if (e === EAGAIN) return;
          if (e === EINTR) continue;
          throw new Error(errName(e));
        }
        d.bytes += n;
        d.prefix = n < d.prefix.length ? d.prefix.subarray(n) : undefined;
        t.lastActive = Date.now();
      } else if (d.inPipe > 0) {
        const n = c.splice(d.pipeR, null, d.to, null, d.inPipe, SPLICE_FLAGS);
        if (n < 0) {
          const e = c.errno();
          if (e === EAGAIN) return;
          if (e === EINTR) continue;
          throw new Error(errName(e));
        }
        d.inPipe -= n;
        inFlight -= n;
        d.bytes += n;
        t.lastActive = Date.now();
      } else if (!d.eof) {
        const len = inFlight < init.budgetBytes ? init.bigReadBytes : init.smallReadBytes;
        const n = c.splice(d.from, null, d.pipeW, null, len, SPLICE_FLAGS);
        if (n < 0) {
          const e = c.errno();
          if (e === EAGAIN) return;
          if (e === EINTR) continue;
          throw new Error(errName(e));
        }
        if (n === 0) d.eof = true;
        d.inPipe = n;
        inFlight += n;
      } else {
        if (!d.shut) {
          d.shut = true;
          c.shutdown(d.to, SHUT_WR); // may fail if the peer is gone: the other direction will tell
        }
        return;
      }
    }
  };

  /** Register exactly the readiness each socket is waited for (none: not in the epoll set at all). */
  const want = (t: Tunnel): void => {
    const reads = (d: Dir): boolean => !d.eof && !d.prefix && d.inPipe === 0;
    const writes = (d: Dir): boolean => !!d.prefix || d.inPipe > 0;
    const masks: Array<[number, number]> = [
      [t.up.from, (reads(t.up) ? EPOLLIN : 0) | (writes(t.down) ? EPOLLOUT : 0)],
      [t.down.from, (reads(t.down) ? EPOLLIN : 0) | (writes(t.up) ? EPOLLOUT : 0)],
    ];
    for (const [fd, m] of masks) {
      const cur = t.mask.get(fd) ?? 0;
      if (m === cur) continue;
      ctl(m === 0 ? CTL_DEL : cur === 0 ? CTL_ADD : CTL_MOD, fd, m);
      t.mask.set(fd, m);
    }
  };

  const service = (t: Tunnel): void => {
    try {
      pump(t, t.up);
      pump(t, t.down);
      if (t.up.shut && t.down.shut) return finish(t);
      want(t);
    } catch (e) {
      finish(t, (e as Error).message);
    }
  };

  const command = (m: Command): void => {
    if (m.op === 'close') {
      const t = tunnels.get(m.id);
      if (t) finish(t, 'closed');
      return;
    }
    const [a, b, upR, upW, downR, downW] = m.fds as [number, number, number, number, number, number];
    const dir = (from: number, to: number, pipeR: number, pipeW: number, prefix: Uint8Array): Dir => ({
      from,
      to,
      pipeR,
      pipeW,
      inPipe: 0,
      prefix: toBuffer(prefix),
      eof: false,
      shut: false,
      bytes: 0,
    });
    const t: Tunnel = {
      id: m.id,
      fds: m.fds,
      up: dir(a, b, upR, upW, m.upPrefix),
      down: dir(b, a, downR, downW, m.downPrefix),
      idleMs: m.idleMs,
      lastActive: Date.now(),
      mask: new Map(),
    };
    tunnels.set(t.id, t);
    byFd.set(a, t);
    byFd.set(b, t);
    service(t);
  };

  const counter = Buffer.alloc(8);
  let lastSweep = Date.now();
  while (Atomics.load(stop, 0) === 0) {
    const n = c.epollWait(ep, events, MAX_EVENTS, 1000);
    if (n < 0 && c.errno() !== EINTR) throw new Error(`epoll_wait: ${errName(c.errno())}`);
    const ready = new Set<Tunnel>();
    for (let i = 0; i < n; i++) {
      const fd = events.readInt32LE(i * init.epollEventSize + init.epollDataOffset);
      if (fd === init.eventFd) {
        c.read(init.eventFd, counter, 8); // reset the wake-up counter, then take every queued command
        for (let m = wt.receiveMessageOnPort(init.port); m; m = wt.receiveMessageOnPort(init.port)) {
          command(m.message as Command);
        }
      } else {
        const t = byFd.get(fd);
        if (t) ready.add(t);
      }
    }
    for (const t of ready) if (tunnels.has(t.id)) service(t);
    const now = Date.now();
    if (now - lastSweep >= 1000) {
      lastSweep = now;
      for (const t of [...tunnels.values()]) if (now - t.lastActive > t.idleMs) finish(t, 'idle');
    }
  }
  for (const t of [...tunnels.values()]) finish(t, 'closed');
  c.close(ep);
  init.port.close();
}

/** The worker's whole program. `__name`: tsx (esbuild keepNames) wraps functions in it when compiling. */
const WORKER_SOURCE = [
  'const __name = (f) => f;',
  `const wt = require('node:worker_threads');`,
  `(${relayWorker.toString()})(wt, require(wt.workerData.koffiPath), ${bindRelayLibc.toString()});`,
].join('\n');

interface Live {
  readonly worker: Worker;
  readonly port: MessagePort;
  readonly eventFd: number;
  readonly stop: Int32Array;
  readonly onProcessExit: () => void;
}

interface Pending {
  readonly live: Live;
  readonly fds: readonly number[];
  readonly resolve: (r: RelayResult) => void;
}

/** Main-thread side: hands socket pairs to the worker and reports when each tunnel ends. */
export class SpliceRelay {
  private live: Live | undefined;
  private readonly pending = new Map<number, Pending>();
  private nextId = 1;
  private readonly one = Buffer.from([1, 0, 0, 0, 0, 0, 0, 0]); // an eventfd increment (u64 1)

  private constructor(
    private readonly c: RelayLibc,
    private readonly koffiPath: string,
    private readonly logger: Logger,
  ) {}

  /** The relay, or undefined where splice(2) through koffi is not available (streams are used then). */
  static create(logger: Logger): SpliceRelay | undefined {
    if (process.platform !== 'linux' || (process.arch !== 'x64' && process.arch !== 'arm64')) return undefined;
    try {
      const req = createRequire(import.meta.url);
      const koffiPath = req.resolve('koffi');
      return new SpliceRelay(bindRelayLibc(req(koffiPath) as Koffi), koffiPath, logger);
    } catch (e) {
      logger.warn({ err: (e as Error).message }, 'egress: zero-copy relay unavailable; using streams');
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
      this.logger.warn({ err: (e as Error).message }, 'egress: zero-copy relay did not start');
    }
  }

  /**
   * Take over client <-> upstream. Returns undefined (nothing taken, nothing consumed; use streams)
   * when a socket is not a plain fd-backed socket in a clean state, or when an fd cannot be made.
   * Callers must have let pending writes finish (see `flushed`).
   */
  take(client: Socket, upstream: Socket, o: { upPrefix?: Buffer; idleMs: number }): RelayedTunnel | undefined {
    const fa = handoffFd(client);
    const fb = handoffFd(upstream);
    if (fa === undefined || fb === undefined) return undefined;
    const fds: number[] = [];
    let live: Live;
    try {
      live = this.start();
      fds.push(this.dup(fa), this.dup(fb), ...this.pipe(), ...this.pipe());
    } catch (e) {
      for (const fd of fds) this.c.close(fd);
      this.logger.warn({ err: (e as Error).message }, 'egress: zero-copy hand-off failed; using streams');
      return undefined;
    }
    // Nothing below can fail. Bytes Node read but nobody consumed go first; then Node lets go.
    const upPrefix = Buffer.concat([o.upPrefix ?? Buffer.alloc(0), ...unread(client)]);
    const downPrefix = Buffer.concat(unread(upstream));
    client.destroy();
    upstream.destroy();
    const id = this.nextId++;
    let resolve!: (r: RelayResult) => void;
    const done = new Promise<RelayResult>((r) => (resolve = r));
    this.pending.set(id, { live, fds, resolve });
    live.worker.ref(); // a live tunnel keeps the process alive, as its sockets did
    this.send(live, { op: 'add', id, fds, upPrefix, downPrefix, idleMs: o.idleMs });
    return {
      done,
      close: () => {
        const p = this.pending.get(id);
        if (p) this.send(p.live, { op: 'close', id });
      },
    };
  }

  /** End every tunnel (each `done` settles) and stop the worker. */
  async close(): Promise<void> {
    const live = this.live;
    if (!live) return;
    const exited = new Promise<void>((r) => live.worker.once('exit', () => r()));
    live.worker.ref(); // until it has exited
    live.onProcessExit(); // stop flag + wake-up: the worker ends every tunnel and returns
    await exited;
  }

  private start(): Live {
    if (this.live) return this.live;
    const eventFd = this.c.eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (eventFd < 0) throw new Error(`eventfd: errno ${this.c.errno()}`);
    const { port1, port2 } = new MessageChannel();
    port1.unref(); // commands only go out on it; the worker's ref/unref decides what stays alive
    const stop = new Int32Array(new SharedArrayBuffer(4));
    const x64 = process.arch === 'x64';
    let worker: Worker;
    try {
      worker = new Worker(WORKER_SOURCE, {
        eval: true,
        workerData: {
          port: port2,
          eventFd,
          stop: stop.buffer,
          koffiPath: this.koffiPath,
          epollEventSize: x64 ? 12 : 16,
          epollDataOffset: x64 ? 4 : 8,
          bigReadBytes: PIPE_BYTES,
          smallReadBytes: SMALL_READ_BYTES,
          budgetBytes: RELAY_BUDGET_BYTES,
        },
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
    const live: Live = { worker, port: port1, eventFd, stop, onProcessExit };
    process.once('exit', onProcessExit);
    worker.on('message', (m: EndMessage) => this.onEnd(m));
    worker.on('error', (e) => this.logger.error({ err: e.message }, 'egress: zero-copy relay failed'));
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
    process.removeListener('exit', live.onProcessExit);
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
    const d = this.c.fcntl(fd, F_DUPFD_CLOEXEC, 'int', 3);
    if (d < 0) throw new Error(`dup: errno ${this.c.errno()}`);
    // libuv made the socket non-blocking; the relay depends on it, so make sure.
    const fl = this.c.fcntl(d, F_GETFL);
    if (fl < 0 || (!(fl & O_NONBLOCK) && this.c.fcntl(d, F_SETFL, 'int', fl | O_NONBLOCK) < 0)) {
      this.c.close(d);
      throw new Error(`fcntl: errno ${this.c.errno()}`);
    }
    return d;
  }

  private pipe(): [number, number] {
    const b = Buffer.alloc(8);
    if (this.c.pipe2(b, O_CLOEXEC | O_NONBLOCK) < 0) throw new Error(`pipe2: errno ${this.c.errno()}`);
    const [r, w] = [b.readInt32LE(0), b.readInt32LE(4)];
    this.c.fcntl(w, F_SETPIPE_SZ, 'int', PIPE_BYTES); // best effort: the default 64 KiB also works
    return [r, w];
  }
}

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
