// SECURITY-CRITICAL: a sandbox's only way out. Per sandbox, three sockets inside its network namespace
// that belong to Airlock (so sandboxed code can use them but never kill or replace them):
//   127.0.0.1:3128        the proxy: HTTP absolute-form, HTTP CONNECT and SOCKS5 on one port
//   10.255.255.254:15001  transparent interception: every other outbound TCP connection lands here
//   127.0.0.1:53 (udp)    DNS: allowed names get a synthetic address, everything else NXDOMAIN
// Every path ends in vetAndDial (policy on the name, Airlock's own resolution, a check of every
// address, a dial to exactly that address) and every attempt becomes an EgressEvent.
import { createSocket, type Socket as UdpSocket } from 'node:dgram';
import {
  createServer as createHttpServer,
  request as httpRequest,
  type IncomingMessage,
  type Server as HttpServer,
  type ServerResponse,
} from 'node:http';
import { createServer, type Server, type Socket } from 'node:net';
import { connect as tlsConnect, TLSSocket } from 'node:tls';
import type { EgressPlumbing, Logger } from '../core/backend.js';
import type { NetworkPolicy } from '../policy/network.js';
import { decideHost } from '../policy/network.js';
import type { SecretLease } from '../secrets/sentinels.js';
import { Scrubber, type ScrubValue } from '../secrets/scrub.js';
import { responseBodyDecoding } from './content-coding.js';
import { canonicalHost } from './address.js';
import { FakeDns } from './dns.js';
import type { EgressEvent, EgressProtocol } from './events.js';
import type { MitmCa } from './mitm.js';
import { flushed, RELAY_FDS, FdRelay, type RelayedTunnel } from './relay.privileged.js';
import { forwardPlain } from './plain-http.js';
import { parseResponseHead } from './http-head.js';
import type { ClientHelloResult } from './sni.js';
import { parseAuthority as parseHostHeader, pinRequest, sameHost } from './pin.js';
import { sniffTunnel } from './sniff.js';
import { refuseForFds } from './fd-refusal.js';
import type { FdBudget } from '../core/fd-budget.js';
import {
  NOT_ALLOWED,
  HOST_UNREACHABLE,
  SUCCEEDED,
  socks5Greeting,
  socks5MethodReply,
  socks5Reply,
  socks5Request,
  selectSocks5Method,
  METHOD_NO_ACCEPTABLE,
} from './socks.js';
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

/** The reason of every allow event. */
const ALLOWED_REASON = 'allowed by network.allow';
// The in-sandbox socket layout lives in core/ (the backends make these sockets ahead too).
export { DNS_PORT, PROXY_ADDRESS, PROXY_PORT, TRANSPARENT_ADDRESS, TRANSPARENT_PORT };
/** Synthetic addresses handed out by the sandbox's DNS (never dialled: mapped back to their name). */
export const SYNTHETIC_POOL = '198.18.0.0/15';
/** Distinct names one sandbox's DNS hands synthetic addresses to (bounds its table's memory). */
export const MAX_DNS_NAMES_PER_SANDBOX = 4096;

/** Slowloris: a request head (or a SOCKS5 handshake) must arrive within this. */
const HEADERS_TIMEOUT_MS = 10_000;
/** File descriptors one sandbox may hold in the gateway at once: client + upstream sockets, whether
 * Node holds them or the fd relay (a tunnel handed to it holds duplicates of its two sockets). */
const MAX_SOCKETS_PER_SANDBOX = 4096;
/** Request headers into which a bound secret's real value may be swapped (credential headers only). */
const SWAP_HEADERS = /^(authorization|x-api-key|api-key|x-auth-token|private-token|x-goog-api-key|cookie)$/i;
const MAX_SWAPPED_BODY_BYTES = 1024 * 1024;
const MAX_BUFFERED_BYTES_PER_SANDBOX = 16 * 1024 * 1024;
/** Bytes of the previous chunk kept when scanning a streamed body (longer than any encoded sentinel). */
const BODY_SCAN_OVERLAP_BYTES = 512;
const FIRST_BYTES_TIMEOUT_MS = 300; // transparent: wait this long for SNI/Host before deciding without
const IDLE_TIMEOUT_MS = 300_000;

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
  readonly policy: NetworkPolicy;
  readonly secrets?: SecretLease;
  /** Names of secrets whose sentinels are also swapped in request bodies. */
  readonly bodySwap?: ReadonlySet<string>;
  readonly onEvent: (e: EgressEvent) => void;
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
export class SandboxEgress {
  /** The listening servers (each owns a socket in the sandbox's netns). */
  private readonly servers: Server[] = [];
  private udp: UdpSocket | undefined;
  private readonly sockets = new Set<Socket>();
  /** Tunnels handed to the fd relay (their sockets are no longer in `sockets`). */
  private readonly relayed = new Set<RelayedTunnel>();
  private readonly dns: FakeDns;
  private closed = false;
  /** The listening sockets in the sandbox's netns, and connections + DNS queries taken from them. */
  private readonly listenFds: number[] = [];
  private activity = 0;
  /** Bytes reserved for request bodies being buffered for a secret swap. */
  private bufferedBytes = 0;
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
  private readonly intercepted = new WeakMap<
    Socket,
    { host: string; port: number; protocol: EgressProtocol }
  >();

  constructor(
    private readonly gw: EgressGateway,
    private readonly o: AttachOptions,
  ) {
    const transparent = o.policy.transparent;
    const listen = (kind: 'tcp' | 'udp', address: string, port: number): number => {
      const fd = o.plumbing.listen(kind, address, port);
      this.listenFds.push(fd);
      return fd;
    };
    let dnsFullReported = false;
    this.dns = new FakeDns({
      allows: (name) => transparent && hostAllowedOnSomePort(o.policy, name),
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

  private get proxyHttp(): HttpServer {
    this.proxyHttpServer ??= this.httpServer((req, res) => this.guard(this.onProxyRequest(req, res), res)).on(
      'connect',
      (req: IncomingMessage, sock: Socket, head: Buffer) => this.guard(this.onConnect(req, sock, head), sock),
    );
    return this.proxyHttpServer;
  }

  private get mitmServer(): HttpServer {
    this.mitmServerLazy ??= this.httpServer((req, res) => this.guard(this.onMitmRequest(req, res), res));
    return this.mitmServerLazy;
  }

  private get transparentHttp(): HttpServer {
    this.transparentHttpLazy ??= this.httpServer((req, res) => {
      const t = this.transparentHttpTargets.get(req.socket);
      if (!t) return void sendText(res, 500, 'Airlock egress: lost the intercepted connection');
      this.guard(this.forwardPinned(t, req, res, false), res);
    }).on('upgrade', (req: IncomingMessage, sock: Socket, head: Buffer) =>
      this.guard(this.onPinnedUpgrade(req, sock, head), sock),
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

  /** Count an upstream socket against the sandbox until it closes (and close it with the sandbox). */
  private hold(sock: Socket): void {
    if (this.sockets.has(sock)) return;
    this.sockets.add(sock);
    sock.once('close', () => this.sockets.delete(sock));
    sock.on('error', () => {});
  }

  /** File descriptors this sandbox holds in the gateway (a relayed tunnel: RELAY_FDS). */
  private fds(): number {
    return this.sockets.size + RELAY_FDS * this.relayed.size;
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

  /** The event of an allowed connection that has ended. */
  private emitAllowed(
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

  private emit(e: Omit<EgressEvent, 'sandboxId' | 'time'>): void {
    try {
      this.o.onEvent({ sandboxId: this.o.sandboxId, time: new Date().toISOString(), ...e });
    } catch {
      /* an event consumer's bug never breaks a connection */
    }
  }

  private vet(host: string, port: number): Promise<VetResult> {
    return vetAndDial(
      { policy: this.o.policy, resolver: this.gw.resolver, dialer: this.gw.dialer },
      host,
      port,
    );
  }

  /** Report a refusal by vetAndDial (policy, SSRF guard, resolution or connect failure). */
  private denyEvent(
    protocol: EgressProtocol,
    r: Extract<VetResult, { ok: false }>,
    port: number,
    started: number,
  ): void {
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

  /** Report a refusal (the reason is the text the sandbox also receives). */
  private denied(
    protocol: EgressProtocol,
    host: string,
    port: number,
    reason: string,
    code: string,
    started: number,
    extra: Partial<Pick<EgressEvent, 'address' | 'alert' | 'bytesUp' | 'bytesDown'>> = {},
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

  /**
   * Relay client <-> upstream, then report one event with the byte counts. With no secrets and no
   * canaries nothing needs to see the bytes, so the fd relay's worker moves them; otherwise they
   * go through Node and what the sandbox sends is inspected.
   */
  private relayTunnel(
    protocol: EgressProtocol,
    client: Socket,
    r: Extract<VetResult, { ok: true }>,
    port: number,
    started: number,
    early?: Buffer,
  ): void {
    this.hold(r.socket);
    if (!this.o.secrets && this.gw.relay) {
      this.guard(this.fdRelay(this.gw.relay, protocol, client, r, port, started, early), client);
      return;
    }
    this.streamRelay(protocol, client, r, port, started, early);
  }

  private async fdRelay(
    relay: FdRelay,
    protocol: EgressProtocol,
    client: Socket,
    r: Extract<VetResult, { ok: true }>,
    port: number,
    started: number,
    early?: Buffer,
  ): Promise<void> {
    const up = r.socket;
    // What Node still has to write (the CONNECT / SOCKS reply) must reach the kernel first.
    await Promise.all([flushed(client), flushed(up)]);
    // A relayed tunnel holds RELAY_FDS instead of its two sockets: only if the sandbox's fd budget allows.
    const fits = this.fds() + RELAY_FDS - 2 <= MAX_SOCKETS_PER_SANDBOX;
    const tunnel =
      !this.closed && fits ? relay.take(client, up, { upPrefix: early, idleMs: IDLE_TIMEOUT_MS }) : undefined;
    if (!tunnel) return this.streamRelay(protocol, client, r, port, started, early);
    this.sockets.delete(client); // destroyed by take(); the tunnel counts for them now
    this.sockets.delete(up);
    this.relayed.add(tunnel);
    const res = await tunnel.done;
    this.relayed.delete(tunnel);
    this.emitAllowed(protocol, r.host, port, r.address, res, started);
  }

  /** The relay through Node streams (the only one when bytes must be inspected). */
  private streamRelay(
    protocol: EgressProtocol,
    client: Socket,
    r: Extract<VetResult, { ok: true }>,
    port: number,
    started: number,
    early?: Buffer,
  ): void {
    const up = r.socket;
    let bytesUp = 0;
    let bytesDown = 0;
    let blocked: { reason: string; alert: 'sentinel' | 'canary' } | undefined;
    // What the sandbox sends is checked (with an overlap across chunks) for sentinels of secrets not
    // bound to this host and for canaries before it is forwarded. Inside TLS this finds nothing,
    // by design: only plain protocols are visible here.
    const lease = this.o.secrets;
    const boundHere = new Set((lease?.secretsForHost(r.host) ?? []).map((x) => x.name));
    let tail = Buffer.alloc(0);
    const forward = (d: Buffer): void => {
      bytesUp += d.length;
      if (lease) {
        const window = Buffer.concat([tail, d]);
        const leaked = lease.findSentinels(window).filter((n) => !boundHere.has(n));
        const canaries = lease.findCanaries(window);
        if (leaked.length || canaries.length) {
          blocked = canaries.length
            ? {
                alert: 'canary',
                reason: `blocked by Airlock egress policy: a planted canary credential (${canaries.join(', ')}) was sent to ${r.host}`,
              }
            : {
                alert: 'sentinel',
                reason: `blocked by Airlock egress policy: the credential ${leaked.join(', ')} may only be sent to its bound host(s), not ${r.host}`,
              };
          done();
          return;
        }
        tail = window.subarray(Math.max(0, window.length - BODY_SCAN_OVERLAP_BYTES));
      }
      if (!up.write(d)) {
        client.pause();
        up.once('drain', () => client.resume());
      }
    };
    up.on('data', (d: Buffer) => (bytesDown += d.length));
    up.pipe(client);
    let reported = false;
    const done = (): void => {
      if (reported) return;
      reported = true;
      client.destroy();
      up.destroy();
      this.emit({
        protocol,
        host: r.host,
        port,
        address: r.address,
        decision: blocked ? 'deny' : 'allow',
        reason: blocked?.reason ?? ALLOWED_REASON,
        ...(blocked ? { code: blocked.alert, alert: blocked.alert } : {}),
        bytesUp,
        bytesDown,
        durationMs: Date.now() - started,
      });
    };
    if (early && early.length) forward(early);
    if (lease) {
      client.on('data', forward);
      client.on('end', () => up.end());
      client.resume();
    } else {
      // Nothing to look for: let streams move the bytes (with their own backpressure).
      client.on('data', (d: Buffer) => (bytesUp += d.length));
      client.pipe(up);
    }
    up.on('error', done);
    client.on('error', done);
    up.on('close', done);
    client.on('close', done);
    if (client.destroyed || up.destroyed) done(); // closed while the tunnel was being set up
  }

  // ---- proxy: SOCKS5 or HTTP -----------------------------------------------------------------------

  private onProxyConnection(sock: Socket, http: HttpServer): void {
    sock.once('data', (first: Buffer) => {
      if (first[0] === 0x05) {
        this.guard(this.onSocks(sock, first), sock);
        return;
      }
      sock.pause();
      sock.unshift(first);
      http.emit('connection', sock);
      sock.resume();
    });
  }

  private async onSocks(sock: Socket, first: Buffer): Promise<void> {
    const started = Date.now();
    let buf = first;
    const more = (): Promise<Buffer> =>
      new Promise((resolve, reject) => {
        const onData = (d: Buffer): void => {
          sock.off('close', onClose);
          resolve(d);
        };
        const onClose = (): void => {
          sock.off('data', onData);
          reject(new Error('closed'));
        };
        sock.once('data', onData);
        sock.once('close', onClose);
      });
    // The whole handshake must complete in time, however slowly bytes trickle in.
    const deadline = setTimeout(() => sock.destroy(), HEADERS_TIMEOUT_MS);
    try {
      let g = socks5Greeting(buf);
      while (g.kind === 'incomplete') g = socks5Greeting((buf = Buffer.concat([buf, await more()])));
      if (g.kind === 'invalid') return void sock.destroy();
      const method = selectSocks5Method(g.methods);
      sock.write(socks5MethodReply(method));
      if (method === METHOD_NO_ACCEPTABLE) return void sock.end();
      buf = buf.subarray(g.consumed);
      let r = socks5Request(buf);
      while (r.kind === 'incomplete') r = socks5Request((buf = Buffer.concat([buf, await more()])));
      if (r.kind === 'invalid') return void sock.end(socks5Reply(r.reply));
      clearTimeout(deadline);
      // Keep anything the client sends before our reply: paused until the tunnel pipes it.
      sock.pause();
      const res = await this.vet(r.host, r.port);
      if (!res.ok) {
        this.denyEvent('socks5', res, r.port, started);
        const unreachable = res.verdict.code === 'resolve_failed' || res.verdict.code === 'connect_failed';
        const code = unreachable ? HOST_UNREACHABLE : NOT_ALLOWED;
        return void sock.end(socks5Reply(code));
      }
      sock.write(socks5Reply(SUCCEEDED, { address: '0.0.0.0', port: 0 }));
      await this.tunnel('socks5', sock, res, r.port, started, buf.subarray(r.consumed));
    } catch {
      sock.destroy();
    } finally {
      clearTimeout(deadline);
    }
  }

  // ---- proxy: HTTP CONNECT ----------------------------------------------------------------------

  private async onConnect(req: IncomingMessage, sock: Socket, head: Buffer): Promise<void> {
    const started = Date.now();
    const target = parseAuthority(req.url ?? '');
    if (!target) {
      sock.end(forbidden('Airlock egress: CONNECT needs host:port'));
      return;
    }
    const res = await this.vet(target.host, target.port);
    if (!res.ok) {
      this.denyEvent('connect', res, target.port, started);
      sock.end(forbidden(res.verdict.reason));
      return;
    }
    sock.write('HTTP/1.1 200 Connection Established\r\n\r\n');
    await this.tunnel('connect', sock, res, target.port, started, head);
  }

  // ---- proxy: HTTP absolute-form ----------------------------------------------------------------

  private async onProxyRequest(req: IncomingMessage, res: ServerResponse): Promise<void> {
    if (req.httpVersionMajor !== 1) {
      return void sendText(res, 400, 'Airlock egress proxy: only HTTP/1.0 and HTTP/1.1 requests are proxied');
    }
    let url: URL;
    try {
      url = new URL(req.url ?? '');
    } catch {
      return void sendText(res, 400, 'Airlock egress proxy: send absolute-form requests (http://host/path)');
    }
    if (url.protocol !== 'http:') {
      return void sendText(res, 400, `Airlock egress proxy: ${url.protocol} URLs go through CONNECT`);
    }
    const port = url.port ? Number(url.port) : 80;
    const host = url.hostname.replace(/^\[|\]$/g, '');
    if (canonicalHost(host).kind !== 'invalid') {
      // The raw target must name the URL's host as Node's URL parser read it, without userinfo
      // (pin.ts). Host headers are ignored and replaced by forward(), as RFC 9112 §3.2.2 asks of a proxy.
      const pin = pinRequest(
        { url: req.url ?? '', rawHeaders: [] },
        { host: canonicalName(host), port, scheme: 'http' },
      );
      if (!pin.ok) {
        this.denied('http', canonicalName(host), port, pin.reason, 'mismatch', Date.now());
        return void sendText(res, 403, pin.reason);
      }
    }
    await this.forward('http', req, res, host, port, `${url.pathname}${url.search}`);
  }

  /** Forward one HTTP request to host:port over a vetted connection (plain, or TLS when `tls`). */
  private async forward(
    protocol: EgressProtocol,
    req: IncomingMessage,
    res: ServerResponse,
    host: string,
    port: number,
    path: string,
    tls = false,
  ): Promise<void> {
    const started = Date.now();
    const canon = canonicalHost(host);
    const hostKey = canon.kind === 'name' ? canon.name : canon.kind === 'ip' ? canon.address : host;
    // Host always names the host that was decided on and dialled: a request cannot be routed to
    // another virtual host (or a denied one) behind an allowed address.
    const defaultPort = tls ? 443 : 80;
    const hostHeader = `${canon.kind === 'ip' && canon.family === 6 ? `[${hostKey}]` : hostKey}${port === defaultPort ? '' : `:${port}`}`;
    const headers: Array<[string, string]> = [
      ['Host', hostHeader],
      ...rawHeaderPairs(req).filter(
        ([k]) => !/^(host|proxy-connection|proxy-authorization|keep-alive|connection)$/i.test(k),
      ),
    ];
    // Secrets: swap sentinels for this host's bound secrets; any other sentinel or a canary is exfiltration.
    // Real values go only into TLS connections, unless a secret opts into plain HTTP (insecureHttp).
    const transport = tls ? 'tls' : 'plain';
    let swapped: string[] = [];
    let outHeaders = headers;
    /** Everything a response must be scrubbed of (fixed now: a late revoke must not unscrub it). */
    let scrubValues: ScrubValue[] = [];
    const lease = this.o.secrets;
    if (lease) {
      const s = lease.swapHeaders(hostKey, headers, transport);
      // Real values go only into credential headers: a header the server might echo back (Origin,
      // Referer, X-Anything) keeps the sentinel, so a reflected value cannot reach the sandbox.
      outHeaders = headers.map((h, i) => (SWAP_HEADERS.test(h[0]) ? (s.headers[i] ?? h) : h));
      swapped = outHeaders.some(([k, v], i) => SWAP_HEADERS.test(k) && v !== headers[i]![1]) ? s.swapped : [];
      // A sentinel split across header values is still a sentinel.
      const joined = lease.findSentinels(headers.map(([, v]) => v).join(''));
      const inPath = [
        ...lease.findSentinels(path),
        ...joined.filter((n) => !lease.secretsForHost(hostKey).some((x) => x.name === n)),
      ];
      const unbound = [...new Set([...s.unbound, ...inPath])];
      const canaries = lease.findCanaries(`${path}\n${headers.map(([k, v]) => `${k}: ${v}`).join('\n')}`);
      if (unbound.length || canaries.length) {
        const alert = canaries.length ? 'canary' : 'sentinel';
        const reason = canaries.length
          ? `blocked by Airlock egress policy: the request carries a planted canary credential (${canaries.join(', ')}); this looks like credential exfiltration`
          : `blocked by Airlock egress policy: the credential ${unbound.join(', ')} may only be sent to its bound host(s), not ${hostKey}`;
        this.denied(protocol, hostKey, port, reason, alert, started, { alert });
        return void sendText(res, 403, reason);
      }
      if (s.cleartext.length) {
        const reason = cleartextReason(s.cleartext, hostKey);
        this.denied(protocol, hostKey, port, reason, 'cleartext_secret', started);
        return void sendText(res, 403, reason);
      }
      scrubValues = [...lease.scrubValuesFor(hostKey), ...s.inserted];
      if (swapped.length) outHeaders = identityRequest(outHeaders);
    }
    const vetted = await this.vet(host, port);
    if (!vetted.ok) {
      this.denyEvent(protocol, vetted, port, started);
      return void sendText(
        res,
        vetted.verdict.code === 'connect_failed' || vetted.verdict.code === 'resolve_failed' ? 502 : 403,
        vetted.verdict.reason,
      );
    }
    this.hold(vetted.socket);
    let socket: Socket = vetted.socket;
    if (tls) {
      try {
        socket = await this.upstreamTls(vetted.socket, hostKey);
      } catch (e) {
        vetted.socket.destroy();
        const reason = `Airlock egress: could not verify ${hostKey}'s TLS certificate: ${(e as Error).message}`;
        this.denied(protocol, hostKey, port, reason, 'upstream_tls', started, { address: vetted.address });
        return void sendText(res, 502, reason);
      }
    }
    // The upstream connection lives exactly as long as this request.
    res.on('close', () => socket.destroy());
    socket.setTimeout(IDLE_TIMEOUT_MS, () => socket.destroy());
    if (!lease && !tls) {
      // Nothing to inspect in the response: its body skips Node's HTTP machinery (plain-http.ts).
      return forwardPlain({
        req,
        res,
        upstream: socket,
        method: req.method ?? 'GET',
        path,
        headers: outHeaders,
        hostKey,
        idleMs: IDLE_TIMEOUT_MS,
        relay: () => {
          const relay = this.gw.relay;
          return relay && !this.closed && this.fds() + RELAY_FDS <= MAX_SOCKETS_PER_SANDBOX
            ? relay
            : undefined;
        },
        track: (t) => {
          this.relayed.add(t);
          return () => this.relayed.delete(t);
        },
        fail: sendText,
        report: (bytesUp, bytesDown) =>
          this.emitAllowed(protocol, hostKey, port, vetted.address, { bytesUp, bytesDown }, started),
      });
    }
    let bytesUp = 0;
    let bytesDown = 0;
    // Secrets configured with `body: true` are swapped in the body too: buffered (bounded) for that.
    const bodySecrets = lease
      ? lease.secretsForHost(hostKey, transport).filter((x) => this.o.bodySwap?.has(x.name))
      : [];
    // Body secrets bound here that may not go over this transport: their sentinels are looked for too.
    const bodyBound = lease ? lease.namesBoundTo(hostKey).filter((n) => this.o.bodySwap?.has(n)) : [];
    let body: Buffer | undefined;
    if (
      bodyBound.length &&
      (req.headers['content-length'] !== undefined || req.headers['transfer-encoding'] !== undefined)
    ) {
      if (this.bufferedBytes + MAX_SWAPPED_BODY_BYTES > MAX_BUFFERED_BYTES_PER_SANDBOX) {
        socket.destroy();
        return void sendText(
          res,
          503,
          'Airlock egress: too many request bodies with secrets in flight; retry',
        );
      }
      this.bufferedBytes += MAX_SWAPPED_BODY_BYTES;
      try {
        body = await readBounded(req, MAX_SWAPPED_BODY_BYTES);
      } finally {
        this.bufferedBytes -= MAX_SWAPPED_BODY_BYTES;
      }
      if (body === undefined) {
        socket.destroy();
        const reason = `Airlock egress: request bodies carrying secrets are limited to ${MAX_SWAPPED_BODY_BYTES} bytes`;
        this.denied(protocol, hostKey, port, reason, 'body_too_large', started);
        return void sendText(res, 413, reason);
      }
      bytesUp = body.length;
      const present = lease!.findSentinels(body);
      const usable = new Set(bodySecrets.map((x) => x.name));
      const cleartext = present.filter((n) => bodyBound.includes(n) && !usable.has(n));
      const unbound = present.filter((n) => !usable.has(n) && !cleartext.includes(n));
      const canaries = lease!.findCanaries(body);
      if (unbound.length || canaries.length || cleartext.length) {
        socket.destroy();
        const alert = canaries.length ? 'canary' : unbound.length ? 'sentinel' : undefined;
        const reason = alert
          ? `blocked by Airlock egress policy: the request body carries ${canaries.length ? `a planted canary credential (${canaries.join(', ')})` : `the credential ${unbound.join(', ')}, which may only be sent to its bound host(s)`}`
          : cleartextReason(cleartext, hostKey);
        this.denied(protocol, hostKey, port, reason, alert ?? 'cleartext_secret', started, {
          address: vetted.address,
          ...(alert ? { alert } : {}),
        });
        return void sendText(res, 403, reason);
      }
      for (const x of bodySecrets) body = replaceAll(body, Buffer.from(x.sentinel), Buffer.from(x.value));
      if (bodySecrets.some((x) => present.includes(x.name))) outHeaders = identityRequest(outHeaders);
      outHeaders = [
        ...outHeaders.filter(([k]) => !/^(content-length|transfer-encoding)$/i.test(k)),
        ['content-length', String(body.length)],
      ];
    }
    let blocked = false; // set when a streamed body turns out to carry a credential
    const upstream = httpRequest({
      createConnection: () => socket,
      method: req.method,
      path,
      headers: [...outHeaders.flat(), 'connection', 'close'] as unknown as Record<string, string>,
      setHost: false,
    });
    upstream.on('response', (up) => {
      const status = up.statusCode ?? 0;
      if (status < 100 || status > 599) {
        upstream.destroy();
        return void sendText(
          res,
          502,
          `Airlock egress: ${hostKey} answered with an invalid status ${status}`,
        );
      }
      // Whatever the upstream reflects, the sandbox never reads a real value back (secrets/scrub.ts):
      // not in the status line, a header (name or value) or the body, decoded first if compressed.
      const scrubber = new Scrubber(scrubValues);
      const scrubbing = !scrubber.empty;
      const hasBody = req.method !== 'HEAD' && status !== 204 && status !== 304 && status >= 200;
      const decoding =
        scrubbing && hasBody
          ? responseBodyDecoding(up.headers['content-encoding'], up.headers['transfer-encoding'])
          : { ok: true as const, decoders: [] };
      if (!decoding.ok) {
        blocked = true;
        upstream.destroy();
        const reason = `Airlock egress: ${hostKey} answered with the coding "${decoding.coding}", which Airlock cannot decode to remove credentials from it; the response was refused (Airlock asks for identity, gzip, deflate or br)`;
        this.denied(protocol, hostKey, port, reason, 'content_encoding', started, {
          address: vetted.address,
          bytesUp,
        });
        return void sendText(res, 502, reason);
      }
      const decoded = decoding.decoders.length > 0;
      try {
        res.writeHead(
          status,
          scrubber.scrubText(up.statusMessage ?? ''),
          rawHeaderPairs(up)
            // A scrubbed body may change length: let Node frame it (chunked) instead.
            .filter(([k]) => !scrubbing || !/^(content-length|transfer-encoding)$/i.test(k))
            // The body is passed on decoded.
            .filter(([k]) => !decoded || !/^content-encoding$/i.test(k))
            // Hop-by-hop: each upstream connection serves one request; the client's may live on.
            .filter(([k]) => !/^(connection|keep-alive|proxy-connection)$/i.test(k))
            .map(([k, v]) => [scrubber.scrubText(k), scrubber.scrubText(v)])
            .flat() as unknown as Record<string, string>,
        );
      } catch (e) {
        upstream.destroy();
        return void sendText(
          res,
          502,
          `Airlock egress: ${hostKey} sent an invalid response head: ${(e as Error).message}`,
        );
      }
      up.on('data', (d: Buffer) => (bytesDown += d.length));
      if (!scrubbing) return void up.pipe(res);
      // Streamed scrub: the scrubber holds back a tail that could still start a match.
      let body: NodeJS.ReadableStream = up;
      for (const d of decoding.decoders) {
        d.on('error', () => {
          upstream.destroy();
          res.destroy(); // a body that does not decode is cut, never passed on unread
        });
        body = body.pipe(d);
      }
      const stream = scrubber.stream();
      body.on('data', (d: Buffer) => {
        if (!res.write(stream.push(d))) {
          body.pause();
          res.once('drain', () => body.resume());
        }
      });
      body.on('end', () => res.end(stream.end()));
    });
    const finish = (): void => {
      if (blocked) return; // the deny was reported when the body was cut
      this.emitAllowed(
        protocol,
        hostKey,
        port,
        vetted.address,
        { bytesUp, bytesDown },
        started,
        swapped.length ? { secretsSwapped: swapped } : {},
      );
    };
    res.on('close', finish);
    upstream.on('error', (e) => {
      if (blocked) return; // we cut it on purpose and answered 403
      if (!res.headersSent) sendText(res, 502, `Airlock egress: upstream ${hostKey} failed: ${e.message}`);
      else res.destroy();
    });
    if (body) {
      upstream.end(body);
      return;
    }
    // Streamed body: forwarded chunk by chunk, each checked (with an overlap) for sentinels of
    // secrets not bound to this host and for canaries before it leaves.
    let tail = Buffer.alloc(0);
    const boundHere = new Set((lease?.secretsForHost(hostKey) ?? []).map((x) => x.name));
    req.on('data', (d: Buffer) => {
      if (blocked) return; // drained, never forwarded
      bytesUp += d.length;
      if (lease) {
        const window = Buffer.concat([tail, d]);
        const leaked = lease.findSentinels(window).filter((n) => !boundHere.has(n));
        const canaries = lease.findCanaries(window);
        if (leaked.length || canaries.length) {
          blocked = true;
          upstream.destroy();
          const alert = canaries.length ? 'canary' : 'sentinel';
          const reason = `blocked by Airlock egress policy: the request body carries ${canaries.length ? `a planted canary credential (${canaries.join(', ')})` : `the credential ${leaked.join(', ')}, which may only be sent to its bound host(s)`}`;
          this.denied(protocol, hostKey, port, reason, alert, started, {
            address: vetted.address,
            alert,
            bytesUp,
            bytesDown,
          });
          sendText(res, 403, reason);
          return;
        }
        tail = window.subarray(Math.max(0, window.length - BODY_SCAN_OVERLAP_BYTES));
      }
      if (!upstream.write(d)) {
        req.pause();
        upstream.once('drain', () => req.resume());
      }
    });
    req.on('end', () => {
      if (!blocked) upstream.end();
    });
  }

  // ---- TLS interception for hosts with a bound secret -----------------------------------------

  /**
   * Terminate the client's TLS with a leaf cert for res.host. Each request inside is then forwarded
   * over its own freshly vetted, certificate-verified TLS connection to the real host.
   */
  private intercept(
    protocol: EgressProtocol,
    client: Socket,
    res: Extract<VetResult, { ok: true }>,
    port: number,
    head?: Buffer,
  ): void {
    res.socket.destroy(); // the decision is made; requests dial their own upstream
    if (head && head.length) client.unshift(head);
    const ca = this.gw.opts.ca();
    const tlsClient = new TLSSocket(client, { isServer: true, secureContext: ca.secureContextFor(res.host) });
    tlsClient.on('error', () => client.destroy());
    tlsClient.on('secure', () => {
      // The name the client asked for inside the tunnel must be the one that was decided on.
      const sni = tlsClient.servername;
      if (typeof sni === 'string' && sni.toLowerCase() !== res.host) tlsClient.destroy();
    });
    this.intercepted.set(tlsClient, { host: res.host, port, protocol });
    this.mitmServer.emit('connection', tlsClient);
  }

  private async onMitmRequest(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const meta = this.intercepted.get(req.socket);
    if (!meta) return void sendText(res, 500, 'Airlock egress: lost the intercepted connection');
    await this.forwardPinned(meta, req, res, true);
  }

  /** TLS to the real host, its certificate verified against the system store (or upstreamCa). */
  private upstreamTls(raw: Socket, host: string): Promise<Socket> {
    return new Promise((resolve, reject) => {
      const t = tlsConnect({
        socket: raw,
        servername: host,
        ...(this.gw.opts.upstreamCa ? { ca: [...this.gw.opts.upstreamCa] } : {}),
      });
      t.once('secureConnect', () => {
        t.removeListener('error', reject);
        this.hold(t);
        resolve(t);
      });
      t.once('error', reject);
    });
  }

  /** Run an async handler; any failure closes its connection instead of reaching the process. */
  private guard(p: Promise<void>, conn: Socket | ServerResponse): void {
    p.catch((e: unknown) => {
      this.gw.opts.logger.warn({ err: (e as Error)?.message }, 'egress handler failed');
      if ('headersSent' in conn && !conn.headersSent) sendText(conn, 502, 'Airlock egress: internal error');
      else conn.destroy();
    });
  }

  // ---- decided connections: what they carry, and every request pinned (pin.ts, sniff.ts) ---------

  /**
   * A vetted tunnel (CONNECT, SOCKS5, or a transparent connection decided by its address): what the
   * client sends first decides its path. Plain HTTP goes to the HTTP path with every request pinned to
   * r.host:port (never a raw relay); TLS must ask for r.host by SNI; anything else is relayed.
   */
  private async tunnel(
    protocol: EgressProtocol,
    client: Socket,
    r: Extract<VetResult, { ok: true }>,
    port: number,
    started: number,
    early?: Buffer,
  ): Promise<void> {
    // The upstream is open while the first bytes are awaited: it counts against the sandbox's fds
    // (and Airlock's fd budget) from now on, not only once the tunnel is relayed.
    this.hold(r.socket);
    const s = await sniffTunnel(client, r.socket, early ?? Buffer.alloc(0), HEADERS_TIMEOUT_MS);
    if (s.from === 'none') {
      r.socket.destroy();
      client.destroy();
      return this.emitAllowed(protocol, r.host, port, r.address, { bytesUp: 0, bytesDown: 0 }, started);
    }
    if (s.from === 'client' && s.kind === 'http') {
      r.socket.destroy(); // each request dials its own vetted connection
      const http = protocol === 'transparent-tcp' ? 'transparent-http' : protocol;
      return this.httpOver(client, s.bytes, { host: r.host, port, protocol: http });
    }
    if (s.from === 'client' && s.kind === 'tls') {
      const why = sniProblem(s.hello, r.host);
      if (why) {
        r.socket.destroy();
        client.destroy();
        return this.denied(protocol, r.host, port, why, 'mismatch', started, { address: r.address });
      }
    }
    const early2 = s.from === 'client' ? s.bytes : undefined;
    if (this.o.secrets?.boundHosts().has(r.host)) return this.intercept(protocol, client, r, port, early2);
    this.relayTunnel(protocol, client, r, port, started, early2);
  }

  /** Hand a connection carrying plain HTTP (its first `bytes` already read) to the pinned HTTP path. */
  private httpOver(sock: Socket, bytes: Buffer, t: PinnedConnection): void {
    sock.unshift(bytes);
    this.transparentHttpTargets.set(sock, t);
    this.transparentHttp.emit('connection', sock);
    sock.resume();
  }

  /**
   * One request on a decided connection: its target and Host must name the connection's host:port
   * (absolute-form is rewritten to origin-form), or it is refused before anything is dialled.
   */
  private async forwardPinned(
    t: PinnedConnection,
    req: IncomingMessage,
    res: ServerResponse,
    tls: boolean,
  ): Promise<void> {
    // Transparent HTTP to a literal address: the first request's Host names the host (else the address).
    t.host ??= firstHost(req) ?? t.fallback!;
    const pin = pinRequest(
      { url: req.url ?? '/', rawHeaders: req.rawHeaders },
      { host: t.host, port: t.port, scheme: tls ? 'https' : 'http' },
    );
    if (!pin.ok) {
      this.denied(t.protocol, t.host, t.port, pin.reason, 'mismatch', Date.now());
      return void sendText(res, 403, pin.reason);
    }
    await this.forward(t.protocol, req, res, t.host, t.port, pin.path, tls);
  }

  /**
   * An Upgrade request (ws://) on a decided plain-HTTP connection: pinned like any request, then sent
   * on its own vetted connection; only a 101 answer turns the connection into a relayed tunnel (any
   * other answer is passed on and both connections close, so no later request goes unvetted). A
   * sandbox with secrets or canaries is refused: nothing would inspect the upgraded stream's head.
   */
  private async onPinnedUpgrade(req: IncomingMessage, sock: Socket, head: Buffer): Promise<void> {
    const started = Date.now();
    const t = this.transparentHttpTargets.get(sock);
    if (!t) return void sock.destroy();
    const host = (t.host ??= firstHost(req) ?? t.fallback!);
    const pin = pinRequest(
      { url: req.url ?? '/', rawHeaders: req.rawHeaders },
      { host: host, port: t.port, scheme: 'http' },
    );
    if (!pin.ok) {
      this.denied(t.protocol, host, t.port, pin.reason, 'mismatch', started);
      return void sock.end(forbidden(pin.reason));
    }
    if (this.o.secrets) {
      const reason =
        'Airlock egress: protocol upgrades (ws://) over plain HTTP are not relayed for a sandbox with secrets; use TLS (wss://)';
      this.denied(t.protocol, host, t.port, reason, 'upgrade', started);
      return void sock.end(forbidden(reason));
    }
    const vetted = await this.vet(host, t.port);
    if (!vetted.ok) {
      this.denyEvent(t.protocol, vetted, t.port, started);
      return void sock.end(forbidden(vetted.verdict.reason));
    }
    const up = vetted.socket;
    this.hold(up);
    const c = canonicalHost(host);
    const hostHeader = `${c.kind === 'ip' && c.family === 6 ? `[${host}]` : host}${t.port === 80 ? '' : `:${t.port}`}`;
    const lines = [`${req.method ?? 'GET'} ${pin.path} HTTP/1.1`, `Host: ${hostHeader}`];
    for (const [k, v] of rawHeaderPairs(req))
      if (!/^(host|proxy-connection|proxy-authorization)$/i.test(k)) lines.push(`${k}: ${v}`);
    up.write(`${lines.join('\r\n')}\r\n\r\n`, 'latin1');
    if (head.length) up.write(head);
    // The answer's head decides: 101 → a tunnel; anything else → passed on, then both close.
    let buf = Buffer.alloc(0);
    let decided = false;
    const onData = (d: Buffer): void => {
      buf = Buffer.concat([buf, d]);
      const h = parseResponseHead(buf, req.method ?? 'GET');
      if (h.kind === 'incomplete') return;
      decided = true;
      up.off('data', onData);
      up.pause();
      if (h.kind === 'response' && h.status === 101) {
        sock.write(buf);
        return this.relayTunnel(t.protocol, sock, vetted, t.port, started);
      }
      sock.write(buf);
      up.pipe(sock);
      up.once('close', () => sock.destroy());
      sock.once('close', () => up.destroy());
      this.emitAllowed(
        t.protocol,
        host,
        t.port,
        vetted.address,
        { bytesUp: 0, bytesDown: buf.length },
        started,
      );
    };
    up.on('data', onData);
    up.once('close', () => decided || sock.destroy());
  }

  // ---- transparent interception ----------------------------------------------------------------

  private async onTransparent(sock: Socket): Promise<void> {
    const started = Date.now();
    const fd = (sock as unknown as { _handle?: { fd?: number } })._handle?.fd;
    const dst = fd === undefined ? undefined : this.o.plumbing.originalDestination(fd);
    if (!dst) return void sock.destroy();
    const synthetic = this.dns.nameFor(dst.address);
    const first = await firstBytes(sock, FIRST_BYTES_TIMEOUT_MS);
    if (first.length === 0) {
      // The client waits for the server (or is slow): decided by the address's name; what the client
      // sends later is still looked at (tunnel()), so waiting cannot buy a raw relay for HTTP.
      const res = await this.vet(synthetic ?? dst.address, dst.port);
      if (!res.ok) {
        this.denyEvent('transparent-tcp', res, dst.port, started);
        return void sock.destroy();
      }
      return this.tunnel('transparent-tcp', sock, res, dst.port, started);
    }
    const s = await sniffTunnel(sock, undefined, first, HEADERS_TIMEOUT_MS);
    if (s.from !== 'client') return void sock.destroy();
    if (s.kind === 'http') {
      // Every request on the connection is vetted, pinned to the decided host and checked for
      // sentinels (forwardPinned): the DNS name of its address, else the first request's Host.
      return this.httpOver(
        sock,
        s.bytes,
        synthetic
          ? { host: synthetic, port: dst.port, protocol: 'transparent-http' }
          : { fallback: dst.address, port: dst.port, protocol: 'transparent-http' },
      );
    }
    const protocol: EgressProtocol = s.kind === 'tls' ? 'transparent-tls' : 'transparent-tcp';
    const named = s.kind === 'tls' && s.hello.kind === 'tls' ? s.hello.serverName : undefined;
    // The name a connection means: the DNS name its synthetic address was handed out for, else what
    // the client says (SNI), else the literal address. A mismatch is refused (no fronting).
    const host = synthetic ?? named ?? dst.address;
    if (synthetic && named && canonicalName(named) !== canonicalName(synthetic)) {
      const reason = `blocked by Airlock egress policy: connection to ${synthetic} names ${named}; the name must match the address it was resolved for`;
      this.denied(protocol, synthetic, dst.port, reason, 'mismatch', started);
      return void denyTransparent(sock, protocol, reason);
    }
    const res = await this.vet(host, dst.port);
    if (!res.ok) {
      this.denyEvent(protocol, res, dst.port, started);
      return void denyTransparent(sock, protocol, res.verdict.reason);
    }
    if (s.kind === 'tls') {
      const why = sniProblem(s.hello, res.host);
      if (why) {
        res.socket.destroy();
        this.denied(protocol, res.host, dst.port, why, 'mismatch', started, { address: res.address });
        return void sock.destroy();
      }
      if (this.o.secrets?.boundHosts().has(res.host))
        return this.intercept('transparent-tls', sock, res, dst.port, s.bytes);
    }
    this.relayTunnel(protocol, sock, res, dst.port, started, s.bytes);
  }
}

/** A connection decided for one host:port: every HTTP request on it must name that host (pin.ts). */
interface PinnedConnection {
  /** Canonical; undefined until the first request names it (transparent HTTP to a literal address). */
  host?: string;
  /** The host when that first request names none (HTTP/1.0 without Host): the address dialled. */
  readonly fallback?: string;
  readonly port: number;
  readonly protocol: EgressProtocol;
}

/**
 * Why a TLS tunnel decided for `host` must not go on, or undefined: its ClientHello must be readable
 * and name `host` (or no name at all), so a shared TLS front end cannot route it to another virtual host.
 */
function sniProblem(hello: ClientHelloResult, host: string): string | undefined {
  const base = 'blocked by Airlock egress policy: ';
  if (hello.kind !== 'tls')
    return `${base}the TLS ClientHello to ${host} could not be read (${hello.kind === 'invalid' ? hello.reason : hello.kind})`;
  if (hello.ech)
    return `${base}the client offered Encrypted Client Hello to ${host}, which hides the name it asks for; turn ECH off`;
  if (hello.serverName !== undefined && !sameHost(hello.serverName, host))
    return `${base}the tunnel to ${host} asks for ${hello.serverName} by TLS SNI; the name must match the tunnel's host`;
  return undefined;
}

/** The host of a request's Host header (canonical), when there is exactly one and it is host[:port]. */
function firstHost(req: IncomingMessage): string | undefined {
  const values: string[] = [];
  for (let i = 0; i + 1 < req.rawHeaders.length; i += 2)
    if (req.rawHeaders[i]!.toLowerCase() === 'host') values.push(req.rawHeaders[i + 1]!);
  const a = values.length === 1 ? parseHostHeader(values[0]!.trim()) : undefined;
  return a ? canonicalName(a.host) : undefined;
}

// ---- helpers ------------------------------------------------------------------------------------

/** Whether some port of `name` is allowed (the DNS responder only answers names the policy allows). */
function hostAllowedOnSomePort(policy: NetworkPolicy, name: string): boolean {
  for (const port of [443, 80]) if (decideHost(policy, name, port).action === 'allow') return true;
  // A name allowed on another explicit port (host:port entries).
  return policy.allow.some((entry) => {
    const m = /:(\d+)$/.exec(entry);
    return m ? decideHost(policy, name, Number(m[1])).action === 'allow' : false;
  });
}

function canonicalName(n: string): string {
  const c = canonicalHost(n);
  return c.kind === 'name' ? c.name : c.kind === 'ip' ? c.address : n.toLowerCase();
}

function parseAuthority(a: string): { host: string; port: number } | undefined {
  const m = /^\[([0-9a-fA-F:.]+)\]:(\d{1,5})$/.exec(a) ?? /^([^:[\]]+):(\d{1,5})$/.exec(a);
  if (!m) return undefined;
  const port = Number(m[2]);
  return port >= 1 && port <= 65535 ? { host: m[1]!, port } : undefined;
}

async function readBounded(req: IncomingMessage, max: number): Promise<Buffer | undefined> {
  const parts: Buffer[] = [];
  let n = 0;
  for await (const chunk of req as AsyncIterable<Buffer>) {
    n += chunk.length;
    if (n > max) return undefined;
    parts.push(chunk);
  }
  return Buffer.concat(parts);
}

function replaceAll(buf: Buffer, from: Buffer, to: Buffer): Buffer {
  const out: Buffer[] = [];
  let i = 0;
  for (let j = buf.indexOf(from, i); j !== -1; j = buf.indexOf(from, i)) {
    out.push(buf.subarray(i, j), to);
    i = j + from.length;
  }
  out.push(buf.subarray(i));
  return Buffer.concat(out);
}

function rawHeaderPairs(m: IncomingMessage): Array<[string, string]> {
  const out: Array<[string, string]> = [];
  for (let i = 0; i + 1 < m.rawHeaders.length; i += 2) out.push([m.rawHeaders[i]!, m.rawHeaders[i + 1]!]);
  return out;
}

/** Why a plain-HTTP request carrying a TLS-only secret's sentinel is refused. */
function cleartextReason(names: readonly string[], host: string): string {
  return `blocked by Airlock egress policy: the credential ${names.join(', ')} is sent to ${host} only over TLS, and this request is plain HTTP; use https://${host}/, or set insecureHttp: true on the secret to allow cleartext`;
}

/**
 * A request carrying a swapped credential asks for an unencoded, whole response, so that what the
 * upstream reflects can be scrubbed: Accept-Encoding identity, no TE, no Range (a range could cut a
 * reflected value in two responses).
 */
function identityRequest(headers: ReadonlyArray<[string, string]>): Array<[string, string]> {
  return [
    ...headers.filter(([k]) => !/^(accept-encoding|te|range|if-range)$/i.test(k)),
    ['Accept-Encoding', 'identity'],
  ];
}

function forbidden(reason: string): string {
  const body = `${reason}\n`;
  return `HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`;
}

function sendText(res: ServerResponse, status: number, text: string): void {
  if (res.headersSent) return void res.destroy();
  const body = `${text}\n`;
  res.writeHead(status, {
    'content-type': 'text/plain; charset=utf-8',
    'content-length': Buffer.byteLength(body),
    connection: 'close',
  });
  res.end(body);
}

/** Denials on intercepted connections: HTTP gets a 403 with the reason; others are closed. */
function denyTransparent(sock: Socket, protocol: EgressProtocol, reason: string): void {
  if (protocol === 'transparent-http') sock.end(forbidden(reason));
  else sock.destroy();
}

/** The bytes a client sends first, or nothing if it waits for the server (SSH, SMTP, ...). */
function firstBytes(sock: Socket, timeoutMs: number): Promise<Buffer> {
  return new Promise((resolve) => {
    const t = setTimeout(() => {
      sock.removeListener('data', onData);
      sock.pause();
      resolve(Buffer.alloc(0));
    }, timeoutMs);
    const onData = (d: Buffer): void => {
      clearTimeout(t);
      sock.pause();
      resolve(d);
    };
    sock.once('data', onData);
  });
}
