// SECURITY-CRITICAL: exfiltration scanning of what a sandbox sends out. The egress gateway asks these
// questions of every request head, request body and inspected tunnel byte stream of a sandbox with
// secrets or canaries; each answer is a verdict (go on, with what to send; or refuse, with the reason
// the sandbox and the event get). They do no I/O: moving bytes and answering is the gateway's part.
//
// The rules: a secret's real value goes only to its bound host(s), in credential headers only, and
// only over TLS unless the secret opts into plain HTTP (insecureHttp); a sentinel sent anywhere else,
// or any planted canary, is refused as exfiltration (alert); a response is scrubbed of what was put in.
import type { ScrubValue } from './scrub.js';
import type { SecretLease, SecretTransport } from './sentinels.js';

/** Request headers into which a bound secret's real value may be swapped (credential headers only). */
const SWAP_HEADERS = /^(authorization|x-api-key|api-key|x-auth-token|private-token|x-goog-api-key|cookie)$/i;
/** Bytes of the previous chunk kept when scanning a stream (longer than any encoded sentinel). */
export const SCAN_OVERLAP_BYTES = 512;

export type Alert = 'sentinel' | 'canary';

/** A refusal: the reason (sent to the sandbox and put in the event), its code, and an alert if any. */
export interface ExfilRefusal {
  readonly ok: false;
  readonly reason: string;
  readonly code: Alert | 'cleartext_secret';
  readonly alert?: Alert;
}

export interface HeadSwap {
  readonly ok: true;
  /** The headers to send (credential headers swapped; identity coding asked for when swapped). */
  readonly headers: Array<[string, string]>;
  /** Names of the secrets swapped in (for the event). */
  readonly swapped: string[];
  /** What the response must be scrubbed of (fixed now: a late revoke must not unscrub it). */
  readonly scrub: ScrubValue[];
}

/** Why a plain-HTTP request carrying a TLS-only secret's sentinel is refused. */
export function cleartextReason(names: readonly string[], host: string): string {
  return `blocked by Airlock egress policy: the credential ${names.join(', ')} is sent to ${host} only over TLS, and this request is plain HTTP; use https://${host}/, or set insecureHttp: true on the secret to allow cleartext`;
}

/**
 * A request carrying a swapped credential asks for an unencoded, whole response, so that what the
 * upstream reflects can be scrubbed: Accept-Encoding identity, no TE, no Range (a range could cut a
 * reflected value in two responses).
 */
export function identityRequest(headers: ReadonlyArray<[string, string]>): Array<[string, string]> {
  return [
    ...headers.filter(([k]) => !/^(accept-encoding|te|range|if-range)$/i.test(k)),
    ['Accept-Encoding', 'identity'],
  ];
}

/**
 * A request head to `host` (canonical, the host that was decided on): swap this host's bound
 * sentinels in credential headers; any other sentinel (in a header or the path) or a canary is
 * exfiltration; a bound sentinel that may not cross `transport` is refused as cleartext.
 */
export function scanRequestHead(
  lease: SecretLease,
  host: string,
  path: string,
  headers: Array<[string, string]>,
  transport: SecretTransport,
): HeadSwap | ExfilRefusal {
  const s = lease.swapHeaders(host, headers, transport);
  // Real values go only into credential headers: a header the server might echo back (Origin,
  // Referer, X-Anything) keeps the sentinel, so a reflected value cannot reach the sandbox.
  let out = headers.map((h, i) => (SWAP_HEADERS.test(h[0]) ? (s.headers[i] ?? h) : h));
  const swapped = out.some(([k, v], i) => SWAP_HEADERS.test(k) && v !== headers[i]![1]) ? s.swapped : [];
  // A sentinel split across header values is still a sentinel.
  const joined = lease.findSentinels(headers.map(([, v]) => v).join(''));
  const inPath = [
    ...lease.findSentinels(path),
    ...joined.filter((n) => !lease.secretsForHost(host).some((x) => x.name === n)),
  ];
  const unbound = [...new Set([...s.unbound, ...inPath])];
  const canaries = lease.findCanaries(`${path}\n${headers.map(([k, v]) => `${k}: ${v}`).join('\n')}`);
  if (unbound.length || canaries.length) {
    const alert = canaries.length ? 'canary' : 'sentinel';
    const reason = canaries.length
      ? `blocked by Airlock egress policy: the request carries a planted canary credential (${canaries.join(', ')}); this looks like credential exfiltration`
      : `blocked by Airlock egress policy: the credential ${unbound.join(', ')} may only be sent to its bound host(s), not ${host}`;
    return { ok: false, reason, code: alert, alert };
  }
  if (s.cleartext.length)
    return { ok: false, reason: cleartextReason(s.cleartext, host), code: 'cleartext_secret' };
  if (swapped.length) out = identityRequest(out);
  return { ok: true, headers: out, swapped, scrub: [...lease.scrubValuesFor(host), ...s.inserted] };
}

/** The secrets whose sentinels a request body to `host` is looked at for (`body: true` ones). */
export interface BodySecrets {
  /** Bound here, body-swapped, usable over this transport. */
  readonly usable: Array<{ name: string; sentinel: string; value: string }>;
  /** Bound here and body-swapped, whatever the transport. */
  readonly bound: string[];
}

export function bodySecretsFor(
  lease: SecretLease,
  host: string,
  transport: SecretTransport,
  bodySwap: ReadonlySet<string> | undefined,
): BodySecrets {
  return {
    usable: lease.secretsForHost(host, transport).filter((x) => bodySwap?.has(x.name)),
    bound: lease.namesBoundTo(host).filter((n) => bodySwap?.has(n)),
  };
}

/**
 * A whole (buffered) request body to `host`: swap the usable body secrets in, or refuse a body that
 * carries another sentinel, a canary, or a bound sentinel that may not cross this transport.
 * `swapped`: a usable sentinel was present (the response is then asked for unencoded).
 */
export function scanBufferedBody(
  lease: SecretLease,
  host: string,
  body: Buffer,
  secrets: BodySecrets,
): { ok: true; body: Buffer; swapped: boolean } | ExfilRefusal {
  const present = lease.findSentinels(body);
  const usable = new Set(secrets.usable.map((x) => x.name));
  const cleartext = present.filter((n) => secrets.bound.includes(n) && !usable.has(n));
  const unbound = present.filter((n) => !usable.has(n) && !cleartext.includes(n));
  const canaries = lease.findCanaries(body);
  if (unbound.length || canaries.length || cleartext.length) {
    const alert = canaries.length ? 'canary' : unbound.length ? 'sentinel' : undefined;
    const reason = alert
      ? `blocked by Airlock egress policy: the request body carries ${canaries.length ? `a planted canary credential (${canaries.join(', ')})` : `the credential ${unbound.join(', ')}, which may only be sent to its bound host(s)`}`
      : cleartextReason(cleartext, host);
    return alert
      ? { ok: false, reason, code: alert, alert }
      : { ok: false, reason, code: 'cleartext_secret' };
  }
  let out = body;
  for (const x of secrets.usable) out = replaceAll(out, Buffer.from(x.sentinel), Buffer.from(x.value));
  return { ok: true, body: out, swapped: secrets.usable.some((x) => present.includes(x.name)) };
}

/** What a stream scan found: sentinels of secrets not bound to the host, and canaries. */
export interface StreamFinding {
  readonly leaked: string[];
  readonly canaries: string[];
}

/**
 * Scans a byte stream to `host` chunk by chunk, each with the tail of the one before (so a sentinel
 * split across chunks is still found), for sentinels of secrets not bound to `host` and canaries.
 */
export class StreamScanner {
  private tail = Buffer.alloc(0);
  private readonly boundHere: Set<string>;

  constructor(
    private readonly lease: SecretLease,
    host: string,
  ) {
    this.boundHere = new Set(lease.secretsForHost(host).map((x) => x.name));
  }

  /** A finding if `chunk` (with the overlap) carries something that must not leave, else undefined. */
  push(chunk: Buffer): StreamFinding | undefined {
    const window = Buffer.concat([this.tail, chunk]);
    const leaked = this.lease.findSentinels(window).filter((n) => !this.boundHere.has(n));
    const canaries = this.lease.findCanaries(window);
    if (leaked.length || canaries.length) return { leaked, canaries };
    this.tail = window.subarray(Math.max(0, window.length - SCAN_OVERLAP_BYTES));
    return undefined;
  }
}

/** The reason for a request body found carrying a credential while it streamed. */
export function streamedBodyReason(f: StreamFinding): { reason: string; alert: Alert } {
  const alert = f.canaries.length ? 'canary' : 'sentinel';
  const reason = `blocked by Airlock egress policy: the request body carries ${f.canaries.length ? `a planted canary credential (${f.canaries.join(', ')})` : `the credential ${f.leaked.join(', ')}, which may only be sent to its bound host(s)`}`;
  return { reason, alert };
}

/** The reason for a tunnel found carrying a credential (plain protocols only: TLS hides it). */
export function tunnelReason(f: StreamFinding, host: string): { reason: string; alert: Alert } {
  return f.canaries.length
    ? {
        alert: 'canary',
        reason: `blocked by Airlock egress policy: a planted canary credential (${f.canaries.join(', ')}) was sent to ${host}`,
      }
    : {
        alert: 'sentinel',
        reason: `blocked by Airlock egress policy: the credential ${f.leaked.join(', ')} may only be sent to its bound host(s), not ${host}`,
      };
}

function replaceAll(buf: Buffer, from: Buffer, to: Buffer): Buffer {
  const out: Buffer[] = [];
  let i = 0;
  for (let j = buf.indexOf(from, i); j !== -1; j = buf.indexOf(from, i)) {
    out.push(buf.subarray(i, j), to);
    i = j + from.length;
  }
  out.push(buf.subarray(i));
  return Buffer.concat(out);
}
