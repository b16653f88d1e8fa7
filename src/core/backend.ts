// The Backend contract, versioned (STYLE.md habit 1). Each isolation tier implements it in its own
// folder under src/backends/<tier>/. The Sandbox facade (src/sandbox/) is the only caller; it owns
// output shaping, timeouts, TTL and result classification, so a backend only runs processes.
import type { Duplex, Readable, Writable } from 'node:stream';
import type { BackendExecution, BackendRunCodeRequest } from './code.js';
import type { SnapshotRecord } from './snapshot.js';
import type { BackendName, SandboxSpec } from './spec.js';

/** Where library code reports what it did (injected; the library never writes to the console). */
export interface Logger {
  debug(obj: object, msg?: string): void;
  info(obj: object, msg?: string): void;
  warn(obj: object, msg?: string): void;
  error(obj: object, msg?: string): void;
}

export const silentLogger: Logger = { debug() {}, info() {}, warn() {}, error() {} };

export interface BackendContext {
  /** Root of Airlock's host-side state (sandbox dirs, uid leases, spills). Root-owned. */
  readonly stateDir: string;
  readonly logger: Logger;
}

export interface ProbeCheck {
  readonly name: string;
  readonly ok: boolean;
  readonly detail: string;
  /** A feature some specs need (e.g. transparent egress); its absence does not make the tier unavailable. */
  readonly optional?: boolean;
}

/** Whether a backend can run on this host, and why not. */
export interface BackendProbe {
  readonly available: boolean;
  /** When unavailable: one line saying why and what to do. */
  readonly reason?: string;
  readonly checks: readonly ProbeCheck[];
}

export interface SpawnRequest {
  readonly argv: readonly string[];
  /** The complete environment of the process (the facade has already merged spec.env and exec env). */
  readonly env: Readonly<Record<string, string>>;
  readonly cwd: string;
  /** Whether the caller will write to stdin; otherwise stdin is /dev/null. */
  readonly stdin: boolean;
}

export interface ProcessExit {
  readonly exitCode: number | null;
  readonly signal: NodeJS.Signals | null;
}

/** One process a backend started inside a sandbox. */
export interface BackendProcess {
  readonly stdout: Readable;
  readonly stderr: Readable;
  readonly stdin: Writable | null;
  /** Resolves once the process and every descendant of it are gone. Never rejects. */
  readonly exited: Promise<ProcessExit>;
  /** SIGKILL the whole process tree of this exec. Idempotent. */
  kill(): void;
  /**
   * The sandbox's limit counters read with this process, where it runs (optional: the microVM
   * tier's guest agent reads them in the guest, so an exec costs no round trips of its own):
   * `atStart` before the process started; `atExit` once it and every descendant are gone (settles
   * with `exited`; `atStart` again when no reading came, e.g. the sandbox died). Required of every
   * process of a sandbox that sets BackendSandbox.countsWithProcesses.
   */
  readonly counters?: { readonly atStart: LimitCounters; readonly atExit: Promise<LimitCounters> };
}

/** Counters the kernel keeps for the sandbox's limits; deltas classify why a process died. */
export interface LimitCounters {
  readonly oomKills: number;
  readonly pidsLimitHits: number;
}

/** A backend's handle on one sandbox: exec, files, limits, kill. */
export interface BackendSandbox {
  readonly id: string;
  /** Host uid the sandbox's processes run as (never 0). */
  readonly hostUid: number;
  spawn(req: SpawnRequest): Promise<BackendProcess>;
  /**
   * The limit counters now. The reading is taken when this is called (synchronously, or by requests
   * sent in order ahead of anything called later): a spawn() called after it, before its promise
   * settles, starts after the reading, so the facade need not wait for it before spawning.
   */
  counters(): Promise<LimitCounters>;
  /**
   * Every process spawn() gives carries its counters (BackendProcess.counters): the facade takes
   * them from there and does not call counters() around an exec.
   */
  readonly countsWithProcesses?: boolean;
  /**
   * spawn() checks an argv's command itself as the facade's shell check does (sandbox/exec-check.ts:
   * one line on stderr naming it; 127 not found, 126 found but not runnable), so the facade starts
   * it directly instead of behind /bin/sh.
   */
  readonly checksCommands?: boolean;
  /** The sandbox's only way out, if the backend supports egress (see src/egress/). */
  readonly egress?: EgressPlumbing;
  /**
   * Capture the sandbox's filesystem state (its workspace and home changes) as a new immutable layer,
   * with its processes paused while copying. Optional: a backend without it cannot snapshot.
   */
  snapshot?(signal?: AbortSignal): Promise<SnapshotRecord>;
  /** Freeze every process of the sandbox (nothing runs until resume). Optional. Idempotent. */
  pause?(): Promise<void>;
  /** Thaw what pause() froze. Idempotent. */
  resume?(): Promise<void>;
  /**
   * A TCP connection to 127.0.0.1:`port` on the sandbox's own loopback (preview URLs), never to
   * anything outside its network namespace. Closed by destroy(). Optional: a backend without it
   * cannot reach its sandboxes' ports.
   */
  connectPort?(port: number, signal?: AbortSignal): Promise<Duplex>;
  /**
   * Run code in the backend's own interpreters (the WASM tier). Optional: without it, the sandbox
   * layer runs a kernel process inside the sandbox through spawn().
   */
  runCode?(req: BackendRunCodeRequest): Promise<BackendExecution>;
  /** Drop a code context runCode created (its variables are gone). Idempotent. */
  closeCodeContext?(contextId: string): Promise<void>;
  /** Kill everything, release every host resource (mounts, cgroups, uid, dirs). Idempotent. */
  destroy(): Promise<void>;
}

/**
 * A backend's stored snapshots (layers). Sandboxes start from one through `SandboxSpec.layers`.
 * Ids are the layers' content digests.
 */
export interface SnapshotStoreV1 {
  list(): Promise<SnapshotRecord[]>;
  /** undefined when there is no such snapshot. */
  get(digest: string): Promise<SnapshotRecord | undefined>;
  /** Ids of live sandboxes (of any process on this state dir) that run on the snapshot's layer. */
  users(digest: string): Promise<string[]>;
  /**
   * Delete the layer and free its disk. SNAPSHOT_IN_USE while a live sandbox runs on it or another
   * snapshot is built on it; SNAPSHOT_NOT_FOUND when it does not exist.
   */
  remove(digest: string): Promise<void>;
}

/**
 * What a backend offers the egress gateway: sockets that live in the sandbox's network namespace but
 * belong to Airlock (sandboxed code can connect to them, never kill or replace them), and a switch
 * that sends every outbound TCP connection of the sandbox to one of them.
 */
export interface EgressPlumbing {
  /** A socket bound to address:port inside the sandbox (TCP: listening). Returns its fd. */
  listen(kind: 'tcp' | 'udp', address: string, port: number): number;
  /** Route the sandbox's outbound TCP to `address:port` (transparent interception). */
  interceptTcp(address: string, port: number): void;
  /** Show these host files read-only at these sandbox paths in every later exec (CA bundle). */
  bindReadOnlyFiles(files: ReadonlyArray<readonly [host: string, sandbox: string]>): void;
  /** The original destination of an intercepted connection (by the accepted socket's fd). */
  originalDestination(fd: number): { address: string; port: number } | undefined;
  /**
   * Whether any of these sockets (made by `listen`) has a connection or datagram not yet picked up.
   * Optional: without it, callers assume there may be one.
   */
  waiting?(fds: readonly number[]): boolean;
}

/**
 * What the next creates will need, so a backend can make it ahead in its warm slots (it then only
 * applies the spec at create). A hint, never a limit: a create that asks for something else still
 * gets exactly what it asks for, only without the head start. Without a plan given, a backend
 * learns one from each create.
 */
export interface PreparePlan {
  /** Their egress: none, the proxy and DNS listeners, or those plus transparent interception. */
  readonly network: 'none' | 'proxy' | 'transparent';
  /** Whether some of them start on a snapshot (user namespaces that idmap its layers, made ahead). */
  readonly snapshotForks: boolean;
  /**
   * Their workspace over a host dir: mounted ahead in that mode (its owner's idmapping only, when
   * they start on a snapshot, whose layers join the overlay at create).
   */
  readonly workspace?: {
    readonly hostDir: string;
    readonly mode: 'ro' | 'cow';
    readonly onSnapshot?: boolean;
  };
}

export interface ReapReport {
  readonly sandboxes: number;
}

/** The versioned contract every isolation tier implements (one folder per tier under backends/). */
export interface BackendV1 {
  readonly specificationVersion: 'v1';
  readonly name: BackendName;
  probe(): Promise<BackendProbe>;
  /** Make a sandbox; the backend names it (ids are unique per host). */
  create(spec: SandboxSpec, signal?: AbortSignal): Promise<BackendSandbox>;
  /** Release what the backend holds beyond live sandboxes (e.g. prepared warm slots). */
  close(): Promise<void>;
  /** Prepare warm slots for `plan` from now on (optional: a backend without warm slots has none). */
  prepare?(plan: PreparePlan): void;
  /** Remove residue of sandboxes whose owning process died (SIGKILL, crash). */
  reapOrphans(): Promise<ReapReport>;
  /** Snapshots of this backend, if it can take them. */
  readonly snapshots?: SnapshotStoreV1;
}
