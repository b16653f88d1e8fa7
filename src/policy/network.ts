// Egress policy: the ONE pure decision function every egress path calls — HTTP proxy, CONNECT, SOCKS5,
// transparent interception and the DNS responder (habit 5) — and the policy-file loader. The schemas of
// `network` and `secrets` are data in core/network-spec.ts (re-exported here under their names).
// Nothing here does I/O except loadPolicyFile, which reads the YAML it is given.
//
// Order of a decision: canonicalise the host (core/address.ts) → always-blocked address ranges (unless
// an exact network.allowPrivate exception) → network.deny (deny wins) → network.allow → default deny.
import { AirlockError } from '../core/errors.js';
import { parseConfigText, readConfigData } from '../core/config-file.js';
import { parseOrThrow } from '../core/validate.js';
import { blockedRange, canonicalHost, exceptionMatches } from '../core/address.js';
import {
  EgressPolicySchema,
  hostMatches,
  parseHostPattern,
  portMatches,
  portsOf,
  type EgressPolicy,
  type HostPattern,
  type NetworkPolicy,
  type PatternList,
} from '../core/network-spec.js';

export {
  DEFAULT_ALLOW_PORTS,
  EgressPolicySchema,
  formatHostPattern,
  NetworkPolicySchema,
  parseHostPattern,
  SecretSpecSchema,
  SecretsSchema,
} from '../core/network-spec.js';
export type {
  EgressPolicy,
  EgressPolicyInput,
  HostPattern,
  NetworkPolicy,
  NetworkPolicyInput,
  SecretSpec,
  SecretValue,
} from '../core/network-spec.js';

export function parseEgressPolicy(input: unknown, what = 'egress policy'): EgressPolicy {
  return parseOrThrow(EgressPolicySchema, input ?? {}, what);
}

const MAX_POLICY_FILE_BYTES = 1024 * 1024;

/** Parse policy YAML text; `source` names it in error messages. */
export function parsePolicyYaml(text: string, source = 'policy'): EgressPolicy {
  const data = parseConfigText(text, source, { what: 'policy file', code: 'INVALID_SPEC', format: 'yaml' });
  return parseEgressPolicy(data, `policy file ${source}`);
}

/** Read and validate a YAML policy file (the only I/O in policy/). */
export function loadPolicyFile(path: string): EgressPolicy {
  const opts = {
    what: 'policy file',
    code: 'INVALID_SPEC',
    maxBytes: MAX_POLICY_FILE_BYTES,
    format: 'yaml',
  } as const;
  return parseEgressPolicy(readConfigData(path, opts), `policy file ${path}`);
}

// ---- the decision -------------------------------------------------------------------------------

export type EgressDenyCode =
  'not_allowed' | 'denied' | 'port_not_allowed' | 'blocked_address' | 'invalid_host';

export type EgressVerdict =
  | { action: 'allow'; rule: string; reason: string }
  | { action: 'deny'; code: EgressDenyCode; reason: string };

const PREFIX = 'blocked by Airlock egress policy: ';
const deny = (code: EgressDenyCode, why: string): EgressVerdict => ({
  action: 'deny',
  code,
  reason: PREFIX + why,
});
/** A client-supplied string, quoted and cut short for a reason text. */
const quote = (s: string): string => JSON.stringify(s.length > 100 ? `${s.slice(0, 100)}…` : s);
const validPort = (port: number): boolean => Number.isInteger(port) && port >= 1 && port <= 65_535;
const hostPort = (address: string, family: 4 | 6, port: number): string =>
  `${family === 6 ? `[${address}]` : address}:${port}`;

interface Rule {
  text: string;
  pattern: HostPattern;
}

/**
 * Parse the patterns of a policy. A policy from NetworkPolicySchema always compiles; one built by hand
 * that does not is a programming error (INVALID_SPEC), never a silent allow.
 */
function compile(policy: NetworkPolicy): { allow: Rule[]; deny: Rule[] } {
  const rules = (list: PatternList): Rule[] =>
    policy[list].map((text, i) => {
      const pattern = parseHostPattern(text, list);
      if ('error' in pattern) {
        throw new AirlockError(
          'INVALID_SPEC',
          `invalid network policy at network.${list}.${i}: ${pattern.error}`,
          {
            field: `network.${list}.${i}`,
          },
        );
      }
      return { text, pattern };
    });
  return { allow: rules('allow'), deny: rules('deny') };
}

function blockedReason(address: string, range: string, host?: string): string {
  const what =
    host !== undefined && host !== address ? `host ${host} resolved to ${address}, which` : address;
  return `${what} is in a blocked range (${range}); private, loopback and metadata addresses are never reachable`;
}

/**
 * Decide whether the sandbox may connect to `host`:`port`, where host is what the client asked for (URL
 * host, Host header, CONNECT target, SNI, SOCKS5 name or address). For a name, an allow verdict is not
 * yet a connection: the proxy resolves it itself and passes EVERY resolved address to decideAddress.
 */
export function decideHost(policy: NetworkPolicy, host: string, port: number): EgressVerdict {
  const c = canonicalHost(host);
  if (c.kind === 'invalid') {
    return deny('invalid_host', `${quote(host)} is not a valid host name or IP address (${c.reason})`);
  }
  if (!validPort(port)) return deny('port_not_allowed', `port ${port} is not a valid TCP port (1-65535)`);
  const shown = c.kind === 'ip' ? c.address : c.name;
  const { allow, deny: denyRules } = compile(policy);

  const range = c.kind === 'ip' ? blockedRange(c.address) : undefined;
  const excepted =
    c.kind === 'ip' && range !== undefined && exceptionMatches(policy.allowPrivate, c.address, port);
  if (range !== undefined && !excepted) return deny('blocked_address', blockedReason(shown, range));

  const denied = denyRules.find((r) => hostMatches(r.pattern, c) && portMatches(r.pattern, 'deny', port));
  if (denied) {
    return deny(
      'denied',
      `host ${shown} is denied by network.deny entry "${denied.text}"; it cannot be reached`,
    );
  }

  if (excepted && c.kind === 'ip') {
    const rule = `network.allowPrivate "${hostPort(c.address, c.family, port)}"`;
    return { action: 'allow', rule, reason: `${shown} port ${port} is an operator exception (${rule})` };
  }

  const forHost = allow.filter((r) => hostMatches(r.pattern, c));
  const hit = forHost.find((r) => portMatches(r.pattern, 'allow', port));
  if (hit) {
    return {
      action: 'allow',
      rule: hit.text,
      reason: `host ${shown} port ${port} matches network.allow entry "${hit.text}"`,
    };
  }
  if (forHost.length > 0) {
    const ports = [...new Set(forHost.flatMap((r) => portsOf(r.pattern, 'allow') as readonly number[]))];
    return deny(
      'port_not_allowed',
      `port ${port} is not allowed for ${shown} (allowed: ${ports.sort((a, b) => a - b).join(', ')}); ask the operator to allow ${c.kind === 'ip' ? hostPort(c.address, c.family, port) : `${shown}:${port}`} if it is needed`,
    );
  }
  return deny('not_allowed', `host ${shown} is not in network.allow; ask the operator to allow it`);
}

/**
 * Decide whether the proxy may dial `address`:`port`, an address it resolved itself (or the literal it
 * was given). Called for EVERY address right before connecting to exactly that address, so a DNS answer
 * cannot rebind an allowed name to a private one. `host` only improves the reason text.
 */
export function decideAddress(
  policy: NetworkPolicy,
  address: string,
  port: number,
  host?: string,
): EgressVerdict {
  const c = canonicalHost(address);
  if (c.kind !== 'ip') return deny('invalid_host', `${quote(address)} is not an IP address`);
  if (!validPort(port)) return deny('port_not_allowed', `port ${port} is not a valid TCP port (1-65535)`);

  const range = blockedRange(c.address);
  if (range !== undefined) {
    if (!exceptionMatches(policy.allowPrivate, c.address, port)) {
      return deny('blocked_address', blockedReason(c.address, range, host));
    }
    const rule = `network.allowPrivate "${hostPort(c.address, c.family, port)}"`;
    return { action: 'allow', rule, reason: `${c.address} port ${port} is an operator exception (${rule})` };
  }
  // An address in network.deny stays denied whatever name led to it (deny wins).
  const denied = compile(policy).deny.find(
    (r) => r.pattern.kind === 'address' && hostMatches(r.pattern, c) && portMatches(r.pattern, 'deny', port),
  );
  if (denied) {
    return deny(
      'denied',
      `${c.address} is denied by network.deny entry "${denied.text}"; it cannot be reached`,
    );
  }
  return { action: 'allow', rule: 'public address', reason: `${c.address} is a public address` };
}

/** Whether some port of `name` is allowed (the DNS responder only answers names the policy allows). */
export function hostAllowedOnSomePort(policy: NetworkPolicy, name: string): boolean {
  for (const port of [443, 80]) if (decideHost(policy, name, port).action === 'allow') return true;
  // A name allowed on another explicit port (host:port entries).
  return policy.allow.some((entry) => {
    const m = /:(\d+)$/.exec(entry);
    return m ? decideHost(policy, name, Number(m[1])).action === 'allow' : false;
  });
}
