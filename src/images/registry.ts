// A small, strict client for the OCI distribution API (pull side only), on Node's fetch.
//
// Why not a library from npm: the clients there (docker-registry-client, @snyk/docker-registry-v2-
// client, oci-registry-client) buffer blobs or bring their own HTTP stacks, and none verifies
// digests while streaming, caps sizes before reading, or refuses plain http to non-loopback hosts.
// The pull side of the protocol is four requests; keeping them here keeps every check visible.
//
// - Transport: https, except plain http to loopback registries and to hosts in `insecure`.
// - Auth (distribution token spec): a 401 with `WWW-Authenticate: Bearer realm=…,service=…,scope=…`
//   → GET realm?service&scope (with basic credentials when configured) → bearer token, cached per
//   registry and scope; `Basic` challenges are answered with the credentials directly.
// - Redirects (blob storage elsewhere) are followed by hand, at most 5, under the same transport
//   rule, and credentials are never sent to another origin.
// - Sizes: documents are capped before and while reading; blobs are handed out as streams for the
//   caller to meter against the descriptor's size and digest.
import { Readable } from 'node:stream';
import type { ReadableStream as WebReadableStream } from 'node:stream/web';
import { AirlockError } from '../core/errors.js';
import { MANIFEST_ACCEPT, MAX_DOCUMENT_BYTES } from './manifest.js';
import { isLoopbackHost } from './reference.js';

export interface RegistryCredentials {
  readonly username: string;
  readonly password: string;
}

export interface RegistryClientOptions {
  /** Hosts (`host[:port]`) reached over plain http although not loopback. */
  readonly insecure?: readonly string[];
  /** Credentials for a registry host, if any. */
  readonly credentials?: (registry: string) => RegistryCredentials | undefined;
}

const MAX_REDIRECTS = 5;
const MAX_TOKEN_BYTES = 64 * 1024;

function regError(msg: string, cause?: unknown): AirlockError {
  return new AirlockError('IMAGE_REGISTRY_ERROR', msg, cause === undefined ? {} : { cause });
}

/** Parses `Scheme k="v", k2="v2"` (the only challenge form registries send). */
export function parseChallenge(header: string): { scheme: string; params: Record<string, string> } {
  const m = /^\s*(\w+)\s*(.*)$/s.exec(header);
  if (!m) return { scheme: '', params: {} };
  const params: Record<string, string> = {};
  for (const p of m[2]!.matchAll(/(\w+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^,\s]*))/g)) {
    params[p[1]!.toLowerCase()] = (p[2] ?? p[3] ?? '').replace(/\\(.)/g, '$1');
  }
  return { scheme: m[1]!.toLowerCase(), params };
}

/** Reads a body up to `max` bytes (refusing a larger Content-Length before reading anything). */
export async function readCapped(res: Response, max: number, what: string): Promise<Buffer> {
  const declared = Number(res.headers.get('content-length') ?? NaN);
  if (declared > max) {
    await res.body?.cancel();
    throw regError(`${what} is ${declared} bytes, over the ${max}-byte cap`);
  }
  const chunks: Buffer[] = [];
  let n = 0;
  for await (const c of res.body ?? []) {
    n += (c as Uint8Array).length;
    if (n > max) {
      await res.body?.cancel().catch(() => undefined);
      throw regError(`${what} is over the ${max}-byte cap`);
    }
    chunks.push(Buffer.from(c as Uint8Array));
  }
  return Buffer.concat(chunks);
}

export class RegistryClient {
  private readonly tokens = new Map<string, string>();

  constructor(private readonly opts: RegistryClientOptions = {}) {}

  private allowed(url: URL): boolean {
    if (url.protocol === 'https:') return true;
    if (url.protocol !== 'http:') return false;
    return isLoopbackHost(url.host) || (this.opts.insecure ?? []).includes(url.host);
  }

  private base(registry: string): string {
    const http = isLoopbackHost(registry) || (this.opts.insecure ?? []).includes(registry);
    return `${http ? 'http' : 'https'}://${registry}`;
  }

  /**
   * GET `path` on `registry` with auth and hand-followed redirects. `scope` is the token scope
   * (`repository:<name>:pull`). Returns the final response (any status; the caller judges).
   */
  private async get(
    registry: string,
    path: string,
    scope: string,
    headers: Record<string, string>,
    signal?: AbortSignal,
  ): Promise<Response> {
    const origin = new URL(this.base(registry)).origin;
    let url = new URL(path, origin);
    for (let hop = 0, retried = false; ;) {
      if (!this.allowed(url)) {
        throw regError(
          `refusing ${url.protocol}//${url.host}: plain http is only for loopback registries or hosts listed as insecure`,
        );
      }
      const h: Record<string, string> = { ...headers };
      const token = this.tokens.get(`${registry} ${scope}`);
      if (url.origin === origin && token) h.authorization = token;
      let res: Response;
      try {
        res = await fetch(url, { headers: h, redirect: 'manual', signal: signal ?? null });
      } catch (e) {
        signal?.throwIfAborted();
        throw regError(`cannot reach registry ${registry}: ${(e as Error).message}`, e);
      }
      if (res.status === 401 && url.origin === origin && !retried) {
        await res.body?.cancel();
        await this.authenticate(registry, scope, res.headers.get('www-authenticate') ?? '', signal);
        retried = true;
        continue;
      }
      if (res.status === 401 || res.status === 403) {
        await res.body?.cancel();
        throw new AirlockError(
          'IMAGE_AUTH_FAILED',
          `registry ${registry} refused access to ${path} (HTTP ${res.status}): check the credentials for ${registry}`,
        );
      }
      if ([301, 302, 303, 307, 308].includes(res.status)) {
        await res.body?.cancel();
        const loc = res.headers.get('location');
        if (!loc || ++hop > MAX_REDIRECTS)
          throw regError(`registry ${registry}: bad or too many redirects for ${path}`);
        url = new URL(loc, url);
        continue;
      }
      return res;
    }
  }

  private async authenticate(
    registry: string,
    scope: string,
    header: string,
    signal?: AbortSignal,
  ): Promise<void> {
    const { scheme, params } = parseChallenge(header);
    const creds = this.opts.credentials?.(registry);
    const basic = creds
      ? `Basic ${Buffer.from(`${creds.username}:${creds.password}`).toString('base64')}`
      : undefined;
    if (scheme === 'basic') {
      if (!basic)
        throw new AirlockError(
          'IMAGE_AUTH_FAILED',
          `registry ${registry} asks for credentials and none are configured for it`,
        );
      this.tokens.set(`${registry} ${scope}`, basic);
      return;
    }
    if (scheme !== 'bearer' || !params.realm) {
      throw new AirlockError(
        'IMAGE_AUTH_FAILED',
        `registry ${registry} asks for authentication this client does not speak ("${header.slice(0, 100)}")`,
      );
    }
    let realm: URL;
    try {
      realm = new URL(params.realm);
    } catch {
      throw regError(`registry ${registry} names an invalid token realm`);
    }
    if (!this.allowed(realm)) {
      throw regError(
        `registry ${registry}'s token realm ${realm.origin} is plain http on a non-loopback host: refused`,
      );
    }
    if (params.service) realm.searchParams.set('service', params.service);
    realm.searchParams.set('scope', params.scope ?? scope);
    let res: Response;
    try {
      res = await fetch(realm, {
        headers: basic ? { authorization: basic } : {},
        redirect: 'error',
        signal: signal ?? null,
      });
    } catch (e) {
      signal?.throwIfAborted();
      throw regError(`cannot reach the token service of ${registry}: ${(e as Error).message}`, e);
    }
    if (res.status === 401 || res.status === 403) {
      await res.body?.cancel();
      throw new AirlockError(
        'IMAGE_AUTH_FAILED',
        `the token service of ${registry} refused ${creds ? `the credentials of "${creds.username}"` : 'anonymous access'} (HTTP ${res.status})`,
      );
    }
    if (!res.ok) throw regError(`the token service of ${registry} answered HTTP ${res.status}`);
    let body: { token?: unknown; access_token?: unknown };
    try {
      body = JSON.parse(
        (await readCapped(res, MAX_TOKEN_BYTES, 'token response')).toString('utf8'),
      ) as typeof body;
    } catch (e) {
      if (AirlockError.isInstance(e)) throw e;
      throw regError(`the token service of ${registry} answered no JSON`);
    }
    const token = typeof body.token === 'string' ? body.token : body.access_token;
    if (typeof token !== 'string' || token === '' || /[\r\n]/.test(token)) {
      throw regError(`the token service of ${registry} answered no token`);
    }
    this.tokens.set(`${registry} ${scope}`, `Bearer ${token}`);
  }

  /** A manifest or index by tag or digest: the raw bytes (capped), its content type and claimed digest. */
  async manifest(
    registry: string,
    repository: string,
    reference: string,
    signal?: AbortSignal,
  ): Promise<{ bytes: Buffer; contentType: string | undefined; claimedDigest: string | undefined }> {
    const res = await this.get(
      registry,
      `/v2/${repository}/manifests/${reference}`,
      `repository:${repository}:pull`,
      { accept: MANIFEST_ACCEPT },
      signal,
    );
    if (res.status === 404) {
      await res.body?.cancel();
      throw new AirlockError(
        'IMAGE_NOT_FOUND',
        `image ${registry}/${repository}:${reference} not found in the registry: check the name and tag`,
        { field: 'image' },
      );
    }
    if (!res.ok) {
      await res.body?.cancel();
      throw regError(
        `registry ${registry} answered HTTP ${res.status} for the manifest of ${repository}:${reference}`,
      );
    }
    const bytes = await readCapped(res, MAX_DOCUMENT_BYTES, `manifest of ${repository}:${reference}`);
    return {
      bytes,
      contentType: res.headers.get('content-type') ?? undefined,
      claimedDigest: res.headers.get('docker-content-digest') ?? undefined,
    };
  }

  /** A blob as a stream (the caller meters it against its descriptor). Refuses a larger Content-Length first. */
  async blob(
    registry: string,
    repository: string,
    digest: string,
    size: number,
    signal?: AbortSignal,
  ): Promise<Readable> {
    const res = await this.get(
      registry,
      `/v2/${repository}/blobs/${digest}`,
      `repository:${repository}:pull`,
      {},
      signal,
    );
    if (res.status === 404) {
      await res.body?.cancel();
      throw new AirlockError(
        'IMAGE_NOT_FOUND',
        `blob ${digest} of ${registry}/${repository} is missing from the registry`,
      );
    }
    if (!res.ok || !res.body) {
      await res.body?.cancel();
      throw regError(`registry ${registry} answered HTTP ${res.status} for blob ${digest}`);
    }
    const declared = Number(res.headers.get('content-length') ?? NaN);
    if (declared > size) {
      await res.body.cancel();
      throw new AirlockError(
        'IMAGE_DIGEST_MISMATCH',
        `blob ${digest} is ${declared} bytes, but the manifest says ${size}`,
      );
    }
    return Readable.fromWeb(res.body as WebReadableStream<Uint8Array>);
  }
}
