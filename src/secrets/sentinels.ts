// SECURITY-CRITICAL: holds the real secret values of one sandbox and decides where they may go. The
// sandbox only ever sees sentinels; the egress proxy swaps a sentinel for its real value ONLY in requests
// to a host the secret is bound to (exact name), and only while the lease is alive. Real values never
// leave this object except through swapHeaders / secretsForHost for a bound host: not through env(),
// errors, toString, JSON or util.inspect.
import { randomBytes, randomInt } from 'node:crypto';
import { isAbsolute } from 'node:path';
import { inspect } from 'node:util';
import { AirlockError } from '../core/errors.js';
import { canonicalHost } from '../core/address.js';
import type { SecretSpec } from '../policy/network.js';
import { resolveSecretValue, type ResolveSecretOptions } from './resolve.js';
import { Needle, prepareHaystack } from './detect.js';
import type { ScrubValue } from './scrub.js';

export const SENTINEL_PREFIX = 'airlock_sentinel_';
/** Random part of a sentinel: 24 base32 characters = 120 bits. */
const SENTINEL_RANDOM_CHARS = 24;
const BASE32 = 'abcdefghijklmnopqrstuvwxyz234567';
const ENV_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;

// ---- canaries -----------------------------------------------------------------------------------

export type CanaryFormat =
  'github' | 'aws-access-key' | 'aws-secret-key' | 'openai' | 'anthropic' | 'generic';

export interface CanarySpec {
  /** The variable name (kind 'env') or a label (kind 'file'). */
  name: string;
  /** 'env': set as an environment variable; 'file': written to `path` inside the sandbox. */
  kind: 'env' | 'file';
  /** Absolute path inside the sandbox, for kind 'file'. */
  path?: string;
  /** Token shape; inferred from the name when absent (GITHUB_* → github, AWS_* → aws-…, …). */
  format?: CanaryFormat;
}

/** A planted fake credential. Its token is worthless, so it may be shown; any appearance in egress is an alert. */
export interface Canary {
  name: string;
  kind: 'env' | 'file';
  path?: string;
  format: CanaryFormat;
  token: string;
}

const BASE62 = '0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz';
const pick = (alphabet: string, n: number): string =>
  Array.from({ length: n }, () => alphabet[randomInt(alphabet.length)]).join('');

const CRC_TABLE = Array.from({ length: 256 }, (_, n) => {
  let c = n;
  for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
  return c >>> 0;
});
function crc32(s: string): number {
  let c = 0xffffffff;
  for (const b of Buffer.from(s, 'latin1')) c = CRC_TABLE[(c ^ b) & 0xff]! ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
}
function base62(n: number, width: number): string {
  let out = '';
  do {
    out = BASE62[n % 62] + out;
    n = Math.floor(n / 62);
  } while (n > 0);
  return out.padStart(width, '0');
}

function inferFormat(name: string): CanaryFormat {
  const n = name.toUpperCase();
  if (/AWS_SECRET|SECRET_ACCESS_KEY/.test(n)) return 'aws-secret-key';
  if (/AWS|ACCESS_KEY_ID/.test(n)) return 'aws-access-key';
  if (/GITHUB|(^|_)GH_|GIT_TOKEN/.test(n)) return 'github';
  if (/ANTHROPIC|CLAUDE/.test(n)) return 'anthropic';
  if (/OPENAI/.test(n)) return 'openai';
  return 'generic';
}

/** A fake token shaped like the real thing, so that secret scanners and curious code take it for one. */
export function fakeToken(format: CanaryFormat): string {
  switch (format) {
    case 'github': {
      // Like a classic PAT: 30 random base62 characters and a 6-character base62 CRC32 of them.
      const body = pick(BASE62, 30);
      return `ghp_${body}${base62(crc32(body), 6)}`;
    }
    case 'aws-access-key':
      return `AKIA${pick('ABCDEFGHIJKLMNOPQRSTUVWXYZ234567', 16)}`;
    case 'aws-secret-key':
      return pick(`${BASE62}+/`, 40);
    case 'openai':
      return `sk-${pick(BASE62, 48)}`;
    case 'anthropic':
      return `sk-ant-api03-${pick(`${BASE62}-_`, 93)}AA`;
    case 'generic':
      return pick('0123456789abcdef', 40);
  }
}

// ---- the lease ----------------------------------------------------------------------------------

export interface SecretLeaseOptions extends Omit<ResolveSecretOptions, 'name'> {
  canaries?: CanarySpec[];
}

export interface HeaderSwapResult {
  /** The headers to send upstream (a new array; the input is not modified). */
  headers: Array<[string, string]>;
  /** Names of the secrets whose sentinel was replaced by the real value. */
  swapped: string[];
  /**
   * Names of this lease's sentinels present in the headers (raw, base64 or percent-encoded) that were NOT
   * swapped because the secret is not bound to this host, or because the lease is revoked. The caller
   * blocks the request and audits it as an exfiltration attempt.
   */
  unbound: string[];
  /** The lease was revoked (the sandbox is gone): nothing is swapped any more. */
  revoked: boolean;
  /**
   * Names of secrets bound to this host whose sentinel is in the headers but which were NOT swapped
   * because the connection is plain HTTP and the secret does not opt into it (`insecureHttp`). The
   * caller refuses the request: the credential would cross the network in cleartext.
   */
  cleartext: string[];
  /**
   * Every exact text this swap put into a header that the sandbox did not send: each changed header
   * value (and the base64 token of a re-encoded Basic header), with what the sandbox sent instead.
   * The response scrubber looks for these besides the bare values.
   */
  inserted: ScrubValue[];
}

/** The transport a request goes upstream on: only 'tls' gets secrets, unless one opts into 'plain'. */
export type SecretTransport = 'tls' | 'plain';

interface Entry {
  readonly name: string;
  readonly hosts: ReadonlySet<string>;
  readonly sentinel: string;
  readonly needle: Needle;
  /** Also swapped into plain-HTTP requests (the value crosses the network in cleartext). */
  readonly insecureHttp: boolean;
  /** undefined once the lease is revoked. */
  value: string | undefined;
}

function newSentinel(name: string): string {
  const bytes = randomBytes(15); // 120 bits → exactly 24 base32 characters
  let bits = 0;
  let acc = 0;
  let out = '';
  for (const b of bytes) {
    acc = (acc << 8) | b;
    bits += 8;
    while (bits >= 5) {
      out += BASE32[(acc >>> (bits - 5)) & 31];
      bits -= 5;
    }
  }
  if (out.length !== SENTINEL_RANDOM_CHARS) throw new AirlockError('INTERNAL', 'sentinel length mismatch');
  return `${SENTINEL_PREFIX}${name.toLowerCase()}_${out}`;
}

/** The host as a bound-host key: canonical name, or undefined for addresses and invalid input. */
function hostKey(host: string): string | undefined {
  const c = canonicalHost(host);
  return c.kind === 'name' ? c.name : undefined;
}

const BASIC = /^(basic)([ \t]+)([A-Za-z0-9+/]+={0,2})([ \t]*)$/i;

/**
 * The secrets of one sandbox, from creation until revoke(). Created per sandbox: every lease has its own
 * random sentinels, so a sentinel seen in one sandbox's egress means nothing in another's.
 */
export class SecretLease {
  readonly #entries: readonly Entry[];
  readonly #canaries: readonly (Canary & { needle: Needle })[];
  #revoked = false;

  private constructor(entries: Entry[], canaries: (Canary & { needle: Needle })[]) {
    this.#entries = entries;
    this.#canaries = canaries;
  }

  /** Resolve every secret's real value (env, file or command) and mint its sentinel. */
  static async create(
    specs: ReadonlyArray<
      Pick<SecretSpec, 'name' | 'value' | 'hosts'> & Partial<Pick<SecretSpec, 'insecureHttp'>>
    >,
    opts: SecretLeaseOptions = {},
  ): Promise<SecretLease> {
    const { canaries: canarySpecs = [], ...resolveOpts } = opts;
    const names = new Set<string>();
    const checkName = (name: string, what: string, field: string): void => {
      if (!ENV_NAME.test(name)) {
        throw new AirlockError('INVALID_SPEC', `${what} name "${name}" must be letters, digits and _`, {
          field,
        });
      }
      if (names.has(name)) {
        throw new AirlockError('INVALID_SPEC', `${what} name "${name}" is used twice`, { field });
      }
      names.add(name);
    };

    const plans = specs.map((spec, i) => {
      checkName(spec.name, 'secret', `secrets.${i}.name`);
      const hosts = spec.hosts.map((h, j) => {
        const key = hostKey(h);
        if (key === undefined) {
          throw new AirlockError(
            'INVALID_SPEC',
            `secret ${spec.name}: "${h}" is not a host name; secrets are bound to exact host names`,
            { field: `secrets.${spec.name}.hosts.${j}` },
          );
        }
        return key;
      });
      if (hosts.length === 0) {
        throw new AirlockError('INVALID_SPEC', `secret ${spec.name}: hosts must list at least one host`, {
          field: `secrets.${spec.name}.hosts`,
        });
      }
      return { spec, hosts };
    });

    const canaries = canarySpecs.map((c, i) => {
      checkName(c.name, 'canary', `canaries.${i}.name`);
      if (c.kind === 'file' && (c.path === undefined || !isAbsolute(c.path))) {
        throw new AirlockError('INVALID_SPEC', `canary ${c.name}: a file canary needs an absolute path`, {
          field: `canaries.${i}.path`,
        });
      }
      const format = c.format ?? inferFormat(c.name);
      const token = fakeToken(format);
      const canary: Canary = { name: c.name, kind: c.kind, format, token };
      if (c.kind === 'file') canary.path = c.path;
      return { ...canary, needle: new Needle(token) };
    });

    const entries: Entry[] = [];
    for (const { spec, hosts } of plans) {
      const value = await resolveSecretValue(spec.value, { ...resolveOpts, name: spec.name });
      // A line break in a header value would let the value smuggle extra headers or requests.
      // eslint-disable-next-line no-control-regex
      if (/[\x00-\x08\x0a-\x1f\x7f]/.test(value)) {
        throw new AirlockError(
          'INVALID_SPEC',
          `secret ${spec.name}: the value contains a line break or control character and cannot be sent in an HTTP header`,
          { field: `secrets.${spec.name}.value` },
        );
      }
      const sentinel = newSentinel(spec.name);
      entries.push({
        name: spec.name,
        hosts: new Set(hosts),
        sentinel,
        needle: new Needle(sentinel),
        value,
        insecureHttp: spec.insecureHttp === true,
      });
    }
    return new SecretLease(entries, canaries);
  }

  /** NAME → sentinel for every secret, plus NAME → token for every env canary. Never a real value. */
  env(): Record<string, string> {
    const env: Record<string, string> = {};
    for (const e of this.#entries) env[e.name] = e.sentinel;
    for (const c of this.#canaries) if (c.kind === 'env') env[c.name] = c.token;
    return env;
  }

  /**
   * What output filters must redact for this sandbox: each secret's real value and sentinel, and
   * each canary token. For the operator's own guards (the MCP output guard), never for the sandbox.
   * Take it at creation: revoke() forgets the real values (the caller keeps its copy to scrub late results).
   */
  redactionSet(): {
    secrets: Array<{ name: string; value: string }>;
    sentinels: Array<{ name: string; value: string }>;
    canaries: Array<{ name: string; value: string }>;
  } {
    return {
      secrets: this.#entries.flatMap((e) =>
        e.value === undefined ? [] : [{ name: e.name, value: e.value }],
      ),
      sentinels: this.#entries.map((e) => ({ name: e.name, value: e.sentinel })),
      canaries: this.#canaries.map((c) => ({ name: c.name, value: c.token })),
    };
  }

  /** Every host some secret is bound to (canonical names): the hosts the proxy must intercept. */
  boundHosts(): Set<string> {
    return new Set(this.#entries.flatMap((e) => [...e.hosts]));
  }

  get revoked(): boolean {
    return this.#revoked;
  }

  /**
   * The secrets bound to `host` (exact name, case-insensitive) that may be sent over `transport`, e.g.
   * for body swapping; none once revoked. Over 'plain' only the secrets with `insecureHttp` qualify.
   */
  secretsForHost(
    host: string,
    transport: SecretTransport = 'tls',
  ): Array<{ name: string; sentinel: string; value: string }> {
    if (this.#revoked) return [];
    const key = hostKey(host);
    if (key === undefined) return [];
    return this.#entries.flatMap((e) =>
      e.value !== undefined && e.hosts.has(key) && (transport === 'tls' || e.insecureHttp)
        ? [{ name: e.name, sentinel: e.sentinel, value: e.value }]
        : [],
    );
  }

  /** Names of the secrets bound to `host`, whatever the transport (also after revoke). */
  namesBoundTo(host: string): string[] {
    const key = hostKey(host);
    return key === undefined ? [] : this.#entries.filter((e) => e.hosts.has(key)).map((e) => e.name);
  }

  /**
   * What a response from `host` must be scrubbed of: each bound secret's real value, which the sandbox
   * reads back as its sentinel. Whatever the transport: an upstream may reflect a value stored earlier.
   */
  scrubValuesFor(host: string): ScrubValue[] {
    return this.secretsForHost(host).map((s) => ({ name: s.name, value: s.value, replacement: s.sentinel }));
  }

  /**
   * Replace bound sentinels with their real values in request headers for `host`, which must be the host
   * the proxy actually connects to (the vetted CONNECT/SNI/URL host), never a Host header that differs.
   * Every occurrence in every value is replaced, and inside `Authorization: Basic …` the credentials are
   * decoded, swapped and re-encoded.
   */
  swapHeaders(
    host: string,
    headers: ReadonlyArray<readonly [string, string]>,
    transport: SecretTransport = 'tls',
  ): HeaderSwapResult {
    const bound = this.secretsForHost(host, transport);
    const swapped = new Set<string>();
    const inserted: ScrubValue[] = [];
    const out: Array<[string, string]> = headers.map(([name, value]) => {
      let v = value;
      const inHeader: string[] = [];
      for (const s of bound) {
        if (v.includes(s.sentinel)) {
          v = v.split(s.sentinel).join(s.value);
          swapped.add(s.name);
          inHeader.push(s.name);
        }
      }
      if (bound.length > 0 && name.toLowerCase() === 'authorization') {
        const m = BASIC.exec(v);
        if (m) {
          // latin1 keeps the decoded bytes exactly; the value goes back in as its UTF-8 bytes.
          let creds = Buffer.from(m[3]!, 'base64').toString('latin1');
          let changed = false;
          for (const s of bound) {
            if (creds.includes(s.sentinel)) {
              creds = creds.split(s.sentinel).join(Buffer.from(s.value, 'utf8').toString('latin1'));
              swapped.add(s.name);
              inHeader.push(s.name);
              changed = true;
            }
          }
          if (changed) {
            const token = Buffer.from(creds, 'latin1').toString('base64');
            // The token Airlock built: a reflection of it decodes to the real value.
            inserted.push({ name: inHeader[0]!, value: token, replacement: m[3]! });
            v = `${m[1]}${m[2]}${token}${m[4]}`;
          }
        }
      }
      if (v !== value) inserted.push({ name: inHeader[0]!, value: v, replacement: value });
      return [name, v];
    });
    const text = headers.map(([n, v]) => `${n}: ${v}\r\n`).join('');
    const present = this.findSentinels(text);
    const hereNames = new Set(this.namesBoundTo(host));
    const usable = new Set(bound.map((s) => s.name));
    // Bound here but not for this transport: refused as cleartext, not reported as exfiltration.
    const cleartext = this.#revoked ? [] : present.filter((n) => hereNames.has(n) && !usable.has(n));
    const unbound = present.filter((n) => !usable.has(n) && !cleartext.includes(n));
    return { headers: out, swapped: [...swapped], unbound, revoked: this.#revoked, cleartext, inserted };
  }

  /**
   * Names of this lease's secrets whose sentinel appears in `text` — raw (any case), base64 / base64url
   * at any alignment, hex, or percent-encoded (up to three times). Works after revoke too. Best effort by
   * design: this is the exfiltration alarm, the real protection is that values are swapped only for
   * bound hosts.
   */
  findSentinels(text: string | Buffer): string[] {
    const hay = prepareHaystack(text);
    return this.#entries.filter((e) => e.needle.foundIn(hay)).map((e) => e.name);
  }

  /** The planted canaries (fake tokens; safe to show). */
  get canaries(): readonly Canary[] {
    return this.#canaries.map(({ needle: _needle, ...c }) => ({ ...c }));
  }

  /** Files to plant in the sandbox for the 'file' canaries. */
  canaryFiles(): Array<{ name: string; path: string; content: string }> {
    return this.#canaries.flatMap((c) =>
      c.kind === 'file' && c.path !== undefined
        ? [{ name: c.name, path: c.path, content: `${c.token}\n` }]
        : [],
    );
  }

  /** Names of the canaries whose token appears in `text` (same encodings as findSentinels). */
  findCanaries(text: string | Buffer): string[] {
    if (this.#canaries.length === 0) return [];
    const hay = prepareHaystack(text);
    return this.#canaries.filter((c) => c.needle.foundIn(hay)).map((c) => c.name);
  }

  /** The sandbox is gone: stop swapping and drop the real values. Idempotent. */
  revoke(): void {
    this.#revoked = true;
    for (const e of this.#entries) e.value = undefined;
  }

  [Symbol.dispose](): void {
    this.revoke();
  }

  /** Redacted: names and hosts only. */
  toJSON(): {
    secrets: Array<{ name: string; hosts: string[] }>;
    canaries: Array<{ name: string; kind: 'env' | 'file'; path?: string }>;
    revoked: boolean;
  } {
    return {
      secrets: this.#entries.map((e) => ({ name: e.name, hosts: [...e.hosts] })),
      canaries: this.#canaries.map((c) =>
        c.path === undefined ? { name: c.name, kind: c.kind } : { name: c.name, kind: c.kind, path: c.path },
      ),
      revoked: this.#revoked,
    };
  }

  toString(): string {
    const names = this.#entries.map((e) => e.name).join(', ');
    return `SecretLease(${names || 'no secrets'}${this.#revoked ? '; revoked' : ''})`;
  }

  [inspect.custom](): string {
    return `SecretLease ${inspect(this.toJSON(), { depth: 4 })}`;
  }
}
