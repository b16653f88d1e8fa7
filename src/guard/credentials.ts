// SECURITY-CRITICAL: shapes of common credentials (cloud keys, GitHub/Slack/npm tokens, AI provider keys,
// private key blocks, JWTs, secrets in assignments and URLs), used by the output guard to redact text a
// sandboxed server returns. Pure: no I/O, no state. Every regex is linear on hostile input: each starts
// at a literal prefix or behind a boundary lookbehind, every quantifier is bounded, and repeated groups
// are separated by characters their bodies cannot match, so a 1 MiB adversarial text scans in one pass.
//
// Deliberately left out (too many false positives in ordinary tool output): bare 40-character base64
// strings (AWS secret keys are matched only after an `aws_secret_access_key`-like name), hex strings
// (git SHAs, digests), UUIDs, and `token=` assignments whose name says pagination (next_token, …).
import { z } from 'zod';

export interface CredentialPattern {
  readonly id: string;
  readonly description: string;
  /** Matches exactly the credential; context (a variable name) sits in a lookbehind. No `g` flag. */
  readonly regex: RegExp;
  /** A further check on the matched text, for what a regex cannot say (a JWT header is JSON). */
  readonly validate?: (match: string) => boolean;
}

export interface CredentialMatch {
  patternId: string;
  /** UTF-16 offsets into the text: text.slice(start, end) is the credential. */
  start: number;
  end: number;
}

/** Not preceded by a character that could continue a token. */
const START = '(?<![A-Za-z0-9_-])';
const END = '(?![A-Za-z0-9_-])';

const JwtHeader = z.looseObject({ alg: z.string() });

/** The first segment decodes (base64url) to a JSON object with a string "alg". */
function isJwt(match: string): boolean {
  const header = match.slice(0, match.indexOf('.'));
  try {
    return JwtHeader.safeParse(JSON.parse(Buffer.from(header, 'base64url').toString('utf8'))).success;
  } catch {
    return false;
  }
}

/** Real secrets mix letters and digits; placeholders (`${TOKEN}`, `changeme`, `xxxx…`) do not. */
function looksRandom(value: string): boolean {
  return /[A-Za-z]/.test(value) && /[0-9]/.test(value) && !/^(?:x+|\*+|\.+)$/i.test(value);
}

const PRIVATE_KEY_LABEL = '[A-Z0-9 ]{0,48}PRIVATE KEY(?: BLOCK)?-----';
/** A PEM line break: real, or escaped as in JSON / a shell string. */
const PEM_BREAK = '(?:[ \\t]*(?:\\r?\\n|\\\\r\\\\n|\\\\n))';
const PEM_LINE = '(?:[A-Za-z0-9-]{1,40}: [^\\r\\n\\\\]{0,160}|[A-Za-z0-9+/=]{1,160})';

const PATTERNS: readonly CredentialPattern[] = [
  {
    id: 'private-key',
    description: 'private key block (PEM, OpenSSH, PGP)',
    // The whole block up to its END line; without an END line (a truncated key), the key lines that follow.
    regex: new RegExp(
      `-----BEGIN ${PRIVATE_KEY_LABEL}(?:(?:[^-]|-(?!----)){0,32768}-----END ${PRIVATE_KEY_LABEL}|(?:${PEM_BREAK}{1,4}${PEM_LINE}){0,1024})`,
    ),
  },
  {
    id: 'jwt',
    description: 'JSON Web Token',
    regex: new RegExp(
      `${START}e[wy][A-Za-z0-9_-]{6,4096}\\.[A-Za-z0-9_-]{2,16384}\\.[A-Za-z0-9_-]{0,8192}${END}`,
    ),
    validate: isJwt,
  },
  {
    id: 'aws-access-key-id',
    description: 'AWS access key id',
    regex: /(?<![A-Za-z0-9])(?:AKIA|ASIA|ABIA|ACCA|A3T[A-Z0-9])[A-Z0-9]{16}(?![A-Za-z0-9])/,
  },
  {
    id: 'aws-secret-access-key',
    description: 'AWS secret access key (after its variable name)',
    regex:
      /(?<=(?:secret[_-]?access[_-]?key|aws[_-]?secret[_-]?key)["']?[ \t]{0,4}[:=][ \t]{0,4}["']?)[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])/i,
  },
  {
    id: 'github-token',
    description: 'GitHub token',
    regex:
      /(?<![A-Za-z0-9_])(?:gh[pousr]_[A-Za-z0-9]{36,251}|github_pat_[A-Za-z0-9_]{40,255})(?![A-Za-z0-9_])/,
  },
  {
    id: 'slack-token',
    description: 'Slack token',
    regex: /(?<![A-Za-z0-9])xox[abprs]-[A-Za-z0-9]{1,64}(?:-[A-Za-z0-9]{1,64}){1,6}(?![A-Za-z0-9-])/,
    validate: (m) => m.length >= 24,
  },
  {
    id: 'slack-webhook',
    description: 'Slack incoming webhook URL',
    regex:
      /https:\/\/hooks\.slack\.com\/(?:services|workflows|triggers)\/[A-Za-z0-9_/-]{20,256}(?![A-Za-z0-9_/-])/,
  },
  {
    id: 'google-api-key',
    description: 'Google API key',
    regex: new RegExp(`${START}AIza[A-Za-z0-9_-]{35}${END}`),
  },
  {
    id: 'anthropic-key',
    description: 'Anthropic API key',
    regex: new RegExp(`${START}sk-ant-[a-z0-9]{2,16}-[A-Za-z0-9_-]{32,256}${END}`),
  },
  {
    id: 'openai-key',
    description: 'OpenAI API key',
    regex: new RegExp(`${START}sk-(?:(?:proj|svcacct|admin)-[A-Za-z0-9_-]{40,256}|[A-Za-z0-9]{32,64})${END}`),
    validate: looksRandom,
  },
  {
    id: 'stripe-key',
    description: 'Stripe live secret or restricted key',
    regex: /(?<![A-Za-z0-9_])[sr]k_live_[A-Za-z0-9]{20,247}(?![A-Za-z0-9_])/,
  },
  {
    id: 'npm-token',
    description: 'npm access token',
    regex: /(?<![A-Za-z0-9_])npm_[A-Za-z0-9]{36}(?![A-Za-z0-9_])/,
  },
  {
    id: 'url-password',
    description: 'password in a URL (scheme://user:password@host)',
    regex: /(?<=[A-Za-z][A-Za-z0-9+.-]{0,20}:\/\/[^\s/:@]{1,128}:)[^\s/@]{1,256}(?=@)/,
  },
  {
    id: 'authorization-header',
    description: 'Bearer/Basic/Token credentials',
    regex:
      /(?<=(?<![A-Za-z0-9])(?:Bearer|Basic|Token)[ \t]{1,4})[A-Za-z0-9._~+/-]{12,4096}={0,2}(?![A-Za-z0-9._~+/=-])/i,
    validate: looksRandom,
  },
  {
    id: 'secret-assignment',
    description: 'value assigned to a password/secret/token/API key name',
    // `password = "…"`, `"client_secret": "…"`, `API_KEY=…`, `?token=…`; not next_token & co (pagination).
    regex:
      /(?<=(?<![A-Za-z0-9])(?<!(?:next|page|continuation|cursor|sync|resume|csrf)[_-]?)(?:password|passwd|passphrase|secret|token|api[_-]?key|private[_-]?key)["']?[ \t]{0,3}[:=][ \t]{0,3}["']?)[A-Za-z0-9_+/=.~!@#$%^*-]{8,200}(?![A-Za-z0-9_+/=.~!@#$%^*-])/i,
    validate: (m) => looksRandom(m) && !/^(?:\$|%|<|\{)/.test(m),
  },
];

/** The credential shapes, in priority order (an earlier pattern wins a tie on start and length). */
export const CREDENTIAL_PATTERNS: readonly CredentialPattern[] = Object.freeze(
  PATTERNS.map((p) => Object.freeze({ ...p })),
);

/** Global copies for matchAll (which clones them, so no lastIndex is shared between calls). */
const GLOBAL = PATTERNS.map((p) => ({ pattern: p, regex: new RegExp(p.regex.source, `${p.regex.flags}g`) }));

/**
 * Every credential-shaped span of `text`, sorted by start and non-overlapping: where matches overlap, the
 * one starting first wins, then the longer one, then the earlier pattern.
 */
export function findCredentials(text: string): CredentialMatch[] {
  const all: Array<CredentialMatch & { rank: number }> = [];
  GLOBAL.forEach(({ pattern, regex }, rank) => {
    for (const m of text.matchAll(regex)) {
      if (m[0].length === 0 || (pattern.validate !== undefined && !pattern.validate(m[0]))) continue;
      all.push({ patternId: pattern.id, start: m.index, end: m.index + m[0].length, rank });
    }
  });
  all.sort((a, b) => a.start - b.start || b.end - a.end || a.rank - b.rank);
  const out: CredentialMatch[] = [];
  let until = 0;
  for (const { patternId, start, end } of all) {
    if (start < until) continue;
    out.push({ patternId, start, end });
    until = end;
  }
  return out;
}
