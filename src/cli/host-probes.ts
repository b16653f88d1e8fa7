// Read-only probes of what this host offers beyond the namespaces tier's own checks: cgroup layout,
// Landlock ABI, KVM, and the helper programs of the tiers not implemented yet. Nothing here changes
// host state; the two raw calls (landlock_create_ruleset, KVM ioctls) go through koffi to libc.
import { execFileSync } from 'node:child_process';
import {
  accessSync,
  closeSync,
  constants as fsConstants,
  existsSync,
  openSync,
  readFileSync,
  readdirSync,
} from 'node:fs';
import { createRequire } from 'node:module';
import { delimiter, join } from 'node:path';

export interface CgroupReport {
  /** 1, 2, or both (hybrid). */
  readonly versions: number[];
  readonly v1Controllers: string[];
  readonly v2Mounts: string[];
  readonly detail: string;
}

export function probeCgroups(mountinfo = readOr('/proc/self/mountinfo')): CgroupReport {
  const v1 = new Set<string>();
  const v2: string[] = [];
  for (const line of mountinfo.split('\n')) {
    const [pre, post] = line.split(' - ');
    if (!pre || !post) continue;
    const mountPoint = pre.split(' ')[4] ?? '';
    const [fstype, , superOpts = ''] = post.split(' ');
    if (fstype === 'cgroup') {
      for (const opt of superOpts.split(',')) {
        if (['rw', 'ro', 'relatime', 'noatime', 'nosuid', 'nodev', 'noexec'].includes(opt)) continue;
        v1.add(opt);
      }
    } else if (fstype === 'cgroup2') {
      v2.push(mountPoint);
    }
  }
  const versions = [...(v1.size ? [1] : []), ...(v2.length ? [2] : [])];
  const v1Controllers = [...v1].sort();
  const parts: string[] = [];
  if (v1.size) parts.push(`v1 (${v1Controllers.join(', ')})`);
  for (const m of v2) {
    const ctl = readOr(join(m, 'cgroup.controllers')).trim();
    parts.push(`v2 at ${m} (${ctl || 'no controllers enabled'})`);
  }
  return {
    versions,
    v1Controllers,
    v2Mounts: v2,
    detail: parts.join('; ') || 'no cgroup filesystem mounted',
  };
}

interface Libc {
  syscall(nr: number, attr: null, size: number, flags: number): number;
  ioctl(fd: number, request: number, arg: number): number;
  errno(): number;
}

let libcCache: Libc | string | undefined;

/** libc through koffi, or the reason it could not be loaded (e.g. a musl host). */
function libc(): Libc | string {
  if (libcCache !== undefined) return libcCache;
  try {
    const koffi = createRequire(import.meta.url)('koffi') as {
      load(path: string): { func(decl: string): (...args: unknown[]) => number };
      errno(): number;
    };
    const lib = koffi.load('libc.so.6');
    const syscall = lib.func('long syscall(long nr, void *attr, unsigned long size, unsigned int flags)');
    const ioctl = lib.func('int ioctl(int fd, unsigned long request, unsigned long arg)');
    libcCache = {
      syscall: (nr, attr, size, flags) => Number(syscall(nr, attr, size, flags)),
      ioctl: (fd, request, arg) => ioctl(fd, request, arg),
      errno: () => koffi.errno(),
    };
  } catch (e) {
    libcCache = `cannot call libc through koffi: ${(e as Error).message}`;
  }
  return libcCache;
}

export interface LandlockReport {
  readonly abi: number | null;
  readonly detail: string;
}

const SYS_LANDLOCK_CREATE_RULESET = 444; // same number on every architecture
const LANDLOCK_CREATE_RULESET_VERSION = 1;
const ENOSYS = 38;
const EOPNOTSUPP = 95;

export function probeLandlock(): LandlockReport {
  const c = libc();
  if (typeof c === 'string') return { abi: null, detail: c };
  const r = c.syscall(SYS_LANDLOCK_CREATE_RULESET, null, 0, LANDLOCK_CREATE_RULESET_VERSION);
  if (r > 0) return { abi: r, detail: `ABI ${r}` };
  const errno = c.errno();
  if (errno === ENOSYS) return { abi: null, detail: 'not in this kernel (ENOSYS)' };
  if (errno === EOPNOTSUPP)
    return { abi: null, detail: 'built in but disabled at boot (EOPNOTSUPP): add "landlock" to lsm=' };
  return { abi: null, detail: `landlock_create_ruleset failed (errno ${errno})` };
}

export interface KvmReport {
  readonly present: boolean;
  readonly openable: boolean;
  readonly apiVersion: number | null;
  /** KVM_CREATE_VM succeeded: a guest could run with hardware (or PVM) acceleration. */
  readonly usable: boolean;
  /** Loaded kvm* kernel modules, e.g. kvm_intel, kvm_amd, kvm_pvm. */
  readonly modules: string[];
  /** The CPU advertises vmx/svm to this (possibly virtual) machine. */
  readonly cpuVirtFlags: boolean;
  readonly detail: string;
}

const KVM_GET_API_VERSION = 0xae00;
const KVM_CREATE_VM = 0xae01;

export function probeKvm(): KvmReport {
  const modules = safeReaddir('/sys/module').filter((m) => m === 'kvm' || m.startsWith('kvm_'));
  const cpuVirtFlags = /^flags\s*:.*\b(vmx|svm)\b/m.test(readOr('/proc/cpuinfo'));
  const base = { modules, cpuVirtFlags };
  if (!existsSync('/dev/kvm')) {
    return {
      ...base,
      present: false,
      openable: false,
      apiVersion: null,
      usable: false,
      detail: `/dev/kvm absent${cpuVirtFlags ? '' : ' (CPU shows no vmx/svm: no nested virtualization)'}`,
    };
  }
  let fd: number;
  try {
    fd = openSync('/dev/kvm', fsConstants.O_RDWR);
  } catch (e) {
    return {
      ...base,
      present: true,
      openable: false,
      apiVersion: null,
      usable: false,
      detail: `/dev/kvm present but cannot be opened read-write (${(e as NodeJS.ErrnoException).code})`,
    };
  }
  try {
    const c = libc();
    if (typeof c === 'string') {
      return {
        ...base,
        present: true,
        openable: true,
        apiVersion: null,
        usable: false,
        detail: `/dev/kvm opens; ${c}`,
      };
    }
    const api = c.ioctl(fd, KVM_GET_API_VERSION, 0);
    const vm = api === 12 ? c.ioctl(fd, KVM_CREATE_VM, 0) : -1;
    const errno = vm < 0 ? c.errno() : 0;
    if (vm >= 0) closeSync(vm);
    const usable = vm >= 0;
    const how = modules.length ? ` via ${modules.join(', ')}` : '';
    return {
      ...base,
      present: true,
      openable: true,
      apiVersion: api >= 0 ? api : null,
      usable,
      detail: usable
        ? `/dev/kvm usable (KVM API ${api}, a VM can be created${how})`
        : `/dev/kvm opens but ${api !== 12 ? `reports KVM API ${api}` : `KVM_CREATE_VM fails (errno ${errno})`}: no usable KVM`,
    };
  } finally {
    closeSync(fd);
  }
}

export interface ToolReport {
  readonly found: boolean;
  readonly path?: string;
  readonly version?: string;
  readonly detail: string;
}

/** Is `name` on PATH, and what does `name --version` say (first line)? */
export function probeTool(name: string): ToolReport {
  const path = onPath(name);
  if (!path) return { found: false, detail: `${name}: not found on PATH` };
  try {
    const out = execFileSync(path, ['--version'], {
      encoding: 'utf8',
      timeout: 5000,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    const version =
      out
        .split('\n')
        .find((l) => l.trim() !== '')
        ?.trim() ?? '';
    return { found: true, path, version, detail: `${name}: ${version || 'found'} at ${path}` };
  } catch (e) {
    return {
      found: true,
      path,
      detail: `${name}: found at ${path} but "--version" failed (${(e as Error).message.split('\n')[0]})`,
    };
  }
}

function onPath(name: string): string | undefined {
  for (const dir of (process.env.PATH ?? '').split(delimiter)) {
    if (!dir) continue;
    const p = join(dir, name);
    try {
      accessSync(p, fsConstants.X_OK);
      return p;
    } catch {
      /* not here */
    }
  }
  return undefined;
}

function readOr(p: string, fallback = ''): string {
  try {
    return readFileSync(p, 'utf8');
  } catch {
    return fallback;
  }
}

function safeReaddir(d: string): string[] {
  try {
    return readdirSync(d);
  } catch {
    return [];
  }
}
