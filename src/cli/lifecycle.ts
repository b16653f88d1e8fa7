// Process-level plumbing shared by the sandbox-creating commands: the runtime the CLI uses, and
// SIGINT/SIGTERM handling that kills this process's live sandboxes before airlock exits 130/143.
import { constants } from 'node:os';
import { Airlock, type AirlockOptions } from '../sandbox/airlock.js';
import { uidRangeFromEnv } from './flags.js';

/** The CLI's runtime: state dir from AIRLOCK_STATE_DIR (the constructor reads it), uids from AIRLOCK_UID_RANGE. */
export function cliAirlock(opts: Pick<AirlockOptions, 'maxSpillBytes'> = {}): Airlock {
  const uidRange = uidRangeFromEnv(process.env.AIRLOCK_UID_RANGE);
  // One-shot: no warm pool (a prepared sandbox would only be released again at exit).
  return new Airlock({ ...opts, warmPool: 0, ...(uidRange ? { uidRange } : {}) });
}

export interface SignalTrap {
  /** Aborted on the first SIGINT/SIGTERM; pass it to exec so the command stops at once. */
  readonly signal: AbortSignal;
  /** 130 after SIGINT, 143 after SIGTERM, else undefined. */
  readonly exitCode: number | undefined;
  dispose(): void;
}

const CLEANUP_GRACE_MS = 15_000;

/**
 * First signal: abort, kill every live sandbox, and let the command's own `finally` finish the
 * cleanup and return the exit code. A second signal (or a cleanup stuck past the grace period)
 * exits at once; the next airlock run reaps whatever is left. A reader that went away (EPIPE on
 * stdout/stderr, e.g. `airlock run -- seq 1 1e9 | head`) is treated like SIGPIPE: same cleanup, 141.
 */
export function trapSignals(airlock: Airlock, writeErr: (line: string) => void): SignalTrap {
  const controller = new AbortController();
  let exitCode: number | undefined;
  let watchdog: NodeJS.Timeout | undefined;
  const interrupt = (code: number): void => {
    exitCode = code;
    controller.abort();
    void airlock.killAll();
    watchdog = setTimeout(() => process.exit(code), CLEANUP_GRACE_MS);
  };
  const onSignal = (sig: 'SIGINT' | 'SIGTERM'): void => {
    if (exitCode !== undefined) process.exit(exitCode);
    writeErr(`airlock: ${sig} received; killing the sandbox`);
    interrupt(128 + constants.signals[sig]);
  };
  const onInt = (): void => onSignal('SIGINT');
  const onTerm = (): void => onSignal('SIGTERM');
  const onStreamError = (e: NodeJS.ErrnoException): void => {
    if (exitCode === undefined && e.code === 'EPIPE') interrupt(128 + constants.signals.SIGPIPE);
  };
  process.on('SIGINT', onInt);
  process.on('SIGTERM', onTerm);
  process.stdout.on('error', onStreamError);
  process.stderr.on('error', onStreamError);
  return {
    signal: controller.signal,
    get exitCode() {
      return exitCode;
    },
    dispose() {
      process.off('SIGINT', onInt);
      process.off('SIGTERM', onTerm);
      process.stdout.off('error', onStreamError);
      process.stderr.off('error', onStreamError);
      if (watchdog) clearTimeout(watchdog);
    },
  };
}

/** The exit status a shell would report: the exit code, or 128 + signal number. */
export function statusOf(r: { exitCode: number | null; signal: NodeJS.Signals | null }): number {
  if (r.exitCode !== null) return r.exitCode;
  const n = r.signal ? constants.signals[r.signal] : undefined;
  return n === undefined ? 1 : 128 + n;
}
