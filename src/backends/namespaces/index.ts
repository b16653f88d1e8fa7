// The namespaces tier: bubblewrap over the host state of backends/host/ (a size-capped tmpfs disk,
// overlayfs workspace, cgroup, netns, uid lease), plus seccomp. A sandbox is that host state; each
// exec is one bwrap process tree entering fresh namespaces over it. See docs/threat-model.md for
// what this stops.
import { execFileSync } from 'node:child_process';
import { accessSync, constants, existsSync } from 'node:fs';
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
import { SandboxHost, type HostOptions } from '../host/index.js';
import { buildSeccompFilter } from '../host/seccomp.privileged.js';
import { NamespacesSandbox } from './sandbox.js';

export interface NamespacesOptions extends HostOptions {
  readonly bwrapPath?: string;
}

export class NamespacesBackend implements BackendV1 {
  readonly specificationVersion = 'v1' as const;
  readonly name: BackendName = 'namespaces';
  readonly snapshots: SnapshotStoreV1;
  private readonly host: SandboxHost;
  private readonly bwrapPath: string;
  private seccomp: Buffer | undefined;
  private probed: BackendProbe | undefined;

  constructor(ctx: BackendContext, opts: NamespacesOptions = {}) {
    this.bwrapPath = opts.bwrapPath ?? findBwrap();
    this.host = new SandboxHost(ctx, { name: this.name, startsBwrap: true, hostLimits: (l) => l }, opts);
    this.snapshots = this.host.snapshots;
  }

  async probe(): Promise<BackendProbe> {
    if (this.probed) return this.probed;
    const [root, ...rest] = this.host.checks();
    const checks: ProbeCheck[] = [root!, bwrapCheck(this.bwrapPath), ...rest];
    const failed = checks.filter((c) => !c.ok && !c.optional);
    this.probed = failed.length
      ? { available: false, reason: failed.map((c) => `${c.name}: ${c.detail}`).join('; '), checks }
      : { available: true, checks };
    return this.probed;
  }

  async create(spec: SandboxSpec): Promise<BackendSandbox> {
    const probe = await this.probe();
    if (!probe.available)
      throw new AirlockError('BACKEND_UNAVAILABLE', `${this.name} backend unavailable: ${probe.reason}`);
    const seccomp = (this.seccomp ??= buildSeccompFilter());
    return this.host.create(
      spec,
      async (parts) => new NamespacesSandbox(parts, { bwrapPath: this.bwrapPath, seccomp }),
    );
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
}

/**
 * bwrap is there and executable. Not run (`--version` cost a one-shot CLI run a process spawn on its
 * critical path): `airlock doctor` gives its version, and a bwrap that cannot start fails the
 * create that starts it.
 */
function bwrapCheck(bwrapPath: string): ProbeCheck {
  try {
    if (bwrapPath.startsWith('/')) accessSync(bwrapPath, constants.X_OK);
    else execFileSync(bwrapPath, ['--version'], { encoding: 'utf8' }); // a PATH lookup
    return { name: 'bwrap', ok: true, detail: `bwrap at ${bwrapPath}` };
  } catch {
    return { name: 'bwrap', ok: false, detail: 'bubblewrap not found: apt-get install bubblewrap' };
  }
}

function findBwrap(): string {
  for (const p of ['/usr/bin/bwrap', '/usr/local/bin/bwrap']) if (existsSync(p)) return p;
  return 'bwrap';
}
