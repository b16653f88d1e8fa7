// What runs the same in this process and on a server: the surface a library Sandbox and the remote
// SDK's RemoteSandbox share (`Sandbox.create(spec)` with no runtime returns one of them, depending on
// AIRLOCK_API_URL), and the seam through which the package entry lends this layer a remote runtime.
//
// src/sandbox must not import src/server (the layer rule); the remote SDK lives there. So the package
// entry registers a factory here (registerRemoteRuntime), and this layer only calls it: when
// `new Airlock({ apiUrl })` is constructed, or `Sandbox.create` runs with AIRLOCK_API_URL set.
import { AirlockError } from '../core/errors.js';
import type { ExecCommand, SandboxSpecInput } from '../core/spec.js';
import type { EgressEvent } from '../egress/events.js';
import type { NetworkPolicy, NetworkPolicyInput } from '../core/network-spec.js';
import type { SandboxFiles } from './files.js';
import type { CodeContextRef, CreateCodeContextOptions, Execution, RunCodeOptions } from '../core/code.js';
import type { ExecHandle, ExecOptions, ExecResult, SandboxProcess, SpawnOptions } from './sandbox.js';

/** The file operations a sandbox offers here and on a server alike. */
export type PortableFiles = Pick<SandboxFiles, 'write' | 'read' | 'list' | 'exists' | 'remove'>;

/** A sandbox's facts that a server reports as well (no host uid, no host layers). */
export interface PortableSandboxInfo {
  readonly id: string;
  readonly backend: string;
  readonly createdAt: Date;
  /** When the TTL ends it; null when it has none. */
  readonly expiresAt: Date | null;
  readonly persistent: boolean;
  readonly paused: boolean;
  readonly metadata: Readonly<Record<string, string>>;
}

/**
 * A sandbox wherever it runs: the library's `Sandbox` (this process) or the remote SDK's
 * `RemoteSandbox` (a server). What `Sandbox.create(spec)` returns when no runtime is given; narrow it
 * with `instanceof Sandbox` for what only a local sandbox has (workspace diffs, the egress log array,
 * connectPort, the host uid).
 */
export interface PortableSandbox {
  readonly id: string;
  readonly info: PortableSandboxInfo;
  readonly alive: boolean;
  readonly paused: boolean;
  readonly files: PortableFiles;
  exec(cmd: ExecCommand, opts: ExecOptions & { background: true }): Promise<ExecHandle>;
  exec(cmd: ExecCommand, opts?: ExecOptions & { background?: false }): Promise<ExecResult>;
  spawn(cmd: ExecCommand, opts?: SpawnOptions): Promise<SandboxProcess>;
  /** Move the TTL to `ttlMs` from now (a remote sandbox returns a promise: await it for the server's answer). */
  setTimeout(ttlMs: number): void | Promise<void>;
  /** Subscribe to egress events (a sandbox with a network policy); returns the unsubscribe function. */
  onEgress(listener: (e: EgressEvent) => void): () => void;
  /** Egress events as an async iterator until the sandbox dies or `signal` aborts. */
  watchEgress(signal?: AbortSignal): AsyncIterable<EgressEvent>;
  pause(): Promise<void>;
  resume(): Promise<void>;
  /**
   * Replace the network policy now (see Sandbox.setNetworkPolicy); resolves to the policy in force.
   * A sandbox created with no network refuses (INVALID_ARGUMENT, field "network").
   */
  setNetworkPolicy(policy: NetworkPolicyInput): Promise<NetworkPolicy>;
  /** Run code (the static analysis first; see docs/guides/code-execution.md). */
  runCode(code: string, opts?: RunCodeOptions): Promise<Execution>;
  createCodeContext(opts?: CreateCodeContextOptions): Promise<CodeContextRef>;
  listCodeContexts(): Promise<CodeContextRef[]>;
  closeCodeContext(ctx: CodeContextRef | string): Promise<void>;
  kill(): Promise<void>;
  [Symbol.asyncDispose](): Promise<void>;
}

/** The options a runtime on a server takes (the remote SDK's RemoteAirlockOptions, less test seams). */
export interface RemoteRuntimeOptions {
  /** The server, e.g. http://127.0.0.1:8787. */
  readonly apiUrl: string;
  /** The API key sent as a bearer token. */
  readonly apiKey?: string;
  /** Where truncated exec output is spilled on this machine (default: a 0700 dir under the tmp dir). */
  readonly spillDir?: string;
  /** All spill files of one sandbox together are cut at this size (default 2 GiB). */
  readonly maxSpillBytes?: number;
}

/** What the registered factory makes: a runtime whose sandboxes live on a server. */
export interface RemoteRuntime {
  create(spec?: SandboxSpecInput): Promise<PortableSandbox>;
  killAll(): Promise<void>;
  close(): Promise<void>;
}

/** The options a remote runtime accepts; any other option of `new Airlock()` acts on this host. */
export const REMOTE_RUNTIME_OPTIONS: ReadonlySet<string> = new Set([
  'apiUrl',
  'apiKey',
  'spillDir',
  'maxSpillBytes',
]);

let remoteFactory: ((opts: RemoteRuntimeOptions) => RemoteRuntime) | undefined;

/** Called once by the package entry (the remote SDK's module): how to reach a server. */
export function registerRemoteRuntime(factory: (opts: RemoteRuntimeOptions) => RemoteRuntime): void {
  remoteFactory = factory;
}

/** A runtime on the server `opts.apiUrl`, made by the registered factory. */
export function remoteRuntime(opts: RemoteRuntimeOptions): RemoteRuntime {
  if (!remoteFactory) {
    // Only when src/sandbox is imported on its own, past the package entry.
    throw new AirlockError(
      'INVALID_ARGUMENT',
      'no remote SDK is loaded: import Airlock and Sandbox from the package entry to use a server (apiUrl)',
      { field: 'apiUrl' },
    );
  }
  return remoteFactory(opts);
}
