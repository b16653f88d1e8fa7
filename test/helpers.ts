// Shared test helpers: a runtime on its own state dir and uid range, and a residue check that looks
// at the host itself (mounts, cgroups, processes, dirs, leases), not at Airlock's own bookkeeping.
import { spawn, spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, readFileSync, readdirSync, readlinkSync, statSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { Airlock } from '../src/index.js';

export const TEST_STATE_DIR = process.env.AIRLOCK_TEST_STATE_DIR ?? '/var/tmp/airlock-test';
/** Overridable so that two test runs on one host (e.g. two engineers) never share uids or state. */
export const TEST_UID_RANGE = {
  first: Number(process.env.AIRLOCK_TEST_UID_FIRST ?? 3_900_000),
  count: 4096,
} as const;

export function testAirlock(): Airlock {
  return new Airlock({ stateDir: TEST_STATE_DIR, uidRange: TEST_UID_RANGE });
}

/** True when this host can run the namespaces tier (root + bwrap); tests of the tier skip otherwise. */
export const canRunNamespaces =
  process.getuid?.() === 0 && (existsSync('/usr/bin/bwrap') || existsSync('/usr/local/bin/bwrap'));
export const SKIP_REASON = 'needs root and bubblewrap (run scripts/setup.sh)';

/** True when this host can run the gVisor tier (the namespaces tier's needs + runsc). */
export const canRunGvisor =
  canRunNamespaces &&
  ['/usr/bin/runsc', '/usr/local/bin/runsc', '/usr/sbin/runsc'].some((p) => existsSync(p));
export const GVISOR_SKIP_REASON = 'needs root, bubblewrap and runsc (run scripts/setup.sh)';

/** What a namespaces-tier sandbox's /dev holds (sorted): bwrap's --dev set, from ensureDevTree. */
export const SANDBOX_DEV_ENTRIES = [
  'fd',
  'full',
  'null',
  'ptmx',
  'pts',
  'random',
  'shm',
  'stderr',
  'stdin',
  'stdout',
  'tty',
  'urandom',
  'zero',
];

export interface Residue {
  mounts: string[];
  cgroups: string[];
  sandboxDirs: string[];
  leases: string[];
  processes: number[];
}

/** Everything on the host that belongs to a sandbox of TEST_STATE_DIR. */
export function residue(stateDir = TEST_STATE_DIR): Residue {
  const mounts = readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .map((l) => l.split(' ')[4] ?? '')
    .filter((m) => m.startsWith(stateDir + '/'));
  // The sandboxes dir's own tmpfs and the shared /dev tree (each mounted once per state dir, see
  // ensureRuntimeTmpfs and ensureDevTree) belong to no sandbox: one of each is expected, a second
  // (stacked) one is residue.
  for (const shared of [`${stateDir}/sandboxes`, `${stateDir}/dev`]) {
    const at = mounts.indexOf(shared);
    if (at >= 0) mounts.splice(at, 1);
  }
  // Sandbox cgroups are named `<first 8 hex of sha256(stateDir)>-<id>` (see backends/namespaces).
  const prefix = `${createHash('sha256').update(stateDir).digest('hex').slice(0, 8)}-`;
  const cgroups: string[] = [];
  for (const ctl of ['memory', 'pids', 'cpu', 'freezer', 'unified']) {
    const parent = join('/sys/fs/cgroup', ctl, 'airlock');
    if (!existsSync(parent)) continue;
    for (const n of readdirSync(parent, { withFileTypes: true }))
      if (n.isDirectory() && n.name.startsWith(prefix)) cgroups.push(join(parent, n.name));
  }
  const ls = (d: string): string[] => (existsSync(d) ? readdirSync(d) : []);
  const processes: number[] = [];
  for (const p of readdirSync('/proc')) {
    if (!/^\d+$/.test(p)) continue;
    try {
      const uid = Number(/^Uid:\s+(\d+)/m.exec(readFileSync(`/proc/${p}/status`, 'utf8'))![1]);
      if (uid >= TEST_UID_RANGE.first && uid < TEST_UID_RANGE.first + TEST_UID_RANGE.count)
        processes.push(Number(p));
      // gVisor's runsc, gofer and sentry run as root/nobody, with the sandbox dir on their command line.
      else if (readFileSync(`/proc/${p}/cmdline`, 'utf8').includes(`${stateDir}/sandboxes/`))
        processes.push(Number(p));
    } catch {
      /* exited */
    }
  }
  return {
    mounts,
    cgroups,
    sandboxDirs: ls(join(stateDir, 'sandboxes')),
    leases: ls('/run/airlock/uid-leases').filter((u) => {
      const n = Number(u);
      return n >= TEST_UID_RANGE.first && n < TEST_UID_RANGE.first + TEST_UID_RANGE.count;
    }),
    processes,
  };
}

export const NO_RESIDUE: Residue = { mounts: [], cgroups: [], sandboxDirs: [], leases: [], processes: [] };

/**
 * residue() once the host has settled: a killed process tree can stay visible for a moment as an
 * exiting task or a zombie its parent has not reaped yet. Waits at most 2 s by default (longer for
 * a child CLI that tears down after its client left); a real leak stays.
 */
export async function settledResidue(maxWaitMs = 2000): Promise<Residue> {
  let r = residue();
  for (let i = 0; i < maxWaitMs / 50 && JSON.stringify(r) !== JSON.stringify(NO_RESIDUE); i++) {
    await new Promise((res) => setTimeout(res, 50));
    r = residue();
  }
  return r;
}

const ROOT = join(import.meta.dirname, '..');

/** How the tests start the real `airlock` CLI: tsx and main.ts by absolute path, on the test state dir. */
function cliCommand(args: readonly string[]): { argv: string[]; env: NodeJS.ProcessEnv } {
  const tsx = pathToFileURL(join(ROOT, 'node_modules', 'tsx', 'dist', 'loader.mjs')).href;
  return {
    argv: ['--import', tsx, join(ROOT, 'src', 'cli', 'main.ts'), ...args],
    env: {
      ...process.env,
      AIRLOCK_STATE_DIR: TEST_STATE_DIR,
      AIRLOCK_UID_RANGE: `${TEST_UID_RANGE.first}:${TEST_UID_RANGE.count}`,
    },
  };
}

/**
 * The real `airlock` CLI as a child process on the test state dir and uid range, from any cwd (tsx
 * and main.ts by absolute path, so the cwd need not hold node_modules). Rejects after `timeoutMs`.
 */
export function runCli(
  args: readonly string[],
  o: { cwd?: string; timeoutMs?: number } = {},
): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const { argv, env } = cliCommand(args);
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, argv, {
      cwd: o.cwd ?? ROOT,
      env,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (t: string) => (stdout += t));
    child.stderr.setEncoding('utf8').on('data', (t: string) => (stderr += t));
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`airlock ${args.join(' ')} did not exit in time; stderr: ${stderr}`));
    }, o.timeoutMs ?? 120_000);
    child.on('error', reject);
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
  });
}

/**
 * runCli, blocking this process until the CLI exits: no turn of this process's event loop runs
 * meanwhile (what a test needs to act between two steps that follow each other at once).
 */
export function runCliSync(args: readonly string[]): { code: number | null; stdout: string; stderr: string } {
  const { argv, env } = cliCommand(args);
  const r = spawnSync(process.execPath, argv, { cwd: ROOT, env, encoding: 'utf8', timeout: 120_000 });
  if (r.error) throw r.error;
  return { code: r.status, stdout: r.stdout, stderr: r.stderr };
}

export function inotifyWatchesOn(dirs: readonly string[]): number {
  const inodes = new Set(dirs.map((d) => statSync(d).ino.toString(16)));
  let n = 0;
  for (const fd of readdirSync('/proc/self/fd')) {
    try {
      if (readlinkSync(`/proc/self/fd/${fd}`) !== 'anon_inode:inotify') continue;
      for (const m of readFileSync(`/proc/self/fdinfo/${fd}`, 'utf8').matchAll(
        /^inotify wd:\S+ ino:(\S+) /gm,
      ))
        if (inodes.has(m[1]!)) n++;
    } catch {
      /* closed meanwhile */
    }
  }
  return n;
}

/** Fds this process holds open on files in `dir`. */
export function openFdsIn(dir: string): number {
  let n = 0;
  for (const fd of readdirSync('/proc/self/fd')) {
    try {
      if (dirname(readlinkSync(`/proc/self/fd/${fd}`)) === dir) n++;
    } catch {
      /* closed meanwhile */
    }
  }
  return n;
}
