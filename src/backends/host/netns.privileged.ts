// SECURITY-CRITICAL (privileged): one network namespace per sandbox, shared by all its execs (so a
// server started in one exec is reachable on localhost from the next), containing only `lo`.
//
// The namespace is made by one thread: unshare(CLONE_NEWNET) moves only the calling thread, we bring
// `lo` up, open /proc/thread-self/ns/net (the fd keeps the namespace alive: no mount, so the host
// mount table, which every bwrap copies and parses, does not grow with each sandbox; and the
// namespace dies with Airlock), and setns() back. That thread is the launcher's worker where it runs
// (createNetnsOff: the same steps in launcher.privileged.ts, so the event loop is not held up),
// else Node's main thread (createNetns). To start a process inside it, `withNetns` switches the main thread in, runs a
// synchronous spawn (the child inherits the thread's namespace at fork), and switches back. Both are
// synchronous, so no other JavaScript runs while the thread is switched; if switching back ever
// failed, the process aborts rather than go on with its own sockets inside a sandbox's namespace.
import { closeSync, openSync, readlinkSync, rmSync, symlinkSync } from 'node:fs';
import { AirlockError } from '../../core/errors.js';
import { libc, type Libc } from '../../core/libc.privileged.js';
import { netlinkRequest, netlinkSocket, nftMessages, routeMessages } from './netlink.privileged.js';

const CLONE_NEWNET = 0x40000000;
const AF_INET = 2;
const SOCK_DGRAM = 2;
/** `lo`'s interface index in every network namespace (the kernel's LOOPBACK_IFINDEX). */
const LOOPBACK_IFINDEX = 1;

let hostNetFd: number | undefined;
let hostNetId: string | undefined;

function load(): Libc {
  const c = libc();
  if (hostNetFd === undefined) {
    // The namespace this thread must always return to.
    hostNetFd = openSync('/proc/thread-self/ns/net', 'r');
    hostNetId = readlinkSync('/proc/thread-self/ns/net');
  }
  return c;
}

function restoreOrAbort(c: Libc): void {
  if (c.setns(hostNetFd!, CLONE_NEWNET) !== 0 || readlinkSync('/proc/thread-self/ns/net') !== hostNetId) {
    // Never continue with this thread inside a sandbox's network namespace.
    process.abort();
  }
}

/**
 * A sandbox's network namespace, held by an fd of this process. Once closed it refuses every use:
 * the fd number may by then belong to another file, or to another sandbox's namespace.
 */
export class NetnsHandle {
  #fd: number;
  /**
   * Listening sockets made ahead in this namespace (prepareEgressInNetns), by socketKey: the egress
   * listeners of a warm slot, taken by the sandbox's egress when it attaches.
   */
  readonly #ahead = new Map<string, number>();
  constructor(
    fd: number,
    /** Where a symlink to the fd (/proc/<pid>/fd/<n>) is kept for inspection (nsenter --net=…). */
    readonly link: string | undefined,
  ) {
    this.#fd = fd;
  }
  get fd(): number {
    if (this.#fd < 0) throw new AirlockError('INTERNAL', 'network namespace already released');
    return this.#fd;
  }
  /** Whether sockets made ahead wait here. */
  get hasSocketsAhead(): boolean {
    return this.#ahead.size > 0;
  }
  /** A socket made ahead for this kind and address, now owned by the caller (it closes it). */
  takeSocket(kind: 'tcp' | 'udp', address: string, port: number): number | undefined {
    const key = socketKey(kind, address, port);
    const fd = this.#ahead.get(key);
    this.#ahead.delete(key);
    return fd;
  }
  /**
   * Close the sockets made ahead that nobody took. A sandbox without egress must never get them:
   * they would hold its ports (3128, 53) and take connections nobody answers.
   */
  dropSockets(): void {
    for (const fd of this.#ahead.values()) closeSync(fd);
    this.#ahead.clear();
  }
  /** @internal prepareEgressInNetns only. A socket it replaces is closed (never leaked). */
  keepSocket(kind: 'tcp' | 'udp', address: string, port: number, fd: number): void {
    const key = socketKey(kind, address, port);
    const old = this.#ahead.get(key);
    if (old !== undefined) closeSync(old);
    this.#ahead.set(key, fd);
  }
  /** Drop this process's reference (the namespace dies with its last process or reference). */
  close(): void {
    if (this.#fd < 0) return;
    this.dropSockets();
    closeSync(this.#fd);
    this.#fd = -1;
    if (this.link !== undefined) rmSync(this.link, { force: true });
  }
}

const socketKey = (kind: string, address: string, port: number): string => `${kind} ${address}:${port}`;

/**
 * Create a netns with only `lo` (up), held by the returned handle. `link`, if given, becomes a symlink
 * to the fd for inspection only: Airlock itself never opens it.
 */
export function createNetns(link?: string): NetnsHandle {
  const c = load();
  if (c.unshare(CLONE_NEWNET) !== 0)
    throw new AirlockError('INTERNAL', `unshare(CLONE_NEWNET) failed: errno ${c.errno()}`);
  let fd: number;
  try {
    try {
      loUp(c);
    } catch (e) {
      throw new AirlockError('INTERNAL', (e as Error).message, { cause: e });
    }
    fd = openSync('/proc/thread-self/ns/net', 'r'); // O_CLOEXEC (libuv): never inherited
  } finally {
    restoreOrAbort(c);
  }
  return handleFor(fd, link);
}

/**
 * Bring `lo` up in the calling thread's network namespace. Self-contained (it refers to nothing
 * outside its body): the launcher's worker runs its source for createNetnsOff. Throws an Error with
 * `errno`.
 */
export function loUp(c: Pick<Libc, 'socket' | 'ioctl' | 'close' | 'errno'>): void {
  const AF_INET = 2;
  const SOCK_DGRAM = 2;
  const SIOCGIFFLAGS = 0x8913;
  const SIOCSIFFLAGS = 0x8914;
  const IFF_UP = 0x1;
  const fail = (what: string): never => {
    const errno = c.errno();
    throw Object.assign(new Error(`${what}: errno ${errno}`), { errno });
  };
  const s = c.socket(AF_INET, SOCK_DGRAM, 0);
  if (s < 0) fail('socket');
  try {
    const ifr = Buffer.alloc(40); // struct ifreq: char name[16]; short flags at offset 16
    ifr.write('lo', 0, 'ascii');
    if (c.ioctl(s, SIOCGIFFLAGS, ifr) !== 0) fail('SIOCGIFFLAGS lo');
    ifr.writeInt16LE(ifr.readInt16LE(16) | IFF_UP, 16);
    if (c.ioctl(s, SIOCSIFFLAGS, ifr) !== 0) fail('SIOCSIFFLAGS lo');
  } finally {
    c.close(s);
  }
}

/**
 * createNetns() made by another thread (`make`: the launcher's worker, which does the same steps and
 * returns the fd), so this one is not held up by the kernel's work (about 0.65 ms).
 */
export async function createNetnsOff(make: () => Promise<number>, link?: string): Promise<NetnsHandle> {
  return handleFor(await make(), link);
}

function handleFor(fd: number, link: string | undefined): NetnsHandle {
  if (link !== undefined) {
    try {
      rmSync(link, { force: true });
      symlinkSync(`/proc/${process.pid}/fd/${fd}`, link);
    } catch (e) {
      closeSync(fd);
      throw e;
    }
  }
  return new NetnsHandle(fd, link);
}

/**
 * A fresh netns holding only `lo` in place of `old` (which is released: it, and anything configured
 * in it, dies with its last reference).
 */
export function recreateNetns(old: NetnsHandle): NetnsHandle {
  old.close();
  return createNetns(old.link);
}

/** Run `f` (synchronous: e.g. child_process.spawn) with this thread inside the netns `ns`. */
export function withNetns<T>(ns: NetnsHandle, f: () => T): T {
  const c = load();
  if (c.setns(ns.fd, CLONE_NEWNET) !== 0)
    throw new AirlockError('INTERNAL', `setns(netns) failed: errno ${c.errno()}`);
  try {
    return f();
  } finally {
    restoreOrAbort(c);
  }
}

const SOCK_STREAM = 1;
const SOCK_NONBLOCK = 0o4000;
const SOCK_CLOEXEC = 0o2000000;
const SOL_SOCKET = 1;
const SO_REUSEADDR = 2;

export interface NetnsSocket {
  readonly kind: 'tcp' | 'udp';
  readonly address: string;
  readonly port: number;
}

/**
 * A socket bound to `address`:`port` (IPv4) INSIDE the netns `ns`, owned by this (Airlock)
 * process: sandboxed code can connect to it but can neither kill nor replace it. TCP sockets are
 * listening. Returns the fd, for `net.Server.listen({ fd })` / `dgram` `bind({ fd })`: the one made
 * ahead for it (prepareEgressInNetns) if there is one.
 */
export function socketInNetns(ns: NetnsHandle, kind: 'tcp' | 'udp', address: string, port: number): number {
  const ahead = ns.takeSocket(kind, address, port);
  if (ahead !== undefined) return ahead;
  const octets = ipv4Octets(address);
  return withNetns(ns, () => bindHere(libc(), { kind, address, port }, octets));
}

/**
 * Ahead of a sandbox that will want them (a warm slot): transparent interception (if `intercept`;
 * see interceptTcpInNetns) and then these listening sockets, in ONE switch into the netns. The
 * sockets wait in the handle (takeSocket) until the sandbox's egress takes them or they are
 * dropped. All or nothing: on failure nothing is kept (the interception may be half made: the
 * caller then must not hand this netns out as intercepting).
 */
export function prepareEgressInNetns(
  ns: NetnsHandle,
  sockets: readonly NetnsSocket[],
  intercept?: { readonly address: string; readonly port: number },
): void {
  const octets = sockets.map((s) => ipv4Octets(s.address));
  const plan = intercept && interceptPlan(intercept.address, intercept.port);
  const made: number[] = [];
  try {
    withNetns(ns, () => {
      const c = libc();
      if (plan) interceptHere(c, plan);
      sockets.forEach((s, i) => made.push(bindHere(c, s, octets[i]!)));
    });
  } catch (e) {
    for (const fd of made) closeSync(fd);
    throw e;
  }
  sockets.forEach((s, i) => ns.keepSocket(s.kind, s.address, s.port, made[i]!));
}

function ipv4Octets(address: string): number[] {
  const octets = address.split('.').map(Number);
  if (octets.length !== 4 || octets.some((o) => !Number.isInteger(o) || o < 0 || o > 255)) {
    throw new AirlockError('INTERNAL', `socketInNetns: "${address}" is not an IPv4 address`);
  }
  return octets;
}

/** The socket, made in the calling thread's netns (inside withNetns). */
function bindHere(c: Libc, s: NetnsSocket, octets: readonly number[]): number {
  const fd = c.socket(
    AF_INET,
    (s.kind === 'tcp' ? SOCK_STREAM : SOCK_DGRAM) | SOCK_NONBLOCK | SOCK_CLOEXEC,
    0,
  );
  if (fd < 0) throw new AirlockError('INTERNAL', `socket in netns: errno ${c.errno()}`);
  try {
    const one = Buffer.alloc(4);
    one.writeInt32LE(1);
    c.setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, one, 4);
    // struct sockaddr_in { sa_family_t family; in_port_t port (BE); struct in_addr addr; char zero[8] }
    const sa = Buffer.alloc(16);
    sa.writeUInt16LE(AF_INET, 0);
    sa.writeUInt16BE(s.port, 2);
    for (let i = 0; i < 4; i++) sa[4 + i] = octets[i]!;
    if (c.bind(fd, sa, 16) !== 0)
      throw new AirlockError('INTERNAL', `bind ${s.address}:${s.port} in netns: errno ${c.errno()}`);
    if (s.kind === 'tcp' && c.listen(fd, 1024) !== 0)
      throw new AirlockError('INTERNAL', `listen in netns: errno ${c.errno()}`);
    return fd;
  } catch (e) {
    c.close(fd);
    throw e;
  }
}

const POLLIN = 0x1;

/**
 * Whether any of these sockets has something waiting to be picked up (a listening socket: a
 * connection not yet accepted; a datagram socket: a datagram not yet read). Never blocks.
 */
export function anyReadable(fds: readonly number[]): boolean {
  if (!fds.length) return false;
  const c = libc();
  const p = Buffer.alloc(8 * fds.length);
  fds.forEach((fd, i) => {
    p.writeInt32LE(fd, 8 * i);
    p.writeInt16LE(POLLIN, 8 * i + 4);
  });
  // An error (never expected) counts as "something may be waiting": callers then wait, as before.
  return c.poll(p, fds.length, 0) !== 0;
}

const SOL_IP = 0;
const SO_ORIGINAL_DST = 80;

/** The destination a connection had before nftables redirected it (for transparent interception). */
export function originalDestination(fd: number): { address: string; port: number } | undefined {
  const c = libc();
  const sa = Buffer.alloc(16);
  const len = Buffer.alloc(4);
  len.writeUInt32LE(16);
  if (c.getsockopt(fd, SOL_IP, SO_ORIGINAL_DST, sa, len) !== 0) return undefined;
  return { address: `${sa[4]}.${sa[5]}.${sa[6]}.${sa[7]}`, port: sa.readUInt16BE(2) };
}

/**
 * Transparent interception: inside the netns `ns`, give `lo` the address `address`, route
 * everything (IPv4) to `lo`, and DNAT every outbound TCP connection that is not to a local address to
 * `address:port`. Nothing can leave anyway (the namespace has no other interface); this only makes
 * proxy-unaware clients reach Airlock's listener instead of failing. IPv6 keeps no route.
 * (REDIRECT to 127.0.0.1 is not used: replies un-NATed to a loopback destination are dropped.)
 * Netlink requests from this process (netlink.privileged.ts), no ip(8)/nft(8) processes.
 * `forwarded`: the connections come in from a device of the netns (a microVM's tap) rather than from
 * its own processes, so the DNAT hooks prerouting, and `forwarded.keep` (the device's host-side
 * address, where the proxy listens) is left alone like the local addresses.
 */
export function interceptTcpInNetns(
  ns: NetnsHandle,
  address: string,
  port: number,
  forwarded?: { readonly keep: string },
): void {
  const plan = interceptPlan(address, port, forwarded);
  withNetns(ns, () => interceptHere(libc(), plan));
}

interface InterceptPlan {
  readonly routes: Buffer[];
  readonly rules: Buffer[];
}

function interceptPlan(address: string, port: number, forwarded?: { readonly keep: string }): InterceptPlan {
  return {
    routes: routeMessages(LOOPBACK_IFINDEX, address),
    rules: nftMessages(address, port, forwarded),
  };
}

/** Interception, in the calling thread's netns (inside withNetns). */
function interceptHere(c: Libc, { routes, rules }: InterceptPlan): void {
  // The sockets belong to the namespace they are made in; the requests are answered in send().
  const rt = netlinkSocket(c, 'route');
  try {
    netlinkRequest(c, rt, routes, 'transparent egress: address/route');
  } finally {
    c.close(rt);
  }
  let nf: number;
  try {
    nf = netlinkSocket(c, 'netfilter');
    try {
      netlinkRequest(c, nf, rules, 'transparent egress: nftables');
    } finally {
      c.close(nf);
    }
  } catch (e) {
    throw new AirlockError(
      'BACKEND_UNAVAILABLE',
      `transparent egress needs nf_tables with NAT in the kernel, or set network.transparent: false (${(e as Error).message})`,
      { cause: e },
    );
  }
}
