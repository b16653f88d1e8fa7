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
  unshare(flags: number): number;
  setns(fd: number, nstype: number): number;
  socket(domain: number, type: number, proto: number): number;
  ioctl(fd: number, req: number, arg: Buffer): number;
  close(fd: number): number;
  /** open_tree(dfd, path, flags) */
  openTree(dfd: number, path: string, flags: number): number;
  /** mount_setattr(fd, path, flags, attr, size) */
  mountSetattr(fd: number, path: string, flags: number, attr: Buffer, size: number): number;
  /** move_mount(from_dfd, from_path, to_dfd, to_path, flags) */
  moveMount(fromFd: number, fromPath: string, toDfd: number, toPath: string, flags: number): number;
  errno(): number;
}

// x86_64 syscall numbers of the new mount API (no libc wrappers in Debian 12's glibc).
const SYS_OPEN_TREE = 428;
const SYS_MOVE_MOUNT = 429;
const SYS_MOUNT_SETATTR = 442;

let bound: Libc | undefined;

export function libc(): Libc {
  if (bound) return bound;
  const koffi = createRequire(import.meta.url)('koffi') as {
    load(name: string): { func(sig: string): (...args: never[]) => number };
    errno(): number;
  };
  const lib = koffi.load('libc.so.6');
  const f = <T>(sig: string): T => lib.func(sig) as unknown as T;
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
  bound = {
    mount: f(
      'int mount(const char *src, const char *target, const char *fstype, unsigned long flags, const char *data)',
    ),
    umount2: f('int umount2(const char *target, int flags)'),
    unshare: f('int unshare(int flags)'),
    setns: f('int setns(int fd, int nstype)'),
    socket: f('int socket(int domain, int type, int protocol)'),
    ioctl: f('int ioctl(int fd, unsigned long req, void *arg)'),
    close: f('int close(int fd)'),
    openTree: (dfd, path, flags) => sysOpenTree(SYS_OPEN_TREE, dfd, path, flags),
    mountSetattr: (fd, path, flags, attr, size) => sysSetattr(SYS_MOUNT_SETATTR, fd, path, flags, attr, size),
    moveMount: (a, b, c, d, flags) => sysMove(SYS_MOVE_MOUNT, a, b, c, d, flags),
    errno: () => koffi.errno(),
  };
  return bound;
}
