// QEMU processes this test process started (its descendants): vitest runs test files side by side,
// so a leak check must never count another file's VMs.
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';

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
