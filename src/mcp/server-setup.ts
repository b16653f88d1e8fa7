// One configured MCP server as the gateway and its sessions see it: its launch, boundary, compiled
// rules, budgets, scan and output policy, pin (setup), and its pool of sandboxed instances (entry).
import type { CompiledToolRules, ScanPolicy } from '../policy/mcp.js';
import type { Budgets } from './budget.js';
import type { Boundary } from './config.js';
import type { ServerPin } from './pin.js';
import type { ServerPool } from './pool.js';
import type { ServerLaunch } from './upstream.js';

export interface ServerSetup {
  readonly name: string;
  /** Tool/prompt name prefix (`<namespace>__<tool>`), or false for the server's own names. */
  readonly namespace: string | false;
  readonly launch: ServerLaunch;
  readonly boundary: Boundary;
  readonly rules: CompiledToolRules;
  readonly budgets: Budgets;
  readonly scan: ScanPolicy;
  readonly output: { readonly maxTextBytes: number };
  /** From the lockfile; absent: trust on first use, per session. */
  readonly pinned?: ServerPin;
}

export interface ServerEntry {
  readonly setup: ServerSetup;
  readonly pool: ServerPool;
}
