// One live sandbox of the microVM tier: its host state comes from backends/host/ (HostSandbox: uid
// lease, cgroup, routeless netns, size-capped dir); what this tier adds is a VM: one QEMU per sandbox,
// running as the leased uid in the sandbox's cgroup, whose guest kernel runs every process. Execs go
// through the guest agent (agent.ts) over the VM's virtio-serial port; kill is QEMU's SIGKILL.
// Starting the VM (boot or restore) is start.ts; saving it for a snapshot is save.ts.
import { readFileSync, rmSync } from 'node:fs';
import type { Socket } from 'node:net';
import { join } from 'node:path';
import type {
  BackendProcess,
  BackendSandbox,
  EgressPlumbing,
  LimitCounters,
  SpawnRequest,
} from '../../core/backend.js';
import { AirlockError } from '../../core/errors.js';
import { PROXY_ADDRESS, PROXY_PORT } from '../../core/sandbox-sockets.js';
import type { SnapshotRecord } from '../../core/snapshot.js';
import { HostSandbox, type HostSandboxParts, type PrepareCapture } from '../host/index.js';
import { SANDBOX_UID } from '../host/rootfs.js';
import type { AgentConnection } from './agent.js';
import { bakeVm, type BakeClaim } from './bake.js';
import type { QemuProcess } from './qemu.privileged.js';
import { saveVm, saveVmStream, type SavableVm } from './save.js';
import {
  connectVm,
  identify,
  launchVm,
  makeVmDirs,
  resumeRestored,
  vmShape,
  type VmAssets,
  type VmRestore,
  type VmShape,
} from './start.js';
import { GUEST_ADDRESS, TAP_HOST_ADDRESS, interceptGuestTcp } from './tap.privileged.js';

/** The proxy URL's authority as the gateway's env names it, and as the guest reaches it. */
const PROXY_AT = `//${PROXY_ADDRESS}:${PROXY_PORT}`;
const GUEST_PROXY_AT = `//${TAP_HOST_ADDRESS}:${PROXY_PORT}`;

export class MicrovmSandbox implements BackendSandbox {
  readonly id: string;
  readonly hostUid: number;
  private readonly host: HostSandbox;
  private qemu: QemuProcess | undefined;
  private agent: AgentConnection | undefined;
  /** Whether the guest has a NIC (the spec has a network policy). */
  private readonly networked: boolean;
  /** Files egress shows the guest (the CA bundle), written in before the next exec starts. */
  private filesIn: Promise<void> = Promise.resolve();
  /** What the VM was started with (a snapshot records it: a restore must reproduce it). */
  private vm: VmShape | undefined;
  /**
   * QEMU's spill dir (snapshot streams) on the state dir's disk, named like a layer capture in
   * progress so the layer store's reaper removes it if Airlock dies; removed by destroy().
   */
  private spillDir: string | undefined;
  /** The guest agent's answer to this sandbox's IDENTITY frame (start.ts identify). */
  private identified: Promise<void> = Promise.resolve();
  /** Snapshots of this VM run one at a time (one monitor session, one stream file). */
  private saving: Promise<unknown> = Promise.resolve();
  /**
   * Egress plumbing (only with a network policy): the gateway's listeners sit in the sandbox's netns
   * as on every tier, but at the tap's host address (the guest's gateway) instead of 127.0.0.1,
   * which inside the guest is the guest's own loopback; interception hooks prerouting.
   */
  readonly egress?: EgressPlumbing;
  /**
   * The guest agent reads the sandbox's limit counters with every exec (STARTED and EXIT carry
   * them), so an exec costs no reads of its own (agent.ts exec).
   */
  readonly countsWithProcesses = true;
  /**
   * The guest agent checks an argv's command before its execve (guest/agent.c check_command): no
   * shell runs first, which on a restored guest's cold translation cache is a second program to load.
   */
  readonly checksCommands = true;
  /** How the VM started: a cold boot, or a restore (of a baked boot snapshot or a fork's snapshot). */
  started: 'booted' | 'restored' | undefined;

  /**
   * `phase` marks the steps of a start and of an exec as they happen (the backend logs them at debug
   * level; bench/microvm.ts --trace times them against raw QEMU's).
   */
  constructor(
    parts: HostSandboxParts,
    private readonly phase: (name: string) => void = () => {},
  ) {
    this.host = new HostSandbox(parts, (signal) => this.prepareCapture(signal));
    this.id = parts.id;
    this.hostUid = parts.hostUid;
    this.networked = parts.spec.network !== undefined;
    if (this.networked) {
      const h = this.host.egress;
      this.egress = {
        listen: (kind, address, port) =>
          h.listen(kind, address === PROXY_ADDRESS ? TAP_HOST_ADDRESS : address, port),
        interceptTcp: (address, port) => interceptGuestTcp(parts.netns, address, port),
        bindReadOnlyFiles: (files) => this.copyIn(files),
        originalDestination: (fd) => h.originalDestination(fd),
        ...(h.waiting ? { waiting: h.waiting } : {}),
      };
    }
  }

  /**
   * The guest has no host dirs: a file egress shows the sandbox is copied in, root-owned 0644 (the
   * sandbox's user cannot change it), before any later exec starts.
   */
  private copyIn(files: ReadonlyArray<readonly [host: string, sandbox: string]>): void {
    const prev = this.filesIn;
    this.filesIn = (async () => {
      await prev;
      for (const [from, to] of files) {
        const agent = this.agent;
        if (!agent) throw new AirlockError('SANDBOX_GONE', `the microVM of sandbox ${this.id} is gone`);
        await agent.writeFile(to, readFileSync(from), 0o644);
      }
    })();
    this.filesIn.catch(() => {}); // surfaced by the next spawn
  }

  /**
   * Boot the VM (or, with `restore`, load a snapshot's VM state into it) and wait for its agent
   * (start.ts). On failure QEMU is gone; the caller releases the host state.
   */
  async boot(a: VmAssets, signal?: AbortSignal, restore?: VmRestore, bake?: BakeClaim): Promise<void> {
    const p = this.host.p;
    const vm = vmShape(p.spec.limits, this.networked, a, restore);
    const { vmDir, spillDir } = makeVmDirs(p.res.dir, p.store.root, this.hostUid, this.spillDir);
    this.spillDir = spillDir;
    this.vm = vm;
    const qemu = await launchVm({
      id: this.id,
      host: this.host,
      assets: a,
      vm,
      spillDir,
      ...(restore ? { restore } : {}),
    });
    this.qemu = qemu;
    this.phase('qemu-started');
    await connectVm({
      id: this.id,
      host: this.host,
      qemu,
      ...(restore ? { restored: restore.vm } : {}),
      ...(signal ? { signal } : {}),
      ready: async (agent) => {
        this.agent = agent;
        this.phase('agent-connected');
        if (restore) await resumeRestored(vmDir, signal, this.phase);
        else {
          await agent.ready();
          this.phase('hello');
          // Saved before it is this sandbox's (bake.ts); a failed bake never fails the create.
          if (bake)
            await bakeVm(
              bake,
              join(vmDir, 'qmp.sock'),
              join(spillDir, 'snapshot'),
              (qmp, dir) => saveVmStream(this.savable(), qmp, dir, signal),
              signal,
            );
        }
        // Not awaited: the first exec follows the IDENTITY frame in order (start.ts identify).
        this.identified = identify(agent, qemu, p.spec.limits, restore?.vm);
        this.phase('identity-sent');
        this.identified.then(
          () => this.phase('identity-answered'),
          () => {},
        );
      },
    });
    this.started = restore ? 'restored' : 'booted';
  }

  async spawn(req: SpawnRequest): Promise<BackendProcess> {
    this.host.assertAlive();
    const agent = this.agent;
    if (!agent || agent.closed)
      throw new AirlockError('SANDBOX_GONE', `the microVM of sandbox ${this.id} is gone`);
    await this.filesIn;
    // Sent at once (the agent runs it only after a successful IDENTITY). A refused IDENTITY is the
    // error (the VM is gone then, and the exec never ran); a kill meanwhile ends the exec as killed.
    const exec = agent.exec({
      uid: SANDBOX_UID,
      argv: req.argv,
      env: this.networked ? guestEnv(req.env) : req.env,
      cwd: req.cwd,
      stdin: req.stdin,
    });
    exec.catch(() => {}); // awaited below unless the IDENTITY was refused
    this.phase('exec-sent');
    try {
      await this.identified;
    } catch (e) {
      if (!this.host.destroyed) throw e;
    }
    const proc = await exec;
    this.phase('exec-started');
    this.host.track(proc);
    return proc;
  }

  /**
   * The guest's own counters (its sandbox cgroup's memory.events oom_kill and pids.events max), read
   * through the agent; the guest is untrusted, so they only ever classify its own results. Both
   * reads are sent at once, now (one round trip; a later spawn's EXEC goes out behind them). An
   * exec's own readings come with it instead (countsWithProcesses).
   */
  async counters(): Promise<LimitCounters> {
    const agent = this.agent;
    if (!agent || agent.closed) return { oomKills: 0, pidsLimitHits: 0 };
    const count = async (file: string, key: string): Promise<number> => {
      try {
        const text = (await agent.readFile(`/sys/fs/cgroup/sbx/${file}`)).toString('latin1');
        const m = new RegExp(`^${key} (\\d{1,15})$`, 'm').exec(text);
        return m ? Number(m[1]) : 0;
      } catch {
        return 0;
      }
    };
    const [oomKills, pidsLimitHits] = await Promise.all([
      count('memory.events', 'oom_kill'),
      count('pids.events', 'max'),
    ]);
    return { oomKills, pidsLimitHits };
  }

  snapshot(signal?: AbortSignal): Promise<SnapshotRecord> {
    return this.host.snapshot(signal);
  }

  /** Save the whole VM for a snapshot (save.ts), one save at a time. */
  private prepareCapture: PrepareCapture = (signal) => {
    const run = this.saving.then(() => this.identified).then(() => saveVm(this.savable(), signal));
    this.saving = run.then(
      (r) => r.done,
      () => {},
    );
    return run.then((r) => r.capture);
  };

  /** The live VM as save.ts needs it (SANDBOX_GONE once it is not). */
  private savable(): SavableVm {
    const agent = this.agent;
    if (!this.qemu || !agent || agent.closed || !this.vm || !this.spillDir)
      throw new AirlockError('SANDBOX_GONE', `the microVM of sandbox ${this.id} is gone`);
    return { id: this.id, host: this.host, agent, vm: this.vm, spillDir: this.spillDir };
  }

  /**
   * A connection to `port` of the guest, made inside the sandbox's netns to the guest's address on
   * its tap (the only place that address exists). Only a VM with a NIC (a network policy) has one.
   */
  connectPort(port: number, signal?: AbortSignal): Promise<Socket> {
    if (!this.networked)
      return Promise.reject(
        new AirlockError(
          'BACKEND_UNAVAILABLE',
          `sandbox ${this.id} is a microVM without a network device, so its ports cannot be reached: ` +
            'give it a network policy (e.g. network: { allow: [] }) to reach its ports',
        ),
      );
    return this.host.connectPort(port, signal, GUEST_ADDRESS);
  }

  pause(): Promise<void> {
    return this.host.pause();
  }

  resume(): Promise<void> {
    return this.host.resume();
  }

  async destroy(): Promise<void> {
    // Killing QEMU (one of the tracked processes) ends every exec: the agent connection closes.
    try {
      await this.host.destroy();
    } finally {
      if (this.spillDir) rmSync(this.spillDir, { recursive: true, force: true });
    }
  }
}

/**
 * The exec's environment as the guest needs it: the proxy variables name 127.0.0.1:3128, which in
 * the guest is its own loopback; the gateway's proxy is at the tap's host address.
 */
function guestEnv(env: Readonly<Record<string, string>>): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(env)) out[k] = v.replaceAll(PROXY_AT, GUEST_PROXY_AT);
  return out;
}
