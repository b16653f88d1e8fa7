// The host side of the guest agent's connection: one virtio-serial port (a unix socket QEMU listens on)
// carrying every exec of the sandbox, multiplexed by id. Frames from the guest are checked by
// protocol.ts; a violation, or the VM going away, ends every exec as killed and fails every request.
import { constants } from 'node:os';
import type { Socket } from 'node:net';
import { PassThrough, Writable } from 'node:stream';
import type { BackendProcess, LimitCounters, ProcessExit } from '../../core/backend.js';
import { AirlockError } from '../../core/errors.js';
import {
  Frame,
  FrameDecoder,
  MAX_FILE_BYTES,
  encodeExec,
  encodeFileWrite,
  encodeFrame,
  encodeIdentity,
  type ExecRequest,
  type Identity,
  type GuestFrame,
} from './protocol.js';

/** stdin is sent in chunks of at most this size (well under the frame bound). */
const STDIN_CHUNK = 256 * 1024;
const SIGNAL_NAMES = new Map<number, NodeJS.Signals>(
  Object.entries(constants.signals).map(([name, n]) => [n, name as NodeJS.Signals]),
);

interface Exec {
  readonly stdout: PassThrough;
  readonly stderr: PassThrough;
  /** `counters`: the sandbox's as the process started (STARTED carries them). */
  started?: (pid: number, counters: LimitCounters) => void;
  failed?: (e: Error) => void;
  /** `counters`: the sandbox's once the exec was gone (EXIT carries them); none if the VM went. */
  exit: (x: ProcessExit, counters?: LimitCounters) => void;
}

/** What a process whose VM went away was counted with (no reading, so no delta). */
const NO_COUNTS: LimitCounters = { oomKills: 0, pidsLimitHits: 0 };

interface Request {
  readonly resolve: (f: GuestFrame) => void;
  readonly reject: (e: Error) => void;
}

export class AgentConnection {
  private readonly decoder = new FrameDecoder();
  private nextId = 1;
  private readonly execs = new Map<number, Exec>();
  private readonly requests = new Map<number, Request>();
  private closedWith: Error | undefined;
  private helloSeen = false;
  private readonly helloWaiters: Array<{ resolve: () => void; reject: (e: Error) => void }> = [];

  /** Ids below this were the saved VM's (a restored connection): their late frames are dropped. */
  private readonly inheritedBelow: number;

  /**
   * `restored`: the guest was loaded from a snapshot, its agent already past HELLO, with requests
   * of the saved connection (ids below `nextId`) possibly still running: their frames are dropped
   * and new ids start at `nextId`, so no two ever meet in the guest.
   */
  constructor(
    private readonly sock: Socket,
    restored?: { readonly nextId: number },
  ) {
    this.inheritedBelow = restored?.nextId ?? 0;
    if (restored) {
      this.helloSeen = true;
      this.nextId = restored.nextId;
    }
    sock.on('data', (chunk: Buffer) => {
      let frames: GuestFrame[];
      try {
        frames = this.decoder.push(chunk);
      } catch (e) {
        this.close(e as Error);
        return;
      }
      for (const f of frames) this.onFrame(f);
    });
    sock.on('error', (e) => this.close(e));
    sock.on('close', () => this.close(new AirlockError('SANDBOX_GONE', 'the microVM is gone')));
  }

  /** Resolves on the agent's HELLO (the guest booted); rejects if the connection ends first. */
  ready(): Promise<void> {
    if (this.helloSeen) return Promise.resolve();
    if (this.closedWith) return Promise.reject(this.closedWith);
    return new Promise((resolve, reject) => this.helloWaiters.push({ resolve, reject }));
  }

  /** The id the next request gets (a snapshot records it: see the constructor). */
  get nextRequestId(): number {
    return this.nextId;
  }

  /** Execs running in the guest for this connection. */
  get running(): number {
    return this.execs.size;
  }

  get closed(): boolean {
    return this.closedWith !== undefined;
  }

  private onFrame(f: GuestFrame): void {
    if (f.type === 'hello') {
      if (this.helloSeen) return this.close(new AirlockError('INTERNAL', 'the guest agent said hello twice'));
      this.helloSeen = true;
      for (const w of this.helloWaiters.splice(0)) w.resolve();
      return;
    }
    if (!this.helloSeen)
      return this.close(new AirlockError('INTERNAL', 'the guest agent spoke before hello'));
    const x = this.execs.get(f.id);
    const r = this.requests.get(f.id);
    // The saved VM's execs carry on in the guest and speak to whoever holds the port now.
    if (!x && !r && f.id < this.inheritedBelow) return;
    switch (f.type) {
      case 'started':
        if (!x?.started) return this.close(new AirlockError('INTERNAL', `unexpected STARTED for ${f.id}`));
        x.started(f.pid, f.counters);
        x.started = undefined;
        x.failed = undefined;
        return;
      case 'stdout':
      case 'stderr':
        if (!x || x.started)
          return this.close(new AirlockError('INTERNAL', `output for unknown exec ${f.id}`));
        (f.type === 'stdout' ? x.stdout : x.stderr).write(f.data);
        return;
      case 'exit':
        if (!x || x.started) return this.close(new AirlockError('INTERNAL', `exit of unknown exec ${f.id}`));
        this.execs.delete(f.id);
        x.exit(
          {
            exitCode: f.code,
            signal: f.signal === null ? null : (SIGNAL_NAMES.get(f.signal) ?? 'SIGKILL'),
          },
          f.counters,
        );
        return;
      case 'error':
        if (x?.failed) {
          this.execs.delete(f.id);
          x.failed(new AirlockError('INTERNAL', `the guest agent could not start the process: ${f.message}`));
          return;
        }
        if (r) {
          this.requests.delete(f.id);
          r.reject(new AirlockError('FILE_NOT_FOUND', `guest: ${f.message}`));
          return;
        }
        return this.close(new AirlockError('INTERNAL', `error for unknown request ${f.id}: ${f.message}`));
      case 'file-data':
      case 'ok':
        if (!r) return this.close(new AirlockError('INTERNAL', `reply to unknown request ${f.id}`));
        this.requests.delete(f.id);
        r.resolve(f);
        return;
    }
  }

  /** Everything in flight ends: execs as killed (their VM is gone), requests with `why`. */
  close(why: Error): void {
    if (this.closedWith) return;
    this.closedWith = why;
    this.sock.destroy();
    for (const w of this.helloWaiters.splice(0)) w.reject(why);
    // An exec whose start was in flight is reported started and killed with the VM, like one
    // that had started: killing a sandbox ends its execs, it does not fail them.
    for (const [, x] of this.execs) {
      x.started?.(0, NO_COUNTS);
      x.exit({ exitCode: null, signal: 'SIGKILL' });
    }
    this.execs.clear();
    for (const [, r] of this.requests) r.reject(why);
    this.requests.clear();
  }

  private send(b: Buffer): boolean {
    if (this.closedWith) throw this.closedWith;
    return this.sock.write(b);
  }

  private id(): number {
    const id = this.nextId;
    this.nextId = this.nextId >= 0xffff_fff0 ? 1 : this.nextId + 1;
    return id;
  }

  /**
   * Start a process in the guest; resolves once the agent reports it started. The process carries
   * the sandbox's limit counters the agent read as it started and once it was gone.
   */
  async exec(req: ExecRequest): Promise<BackendProcess> {
    await this.ready();
    const id = this.id();
    const stdout = new PassThrough();
    const stderr = new PassThrough();
    let exitResolve!: (x: ProcessExit) => void;
    const exited = new Promise<ProcessExit>((r) => (exitResolve = r));
    let countsResolve!: (c: LimitCounters) => void;
    const atExit = new Promise<LimitCounters>((r) => (countsResolve = r));
    let done = false;
    let atStartSeen = NO_COUNTS;
    const started = new Promise<LimitCounters>((resolve, reject) => {
      this.execs.set(id, {
        stdout,
        stderr,
        started: (_pid, counters) => resolve((atStartSeen = counters)),
        failed: reject,
        exit: (x, counters) => {
          done = true;
          stdout.end();
          stderr.end();
          countsResolve(counters ?? atStartSeen); // no reading (the VM went): no change
          exitResolve(x);
        },
      });
    });
    this.send(encodeExec(id, req));
    const atStart = await started;
    const stdin = req.stdin ? this.stdinOf(id, () => done) : null;
    const proc: BackendProcess = {
      stdout,
      stderr,
      stdin,
      exited,
      counters: { atStart, atExit },
      kill: () => {
        if (done || this.closedWith) return;
        const p = Buffer.alloc(4);
        p.writeUInt32LE(constants.signals.SIGKILL, 0);
        this.send(encodeFrame(Frame.KILL, id, p));
      },
    };
    return proc;
  }

  /** A Writable whose bytes become STDIN frames (respecting the socket's backpressure); end → STDIN_EOF. */
  private stdinOf(id: number, done: () => boolean): Writable {
    const whenDrained = (cb: (e?: Error | null) => void, ok: boolean): void => {
      if (ok) cb();
      else this.sock.once('drain', () => cb());
    };
    return new Writable({
      write: (chunk: Buffer, _enc, cb) => {
        if (done() || this.closedWith) return cb(); // the process is gone: drop, like a closed pipe
        let ok = true;
        for (let o = 0; o < chunk.length; o += STDIN_CHUNK) {
          ok = this.send(encodeFrame(Frame.STDIN, id, chunk.subarray(o, o + STDIN_CHUNK)));
        }
        whenDrained(cb, ok);
      },
      final: (cb) => {
        if (!done() && !this.closedWith) this.send(encodeFrame(Frame.STDIN_EOF, id));
        cb();
      },
    });
  }

  /**
   * Send a request and wait for its answer. Once the agent said hello it is sent at the call, not a
   * turn later, so requests leave in the order they are called in (counters() before a spawn).
   */
  private request(frame: (id: number) => Buffer): Promise<GuestFrame> {
    const send = (): Promise<GuestFrame> =>
      new Promise<GuestFrame>((resolve, reject) => {
        const id = this.id();
        this.requests.set(id, { resolve, reject });
        this.send(frame(id));
      });
    return this.helloSeen ? send() : this.ready().then(send);
  }

  /** Read a guest file as root (bounded: FILE_TOO_LARGE over MAX_FILE_BYTES). Host-internal use only. */
  async readFile(path: string): Promise<Buffer> {
    checkPath(path);
    const f = await this.request((id) => encodeFrame(Frame.FILE_READ, id, Buffer.from(`${path}\0`))).catch(
      (e) => {
        if (AirlockError.isInstance(e) && /too large/.test(e.message))
          throw new AirlockError('FILE_TOO_LARGE', `${path} is over ${MAX_FILE_BYTES} bytes`);
        throw e;
      },
    );
    if (f.type !== 'file-data')
      throw new AirlockError('INTERNAL', 'the guest agent answered a read with no data');
    return f.data;
  }

  /** Write a guest file as root (bounded). Host-internal use only. */
  async writeFile(path: string, data: Buffer, mode = 0o644): Promise<void> {
    checkPath(path);
    if (data.length > MAX_FILE_BYTES) {
      throw new AirlockError('FILE_TOO_LARGE', `the agent writes at most ${MAX_FILE_BYTES} bytes at once`);
    }
    await this.request((id) => encodeFileWrite(id, path, mode, data));
  }

  /** Make the VM this sandbox (clock, RNG seed, hostname, limits: guest/agent.c do_identity). */
  async identify(x: Identity): Promise<void> {
    await this.request((id) => encodeIdentity(id, x)).catch((e) => {
      throw new AirlockError(
        'INTERNAL',
        `the guest agent refused the sandbox's identity: ${(e as Error).message}`,
      );
    });
  }

  /** Ask the guest to power off (it kills everything and syncs first). */
  shutdown(): void {
    if (!this.closedWith) this.send(encodeFrame(Frame.SHUTDOWN, 0));
  }
}

function checkPath(path: string): void {
  if (!path.startsWith('/') || path.includes('\0') || path.length > 4096) {
    throw new AirlockError('INVALID_ARGUMENT', 'a guest path is absolute, at most 4096 bytes, without NUL', {
      field: 'path',
    });
  }
}
