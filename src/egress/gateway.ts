// SECURITY-CRITICAL: a sandbox's only way out. Per sandbox, three sockets inside its network namespace
// that belong to Airlock (so sandboxed code can use them but never kill or replace them):
//   127.0.0.1:3128        the proxy: HTTP absolute-form, HTTP CONNECT and SOCKS5 on one port
//   10.255.255.254:15001  transparent interception: every other outbound TCP connection lands here
//   127.0.0.1:53 (udp)    DNS: allowed names get a synthetic address, everything else NXDOMAIN
// Every path ends in vetAndDial (policy on the name, Airlock's own resolution, a check of every
// address, a dial to exactly that address) and every attempt becomes an EgressEvent.
// This file is the mechanism that holds them: listeners, socket and fd accounting, events. The paths
// are forward.ts (plain requests), tunnel.ts (CONNECT, SOCKS5, relaying), transparent.ts, and the
// exfiltration scanning is secrets/exfil.ts; what is allowed is policy's verdict (policy/network.ts).
import { createSocket, type Socket as UdpSocket } from 'node:dgram';
import {
  createServer as createHttpServer,
  type IncomingMessage,
  type Server as HttpServer,
  type ServerResponse,
} from 'node:http';
import { createServer, type Server, type Socket } from 'node:net';
import { AirlockError } from '../core/errors.js';
import { decideAddress, decideHost, hostAllowedOnSomePort, type NetworkPolicy } from '../policy/network.js';
import {
  HEADERS_TIMEOUT_MS,
  IDLE_TIMEOUT_MS,
  ALLOWED_REASON,
  MAX_SOCKETS_PER_SANDBOX,
  type AttachOptions,
  type DenyExtra,
  type EgressContext,
  type EgressGatewayOptions,
  type PinnedConnection,
  type Refused,
} from './context.js';
import { FakeDns } from './dns.js';
import type { EgressEvent, EgressProtocol } from './events.js';
import { refuseForFds } from './fd-refusal.js';
import { forwardPinned, onProxyRequest } from './forward.js';
import { sendText } from './http-util.js';
import { FdRelay, RELAY_FDS, type RelayedTunnel } from './relay.privileged.js';
import { onTransparent } from './transparent.js';
import { onConnect, onPinnedUpgrade, onSocks } from './tunnel.js';
import {
  systemDialer,
  systemResolver,
  vetAndDial,
  type Dialer,
  type Resolver,
  type VetResult,
} from './vet.js';
import {
  DNS_PORT,
  PROXY_ADDRESS,
  PROXY_PORT,
  TRANSPARENT_ADDRESS,
  TRANSPARENT_PORT,
} from '../core/sandbox-sockets.js';

export type { AttachOptions, EgressGatewayOptions } from './context.js';

// The in-sandbox socket layout lives in core/ (the backends make these sockets ahead too).
export { DNS_PORT, PROXY_ADDRESS, PROXY_PORT, TRANSPARENT_ADDRESS, TRANSPARENT_PORT };
/** Synthetic addresses handed out by the sandbox's DNS (never dialled: mapped back to their name). */
export const SYNTHETIC_POOL = '198.18.0.0/15';
/** Distinct names one sandbox's DNS hands synthetic addresses to (bounds its table's memory). */
export const MAX_DNS_NAMES_PER_SANDBOX = 4096;

/** Where an open upstream connection goes. */
interface Destination {
  readonly host: string;
  readonly port: number;
  readonly address: string;
}

/** The runtime-wide part: resolver, dialer and CA shared by every sandbox's egress. */
export class EgressGateway {
  readonly resolver: Resolver;
  readonly dialer: Dialer;
  /** undefined: not made yet; null: not available here (or turned off). */
  private relayInstance: FdRelay | null | undefined;
  constructor(readonly opts: EgressGatewayOptions) {
    this.resolver = opts.resolver ?? systemResolver;
    this.dialer = opts.dialer ?? systemDialer;
  }

  attach(o: AttachOptions): SandboxEgress {
    if (!o.secrets) this.relay?.warm();
    return new SandboxEgress(this, o);
  }

  /** The fd relay shared by every sandbox of this runtime, if there is one. */
  get relay(): FdRelay | undefined {
    if (this.relayInstance === undefined) {
      this.relayInstance = this.opts.fdRelay === false ? null : (FdRelay.create(this.opts.logger) ?? null);
    }
    return this.relayInstance ?? undefined;
  }

  /** Stop the relay's worker (ending any tunnel it still carries). Sandboxes close their own egress. */
  async close(): Promise<void> {
    await this.relayInstance?.close();
  }
}

/** One sandbox's listeners and state. close() stops them and revokes its secrets. */
export class SandboxEgress implements EgressContext {
  /** The listening servers (each owns a socket in the sandbox's netns). */
  private readonly servers: Server[] = [];
  private udp: UdpSocket | undefined;
  private readonly sockets = new Set<Socket>();
  /** Tunnels handed to the fd relay (their sockets are no longer in `sockets`). */
  private readonly relayed = new Set<RelayedTunnel>();
  private readonly dns: FakeDns;
  closed = false;
  /** The listening sockets in the sandbox's netns, and connections + DNS queries taken from them. */
  private readonly listenFds: number[] = [];
  private activity = 0;
  bufferedBytes = 0;
  /**
   * The HTTP parsers connections are handed to (they never listen), each made at its first use:
   * most sandboxes never need one, and the proxy port's first byte decides between HTTP and SOCKS.
   */
  private readonly httpServers: HttpServer[] = [];
  private proxyHttpServer: HttpServer | undefined;
  /** Requests inside intercepted TLS (hosts with a bound secret). */
  private mitmServerLazy: HttpServer | undefined;
  /**
   * Plain HTTP on a decided connection (transparent, or inside a CONNECT / SOCKS5 tunnel): one server
   * for the sandbox, the decided target per connection; every request is pinned to it (pin.ts).
   */
  private transparentHttpLazy: HttpServer | undefined;
  private readonly transparentHttpTargets = new WeakMap<Socket, PinnedConnection>();
  /** Client-side TLS sockets of intercepted connections → where their requests may go. */
  private readonly intercepted = new WeakMap<Socket, PinnedConnection>();
  /**
   * The policy in force. Replaced whole by setPolicy (never mutated), so a decision that read it once
   * saw one policy, old or new, never a mix of both.
   */
  private current: NetworkPolicy;
  /** Open upstream connections and where they go: setPolicy closes those the new policy denies. */
  private readonly upstreams = new Map<Socket, Destination>();
  /** Tunnels handed to the fd relay and where they go (their sockets are no longer Node's). */
  private readonly relayedTo = new Map<RelayedTunnel, Destination>();

  constructor(
    private readonly gw: EgressGateway,
    readonly o: AttachOptions,
  ) {
    this.current = o.policy;
    const transparent = o.policy.transparent;
    const listen = (kind: 'tcp' | 'udp', address: string, port: number): number => {
      const fd = o.plumbing.listen(kind, address, port);
      this.listenFds.push(fd);
      return fd;
    };
    let dnsFullReported = false;
    this.dns = new FakeDns({
      // Asked at every query: an answer follows the policy in force when it is given.
      allows: (name) => transparent && hostAllowedOnSomePort(this.current, name),
      pool: SYNTHETIC_POOL,
      maxNames: MAX_DNS_NAMES_PER_SANDBOX,
      // Reported once per sandbox (every later new name gets the same REFUSED answer).
      onTableFull: (name) => {
        if (dnsFullReported) return;
        dnsFullReported = true;
        const reason = `Airlock egress: this sandbox's DNS has given addresses to ${MAX_DNS_NAMES_PER_SANDBOX} names, its limit; new names (${name} first) are refused, names it already knows keep working. Use fewer distinct names, or the proxy (HTTP_PROXY), which needs no DNS`;
        this.denied('dns', name, DNS_PORT, reason, 'dns_table_full', Date.now());
      },
    });
    // Proxy: one port, SOCKS5 sniffed by its first byte, everything else is HTTP.
    // noDelay: the http servers never accept, so the option they set on accepted sockets (no
    // Nagle: a response's last small write, e.g. the final chunk, must not wait for an ACK) is set here.
    const proxy = createServer({ noDelay: true }, (sock) =>
      this.track(sock, () => this.onProxyConnection(sock, this.proxyHttp)),
    );
    proxy.listen({ fd: listen('tcp', PROXY_ADDRESS, PROXY_PORT) });
    this.servers.push(proxy);
    if (transparent) {
      o.plumbing.interceptTcp(TRANSPARENT_ADDRESS, TRANSPARENT_PORT);
      const t = createServer({ noDelay: true }, (sock) =>
        this.track(sock, () => this.guard(this.onTransparent(sock), sock)),
      );
      t.listen({ fd: listen('tcp', TRANSPARENT_ADDRESS, TRANSPARENT_PORT) });
      this.servers.push(t);
    }
    const udp = createSocket('udp4');
    udp.on('message', (msg, rinfo) => {
      this.activity++;
      const answer = this.dns.answer(msg);
      if (answer) udp.send(answer, rinfo.port, rinfo.address);
    });
    udp.on('error', () => {});
    udp.bind({ fd: listen('udp', PROXY_ADDRESS, DNS_PORT) });
    this.udp = udp;
  }

  /** Environment for the sandbox: proxy variables (upper and lower case). */
  env(): Record<string, string> {
    const url = `http://${PROXY_ADDRESS}:${PROXY_PORT}`;
    const socks = `socks5h://${PROXY_ADDRESS}:${PROXY_PORT}`;
    const e: Record<string, string> = {};
    for (const [k, v] of [
      ['HTTP_PROXY', url],
      ['HTTPS_PROXY', url],
      ['ALL_PROXY', socks],
      ['NO_PROXY', 'localhost,127.0.0.1,::1'],
    ] as const) {
      e[k] = v;
      e[k.toLowerCase()] = v;
    }
    return e;
  }

  /** A mark for quietSince(). */
  activityMark(): number {
    return this.activity;
  }

  /**
   * Whether no connection or DNS query reached this sandbox's listeners since `mark` and none waits
   * in the kernel to be taken: then nothing started in between caused an egress event still to come.
   */
  quietSince(mark: number): boolean {
    return this.activity === mark && this.o.plumbing.waiting?.(this.listenFds) === false;
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.o.secrets?.revoke(); // lease-bound: from now on no sentinel is ever swapped
    for (const s of this.sockets) s.destroy();
    for (const t of this.relayed) t.close();
    this.udp?.close();
    // Every listener stops accepting now (server.close() closes its handle at once); the promise
    // resolves once their handles and every relayed connection are closed.
    // The HTTP parsers hold no handle: close() only stops their timers (no callback: it would get
    // an ERR_SERVER_NOT_RUNNING error, whose stack trace is costly, for nothing).
    for (const s of this.httpServers) s.close();
    await Promise.all([
      ...this.servers.map((s) => new Promise<void>((r) => s.close(() => r()))),
      ...[...this.relayed].map((t) => t.done),
    ]);
  }

  // ---- plumbing ----------------------------------------------------------------------------------

  get opts(): EgressGatewayOptions {
    return this.gw.opts;
  }

  get relay(): FdRelay | undefined {
    return this.gw.relay;
  }

  private get proxyHttp(): HttpServer {
    this.proxyHttpServer ??= this.httpServer((req, res) =>
      this.guard(onProxyRequest(this, req, res), res),
    ).on('connect', (req: IncomingMessage, sock: Socket, head: Buffer) =>
      this.guard(onConnect(this, req, sock, head), sock),
    );
    return this.proxyHttpServer;
  }

  private get mitmServer(): HttpServer {
    this.mitmServerLazy ??= this.httpServer((req, res) => {
      const meta = this.intercepted.get(req.socket);
      if (!meta) return void sendText(res, 500, 'Airlock egress: lost the intercepted connection');
      this.guard(forwardPinned(this, meta, req, res, true), res);
    });
    return this.mitmServerLazy;
  }

  private get transparentHttp(): HttpServer {
    this.transparentHttpLazy ??= this.httpServer((req, res) => {
      const t = this.transparentHttpTargets.get(req.socket);
      if (!t) return void sendText(res, 500, 'Airlock egress: lost the intercepted connection');
      this.guard(forwardPinned(this, t, req, res, false), res);
    }).on('upgrade', (req: IncomingMessage, sock: Socket, head: Buffer) =>
      this.guard(onPinnedUpgrade(this, req, sock, head), sock),
    );
    return this.transparentHttpLazy;
  }

  private httpServer(onRequest: (req: IncomingMessage, res: ServerResponse) => void): HttpServer {
    const s = createHttpServer(
      {
        requestTimeout: 60_000,
        headersTimeout: HEADERS_TIMEOUT_MS,
        keepAliveTimeout: 5_000,
        connectionsCheckingInterval: 1_000,
      },
      onRequest,
    );
    // These servers never listen(): connections are handed to them. Node only tracks connections and
    // enforces headersTimeout/requestTimeout (slowloris) from the 'listening' event on, so emit it.
    s.emit('listening');
    s.on('clientError', (_err, sock: Socket) => {
      if (sock.writable)
        sock.end('HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Length: 0\r\n\r\n');
      sock.destroy();
    });
    this.httpServers.push(s);
    // Made by a connection still being handled when the sandbox's egress closed: stop its timer at
    // once (its socket is destroyed already), or it would keep the process alive.
    if (this.closed) s.close();
    return s;
  }

  httpOver(sock: Socket, bytes: Buffer, t: PinnedConnection): void {
    sock.unshift(bytes);
    this.transparentHttpTargets.set(sock, t);
    this.transparentHttp.emit('connection', sock);
    sock.resume();
  }

  serveIntercepted(tlsClient: Socket, t: PinnedConnection): void {
    this.intercepted.set(tlsClient, t);
    this.mitmServer.emit('connection', tlsClient);
  }

  pinnedOf(req: IncomingMessage): PinnedConnection | undefined {
    return this.transparentHttpTargets.get(req.socket);
  }

  hold(sock: Socket): void {
    if (this.sockets.has(sock)) return;
    this.sockets.add(sock);
    sock.once('close', () => this.sockets.delete(sock));
    sock.on('error', () => {});
  }

  /** File descriptors this sandbox holds in the gateway (a relayed tunnel: RELAY_FDS). */
  fds(): number {
    return this.sockets.size + RELAY_FDS * this.relayed.size;
  }

  trackRelayed(t: RelayedTunnel, sockets: readonly Socket[], upstream?: Socket): () => void {
    for (const s of sockets) this.sockets.delete(s);
    this.relayed.add(t);
    const dest = [...sockets, ...(upstream ? [upstream] : [])]
      .map((s) => this.upstreams.get(s))
      .find((d) => d !== undefined);
    if (dest) this.relayedTo.set(t, dest);
    // Swapped while the tunnel was being handed over: the sweep saw neither the socket nor the tunnel.
    if (dest && !this.permits(this.current, dest)) t.close();
    return () => {
      this.relayed.delete(t);
      this.relayedTo.delete(t);
    };
  }

  private track(sock: Socket, handle: () => void): void {
    this.activity++;
    // One sandbox must not exhaust Airlock's file descriptors (each client also holds an upstream).
    if (this.closed || this.fds() >= MAX_SOCKETS_PER_SANDBOX) {
      sock.destroy();
      return;
    }
    // Airlock's process-wide fd budget (core/fd-budget.ts): refused at once, with the reason.
    const fdAdmission = this.gw.opts.fdBudget?.admit(this.fds(), 2);
    if (fdAdmission && !fdAdmission.ok)
      return void refuseForFds(sock, fdAdmission.reason, (e) => this.emit(e));
    this.sockets.add(sock);
    sock.setTimeout(IDLE_TIMEOUT_MS, () => sock.destroy());
    sock.on('close', () => this.sockets.delete(sock));
    sock.on('error', () => {});
    handle();
  }

  emitAllowed(
    protocol: EgressProtocol,
    host: string,
    port: number,
    address: string,
    bytes: { bytesUp: number; bytesDown: number },
    started: number,
    extra: Partial<EgressEvent> = {},
  ): void {
    this.emit({
      protocol,
      host,
      port,
      address,
      decision: 'allow',
      reason: ALLOWED_REASON,
      bytesUp: bytes.bytesUp,
      bytesDown: bytes.bytesDown,
      durationMs: Date.now() - started,
      ...extra,
    });
  }

  emit(e: Omit<EgressEvent, 'sandboxId' | 'time'>): void {
    try {
      this.o.onEvent({ sandboxId: this.o.sandboxId, time: new Date().toISOString(), ...e });
    } catch {
      /* an event consumer's bug never breaks a connection */
    }
  }

  /** The network policy in force (the one given at attach, or the last setPolicy's). */
  get policy(): NetworkPolicy {
    return this.current;
  }

  /**
   * Replace the policy, atomically for this sandbox: every decision from now on (connections, each
   * request on a kept-alive connection, DNS answers) uses `policy`, and every open upstream
   * connection it denies (host, port or address) is closed now. DNS answers need no purge: the
   * responder asks the policy at each query, and a synthetic address handed out earlier is only
   * ever mapped back to its name, which is then decided under the policy in force.
   * @throws AirlockError SANDBOX_GONE once closed; INVALID_ARGUMENT when `transparent` differs
   * (the interception is set up in the sandbox's netns at create).
   */
  setPolicy(policy: NetworkPolicy): void {
    if (this.closed) throw new AirlockError('SANDBOX_GONE', `sandbox ${this.o.sandboxId} is gone`);
    if (policy.transparent !== this.current.transparent) {
      throw new AirlockError(
        'INVALID_ARGUMENT',
        `network.transparent is fixed when the sandbox is created (it is ${String(this.current.transparent)}); keep it, or create a new sandbox`,
        { field: 'network.transparent' },
      );
    }
    this.current = policy;
    for (const [sock, dest] of this.upstreams) if (!this.permits(policy, dest)) sock.destroy();
    for (const [t, dest] of this.relayedTo) if (!this.permits(policy, dest)) t.close();
  }

  /** Whether `policy` allows a connection already made to `dest` (its name and the address dialled). */
  private permits(policy: NetworkPolicy, dest: Destination): boolean {
    return this.verdict(policy, dest).action === 'allow';
  }

  /** `policy`'s verdict on a connection to `dest`: its name and port first, then the address dialled. */
  private verdict(policy: NetworkPolicy, dest: Destination): ReturnType<typeof decideHost> {
    const v = decideHost(policy, dest.host, dest.port);
    return v.action === 'allow' ? decideAddress(policy, dest.address, dest.port, dest.host) : v;
  }

  async vet(host: string, port: number): Promise<VetResult> {
    const policy = this.current;
    const r = await vetAndDial({ policy, resolver: this.gw.resolver, dialer: this.gw.dialer }, host, port);
    if (!r.ok) return r;
    const dest: Destination = { host: r.host, port, address: r.address };
    // The policy changed while this was resolving or dialling: the connection must also pass the new
    // one, or a dial begun under the old policy would open after the swap's sweep.
    if (this.current !== policy) {
      const va = this.verdict(this.current, dest);
      if (va.action === 'deny') {
        r.socket.destroy();
        return { ok: false, host: r.host, address: r.address, verdict: va };
      }
    }
    this.upstreams.set(r.socket, dest);
    r.socket.once('close', () => this.upstreams.delete(r.socket));
    return r;
  }

  denyEvent(protocol: EgressProtocol, r: Refused, port: number, started: number): void {
    this.denied(
      protocol,
      r.host,
      port,
      r.verdict.reason,
      r.verdict.code,
      started,
      r.address ? { address: r.address } : {},
    );
  }

  denied(
    protocol: EgressProtocol,
    host: string,
    port: number,
    reason: string,
    code: string,
    started: number,
    extra: DenyExtra = {},
  ): void {
    this.emit({
      protocol,
      host,
      port,
      decision: 'deny',
      reason,
      code,
      bytesUp: 0,
      bytesDown: 0,
      durationMs: Date.now() - started,
      ...extra,
    });
  }

  guard(p: Promise<void>, conn: Socket | ServerResponse): void {
    p.catch((e: unknown) => {
      this.gw.opts.logger.warn({ err: (e as Error)?.message }, 'egress handler failed');
      if ('headersSent' in conn && !conn.headersSent) sendText(conn, 502, 'Airlock egress: internal error');
      else conn.destroy();
    });
  }

  // ---- the two listeners' first step ----------------------------------------------------------------

  /** The proxy port: SOCKS5 by its first byte (0x05), everything else goes to the HTTP parser. */
  private onProxyConnection(sock: Socket, http: HttpServer): void {
    sock.once('data', (first: Buffer) => {
      if (first[0] === 0x05) {
        this.guard(onSocks(this, sock, first), sock);
        return;
      }
      sock.pause();
      sock.unshift(first);
      http.emit('connection', sock);
      sock.resume();
    });
  }

  /** The transparent port: the connection's original destination, and its DNS name if synthetic. */
  private async onTransparent(sock: Socket): Promise<void> {
    const fd = (sock as unknown as { _handle?: { fd?: number } })._handle?.fd;
    const dst = fd === undefined ? undefined : this.o.plumbing.originalDestination(fd);
    if (!dst) return void sock.destroy();
    await onTransparent(this, sock, { ...dst, synthetic: this.dns.nameFor(dst.address) });
  }
}
