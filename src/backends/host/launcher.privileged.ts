// SECURITY-CRITICAL (privileged): the mount namespace bwrap starts in.
//
// bwrap copies the mount namespace it starts in, and after each of its bind mounts it reads the
// whole mount table again (to find the submounts to remount): its CPU grows with every mount the
// host has, and with every other live sandbox's disk and devpts (1,000 live sandboxes made one exec
// 10–14× slower). So each sandbox's bwrap starts in a mount namespace of its own that holds only:
//   - a base, made once per process: a tmpfs root, /usr and /dev/null (bound), /proc (its own instance), and
//     clones of the state dir's shared read-only dirs bwrap binds from (the generated /etc, the /dev
//     tree, the public CA files), each at its host path;
//   - the sandbox's own dir with everything mounted under it (disk, devpts, workspace overlay,
//     layers, read-only mounts), cloned (open_tree) from the host once its host state is complete.
// bwrap then sees none of the host's other mounts, and none of any other sandbox: that is less than
// before (it used to start in the host's namespace), and nothing a sandbox sees changes (bwrap binds
// the same paths).
//
// A thread can only change mount namespace if it shares no filesystem attributes (cwd, root, umask)
// with another thread, so this is done on a worker thread of its own, which unshares them: Node's
// main thread (where user code may chdir) is never touched. The worker runs launcher-worker.privileged.ts and
// binds libc itself (bindLibc); the main thread calls it synchronously (a request on a message port,
// a wake-up through a shared Int32Array, and an Atomics.wait for the answer: ~35 µs). The worker
// also starts every bwrap (posix_spawn with the sandbox's identity, in its netns and launch
// namespace; posixSpawnAs), so bwrap's parent-death signal is tied to that thread: it never exits
// while the process lives, and if it ever died, every sandbox process would die with it. Warm slots
// ask it for their network and launch namespaces without waiting (callAsync: each request and reply
// carries an id), so the event loop goes on meanwhile; a spawn waits for the answer.
// If the worker cannot be started or set up, Airlock starts bwrap as before (from the host's
// namespace) and says why once.
import { closeSync } from 'node:fs';
import { dirname } from 'node:path';
import { MessageChannel, receiveMessageOnPort, type MessagePort, type Worker } from 'node:worker_threads';
import { AirlockError } from '../../core/errors.js';
import { libc } from '../../core/libc.privileged.js';
import { closeGate } from '../../core/native-gate.js';
import { moduleWorker } from '../../core/worker.js';
import type { LauncherInit, Reply, Request } from './launcher-worker.privileged.js';
import type { SpawnCall } from './spawn.privileged.js';

const OPEN_TREE_CLONE = 1;
const OPEN_TREE_CLOEXEC = 0o2000000;
const AT_RECURSIVE = 0x8000;
const F_DUPFD_CLOEXEC = 1030;
/** ctrl's slot for the native gate (ctrl[0..2]: see launcher-worker.privileged.ts). */
const GATE = 3;
/** How long the first use waits for the worker to set up its base namespace. */
const START_TIMEOUT_MS = 10_000;

/** The process's launcher (see the header); undefined (with the reason) where it cannot run. */
export class Launcher {
  private static instance: Launcher | { failed: string } | undefined;
  private readonly ctrl = new Int32Array(new SharedArrayBuffer(16));
  private readonly port: MessagePort;
  private readonly worker: Worker;
  private nextId = 1;
  /** Asynchronous calls waiting for their reply (the port keeps Node alive only while there are some). */
  private readonly pending = new Map<number, { resolve(n: number): void; reject(e: Error): void }>();
  /** Host dirs already cloned into the base. */
  private readonly shared = new Set<string>();

  /**
   * Starts the worker without waiting for it, so that it sets up while this thread goes on (a
   * one-shot CLI run would otherwise wait for it on the critical path); get() waits for it.
   */
  static warm(): void {
    Launcher.instance ??= Launcher.start();
  }

  static get(): Launcher | { failed: string } {
    const l = (Launcher.instance ??= Launcher.start());
    if (l instanceof Launcher) {
      const failed = l.awaitSetUp();
      if (failed) Launcher.instance = { failed };
    }
    return Launcher.instance;
  }

  private static start(): Launcher | { failed: string } {
    try {
      return new Launcher();
    } catch (e) {
      return { failed: (e as Error).message };
    }
  }

  private constructor() {
    const { port1, port2 } = new MessageChannel();
    this.port = port1;
    this.worker = moduleWorker(import.meta.url, './launcher-worker.privileged', {
      workerData: { ctrl: this.ctrl.buffer, port: port2 } satisfies LauncherInit,
      transferList: [port2],
      stdout: false,
      stderr: false,
    });
    this.worker.unref(); // it lives as long as the process, and never keeps it alive
    // Node terminates the worker at exit: not while it is inside koffi (core/native-gate.ts).
    process.once('exit', () => closeGate(this.ctrl, GATE, START_TIMEOUT_MS));
    port1.on('message', (reply: Reply) => this.settle(reply));
    port1.unref();
  }

  private setUp = false;

  /** Waits (once) until the worker has set up its base namespace; the reason where it could not. */
  private awaitSetUp(): string | undefined {
    if (this.setUp) return undefined;
    if (Atomics.wait(this.ctrl, 2, 0, START_TIMEOUT_MS) === 'timed-out' || Atomics.load(this.ctrl, 2) !== 1) {
      void this.worker.terminate();
      return 'the launcher thread could not set up its mount namespace (see stderr)';
    }
    this.setUp = true;
    return undefined;
  }

  /** Hand `r` to the worker; its reply comes back with the same id. */
  private post(r: Request): number {
    const id = this.nextId++;
    this.port.postMessage({ ...r, id });
    Atomics.store(this.ctrl, 0, 1);
    Atomics.notify(this.ctrl, 0);
    return id;
  }

  /** A call that blocks this thread until the worker has answered it (replies to others are settled). */
  private call(r: Request): number {
    Atomics.store(this.ctrl, 1, 0);
    const id = this.post(r);
    for (;;) {
      // ctrl[1] is set after every reply: wake, clear it, then take what is there.
      Atomics.wait(this.ctrl, 1, 0);
      Atomics.store(this.ctrl, 1, 0);
      for (let m = receiveMessageOnPort(this.port); m; m = receiveMessageOnPort(this.port)) {
        const reply = m.message as Reply;
        if (reply.id === id) return unwrap(reply);
        this.settle(reply);
      }
    }
  }

  /** A call this thread does not wait for (the worker runs requests one at a time, in order). */
  private callAsync(r: Request): Promise<number> {
    return new Promise<number>((resolve, reject) => {
      if (this.pending.size === 0) this.port.ref();
      this.pending.set(this.post(r), { resolve, reject });
    });
  }

  private settle(reply: Reply): void {
    const p = this.pending.get(reply.id);
    if (!p) return;
    this.pending.delete(reply.id);
    if (this.pending.size === 0) this.port.unref();
    try {
      p.resolve(unwrap(reply));
    } catch (e) {
      p.reject(e as Error);
    }
  }

  /** A detached clone of host dir `path` (recursive with `recursive`): closed by the worker. */
  private static clone(path: string, recursive: boolean): number {
    const c = libc();
    const fd = c.openTree(-100, path, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | (recursive ? AT_RECURSIVE : 0));
    if (fd < 0) throw new AirlockError('INTERNAL', `open_tree ${path}: errno ${c.errno()}`);
    return fd;
  }

  /** Make host dir `path` visible at the same path in every launch namespace made from now on. */
  share(path: string): void {
    if (this.shared.has(path)) return;
    this.call({ op: 'share', fd: Launcher.clone(path, true), path });
    this.shared.add(path);
  }

  /**
   * A launch namespace for the sandbox whose dir is `dir` (its host mounts all made): an fd the
   * caller closes when the sandbox is gone.
   */
  sandboxNamespace(dir: string): number {
    return this.call(Launcher.sandboxRequest(dir));
  }

  /** sandboxNamespace() without blocking this thread meanwhile (warm slots). */
  async sandboxNamespaceAsync(dir: string): Promise<number> {
    return this.callAsync(Launcher.sandboxRequest(dir));
  }

  private static sandboxRequest(dir: string): Request {
    if (dirname(dir) === '/') throw new AirlockError('INTERNAL', `launcher: ${dir} has no parent dir`);
    return { op: 'sandbox', fd: Launcher.clone(dir, true), dir };
  }

  /** A new network namespace with only `lo` (up), made on the worker: an fd held by the caller. */
  netns(): Promise<number> {
    return this.callAsync({ op: 'netns' });
  }

  /**
   * An unconnected TCP socket made inside the network namespace `netns` (an fd the caller owns),
   * made on the worker so that no thread the rest of the process uses ever enters the namespace.
   * `netns` is dup'd here (the worker closes the dup), so it stays valid whatever the caller closes.
   */
  async tcpSocketIn(netns: number): Promise<number> {
    const c = libc();
    const dup = c.fcntl(netns, F_DUPFD_CLOEXEC, 3);
    if (dup < 0) throw new AirlockError('INTERNAL', `launcher: dup netns: errno ${c.errno()}`);
    return this.callAsync({ op: 'tcpSocket', netns: dup });
  }

  /** Add the mount at host path `path` (under the sandbox's dir) to its launch namespace `mntns`. */
  addMount(mntns: number, path: string): void {
    this.call({ op: 'add', fd: Launcher.clone(path, false), mntns, path });
  }

  /** addMount() without blocking this thread meanwhile (warm slots). */
  async addMountAsync(mntns: number, path: string): Promise<void> {
    await this.callAsync({ op: 'add', fd: Launcher.clone(path, false), mntns, path });
  }

  /** posix_spawn `call` in launch namespace `mntns` (and netns `netns`): the pid. */
  spawn(call: SpawnCall, mntns: number, netns: number | undefined): number {
    return this.call({ op: 'spawn', call, mntns, netns });
  }
}

function unwrap(reply: Reply): number {
  if ('ok' in reply) return reply.ok;
  throw Object.assign(new AirlockError('INTERNAL', `launcher: ${reply.error}`), { errno: reply.errno });
}

/**
 * Close a launch namespace fd (nothing for undefined), off the event loop: dropping the last
 * reference to a mount namespace unmounts its mounts and can wait for an RCU grace period (0.5 ms
 * on this thread otherwise).
 */
export async function closeLaunchNamespace(fd: number | undefined): Promise<void> {
  if (fd === undefined) return;
  // Only if the call could not be made at all: close(2) releases the fd even when it fails, so a
  // second close could hit a number that has been reused meanwhile.
  await libc()
    .closeAsync(fd)
    .catch(() => closeSync(fd));
}
