// What the contract suites share: options with declared skips, a test registrar that enforces them,
// typed-error assertions, and a byte-for-byte picture of a host tree.
import { lstatSync, readFileSync, readdirSync, readlinkSync } from 'node:fs';
import { join } from 'node:path';
import { expect, it } from 'vitest';
import { AirlockError, type Airlock, type AirlockErrorCode } from '../../src/index.js';

export interface ContractOptions {
  /** Test name → why this backend cannot honour it. Every key must name a test of the suite. */
  readonly skip?: Partial<Record<string, string>>;
  /**
   * The runtime the suite creates sandboxes with (default testAirlock()). The remote variant passes
   * a RemoteAirlock: the library's surface over a server (typed as Airlock for the suite's sake).
   */
  readonly airlock?: () => Airlock;
  /** The host state dir its sandboxes live in (default the runtime's; the server's for the remote variant). */
  readonly stateDir?: () => string;
  /** Suffix of the suite's name, e.g. "through the remote SDK". */
  readonly variant?: string;
}

/**
 * `test(name, fn)` for a contract suite: registers the test, or its declared skip with the reason,
 * and refuses duplicate names. `unknownSkips()` names declared skips that match no test.
 */
export function contractRegistrar(opts: ContractOptions): {
  test: (name: string, fn: () => Promise<void>, timeoutMs?: number) => void;
  unknownSkips: () => string[];
} {
  const names = new Set<string>();
  return {
    test: (name, fn, timeoutMs) => {
      if (names.has(name)) throw new Error(`contract: duplicate test name "${name}"`);
      names.add(name);
      const reason = opts.skip?.[name];
      if (reason !== undefined) it.skip(`${name} [skipped: ${reason}]`, fn);
      else it(name, fn, timeoutMs);
    },
    unknownSkips: () => Object.keys(opts.skip ?? {}).filter((k) => !names.has(k)),
  };
}

/** Await (or call) `p` and return the AirlockError it throws; fail if it succeeds or throws anything else. */
export async function airlockError(p: Promise<unknown> | (() => unknown)): Promise<AirlockError> {
  let thrown: unknown;
  try {
    await (typeof p === 'function' ? p() : p);
  } catch (e) {
    thrown = e;
  }
  if (thrown === undefined) expect.fail('expected an AirlockError, but the call succeeded');
  if (!AirlockError.isInstance(thrown)) expect.fail(`expected an AirlockError, got: ${String(thrown)}`);
  return thrown;
}

/** The AirlockError `p` throws, checked to have `code` (and `field`, when given). */
export async function expectError(
  p: Promise<unknown> | (() => unknown),
  code: AirlockErrorCode,
  field?: string,
): Promise<AirlockError> {
  const e = await airlockError(p);
  expect({ code: e.code, message: e.message }).toMatchObject({ code });
  if (field !== undefined) expect(e.field).toBe(field);
  return e;
}

/** Every path under `dir` with its type, mode and content: a byte-for-byte picture of a host tree. */
export function picture(dir: string): Record<string, string> {
  const out: Record<string, string> = {};
  const walk = (rel: string): void => {
    for (const name of readdirSync(join(dir, rel)).sort()) {
      const r = join(rel, name);
      const p = join(dir, r);
      const st = lstatSync(p);
      const mode = (st.mode & 0o7777).toString(8);
      if (st.isSymbolicLink()) out[r] = `link ${mode} ${st.uid} -> ${readlinkSync(p)}`;
      else if (st.isDirectory()) {
        out[r] = `dir ${mode} ${st.uid}`;
        walk(r);
      } else out[r] = `file ${mode} ${st.uid} ${readFileSync(p).toString('base64')}`;
    }
  };
  walk('');
  return out;
}
