// What a gVisor sandbox's cgroup must allow beyond the sandboxed processes' own limits.
import type { Limits } from '../../core/spec.js';

/**
 * Host tasks and memory of gVisor itself, per running exec: a runsc process, its gofer and its
 * sentry (measured here: ≈26 host threads and ≈45–65 MiB before the sandboxed process does
 * anything). The sandbox's cgroup allows limits.pids / limits.memoryBytes plus this much for each
 * exec that is running (at least one), adjusted as execs start and end (see GvisorSandbox).
 */
export const GVISOR_EXEC_OVERHEAD = { pids: 64, memoryBytes: 80 * 1024 * 1024 } as const;

/** The cgroup limits for a sandbox with `l` while `execs` execs run. */
export function gvisorHostLimits(l: Limits, execs: number): Limits {
  const n = Math.max(1, execs);
  return {
    ...l,
    pids: l.pids + n * GVISOR_EXEC_OVERHEAD.pids,
    memoryBytes: l.memoryBytes + n * GVISOR_EXEC_OVERHEAD.memoryBytes,
  };
}
