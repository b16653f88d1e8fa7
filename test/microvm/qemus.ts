// QEMU processes this test process started (its descendants): vitest runs test files side by side,
// so a leak check must never count another file's VMs.
import { execFileSync } from 'node:child_process';
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import { canRunNamespaces } from '../helpers.js';

function parentOf(pid: number): number | undefined {
  try {
    const m = /^PPid:\s+(\d+)$/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
    return m ? Number(m[1]) : undefined;
  } catch {
    return undefined;
  }
}

function descendsFromMe(pid: number): boolean {
  for (let p: number | undefined = pid, i = 0; p !== undefined && p > 1 && i < 64; p = parentOf(p), i++) {
    if (p === process.pid) return true;
  }
  return false;
}

/** [pid, args] of every QEMU process descending from this process. */
export function myQemus(): Array<[number, string]> {
  let out: string;
  try {
    out = execFileSync('pgrep', ['-a', 'qemu-system'], { encoding: 'utf8' });
  } catch {
    return []; // pgrep exits 1 when nothing matches
  }
  return out
    .trim()
    .split('\n')
    .filter(Boolean)
    .map((l) => [Number(l.split(' ')[0]), l.slice(l.indexOf(' ') + 1)] as [number, string])
    .filter(([pid]) => descendsFromMe(pid));
}

const KERNEL_BOOT = '/var/cache/airlock/microvm/kernel/boot';
/** Whether this host can run the microVM tier's suites (setup.sh installs what it needs). */
export const canRunMicrovm =
  canRunNamespaces &&
  existsSync('/usr/bin/qemu-system-x86_64') &&
  existsSync(KERNEL_BOOT) &&
  readdirSync(KERNEL_BOOT).some((n) => n.startsWith('vmlinuz-'));
/** Why a microVM suite is skipped when canRunMicrovm is false. */
export const MICROVM_SKIP_REASON =
  'needs root, qemu-system-x86, erofs-utils, gcc and the guest kernel in /var/cache/airlock/microvm (run scripts/setup.sh)';
