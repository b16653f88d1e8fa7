// Helpers for the escape suite: host-side views of a sandbox (its processes, namespaces, cgroups,
// disk mount) read straight from /proc and /sys, never from Airlock's own bookkeeping.
import { existsSync, readFileSync, readdirSync, readlinkSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { expect } from 'vitest';
import type { Airlock } from '../../src/index.js';
import { NO_RESIDUE, residue, type Residue } from '../helpers.js';

export const MiB = 1024 * 1024;

/** `ls -A /` inside a sandbox: nothing else of a root filesystem exists there. */
export const SANDBOX_ROOT_ENTRIES: readonly string[] = [
  'bin',
  'dev',
  'etc',
  'home',
  'lib',
  'lib64',
  'proc',
  // Links to /usr's lib32/libx32 exist only where the host has them.
  ...['lib32', 'libx32'].filter((l) => existsSync(`/usr/${l}`)),
  'sbin',
  'tmp',
  'usr',
  'workspace',
].sort();

/** The namespaces every sandboxed process must have of its own. */
export const NAMESPACES = ['user', 'pid', 'mnt', 'net', 'ipc', 'uts', 'cgroup'] as const;
export type NamespaceName = (typeof NAMESPACES)[number];

const FIXTURES = join(dirname(fileURLToPath(import.meta.url)), '..', 'fixtures');

/** Contents of a file in test/fixtures (fed to the sandbox on stdin: the host tree is not visible inside). */
export function fixture(name: string): string {
  return readFileSync(join(FIXTURES, name), 'utf8');
}

/** `readlink /proc/<pid>/ns/<name>` for every namespace, as the host sees it. */
export function nsLinks(pid: number | 'self' = 'self'): Record<NamespaceName, string> {
  const out = {} as Record<NamespaceName, string>;
  for (const n of NAMESPACES) out[n] = readlinkSync(`/proc/${pid}/ns/${n}`);
  return out;
}

export interface HostProc {
  readonly pid: number;
  readonly status: string;
  readonly argv: string[];
}

/** One field of /proc/<pid>/status, e.g. field(status, 'Uid') → "3900001\t3900001\t3900001\t3900001". */
export function statusField(status: string, name: string): string {
  const m = new RegExp(`^${name}:[ \\t]*(.*)$`, 'm').exec(status);
  if (!m) throw new Error(`test: no ${name} in /proc/<pid>/status`);
  return m[1]!.trim();
}

/** Every host process whose real uid is `uid`, read from the host's /proc. */
export function hostProcsOfUid(uid: number): HostProc[] {
  const out: HostProc[] = [];
  for (const p of readdirSync('/proc')) {
    if (!/^\d+$/.test(p)) continue;
    try {
      const status = readFileSync(`/proc/${p}/status`, 'utf8');
      if (Number(statusField(status, 'Uid').split(/\s+/)[0]) !== uid) continue;
      const argv = readFileSync(`/proc/${p}/cmdline`, 'utf8').split('\0').filter(Boolean);
      out.push({ pid: Number(p), status, argv });
    } catch {
      /* exited while we looked */
    }
  }
  return out;
}

/** A /proc/<pid>/ file as the host reads it; undefined if the process has exited meanwhile. */
export function readProcFile(pid: number, name: string): string | undefined {
  try {
    return readFileSync(`/proc/${pid}/${name}`, 'utf8');
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ESRCH' || (e as NodeJS.ErrnoException).code === 'ENOENT')
      return undefined;
    throw e;
  }
}

/** `leaf` and its ancestors among `procs` (leaf first): one exec's process chain up to bwrap's monitor. */
export function ancestry(procs: readonly HostProc[], leaf: number): HostProc[] {
  const byPid = new Map(procs.map((p) => [p.pid, p]));
  const out: HostProc[] = [];
  for (let p = byPid.get(leaf); p && !out.includes(p); p = byPid.get(Number(statusField(p.status, 'PPid')))) {
    out.push(p);
  }
  return out;
}

/** Poll `read` until `ok` holds or `timeoutMs` passes; returns the last value (assert on it). */
export async function settle<T>(read: () => T, ok: (v: T) => boolean, timeoutMs = 5_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let v = read();
  while (!ok(v) && Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, 50));
    v = read();
  }
  return v;
}

/** The host cgroup directory of a sandbox for one controller (v1 hierarchy or v2 unified), if any. */
export function sandboxCgroupDir(controller: 'pids' | 'memory', sandboxId: string): string | undefined {
  const marker = controller === 'pids' ? ['pids.current'] : ['memory.limit_in_bytes', 'memory.max'];
  for (const root of [join('/sys/fs/cgroup', controller), '/sys/fs/cgroup', '/sys/fs/cgroup/unified']) {
    const parent = join(root, 'airlock');
    if (!existsSync(parent)) continue;
    const hit = readdirSync(parent).find((n) => n.endsWith(`-${sandboxId}`));
    if (hit && marker.some((f) => existsSync(join(parent, hit, f)))) return join(parent, hit);
  }
  return undefined;
}

export function readNumber(path: string): number {
  return Number(readFileSync(path, 'utf8').trim());
}

/** Kill every sandbox of the runtime, then wait until the host holds nothing of them. */
export async function expectNoResidue(airlock: Airlock): Promise<void> {
  await airlock.killAll();
  const r = await settle<Residue>(
    () => residue(),
    (v) => JSON.stringify(v) === JSON.stringify(NO_RESIDUE),
  );
  expect(r).toEqual(NO_RESIDUE);
}
