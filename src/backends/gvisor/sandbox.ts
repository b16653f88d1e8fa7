// One live sandbox of the gVisor tier. Its host state and the operations on all of it come from
// backends/host/ (HostSandbox: disk, overlays, netns, cgroup, uid lease); what this tier adds is how a
// process runs: every exec is its own
// runsc container (a fresh sentry, pid namespace and mount view, like a fresh bwrap per exec) over
// that shared state. Snapshots also checkpoint the memory of the execs that are still running, and a
// fork restores them: they continue with their in-memory state.
import { createHash, randomBytes } from 'node:crypto';
import { execFile } from 'node:child_process';
import { createReadStream, mkdirSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Duplex } from 'node:stream';
import { promisify } from 'node:util';
import { z } from 'zod';
import type {
  BackendProcess,
  BackendSandbox,
  EgressPlumbing,
  LimitCounters,
  SpawnRequest,
} from '../../core/backend.js';
import { AirlockError } from '../../core/errors.js';
import type { SnapshotRecord } from '../../core/snapshot.js';
import { readRecordFile } from '../../core/validate.js';
import type { CaptureRequest } from '../host/layers.js';
import { withNetns } from '../host/netns.privileged.js';
import { HostSandbox, type HostSandboxParts } from '../host/index.js';
import { selfOwner } from '../host/state.js';
import { ociConfig, type OciProcess } from './oci.privileged.js';
import { startRunsc } from './process.privileged.js';
import { globalArgs, type Platform } from './runsc.js';
import { gvisorHostLimits } from './limits.js';

const run = promisify(execFile);

export interface GvisorParts {
  readonly runsc: string;
  readonly platform: Platform;
  readonly rootfs: string;
  /** Where snapshot layers live (memory images are staged beside them, then moved in). */
  readonly layersRoot: string;
}

/** What a checkpointed exec was started as (the fork's bundle runs the same process spec). */
const ProcessFileSchema = z
  .object({
    argv: z.array(z.string()).min(1),
    env: z.record(z.string(), z.string()),
    cwd: z.string().startsWith('/'),
  })
  .strict();

const HOSTINET_REASON =
  'the sandbox has a network policy, so its execs use the host network stack of its netns, which runsc cannot checkpoint; snapshot before attaching egress (a sandbox without `network`) to keep process memory';

/** How long a fork may take to restore one checkpointed process. */
const RESTORE_TIMEOUT_MS = 60_000;

const PAUSED_REASON =
  'the sandbox is paused: its frozen processes (and gVisor with them) cannot be checkpointed; resume it before the snapshot to keep process memory';

interface Container {
  readonly process: OciProcess;
  readonly proc: BackendProcess;
}

export class GvisorSandbox implements BackendSandbox {
  readonly id: string;
  readonly hostUid: number;
  readonly egress: EgressPlumbing;
  private readonly host: HostSandbox;
  private seq = 0;
  private readonly containers = new Map<string, Container>();
  /** Containers started and not yet gone (sizes the cgroup's allowance for gVisor itself). */
  private running = 0;
  /** Dead tasks still charged to the cgroup when the last exec started from an idle sandbox. */
  private lingering = 0;
  /** The cgroup limits last written (memory/pids/cpus), so unchanged ones are not rewritten. */
  private written: string | undefined;

  constructor(
    parts: HostSandboxParts,
    private readonly g: GvisorParts,
  ) {
    this.host = new HostSandbox(parts, (signal) => this.prepareCapture(signal));
    this.id = parts.id;
    this.hostUid = parts.hostUid;
    this.egress = this.host.egress;
    // create() left the cgroup at the limits for one exec.
    this.written = limitsKey(gvisorHostLimits(parts.spec.limits, 1));
  }

  private get network(): 'none' | 'host' {
    // Egress listeners live in the sandbox's (routeless) netns; only the host stack reaches them.
    return this.host.p.spec.network ? 'host' : 'none';
  }

  private runscArgs(): string[] {
    return globalArgs({
      root: join(this.host.p.res.dir, 'runsc'),
      platform: this.g.platform,
      network: this.network,
    });
  }

  async spawn(req: SpawnRequest): Promise<BackendProcess> {
    this.host.assertAlive();
    return (await this.start({ argv: req.argv, env: req.env, cwd: req.cwd }, req.stdin)).proc;
  }

  /** One container: `runsc run` (or `restore` from a checkpoint image) in the foreground. */
  private async start(
    process: OciProcess,
    stdin: boolean,
    image?: string,
  ): Promise<{ cid: string; proc: BackendProcess }> {
    const cid = `${this.id}-${++this.seq}`;
    const bundle = join(this.host.p.res.dir, 'bundles', cid);
    mkdirSync(bundle, { recursive: true, mode: 0o700 });
    const config = ociConfig({
      rootfs: this.g.rootfs,
      layout: this.host.layout,
      hostUid: this.hostUid,
      process,
      ownNetns: this.network === 'none',
      pids: this.host.p.spec.limits.pids,
    });
    writeFileSync(join(bundle, 'config.json'), JSON.stringify(config), { mode: 0o600 });
    const sub = image ? ['restore', '--image-path', image] : ['run'];
    // With nothing running, every task the cgroup still charges is dead: a finished sentry's systrap
    // helpers are released by the kernel seconds after runsc exits (after a fork storm: dozens).
    // They run nothing, but they hold pid slots; allow for them so the next exec's sentry fits.
    if (this.running === 0) this.lingering = this.host.p.res.cgroup?.tasks() ?? 0;
    this.running++;
    this.applyLimits();
    const p = await startRunsc({
      runsc: this.g.runsc,
      args: [...this.runscArgs(), ...sub, '--bundle', bundle, cid],
      stdin,
      enroll: (pid) => this.host.p.res.cgroup!.addProcess(pid),
      enterNetns: (f) => withNetns(this.host.p.netns, f),
    });
    const exited = p.exited.then((x) => {
      this.running--;
      this.containers.delete(cid);
      rmSync(bundle, { recursive: true, force: true });
      this.applyLimits();
      return x;
    });
    const proc: BackendProcess = { ...p, exited };
    this.containers.set(cid, { process, proc });
    this.host.track(proc);
    return { cid, proc };
  }

  /**
   * The cgroup holds the sandboxed processes and gVisor itself: allow the spec's limits plus gVisor's
   * footprint per running exec. Lowering memory below what is in use fails (cgroup v1 EBUSY): it
   * then stays where it is until the next change.
   */
  private applyLimits(): void {
    if (this.host.destroyed) return;
    try {
      const l = gvisorHostLimits(this.host.p.spec.limits, this.running);
      const want = { ...l, pids: l.pids + this.lingering };
      const key = limitsKey(want);
      if (key === this.written) return; // one exec at a time: nothing changes between execs
      this.host.p.res.cgroup?.setLimits(want);
      this.written = key;
    } catch {
      // see above
    }
  }

  /** Start every process checkpointed in `memoryDir` (a fork of a snapshot with memory). */
  async restore(memoryDir: string): Promise<void> {
    const dirs = readdirSync(memoryDir)
      .filter((n) => /^\d+$/.test(n))
      .sort((a, b) => Number(a) - Number(b));
    for (const d of dirs) {
      const image = join(memoryDir, d);
      const process = readRecordFile(
        ProcessFileSchema,
        join(image, 'process.json'),
        'checkpoint process file',
      );
      if (!process) throw new AirlockError('INTERNAL', `checkpoint ${image} has no process.json`);
      const { cid, proc } = await this.start(process, false, image);
      // Nobody reads a restored process's output: drain it so it never blocks on a full pipe.
      proc.stdout.resume();
      let err = '';
      proc.stderr.on('data', (c: Buffer) => void (err = (err + c.toString()).slice(-4000)));
      await this.waitRunning(cid, proc, () => err);
    }
  }

  /** Resolve once runsc reports the restored container running; fail if runsc exits first. */
  private async waitRunning(cid: string, p: BackendProcess, stderr: () => string): Promise<void> {
    let gone = false;
    void p.exited.then(() => (gone = true));
    const deadline = Date.now() + RESTORE_TIMEOUT_MS;
    while (!gone && Date.now() < deadline) {
      try {
        const { stdout } = await run(this.g.runsc, [...this.runscArgs(), 'state', cid], {
          timeout: 10_000,
          env: {},
        });
        if (/"status":\s*"running"/.test(stdout)) return;
      } catch {
        // not created yet
      }
      await new Promise((r) => setTimeout(r, 5));
    }
    p.kill();
    const why = stderr().trim().split('\n').pop() ?? '';
    throw new AirlockError(
      'INTERNAL',
      `restoring checkpointed process ${cid} failed${gone ? '' : ' (timed out)'}${why ? `: ${why}` : ''}`,
    );
  }

  /** Kill every container and wait until they are gone (a failed restore, before host state goes). */
  async stopAll(): Promise<void> {
    for (const p of this.host.procs) p.kill();
    await Promise.all([...this.host.procs].map((p) => p.exited));
  }

  private async runsc(args: readonly string[]): Promise<void> {
    await run(this.g.runsc, [...this.runscArgs(), ...args], { timeout: 120_000, env: {} });
  }

  /**
   * Stop the running execs (gVisor pause), checkpoint each (they stay paused), and keep them paused
   * through the filesystem copy, so files and memory are of the same instant; resume afterwards.
   */
  private async prepareCapture(
    signal?: AbortSignal,
  ): Promise<{ memory?: CaptureRequest['memory']; release?: () => Promise<void> }> {
    const live = [...this.containers.entries()];
    if (!live.length) return {};
    const skipped = this.network === 'host' ? HOSTINET_REASON : this.host.paused ? PAUSED_REASON : undefined;
    if (skipped) return { memory: { hash: 'skipped', record: { processes: 0, bytes: 0, skipped } } };
    const paused: string[] = [];
    const release = async (): Promise<void> => {
      await Promise.allSettled(paused.map((cid) => this.runsc(['resume', cid])));
    };
    const owner = selfOwner();
    // Named like a layer capture in progress: the layer store's reaper removes it if we die.
    const dir = join(
      this.g.layersRoot,
      `.tmp-${owner.pid}-${owner.startTicks}-${randomBytes(6).toString('hex')}`,
    );
    try {
      for (const [cid] of live) {
        try {
          await this.runsc(['pause', cid]);
          paused.push(cid);
        } catch {
          // It exited meanwhile: nothing to keep.
        }
      }
      mkdirSync(dir, { recursive: true, mode: 0o700 });
      const hash = createHash('sha256');
      let bytes = 0;
      let n = 0;
      for (const cid of paused) {
        if (signal?.aborted) throw new AirlockError('ABORTED', 'snapshot aborted');
        if (this.host.destroyed) throw new AirlockError('SANDBOX_GONE', `sandbox ${this.id} was killed`);
        const image = join(dir, String(n));
        mkdirSync(image, { mode: 0o700 });
        try {
          await this.runsc([
            'checkpoint',
            '--leave-running',
            '--compression',
            'none',
            '--image-path',
            image,
            cid,
          ]);
        } catch (e) {
          const msg = ((e as { stderr?: string }).stderr || (e as Error).message).trim();
          throw new AirlockError('INTERNAL', `runsc checkpoint of ${cid} failed: ${msg}`);
        }
        const process = this.containers.get(cid)?.process;
        if (!process) {
          rmSync(image, { recursive: true, force: true });
          continue;
        }
        const pj = JSON.stringify({ argv: process.argv, env: process.env, cwd: process.cwd });
        writeFileSync(join(image, 'process.json'), pj, { mode: 0o600 });
        for (const f of readdirSync(image).sort()) {
          hash.update(`${n}/${f}\0`);
          bytes += await hashFile(hash, join(image, f));
        }
        n++;
      }
      return {
        memory: { dir, hash: hash.digest('hex'), record: { processes: n, bytes } },
        release: async () => {
          rmSync(dir, { recursive: true, force: true }); // moved into the layer unless it failed
          await release();
        },
      };
    } catch (e) {
      rmSync(dir, { recursive: true, force: true });
      await release();
      throw e;
    }
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

  /**
   * Only with a network policy: the sentry then uses the host kernel's stack of the sandbox's netns,
   * where a server's port is on that netns's loopback. Without one, each exec runs on gVisor's own
   * network stack (--network=none), which nothing outside that exec can reach.
   */
  async connectPort(port: number, signal?: AbortSignal): Promise<Duplex> {
    if (this.network !== 'host') {
      throw new AirlockError(
        'BACKEND_UNAVAILABLE',
        `a gVisor sandbox without a network policy runs on gVisor's own network stack, which Airlock cannot reach: ` +
          'create it with a network policy (e.g. network: { allow: [] }) or on the namespaces backend to reach its ports',
      );
    }
    return this.host.connectPort(port, signal);
  }

  destroy(): Promise<void> {
    return this.host.destroy();
  }
}

function limitsKey(l: { memoryBytes: number; pids: number; cpus: number }): string {
  return `${l.memoryBytes}/${l.pids}/${l.cpus}`;
}

function hashFile(h: ReturnType<typeof createHash>, path: string): Promise<number> {
  if (!statSync(path).isFile()) return Promise.resolve(0);
  return new Promise((resolve, reject) => {
    let n = 0;
    createReadStream(path)
      .on('data', (c: Buffer | string) => {
        const b = typeof c === 'string' ? Buffer.from(c) : c;
        n += b.length;
        h.update(b);
      })
      .on('end', () => resolve(n))
      .on('error', reject);
  });
}
