// One live sandbox's host state and the operations on all of it, whatever runs its processes: the
// freeze holds behind pause/resume and snapshots, the snapshot itself, the egress plumbing into its
// netns, the limit counters, and destroy (every process gone, then the host state released). Each
// tier's sandbox class composes one and adds how a process starts (spawn).
import { statfsSync } from 'node:fs';
import { dirname } from 'node:path';
import type { BackendProcess, EgressPlumbing, LimitCounters } from '../../core/backend.js';
import { AirlockError } from '../../core/errors.js';
import type { SnapshotRecord } from '../../core/snapshot.js';
import { MAX_LAYERS, type SandboxSpec } from '../../core/spec.js';
import type { CgroupHandle } from './cgroups.privileged.js';
import type { CaptureSource } from './layer-capture.privileged.js';
import type { CaptureRequest, LayerStore } from './layers.js';
import type { Launcher } from './launcher.privileged.js';
import type { SandboxLayout } from './layout.js';
import {
  anyReadable,
  interceptTcpInNetns,
  originalDestination,
  socketInNetns,
  type NetnsHandle,
} from './netns.privileged.js';
import { MAX_PORT_CONNECTIONS, dialInNetns } from './port-dial.privileged.js';
import type { HostResources } from './resources.js';
import type { Socket } from 'node:net';

/** A sandbox's host state, as SandboxHost.create hands it to the tier. */
export interface HostSandboxParts {
  readonly id: string;
  readonly hostUid: number;
  readonly layout: SandboxLayout;
  readonly res: HostResources;
  readonly netns: NetnsHandle;
  readonly spec: SandboxSpec;
  readonly store: LayerStore;
  /** What a snapshot copies: the workspace and home trees (plain dirs or overlay upper dirs). */
  readonly sources: readonly CaptureSource[];
  /** The sandbox's tmpfs disk. */
  readonly disk: string;
  /** Transparent interception to this address:port is already set up in the netns (warm pool). */
  readonly intercepting?: { readonly address: string; readonly port: number };
  /**
   * Takes the release of the host state once every process is gone (mounts, dirs, cgroup dirs, uid
   * lease), to start it soon (batched with others') and track it until it settles, so that close()
   * waits for it.
   */
  readonly teardown: (release: () => Promise<void>) => void;
  /** Told each time a process of the sandbox has started (the backend then refills its warm pool). */
  readonly processStarted?: () => void;
  /** Starts bwrap in a mount namespace of the sandbox's own; absent: from the host's (as before). */
  readonly launcher?: Launcher;
}

/**
 * Work a tier does before a snapshot's filesystem copy (gVisor checkpoints its processes' memory
 * here, with them stopped until `release`).
 */
export type PrepareCapture = (
  signal?: AbortSignal,
) => Promise<{ memory?: CaptureRequest['memory']; release?: () => Promise<void> }>;

export class HostSandbox {
  readonly id: string;
  readonly hostUid: number;
  /** What the tier shows its processes (egress may add read-only files: bindReadOnlyFiles). */
  layout: SandboxLayout;
  /** The sandbox's running processes (the tier adds each it starts: track). */
  readonly procs = new Set<BackendProcess>();
  /** Cgroup enrolments in flight: processes about to start (or, if destroyed meanwhile, not to). */
  private readonly enrolling = new Set<Promise<void>>();
  private readonly captures = new Set<Promise<unknown>>();
  /** Open connections into the sandbox's ports (connectPort): destroyed with it. */
  private readonly portSockets = new Set<Socket>();
  /** Connects to its ports in flight (counted against MAX_PORT_CONNECTIONS with the open ones). */
  private dialing = 0;
  /** Set once destroy() has begun. */
  destroyed: Promise<void> | undefined;
  /** Freeze holders: pause() and each running snapshot. Frozen while > 0. */
  private holds = 0;
  paused = false;
  /** Freeze/thaw steps run one at a time, in order. */
  private freezeQueue: Promise<void> = Promise.resolve();

  constructor(
    readonly p: HostSandboxParts,
    private readonly prepareCapture: PrepareCapture = () => Promise.resolve({}),
  ) {
    this.id = p.id;
    this.hostUid = p.hostUid;
    this.layout = p.layout;
  }

  /** SANDBOX_GONE once destroy() has begun. */
  assertAlive(): void {
    if (this.destroyed) throw gone(this.id);
  }

  /** Enrol `pid` in the sandbox's cgroup, tracked so that destroy() waits for it. */
  enroll(pid: number): Promise<void> {
    const e = this.p.res.cgroup!.enroll(pid);
    this.enrolling.add(e);
    const done = (): boolean => this.enrolling.delete(e);
    e.then(done, done);
    return e;
  }

  /** A process of the sandbox has started: tracked until it exits (destroy kills it). */
  track(p: BackendProcess): void {
    this.procs.add(p);
    void p.exited.then(() => this.procs.delete(p));
    if (this.destroyed) p.kill();
  }

  readonly egress: EgressPlumbing = {
    listen: (kind, address, port) => socketInNetns(this.p.netns, kind, address, port),
    interceptTcp: (address, port) => {
      const ready = this.p.intercepting;
      if (!ready) return interceptTcpInNetns(this.p.netns, address, port);
      if (ready.address !== address || ready.port !== port)
        throw new AirlockError(
          'INTERNAL',
          `netns prepared for ${ready.address}:${ready.port}, not ${address}:${port}`,
        );
    },
    bindReadOnlyFiles: (files) => {
      this.layout = { ...this.layout, extraRoFiles: [...(this.layout.extraRoFiles ?? []), ...files] };
    },
    originalDestination: (fd) => originalDestination(fd),
    waiting: (fds) => anyReadable(fds),
  };

  /** A connection to 127.0.0.1:`port` inside the sandbox's netns (see port-dial.privileged.ts). */
  async connectPort(port: number, signal?: AbortSignal, address?: '10.0.2.2'): Promise<Socket> {
    this.assertAlive();
    if (this.portSockets.size + this.dialing >= MAX_PORT_CONNECTIONS) {
      throw new AirlockError(
        'CAPACITY_EXHAUSTED',
        `sandbox ${this.id} already has ${MAX_PORT_CONNECTIONS} open connections to its ports; close some first`,
      );
    }
    let s: Socket;
    this.dialing++;
    try {
      s = await dialInNetns(this.p.netns, port, {
        id: this.id,
        ...(this.p.launcher ? { launcher: this.p.launcher } : {}),
        ...(signal ? { signal } : {}),
        ...(address ? { address } : {}),
      });
    } catch (e) {
      // Killed meanwhile (its netns may be released already): say so, not how the dial failed.
      if (this.destroyed) throw gone(this.id);
      throw e;
    } finally {
      this.dialing--;
    }
    if (this.destroyed) {
      s.destroy();
      throw gone(this.id);
    }
    this.portSockets.add(s);
    s.once('close', () => this.portSockets.delete(s));
    return s;
  }

  async counters(): Promise<LimitCounters> {
    return this.p.res.cgroup?.counters() ?? { oomKills: 0, pidsLimitHits: 0 };
  }

  private cgroup(): CgroupHandle {
    const cg = this.p.res.cgroup;
    if (!cg) throw new AirlockError('INTERNAL', `sandbox ${this.id} has no cgroup`);
    return cg;
  }

  private queued<T>(f: () => Promise<T>): Promise<T> {
    const run = this.freezeQueue.then(f);
    this.freezeQueue = run.then(
      () => {},
      () => {},
    );
    return run;
  }

  /** Take a freeze hold: frozen from the first holder until the last lets go. */
  private hold(): Promise<void> {
    return this.queued(async () => {
      if (this.holds === 0) await this.cgroup().freeze();
      this.holds++;
    });
  }

  private unhold(): Promise<void> {
    return this.queued(async () => {
      this.holds--;
      if (this.holds === 0) await this.cgroup().thaw();
    });
  }

  pause(): Promise<void> {
    if (this.destroyed) return Promise.reject(gone(this.id));
    return this.queued(async () => {
      if (this.paused) return;
      if (this.holds === 0) await this.cgroup().freeze();
      this.holds++;
      this.paused = true;
    });
  }

  resume(): Promise<void> {
    if (this.destroyed) return Promise.reject(gone(this.id));
    return this.queued(async () => {
      if (!this.paused) return;
      this.paused = false;
      this.holds--;
      if (this.holds === 0) await this.cgroup().thaw();
    });
  }

  /**
   * Copy the workspace and home into a new layer with every process of the sandbox frozen, so the
   * copy is consistent and nothing in the sandbox can change the tree under the (root) copier.
   * Without a freezer this fails closed: copying a live hostile tree as root is not done.
   */
  snapshot(signal?: AbortSignal): Promise<SnapshotRecord> {
    if (this.destroyed) return Promise.reject(gone(this.id));
    if (this.p.spec.rootfs && !this.p.sources.some((s) => s.area === 'root')) {
      // Without the image root's upper dir a fork would lose what was written to the root, so a
      // snapshot is refused rather than silently incomplete (a tier that does not capture it).
      return Promise.reject(
        new AirlockError(
          'INVALID_ARGUMENT',
          `sandbox ${this.id} runs on an image: snapshots of image sandboxes are not supported yet; ` +
            'keep state in /workspace and start a new sandbox on the same image instead',
        ),
      );
    }
    if ((this.p.spec.layers?.length ?? 0) >= MAX_LAYERS) {
      return Promise.reject(
        new AirlockError(
          'INVALID_ARGUMENT',
          `sandbox ${this.id} already runs on ${MAX_LAYERS} snapshot layers, the deepest chain there can be; ` +
            'start a fresh sandbox to snapshot more',
        ),
      );
    }
    if (!this.cgroup().canFreeze) {
      return Promise.reject(
        new AirlockError(
          'BACKEND_UNAVAILABLE',
          'snapshots freeze the sandbox while copying, which needs the cgroup freezer (v1 "freezer" controller or cgroup v2 cgroup.freeze); this host has neither',
        ),
      );
    }
    const run = (async () => {
      const pre = await this.prepareCapture(signal);
      try {
        await this.hold();
        try {
          return await this.p.store.capture({
            sources: this.p.sources,
            selfUid: this.hostUid,
            parent: {
              layers: this.p.spec.layers ?? [],
              workspace: {
                mode: this.p.spec.workspace.mode,
                ...(this.p.spec.workspace.hostDir !== undefined
                  ? { hostDir: this.p.spec.workspace.hostDir }
                  : {}),
              },
            },
            spec: this.p.spec,
            source: this.id,
            checkpoint: () => {
              if (this.destroyed) throw gone(this.id);
              if (signal?.aborted) throw new AirlockError('ABORTED', 'snapshot aborted');
            },
            maxContentBytes: this.p.spec.limits.diskBytes,
            usedBytes: usedBytes(this.p.disk),
            backend: this.p.spec.backend,
            ...(pre.memory ? { memory: pre.memory } : {}),
          });
        } finally {
          await this.unhold();
        }
      } finally {
        await pre.release?.();
      }
    })();
    this.captures.add(run);
    void run.then(
      () => this.captures.delete(run),
      () => this.captures.delete(run),
    );
    return run;
  }

  destroy(): Promise<void> {
    this.destroyed ??= (async () => {
      // A capture in progress sees `destroyed` at its next entry and stops; wait for it so that its
      // thaw happens before the cgroup is removed.
      await Promise.allSettled([...this.captures]);
      await this.freezeQueue;
      // A process whose enrolment is in flight either starts inside the cgroup before the sweep
      // below or sees `destroyed` and never starts (process.ts): wait until it has done either.
      await Promise.allSettled([...this.enrolling]);
      for (const s of this.portSockets) s.destroy();
      for (const p of this.procs) p.kill();
      // Frozen (paused) processes do not act on SIGKILL until thawed (cgroup v1): kill everything in
      // the cgroup while it is frozen, then thaw it, so they die without running another instruction.
      if (this.holds > 0) await this.p.res.cgroup?.killAll();
      await Promise.all([...this.procs].map((p) => p.exited));
      // Nothing of the sandbox runs once its cgroup is empty (this also catches a process that was
      // being started while the sandbox was killed). The rest of the host state (mounts, dirs, cgroup
      // dirs, uid lease) is released after kill resolves, tracked by the backend: its close() waits
      // for it, and if Airlock dies first the sandbox dir is an orphan the next reaper removes.
      await this.p.res.cgroup?.killAll();
      this.p.teardown(() => this.p.res.release());
    })();
    return this.destroyed;
  }
}

/** The host dirs (outside the sandbox's own) bwrap binds from with this layout, as one key. */
export function launchSharesKey(l: Pick<SandboxLayout, 'etcDir' | 'devDir' | 'extraRoFiles'>): string {
  const dirs = [
    l.etcDir,
    ...(l.devDir ? [l.devDir] : []),
    ...(l.extraRoFiles ?? []).map(([h]) => dirname(h)),
  ];
  return [...new Set(dirs)].join('\0');
}

function gone(id: string): AirlockError {
  return new AirlockError('SANDBOX_GONE', `sandbox ${id} was killed`);
}

function usedBytes(disk: string): number {
  const s = statfsSync(disk);
  return (s.blocks - s.bfree) * s.bsize;
}
