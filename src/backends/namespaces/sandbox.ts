// One live sandbox of the namespaces tier: its host state and the operations on all of it come from
// backends/host/ (HostSandbox); what this tier adds is how a process runs: each exec is one bwrap
// process tree entering fresh namespaces over that state, started from the sandbox's launch namespace.
import type {
  BackendProcess,
  BackendSandbox,
  EgressPlumbing,
  LimitCounters,
  SpawnRequest,
} from '../../core/backend.js';
import type { Duplex } from 'node:stream';
import type { SnapshotRecord } from '../../core/snapshot.js';
import { closeLaunchNamespace } from '../host/launcher.privileged.js';
import { withNetns } from '../host/netns.privileged.js';
import { HostSandbox, launchSharesKey, type HostSandboxParts } from '../host/index.js';
import { bwrapOptions } from './bwrap.js';
import { startSandboxedProcess, type StartOptions } from './process.js';

/** What this tier adds to a sandbox's host state. */
export interface BwrapParts {
  readonly bwrapPath: string;
  readonly seccomp: Buffer;
}

export class NamespacesSandbox implements BackendSandbox {
  readonly id: string;
  readonly hostUid: number;
  readonly egress: EgressPlumbing;
  private readonly host: HostSandbox;

  /**
   * The shared dirs the sandbox's launch namespace was made with: a namespace made ahead in the
   * warm slot (res.launchNs, complete when create added no mount) has the backend's /etc and /dev.
   */
  private launchShares: string;

  constructor(
    p: HostSandboxParts,
    private readonly b: BwrapParts,
  ) {
    this.host = new HostSandbox(p);
    this.id = p.id;
    this.hostUid = p.hostUid;
    this.egress = this.host.egress;
    this.launchShares = launchSharesKey(p.layout);
  }

  /**
   * Where bwrap is started from: the launcher's thread, in this sandbox's launch namespace (made at
   * the first exec, once every host mount of the sandbox exists, and again if the layout came to
   * bind another shared dir from); without a launcher, this thread in the host's namespaces.
   */
  private spawnVia(): Pick<StartOptions, 'via' | 'enterNetns'> {
    const p = this.host.p;
    const launcher = p.launcher;
    if (!launcher) return { enterNetns: (f) => withNetns(p.netns, f) };
    const key = launchSharesKey(this.host.layout);
    if (p.res.launchNs === undefined || key !== this.launchShares) {
      for (const s of key.split('\0')) launcher.share(s);
      const ns = launcher.sandboxNamespace(p.res.dir);
      void closeLaunchNamespace(p.res.launchNs);
      p.res.launchNs = ns;
      this.launchShares = key;
    }
    const mntns = p.res.launchNs;
    return { via: (call) => launcher.spawn(call, mntns, p.netns.fd) };
  }

  async spawn(req: SpawnRequest): Promise<BackendProcess> {
    this.host.assertAlive();
    const p = await startSandboxedProcess({
      ...this.spawnVia(),
      bwrapPath: this.b.bwrapPath,
      hostUid: this.hostUid,
      options: bwrapOptions(this.host.layout, req.cwd, req.env),
      argv: req.argv,
      seccomp: this.b.seccomp,
      stdin: req.stdin,
      enroll: (pid) => this.host.enroll(pid),
      cancelled: () => this.host.destroyed !== undefined,
    });
    this.host.track(p);
    this.host.p.processStarted?.();
    return p;
  }

  counters(): Promise<LimitCounters> {
    return this.host.counters();
  }

  snapshot(signal?: AbortSignal): Promise<SnapshotRecord> {
    return this.host.snapshot(signal);
  }

  pause(): Promise<void> {
    return this.host.pause();
  }

  resume(): Promise<void> {
    return this.host.resume();
  }

  connectPort(port: number, signal?: AbortSignal): Promise<Duplex> {
    return this.host.connectPort(port, signal);
  }

  destroy(): Promise<void> {
    return this.host.destroy();
  }
}
