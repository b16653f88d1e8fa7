// Process-level plumbing shared by the sandbox-creating commands: the runtime the CLI uses, and
// SIGINT/SIGTERM handling that kills this process's live sandboxes before airlock exits 130/143.
import { readFileSync } from 'node:fs';
import { constants } from 'node:os';
import { Airlock, type AirlockOptions } from '../sandbox/airlock.js';
import { uidRangeFromEnv } from './flags.js';

/** What the command does with its runtime. */
export interface CliRuntimeUse extends Pick<AirlockOptions, 'maxSpillBytes'> {
  /** The process makes one sandbox only (run, diff, mcp): see launcherPaysOff. */
  readonly oneSandbox?: boolean;
}

/** The CLI's runtime: state dir from AIRLOCK_STATE_DIR (the constructor reads it), uids from AIRLOCK_UID_RANGE. */
export function cliAirlock(use: CliRuntimeUse = {}): Airlock {
  const { oneSandbox, ...opts } = use;
  const uidRange = uidRangeFromEnv(process.env.AIRLOCK_UID_RANGE);
  // One-shot: no warm pool (a prepared sandbox would only be released again at exit).
  return new Airlock({
    ...opts,
    warmPool: 0,
    ...(oneSandbox && !launcherPaysOff() ? { launchNamespaces: false } : {}),
    ...(uidRange ? { uidRange } : {}),
  });
}

/** Host mounts above which bwrap's own start-up (it rereads the mount table per bind) outweighs the launcher's boot. */
const LAUNCHER_MOUNTS = 500;

/**
 * The launcher thread (AirlockOptions.launchNamespaces) starts each bwrap in a mount namespace of
 * its own so that bwrap's cost depends neither on the host's mounts nor on other live sandboxes.
 * Booting that thread is the longest step of a one-shot `airlock run` (a worker thread takes
 * 60-80 ms to start here, the whole create → exec → kill ~20 ms), and with one sandbox there are
 * no others to be independent of: a process that makes one sandbox uses it only when the host's
 * mount table is large. What the sandbox sees is the same either way (bwrap binds the same paths;
 * test/unit/launcher.test.ts runs a sandbox both ways).
 */
export function launcherPaysOff(
  mountinfo = (): string => readFileSync('/proc/self/mountinfo', 'latin1'),
): boolean {
  try {
    return mountinfo().split('\n').length - 1 > LAUNCHER_MOUNTS;
  } catch {
    return true; // unknown: the default
  }
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
