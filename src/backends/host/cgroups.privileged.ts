// SECURITY-CRITICAL (privileged): per-sandbox cgroups enforcing memory, pids and CPU limits.
// cgroup v1 (one hierarchy per controller, as on this Debian host) and v2 (unified) are both
// supported; the layout is detected at runtime from /proc/self/mountinfo. Writes are direct fs
// syscalls (~0.4 ms for a whole sandbox), never spawned shell commands.
import {
  closeSync,
  constants,
  existsSync,
  mkdirSync,
  openSync,
  readFileSync,
  readdirSync,
  write,
  writeFileSync,
  writeSync,
} from 'node:fs';
import { mkdir, rmdir } from 'node:fs/promises';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import type { LimitCounters } from '../../core/backend.js';
import { AirlockError } from '../../core/errors.js';
import type { Limits } from '../../core/spec.js';
import { libc } from '../../core/libc.privileged.js';

const REQUIRED = ['memory', 'pids', 'cpu'] as const;
const GROUP = 'airlock';
const CPU_PERIOD_US = 100_000;

export type CgroupLayout =
  | { readonly version: 1; readonly mounts: Readonly<Record<string, string>> }
  | { readonly version: 2; readonly root: string }
  | { readonly version: 0; readonly reason: string };

/** Detect where memory/pids/cpu(/freezer) can be controlled: v1 hierarchies first, else unified v2. */
export function detectCgroups(mountinfo = readFileSync('/proc/self/mountinfo', 'utf8')): CgroupLayout {
  const v1: Record<string, string> = {};
  let v2Root: string | undefined;
  for (const line of mountinfo.split('\n')) {
    const [pre, post] = line.split(' - ');
    if (!pre || !post) continue;
    const mountPoint = pre.split(' ')[4]!;
    const [fstype, , superOpts = ''] = post.split(' ');
    if (fstype === 'cgroup') {
      for (const opt of superOpts.split(','))
        if (['memory', 'pids', 'cpu', 'freezer'].includes(opt)) v1[opt] = mountPoint;
    } else if (fstype === 'cgroup2' && v2Root === undefined) {
      v2Root = mountPoint;
    }
  }
  if (REQUIRED.every((c) => v1[c])) return { version: 1, mounts: v1 };
  if (v2Root) {
    const controllers = readOr(join(v2Root, 'cgroup.controllers'), '').split(/\s+/);
    const missing = REQUIRED.filter((c) => !controllers.includes(c));
    if (missing.length === 0) return { version: 2, root: v2Root };
    return {
      version: 0,
      reason: `cgroup v2 at ${v2Root} lacks controller(s) ${missing.join(', ')} and no cgroup v1 hierarchy has them`,
    };
  }
  return { version: 0, reason: 'no cgroup v1 memory/pids/cpu hierarchy and no cgroup2 mount found' };
}

function readOr(path: string, fallback: string): string {
  try {
    return readFileSync(path, 'utf8');
  } catch {
    return fallback;
  }
}

function counter(text: string, key: string): number {
  const m = new RegExp(`^${key} (\\d+)$`, 'm').exec(text);
  return m ? Number(m[1]) : 0;
}

export interface CgroupHandle {
  readonly dirs: readonly string[];
  /** Move a process (and, from then on, all its future children) into the sandbox's cgroups. */
  addProcess(pid: number): void;
  /**
   * addProcess off the event loop; resolves once the process is in every one of the cgroups. A
   * cgroup.procs write takes the kernel's global threadgroup lock, whose write side waits for
   * forks and exits host-wide to drain and, after a quiet spell, for an RCU grace period: on a busy
   * host that is milliseconds, which must not stall Airlock's event loop. The cgroup.procs files
   * are opened once per sandbox and written from libuv's thread pool.
   */
  enroll(pid: number): Promise<void>;
  /** OOM kills and pids-limit hits so far (from createCgroup: zero, without reading, until a process entered). */
  counters(): LimitCounters;
  /**
   * Tasks the pids controller still charges to the cgroup: live ones, and dead ones the kernel has
   * not released yet (a killed gVisor sentry's helpers drain for seconds). 0 without the controller.
   */
  tasks(): number;
  /** Write the memory, pids and CPU limits (before any process of the sandbox runs). */
  setLimits(limits: Limits): void;
  /** SIGKILL every process in the cgroup and wait until it is empty. */
  killAll(): Promise<void>;
  /** Whether the processes can be frozen here (v1 freezer controller, or v2 `cgroup.freeze`). */
  readonly canFreeze: boolean;
  /**
   * Freeze every process of the cgroup; resolves once the kernel reports it frozen (nothing of it
   * runs until thaw). BACKEND_UNAVAILABLE when the host has no freezer.
   */
  freeze(): Promise<void>;
  /** Thaw what freeze() froze. */
  thaw(): Promise<void>;
  /** killAll, then remove the cgroup directories. Idempotent. */
  destroy(): Promise<void>;
}

/**
 * Make a sandbox's cgroup(s) with its limits written. The mkdirs run off the event loop: they take
 * the kernel's cgroup_mutex, which an enrolment waiting on the threadgroup lock may hold for a while.
 */
export async function createCgroup(layout: CgroupLayout, id: string, limits: Limits): Promise<CgroupHandle> {
  if (layout.version === 0)
    throw new AirlockError('BACKEND_UNAVAILABLE', `cgroups unavailable: ${layout.reason}`);
  const h = await (layout.version === 1
    ? createV1(layout.mounts, id, limits)
    : createV2(layout.root, id, limits));
  return countsOnceEntered(h);
}

/**
 * A cgroup just made has counted nothing until a process enters it: counters() says so without
 * reading, until enroll or addProcess puts the first process in.
 */
function countsOnceEntered(h: CgroupHandle): CgroupHandle {
  let entered = false;
  return {
    ...h,
    addProcess(pid) {
      entered = true;
      h.addProcess(pid);
    },
    enroll(pid) {
      entered = true;
      return h.enroll(pid);
    },
    counters: () => (entered ? h.counters() : { oomKills: 0, pidsLimitHits: 0 }),
  };
}

/** Every sandbox cgroup dir named `<prefix><id>` on the host, by sandbox id (for the orphan reaper). */
export function listCgroups(layout: CgroupLayout, prefix: string): Map<string, string[]> {
  const out = new Map<string, string[]>();
  const parents =
    layout.version === 1
      ? Object.values(layout.mounts).map((m) => join(m, GROUP))
      : layout.version === 2
        ? [join(layout.root, GROUP)]
        : [];
  for (const parent of new Set(parents)) {
    let names: string[] = [];
    try {
      names = readdirSync(parent, { withFileTypes: true })
        .filter((d) => d.isDirectory())
        .map((d) => d.name);
    } catch {
      continue;
    }
    for (const n of names) {
      if (!n.startsWith(prefix)) continue;
      const id = n.slice(prefix.length);
      out.set(id, [...(out.get(id) ?? []), join(parent, n)]);
    }
  }
  return out;
}

/** Handle on an existing set of cgroup dirs (used by the reaper to kill and remove them). */
export function attachCgroup(layout: CgroupLayout, dirs: readonly string[]): CgroupHandle {
  return layout.version === 2
    ? v2Handle(dirs[0]!)
    : v1Handle(layout.version === 1 ? layout.mounts : {}, dirs);
}

// ---- v1 -------------------------------------------------------------------------------------------

async function createV1(
  mounts: Readonly<Record<string, string>>,
  id: string,
  limits: Limits,
): Promise<CgroupHandle> {
  const dirs: string[] = [];
  for (const ctl of [...REQUIRED, 'freezer'] as const) {
    const mount = mounts[ctl];
    if (!mount) continue;
    const dir = join(mount, GROUP, id);
    if (!dirs.includes(dir)) dirs.push(dir);
  }
  const made = await Promise.allSettled(dirs.map((d) => mkdir(d, { recursive: true })));
  const failed = made.find((r) => r.status === 'rejected');
  if (failed) {
    await Promise.allSettled(dirs.filter((_, i) => made[i]!.status === 'fulfilled').map((d) => rmdir(d)));
    throw (failed as PromiseRejectedResult).reason;
  }
  try {
    const h = v1Handle(mounts, dirs, true);
    h.setLimits(limits);
    return h;
  } catch (e) {
    await Promise.allSettled(dirs.map((d) => rmdir(d)));
    throw e;
  }
}

/** `fresh`: a cgroup just made for a sandbox (its cgroup.procs files are opened now, not on the first exec). */
function v1Handle(
  mounts: Readonly<Record<string, string>>,
  dirs: readonly string[],
  fresh = false,
): CgroupHandle {
  const under = (ctl: string): string | undefined => {
    const m = mounts[ctl];
    return m ? dirs.find((d) => d.startsWith(m + '/')) : undefined;
  };
  const memDir = under('memory');
  const pidsDir = under('pids');
  const freezerDir = under('freezer');
  const cpuDir = under('cpu');
  const freezerState = freezerDir ? join(freezerDir, 'freezer.state') : undefined;
  const procs = procsWriter(dirs, fresh);
  const handle: CgroupHandle = {
    dirs,
    canFreeze: freezerState !== undefined,
    async freeze() {
      if (!freezerState) throw noFreezer('cgroup v1 has no freezer hierarchy mounted');
      // A v1 freeze can stall in FREEZING for good when a task sits in a state the freezer cannot
      // catch (seen with runsc's threads under load). As runc does, thaw and ask again while it
      // stalls: each new FROZEN write re-signals every task, and a retry usually lands at once.
      let asked = 0;
      writeFileSync(freezerState, 'FROZEN');
      await waitFor(
        () => {
          if (readOr(freezerState, '').trim() === 'FROZEN') return true;
          if (++asked % 200 === 0) {
            writeIgnoringGone(freezerState, 'THAWED');
            writeIgnoringGone(freezerState, 'FROZEN');
          }
          return false;
        },
        freezerState,
        () => writeIgnoringGone(freezerState, 'THAWED'),
      );
    },
    async thaw() {
      if (!freezerState) throw noFreezer('cgroup v1 has no freezer hierarchy mounted');
      writeFileSync(freezerState, 'THAWED');
    },
    addProcess(pid) {
      for (const d of dirs) writeFileSync(join(d, 'cgroup.procs'), String(pid));
    },
    enroll: (pid) => procs.enroll(pid),
    setLimits(limits) {
      // With swap accounting, cap memory+swap too, or a sandbox could page its excess out to swap.
      // v1 requires limit <= memsw at every step: raise memsw first, lower it last.
      const limit = join(memDir!, 'memory.limit_in_bytes');
      const memsw = join(memDir!, 'memory.memsw.limit_in_bytes');
      const want = String(limits.memoryBytes);
      if (existsSync(memsw)) {
        const raising = limits.memoryBytes > Number(readOr(memsw, '0').trim());
        for (const f of raising ? [memsw, limit] : [limit, memsw]) writeFileSync(f, want);
      } else {
        writeFileSync(limit, want);
      }
      writeFileSync(join(pidsDir!, 'pids.max'), String(limits.pids));
      const period = join(cpuDir!, 'cpu.cfs_period_us');
      if (readOr(period, '').trim() !== String(CPU_PERIOD_US)) writeFileSync(period, String(CPU_PERIOD_US));
      writeFileSync(join(cpuDir!, 'cpu.cfs_quota_us'), String(cpuQuotaUs(limits)));
    },
    tasks() {
      return pidsDir ? Number(readOr(join(pidsDir, 'pids.current'), '0').trim()) || 0 : 0;
    },
    counters() {
      return {
        oomKills: memDir ? counter(readOr(join(memDir, 'memory.oom_control'), ''), 'oom_kill') : 0,
        pidsLimitHits: pidsDir ? counter(readOr(join(pidsDir, 'pids.events'), ''), 'max') : 0,
      };
    },
    async killAll() {
      // v1 has no cgroup.kill: freeze (so nothing forks while we sweep), SIGKILL each pid, thaw.
      const freeze = freezerDir ? join(freezerDir, 'freezer.state') : undefined;
      for (let round = 0; round < 200; round++) {
        const pids = new Set<number>();
        for (const d of dirs) for (const p of readPids(d)) pids.add(p);
        if (pids.size === 0) break;
        if (freeze) writeIgnoringGone(freeze, 'FROZEN');
        for (const p of pids) killQuiet(p);
        if (freeze) writeIgnoringGone(freeze, 'THAWED');
        await sleep(round < 10 ? 1 : 10);
      }
    },
    async destroy() {
      await procs.close();
      await handle.killAll();
      await removeDirs(dirs);
    },
  };
  return handle;
}

// ---- v2 -------------------------------------------------------------------------------------------

async function createV2(root: string, id: string, limits: Limits): Promise<CgroupHandle> {
  const parent = join(root, GROUP);
  if (!existsSync(parent)) {
    mkdirSync(parent, { recursive: true });
  }
  // Delegate the controllers down to our subtree (root first, then airlock/).
  for (const d of [root, parent]) {
    const enabled = readOr(join(d, 'cgroup.subtree_control'), '');
    const want = REQUIRED.filter((c) => !enabled.split(/\s+/).includes(c));
    if (want.length) writeFileSync(join(d, 'cgroup.subtree_control'), want.map((c) => `+${c}`).join(' '));
  }
  const dir = join(parent, id);
  await mkdir(dir);
  try {
    const h = v2Handle(dir, true);
    h.setLimits(limits);
    return h;
  } catch (e) {
    await rmdir(dir).catch(() => {});
    throw e;
  }
}

/** `fresh`: as for v1Handle. */
function v2Handle(dir: string, fresh = false): CgroupHandle {
  const freezeFile = join(dir, 'cgroup.freeze');
  const canFreeze = existsSync(freezeFile);
  const procs = procsWriter([dir], fresh);
  const handle: CgroupHandle = {
    dirs: [dir],
    canFreeze,
    async freeze() {
      if (!canFreeze) throw noFreezer(`${freezeFile} does not exist (kernel older than 5.2?)`);
      writeFileSync(freezeFile, '1');
      await waitFor(
        () => /^frozen 1$/m.test(readOr(join(dir, 'cgroup.events'), '')),
        freezeFile,
        () => writeIgnoringGone(freezeFile, '0'),
      );
    },
    async thaw() {
      if (!canFreeze) throw noFreezer(`${freezeFile} does not exist (kernel older than 5.2?)`);
      writeFileSync(freezeFile, '0');
    },
    addProcess(pid) {
      writeFileSync(join(dir, 'cgroup.procs'), String(pid));
    },
    enroll: (pid) => procs.enroll(pid),
    setLimits(limits) {
      writeFileSync(join(dir, 'memory.max'), String(limits.memoryBytes));
      if (existsSync(join(dir, 'memory.swap.max'))) writeFileSync(join(dir, 'memory.swap.max'), '0');
      writeFileSync(join(dir, 'pids.max'), String(limits.pids));
      writeFileSync(join(dir, 'cpu.max'), `${cpuQuotaUs(limits)} ${CPU_PERIOD_US}`);
    },
    tasks() {
      return Number(readOr(join(dir, 'pids.current'), '0').trim()) || 0;
    },
    counters() {
      return {
        oomKills: counter(readOr(join(dir, 'memory.events'), ''), 'oom_kill'),
        pidsLimitHits: counter(readOr(join(dir, 'pids.events'), ''), 'max'),
      };
    },
    async killAll() {
      for (let round = 0; round < 200; round++) {
        const pids = readPids(dir);
        if (pids.length === 0) break;
        if (existsSync(join(dir, 'cgroup.kill'))) writeIgnoringGone(join(dir, 'cgroup.kill'), '1');
        else for (const p of pids) killQuiet(p);
        await sleep(round < 10 ? 1 : 10);
      }
    },
    async destroy() {
      await procs.close();
      await handle.killAll();
      await removeDirs([dir]);
    },
  };
  return handle;
}

// ---- helpers --------------------------------------------------------------------------------------

/** How long a freeze may take before it is given up (a task stuck in the kernel blocks FREEZING). */
const FREEZE_TIMEOUT_MS = 10_000;

function noFreezer(why: string): AirlockError {
  return new AirlockError(
    'BACKEND_UNAVAILABLE',
    `pausing a sandbox needs the cgroup freezer (v1 "freezer" controller or cgroup v2 cgroup.freeze): ${why}`,
  );
}

async function waitFor(done: () => boolean, what: string, undo: () => void): Promise<void> {
  const deadline = Date.now() + FREEZE_TIMEOUT_MS;
  for (let round = 0; !done(); round++) {
    if (Date.now() > deadline) {
      undo();
      throw new AirlockError(
        'INTERNAL',
        `the sandbox did not freeze within ${FREEZE_TIMEOUT_MS} ms (${what})`,
      );
    }
    await sleep(round < 20 ? 0 : 5);
  }
}

function cpuQuotaUs(limits: Limits): number {
  return Math.max(1000, Math.round(limits.cpus * CPU_PERIOD_US));
}

/**
 * Writes pids to the cgroup.procs files of `dirs` (opened on first use) from the thread pool.
 * close() waits for writes in flight before it closes the fds: a queued write must never find its fd
 * number reused by another file.
 */
/**
 * Set once favordynmods is known to be on: a cgroup.procs write then takes about 0.1 ms, less than
 * handing it to the thread pool costs, so enrolments are written directly (see favorDynmods).
 */
let migrationNeverWaits = false;

/**
 * Writes a pid to the cgroup.procs file of each dir. The files stay open for the cgroup's life; a
 * `fresh` cgroup (made ahead in a warm slot) opens them at once, so the first exec does not.
 */
function procsWriter(
  dirs: readonly string[],
  fresh: boolean,
): {
  enroll(pid: number): Promise<void>;
  close(): Promise<void>;
} {
  const open = (): number[] => {
    const opened: number[] = [];
    try {
      for (const d of dirs) opened.push(openSync(join(d, 'cgroup.procs'), constants.O_WRONLY));
    } catch (e) {
      for (const fd of opened) closeSync(fd);
      throw e;
    }
    return opened;
  };
  let fds: number[] | undefined = fresh ? open() : undefined;
  let closed = false;
  const inFlight = new Set<Promise<unknown>>();
  return {
    async enroll(pid) {
      if (closed) throw Object.assign(new Error('cgroup removed'), { code: 'ENOENT' });
      fds ??= open();
      const buf = Buffer.from(String(pid));
      if (migrationNeverWaits) {
        for (const fd of fds) writeSync(fd, buf);
        return;
      }
      const all = Promise.allSettled(
        fds.map((fd) => new Promise<void>((res, rej) => write(fd, buf, (err) => (err ? rej(err) : res())))),
      );
      inFlight.add(all);
      const results = await all;
      inFlight.delete(all);
      const failed = results.find((r) => r.status === 'rejected');
      if (failed) throw (failed as PromiseRejectedResult).reason;
    },
    async close() {
      closed = true;
      await Promise.all([...inFlight]);
      for (const fd of fds ?? []) closeSync(fd);
      fds = undefined;
    },
  };
}

function readPids(dir: string): number[] {
  return readOr(join(dir, 'cgroup.procs'), '').split('\n').filter(Boolean).map(Number);
}

function killQuiet(pid: number): void {
  try {
    process.kill(pid, 'SIGKILL');
  } catch {
    /* already gone */
  }
}

function writeIgnoringGone(path: string, value: string): void {
  try {
    writeFileSync(path, value);
  } catch {
    /* cgroup removed concurrently */
  }
}

async function removeDirs(dirs: readonly string[]): Promise<void> {
  for (const d of dirs) {
    for (let attempt = 0; ; attempt++) {
      try {
        await rmdir(d); // off the event loop, like mkdir (cgroup_mutex)
        break;
      } catch (e) {
        const code = (e as NodeJS.ErrnoException).code;
        if (code === 'ENOENT') break;
        if (code !== 'EBUSY' || attempt >= 100) {
          throw new AirlockError('INTERNAL', `could not remove cgroup ${d}: ${code}`, { cause: e });
        }
        await sleep(5);
      }
    }
  }
}

/** Where the controller-less hierarchy that asks for fast migrations is mounted (host-wide). */
const FAVOR_DYNMODS_MOUNT = '/run/airlock/cgroup-favordynmods';
const FAVOR_DYNMODS_NAME = 'airlock-favordynmods';

/**
 * Fast task migration: the kernel's cgroup `favordynmods` mode (Linux ≥ 6.1).
 *
 * Every exec moves a process into the sandbox's cgroups (a write to cgroup.procs). That write takes
 * the kernel's global cgroup_threadgroup_rwsem for writing, and by default the write side waits for
 * an RCU grace period whenever migrations are not back to back: measured here, 5 ms per write after a
 * 50 ms quiet spell (0.06 ms back to back) — more than bwrap itself takes. In favordynmods mode the
 * kernel keeps that lock in the state where writers do not wait (0.23 ms after the same quiet spell),
 * at the cost the kernel documents: forks and exits host-wide take a slightly slower path. The mode
 * belongs to that lock, so it is host-wide whichever hierarchy asks for it; we ask by mounting a
 * controller-less named v1 hierarchy with the option, which nothing else uses. It stays mounted
 * (host-wide state, like the uid leases): unmounting it would turn the mode off again.
 *
 * Nothing here changes what a sandbox can do; it only makes enrolment fast. Fails soft: a host where
 * the mount is refused keeps working, slower, and the probe says why.
 */
export function favorDynmods(
  mountinfo = readFileSync('/proc/self/mountinfo', 'utf8'),
  target = FAVOR_DYNMODS_MOUNT,
): { readonly on: boolean; readonly detail: string } {
  for (const line of mountinfo.split('\n')) {
    const [pre, post] = line.split(' - ');
    if (!pre || !post) continue;
    const [fstype, , superOpts = ''] = post.split(' ');
    if ((fstype === 'cgroup' || fstype === 'cgroup2') && superOpts.split(',').includes('favordynmods')) {
      migrationNeverWaits = true;
      return {
        on: true,
        detail: `favordynmods on (${pre.split(' ')[4]}): a cgroup.procs write never waits for an RCU grace period`,
      };
    }
  }
  try {
    mkdirSync(target, { recursive: true, mode: 0o755 });
  } catch (e) {
    return { on: false, detail: `favordynmods off: cannot make ${target}: ${(e as Error).message}` };
  }
  const c = libc();
  if (
    c.mount(
      'cgroup',
      target,
      'cgroup',
      MS_NOSUID | MS_NODEV | MS_NOEXEC,
      `none,name=${FAVOR_DYNMODS_NAME},favordynmods`,
    ) !== 0
  ) {
    return {
      on: false,
      detail: `favordynmods off (mount refused, errno ${c.errno()}; Linux ≥ 6.1 and cgroup v1 named hierarchies needed): each exec's cgroup enrolment may wait for an RCU grace period (milliseconds)`,
    };
  }
  migrationNeverWaits = true;
  return {
    on: true,
    detail: `favordynmods on (mounted ${target}): a cgroup.procs write never waits for an RCU grace period`,
  };
}

const MS_NOSUID = 0x2;
const MS_NODEV = 0x4;
const MS_NOEXEC = 0x8;
