// SECURITY-CRITICAL: the envd access token, what the e2b SDK sends as X-Access-Token on every
// in-sandbox request (the control API's key is never sent there). It is
//   <tenant, base64url> "." <API key id> "." <HMAC-SHA256(secret, fields), base64url>
// where the MAC covers a domain tag, the tenant, the key id and the sandbox id, each length-prefixed
// (so no separator or field content can make two different field lists hash alike). It is bound to
// one sandbox, to the tenant that owns it and to the API key that asked the control API for it
// (create, connect, resume, info): the envd API checks on every request that this key still exists
// and is not revoked, so revoking a key ends the envd access it handed out. It needs no stored
// session and stays valid across server restarts while the secret is kept.
//
// Parsing is strict: the token must be exactly the one this code would mint for the fields it
// names (compared as strings, in constant time), so no other spelling of it (base64 instead of
// base64url, padding, upper-cased hex, extra characters) is accepted.
import { timingSafeEqual } from 'node:crypto';
import type { Caller } from '../contract.js';
import { macFields } from '../mac.js';

/** A caller of the E2B API: a tenant, and the id of the API key it authenticated with. */
export interface KeyedCaller extends Caller {
  readonly keyId: string;
}

const TAG = 'airlock-e2b-envd/2';
const PART = /^[A-Za-z0-9_-]+$/;
const KEY_ID = /^[A-Za-z0-9_-]{1,64}$/;

function mac(secret: Uint8Array, tenant: string, keyId: string, sandboxId: string): Buffer {
  return macFields(secret, [TAG, tenant, keyId, sandboxId]);
}

/** The token the control API hands out for `sandboxId` to `caller` (its tenant and key). */
export function envdToken(secret: Uint8Array, caller: KeyedCaller, sandboxId: string): string {
  if (!KEY_ID.test(caller.keyId)) throw new TypeError('envdToken: malformed key id');
  const t = Buffer.from(caller.tenant, 'utf8').toString('base64url');
  return `${t}.${caller.keyId}.${mac(secret, caller.tenant, caller.keyId, sandboxId).toString('base64url')}`;
}

/**
 * The caller (tenant and key id) a token speaks for, if it is exactly a token this secret minted for
 * this sandbox; else undefined. Whether the key is still valid is the caller's check (envd.ts).
 */
export function callerFromToken(
  secret: Uint8Array,
  token: string | undefined,
  sandboxId: string,
): KeyedCaller | undefined {
  if (!token || token.length > 1024) return undefined;
  const parts = token.split('.');
  if (parts.length !== 3 || !parts.every((p) => PART.test(p))) return undefined;
  const [t, keyId] = parts as [string, string, string];
  if (!KEY_ID.test(keyId)) return undefined;
  const tenant = Buffer.from(t, 'base64url').toString('utf8');
  if (tenant === '') return undefined;
  // Recompute the whole token from the fields it names and compare the strings: any non-canonical
  // spelling of the tenant or the MAC differs. Constant time (lengths are public).
  const want = Buffer.from(envdToken(secret, { tenant, keyId }, sandboxId), 'utf8');
  const given = Buffer.from(token, 'utf8');
  if (given.length !== want.length || !timingSafeEqual(given, want)) return undefined;
  return { tenant, keyId };
}
