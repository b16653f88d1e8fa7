// SECURITY-CRITICAL (privileged): the transparent-egress configuration of a sandbox's network
// namespace, written as netlink messages instead of spawning ip(8) and nft(8) on every create (two
// fork+execs of a large process, milliseconds; this is tens of microseconds). What it sets up is
// exactly what these commands would:
//
//   ip addr add A/32 dev lo
//   ip route add default dev lo src A
//   nft -f - <<'EOF'
//   table ip airlock {
//     chain out {
//       type nat hook output priority -100; policy accept;
//       ip daddr 127.0.0.0/8 return
//       ip daddr A return
//       meta l4proto tcp dnat to A:P
//     }
//   }
//   EOF
//
// (test/egress/netns.test.ts lists the result with nft(8)/ip(8) where installed and compares it to
// this text.) Nothing here can widen what a sandbox reaches: its namespace has no interface but `lo`,
// so these rules only turn "network unreachable" into "connected to Airlock's listener". The kernel
// validates every message; any error (a NLMSG_ERROR with a non-zero code, or a missing answer) throws.
import { AirlockError } from '../../core/errors.js';
import type { Libc } from '../../core/libc.privileged.js';

const AF_NETLINK = 16;
const SOCK_RAW = 3;
const SOCK_CLOEXEC = 0o2000000;
const NETLINK_ROUTE = 0;
const NETLINK_NETFILTER = 12;
const MSG_DONTWAIT = 0x40;

const NLM_F_REQUEST = 0x1;
const NLM_F_ACK = 0x4;
const NLM_F_EXCL = 0x200;
const NLM_F_CREATE = 0x400;
const NLM_F_APPEND = 0x800;
const NLMSG_ERROR = 2;
const NLA_F_NESTED = 0x8000;

// rtnetlink (linux/rtnetlink.h, linux/if_addr.h)
const RTM_NEWADDR = 20;
const RTM_NEWROUTE = 24;
const AF_INET = 2;
const IFA_ADDRESS = 1;
const IFA_LOCAL = 2;
const RT_TABLE_MAIN = 254;
const RTPROT_BOOT = 3;
const RT_SCOPE_LINK = 253;
const RTN_UNICAST = 1;
const RTA_OIF = 4;
const RTA_PREFSRC = 7;

// nfnetlink / nf_tables (linux/netfilter/nfnetlink.h, linux/netfilter/nf_tables.h)
const NFNL_SUBSYS_NFTABLES = 10;
const NFNL_MSG_BATCH_BEGIN = 16;
const NFNL_MSG_BATCH_END = 17;
const NFT_MSG_NEWTABLE = 0;
const NFT_MSG_NEWCHAIN = 3;
const NFT_MSG_NEWRULE = 6;
const NFPROTO_IPV4 = 2;
const NFTA_TABLE_NAME = 1;
const NFTA_CHAIN_TABLE = 1;
const NFTA_CHAIN_NAME = 3;
const NFTA_CHAIN_HOOK = 4;
const NFTA_CHAIN_POLICY = 5;
const NFTA_CHAIN_TYPE = 7;
const NFTA_HOOK_HOOKNUM = 1;
const NFTA_HOOK_PRIORITY = 2;
const NF_INET_PRE_ROUTING = 0;
const NF_INET_LOCAL_OUT = 3;
const NF_ACCEPT = 1;
const NFTA_RULE_TABLE = 1;
const NFTA_RULE_CHAIN = 2;
const NFTA_RULE_EXPRESSIONS = 4;
const NFTA_LIST_ELEM = 1;
const NFTA_EXPR_NAME = 1;
const NFTA_EXPR_DATA = 2;
const NFTA_DATA_VALUE = 1;
const NFTA_DATA_VERDICT = 2;
const NFTA_VERDICT_CODE = 1;
const NFT_RETURN = -5;
const NFT_REG_VERDICT = 0;
const NFT_REG_1 = 1;
const NFT_REG_2 = 2;
const NFT_PAYLOAD_NETWORK_HEADER = 1;
const IPV4_DADDR_OFFSET = 16;
const NFT_CMP_EQ = 0;
const NFT_META_L4PROTO = 16;
const IPPROTO_TCP = 6;
const NFT_NAT_DNAT = 1;
const NF_NAT_RANGE_PROTO_SPECIFIED = 2;

const NFT_TABLE = 'airlock';
const NFT_CHAIN = 'out';

// ---- encoding ----------------------------------------------------------------------------------

const pad4 = (n: number): number => (n + 3) & ~3;

/** One netlink attribute (nested when `payload` is a list of attributes). */
function attr(type: number, payload: Buffer | readonly Buffer[]): Buffer {
  const nested = Array.isArray(payload);
  const body = nested ? Buffer.concat(payload as readonly Buffer[]) : (payload as Buffer);
  const out = Buffer.alloc(4 + pad4(body.length));
  out.writeUInt16LE(4 + body.length, 0);
  out.writeUInt16LE(nested ? type | NLA_F_NESTED : type, 2);
  body.copy(out, 4);
  return out;
}
const str = (s: string): Buffer => Buffer.from(`${s}\0`, 'ascii');
const be32 = (n: number): Buffer => {
  const b = Buffer.alloc(4);
  b.writeInt32BE(n);
  return b;
};
const u32 = (n: number): Buffer => {
  const b = Buffer.alloc(4);
  b.writeUInt32LE(n);
  return b;
};

/** A netlink message: header (length, type, flags, seq, port 0 = let the kernel pick) + body. */
function message(type: number, flags: number, seq: number, body: readonly Buffer[]): Buffer {
  const payload = Buffer.concat(body);
  const h = Buffer.alloc(16);
  h.writeUInt32LE(16 + payload.length, 0);
  h.writeUInt16LE(type, 4);
  h.writeUInt16LE(flags, 6);
  h.writeUInt32LE(seq, 8);
  return Buffer.concat([h, payload, Buffer.alloc(pad4(payload.length) - payload.length)]);
}

/** struct nfgenmsg { u8 family; u8 version; be16 res_id }. */
function nfgen(family: number, resId = 0): Buffer {
  const b = Buffer.alloc(4);
  b[0] = family;
  b.writeUInt16BE(resId, 2);
  return b;
}

function expr(name: string, data: readonly Buffer[]): Buffer {
  return attr(NFTA_LIST_ELEM, [attr(NFTA_EXPR_NAME, str(name)), attr(NFTA_EXPR_DATA, data)]);
}
const value = (type: number, bytes: Buffer): Buffer => attr(type, [attr(NFTA_DATA_VALUE, bytes)]);
const returnVerdict = (): Buffer =>
  expr('immediate', [
    attr(1 /* NFTA_IMMEDIATE_DREG */, be32(NFT_REG_VERDICT)),
    attr(2 /* NFTA_IMMEDIATE_DATA */, [attr(NFTA_DATA_VERDICT, [attr(NFTA_VERDICT_CODE, be32(NFT_RETURN))])]),
  ]);
/** payload load `len` bytes of the IPv4 header at the destination address → reg 1. */
const loadDaddr = (len: number): Buffer =>
  expr('payload', [
    attr(1 /* NFTA_PAYLOAD_DREG */, be32(NFT_REG_1)),
    attr(2 /* NFTA_PAYLOAD_BASE */, be32(NFT_PAYLOAD_NETWORK_HEADER)),
    attr(3 /* NFTA_PAYLOAD_OFFSET */, be32(IPV4_DADDR_OFFSET)),
    attr(4 /* NFTA_PAYLOAD_LEN */, be32(len)),
  ]);
/** cmp eq reg 1 `bytes`. */
const cmpEq = (bytes: Buffer): Buffer =>
  expr('cmp', [
    attr(1 /* NFTA_CMP_SREG */, be32(NFT_REG_1)),
    attr(2 /* NFTA_CMP_OP */, be32(NFT_CMP_EQ)),
    value(3 /* NFTA_CMP_DATA */, bytes),
  ]);
const immediate = (reg: number, bytes: Buffer): Buffer =>
  expr('immediate', [
    attr(1 /* NFTA_IMMEDIATE_DREG */, be32(reg)),
    value(2 /* NFTA_IMMEDIATE_DATA */, bytes),
  ]);

function ipv4(address: string): Buffer {
  const octets = address.split('.').map(Number);
  if (octets.length !== 4 || octets.some((o) => !Number.isInteger(o) || o < 0 || o > 255)) {
    throw new AirlockError('INTERNAL', `"${address}" is not an IPv4 address`);
  }
  return Buffer.from(octets);
}

// ---- messages ----------------------------------------------------------------------------------

/** `ip addr add A/32 dev lo` and `ip route add default dev lo src A`. */
export function routeMessages(loIndex: number, address: string): Buffer[] {
  const a = ipv4(address);
  const flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL;
  // struct ifaddrmsg { u8 family, prefixlen, flags, scope (0: global); u32 index }
  const ifa = Buffer.from([AF_INET, 32, 0, 0, 0, 0, 0, 0]);
  ifa.writeUInt32LE(loIndex, 4);
  // struct rtmsg { u8 family, dst_len, src_len, tos, table, protocol, scope, type; u32 flags }
  const rtm = Buffer.from([
    AF_INET,
    0,
    0,
    0,
    RT_TABLE_MAIN,
    RTPROT_BOOT,
    RT_SCOPE_LINK,
    RTN_UNICAST,
    0,
    0,
    0,
    0,
  ]);
  return [
    message(RTM_NEWADDR, flags, 1, [ifa, attr(IFA_LOCAL, a), attr(IFA_ADDRESS, a)]),
    message(RTM_NEWROUTE, flags, 2, [rtm, attr(RTA_OIF, u32(loIndex)), attr(RTA_PREFSRC, a)]),
  ];
}

/**
 * One nf_tables transaction (batch): the table, its NAT output chain and the three rules.
 * `forwarded` (the microVM tier): the chain hooks prerouting instead (connections that arrive from a
 * guest's tap, not ones made in the netns), is named `pre`, and also lets connections to `keep` (the
 * tap's own address, where the proxy listens) through untouched.
 */
export function nftMessages(address: string, port: number, forwarded?: { readonly keep: string }): Buffer[] {
  if (!Number.isInteger(port) || port < 1 || port > 65535)
    throw new AirlockError('INTERNAL', `bad port ${port}`);
  const a = ipv4(address);
  const keep = forwarded ? ipv4(forwarded.keep) : undefined;
  const chain = forwarded ? 'pre' : NFT_CHAIN;
  const p = Buffer.alloc(2);
  p.writeUInt16BE(port);
  const type = (m: number): number => (NFNL_SUBSYS_NFTABLES << 8) | m;
  const create = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE;
  const rule = (seq: number, exprs: Buffer[]): Buffer =>
    message(type(NFT_MSG_NEWRULE), create | NLM_F_APPEND, seq, [
      nfgen(NFPROTO_IPV4),
      attr(NFTA_RULE_TABLE, str(NFT_TABLE)),
      attr(NFTA_RULE_CHAIN, str(chain)),
      attr(NFTA_RULE_EXPRESSIONS, exprs),
    ]);
  return [
    message(NFNL_MSG_BATCH_BEGIN, NLM_F_REQUEST, 1, [nfgen(0, NFNL_SUBSYS_NFTABLES)]),
    message(type(NFT_MSG_NEWTABLE), create | NLM_F_EXCL, 2, [
      nfgen(NFPROTO_IPV4),
      attr(NFTA_TABLE_NAME, str(NFT_TABLE)),
    ]),
    message(type(NFT_MSG_NEWCHAIN), create | NLM_F_EXCL, 3, [
      nfgen(NFPROTO_IPV4),
      attr(NFTA_CHAIN_TABLE, str(NFT_TABLE)),
      attr(NFTA_CHAIN_NAME, str(chain)),
      attr(NFTA_CHAIN_HOOK, [
        attr(NFTA_HOOK_HOOKNUM, be32(forwarded ? NF_INET_PRE_ROUTING : NF_INET_LOCAL_OUT)),
        attr(NFTA_HOOK_PRIORITY, be32(-100)),
      ]),
      attr(NFTA_CHAIN_POLICY, be32(NF_ACCEPT)),
      attr(NFTA_CHAIN_TYPE, str('nat')),
    ]),
    // ip daddr 127.0.0.0/8 return (a /8 prefix is its first byte)
    rule(4, [loadDaddr(1), cmpEq(Buffer.from([127])), returnVerdict()]),
    // ip daddr A return
    rule(5, [loadDaddr(4), cmpEq(a), returnVerdict()]),
    // (forwarded) ip daddr K return
    ...(keep ? [rule(8, [loadDaddr(4), cmpEq(keep), returnVerdict()])] : []),
    // meta l4proto tcp dnat to A:P
    rule(6, [
      expr('meta', [
        attr(1 /* NFTA_META_DREG */, be32(NFT_REG_1)),
        attr(2 /* NFTA_META_KEY */, be32(NFT_META_L4PROTO)),
      ]),
      cmpEq(Buffer.from([IPPROTO_TCP])),
      immediate(NFT_REG_1, a),
      immediate(NFT_REG_2, p),
      expr('nat', [
        attr(1 /* NFTA_NAT_TYPE */, be32(NFT_NAT_DNAT)),
        attr(2 /* NFTA_NAT_FAMILY */, be32(NFPROTO_IPV4)),
        attr(3 /* NFTA_NAT_REG_ADDR_MIN */, be32(NFT_REG_1)),
        attr(5 /* NFTA_NAT_REG_PROTO_MIN */, be32(NFT_REG_2)),
        attr(7 /* NFTA_NAT_FLAGS */, be32(NF_NAT_RANGE_PROTO_SPECIFIED)),
      ]),
    ]),
    message(NFNL_MSG_BATCH_END, NLM_F_REQUEST, 7, [nfgen(0, NFNL_SUBSYS_NFTABLES)]),
  ];
}

// ---- transport ---------------------------------------------------------------------------------

/** A netlink socket of `protocol` in the calling thread's current network namespace. */
export function netlinkSocket(c: Libc, protocol: 'route' | 'netfilter'): number {
  const fd = c.socket(
    AF_NETLINK,
    SOCK_RAW | SOCK_CLOEXEC,
    protocol === 'route' ? NETLINK_ROUTE : NETLINK_NETFILTER,
  );
  if (fd < 0) throw new AirlockError('INTERNAL', `netlink socket: errno ${c.errno()}`);
  return fd;
}

/**
 * Send `messages` in one datagram and check that every one asking for an ACK got a zero error. The
 * kernel handles a request inside send(), so the answers are queued when it returns: they are read
 * without blocking, and a missing one is an error (never a hang).
 */
export function netlinkRequest(c: Libc, fd: number, messages: readonly Buffer[], what: string): void {
  const req = Buffer.concat(messages);
  const waiting = new Set<number>();
  for (const m of messages) if (m.readUInt16LE(6) & NLM_F_ACK) waiting.add(m.readUInt32LE(8));
  const sent = c.send(fd, req, req.length, 0);
  if (sent !== req.length) throw new AirlockError('INTERNAL', `${what}: netlink send: errno ${c.errno()}`);
  const buf = Buffer.alloc(8192);
  while (waiting.size) {
    const n = c.recv(fd, buf, buf.length, MSG_DONTWAIT);
    if (n < 0) throw new AirlockError('INTERNAL', `${what}: no netlink answer: errno ${c.errno()}`);
    for (let off = 0; off + 16 <= n;) {
      const len = buf.readUInt32LE(off);
      if (len < 16 || off + len > n) throw new AirlockError('INTERNAL', `${what}: malformed netlink answer`);
      if (buf.readUInt16LE(off + 4) === NLMSG_ERROR && len >= 20) {
        const error = buf.readInt32LE(off + 16);
        const seq = buf.readUInt32LE(off + 8); // an answer carries its request's sequence number
        if (error !== 0)
          throw new AirlockError('INTERNAL', `${what}: kernel refused message ${seq}: errno ${-error}`);
        waiting.delete(seq);
      }
      off += pad4(len);
    }
  }
}
