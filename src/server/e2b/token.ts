// The envd access token: what the e2b SDK sends as X-Access-Token on every in-sandbox request (the
// control API's key is never sent there). It is `<tenant, base64url>.<HMAC-SHA256(secret, tenant \0 id)>`:
// bound to one sandbox and to the tenant that created it, checkable without any stored session, and
// valid across server restarts as long as the secret is kept. It names the tenant so the envd API can
// call the SandboxApi as that tenant (whose own scoping then applies as for any other call).
import { createHmac, timingSafeEqual } from 'node:crypto';
import type { Caller } from '../contract.js';

function mac(secret: Uint8Array, tenant: string, sandboxId: string): Buffer {
  return createHmac('sha256', secret)
    .update('airlock-e2b-envd\0')
    .update(tenant)
    .update('\0')
    .update(sandboxId)
    .digest();
}

export function envdToken(secret: Uint8Array, caller: Caller, sandboxId: string): string {
  const t = Buffer.from(caller.tenant, 'utf8').toString('base64url');
  return `${t}.${mac(secret, caller.tenant, sandboxId).toString('base64url')}`;
}

/** The caller a token speaks for, if it is a valid token for this sandbox; else undefined. */
export function callerFromToken(
  secret: Uint8Array,
  token: string | undefined,
  sandboxId: string,
): Caller | undefined {
  if (!token || token.length > 1024) return undefined;
  const dot = token.indexOf('.');
  if (dot <= 0) return undefined;
  const tenant = Buffer.from(token.slice(0, dot), 'base64url').toString('utf8');
  const given = Buffer.from(token.slice(dot + 1), 'base64url');
  const want = mac(secret, tenant, sandboxId);
  // Constant-time compare (lengths are public: the MAC is always 32 bytes).
  if (given.length !== want.length || !timingSafeEqual(given, want)) return undefined;
  return { tenant };
}
