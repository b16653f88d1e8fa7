// SECURITY-CRITICAL (privileged): the only place Airlock calls libc directly. Node has no binding
// for mount(2), unshare(2), setns(2) or the new mount API, and spawning mount(8)/ip(8) costs
// milliseconds, so these few functions are bound through koffi (a maintained FFI library that ships
// prebuilt binaries). Each function is declared with its exact C prototype; callers check the
// return value and read errno right after the call, on the same thread.
import { createRequire } from 'node:module';

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
  unshare(flags: number): number;
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
  errno(): number;
}

// x86_64 syscall numbers of the new mount API (no libc wrappers in Debian 12's glibc).
const SYS_OPEN_TREE = 428;
const SYS_MOVE_MOUNT = 429;
const SYS_MOUNT_SETATTR = 442;
const SYS_PIDFD_SEND_SIGNAL = 424;
const SYS_PIDFD_OPEN = 434;
const SYS_CLOSE_RANGE = 436;
const CLOSE_RANGE_CLOEXEC = 1 << 2;

let bound: Libc | undefined;

export function libc(): Libc {
  if (bound) return bound;
  const koffi = createRequire(import.meta.url)('koffi') as {
    load(name: string): { func(sig: string): (...args: never[]) => number };
    errno(): number;
  };
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
  bound = {
    mount: f(
      'int mount(const char *src, const char *target, const char *fstype, unsigned long flags, const char *data)',
    ),
    umount2: umount2,
    umount2Async: (target, flags) =>
      withAsyncSlot(
        () =>
          new Promise<number>((resolve, reject) =>
            umount2.async(target, flags, (err: unknown, r: number) => (err ? reject(err) : resolve(r))),
          ),
      ),
    unshare: f('int unshare(int flags)'),
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
    errno: () => koffi.errno(),
  };
  return bound;
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
