// Helpers for the escape suite: host-side views of a sandbox (its processes, namespaces, cgroups,
// disk mount) read straight from /proc and /sys, never from Airlock's own bookkeeping.
import { execFile } from 'node:child_process';
import { existsSync, readFileSync, readdirSync, readlinkSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { expect } from 'vitest';
import type { Airlock } from '../../src/index.js';
import {
  canRunGvisor,
  canRunNamespaces,
  GVISOR_SKIP_REASON,
  NO_RESIDUE,
  residue,
  SKIP_REASON,
  TEST_STATE_DIR,
  type Residue,
} from '../helpers.js';

export const MiB = 1024 * 1024;

/** The isolation tiers every escape test runs against (each file: one describe per tier). */
export const TIERS = ['namespaces', 'gvisor'] as const;
export type Tier = (typeof TIERS)[number];

/** Whether this host can run sandboxes of `tier` (tests of a tier skip otherwise). */
export function canRunTier(tier: Tier): boolean {
  return tier === 'gvisor' ? canRunGvisor : canRunNamespaces;
}

/** Why tests of `tier` skip on this host. */
export function tierSkipReason(tier: Tier): string {
  return tier === 'gvisor' ? GVISOR_SKIP_REASON : SKIP_REASON;
}

/** `ls -A /` inside a namespaces-tier sandbox: nothing else of a root filesystem exists there. */
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

/**
 * `ls -A /` inside a sandbox of `tier`. gVisor also mounts its own synthetic sysfs on /sys (the
 * sentry's, not the host's: see visibility.test.ts).
 */
export function sandboxRootEntries(tier: Tier): string[] {
  return tier === 'gvisor' ? [...SANDBOX_ROOT_ENTRIES, 'sys'].sort() : [...SANDBOX_ROOT_ENTRIES];
}

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

/** One host process by pid (undefined once it has exited). */
export function hostProc(pid: number): HostProc | undefined {
  try {
    const status = readFileSync(`/proc/${pid}/status`, 'utf8');
    const argv = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').filter(Boolean);
    return { pid, status, argv };
  } catch {
    return undefined;
  }
}

/**
 * The host processes in a sandbox's pids cgroup. On the gVisor tier these are runsc, its gofer, the
 * sentry and the sentry's systrap stubs (the sandboxed processes themselves are not host processes).
 */
export function cgroupProcs(sandboxId: string): HostProc[] {
  const dir = sandboxCgroupDir('pids', sandboxId);
  if (!dir) return [];
  let pids: number[];
  try {
    pids = readFileSync(join(dir, 'cgroup.procs'), 'utf8').split('\n').filter(Boolean).map(Number);
  } catch {
    return []; // the cgroup went away
  }
  return pids.map(hostProc).filter((p): p is HostProc => p !== undefined);
}

/**
 * Every host process that belongs to a sandbox, found without its cgroup: its host uid (the
 * namespaces tier's processes) or its sandbox dir on the command line (gVisor's runsc, gofer, sentry).
 */
export function sandboxHostProcs(sandboxId: string, hostUid: number): HostProc[] {
  const dir = join(TEST_STATE_DIR, 'sandboxes', sandboxId) + '/';
  const out = hostProcsOfUid(hostUid);
  for (const p of readdirSync('/proc')) {
    if (!/^\d+$/.test(p) || out.some((h) => h.pid === Number(p))) continue;
    const h = hostProc(Number(p));
    if (h?.argv.some((a) => a.includes(dir))) out.push(h);
  }
  return out;
}

export interface SentryProc {
  readonly uid: number;
  readonly pid: number;
  readonly ppid: number;
  readonly cmd: string;
}

const run = promisify(execFile);

/**
 * The processes inside a gVisor sandbox's running execs, as its sentries report them to the host
 * (`runsc ps` of every container under the sandbox's runsc root): the host-side view of sandboxed
 * processes that are no host processes. Empty when no exec runs.
 */
export async function sentryProcs(sandboxId: string): Promise<SentryProc[]> {
  const runsc = ['/usr/bin/runsc', '/usr/local/bin/runsc', '/usr/sbin/runsc'].find((p) => existsSync(p))!;
  const root = join(TEST_STATE_DIR, 'sandboxes', sandboxId, 'runsc');
  if (!existsSync(root)) return [];
  const out: SentryProc[] = [];
  let cids: string[];
  try {
    const { stdout } = await run(runsc, ['--root', root, 'list', '--quiet'], { timeout: 10_000 });
    cids = stdout.split('\n').filter(Boolean);
  } catch {
    return out; // the sandbox went away while we asked
  }
  for (const cid of cids) {
    let ps: string;
    try {
      ps = (await run(runsc, ['--root', root, 'ps', cid], { timeout: 10_000 })).stdout;
    } catch {
      continue; // this container has ended
    }
    // UID PID PPID C TTY STIME TIME CMD
    for (const line of ps.split('\n').slice(1).filter(Boolean)) {
      const f = line.trim().split(/\s+/);
      out.push({ uid: Number(f[0]), pid: Number(f[1]), ppid: Number(f[2]), cmd: f.slice(7).join(' ') });
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
