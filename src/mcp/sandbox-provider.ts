// What the MCP layer needs from a sandbox runtime, and nothing more. `Airlock` and its `Sandbox`
// satisfy these interfaces structurally; callers (cli, the library entry) pass an Airlock in. Declared
// here so mcp/ never imports sandbox/ (imports point down the layers: sandbox/ is above mcp/).
import type { Readable, Writable } from 'node:stream';
import type { SandboxSpecInput } from '../core/spec.js';
import type { EgressEvent } from '../egress/events.js';

/** A long-running process with raw pipes in a sandbox: the MCP server's stdio. */
export interface McpServerProcess {
  readonly stdin: Writable;
  readonly stdout: Readable;
  readonly stderr: Readable;
  /** Resolves once the process tree is gone (never rejects). */
  readonly exited: Promise<{ exitCode: number | null; signal: string | null; killedBy?: string }>;
}

/** One MCP server's sandbox. */
export interface McpSandbox {
  readonly id: string;
  /** False once the sandbox is gone (killed, TTL, OOM). */
  readonly alive: boolean;
  /** Restart the sandbox's TTL at `ttlMs` from now. */
  setTimeout(ttlMs: number): void;
  spawn(argv: string[], opts: { cwd?: string }): Promise<McpServerProcess>;
  /** Run a shell command to completion (tests and diagnostics read the server's environment with it). */
  exec(cmd: string): Promise<{ exitCode: number | null; stdout: string; stderr: string }>;
  /** Subscribe to the sandbox's egress events; returns the unsubscribe function. */
  onEgress(listener: (e: EgressEvent) => void): () => void;
  /** Kill the sandbox and everything in it; resolves once it is gone. */
  kill(): Promise<void>;
}

/** Name → value pairs the output guard scrubs for one sandbox. */
export interface McpRedactionSet {
  secrets: Array<{ name: string; value: string }>;
  sentinels: Array<{ name: string; value: string }>;
  canaries: Array<{ name: string; value: string }>;
}

/** The sandbox runtime the gateway starts servers in (an `Airlock`). */
export interface McpSandboxProvider {
  /** Where the gateway keeps its spill files (under `spill/mcp`). */
  readonly stateDir: string;
  create(spec: SandboxSpecInput): Promise<McpSandbox>;
  /** What output guards must scrub for a sandbox of this runtime. */
  redactionSetFor(sandboxId: string): McpRedactionSet;
}
