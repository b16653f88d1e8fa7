// Changing a live sandbox's network policy (issue 34: the AI SDK session's setNetworkPolicy, the
// server's PUT /v1/sandboxes/:id/network). The mechanism is the egress gateway's
// SandboxEgress.setPolicy (an atomic swap that closes connections the new policy denies); this file
// validates the request, refuses what cannot be honoured, and makes the change an audit record.
import { AirlockError } from '../core/errors.js';
import { NetworkPolicySchema, type NetworkPolicy, type NetworkPolicyInput } from '../core/network-spec.js';
import { parseOrThrow } from '../core/validate.js';
import type { AuditSink, NetworkAuditEvent } from '../mcp/audit.js';

/** What the runtime gives a sandbox with egress: the swap on its gateway (SandboxEgress.setPolicy). */
export type SetEgressPolicy = (policy: NetworkPolicy) => void;

export interface NetworkChange {
  readonly sandboxId: string;
  /** The policy in force now (undefined: the sandbox was created with no network). */
  readonly current: NetworkPolicy | undefined;
  readonly setEgress: SetEgressPolicy | undefined;
  readonly audit?: AuditSink | undefined;
  readonly listeners: Iterable<(e: NetworkAuditEvent) => void>;
}

/**
 * Validate `input`, swap it in, report it. Returns the policy now in force.
 * @throws AirlockError INVALID_ARGUMENT for a malformed policy, for a sandbox created without a
 * network (it has no route and no gateway to swap), or when `transparent` would change.
 */
export function changeNetworkPolicy(c: NetworkChange, input: NetworkPolicyInput): NetworkPolicy {
  // An absent `transparent` keeps the sandbox's (it cannot change; see SandboxEgress.setPolicy).
  const keep =
    c.current && input !== null && typeof input === 'object' && input.transparent === undefined
      ? { ...input, transparent: c.current.transparent }
      : input;
  const policy = parseOrThrow(NetworkPolicySchema, keep, 'network policy', 'INVALID_ARGUMENT');
  if (!c.setEgress || !c.current) {
    // No netns route and no gateway exist for it: adding them to a running sandbox is not done.
    throw new AirlockError(
      'INVALID_ARGUMENT',
      `sandbox ${c.sandboxId} was created with no network, so it has no egress to change; create it with a network policy (spec.network, e.g. { allow: [] }) and change that later`,
      { field: 'network' },
    );
  }
  c.setEgress(policy);
  const e: NetworkAuditEvent = {
    kind: 'network',
    sandboxId: c.sandboxId,
    time: new Date().toISOString(),
    decision: 'allow',
    reason: `network policy changed: allow [${policy.allow.join(', ')}], deny [${policy.deny.join(', ')}]`,
    previous: c.current,
    policy,
  };
  for (const l of [...c.listeners, ...(c.audit ? [c.audit] : [])]) {
    try {
      l(e);
    } catch {
      /* a listener's bug never undoes the change */
    }
  }
  return policy;
}
