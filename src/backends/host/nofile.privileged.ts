// SECURITY-CRITICAL (privileged): Airlock's own RLIMIT_NOFILE, and its open fds counted.
// At start the soft limit is raised to the hard one (Node may have done it already), so the fd
// budget (core/fd-budget.ts) works with all the process may hold. Sandboxed processes never inherit
// it: spawnDirect's children are capped (process.ts NOFILE) before they run.
import { readFileSync, readdirSync } from 'node:fs';
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

/**
 * RLIMIT_NOFILE as /proc/self/limits states it (undefined if unreadable): a read that needs no libc
 * binding, whose loading (koffi) is a good part of a one-shot CLI's start when nothing else needs it.
 */
function limitsFromProc(): { soft: bigint; hard: bigint } | undefined {
  try {
    const m = /^Max open files +(\d+|unlimited) +(\d+|unlimited) /m.exec(
      readFileSync('/proc/self/limits', 'latin1'),
    );
    if (!m) return undefined;
    const n = (t: string): bigint => (t === 'unlimited' ? BigInt(NR_OPEN_FALLBACK) : BigInt(t));
    return { soft: n(m[1]!), hard: n(m[2]!) };
  } catch {
    return undefined;
  }
}

/** Raise this process's soft RLIMIT_NOFILE to its hard limit; returns the limits now in force. */
export function raiseOpenFileLimit(): { soft: number; hard: number } {
  // Node raises the soft limit to the hard one at its own start: usually there is nothing to do.
  const now = limitsFromProc();
  if (now && now.soft >= now.hard) return { soft: capped(now.soft), hard: capped(now.hard) };
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
