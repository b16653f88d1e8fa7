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
// main thread (where user code may chdir) is never touched. The worker runs only the code below and
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
import { MessageChannel, receiveMessageOnPort, Worker, type MessagePort } from 'node:worker_threads';
import type * as WorkerThreads from 'node:worker_threads';
import { AirlockError } from '../../core/errors.js';
import { bindLibc, koffiPath, libc, type Koffi, type SyncLibc } from '../../core/libc.privileged.js';
import { loUp } from './netns.privileged.js';
import { posixSpawnAs, withIdentity, type SpawnCall } from './spawn.privileged.js';

const OPEN_TREE_CLONE = 1;
const OPEN_TREE_CLOEXEC = 0o2000000;
const AT_RECURSIVE = 0x8000;
/** How long the first use waits for the worker to set up its base namespace. */
const START_TIMEOUT_MS = 10_000;

type Request =
  | { op: 'share'; fd: number; path: string }
  | { op: 'sandbox'; fd: number; dir: string }
  | { op: 'add'; fd: number; mntns: number; path: string }
  | { op: 'spawn'; call: SpawnCall; mntns: number; netns: number | undefined }
  | { op: 'netns' };
/** Every request carries an id its reply repeats: synchronous and asynchronous calls share the port. */
type Reply = ({ ok: number } | { error: string; errno?: number }) & { id: number };

interface LauncherInit {
  readonly koffiPath: string;
  readonly ctrl: SharedArrayBuffer;
  readonly port: MessagePort;
}

/**
 * The worker's program (self-contained: it runs from its source). ctrl[0]: requests waiting (set by
 * the main thread); ctrl[1]: answer ready; ctrl[2]: 1 once set up, -1 if that failed.
 */
function launcherWorker(
  wt: typeof WorkerThreads,
  fs: typeof import('node:fs'),
  loadKoffi: () => Koffi,
  bind: typeof bindLibc,
  spawnAs: typeof posixSpawnAs,
  up: typeof loUp,
): void {
  const CLONE_NEWNS = 0x20000;
  const CLONE_NEWNET = 0x40000000;
  const MS_NOSUID = 0x2;
  const MS_NODEV = 0x4;
  const MS_NOEXEC = 0x8;
  const MS_BIND = 0x1000;
  const MS_REC = 0x4000;
  const MS_PRIVATE = 0x40000;
  const MNT_DETACH = 2;
  const O_RDONLY_CLOEXEC = 0o2000000;
  const MOVE_MOUNT_F_EMPTY_PATH = 4;
  const init = wt.workerData as LauncherInit;
  const ctrl = new Int32Array(init.ctrl);
  const port = init.port;
  let c: SyncLibc; // bound in the set-up below (a failure there is reported, not thrown)
  const check = (r: number, what: string): number => {
    if (r < 0) throw Object.assign(new Error(`${what}: errno ${c.errno()}`), { errno: c.errno() });
    return r;
  };
  // The whole process must not go on (process.abort and process.exit do not, or only end this
  // thread, in a worker): SIGKILL it.
  const fatal = (why: string): never => {
    fs.writeSync(2, `airlock launcher: ${why}; killing the process\n`);
    process.kill(process.pid, 'SIGKILL');
    throw new Error(why);
  };
  let base = -1;
  let hostNet = -1;
  /** mkdir -p on the base's root tmpfs (root-owned, 0755). */
  const mkdirs = (p: string): void => void fs.mkdirSync(p, { recursive: true, mode: 0o755 });

  function setUp(): void {
    hostNet = check(c.open('/proc/thread-self/ns/net', O_RDONLY_CLOEXEC), 'open netns');
    // A mount namespace for this thread only (which also unshares its cwd/root/umask), receiving no
    // events from the host's.
    check(c.unshare(CLONE_NEWNS), 'unshare(CLONE_NEWNS)');
    check(c.mount(null, '/', null, MS_REC | MS_PRIVATE, null), 'make / private');
    const root = '/tmp'; // any existing dir: the tmpfs covers it in this namespace only
    check(
      c.mount('airlock-launch', root, 'tmpfs', MS_NOSUID | MS_NODEV | MS_NOEXEC, 'mode=755,size=1m'),
      'tmpfs',
    );
    // tmp: where bwrap mounts its own root tmpfs (in its own namespace: this one stays empty).
    for (const d of ['usr', 'proc', 'dev', 'tmp', '.old']) fs.mkdirSync(`${root}/${d}`, { mode: 0o755 });
    // posix_spawn opens /dev/null for the fds a child gets no pipe on.
    fs.writeFileSync(`${root}/dev/null`, '', { mode: 0o644 });
    check(c.mount('/dev/null', `${root}/dev/null`, null, MS_BIND, null), 'bind /dev/null');
    check(c.mount('/usr', `${root}/usr`, null, MS_BIND | MS_REC, null), 'bind /usr');
    check(c.mount('proc', `${root}/proc`, 'proc', MS_NOSUID | MS_NODEV | MS_NOEXEC, null), 'proc');
    // /bin, /lib … : the host's symlinks into /usr; a real dir is bound as it is.
    for (const top of ['bin', 'sbin', 'lib', 'lib64', 'lib32', 'libx32']) {
      let st;
      try {
        st = fs.lstatSync(`/${top}`);
      } catch {
        continue;
      }
      if (st.isSymbolicLink()) fs.symlinkSync(fs.readlinkSync(`/${top}`), `${root}/${top}`);
      else if (st.isDirectory()) {
        fs.mkdirSync(`${root}/${top}`, { mode: 0o755 });
        check(c.mount(`/${top}`, `${root}/${top}`, null, MS_BIND | MS_REC, null), `bind /${top}`);
      }
    }
    check(c.pivotRoot(root, `${root}/.old`), 'pivot_root');
    check(c.chdir('/'), 'chdir');
    check(c.umount2('/.old', MNT_DETACH), 'detach the old root');
    fs.rmdirSync('/.old');
    base = check(c.open('/proc/thread-self/ns/mnt', O_RDONLY_CLOEXEC), 'open mntns');
  }

  /** Back to the base namespace and the host's netns; a thread that cannot go back must not go on. */
  function restore(): void {
    if (c.setns(base, CLONE_NEWNS) !== 0)
      fatal(`cannot return to the base mount namespace (errno ${c.errno()})`);
    restoreNet();
  }

  function restoreNet(): void {
    if (c.setns(hostNet, CLONE_NEWNET) !== 0) fatal(`cannot return to the host netns (errno ${c.errno()})`);
  }

  function handle(r: Request): number {
    switch (r.op) {
      case 'share': {
        // A detached clone of a host dir, placed at the same path in the base (once: see share()).
        try {
          mkdirs(r.path);
          check(c.moveMount(r.fd, '', -100, r.path, MOVE_MOUNT_F_EMPTY_PATH), `move_mount ${r.path}`);
          return 0;
        } finally {
          c.close(r.fd);
        }
      }
      case 'sandbox': {
        // A namespace copied from the base, with the sandbox's dir (a detached clone of its tree)
        // at its host path, on a tmpfs of this namespace only (so the base never holds its dirs).
        try {
          mkdirs(fsDirname(r.dir));
          check(c.unshare(CLONE_NEWNS), 'unshare(CLONE_NEWNS)');
          try {
            check(
              c.mount(
                'airlock-launch',
                fsDirname(r.dir),
                'tmpfs',
                MS_NOSUID | MS_NODEV | MS_NOEXEC,
                'mode=711,size=64k',
              ),
              'tmpfs',
            );
            fs.mkdirSync(r.dir, { mode: 0o711 });
            check(c.moveMount(r.fd, '', -100, r.dir, MOVE_MOUNT_F_EMPTY_PATH), `move_mount ${r.dir}`);
            // Nothing done in here (bwrap makes its own namespace a slave anyway) goes back to the host.
            check(c.mount(null, r.dir, null, MS_REC | MS_PRIVATE, null), 'make private');
            return check(c.open('/proc/thread-self/ns/mnt', O_RDONLY_CLOEXEC), 'open mntns');
          } finally {
            restore();
          }
        } finally {
          c.close(r.fd);
        }
      }
      case 'add': {
        // One more mount (a detached clone) at its host path in a sandbox's launch namespace.
        try {
          check(c.setns(r.mntns, CLONE_NEWNS), 'setns(mnt)');
          try {
            check(c.moveMount(r.fd, '', -100, r.path, MOVE_MOUNT_F_EMPTY_PATH), `move_mount ${r.path}`);
            check(c.mount(null, r.path, null, MS_REC | MS_PRIVATE, null), 'make private');
            return 0;
          } finally {
            restore();
          }
        } finally {
          c.close(r.fd);
        }
      }
      case 'netns': {
        // A sandbox's network namespace with only `lo` (up), held by the returned fd: createNetns's
        // steps (netns.privileged.ts), off the main thread.
        check(c.unshare(CLONE_NEWNET), 'unshare(CLONE_NEWNET)');
        try {
          up(c);
          return check(c.open('/proc/thread-self/ns/net', O_RDONLY_CLOEXEC), 'open netns');
        } finally {
          restoreNet();
        }
      }
      case 'spawn': {
        check(c.setns(r.mntns, CLONE_NEWNS), 'setns(mnt)');
        try {
          if (r.netns !== undefined) check(c.setns(r.netns, CLONE_NEWNET), 'setns(net)');
          return spawnAs(c, r.call, cache, fatal);
        } finally {
          restore();
        }
      }
    }
  }

  function fsDirname(p: string): string {
    return p.slice(0, p.lastIndexOf('/')) || '/';
  }

  const cache: { attr?: Buffer } = {};
  try {
    c = bind(loadKoffi());
    setUp();
  } catch (e) {
    process.stderr.write(`airlock launcher: ${(e as Error).message}\n`);
    Atomics.store(ctrl, 2, -1);
    Atomics.notify(ctrl, 2);
    return;
  }
  Atomics.store(ctrl, 2, 1);
  Atomics.notify(ctrl, 2);
  for (;;) {
    Atomics.wait(ctrl, 0, 0);
    Atomics.store(ctrl, 0, 0);
    for (let m = wt.receiveMessageOnPort(port); m; m = wt.receiveMessageOnPort(port)) {
      const r = m.message as Request & { id: number };
      let reply: Reply;
      try {
        reply = { id: r.id, ok: handle(r) };
      } catch (e) {
        const errno = (e as { errno?: number }).errno;
        reply = { id: r.id, error: (e as Error).message, ...(errno !== undefined ? { errno } : {}) };
      }
      port.postMessage(reply);
      Atomics.store(ctrl, 1, 1);
      Atomics.notify(ctrl, 1);
    }
  }
}

/** The worker's whole program. `__name`: tsx (esbuild keepNames) wraps functions in it when compiling. */
const LAUNCHER_SOURCE = [
  'const __name = (f) => f;',
  `const wt = require('node:worker_threads');`,
  withIdentity.toString(),
  `(${launcherWorker.toString()})(wt, require('node:fs'), () => require(wt.workerData.koffiPath), ${bindLibc.toString()}, ${posixSpawnAs.toString()}, ${loUp.toString()});`,
].join('\n');

/** The process's launcher (see the header); undefined (with the reason) where it cannot run. */
export class Launcher {
  private static instance: Launcher | { failed: string } | undefined;
  private readonly ctrl = new Int32Array(new SharedArrayBuffer(12));
  private readonly port: MessagePort;
  private readonly worker: Worker;
  private nextId = 1;
  /** Asynchronous calls waiting for their reply (the port keeps Node alive only while there are some). */
  private readonly pending = new Map<number, { resolve(n: number): void; reject(e: Error): void }>();
  /** Host dirs already cloned into the base. */
  private readonly shared = new Set<string>();

  static get(): Launcher | { failed: string } {
    Launcher.instance ??= Launcher.start();
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
    this.worker = new Worker(LAUNCHER_SOURCE, {
      eval: true,
      workerData: { koffiPath: koffiPath(), ctrl: this.ctrl.buffer, port: port2 } satisfies LauncherInit,
      transferList: [port2],
      stdout: false,
      stderr: false,
    });
    this.worker.unref(); // it lives as long as the process, and never keeps it alive
    port1.on('message', (reply: Reply) => this.settle(reply));
    port1.unref();
    // Set up synchronously before first use (tens of ms, once per process).
    if (Atomics.wait(this.ctrl, 2, 0, START_TIMEOUT_MS) === 'timed-out' || Atomics.load(this.ctrl, 2) !== 1) {
      void this.worker.terminate();
      throw new Error('the launcher thread could not set up its mount namespace (see stderr)');
    }
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
