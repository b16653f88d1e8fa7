// The egress audit event: one per connection attempt (and per proxied HTTP request). Its shape is
// stable: the audit store (a later issue) persists it as is.

/** How an egress attempt arrived: proxy, CONNECT, SOCKS5 or transparent. */
export type EgressProtocol =
  | 'http' // absolute-form request through the proxy
  | 'connect' // HTTP CONNECT tunnel through the proxy
  | 'socks5'
  | 'transparent-http' // intercepted plain HTTP, decided by Host
  | 'transparent-tls' // intercepted TLS, decided by SNI
  | 'transparent-tcp' // intercepted other TCP, decided by the DNS name of its address
  | 'dns';

/** One egress attempt of a sandbox: host, port, protocol, decision and reason. */
export interface EgressEvent {
  readonly sandboxId: string;
  readonly time: string;
  readonly protocol: EgressProtocol;
  readonly host: string;
  readonly port: number;
  /** The vetted address Airlock connected to (absent when denied before resolving). */
  readonly address?: string;
  readonly decision: 'allow' | 'deny';
  readonly reason: string;
  /** For denials: a stable code (policy codes, plus 'sentinel', 'canary', 'resolve_failed', 'mismatch', ...). */
  readonly code?: string;
  readonly bytesUp: number;
  readonly bytesDown: number;
  readonly durationMs: number;
  /** Secret names whose sentinels were swapped for real values on this request. */
  readonly secretsSwapped?: readonly string[];
  /** Set when the attempt looks like exfiltration (a sentinel or canary where it must not go). */
  readonly alert?: 'sentinel' | 'canary';
}
