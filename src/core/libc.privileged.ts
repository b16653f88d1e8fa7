// SECURITY-CRITICAL (privileged): the only place Airlock calls libc directly. Node has no binding
// for mount(2), unshare(2), setns(2) or the new mount API, and spawning mount(8)/ip(8) costs
// milliseconds, so these few functions are bound through koffi (a maintained FFI library that ships
// prebuilt binaries). Each function is declared with its exact C prototype; callers check the
// return value and read errno right after the call, on the same thread.
import { closeSync, existsSync, openSync, readFileSync, readSync, realpathSync } from 'node:fs';
import { createRequire } from 'node:module';
import { join } from 'node:path';

export interface Libc {
  mount(
    src: string | null,
    target: string,
    fstype: string | null,
    flags: number,
    data: string | null,
  ): number;
  umount2(target: string, flags: number): number;
  /** umount2 on a worker thread (errno is not available: callers retry synchronously on failure). */
  umount2Async(target: string, flags: number): Promise<number>;
  /** close(2) on a worker thread (closing the last reference to a namespace can wait for RCU). */
  closeAsync(fd: number): Promise<number>;
  unshare(flags: number): number;
  /** flock(2): an advisory lock on an open file, released when the fd is closed. */
  flock(fd: number, op: number): number;
  setns(fd: number, nstype: number): number;
  socket(domain: number, type: number, proto: number): number;
  ioctl(fd: number, req: number, arg: Buffer): number;
  close(fd: number): number;
  bind(fd: number, addr: Buffer, len: number): number;
  listen(fd: number, backlog: number): number;
  setsockopt(fd: number, level: number, name: number, value: Buffer, len: number): number;
  /** `len` is a 4-byte buffer holding socklen_t in/out. */
  getsockopt(fd: number, level: number, name: number, value: Buffer, len: Buffer): number;
  /** send(fd, buf, len, flags) / recv(fd, buf, len, flags): netlink requests to the kernel. */
  send(fd: number, buf: Buffer, len: number, flags: number): number;
  recv(fd: number, buf: Buffer, len: number, flags: number): number;
  /** poll(fds, nfds, timeoutMs): `fds` holds nfds `struct pollfd { int fd; short events, revents }`. */
  poll(fds: Buffer, nfds: number, timeoutMs: number): number;
  /** open_tree(dfd, path, flags) */
  openTree(dfd: number, path: string, flags: number): number;
  /** mount_setattr(fd, path, flags, attr, size) */
  mountSetattr(fd: number, path: string, flags: number, attr: Buffer, size: number): number;
  /** move_mount(from_dfd, from_path, to_dfd, to_path, flags) */
  moveMount(fromFd: number, fromPath: string, toDfd: number, toPath: string, flags: number): number;
  /** pidfd_open(pid, 0): a handle on a process that can't be confused with a later one of the same pid. */
  pidfdOpen(pid: number): number;
  /** pidfd_send_signal(pidfd, sig, NULL, 0) */
  pidfdSignal(pidfd: number, sig: number): number;
  /** close_range(first, ~0U, CLOSE_RANGE_CLOEXEC): mark every fd >= first close-on-exec. */
  cloexecFrom(first: number): number;
  /** lgetxattr(path, name, value, size) (path: NUL-terminated bytes; never follows a final symlink). */
  lgetxattr(path: Buffer, name: string, value: Buffer, size: number): number;
  /** lsetxattr(path, name, value, size, flags) */
  lsetxattr(path: Buffer, name: string, value: Buffer, size: number, flags: number): number;
  /** mknod(path, mode, dev): FIFOs and overlayfs whiteouts (char 0/0) in snapshot layers. */
  mknod(path: Buffer, mode: number, dev: number): number;
  /** pipe2(fds, flags): `fds` is an 8-byte buffer receiving the read and write ends. */
  pipe2(fds: Buffer, flags: number): number;
  /** fcntl(fd, cmd, arg) with an int argument (F_DUPFD_CLOEXEC and the like). */
  fcntl(fd: number, cmd: number, arg: number): number;
  /** waitid(idtype, id, info, options): `info` is a 128-byte siginfo_t. */
  waitid(idtype: number, id: number, info: Buffer, options: number): number;
  /** posix_spawn(pid, path, file_actions, attr, argv, envp); returns an errno (0: started). */
  posixSpawn(
    pid: number[],
    path: string,
    fileActions: Buffer,
    attr: Buffer,
    argv: Array<string | null>,
    envp: Array<string | null>,
  ): number;
  spawnFileActionsInit(fa: Buffer): number;
  spawnFileActionsDestroy(fa: Buffer): number;
  spawnFileActionsAddDup2(fa: Buffer, fd: number, newFd: number): number;
  spawnFileActionsAddOpen(fa: Buffer, fd: number, path: string, flags: number, mode: number): number;
  spawnFileActionsAddChdir(fa: Buffer, path: string): number;
  spawnAttrInit(attr: Buffer): number;
  spawnAttrSetFlags(attr: Buffer, flags: number): number;
  spawnAttrSetSigDefault(attr: Buffer, set: Buffer): number;
  spawnAttrSetSigMask(attr: Buffer, set: Buffer): number;
  sigfillset(set: Buffer): number;
  sigemptyset(set: Buffer): number;
  /**
   * The raw setresuid/setresgid/setgroups system calls: unlike glibc's wrappers (which apply the
   * change to every thread of the process), these change only the calling thread's credentials.
   */
  threadSetresuid(r: number, e: number, s: number): number;
  threadSetresgid(r: number, e: number, s: number): number;
  threadSetgroups(n: number, list: Buffer | null): number;
  /** getgroups(size, list): the calling thread's supplementary groups (Node's own adds the egid). */
  getgroups(size: number, list: Buffer | null): number;
  /** prlimit(pid, resource, new, old): `limits` is a 16-byte struct rlimit (soft, hard). */
  prlimit(pid: number, resource: number, limits: Buffer | null, old: Buffer | null): number;
  /** prctl(option, arg2, 0, 0, 0) */
  prctl(option: number, arg2: number): number;
  /** prctl(option, &out): PR_GET_PDEATHSIG and the like; -1 on failure. */
  prctlGetInt(option: number): number;
  /** open(path, flags): a raw fd (Node's fs does not track it; the caller closes it with close). */
  open(path: string, flags: number): number;
  chdir(path: string): number;
  /** pivot_root(newRoot, putOld) */
  pivotRoot(newRoot: string, putOld: string): number;
  /** read(2) / write(2) on a raw fd (the egress fd relay's worker; non-blocking sockets there). */
  read(fd: number, buf: Uint8Array, n: number): number;
  write(fd: number, buf: Uint8Array, n: number): number;
  /** shutdown(fd, how) */
  shutdown(fd: number, how: number): number;
  /** eventfd(initval, flags): the fd relay's wake-up. */
  eventfd(initval: number, flags: number): number;
  /** epoll_create1(flags), epoll_ctl(ep, op, fd, event), epoll_wait(ep, events, max, timeoutMs). */
  epollCreate1(flags: number): number;
  epollCtl(ep: number, op: number, fd: number, event: Uint8Array): number;
  epollWait(ep: number, events: Uint8Array, max: number, timeoutMs: number): number;
  errno(): number;
}

/** The koffi module (loaded by the caller: the main thread, or a worker thread from its path). */
export interface Koffi {
  load(name: string): { func(sig: string): (...args: never[]) => number };
  errno(): number;
  /** errno names by number (koffi.os.errno), for messages. */
  readonly os?: { readonly errno?: Readonly<Record<string, number>> };
}

/** The synchronous functions of Libc (the *Async ones are added by libc() on the main thread). */
export type CoreLibc = Omit<Libc, 'umount2Async' | 'closeAsync'>;

/** What bindLibc returns: CoreLibc, with koffi's asynchronous form of umount2 and close. */
export type SyncLibc = CoreLibc & {
  umount2: Libc['umount2'] & {
    async(target: string, flags: number, cb: (err: unknown, r: number) => void): void;
  };
  close: Libc['close'] & { async(fd: number, cb: (err: unknown, r: number) => void): void };
};

/** Where koffi is, for a worker thread that binds libc itself (bindLibc). */
export function koffiPath(): string {
  return createRequire(import.meta.url).resolve('koffi');
}

let bound: Libc | undefined;

/**
 * koffi, as its entry module would load it, without the entry module. That entry finds its native
 * module by probing: several module resolutions, three more files compiled, node's own ELF headers
 * read to tell glibc from musl; together a good part of a one-shot CLI start. Its prebuilt package
 * for this platform (resolved from koffi's own directory, as koffi does) holds the native module at
 * <os>_<arch>/koffi.node for glibc; that is loaded directly when its version is koffi's (the check
 * koffi makes). Anything else (musl, another layout, an error) takes koffi's own entry, which then
 * reports what is wrong. The JS koffi wraps around the native module only adds deprecated aliases.
 */
export function loadKoffi(): Koffi {
  const require = createRequire(import.meta.url);
  try {
    const dir = process.platform === 'linux' && onGlibc() ? packageDir(require, 'koffi') : undefined;
    if (dir !== undefined) {
      const pkg = join(dir, 'package.json');
      const version = (JSON.parse(readFileSync(pkg, 'utf8')) as { version?: unknown }).version;
      const { platform, arch } = process;
      const native = createRequire(pkg)(
        `@koromix/koffi-${platform}-${arch}/${platform}_${arch}/koffi.node`,
      ) as Koffi & { version?: unknown };
      if (typeof version === 'string' && native.version === version) return native;
    }
  } catch {
    // not the layout above: koffi's entry below
  }
  return require('koffi') as Koffi;
}

/**
 * The directory (symlinks resolved, as require resolves them) of the package `name` that `require`
 * loads: the first directory on require's own search path that holds it. Not require.resolve: that
 * applies the package's "exports" map, which koffi has, and Node's resolver for those maps is a
 * good part of a one-shot CLI start on its own (issue 31), for an entry file not used here.
 */
function packageDir(require: NodeRequire, name: string): string | undefined {
  for (const dir of require.resolve.paths(name) ?? []) {
    const at = join(dir, name);
    if (existsSync(join(at, 'package.json'))) return realpathSync.native(at);
  }
  return undefined;
}

/**
 * Whether node itself runs on glibc: its ELF interpreter (PT_INTERP, read from the first page of the
 * node binary, as koffi reads it) is glibc's ld-linux. Anything unexpected: false.
 */
function onGlibc(): boolean {
  const b = Buffer.alloc(4096);
  const fd = openSync(process.execPath, 'r');
  let n: number;
  try {
    n = readSync(fd, b, 0, b.length, 0);
  } finally {
    closeSync(fd);
  }
  // ELF, 64-bit, little-endian.
  if (n < 64 || b.readUInt32BE(0) !== 0x7f454c46 || b[4] !== 2 || b[5] !== 1) return false;
  const phoff = Number(b.readBigUInt64LE(32));
  const phentsize = b.readUInt16LE(54);
  for (let i = 0, count = b.readUInt16LE(56); i < count; i++) {
    const o = phoff + i * phentsize;
    if (o + 40 > n) return false;
    if (b.readUInt32LE(o) !== 3) continue; // PT_INTERP
    const at = Number(b.readBigUInt64LE(o + 8));
    const size = Number(b.readBigUInt64LE(o + 32));
    if (size < 2 || at + size > n) return false;
    return /\/ld-linux[-.][^/]*$/.test(b.toString('latin1', at, at + size - 1));
  }
  return false;
}

export function libc(): Libc {
  if (bound) return bound;
  const c = bindLibc(loadKoffi());
  bound = {
    ...c,
    umount2Async: (target, flags) => onThreadPool(c.umount2, target, flags),
    closeAsync: (fd) => onThreadPool(c.close, fd),
  };
  return bound;
}

/**
 * Bind the libc functions with `koffi`. Self-contained (it refers to nothing outside its body), so
 * that a worker thread can run its source too (launcher.privileged.ts).
 */
export function bindLibc(koffi: Koffi): SyncLibc {
  // x86_64 syscall numbers of the new mount API (no libc wrappers in Debian 12's glibc).
  const SYS_OPEN_TREE = 428;
  const SYS_MOVE_MOUNT = 429;
  const SYS_MOUNT_SETATTR = 442;
  const SYS_PIDFD_SEND_SIGNAL = 424;
  const SYS_PIDFD_OPEN = 434;
  const SYS_CLOSE_RANGE = 436;
  const SYS_SETGROUPS = 116;
  const SYS_SETRESUID = 117;
  const SYS_SETRESGID = 119;
  const CLOSE_RANGE_CLOEXEC = 1 << 2;
  const SYS_PIVOT_ROOT = 155;
  const lib = koffi.load('libc.so.6');
  const f = <T>(sig: string): T => lib.func(sig) as unknown as T;
  const umount2 = f<
    ((target: string, flags: number) => number) & {
      async(target: string, flags: number, cb: (err: unknown, r: number) => void): void;
    }
  >('int umount2(const char *target, int flags)');
  // syscall(2) is variadic: one prototype per call shape.
  const sysOpenTree = f<(nr: number, dfd: number, path: string, flags: number) => number>(
    'long syscall(long nr, int dfd, const char *path, unsigned int flags)',
  );
  const sysSetattr = f<
    (nr: number, fd: number, path: string, flags: number, attr: Buffer, size: number) => number
  >('long syscall(long nr, int fd, const char *path, unsigned int flags, void *attr, size_t size)');
  const sysMove = f<(nr: number, a: number, b: string, c: number, d: string, flags: number) => number>(
    'long syscall(long nr, int fd, const char *from, int tofd, const char *to, unsigned int flags)',
  );
  const sys2 = f<(nr: number, a: number, b: number) => number>(
    'long syscall(long nr, int a, unsigned int b)',
  );
  const sys3u = f<(nr: number, a: number, b: number, c: number) => number>(
    'long syscall(long nr, unsigned int a, unsigned int b, unsigned int c)',
  );
  const sysSig = f<(nr: number, fd: number, sig: number, info: null, flags: number) => number>(
    'long syscall(long nr, int fd, int sig, void *info, unsigned int flags)',
  );
  const sysGroups = f<(nr: number, n: number, list: Buffer | null) => number>(
    'long syscall(long nr, int n, void *list)',
  );
  // prctl(2) is variadic too: one shape for integer arguments, one for an int written back.
  const prctl5 = f<(o: number, a: number, b: number, c: number, d: number) => number>(
    'int prctl(int option, unsigned long a2, unsigned long a3, unsigned long a4, unsigned long a5)',
  );
  const prctlOut = f<(o: number, out: number[], b: number, c: number, d: number) => number>(
    'int prctl(int option, _Out_ int *a2, unsigned long a3, unsigned long a4, unsigned long a5)',
  );
  const sysPivot = f<(nr: number, a: string, b: string) => number>(
    'long syscall(long nr, const char *a, const char *b)',
  );
  return {
    mount: f(
      'int mount(const char *src, const char *target, const char *fstype, unsigned long flags, const char *data)',
    ),
    umount2,
    unshare: f('int unshare(int flags)'),
    flock: f('int flock(int fd, int op)'),
    setns: f('int setns(int fd, int nstype)'),
    socket: f('int socket(int domain, int type, int protocol)'),
    ioctl: f('int ioctl(int fd, unsigned long req, void *arg)'),
    close: f('int close(int fd)'),
    bind: f('int bind(int fd, void *addr, uint32_t len)'),
    listen: f('int listen(int fd, int backlog)'),
    setsockopt: f('int setsockopt(int fd, int level, int name, void *value, uint32_t len)'),
    getsockopt: f('int getsockopt(int fd, int level, int name, void *value, void *len)'),
    send: f('long send(int fd, void *buf, size_t len, int flags)'),
    recv: f('long recv(int fd, void *buf, size_t len, int flags)'),
    poll: f('int poll(void *fds, unsigned long nfds, int timeout)'),
    openTree: (dfd, path, flags) => sysOpenTree(SYS_OPEN_TREE, dfd, path, flags),
    mountSetattr: (fd, path, flags, attr, size) => sysSetattr(SYS_MOUNT_SETATTR, fd, path, flags, attr, size),
    moveMount: (a, b, c, d, flags) => sysMove(SYS_MOVE_MOUNT, a, b, c, d, flags),
    pidfdOpen: (pid) => sys2(SYS_PIDFD_OPEN, pid, 0),
    pidfdSignal: (fd, sig) => sysSig(SYS_PIDFD_SEND_SIGNAL, fd, sig, null, 0),
    cloexecFrom: (first) => sys3u(SYS_CLOSE_RANGE, first, 0xffffffff, CLOSE_RANGE_CLOEXEC),
    lgetxattr: f('long lgetxattr(void *path, const char *name, void *value, size_t size)'),
    lsetxattr: f('int lsetxattr(void *path, const char *name, void *value, size_t size, int flags)'),
    mknod: f('int mknod(void *path, uint32_t mode, uint64_t dev)'),
    pipe2: f('int pipe2(void *fds, int flags)'),
    fcntl: f('int fcntl(int fd, int cmd, int arg)'),
    waitid: f('int waitid(int idtype, int id, void *info, int options)'),
    posixSpawn: f(
      'int posix_spawn(_Out_ int *pid, const char *path, void *fa, void *attr, const char **argv, const char **envp)',
    ),
    spawnFileActionsInit: f('int posix_spawn_file_actions_init(void *fa)'),
    spawnFileActionsDestroy: f('int posix_spawn_file_actions_destroy(void *fa)'),
    spawnFileActionsAddDup2: f('int posix_spawn_file_actions_adddup2(void *fa, int fd, int newfd)'),
    spawnFileActionsAddOpen: f(
      'int posix_spawn_file_actions_addopen(void *fa, int fd, const char *path, int flags, uint32_t mode)',
    ),
    spawnFileActionsAddChdir: f('int posix_spawn_file_actions_addchdir_np(void *fa, const char *path)'),
    spawnAttrInit: f('int posix_spawnattr_init(void *attr)'),
    spawnAttrSetFlags: f('int posix_spawnattr_setflags(void *attr, short flags)'),
    spawnAttrSetSigDefault: f('int posix_spawnattr_setsigdefault(void *attr, void *set)'),
    spawnAttrSetSigMask: f('int posix_spawnattr_setsigmask(void *attr, void *set)'),
    sigfillset: f('int sigfillset(void *set)'),
    sigemptyset: f('int sigemptyset(void *set)'),
    threadSetresuid: (r, e, su) => sys3u(SYS_SETRESUID, r, e, su),
    threadSetresgid: (r, e, sg) => sys3u(SYS_SETRESGID, r, e, sg),
    threadSetgroups: (n, list) => sysGroups(SYS_SETGROUPS, n, list),
    getgroups: f('int getgroups(int size, void *list)'),
    prlimit: f('int prlimit(int pid, int resource, void *limits, void *old)'),
    prctl: (option, arg2) => prctl5(option, arg2, 0, 0, 0),
    prctlGetInt: (option) => {
      const out = [0];
      return prctlOut(option, out, 0, 0, 0) === 0 ? out[0]! : -1;
    },
    open: f('int open(const char *path, int flags)'),
    chdir: f('int chdir(const char *path)'),
    pivotRoot: (a, b) => sysPivot(SYS_PIVOT_ROOT, a, b),
    read: f('intptr_t read(int fd, void *buf, size_t n)'),
    write: f('intptr_t write(int fd, const void *buf, size_t n)'),
    shutdown: f('int shutdown(int fd, int how)'),
    eventfd: f('int eventfd(unsigned int initval, int flags)'),
    epollCreate1: f('int epoll_create1(int flags)'),
    epollCtl: f('int epoll_ctl(int epfd, int op, int fd, void *event)'),
    epollWait: f('int epoll_wait(int epfd, void *events, int maxevents, int timeout)'),
    errno: () => koffi.errno(),
  };
}

/** Call a koffi function on a libuv thread-pool thread (its `.async` form), within ASYNC_LIMIT. */
function onThreadPool<A extends unknown[]>(
  fn: { async(...args: [...A, (err: unknown, r: number) => void]): void },
  ...args: A
): Promise<number> {
  return withAsyncSlot(
    () =>
      new Promise<number>((resolve, reject) =>
        fn.async(...args, (err: unknown, r: number) => (err ? reject(err) : resolve(r))),
      ),
  );
}

/**
 * koffi queues at most `max_async_calls` (256) asynchronous calls per process and throws beyond that:
 * 1,000 sandboxes killed at once each unmounting their disk would hit it (and leave mounts behind).
 * Ours wait for one of ASYNC_LIMIT slots instead; a finishing call hands its slot to the next waiter.
 */
const ASYNC_LIMIT = 32;
let asyncInFlight = 0;
const asyncWaiting: Array<() => void> = [];

async function withAsyncSlot<T>(run: () => Promise<T>): Promise<T> {
  if (asyncInFlight >= ASYNC_LIMIT) await new Promise<void>((r) => asyncWaiting.push(r));
  else asyncInFlight++;
  try {
    return await run();
  } finally {
    const next = asyncWaiting.shift();
    if (next) next();
    else asyncInFlight--;
  }
}
