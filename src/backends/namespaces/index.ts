// The namespaces tier: bubblewrap + a size-capped tmpfs disk + overlayfs workspace + cgroups + seccomp.
// A sandbox is host state (disk, workspace mount, cgroup, uid lease); each exec is one bwrap process
// tree entering fresh namespaces over that state. See docs/threat-model.md for what this stops.
import { execFileSync } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import {
  chmodSync,
  chownSync,
  existsSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  realpathSync,
  rmSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import { join } from 'node:path';
import type {
  BackendContext,
  BackendProbe,
  BackendProcess,
  BackendSandbox,
  BackendV1,
  EgressPlumbing,
  LimitCounters,
  ProbeCheck,
  ReapReport,
  SpawnRequest,
} from '../../core/backend.js';
import { AirlockError } from '../../core/errors.js';
import {
  forbiddenMountSourceReason,
  forbiddenWorkspaceReason,
  LimitsSchema,
  type Limits,
  type SandboxSpec,
} from '../../core/spec.js';
import { bwrapOptions, type BwrapLayout } from './bwrap.js';
import {
  attachCgroup,
  createCgroup,
  detectCgroups,
  listCgroups,
  type CgroupHandle,
  type CgroupLayout,
} from './cgroups.privileged.js';
import { bindReadOnly, mountIdmapped } from './idmap.privileged.js';
import {
  createNetns,
  interceptTcpInNetns,
  originalDestination,
  socketInNetns,
  withNetns,
} from './netns.privileged.js';
import { mountDevpts, mountOverlay, mountTmpfs, resizeTmpfs, unmount } from './mount.privileged.js';
import { startSandboxedProcess } from './process.js';
import { ensureEtc } from './rootfs.js';
import { buildSeccompFilter } from './seccomp.privileged.js';
import {
  DEFAULT_UID_RANGE,
  killProcessesOfUids,
  ownerAlive,
  selfOwner,
  StateDirs,
  type Owner,
  type UidRange,
} from './state.js';

interface Slot {
  readonly id: string;
  readonly uid: number;
  readonly dir: string;
  readonly disk: string;
  readonly diskBytes: number;
  readonly limits: Limits;
  readonly res: HostResources;
  readonly tmpDir: string;
  readonly homeDir: string;
  readonly shmDir: string;
  readonly netnsFile: string;
  readonly ptsDir: string;
}

/** Pseudo-terminals per sandbox (its own devpts instance). */
const MAX_PTYS = 64;

const DEFAULT_LIMITS: Limits = LimitsSchema.parse({});

export interface NamespacesOptions {
  /**
   * Sandboxes' host state prepared ahead of time (default 1): `create` then only applies the spec.
   * Prepared slots hold a uid, an empty tmpfs, a netns and a cgroup; `close()` releases them.
   */
  readonly warmPool?: number;
  readonly uidRange?: UidRange;
  /** Host-wide uid lease dir (default /run/airlock/uid-leases). */
  readonly uidLeaseDir?: string;
  readonly bwrapPath?: string;
}

interface OwnerFile {
  readonly id: string;
  readonly uid: number;
  readonly owner: Owner;
}

export class NamespacesBackend implements BackendV1 {
  readonly specificationVersion = 'v1' as const;
  readonly name = 'namespaces' as const;
  private readonly dirs: StateDirs;
  private readonly uidRange: UidRange;
  private readonly bwrapPath: string;
  private cgroupLayout: CgroupLayout | undefined;
  private etcDir: string | undefined;
  private seccomp: Buffer | undefined;
  private probed: BackendProbe | undefined;
  private readonly pool: Slot[] = [];
  private readonly warmPool: number;
  private refillTimer: NodeJS.Immediate | undefined;
  /** Cgroup names are `<prefix><id>`: several state dirs on one host never reap each other's. */
  private readonly cgPrefix: string;

  constructor(
    private readonly ctx: BackendContext,
    opts: NamespacesOptions = {},
  ) {
    this.dirs = new StateDirs(ctx.stateDir, opts.uidLeaseDir);
    this.uidRange = opts.uidRange ?? DEFAULT_UID_RANGE;
    this.bwrapPath = opts.bwrapPath ?? findBwrap();
    this.warmPool = opts.warmPool ?? 1;
    this.cgPrefix = `${createHash('sha256').update(ctx.stateDir).digest('hex').slice(0, 8)}-`;
  }

  async probe(): Promise<BackendProbe> {
    if (this.probed) return this.probed;
    const checks: ProbeCheck[] = [];
    const isRoot = process.getuid?.() === 0;
    checks.push({
      name: 'root',
      ok: isRoot,
      detail: isRoot
        ? 'running as root'
        : 'the namespaces tier mounts overlayfs and writes cgroups: run Airlock as root',
    });
    try {
      const v = execFileSync(this.bwrapPath, ['--version'], { encoding: 'utf8' }).trim();
      checks.push({ name: 'bwrap', ok: true, detail: `${v} at ${this.bwrapPath}` });
    } catch {
      checks.push({ name: 'bwrap', ok: false, detail: 'bubblewrap not found: apt-get install bubblewrap' });
    }
    const userns = readTrim('/proc/sys/user/max_user_namespaces');
    const usernsOk =
      userns !== undefined &&
      Number(userns) > 0 &&
      readTrim('/proc/sys/kernel/unprivileged_userns_clone') !== '0';
    checks.push({
      name: 'userns',
      ok: usernsOk,
      detail: usernsOk
        ? `unprivileged user namespaces enabled (max ${userns})`
        : 'unprivileged user namespaces are disabled (sysctl user.max_user_namespaces / kernel.unprivileged_userns_clone)',
    });
    const layout = this.layout();
    checks.push({
      name: 'cgroups',
      ok: layout.version !== 0,
      detail:
        layout.version === 1
          ? `cgroup v1 (${Object.entries(layout.mounts)
              .map(([c, m]) => `${c}:${m}`)
              .join(' ')})`
          : layout.version === 2
            ? `cgroup v2 at ${layout.root}`
            : layout.reason,
    });
    const overlayOk =
      /\toverlay$/m.test(readTrim('/proc/filesystems') ?? '') || existsSync('/sys/module/overlay');
    checks.push({
      name: 'overlayfs',
      ok: overlayOk,
      detail: overlayOk
        ? 'overlay filesystem available'
        : 'overlayfs not in /proc/filesystems (modprobe overlay)',
    });
    const seccompOk = existsSync('/proc/sys/kernel/seccomp/actions_avail');
    checks.push({
      name: 'seccomp',
      ok: seccompOk,
      detail: seccompOk
        ? `filter actions: ${readTrim('/proc/sys/kernel/seccomp/actions_avail')}`
        : 'kernel lacks seccomp filters',
    });
    const nft = existsSync('/usr/sbin/nft') && existsSync('/usr/sbin/ip');
    checks.push({
      name: 'egress',
      ok: nft,
      optional: true,
      detail: nft
        ? 'nftables + iproute2: transparent egress interception available'
        : 'nftables/iproute2 missing: network policies need `transparent: false` (apt-get install nftables iproute2)',
    });
    const failed = checks.filter((c) => !c.ok && !c.optional);
    this.probed = failed.length
      ? { available: false, reason: failed.map((c) => `${c.name}: ${c.detail}`).join('; '), checks }
      : { available: true, checks };
    return this.probed;
  }

  private layout(): CgroupLayout {
    this.cgroupLayout ??= detectCgroups();
    return this.cgroupLayout;
  }

  /**
   * Host state for one sandbox that does not depend on its spec (uid lease, dirs, a tmpfs disk,
   * netns, cgroup), made ahead of time so that `create` only applies the spec. Synchronous.
   */
  private prepareSlot(limits: Limits): Slot {
    if (this.etcDir === undefined) {
      this.dirs.ensure();
      this.etcDir = ensureEtc(this.ctx.stateDir);
    }
    const id = `sbx-${randomBytes(8).toString('hex')}`;
    const owner = selfOwner();
    const uid = this.dirs.leaseUid(this.uidRange, id, owner);
    const dir = this.dirs.sandboxDir(id);
    const res = new HostResources(dir, uid, this.dirs);
    try {
      mkdirSync(dir, { mode: 0o711 });
      writeFileSync(join(dir, 'owner.json'), JSON.stringify({ id, uid, owner } satisfies OwnerFile), {
        mode: 0o600,
      });
      const disk = join(dir, 'disk');
      mkdirSync(disk, { mode: 0o700 });
      mountTmpfs(disk, limits.diskBytes, uid, 0o700);
      const slot: Slot = {
        id,
        uid,
        dir,
        disk,
        diskBytes: limits.diskBytes,
        limits,
        res,
        tmpDir: mkOwned(join(disk, 'tmp'), uid, 0o1777),
        homeDir: mkOwned(join(disk, 'home'), uid, 0o700),
        shmDir: mkOwned(join(disk, 'shm'), uid, 0o1777),
        netnsFile: join(dir, 'netns'),
        ptsDir: join(dir, 'pts'),
      };
      createNetns(slot.netnsFile);
      mkdirSync(slot.ptsDir, { mode: 0o755 });
      mountDevpts(slot.ptsDir, MAX_PTYS);
      res.cgroup = createCgroup(this.layout(), this.cgPrefix + id, limits);
      return slot;
    } catch (e) {
      void res.release().catch(() => {});
      throw e;
    }
  }

  /** Keep `warmPool` slots ready. Runs from setImmediate right after a create, i.e. typically while
   *  the caller's first command is starting in bwrap on another core. */
  private refill(): void {
    this.refillTimer = undefined;
    try {
      while (this.pool.length < this.warmPool) this.pool.push(this.prepareSlot(DEFAULT_LIMITS));
    } catch (e) {
      this.ctx.logger.warn({ err: (e as Error).message }, 'warm pool refill failed');
    }
  }

  async create(spec: SandboxSpec): Promise<BackendSandbox> {
    const probe = await this.probe();
    if (!probe.available)
      throw new AirlockError('BACKEND_UNAVAILABLE', `namespaces backend unavailable: ${probe.reason}`);
    this.seccomp ??= buildSeccompFilter();

    const ws = spec.workspace;
    let hostDir: string | undefined;
    if (ws.hostDir !== undefined) hostDir = checkHostDir(ws.hostDir, realpathOr(this.ctx.stateDir));

    const slot = this.pool.pop() ?? this.prepareSlot(spec.limits);
    if (this.warmPool > 0 && this.refillTimer === undefined)
      this.refillTimer = setImmediate(() => this.refill());
    const { id, uid, dir, disk, res } = slot;
    try {
      if (slot.diskBytes !== spec.limits.diskBytes) resizeTmpfs(disk, spec.limits.diskBytes);
      const l = slot.limits;
      const want = spec.limits;
      if (l.memoryBytes !== want.memoryBytes || l.pids !== want.pids || l.cpus !== want.cpus) {
        res.cgroup!.setLimits(want);
      }
      let workspaceDir: string;
      if (ws.mode === 'empty') {
        workspaceDir = mkOwned(join(disk, 'ws'), uid, 0o755);
      } else {
        // The host dir, seen through an idmapped mount so the sandbox uid owns what the dir's owner
        // owns (falls back to the plain dir where the filesystem cannot idmap).
        const lower = join(dir, 'lower');
        mkdirSync(lower, { mode: 0o755 });
        const st = statSync(hostDir!);
        // Always read-only: overlayfs never writes to its lower layers, and a writable host-side alias
        // of the caller's dir owned by the sandbox uid would be one mistake away from a write-through.
        const mapped = await mountIdmapped(hostDir!, lower, { uid: st.uid, gid: st.gid }, uid, true);
        if (!mapped)
          this.ctx.logger.warn({ hostDir }, 'idmapped mount unavailable; workspace keeps host owners');
        const source = mapped ? lower : hostDir!;
        workspaceDir = join(dir, 'ws');
        mkdirSync(workspaceDir, { mode: 0o755 });
        if (ws.mode === 'ro') {
          // A second, empty lower layer: overlayfs needs two lowers when it has no upper.
          const empty = join(dir, 'empty');
          mkdirSync(empty, { mode: 0o755 });
          mountOverlay(workspaceDir, [source, empty]);
        } else {
          const upper = mkOwned(join(disk, 'upper'), uid, 0o755);
          const work = mkOwned(join(disk, 'work'), 0, 0o700);
          mountOverlay(workspaceDir, [source], { dir: upper, work });
        }
      }
      // Read-only host mounts (e.g. an MCP server's package): each a detached read-only clone under
      // the sandbox dir, which bwrap then binds at its sandbox path.
      const roMounts: Array<readonly [string, string]> = [];
      for (const [i, m] of spec.mounts.entries()) {
        const src = checkMountSource(m.hostPath, realpathOr(this.ctx.stateDir), i);
        const target = join(dir, `ro-${i}`);
        if (statSync(src).isDirectory()) mkdirSync(target, { mode: 0o755 });
        else writeFileSync(target, '', { mode: 0o444 });
        bindReadOnly(src, target);
        roMounts.push([target, m.path]);
      }
      const layout: BwrapLayout = {
        etcDir: this.etcDir!,
        roMounts,
        workspaceDir,
        workspaceReadOnly: ws.mode === 'ro', // also bound read-only
        tmpDir: slot.tmpDir,
        homeDir: slot.homeDir,
        shmDir: slot.shmDir,
        ptsDir: slot.ptsDir,
        inSandboxNetns: true,
      };
      return new NamespacesSandbox(id, uid, layout, res, this.bwrapPath, this.seccomp, slot.netnsFile);
    } catch (e) {
      await res.release().catch(() => {});
      throw e;
    }
  }

  /** Release the warm pool (prepared, never used slots). Creating again refills it. */
  async close(): Promise<void> {
    if (this.refillTimer !== undefined) clearImmediate(this.refillTimer);
    this.refillTimer = undefined;
    const slots = this.pool.splice(0);
    await Promise.allSettled(slots.map((s) => s.res.release()));
  }

  async reapOrphans(): Promise<ReapReport> {
    const layout = this.layout();
    const live = new Set<string>();
    const orphans: Array<{ id: string; dir: string; uid: number | undefined }> = [];
    for (const id of this.dirs.listSandboxIds()) {
      const dir = this.dirs.sandboxDir(id);
      let meta: OwnerFile | undefined;
      try {
        meta = JSON.parse(readFileSync(join(dir, 'owner.json'), 'utf8')) as OwnerFile;
      } catch {
        meta = undefined;
      }
      if ((meta && ownerAlive(meta.owner)) || (!meta && recentlyCreated(dir))) {
        live.add(id); // alive, or being created right now by another process (owner.json is next)
        continue;
      }
      orphans.push({ id, dir, uid: meta?.uid });
    }
    const deadLeases = this.dirs.listLeases().filter((l) => !ownerAlive(l.owner) && !live.has(l.sandboxId));
    // Nothing may still run as a uid that is about to be handed out again, whatever cgroup it is in.
    const uids = new Set<number>([
      ...orphans.flatMap((o) => (o.uid === undefined ? [] : [o.uid])),
      ...deadLeases.map((l) => l.uid),
    ]);
    killProcessesOfUids(uids);

    const cgroups = listCgroups(layout, this.cgPrefix);
    let reaped = 0;
    for (const o of orphans) {
      const res = new HostResources(o.dir, o.uid, this.dirs);
      const cg = cgroups.get(o.id);
      if (cg) res.cgroup = attachCgroup(layout, cg);
      try {
        await res.release();
        reaped++;
      } catch (e) {
        this.ctx.logger.warn({ id: o.id, err: (e as Error).message }, 'could not fully reap sandbox');
      }
    }
    // Cgroups without a sandbox dir, and leases whose owner died.
    for (const [id, cgDirs] of cgroups) {
      if (live.has(id) || existsSync(this.dirs.sandboxDir(id))) continue;
      await attachCgroup(layout, cgDirs)
        .destroy()
        .catch(() => {});
    }
    for (const l of deadLeases) this.dirs.releaseUid(l.uid);
    return { sandboxes: reaped };
  }
}

/** Everything a sandbox holds on the host, released in dependency order, each step attempted. */
class HostResources {
  cgroup: CgroupHandle | undefined;
  constructor(
    readonly dir: string,
    readonly uid: number | undefined,
    private readonly dirs: StateDirs,
  ) {}

  async release(): Promise<void> {
    const errors: unknown[] = [];
    const step = async (f: () => unknown): Promise<void> => {
      try {
        await f();
      } catch (e) {
        errors.push(e);
      }
    };
    // 1. processes (they pin the mounts), 2. mounts, innermost first, 3. files, 4. uid lease.
    await step(() => this.cgroup?.destroy());
    await step(() => unmount(join(this.dir, 'ws')));
    for (const name of readdirOr(this.dir)) {
      if (/^ro-\d+$/.test(name)) await step(() => unmount(join(this.dir, name)));
    }
    await step(() => unmount(join(this.dir, 'lower')));
    await step(() => unmount(join(this.dir, 'disk')));
    await step(() => unmount(join(this.dir, 'netns')));
    await step(() => unmount(join(this.dir, 'pts')));
    await step(() => rmSync(this.dir, { recursive: true, force: true }));
    if (this.uid !== undefined) await step(() => this.dirs.releaseUid(this.uid!));
    if (errors.length) {
      throw new AirlockError(
        'INTERNAL',
        `sandbox cleanup incomplete: ${errors.map((e) => (e as Error).message).join('; ')}`,
      );
    }
  }
}

class NamespacesSandbox implements BackendSandbox {
  private readonly procs = new Set<BackendProcess>();
  private destroyed: Promise<void> | undefined;

  constructor(
    readonly id: string,
    readonly hostUid: number,
    private layout: BwrapLayout,
    private readonly res: HostResources,
    private readonly bwrapPath: string,
    private readonly seccomp: Buffer,
    private readonly netnsFile: string,
  ) {}

  async spawn(req: SpawnRequest): Promise<BackendProcess> {
    if (this.destroyed) throw new AirlockError('SANDBOX_GONE', `sandbox ${this.id} was killed`);
    const p = await startSandboxedProcess({
      bwrapPath: this.bwrapPath,
      hostUid: this.hostUid,
      options: bwrapOptions(this.layout, req.cwd, req.env),
      argv: req.argv,
      seccomp: this.seccomp,
      stdin: req.stdin,
      enterNetns: (f) => withNetns(this.netnsFile, f),
      enroll: (pid) => this.res.cgroup!.addProcess(pid),
    });
    this.procs.add(p);
    void p.exited.then(() => this.procs.delete(p));
    if (this.destroyed) p.kill();
    return p;
  }

  readonly egress: EgressPlumbing = {
    listen: (kind, address, port) => socketInNetns(this.netnsFile, kind, address, port),
    interceptTcp: (address, port) => interceptTcpInNetns(this.netnsFile, address, port),
    bindReadOnlyFiles: (files) => {
      this.layout = { ...this.layout, extraRoFiles: [...(this.layout.extraRoFiles ?? []), ...files] };
    },
    originalDestination: (fd) => originalDestination(fd),
  };

  async counters(): Promise<LimitCounters> {
    return this.res.cgroup?.counters() ?? { oomKills: 0, pidsLimitHits: 0 };
  }

  destroy(): Promise<void> {
    this.destroyed ??= (async () => {
      for (const p of this.procs) p.kill();
      await Promise.all([...this.procs].map((p) => p.exited));
      await this.res.release();
    })();
    return this.destroyed;
  }
}

function mkOwned(path: string, uid: number, mode: number): string {
  mkdirSync(path);
  chownSync(path, uid, uid);
  chmodSync(path, mode); // after chown, and not subject to the umask
  return path;
}

function checkHostDir(p: string, stateDir: string): string {
  let real: string;
  try {
    real = realpathSync(p);
  } catch {
    throw new AirlockError('INVALID_SPEC', `workspace.hostDir "${p}" does not exist`, {
      field: 'workspace.hostDir',
    });
  }
  if (!statSync(real).isDirectory()) {
    throw new AirlockError('INVALID_SPEC', `workspace.hostDir "${p}" is not a directory`, {
      field: 'workspace.hostDir',
    });
  }
  const why = forbiddenWorkspaceReason(real, stateDir);
  if (why) {
    throw new AirlockError('INVALID_SPEC', `${why} (resolved from "${p}")`, { field: 'workspace.hostDir' });
  }
  return real;
}

function checkMountSource(p: string, stateDir: string, i: number): string {
  const field = `mounts.${i}.hostPath`;
  let real: string;
  try {
    real = realpathSync(p);
  } catch {
    throw new AirlockError('INVALID_SPEC', `${field} "${p}" does not exist`, { field });
  }
  const st = statSync(real);
  if (!st.isDirectory() && !st.isFile()) {
    throw new AirlockError('INVALID_SPEC', `${field} "${p}" is neither a file nor a directory`, { field });
  }
  const why = forbiddenMountSourceReason(real, stateDir);
  if (why) throw new AirlockError('INVALID_SPEC', `${why} (resolved from "${p}")`, { field });
  return real;
}

function readdirOr(dir: string): string[] {
  try {
    return readdirSync(dir);
  } catch {
    return [];
  }
}

function realpathOr(p: string): string {
  try {
    return realpathSync(p);
  } catch {
    return p;
  }
}

function recentlyCreated(dir: string): boolean {
  try {
    return Date.now() - statSync(dir).mtimeMs < 10_000;
  } catch {
    return false;
  }
}

function readTrim(p: string): string | undefined {
  try {
    return readFileSync(p, 'utf8').trim();
  } catch {
    return undefined;
  }
}

function findBwrap(): string {
  for (const p of ['/usr/bin/bwrap', '/usr/local/bin/bwrap']) if (existsSync(p)) return p;
  return 'bwrap';
}
