// Egress policy: the zod schema of `network` and `secrets` (STYLE.md habit 3) and the ONE pure decision
// function every egress path calls — HTTP proxy, CONNECT, SOCKS5, transparent interception and the DNS
// responder (habit 5). Nothing here does I/O except loadPolicyFile, which reads the YAML it is given.
//
// Order of a decision: canonicalise the host (egress/address.ts) → always-blocked address ranges (unless
// an exact network.allowPrivate exception) → network.deny (deny wins) → network.allow → default deny.
import { isAbsolute } from 'node:path';
import type * as Tldts from 'tldts';
import { z } from 'zod';
import { AirlockError } from '../core/errors.js';
import { lazyRequire } from '../core/lazy.js';
import { parseConfigText, readConfigData } from '../core/config-file.js';
import { parseOrThrow } from '../core/validate.js';
import {
  blockedRange,
  canonicalHost,
  exceptionAddressProblem,
  exceptionMatches,
  parseAddressPort,
  parsePort,
  type CanonicalHost,
} from '../egress/address.js';

const tldts = lazyRequire<typeof Tldts>('tldts');

/** Ports an allow entry without `:port` opens. */
export const DEFAULT_ALLOW_PORTS: readonly number[] = [80, 443];

// ---- host patterns ------------------------------------------------------------------------------

export type HostPattern =
  | { kind: 'exact'; name: string; port: number | undefined }
  /** `*.suffix`: any name below suffix, at any depth; never suffix itself. */
  | { kind: 'subdomains'; suffix: string; port: number | undefined }
  | { kind: 'address'; address: string; family: 4 | 6; port: number | undefined };

type PatternList = 'allow' | 'deny';

function splitHostPort(entry: string): { host: string; port: number | undefined } | { error: string } {
  let host = entry;
  let portText: string | undefined;
  if (entry.startsWith('[')) {
    const end = entry.indexOf(']');
    if (end < 0) return { error: 'unterminated "[" (write IPv6 addresses as [2606:4700::1111]:443)' };
    host = entry.slice(0, end + 1);
    const rest = entry.slice(end + 1);
    if (rest !== '' && !rest.startsWith(':')) return { error: 'expected ":PORT" after the "]"' };
    if (rest !== '') portText = rest.slice(1);
  } else {
    const colons = entry.split(':').length - 1;
    if (colons > 1) return { error: 'IPv6 addresses must be in brackets, e.g. [2606:4700::1111]:443' };
    if (colons === 1) [host, portText] = entry.split(':') as [string, string];
  }
  if (portText === undefined) return { host, port: undefined };
  const port = parsePort(portText);
  return port === undefined ? { error: `"${portText}" is not a TCP port (1-65535)` } : { host, port };
}

/** Parse one network.allow / network.deny entry; the error says what to write instead. */
export function parseHostPattern(entry: string, list: PatternList): HostPattern | { error: string } {
  if (entry.trim() === '') return { error: 'empty entry' };
  if (entry.includes('/')) return { error: `write a host such as api.github.com, not a URL or path` };
  const hp = splitHostPort(entry);
  if ('error' in hp) return hp;
  const { host, port } = hp;

  if (host === '*') {
    return list === 'allow'
      ? { error: 'bare "*" would allow every host; list the hosts the sandbox needs' }
      : { error: 'bare "*" is not needed: every host not in network.allow is already denied' };
  }
  if (host.includes('*')) {
    const suffixText = host.slice(2);
    if (!host.startsWith('*.') || suffixText.includes('*')) {
      return { error: '"*" is only allowed as a whole leading label, as in *.example.com' };
    }
    const suffix = canonicalHost(suffixText);
    if (suffix.kind === 'invalid')
      return { error: `"${suffixText}" is not a valid host name (${suffix.reason})` };
    if (suffix.kind === 'ip') return { error: 'wildcards match names, not addresses' };
    const registrable = tldts().parse(suffix.name, {
      allowPrivateDomains: true, // *.github.io, *.s3.amazonaws.com: every subdomain is someone else's site
      validateHostname: false, // already validated (and underscores are fine)
      detectIp: false,
      extractHostname: false,
    }).domain;
    if (registrable === null) {
      return {
        error: `too broad: "${suffix.name}" is a public suffix shared by unrelated owners; name a registrable domain, e.g. *.example.${suffix.name}`,
      };
    }
    return { kind: 'subdomains', suffix: suffix.name, port };
  }

  const c = canonicalHost(host);
  if (c.kind === 'invalid') return { error: `"${host}" is not a valid host name (${c.reason})` };
  if (c.kind === 'name') return { kind: 'exact', name: c.name, port };
  const range = blockedRange(c.address);
  if (list === 'allow' && range !== undefined) {
    const example = `${c.family === 6 ? `[${c.address}]` : c.address}:${port ?? 'PORT'}`;
    return {
      error: `${c.address} is in a blocked range (${range}); network.allow takes names and public addresses; for an operator exception use network.allowPrivate: ["${example}"]`,
    };
  }
  return { kind: 'address', address: c.address, family: c.family, port };
}

/** The canonical spelling of a pattern (lower-case, punycode, RFC 5952 IPv6 in brackets). */
export function formatHostPattern(p: HostPattern): string {
  const host =
    p.kind === 'exact'
      ? p.name
      : p.kind === 'subdomains'
        ? `*.${p.suffix}`
        : p.family === 6
          ? `[${p.address}]`
          : p.address;
  return p.port === undefined ? host : `${host}:${p.port}`;
}

function hostMatches(p: HostPattern, c: CanonicalHost): boolean {
  if (p.kind === 'address') return c.kind === 'ip' && c.address === p.address;
  if (c.kind !== 'name') return false;
  return p.kind === 'exact' ? c.name === p.name : c.name.endsWith(`.${p.suffix}`);
}

function portsOf(p: HostPattern, list: PatternList): readonly number[] | 'any' {
  if (p.port !== undefined) return [p.port];
  return list === 'allow' ? DEFAULT_ALLOW_PORTS : 'any';
}

const portMatches = (p: HostPattern, list: PatternList, port: number): boolean => {
  const ports = portsOf(p, list);
  return ports === 'any' || ports.includes(port);
};

// ---- schema -------------------------------------------------------------------------------------

const patternEntry = (list: PatternList) =>
  z.string().transform((s, ctx) => {
    const p = parseHostPattern(s, list);
    if ('error' in p) {
      ctx.addIssue({ code: 'custom', message: `"${s}": ${p.error}` });
      return z.NEVER;
    }
    return formatHostPattern(p);
  });

const allowPrivateEntry = z.string().transform((s, ctx) => {
  const p = parseAddressPort(s);
  if ('error' in p) {
    ctx.addIssue({ code: 'custom', message: `"${s}": ${p.error}` });
    return z.NEVER;
  }
  const problem = exceptionAddressProblem(p.address);
  if (problem !== undefined) {
    ctx.addIssue({ code: 'custom', message: `"${s}": ${p.address} ${problem}` });
    return z.NEVER;
  }
  return `${p.family === 6 ? `[${p.address}]` : p.address}:${p.port}`;
});

export const NetworkPolicySchema = z
  .object({
    allow: z
      .array(patternEntry('allow'))
      .default([])
      .describe(
        'Hosts the sandbox may reach, as host[:port]. host is an exact name (api.github.com), "*.suffix" ' +
          '(any subdomain of suffix at any depth, but NOT suffix itself: list both to allow both; suffix must ' +
          'be a registrable domain, so *.com, *.co.uk and *.github.io are rejected) or a public IP address ' +
          '(IPv6 in brackets). Without a port only ports 80 and 443 are allowed; host:port allows exactly that ' +
          'port. Bare "*" is rejected. Default: nothing (deny all).',
      ),
    deny: z
      .array(patternEntry('deny'))
      .default([])
      .describe(
        'Hosts that are never reachable, same syntax as allow; deny wins over allow. Without a port every ' +
          'port is denied; host:port denies only that port.',
      ),
    transparent: z
      .boolean()
      .default(true)
      .describe(
        'Also intercept connections from clients that ignore HTTP_PROXY/HTTPS_PROXY (nftables redirect, ' +
          'TLS SNI / Host, and a DNS responder that answers only allowed names). The same rules apply.',
      ),
    allowPrivate: z
      .array(allowPrivateEntry)
      .default([])
      .describe(
        'Operator exception to the SSRF guard: exact ADDRESS:PORT pairs inside an always-blocked range ' +
          '(e.g. "10.0.0.5:5432", "[fd00::1]:443") that the sandbox may reach. No names, CIDRs or wildcards. ' +
          'To reach such a host by name, also list the name in allow. Empty by default.',
      ),
  })
  .strict();

export type NetworkPolicy = z.output<typeof NetworkPolicySchema>;
export type NetworkPolicyInput = z.input<typeof NetworkPolicySchema>;

const envName = z
  .string()
  .regex(
    /^[A-Za-z_][A-Za-z0-9_]*$/,
    'must be an environment variable name: letters, digits and _, not starting with a digit',
  );
const noNul = (s: string): boolean => !s.includes('\0');

export type SecretValue = { fromEnv: string } | { fromFile: string } | { command: string[] };

const SecretValueSchema = z
  .object({
    fromEnv: envName.optional(),
    fromFile: z
      .string()
      .refine((p) => isAbsolute(p), 'fromFile must be an absolute path')
      .refine(noNul, 'fromFile must not contain NUL')
      .optional(),
    command: z
      .array(z.string().refine(noNul, 'command arguments must not contain NUL'))
      .min(1, 'command must be a non-empty array, e.g. ["vault", "kv", "get", "-field=token", "secret/gh"]')
      .refine((c) => c[0] !== '', 'command[0] (the program) must not be empty')
      .optional(),
  })
  .strict()
  .superRefine((v, ctx) => {
    const given = [v.fromEnv, v.fromFile, v.command].filter((x) => x !== undefined).length;
    if (given !== 1) {
      ctx.addIssue({
        code: 'custom',
        message: `value needs exactly one of fromEnv, fromFile or command (got ${given})`,
      });
    }
  })
  .transform((v): SecretValue =>
    v.fromEnv !== undefined
      ? { fromEnv: v.fromEnv }
      : v.fromFile !== undefined
        ? { fromFile: v.fromFile }
        : { command: v.command ?? [] },
  );

const secretHost = z.string().transform((s, ctx) => {
  const fail = (message: string) => {
    ctx.addIssue({ code: 'custom', message: `"${s}": ${message}` });
    return z.NEVER;
  };
  if (s.includes('*')) return fail('secrets are bound to exact host names, not wildcards; list each host');
  if (/^[^:[\]]+:[0-9]*$/.test(s)) return fail('write the host name without a port');
  const c = canonicalHost(s);
  if (c.kind === 'invalid') return fail(`not a valid host name (${c.reason})`);
  if (c.kind === 'ip') return fail('secrets are bound to host names, not IP addresses');
  return c.name;
});

export const SecretSpecSchema = z
  .object({
    name: envName.describe('The variable the sandbox sees, set to a sentinel instead of the real value.'),
    value: SecretValueSchema.describe(
      'Where the real value comes from: { fromEnv: VAR }, { fromFile: /abs/path } or { command: [argv…] }.',
    ),
    hosts: z
      .array(secretHost)
      .min(1, 'hosts must list at least one host the secret is sent to')
      .describe('Exact host names for which the proxy swaps the sentinel for the real value.'),
    body: z
      .boolean()
      .default(false)
      .describe(
        'Also swap the sentinel in request bodies to those hosts (bodies are then buffered, up to 1 MiB).',
      ),
    insecureHttp: z
      .boolean()
      .default(false)
      .describe(
        'Also swap the real value into plain-HTTP requests to those hosts, where it crosses the network in ' +
          'cleartext. Default false: the value goes only into TLS connections; a plain-HTTP request ' +
          'carrying the sentinel is refused.',
      ),
  })
  .strict();

export const SecretsSchema = z.array(SecretSpecSchema).superRefine((secrets, ctx) => {
  const seen = new Map<string, number>();
  secrets.forEach((s, i) => {
    const first = seen.get(s.name);
    if (first !== undefined) {
      ctx.addIssue({
        code: 'custom',
        path: [i, 'name'],
        message: `duplicate secret name "${s.name}" (already used by secrets.${first})`,
      });
    } else seen.set(s.name, i);
  });
});

export type SecretSpec = z.output<typeof SecretSpecSchema>;

export const EgressPolicySchema = z
  .object({
    network: NetworkPolicySchema.default(() => NetworkPolicySchema.parse({})),
    secrets: SecretsSchema.default([]),
  })
  .strict();

export type EgressPolicyInput = z.input<typeof EgressPolicySchema>;
export type EgressPolicy = z.output<typeof EgressPolicySchema>;

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
