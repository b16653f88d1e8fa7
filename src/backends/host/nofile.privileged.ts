// SECURITY-CRITICAL (privileged): Airlock's own RLIMIT_NOFILE, and its open fds counted.
// At start the soft limit is raised to the hard one (Node may have done it already), so the fd
// budget (core/fd-budget.ts) works with all the process may hold. Sandboxed processes never inherit
// it: spawnDirect's children are capped (process.ts NOFILE) before they run.
import { readdirSync } from 'node:fs';
import { libc } from '../../core/libc.privileged.js';

const RLIMIT_NOFILE = 7;
/** RLIM_INFINITY as a soft limit is not a number of fds: count with the kernel's own ceiling. */
const NR_OPEN_FALLBACK = 1 << 20;

/** This process's RLIMIT_NOFILE (soft, hard) as it is now. */
export function openFileLimit(): { soft: number; hard: number } {
  const lim = Buffer.alloc(16);
  if (libc().prlimit(0, RLIMIT_NOFILE, null, lim) !== 0) return { soft: 1024, hard: 1024 };
  return { soft: capped(lim.readBigUInt64LE(0)), hard: capped(lim.readBigUInt64LE(8)) };
}

function capped(n: bigint): number {
  return n > BigInt(NR_OPEN_FALLBACK) ? NR_OPEN_FALLBACK : Number(n);
}

/** Raise this process's soft RLIMIT_NOFILE to its hard limit; returns the limits now in force. */
export function raiseOpenFileLimit(): { soft: number; hard: number } {
  let c;
  try {
    c = libc();
  } catch {
    return { soft: 1024, hard: 1024 }; // no libc binding here: budget as for the usual default limit
  }
  const lim = Buffer.alloc(16);
  if (c.prlimit(0, RLIMIT_NOFILE, null, lim) !== 0) return { soft: 1024, hard: 1024 };
  const soft = lim.readBigUInt64LE(0);
  const hard = lim.readBigUInt64LE(8);
  if (soft < hard) {
    const want = Buffer.alloc(16);
    want.writeBigUInt64LE(hard, 0);
    want.writeBigUInt64LE(hard, 8);
    if (c.prlimit(0, RLIMIT_NOFILE, want, null) === 0) return { soft: capped(hard), hard: capped(hard) };
  }
  return { soft: capped(soft), hard: capped(hard) };
}

/** This process's open fds right now (one readdir of /proc/self/fd, less the fd of the readdir). */
export function countOpenFds(): number {
  try {
    return readdirSync('/proc/self/fd').length - 1;
  } catch {
    return 0;
  }
}
