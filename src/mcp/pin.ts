// SECURITY-CRITICAL: pinning of MCP server definitions (issue 4, "Definitions: scan and pin"). A server
// can change what a tool means after it was reviewed (a "rug pull"): the same name, a new description
// that instructs the model, a wider input schema. This module hashes each definition canonically,
// compares what a server lists now against what was pinned (in `airlock.lock.json`, or on first use in a
// session), and says which tools must be quarantined and why. Everything is pure and deterministic
// except `readLockfile`/`writeLockfile`. It only reports; the gateway enforces the quarantine.
//
// What is hashed (exactly these fields; any other field a server sends is ignored):
//   tool:              name, title, description, inputSchema, outputSchema, annotations, icons, execution
//   prompt:            name, title, description, arguments, icons
//   resource template: name, title, uriTemplate, description, mimeType, annotations, icons
//   instructions:      the string
// `icons` are included: clients show them as the tool's identity, so a swapped icon (or an icon URL moved
// to another host, which the client then fetches) changes what the user trusts. `execution` is included:
// it changes how a client must invoke the tool. `_meta` is excluded: it is protocol and extension
// bookkeeping, never the tool's description to the model, and varies between server builds, so hashing it
// would quarantine on noise. Consequence: nothing may act on a tool's `_meta` without pinning it itself.
//
// Schema widenings are reported in addition to the change itself: a changed tool is quarantined whether or
// not a widening was found, so a missed widening never lets a change through. The comparison is still
// conservative: what it cannot judge (`$ref`, `allOf`, `not`, `if`, unknown keywords) is 'changed-unknown'.
//
// The pieces: canonical JSON (core/canonical-json.ts), hashing (pin/hash.ts), schema widening
// (pin/widen.ts), comparing and the diff (pin/diff.ts), the lockfile (pin/lockfile.ts). This file is the
// entry point (named re-exports) and holds the per-session trust-on-first-use pin.

import { canonicalJson, prettyJson } from '../core/canonical-json.js';
import { comparePins, diffFindings, quarantinedTools, type PinDiff, type PinFinding } from './pin/diff.js';
import { indexServer, type ServerDefinitions, type ServerPin } from './pin/hash.js';

export { canonicalJson, prettyJson };
export {
  hashInstructions,
  hashPrompt,
  hashResourceTemplate,
  hashTool,
  pinDefinitions,
  type PinEntry,
  type PinHash,
  type PromptDefinition,
  type ResourceTemplateDefinition,
  type ServerDefinitions,
  type ServerPin,
  type ToolDefinition,
} from './pin/hash.js';
export { schemaWidenings, WIDENING_KINDS, type Widening, type WideningKind } from './pin/widen.js';
export {
  comparePins,
  diffFindings,
  formatDiff,
  isCleanDiff,
  PIN_RULE_IDS,
  quarantinedTools,
  type ChangedEntry,
  type KindDiff,
  type PinDiff,
  type PinFinding,
  type PinMessageOptions,
  type PinRuleId,
} from './pin/diff.js';
export {
  LOCKFILE_NAME,
  LockfileSchema,
  readLockfile,
  serializeLockfile,
  ServerPinSchema,
  setServerPin,
  writeLockfile,
  type LockedServer,
  type Lockfile,
} from './pin/lockfile.js';

// ---------------------------------------------------------------------------------------------------
// Trust on first use

export interface PinObservation {
  diff: PinDiff;
  /** Tool name → reason; the gateway hides or refuses these until re-pinned. */
  quarantined: Map<string, string>;
  findings: PinFinding[];
}

/**
 * The pin a session checks every tools/list against: the lockfile's when there is one, otherwise the
 * definitions of the first observation (trust on first use). Pass complete (all pages) lists.
 */
export class SessionPins {
  #baseline: ServerPin | undefined;
  readonly mode: 'lockfile' | 'first-use';
  readonly #serverName: string;

  constructor(locked?: ServerPin, opts: { serverName?: string } = {}) {
    this.#baseline = locked === undefined ? undefined : structuredClone(locked);
    this.mode = locked === undefined ? 'first-use' : 'lockfile';
    this.#serverName = opts.serverName ?? 'server';
  }

  /** The pin compared against, once there is one. */
  get baseline(): ServerPin | undefined {
    return this.#baseline === undefined ? undefined : structuredClone(this.#baseline);
  }

  observe(defs: ServerDefinitions): PinObservation {
    // On first use, names listed twice with different definitions stay out of the baseline: they show
    // up as duplicated now and as added later, quarantined either way.
    this.#baseline ??= indexServer(defs).pin;
    const diff = comparePins(this.#baseline, defs);
    const opts = { firstUse: this.mode === 'first-use' };
    return {
      diff,
      quarantined: quarantinedTools(diff, opts),
      findings: diffFindings(this.#serverName, diff, opts),
    };
  }
}
