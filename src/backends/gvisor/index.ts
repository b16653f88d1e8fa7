// The gVisor tier: the host state of backends/host/ (size-capped disk, overlay workspace, snapshot
// layers, routeless netns, cgroup, leased uid) with every process run by runsc, so that a sandboxed
// process talks to gVisor's user-space kernel (the sentry) instead of the host kernel. See
// docs/threat-model.md for what this adds over the namespaces tier and what it does not.
import type {
  BackendContext,
  BackendProbe,
  BackendSandbox,
  BackendV1,
  PreparePlan,
  ProbeCheck,
  ReapReport,
  SnapshotStoreV1,
} from '../../core/backend.js';
import { AirlockError } from '../../core/errors.js';
import type { BackendName, SandboxSpec } from '../../core/spec.js';
import { SandboxHost, type HostOptions, type HostSandboxParts } from '../host/index.js';
import { statSync } from 'node:fs';
import { join } from 'node:path';
import { makeRootfs } from './oci.privileged.js';
import { cachedPlatform, findRunsc, runscInfo, type Platform } from './runsc.js';
import { GvisorSandbox } from './sandbox.js';
import { gvisorHostLimits } from './limits.js';

export { GVISOR_EXEC_OVERHEAD } from './limits.js';

export interface GvisorOptions extends HostOptions {
  readonly runscPath?: string;
  /** Force a platform instead of detecting one (kvm, systrap, ptrace). */
  readonly platform?: Platform;
}

export class GvisorBackend implements BackendV1 {
  readonly specificationVersion = 'v1' as const;
  readonly name: BackendName = 'gvisor';
  readonly snapshots: SnapshotStoreV1;
  private readonly host: SandboxHost;
  private readonly runscPath: string | undefined;
  private readonly forcedPlatform: Platform | undefined;
  private gvProbe: Promise<BackendProbe> | undefined;
  private platform: Platform | undefined;

  constructor(
    private readonly ctx: BackendContext,
    opts: GvisorOptions = {},
  ) {
    // Its processes are started by runsc, not bwrap; its cgroup also holds gVisor's own footprint.
    this.host = new SandboxHost(
      ctx,
      { name: this.name, startsBwrap: false, hostLimits: (l) => gvisorHostLimits(l, 1) },
      opts,
    );
    this.snapshots = this.host.snapshots;
    this.runscPath = opts.runscPath ?? findRunsc();
    this.forcedPlatform = opts.platform;
  }

  probe(): Promise<BackendProbe> {
    this.gvProbe ??= this.probeGvisor();
    return this.gvProbe;
  }

  private async probeGvisor(): Promise<BackendProbe> {
    const checks: ProbeCheck[] = this.host.checks();
    if (!this.runscPath) {
      checks.push({
        name: 'runsc',
        ok: false,
        detail: 'runsc not found: apt-get install runsc (scripts/setup.sh installs it)',
      });
    } else {
      try {
        const info = await runscInfo(this.runscPath);
        checks.push({ name: 'runsc', ok: true, detail: `runsc ${info.version} at ${info.path}` });
        if (this.forcedPlatform) {
          this.platform = this.forcedPlatform;
          checks.push({ name: 'platform', ok: true, detail: `${this.forcedPlatform} (forced by options)` });
        } else {
          const rep = await cachedPlatform(info, join(this.ctx.stateDir, 'gvisor-platform.json'));
          this.platform = rep.platform;
          checks.push({
            name: 'platform',
            ok: rep.platform !== undefined,
            detail:
              (rep.platform ? `${rep.platform}; ` : 'no platform runs a process here; ') +
              rep.tried.map((t) => `${t.platform}: ${t.detail}`).join('; '),
          });
        }
      } catch (e) {
        checks.push({ name: 'runsc', ok: false, detail: `runsc --version failed: ${(e as Error).message}` });
      }
    }
    const failed = checks.filter((c) => !c.ok && !c.optional);
    return failed.length
      ? { available: false, reason: failed.map((c) => `${c.name}: ${c.detail}`).join('; '), checks }
      : { available: true, checks };
  }

  async create(spec: SandboxSpec): Promise<BackendSandbox> {
    const probe = await this.probe();
    if (!probe.available)
      throw new AirlockError('BACKEND_UNAVAILABLE', `${this.name} backend unavailable: ${probe.reason}`);
    return this.host.create(spec, (parts) => this.makeSandbox(parts));
  }

  prepare(plan: PreparePlan): void {
    this.host.prepare(plan);
  }

  close(): Promise<void> {
    return this.host.close();
  }

  reapOrphans(): Promise<ReapReport> {
    return this.host.reapOrphans();
  }

  /** The live sandbox over prepared host state; a fork of a snapshot with memory restores its processes. */
  private async makeSandbox(parts: HostSandboxParts): Promise<GvisorSandbox> {
    // On an image root the overlay is the bundle root (its mount points are made in it); else an
    // empty read-only root of mount points.
    const rootfs =
      parts.layout.imageRoot?.dir ??
      makeRootfs(
        join(parts.res.dir, 'rootfs'),
        (parts.layout.roMounts ?? []).map(([host, path]) => ({ path, file: !statSync(host).isDirectory() })),
      );
    const sbx = new GvisorSandbox(parts, {
      runsc: this.runscPath!,
      platform: this.platform!,
      rootfs,
      layersRoot: this.host.layerStore.root,
    });
    const top = parts.spec.layers?.[0];
    const record = top === undefined ? undefined : this.host.layerStore.get(top);
    if (top !== undefined && record?.memory && record.memory.processes > 0) {
      try {
        await sbx.restore(this.host.layerStore.memoryDir(top));
      } catch (e) {
        await sbx.stopAll(); // the caller (create) releases the host state
        throw e;
      }
    }
    return sbx;
  }
}
