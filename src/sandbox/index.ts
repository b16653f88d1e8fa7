// `Sandbox`: the public class. `Sandbox.create(spec)` is the E2B-style entry point.
import type { SandboxSpecInput } from '../core/spec.js';
import { Airlock } from './airlock.js';
import { SandboxBase } from './sandbox.js';

let defaultRuntime: Airlock | undefined;

/** The runtime used when `Sandbox.create` is not given one (created lazily, with defaults). */
export function defaultAirlock(): Airlock {
  defaultRuntime ??= new Airlock();
  return defaultRuntime;
}

/** A disposable sandbox; `Sandbox.create(spec)` makes one on the default runtime. */
export class Sandbox extends SandboxBase {
  static create(spec: SandboxSpecInput = {}, opts: { airlock?: Airlock } = {}): Promise<Sandbox> {
    return (opts.airlock ?? defaultAirlock()).create(spec);
  }
}
