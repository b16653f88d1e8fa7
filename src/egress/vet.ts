// SECURITY-CRITICAL: the one path from "the sandbox wants host:port" to an open upstream socket.
// Every protocol goes through vetAndDial: policy decision on the name, resolution by Airlock (never by
// the sandbox), a decision on EVERY resolved address, and a dial to exactly one of those vetted
// addresses (no second resolution: DNS rebinding cannot swap the address after the check).
import { isIP, connect, type Socket } from 'node:net';
import { lookup } from 'node:dns/promises';
import type { NetworkPolicy, EgressVerdict } from '../policy/network.js';
import { decideAddress, decideHost } from '../policy/network.js';
import { canonicalHost } from '../core/address.js';

/** Resolve a name to addresses (all of them). Injectable: tests map names to test addresses. */
export type Resolver = (name: string) => Promise<string[]>;
/** Open a TCP connection to an already vetted address. Injectable: tests refuse foreign addresses. */
export type Dialer = (address: string, port: number) => Promise<Socket>;

export const systemResolver: Resolver = async (name) =>
  (await lookup(name, { all: true, verbatim: true })).map((a) => a.address);

export const systemDialer: Dialer = (address, port) =>
  new Promise((resolve, reject) => {
    const s = connect({ host: address, port });
    s.once('connect', () => {
      s.removeListener('error', reject);
      resolve(s);
    });
    s.once('error', reject);
  });

export type VetResult =
  | { readonly ok: true; readonly host: string; readonly address: string; readonly socket: Socket }
  | {
      readonly ok: false;
      readonly host: string;
      readonly address?: string;
      readonly verdict: Extract<EgressVerdict, { action: 'deny' }> | DialFailure;
    };

export interface DialFailure {
  readonly action: 'deny';
  readonly code: 'resolve_failed' | 'connect_failed';
  readonly reason: string;
}

export interface VetOptions {
  readonly policy: NetworkPolicy;
  readonly resolver: Resolver;
  readonly dialer: Dialer;
}

/** Decide, resolve, vet every address, dial one. Never throws; a refusal carries a model-readable reason. */
export async function vetAndDial(o: VetOptions, rawHost: string, port: number): Promise<VetResult> {
  const verdict = decideHost(o.policy, rawHost, port);
  const canon = canonicalHost(rawHost);
  const host = canon.kind === 'ip' ? canon.address : canon.kind === 'name' ? canon.name : rawHost;
  if (verdict.action === 'deny') return { ok: false, host, verdict };

  let addresses: string[];
  if (canon.kind === 'ip') {
    addresses = [canon.address];
  } else {
    try {
      addresses = await o.resolver(host);
    } catch (e) {
      return {
        ok: false,
        host,
        verdict: dialFailure('resolve_failed', `could not resolve ${host}: ${(e as Error).message}`),
      };
    }
    addresses = addresses.filter((a) => isIP(a) !== 0);
    if (addresses.length === 0) {
      return { ok: false, host, verdict: dialFailure('resolve_failed', `${host} has no address`) };
    }
  }
  // Every answer must pass: one private address among public ones is how rebinding attacks look.
  for (const a of addresses) {
    const v = decideAddress(o.policy, a, port, host);
    if (v.action === 'deny') return { ok: false, host, address: a, verdict: v };
  }
  const address = addresses[0]!;
  try {
    return { ok: true, host, address, socket: await o.dialer(address, port) };
  } catch (e) {
    return {
      ok: false,
      host,
      address,
      verdict: dialFailure(
        'connect_failed',
        `could not connect to ${host} (${address}:${port}): ${(e as Error).message}`,
      ),
    };
  }
}

function dialFailure(code: DialFailure['code'], reason: string): DialFailure {
  return { action: 'deny', code, reason: `Airlock egress: ${reason}` };
}
