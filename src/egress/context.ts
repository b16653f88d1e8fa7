// What the egress paths (forward.ts, tunnel.ts, transparent.ts) need from one sandbox's egress
// (SandboxEgress in gateway.ts): its options, the vetted dial, socket accounting and event reporting.
// An interface, so the paths and the gateway that runs them do not import each other in a cycle.
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import type { EgressPlumbing, Logger } from '../core/backend.js';
import type { FdBudget } from '../core/fd-budget.js';
import type { NetworkPolicy } from '../policy/network.js';
import type { SecretLease } from '../secrets/sentinels.js';
import type { EgressEvent, EgressProtocol } from './events.js';
import type { MitmCa } from './mitm.js';
import type { FdRelay, RelayedTunnel } from './relay.privileged.js';
import type { Dialer, Resolver, VetResult } from './vet.js';

/** Slowloris: a request head (or a SOCKS5 handshake) must arrive within this. */
export const HEADERS_TIMEOUT_MS = 10_000;
/** File descriptors one sandbox may hold in the gateway at once: client + upstream sockets, whether
 * Node holds them or the fd relay (a tunnel handed to it holds duplicates of its two sockets). */
export const MAX_SOCKETS_PER_SANDBOX = 4096;
export const IDLE_TIMEOUT_MS = 300_000;
/** The reason of every allow event. */
export const ALLOWED_REASON = 'allowed by network.allow';

export interface EgressGatewayOptions {
  readonly resolver?: Resolver;
  readonly dialer?: Dialer;
  /** The per-installation CA, created on first use (only sandboxes with secrets need it). */
  readonly ca: () => MitmCa;
  /** Extra CAs trusted for upstream TLS when intercepting (tests use a private test CA). */
  readonly upstreamCa?: readonly string[];
  /**
   * Let a worker thread move the bytes of tunnels nothing needs to inspect on the raw fds, off
   * Node's streams (see relay.privileged.ts). Default true; false keeps every byte in Node streams.
   */
  readonly fdRelay?: boolean;
  /** Admits each new sandbox connection against Airlock's fd budget (none: no budget). */
  readonly fdBudget?: Pick<FdBudget, 'admit'>;
  readonly logger: Logger;
}

export interface AttachOptions {
  readonly sandboxId: string;
  readonly plumbing: EgressPlumbing;
  /** The policy at attach; the one in force is EgressContext.policy (it can be replaced). */
  readonly policy: NetworkPolicy;
  readonly secrets?: SecretLease;
  /** Names of secrets whose sentinels are also swapped in request bodies. */
  readonly bodySwap?: ReadonlySet<string>;
  readonly onEvent: (e: EgressEvent) => void;
}

/** A connection decided for one host:port: every HTTP request on it must name that host (pin.ts). */
export interface PinnedConnection {
  /** Canonical; undefined until the first request names it (transparent HTTP to a literal address). */
  host?: string;
  /** The host when that first request names none (HTTP/1.0 without Host): the address dialled. */
  readonly fallback?: string;
  readonly port: number;
  readonly protocol: EgressProtocol;
}

export type Vetted = Extract<VetResult, { ok: true }>;
export type Refused = Extract<VetResult, { ok: false }>;
export type DenyExtra = Partial<Pick<EgressEvent, 'address' | 'alert' | 'bytesUp' | 'bytesDown'>>;

/** One sandbox's egress, as the paths see it. */
export interface EgressContext {
  readonly o: AttachOptions;
  readonly opts: EgressGatewayOptions;
  /** The egress was closed (nothing new may start). */
  readonly closed: boolean;
  /** Bytes reserved for request bodies being buffered for a secret swap (forward.ts). */
  bufferedBytes: number;
  /** The runtime's fd relay, if there is one. */
  readonly relay: FdRelay | undefined;
  /** Policy on the name, Airlock's own resolution, every address checked, a dial (vet.ts). */
  vet(host: string, port: number): Promise<VetResult>;
  /** Count an upstream socket against the sandbox until it closes (and close it with the sandbox). */
  hold(sock: Socket): void;
  /** File descriptors this sandbox holds in the gateway. */
  fds(): number;
  /** The network policy in force (the attach's, or the last one set; see SandboxEgress.setPolicy). */
  readonly policy: NetworkPolicy;
  /** A tunnel handed to the fd relay counts against the sandbox until released. */
  trackRelayed(t: RelayedTunnel, sockets: readonly Socket[], upstream?: Socket): () => void;
  emit(e: Omit<EgressEvent, 'sandboxId' | 'time'>): void;
  emitAllowed(
    protocol: EgressProtocol,
    host: string,
    port: number,
    address: string,
    bytes: { bytesUp: number; bytesDown: number },
    started: number,
    extra?: Partial<EgressEvent>,
  ): void;
  /** Report a refusal (the reason is the text the sandbox also receives). */
  denied(
    protocol: EgressProtocol,
    host: string,
    port: number,
    reason: string,
    code: string,
    started: number,
    extra?: DenyExtra,
  ): void;
  /** Report a refusal by vetAndDial (policy, SSRF guard, resolution or connect failure). */
  denyEvent(protocol: EgressProtocol, r: Refused, port: number, started: number): void;
  /** Run an async handler; any failure closes its connection instead of reaching the process. */
  guard(p: Promise<void>, conn: Socket | ServerResponse): void;
  /** Hand a connection carrying plain HTTP (its first `bytes` already read) to the pinned HTTP path. */
  httpOver(sock: Socket, bytes: Buffer, t: PinnedConnection): void;
  /** Hand a client-side TLS socket of an intercepted connection to the HTTP path inside TLS. */
  serveIntercepted(tlsClient: Socket, t: PinnedConnection): void;
  /** The pinned connection a request on the plain-HTTP path arrived on. */
  pinnedOf(req: IncomingMessage): PinnedConnection | undefined;
}
