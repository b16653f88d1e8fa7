// SECURITY-CRITICAL (privileged): the launcher's worker thread (see launcher.privileged.ts, which
// starts it with moduleWorker). It unshares its filesystem attributes and mount namespace, builds the
// base launch namespace, then serves requests from the main thread one at a time: clones shared into
// the base, a launch namespace per sandbox, mounts added to one, network namespaces, and every bwrap
// spawn (posix_spawn with the sandbox's identity, so bwrap's parent-death signal is tied to this
// thread). Its libc comes from the one binding table (core/libc.privileged.ts, bindLibc).
// ctrl[0]: requests waiting (set by the main thread); ctrl[1]: answer ready; ctrl[2]: 1 once set up,
// -1 if that failed; ctrl[3]: the native gate (core/native-gate.ts: the process never exits while this
// thread is inside koffi).
import * as fs from 'node:fs';
import { createRequire } from 'node:module';
import { receiveMessageOnPort, workerData, type MessagePort } from 'node:worker_threads';
import { bindLibc, type Koffi, type SyncLibc } from '../../core/libc.privileged.js';
import { enterNative, leaveNative } from '../../core/native-gate.js';
import { loUp } from './netns.privileged.js';
import { posixSpawnAs, type SpawnCall } from './spawn.privileged.js';

/** What the main thread asks of the worker. */
export type Request =
  | { op: 'share'; fd: number; path: string }
  | { op: 'sandbox'; fd: number; dir: string }
  | { op: 'add'; fd: number; mntns: number; path: string }
  | { op: 'spawn'; call: SpawnCall; mntns: number; netns: number | undefined }
  | { op: 'netns' }
  | { op: 'tcpSocket'; netns: number };
/** Every request carries an id its reply repeats: synchronous and asynchronous calls share the port. */
export type Reply = ({ ok: number } | { error: string; errno?: number }) & { id: number };

export interface LauncherInit {
  readonly ctrl: SharedArrayBuffer;
  readonly port: MessagePort;
}

const CLONE_NEWNS = 0x20000;
const CLONE_NEWNET = 0x40000000;
const AF_INET = 2;
const SOCK_STREAM = 1;
const SOCK_NONBLOCK = 0o4000;
const SOCK_CLOEXEC = 0o2000000;
const MS_NOSUID = 0x2;
const MS_NODEV = 0x4;
const MS_NOEXEC = 0x8;
const MS_BIND = 0x1000;
const MS_REC = 0x4000;
const MS_PRIVATE = 0x40000;
const MNT_DETACH = 2;
const O_RDONLY_CLOEXEC = 0o2000000;
const MOVE_MOUNT_F_EMPTY_PATH = 4;
/** ctrl's slot for the native gate. */
const GATE = 3;
const init = workerData as LauncherInit;
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
        loUp(c);
        return check(c.open('/proc/thread-self/ns/net', O_RDONLY_CLOEXEC), 'open netns');
      } finally {
        restoreNet();
      }
    }
    case 'tcpSocket': {
      // An unconnected TCP socket that belongs to the sandbox's netns (`netns`: a dup this thread
      // closes). A socket keeps the namespace it was made in for life, wherever it is used: the main
      // thread connects it (to the sandbox's loopback only; see port-dial.privileged.ts).
      try {
        check(c.setns(r.netns, CLONE_NEWNET), 'setns(net)');
        try {
          return check(c.socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), 'socket');
        } finally {
          restoreNet();
        }
      } finally {
        c.close(r.netns);
      }
    }
    case 'spawn': {
      check(c.setns(r.mntns, CLONE_NEWNS), 'setns(mnt)');
      try {
        if (r.netns !== undefined) check(c.setns(r.netns, CLONE_NEWNET), 'setns(net)');
        return posixSpawnAs(c, r.call, cache, fatal);
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

/** Bind libc and build the base namespace; false (said on stderr) if that fails. */
function start(): boolean {
  try {
    c = bindLibc(createRequire(import.meta.url)('koffi') as Koffi);
    setUp();
    return true;
  } catch (e) {
    process.stderr.write(`airlock launcher: ${(e as Error).message}\n`);
    return false;
  }
}

/** Answer requests as they come, for as long as the process lives (until it starts exiting). */
function serve(): void {
  for (;;) {
    Atomics.wait(ctrl, 0, 0);
    if (!enterNative(ctrl, GATE)) return;
    Atomics.store(ctrl, 0, 0);
    for (let m = receiveMessageOnPort(port); m; m = receiveMessageOnPort(port)) {
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
    leaveNative(ctrl, GATE);
  }
}

// Set-up (koffi's load and binding included) runs inside the gate; nothing starts once the process exits.
const ok = enterNative(ctrl, GATE) && start();
Atomics.store(ctrl, 2, ok ? 1 : -1);
Atomics.notify(ctrl, 2);
leaveNative(ctrl, GATE);
if (ok) serve();
