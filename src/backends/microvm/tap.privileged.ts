// SECURITY-CRITICAL (privileged): a microVM's only network path. For a sandbox with a network policy,
// root makes one tap device INSIDE the sandbox's own netns (which otherwise holds only `lo`) and hands
// its fd to QEMU, which runs unprivileged and could not open /dev/net/tun (0600 root) itself. The tap
// is not persistent: it disappears when QEMU, its last holder, exits. The netns has no other
// interface and IP forwarding stays off (its default), so a guest packet can only reach a socket of
// the netns itself:
//   - the proxy and DNS listeners, bound at TAP_HOST_ADDRESS (the guest's gateway) instead of
//     127.0.0.1, which is the guest's own loopback;
//   - with transparent interception, every other TCP connection, DNATed in prerouting (a forwarded
//     packet never passes the output hook the other tiers use) to the transparent listener, which
//     reads its original destination as on every tier.
// Anything else (other UDP, ICMP, IPv6) is not for a local address and is dropped, since nothing
// forwards.
import { closeSync, openSync } from 'node:fs';
import { AirlockError } from '../../core/errors.js';
import { libc, type Libc } from '../../core/libc.privileged.js';
import { interceptTcpInNetns, withNetns, type NetnsHandle } from '../host/netns.privileged.js';

/** The host side of the guest's link (the guest's gateway, where its proxy and DNS listen). */
export const TAP_HOST_ADDRESS = '10.0.2.1';
/** The guest's address (eth0), on a /30 with the host side. */
export const GUEST_ADDRESS = '10.0.2.2';
const NETMASK = '255.255.255.252';
/** The tap's name inside the sandbox's netns (each netns has its own, so one name serves all). */
export const TAP_NAME = 'vm0';

const TUNSETIFF = 0x400454ca;
const IFF_TAP = 0x0002;
const IFF_NO_PI = 0x1000;
const SIOCSIFFLAGS = 0x8914;
const SIOCGIFFLAGS = 0x8913;
const SIOCSIFADDR = 0x8916;
const SIOCSIFNETMASK = 0x891c;
const IFF_UP = 0x1;
const AF_INET = 2;
const SOCK_DGRAM = 2;
const SOCK_CLOEXEC = 0o2000000;

/** struct ifreq: char name[16], then a union (flags: short; addr: struct sockaddr_in). */
function ifreq(name: string): Buffer {
  const ifr = Buffer.alloc(40);
  ifr.write(name, 0, 'ascii');
  return ifr;
}

function sockaddrIn(ifr: Buffer, address: string): Buffer {
  ifr.writeUInt16LE(AF_INET, 16);
  address.split('.').forEach((o, i) => (ifr[20 + i] = Number(o)));
  return ifr;
}

function check(c: Libc, rc: number, what: string): void {
  if (rc !== 0) throw new AirlockError('INTERNAL', `microVM tap: ${what}: errno ${c.errno()}`);
}

/**
 * Make the tap in `ns`, give it TAP_HOST_ADDRESS/30 and bring it up. Returns its fd (close-on-exec:
 * only the QEMU it is handed to keeps it, as its fd 4); the caller closes its own copy once QEMU runs.
 */
export function makeTap(ns: NetnsHandle): number {
  return withNetns(ns, () => {
    const c = libc();
    // tun's open() binds the device to the opener's netns: this thread's, switched into `ns`.
    const fd = openSync('/dev/net/tun', 'r+');
    try {
      const ifr = ifreq(TAP_NAME);
      ifr.writeUInt16LE(IFF_TAP | IFF_NO_PI, 16);
      check(c, c.ioctl(fd, TUNSETIFF, ifr), 'TUNSETIFF');
      const s = c.socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
      if (s < 0) check(c, -1, 'socket');
      try {
        check(c, c.ioctl(s, SIOCSIFADDR, sockaddrIn(ifreq(TAP_NAME), TAP_HOST_ADDRESS)), 'SIOCSIFADDR');
        check(c, c.ioctl(s, SIOCSIFNETMASK, sockaddrIn(ifreq(TAP_NAME), NETMASK)), 'SIOCSIFNETMASK');
        const f = ifreq(TAP_NAME);
        check(c, c.ioctl(s, SIOCGIFFLAGS, f), 'SIOCGIFFLAGS');
        f.writeInt16LE(f.readInt16LE(16) | IFF_UP, 16);
        check(c, c.ioctl(s, SIOCSIFFLAGS, f), 'SIOCSIFFLAGS');
      } finally {
        c.close(s);
      }
      return fd;
    } catch (e) {
      closeSync(fd);
      throw e;
    }
  });
}

/**
 * Transparent interception of the guest's TCP: `address` (the transparent listener's) on `lo`, and
 * a prerouting DNAT of every TCP connection not to `lo`'s addresses or the tap's own to
 * `address:port` (the same netlink requests and errors as every tier's, netns.privileged.ts). The
 * tap's connected route still carries the replies back to the guest.
 */
export function interceptGuestTcp(ns: NetnsHandle, address: string, port: number): void {
  interceptTcpInNetns(ns, address, port, { keep: TAP_HOST_ADDRESS });
}
