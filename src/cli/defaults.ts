// What the command registration in main.ts needs before any command runs: kept apart from flags.ts and
// run.ts so that `airlock --help` and `--version` load no more than commander and this file.

import type { BackendName } from '../core/backend-names.js';

/** The tiers this version implements: the ones `--backend` offers or names in an error. */
export const CLI_BACKENDS = [
  'namespaces',
  'gvisor',
  'microvm',
  'wasm',
] as const satisfies readonly BackendName[];

export interface Io {
  out(text: string): void;
  err(text: string): void;
}

/** Writes to a stream whose reader went away (EPIPE) are dropped, never thrown. */
export const processIo: Io = {
  out: (t) => void (process.stdout.writable && process.stdout.write(t)),
  err: (t) => void (process.stderr.writable && process.stderr.write(t)),
};

/** The library's exec defaults, repeated here so `--help` can show them. */
export const DEFAULT_TIMEOUT = '60s';
export const DEFAULT_MAX_OUTPUT = '64000';

/** Parse-time helper for repeatable options (commander argParser). */
export function collect(value: string, previous: string[]): string[] {
  return [...previous, value];
}
