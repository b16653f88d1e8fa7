// A live sandbox's network policy on the wire (issue 34): PUT /v1/sandboxes/:id/network replaces it
// (sbx.setNetworkPolicy; the egress gateway swaps it atomically) and answers with the policy now in
// force, canonical (the body is checked with NetworkPolicySchema at the route).
import { z } from 'zod';
import { NetworkPolicySchema } from '../core/network-spec.js';

/**
 * The request body: a network policy, as SandboxSpec.network, except that an absent `transparent`
 * keeps the sandbox's (it cannot change on a live sandbox) instead of defaulting to true.
 */
export const NetworkPolicyRequestSchema = NetworkPolicySchema.extend({
  transparent: z.boolean().optional(),
});

/** The answer: the policy in force, each list canonical. */
export const NetworkPolicyViewSchema = z
  .object({
    allow: z.array(z.string()),
    deny: z.array(z.string()),
    transparent: z.boolean(),
    allowPrivate: z.array(z.string()),
  })
  .strict();
export type NetworkPolicyView = z.infer<typeof NetworkPolicyViewSchema>;
