// The gVisor tier: the namespaces tier's host state (size-capped disk, overlay workspace, snapshot
// layers, routeless netns, cgroup, leased uid) with every process run by runsc, so that a sandboxed
// process talks to gVisor's user-space kernel (the sentry) instead of the host kernel. See
// docs/threat-model.md for what this adds over the namespaces tier and what it does not.
import type { BackendContext, BackendProbe, ProbeCheck } from '../../core/backend.js';
import type { BackendName, Limits } from '../../core/spec.js';
import { NamespacesBackend, type NamespacesOptions } from '../namespaces/index.js';
import type { NamespacesSandbox, NamespacesSandboxParts } from '../namespaces/sandbox.js';
import { statSync } from 'node:fs';
import { join } from 'node:path';
import { makeRootfs } from './oci.privileged.js';
import { cachedPlatform, findRunsc, runscInfo, type Platform } from './runsc.js';
import { GvisorSandbox } from './sandbox.js';
import { gvisorHostLimits } from './limits.js';

export { GVISOR_EXEC_OVERHEAD } from './limits.js';

export interface GvisorOptions extends NamespacesOptions {
  readonly runscPath?: string;
  /** Force a platform instead of detecting one (kvm, systrap, ptrace). */
  readonly platform?: Platform;
}

export class GvisorBackend extends NamespacesBackend {
  override readonly name: BackendName = 'gvisor';
  /** Its processes are started by runsc, not bwrap. */
  protected override readonly startsBwrap = false;
  private readonly runscPath: string | undefined;
  private readonly forcedPlatform: Platform | undefined;
  private gvProbe: Promise<BackendProbe> | undefined;
  private platform: Platform | undefined;

  constructor(ctx: BackendContext, opts: GvisorOptions = {}) {
    super(ctx, opts);
    this.runscPath = opts.runscPath ?? findRunsc();
    this.forcedPlatform = opts.platform;
  }

  override probe(): Promise<BackendProbe> {
    this.gvProbe ??= this.probeGvisor();
    return this.gvProbe;
  }

  private async probeGvisor(): Promise<BackendProbe> {
    const base = await super.probe();
    const checks: ProbeCheck[] = base.checks.filter((c) => c.name !== 'bwrap');
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

  protected override hostLimits(l: Limits): Limits {
    return gvisorHostLimits(l, 1);
  }

  protected override async makeSandbox(parts: NamespacesSandboxParts): Promise<NamespacesSandbox> {
    const rootfs = makeRootfs(
      join(parts.res.dir, 'rootfs'),
      (parts.layout.roMounts ?? []).map(([host, path]) => ({ path, file: !statSync(host).isDirectory() })),
    );
    const sbx = new GvisorSandbox(parts, {
      runsc: this.runscPath!,
      platform: this.platform!,
      rootfs,
      layersRoot: this.layerStore.root,
    });
    const top = parts.spec.layers?.[0];
    const record = top === undefined ? undefined : this.layerStore.get(top);
    if (top !== undefined && record?.memory && record.memory.processes > 0) {
      try {
        await sbx.restore(this.layerStore.memoryDir(top));
      } catch (e) {
        await sbx.stopAll(); // the caller (create) releases the host state
        throw e;
      }
    }
    return sbx;
  }
}
