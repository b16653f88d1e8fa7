// The egress part of a sandbox spec as data: the zod schemas of `network` and `secrets` (STYLE.md
// habit 3) and the host patterns their entries are written in. Pure: no I/O, no decision. The decision
// every egress path asks for (decideHost, decideAddress) is in policy/network.ts, built on the pattern
// matching here; core/spec.ts and core/template.ts validate specs with these schemas.
import { isAbsolute } from 'node:path';
import type * as Tldts from 'tldts';
import { z } from 'zod';
import { lazyRequire } from './lazy.js';
import {
  blockedRange,
  canonicalHost,
  exceptionAddressProblem,
  parseAddressPort,
  parsePort,
  type CanonicalHost,
} from './address.js';

const tldts = lazyRequire<typeof Tldts>('tldts');

/** Ports an allow entry without `:port` opens. */
export const DEFAULT_ALLOW_PORTS: readonly number[] = [80, 443];

// ---- host patterns ------------------------------------------------------------------------------

export type HostPattern =
  | { kind: 'exact'; name: string; port: number | undefined }
  /** `*.suffix`: any name below suffix, at any depth; never suffix itself. */
  | { kind: 'subdomains'; suffix: string; port: number | undefined }
  | { kind: 'address'; address: string; family: 4 | 6; port: number | undefined };

export type PatternList = 'allow' | 'deny';

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

export function hostMatches(p: HostPattern, c: CanonicalHost): boolean {
  if (p.kind === 'address') return c.kind === 'ip' && c.address === p.address;
  if (c.kind !== 'name') return false;
  return p.kind === 'exact' ? c.name === p.name : c.name.endsWith(`.${p.suffix}`);
}

export function portsOf(p: HostPattern, list: PatternList): readonly number[] | 'any' {
  if (p.port !== undefined) return [p.port];
  return list === 'allow' ? DEFAULT_ALLOW_PORTS : 'any';
}

export const portMatches = (p: HostPattern, list: PatternList, port: number): boolean => {
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

/**
 * Where a secret's real value comes from. `literal`: the value itself, as a remote client of the
 * server sends it (the server must never resolve a client's fromEnv/fromFile/command: those read its
 * own environment and files or run its programs). A literal is never written to a snapshot record.
 */
export type SecretValue =
  { fromEnv: string } | { fromFile: string } | { command: string[] } | { literal: string };

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
    literal: z.string().min(1, 'literal must not be empty').optional(),
  })
  .strict()
  .superRefine((v, ctx) => {
    const given = [v.fromEnv, v.fromFile, v.command, v.literal].filter((x) => x !== undefined).length;
    if (given !== 1) {
      ctx.addIssue({
        code: 'custom',
        message: `value needs exactly one of fromEnv, fromFile, command or literal (got ${given})`,
      });
    }
  })
  .transform((v): SecretValue =>
    v.fromEnv !== undefined
      ? { fromEnv: v.fromEnv }
      : v.fromFile !== undefined
        ? { fromFile: v.fromFile }
        : v.literal !== undefined
          ? { literal: v.literal }
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

/**
 * Whether `host` (a name) is reachable under `network` on port 443 or 80: some network.allow entry
 * matches it on that port and no network.deny entry does. The same rules as policy's decideHost for a
 * name (names are never in a blocked address range), checked on the data alone so that a spec can be
 * validated in core; test/unit/spec.test.ts holds the two to the same answers.
 */
export function secretHostReachable(network: NetworkPolicy, host: string): boolean {
  const c = canonicalHost(host);
  if (c.kind !== 'name') return false;
  const matching = (list: PatternList, port: number): boolean =>
    network[list].some((text) => {
      const p = parseHostPattern(text, list);
      return !('error' in p) && hostMatches(p, c) && portMatches(p, list, port);
    });
  return [443, 80].some((port) => !matching('deny', port) && matching('allow', port));
}
