// Where a sandbox's way out listens, inside the sandbox's own network namespace. The egress gateway
// binds these, the backends make them ahead in warm slots, the runtime points the proxy variables
// at them: one definition for every layer (see docs/threat-model.md, egress).

/** The HTTP/CONNECT/SOCKS5 proxy and the DNS server, on the sandbox's loopback. */
export const PROXY_ADDRESS = '127.0.0.1';
export const PROXY_PORT = 3128;
export const DNS_PORT = 53;
/** Where transparent interception sends every outbound TCP connection (an address only lo holds). */
export const TRANSPARENT_ADDRESS = '10.255.255.254';
export const TRANSPARENT_PORT = 15001;

/** A socket the egress gateway listens on inside a sandbox. */
export interface SandboxSocket {
  readonly kind: 'tcp' | 'udp';
  readonly address: string;
  readonly port: number;
}

/** The listening sockets of every sandbox's egress: its proxy and its DNS. */
export const EGRESS_SOCKETS: readonly SandboxSocket[] = [
  { kind: 'tcp', address: PROXY_ADDRESS, port: PROXY_PORT },
  { kind: 'udp', address: PROXY_ADDRESS, port: DNS_PORT },
];

/** The listener of transparent interception. */
export const TRANSPARENT_SOCKET: SandboxSocket = {
  kind: 'tcp',
  address: TRANSPARENT_ADDRESS,
  port: TRANSPARENT_PORT,
};
