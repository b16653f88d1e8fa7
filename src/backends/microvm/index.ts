// The microVM tier: the host state of backends/host/ (uid lease, cgroup, routeless netns, sandbox dir)
// with every process run inside a guest kernel of the sandbox's own, booted by QEMU `-M microvm` (KVM
// where a probe boots a guest, TCG emulation otherwise). See docs/microvm.md for the decisions and
// what it does not do yet (host workspaces and mounts). Snapshots are whole VMs (sandbox.ts, snapshot.ts).
import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { closeSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import type {
  BackendContext,
  BackendProbe,
  BackendSandbox,
  BackendV1,
  ProbeCheck,
  ReapReport,
  SnapshotStoreV1,
} from '../../core/backend.js';
import { AirlockError } from '../../core/errors.js';
import type { BackendName, Limits, SandboxSpec } from '../../core/spec.js';
import { SandboxHost, type HostOptions, type HostSandboxParts } from '../host/index.js';
import { selfOwner } from '../host/state.js';
import { BootSnapshots, bootKey, type BootShape } from './bake.js';
import { detectAccel, type AccelReport } from './accel.js';
import {
  DEFAULT_CACHE_DIR,
  ensureAgent,
  ensureInitramfs,
  ensurePackageLayer,
  ensureRootfs,
  ensureVmmJail,
  findKernel,
  type Kernel,
} from './assets.js';
import {
  GUEST_KERNEL_BYTES,
  QEMU_OVERHEAD_BYTES,
  QEMU_TASKS,
  findQemu,
  qemuVersion,
  type Accel,
} from './qemu.js';
import { MicrovmSandbox } from './sandbox.js';
import type { VmAssets } from './start.js';
import { readVmRecord } from './snapshot.js';

const run = promisify(execFile);

export interface MicrovmOptions extends HostOptions {
  /** Where the guest kernel, agent, initramfs and rootfs images live (default /var/cache/airlock/microvm). */
  readonly cacheDir?: string;
  readonly qemuPath?: string;
  /** Force an accelerator instead of probing. */
  readonly accel?: Accel;
  /**
   * Creates restore a baked boot snapshot of their machine shape instead of booting (bake.ts;
   * default true). False: every create boots its guest kernel (tests and benchmarks of cold boot).
   */
  readonly bootSnapshots?: boolean;
}

/** The cgroup holding a sandbox holds its QEMU: the guest's RAM plus QEMU's own footprint. */
export function microvmHostLimits(l: Limits): Limits {
  return { ...l, memoryBytes: l.memoryBytes + GUEST_KERNEL_BYTES + QEMU_OVERHEAD_BYTES, pids: QEMU_TASKS };
}

/** What this milestone of the tier cannot do yet, as the typed error a create gets. */
function unsupported(spec: SandboxSpec): string | undefined {
  if (spec.workspace.mode !== 'empty')
    return `workspace mode '${spec.workspace.mode}' (host dirs are not shared into the VM yet)`;
  if (spec.mounts.length) return 'mounts (host dirs are not shared into the VM yet)';
  return undefined;
}

export class MicrovmBackend implements BackendV1 {
  readonly specificationVersion = 'v1' as const;
  readonly name: BackendName = 'microvm';
  /** Snapshots are whole VMs (memory and device state): see sandbox.ts saveVm and snapshot.ts. */
  readonly snapshots: SnapshotStoreV1;
  private readonly host: SandboxHost;
  private readonly cacheDir: string;
  private readonly qemuPath: string | undefined;
  private readonly forcedAccel: Accel | undefined;
  private vmProbe: Promise<BackendProbe> | undefined;
  private kernel: Kernel | undefined;
  private accel: AccelReport | undefined;
  private bootAssets: Promise<Omit<VmAssets, 'rootfs'>> | undefined;
  private qemuVer = 'unknown';
  /** The baked boot snapshots, or undefined when creates always boot. */
  private readonly boots: BootSnapshots | undefined;

  constructor(
    private readonly ctx: BackendContext,
    opts: MicrovmOptions = {},
  ) {
    this.host = new SandboxHost(
      ctx,
      // Egress goes through a tap made at boot (tap.privileged.ts), not listeners made ahead.
      { name: this.name, startsBwrap: false, hostLimits: microvmHostLimits, egressAhead: false },
      opts,
    );
    this.snapshots = this.host.snapshots;
    this.cacheDir = opts.cacheDir ?? DEFAULT_CACHE_DIR;
    this.qemuPath = opts.qemuPath ?? findQemu();
    this.forcedAccel = opts.accel;
    if (opts.bootSnapshots !== false) {
      const store = this.host.layerStore;
      this.boots = new BootSnapshots(join(ctx.stateDir, 'microvm-boot'), () => {
        // Named like a layer capture in progress: the layer store's reaper removes it if we die.
        const o = selfOwner();
        return join(store.root, `.tmp-${o.pid}-${o.startTicks}-${randomBytes(6).toString('hex')}`);
      });
    }
  }

  probe(): Promise<BackendProbe> {
    this.vmProbe ??= this.probeVm();
    return this.vmProbe;
  }

  private async probeVm(): Promise<BackendProbe> {
    const checks: ProbeCheck[] = this.host.checks();
    if (!this.qemuPath) {
      checks.push({
        name: 'qemu',
        ok: false,
        detail:
          'qemu-system-x86_64 not found: apt-get install qemu-system-x86 (scripts/setup.sh installs it)',
      });
    } else {
      try {
        this.qemuVer = await qemuVersion(this.qemuPath);
        checks.push({ name: 'qemu', ok: true, detail: `QEMU ${this.qemuVer} at ${this.qemuPath}` });
      } catch (e) {
        checks.push({ name: 'qemu', ok: false, detail: `qemu --version failed: ${(e as Error).message}` });
      }
    }
    const k = findKernel(this.cacheDir);
    if (typeof k === 'string') checks.push({ name: 'guest kernel', ok: false, detail: k });
    else {
      this.kernel = k;
      checks.push({ name: 'guest kernel', ok: true, detail: `${k.version} at ${k.vmlinuz}` });
    }
    for (const [tool, pkg] of [
      ['gcc', 'gcc and libc6-dev'],
      ['mkfs.erofs', 'erofs-utils'],
    ] as const) {
      try {
        await run('sh', ['-c', `command -v ${tool}`], { timeout: 10_000 });
        checks.push({ name: tool, ok: true, detail: `${tool} found` });
      } catch {
        checks.push({ name: tool, ok: false, detail: `${tool} not found: apt-get install ${pkg}` });
      }
    }
    let failed = checks.filter((c) => !c.ok && !c.optional);
    if (!failed.length) {
      try {
        const assets = await this.assets();
        this.accel = this.forcedAccel
          ? { accel: this.forcedAccel, detail: `${this.forcedAccel} (forced by options)` }
          : await detectAccel(
              this.qemuPath!,
              assets.kernel,
              assets.initramfs,
              join(this.ctx.stateDir, 'microvm-accel.json'),
              `${this.qemuPath}:${this.kernel!.version}`,
            );
        checks.push({ name: 'accelerator', ok: true, detail: this.accel.detail });
      } catch (e) {
        checks.push({ name: 'guest assets', ok: false, detail: (e as Error).message });
      }
      failed = checks.filter((c) => !c.ok && !c.optional);
    }
    return failed.length
      ? { available: false, reason: failed.map((c) => `${c.name}: ${c.detail}`).join('; '), checks }
      : { available: true, checks };
  }

  /** Agent and initramfs, built once (cached on disk by content): all the probe needs. */
  private assets(): Promise<Omit<VmAssets, 'rootfs'>> {
    this.bootAssets ??= (async () => {
      const agent = await ensureAgent(this.cacheDir);
      const initramfs = await ensureInitramfs(this.cacheDir, this.kernel!, agent);
      const vmmJail = await ensureVmmJail(this.cacheDir);
      return {
        qemu: this.qemuPath!,
        accel: 'tcg' as Accel,
        kernel: this.kernel!.vmlinuz,
        initramfs,
        vmmJail,
      };
    })();
    this.bootAssets.catch(() => (this.bootAssets = undefined));
    return this.bootAssets;
  }

  async create(spec: SandboxSpec, signal?: AbortSignal): Promise<BackendSandbox> {
    const probe = await this.probe();
    if (!probe.available)
      throw new AirlockError('BACKEND_UNAVAILABLE', `${this.name} backend unavailable: ${probe.reason}`);
    return this.host.create(spec, (parts) => this.makeSandbox(parts, signal));
  }

  close(): Promise<void> {
    return this.host.close();
  }

  reapOrphans(): Promise<ReapReport> {
    // Baked boot snapshots whose kernel, agent or rootfs is gone or replaced (bake.ts prune).
    try {
      this.boots?.prune();
    } catch (e) {
      this.ctx.logger.warn({ err: (e as Error).message }, 'microvm: pruning baked boot snapshots failed');
    }
    return this.host.reapOrphans();
  }

  private async makeSandbox(parts: HostSandboxParts, signal?: AbortSignal): Promise<MicrovmSandbox> {
    // Checked after the host state validated the spec (bad host dirs and mounts are INVALID_SPEC on
    // every tier); what is left is only what this tier cannot do yet.
    const spec = parts.spec;
    const no = unsupported(spec);
    if (no)
      throw new AirlockError(
        'BACKEND_UNAVAILABLE',
        `the microvm backend does not support ${no} yet; use the namespaces or gvisor backend for it`,
      );
    const a = await this.assets();
    // The rootfs is a list of layer dirs, bottom first (image layers will join here): the host
    // packages, then the generated /etc every tier shows its sandboxes.
    // The package layer is built on the first create (minutes on a cold cache), never by the probe.
    const packages = await ensurePackageLayer(this.cacheDir);
    const rootfs = await ensureRootfs(this.cacheDir, [
      { dir: packages },
      { dir: parts.layout.etcDir, at: '/etc' },
    ]);
    const sbx = new MicrovmSandbox(parts, (phase) =>
      this.ctx.logger.debug({ sandbox: parts.id, phase }, 'microvm phase'),
    );
    const assets: VmAssets = { ...a, accel: this.accel!.accel, rootfs };
    const fork = this.restoreOf(spec);
    if (fork || !this.boots) {
      await sbx.boot(assets, signal, fork);
      return sbx;
    }
    const l = spec.limits;
    const shape: BootShape = {
      kernel: assets.kernel,
      initramfs: assets.initramfs,
      rootfs,
      memoryBytes: l.memoryBytes,
      vcpus: l.cpus,
      diskBytes: l.diskBytes,
      net: spec.network !== undefined,
      qemu: assets.qemu,
      qemuVersion: this.qemuVer,
      accel: assets.accel,
    };
    const key = bootKey(shape);
    const baked = this.boots.find(key);
    if (baked) {
      try {
        await sbx.boot(assets, signal, baked);
        return sbx;
      } catch (e) {
        // Killed or aborted meanwhile: that is the create's answer. Anything else is the snapshot's
        // fault (QEMU refused the stream, the guest never answered): drop it, boot and bake again.
        if (AirlockError.isInstance(e) && (e.code === 'ABORTED' || e.code === 'SANDBOX_GONE')) throw e;
        this.ctx.logger.warn(
          { key, err: (e as Error).message },
          'microvm: the baked boot snapshot did not restore; booting and baking it again',
        );
        this.boots.discard(key);
      } finally {
        closeSync(baked.ramFd);
      }
    }
    await sbx.boot(assets, signal, undefined, this.boots.claim(key, shape));
    return sbx;
  }

  /**
   * A fork: the saved VM of the top layer (the host state already checked the chain). A microVM
   * sandbox keeps all it wrote in guest RAM, so only a microVM snapshot's memory can start one.
   */
  private restoreOf(spec: SandboxSpec): Parameters<MicrovmSandbox['boot']>[2] {
    const top = spec.layers?.[0];
    if (top === undefined) return undefined;
    const store = this.host.layerStore;
    const record = store.get(top);
    if (record?.backend !== this.name || !record.memory || record.memory.skipped !== undefined)
      throw new AirlockError(
        'INVALID_SPEC',
        `layers.0: snapshot ${top} holds no microVM state (a microvm sandbox starts only from a snapshot of a microvm sandbox)`,
        { field: 'layers.0' },
      );
    const memoryDir = store.memoryDir(top);
    return { memoryDir, vm: readVmRecord(memoryDir) };
  }
}
