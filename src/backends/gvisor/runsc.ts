// Finding runsc, what this host can run it on (platform), and the global flags every call uses.
import { execFile, spawn } from 'node:child_process';
import {
  closeSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  renameSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { promisify } from 'node:util';
import { z } from 'zod';
import { readRecordFile } from '../../core/validate.js';

const run = promisify(execFile);

export type Platform = (typeof PLATFORMS)[number];

export interface RunscInfo {
  readonly path: string;
  /** e.g. "0.0~20240729.0" (Debian's version string: a release date). */
  readonly version: string;
  /** The release date from the version, as YYYYMMDD (0 when it cannot be read). */
  readonly date: number;
}

export interface PlatformReport {
  readonly platform: Platform | undefined;
  /** One line per platform tried: why it was or was not chosen. */
  readonly tried: ReadonlyArray<{
    readonly platform: Platform;
    readonly ok: boolean;
    readonly detail: string;
  }>;
}

const PLATFORMS = ['kvm', 'systrap', 'ptrace'] as const;

/** The cache file: only a known platform name is ever passed back to runsc. */
const PlatformCacheSchema = z
  .object({
    key: z.string(),
    report: z
      .object({
        platform: z.enum(PLATFORMS), // only a report that found one is cached
        tried: z.array(
          z.object({ platform: z.enum(PLATFORMS), ok: z.boolean(), detail: z.string() }).strict(),
        ),
      })
      .strict(),
  })
  .strict();

/** systrap replaced ptrace as the default in mid-2023; older runsc has only ptrace and kvm. */
const SYSTRAP_SINCE = 20230601;

export function findRunsc(): string | undefined {
  for (const p of ['/usr/bin/runsc', '/usr/local/bin/runsc', '/usr/sbin/runsc']) if (existsSync(p)) return p;
  return undefined;
}

export async function runscInfo(path: string): Promise<RunscInfo> {
  const { stdout } = await run(path, ['--version'], { timeout: 10_000 });
  const version = /runsc version (\S+)/.exec(stdout)?.[1] ?? stdout.trim().split('\n')[0] ?? '?';
  const date = Number(/(20\d{6})/.exec(version)?.[1] ?? 0);
  return { path, version, date };
}

/**
 * Run a probe in its own process group and kill the whole group on timeout (runsc's sentry and
 * gofer would otherwise keep the pipes open, and the probe waiting, long after runsc was killed).
 */
function probeRun(cmd: string, args: readonly string[], timeoutMs: number): Promise<void> {
  return new Promise((resolve, reject) => {
    const c = spawn(cmd, args, {
      detached: true,
      stdio: ['ignore', 'ignore', 'pipe'],
      env: { PATH: '/usr/bin:/bin' },
    });
    let err = '';
    c.stderr.on('data', (d: Buffer) => void (err = (err + d.toString()).slice(-2000)));
    const timer = setTimeout(() => {
      try {
        process.kill(-c.pid!, 'SIGKILL');
      } catch {
        // already gone
      }
      reject(new Error(`no answer within ${timeoutMs} ms`));
    }, timeoutMs);
    c.on('error', (e) => {
      clearTimeout(timer);
      reject(e);
    });
    c.on('exit', (code) => {
      clearTimeout(timer);
      if (code === 0) resolve();
      else reject(new Error(err.trim().split('\n').pop() || `exit ${code}`));
    });
  });
}

/** /dev/kvm exists and can be opened (it may exist and still fail, e.g. nested virtualisation off). */
function kvmOpenable(): boolean {
  try {
    closeSync(openSync('/dev/kvm', 'r+'));
    return true;
  } catch {
    return false;
  }
}

/**
 * The fastest platform that really runs a guest process here: kvm where /dev/kvm works, else systrap
 * (runsc ≥ mid-2023), else ptrace. Each candidate is proven with `runsc do /bin/true`.
 */
export async function detectPlatform(info: RunscInfo): Promise<PlatformReport> {
  const candidates: Platform[] = [];
  const tried: Array<{ platform: Platform; ok: boolean; detail: string }> = [];
  if (kvmOpenable()) candidates.push('kvm');
  else tried.push({ platform: 'kvm', ok: false, detail: '/dev/kvm is missing or cannot be opened' });
  if (info.date === 0 || info.date >= SYSTRAP_SINCE) candidates.push('systrap');
  else tried.push({ platform: 'systrap', ok: false, detail: `runsc ${info.version} predates systrap` });
  candidates.push('ptrace');
  for (const platform of candidates) {
    const root = mkdtempSync(join(tmpdir(), 'airlock-runsc-probe-'));
    try {
      await probeRun(
        info.path,
        ['--root', root, '--platform', platform, '--network', 'none', 'do', '/bin/true'],
        // KVM without working (nested) virtualisation hangs rather than failing: give up soon.
        platform === 'kvm' ? 8_000 : 30_000,
      );
      tried.push({ platform, ok: true, detail: 'runs /bin/true' });
      return { platform, tried };
    } catch (e) {
      tried.push({ platform, ok: false, detail: `runsc do /bin/true failed: ${(e as Error).message}` });
    } finally {
      rmSync(root, { recursive: true, force: true });
    }
  }
  return { platform: undefined, tried };
}

/**
 * detectPlatform, remembered in `file` per runsc version and /dev/kvm presence (a failed KVM attempt
 * costs seconds; the answer only changes when one of those does).
 */
export async function cachedPlatform(info: RunscInfo, file: string): Promise<PlatformReport> {
  const key = `${info.path} ${info.version} kvm:${existsSync('/dev/kvm')}`;
  let cached: z.output<typeof PlatformCacheSchema> | undefined;
  try {
    cached = readRecordFile(PlatformCacheSchema, file, 'gVisor platform cache');
  } catch {
    // corrupt: detect again (and overwrite it)
  }
  if (cached?.key === key) return cached.report;
  const report = await detectPlatform(info);
  if (report.platform) {
    mkdirSync(dirname(file), { recursive: true, mode: 0o711 });
    writeFileSync(`${file}.tmp`, JSON.stringify({ key, report }), { mode: 0o600 });
    renameSync(`${file}.tmp`, file);
  }
  return report;
}

export interface GlobalFlags {
  /** runsc's state dir for this sandbox's containers. */
  readonly root: string;
  readonly platform: Platform;
  /**
   * 'none': gVisor's own network stack with loopback only (checkpointable). 'host': the sentry uses
   * the host kernel's stack of the netns runsc starts in — the sandbox's own, routeless netns — so
   * Airlock's egress listeners there are reachable (not checkpointable).
   */
  readonly network: 'none' | 'host';
}

/** Flags before the subcommand, the same for run, restore, checkpoint, pause and resume. */
export function globalArgs(f: GlobalFlags): string[] {
  return [
    '--root',
    f.root,
    '--platform',
    f.platform,
    '--network',
    f.network,
    // Mounts are Airlock's own host overlays (snapshots copy them): no gVisor overlay on top.
    '--overlay2',
    'none',
    // runsc's processes are placed in the sandbox's cgroup by Airlock before they start.
    '--ignore-cgroups',
    // The sandbox's syscall deny list (linux.seccomp in the bundle) is enforced inside the sentry.
    '--oci-seccomp',
    // No host Unix sockets: the egress path is a TCP listener in the sandbox's netns.
    '--host-uds',
    'none',
    // Operator-side debugging only (never set by Airlock itself): runsc's own logs to this dir.
    ...(process.env.AIRLOCK_RUNSC_DEBUG_DIR
      ? ['--debug', '--debug-log', `${process.env.AIRLOCK_RUNSC_DEBUG_DIR}/`]
      : []),
  ];
}
