// `airlock run` egress flags → spec.network / spec.secrets:
//   --allow HOST[:PORT]   --deny HOST[:PORT]   --secret NAME=SOURCE@HOST[,HOST...]   --policy FILE
// SOURCE is env:VAR, file:/abs/path or cmd:PROGRAM ARGS (split on spaces, no shell). --policy loads a
// YAML policy (network:, secrets:) and the flags are merged on top: allow/deny entries are added, a
// --secret replaces a policy secret of the same name. Every bad value is an INVALID_ARGUMENT naming
// its flag (exit 2). I/O: reading the --policy file, and checkSecretSources (env variable set, file
// present) so a missing source fails before any sandbox exists. Error messages never repeat a
// SOURCE: a cmd: argument may itself be a credential.
import { statSync } from 'node:fs';
import { isAbsolute, resolve } from 'node:path';
import { AirlockError } from '../core/errors.js';
import type { SandboxSpecInput } from '../core/spec.js';
import {
  decideHost,
  loadPolicyFile,
  NetworkPolicySchema,
  parseHostPattern,
  SecretSpecSchema,
  type EgressPolicy,
  type SecretValue,
} from '../policy/network.js';

export interface EgressFlags {
  allow?: string[];
  deny?: string[];
  secret?: string[];
  policy?: string;
}

export type EgressFlag = '--allow' | '--deny' | '--secret' | '--policy';
type SecretInput = NonNullable<SandboxSpecInput['secrets']>[number];

export interface EgressPlan {
  /** Absent when no egress flag was given: the sandbox then has no network at all. */
  readonly network?: NonNullable<SandboxSpecInput['network']>;
  readonly secrets: SecretInput[];
  /** Which flag each secret (by name) came from, so a later error about it names that flag. */
  readonly secretOrigin: ReadonlyMap<string, '--secret' | '--policy'>;
}

const SECRET_EXAMPLE = 'e.g. --secret GITHUB_TOKEN=env:GITHUB_TOKEN@api.github.com';

function fail(flag: EgressFlag, message: string): never {
  throw new AirlockError('INVALID_ARGUMENT', `${flag}: ${message}`, { field: flag });
}

/** One --allow / --deny value, checked with the policy's own parser (bare "*", "*.com", URLs…). */
function hostEntry(flag: '--allow' | '--deny', text: string): string {
  const p = parseHostPattern(text, flag === '--allow' ? 'allow' : 'deny');
  if ('error' in p) fail(flag, `"${text}": ${p.error}`);
  return text;
}

function secretSource(name: string, source: string): SecretValue {
  const colon = source.indexOf(':');
  const kind = colon < 0 ? '' : source.slice(0, colon);
  const rest = colon < 0 ? '' : source.slice(colon + 1);
  switch (kind) {
    case 'env':
      if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(rest)) {
        fail(
          '--secret',
          `${name}: env: needs a variable name (letters, digits and _), e.g. ${name}=env:${name}@HOST`,
        );
      }
      return { fromEnv: rest };
    case 'file':
      if (!isAbsolute(rest))
        fail('--secret', `${name}: file: needs an absolute path, e.g. ${name}=file:/run/secrets/token@HOST`);
      return { fromFile: rest };
    case 'cmd': {
      const argv = rest.split(' ').filter((a) => a !== '');
      if (argv.length === 0)
        fail(
          '--secret',
          `${name}: cmd: needs a program, e.g. ${name}=cmd:vault kv get -field=token secret/gh@HOST`,
        );
      return { command: argv };
    }
    default:
      return fail('--secret', `${name}: the source must start with env:, file: or cmd: (${SECRET_EXAMPLE})`);
  }
}

/** `NAME=SOURCE@HOST[,HOST...]`; the hosts follow the LAST "@" (a path or command may contain one). */
export function parseSecretFlag(text: string): SecretInput {
  const m = /^([^=]*)=(.*)$/s.exec(text);
  if (!m) fail('--secret', `expected NAME=SOURCE@HOST[,HOST...] (no "=" found); ${SECRET_EXAMPLE}`);
  const name = m[1]!;
  if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(name)) {
    fail(
      '--secret',
      `"${name}" is not a variable name (letters, digits and _, not starting with a digit); ${SECRET_EXAMPLE}`,
    );
  }
  const at = m[2]!.lastIndexOf('@');
  if (at < 0) {
    fail(
      '--secret',
      `${name}: no hosts; the real value is only sent to the hosts after "@", e.g. ${name}=env:${name}@api.github.com`,
    );
  }
  const value = secretSource(name, m[2]!.slice(0, at));
  const hosts = m[2]!.slice(at + 1).split(',');
  if (hosts.some((h) => h.trim() === ''))
    fail('--secret', `${name}: empty host name after "@"; list hosts as a,b`);
  const parsed = SecretSpecSchema.safeParse({ name, value, hosts });
  if (!parsed.success) {
    const issue = parsed.error.issues[0]!;
    fail('--secret', `${name}: ${issue.message}`);
  }
  return { name, value, hosts };
}

function loadPolicy(path: string, cwd: string): EgressPolicy {
  try {
    return loadPolicyFile(resolve(cwd, path));
  } catch (e) {
    if (!AirlockError.isInstance(e)) throw e;
    // One line: a YAML error comes with a code frame below its first line.
    return fail('--policy', e.message.split('\n')[0]!.trim().replace(/:$/, ''));
  }
}

/** The egress part of the spec, or no network at all when none of the flags is given. */
export function planEgress(f: EgressFlags, cwd: string): EgressPlan {
  const allow = (f.allow ?? []).map((a) => hostEntry('--allow', a));
  const deny = (f.deny ?? []).map((d) => hostEntry('--deny', d));
  const flagSecrets = (f.secret ?? []).map(parseSecretFlag);
  if (f.policy === undefined && !allow.length && !deny.length && !flagSecrets.length) {
    return { secrets: [], secretOrigin: new Map() };
  }
  const base = f.policy === undefined ? undefined : loadPolicy(f.policy, cwd);

  const secretOrigin = new Map<string, '--secret' | '--policy'>();
  const secrets: SecretInput[] = [];
  for (const s of base?.secrets ?? []) {
    if (!flagSecrets.some((x) => x.name === s.name)) {
      secrets.push(s);
      secretOrigin.set(s.name, '--policy');
    }
  }
  for (const s of flagSecrets) {
    if (secretOrigin.get(s.name) === '--secret') fail('--secret', `${s.name} is given twice`);
    secrets.push(s);
    secretOrigin.set(s.name, '--secret');
  }

  const merged = {
    ...(base?.network ?? {}),
    allow: [...new Set([...(base?.network.allow ?? []), ...allow])],
    deny: [...new Set([...(base?.network.deny ?? []), ...deny])],
  };
  const network = NetworkPolicySchema.safeParse(merged);
  if (!network.success) {
    const issue = network.error.issues[0]!;
    const flag = issue.path[0] === 'deny' ? '--deny' : issue.path[0] === 'allow' ? '--allow' : '--policy';
    fail(flag, issue.message);
  }
  // A secret whose host the policy does not allow could never be used: say which flag fixes it.
  for (const s of secrets) {
    for (const host of s.hosts) {
      if (![443, 80].some((port) => decideHost(network.data, host, port).action === 'allow')) {
        fail(
          secretOrigin.get(s.name)!,
          `${s.name} is bound to ${host}, which the network policy does not allow; add --allow ${host}`,
        );
      }
    }
  }
  return { network: merged, secrets, secretOrigin };
}

/** Fail early (before any sandbox exists) when an env: variable is unset or a file: source is missing. */
export function checkSecretSources(plan: EgressPlan, env: NodeJS.ProcessEnv = process.env): void {
  for (const s of plan.secrets) {
    const flag = plan.secretOrigin.get(s.name) ?? '--secret';
    const v = s.value as SecretValue;
    if ('fromEnv' in v && !env[v.fromEnv]) {
      fail(
        flag,
        `${s.name}: environment variable ${v.fromEnv} is not set (or empty) in airlock's environment`,
      );
    }
    if ('fromFile' in v) {
      let isFile = false;
      try {
        isFile = statSync(v.fromFile).isFile();
      } catch {
        fail(flag, `${s.name}: file ${v.fromFile} does not exist or cannot be read`);
      }
      if (!isFile) fail(flag, `${s.name}: ${v.fromFile} is not a regular file`);
    }
  }
}

/**
 * An error about `secrets.N…` / `secrets.NAME…` raised while creating the sandbox, re-labelled with the
 * flag the secret came from (--secret or --policy); anything else unchanged.
 */
export function relabelSecretError(e: unknown, plan: EgressPlan): unknown {
  if (!AirlockError.isInstance(e) || e.field === undefined) return e;
  const m = /^secrets\.([^.]+)/.exec(e.field);
  if (!m) return e;
  const key = m[1]!;
  const name = /^\d+$/.test(key) ? plan.secrets[Number(key)]?.name : key;
  const flag = name === undefined ? undefined : plan.secretOrigin.get(name);
  if (flag === undefined) return e;
  // A secret that cannot be read is a bad flag value (exit 2), whatever the library's code for it.
  const code = e.code === 'ABORTED' || e.code === 'INTERNAL' ? e.code : 'INVALID_ARGUMENT';
  return new AirlockError(code, e.message, { field: flag, cause: e });
}
