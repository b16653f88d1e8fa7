// One live sandbox of the microVM tier: its host state comes from backends/host/ (HostSandbox: uid
// lease, cgroup, routeless netns, size-capped dir); what this tier adds is a VM: one QEMU per sandbox,
// running as the leased uid in the sandbox's cgroup, whose guest kernel runs every process. Execs go
// through the guest agent (agent.ts) over the VM's virtio-serial port; kill is QEMU's SIGKILL.
import { randomBytes } from 'node:crypto';
import {
  chownSync,
  closeSync,
  existsSync,
  mkdirSync,
  openSync,
  readFileSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { connect, type Socket } from 'node:net';
import { join } from 'node:path';
import { Readable } from 'node:stream';
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
import { selfOwner } from '../host/state.js';
import { withNetns } from '../host/netns.privileged.js';
import { SANDBOX_HOSTNAME, SANDBOX_UID } from '../host/rootfs.js';
import { AgentConnection } from './agent.js';
import { bakeVm, type BakeClaim } from './bake.js';
import { SEED_BYTES } from './protocol.js';
import { INCOMING_FD, JAILED, TAP_FD, qemuArgs, type Accel } from './qemu.js';
import { Qmp } from './qmp.js';
import { vmmSeccompFilter } from './seccomp.js';
import { MIGRATE_TIMEOUT_MS, RAM_FILE, saveStream, type VmRecord } from './snapshot.js';
import { startQemu, type QemuProcess } from './qemu.privileged.js';
import { GUEST_ADDRESS, TAP_HOST_ADDRESS, interceptGuestTcp, makeTap } from './tap.privileged.js';

/** The proxy URL's authority as the gateway's env names it, and as the guest reaches it. */
const PROXY_AT = `//${PROXY_ADDRESS}:${PROXY_PORT}`;
const GUEST_PROXY_AT = `//${TAP_HOST_ADDRESS}:${PROXY_PORT}`;

/** How long a guest may take from QEMU's start to its agent's hello (TCG on a loaded host is slow). */
export const BOOT_TIMEOUT_MS = 180_000;

/** Why a paused microVM is not snapshotted (its frozen QEMU cannot answer its monitor). */
const PAUSED_REASON =
  'the sandbox is paused: its frozen QEMU cannot save the VM; resume it before the snapshot';

export interface VmAssets {
  readonly qemu: string;
  readonly accel: Accel;
  readonly kernel: string;
  readonly initramfs: string;
  readonly rootfs: string;
  /** The VMM jail's seccomp helper (assets.ts ensureVmmSeccomp). */
  readonly vmmSeccomp: string;
}

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
  private vm: Omit<VmRecord, 'version' | 'nextId' | 'processes'> | undefined;
  /**
   * QEMU's spill dir (snapshot streams) on the state dir's disk, named like a layer capture in
   * progress so the layer store's reaper removes it if Airlock dies; removed by destroy().
   */
  private spillDir: string | undefined;
  /** Snapshots of this VM run one at a time (one monitor session, one stream file). */
  private saving: Promise<unknown> = Promise.resolve();
  /**
   * Egress plumbing (only with a network policy): the gateway's listeners sit in the sandbox's netns
   * as on every tier, but at the tap's host address (the guest's gateway) instead of 127.0.0.1,
   * which inside the guest is the guest's own loopback; interception hooks prerouting.
   */
  readonly egress?: EgressPlumbing;
  /** How the VM started: a cold boot, or a restore (of a baked boot snapshot or a fork's snapshot). */
  started: 'booted' | 'restored' | undefined;

  constructor(parts: HostSandboxParts) {
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
   * Boot the VM (or, with `restore`, load a snapshot's VM state into it) and wait for its agent. On
   * failure QEMU is gone; the caller releases the host state.
   */
  async boot(
    a: VmAssets,
    signal?: AbortSignal,
    restore?: { memoryDir: string; vm: VmRecord; ramFd?: number },
    bake?: BakeClaim,
  ): Promise<void> {
    const p = this.host.p;
    const vmDir = join(p.res.dir, 'vm');
    // A second start of this sandbox (a baked snapshot QEMU refused, then a cold boot) starts clean.
    rmSync(vmDir, { recursive: true, force: true });
    if (this.spillDir) rmSync(this.spillDir, { recursive: true, force: true });
    mkdirSync(vmDir, { mode: 0o700 });
    chownSync(vmDir, this.hostUid, this.hostUid); // QEMU (as the sandbox uid) makes its socket here
    const sock = join(vmDir, 'agent.sock');
    const consoleLog = join(vmDir, 'console.log');
    // QEMU's root, mounted in its namespace only (so it is an empty dir here).
    mkdirSync(join(p.res.dir, 'jail'), { recursive: true, mode: 0o755 });
    const owner = selfOwner();
    this.spillDir = join(
      p.store.root,
      `.tmp-${owner.pid}-${owner.startTicks}-${randomBytes(6).toString('hex')}`,
    );
    mkdirSync(this.spillDir, { recursive: true, mode: 0o700 });
    chownSync(this.spillDir, this.hostUid, this.hostUid);
    // The guest's one NIC, only with a network policy: a tap in the sandbox's netns (QEMU keeps the
    // only other reference, so it goes when QEMU does).
    const l = p.spec.limits;
    // A restore reproduces the saved VM exactly (QEMU refuses a stream of another machine); the
    // fork's own limits are then set inside the guest (restored()).
    this.vm = restore
      ? { ...restore.vm }
      : {
          memoryBytes: l.memoryBytes,
          vcpus: l.cpus,
          pids: l.pids,
          diskBytes: l.diskBytes,
          net: this.networked,
          kernel: a.kernel,
          initramfs: a.initramfs,
          rootfs: a.rootfs,
        };
    const lost =
      restore && [restore.vm.kernel, restore.vm.initramfs, restore.vm.rootfs].find((f) => !existsSync(f));
    if (lost)
      throw new AirlockError(
        'INVALID_SPEC',
        `layers.0: the guest image this microVM snapshot was taken on is gone (${lost}); take the snapshot again`,
        { field: 'layers.0' },
      );
    if (restore && restore.vm.net !== this.networked)
      throw new AirlockError(
        'INVALID_SPEC',
        `network: a fork of this microVM snapshot ${restore.vm.net ? 'needs a network policy (the VM had a NIC)' : 'cannot have a network policy (the VM had no NIC)'}`,
        { field: 'network' },
      );
    const tap = this.networked ? makeTap(p.netns) : undefined;
    // The stream: already open for a baked snapshot (bake.ts find, closed by the caller), else opened here.
    const incoming =
      restore && restore.ramFd === undefined ? openSync(join(restore.memoryDir, RAM_FILE), 'r') : undefined;
    // The filter reaches the helper as an fd of a root-owned file in the sandbox's (root) dir.
    const filterFile = join(p.res.dir, 'vmm-seccomp.bpf');
    writeFileSync(filterFile, vmmSeccompFilter(), { mode: 0o600 });
    const filterFd = openSync(filterFile, 'r');
    let qemu: QemuProcess;
    try {
      qemu = await this.startVm(a, tap, incoming ?? restore?.ramFd, filterFd);
    } finally {
      if (tap !== undefined) closeSync(tap);
      if (incoming !== undefined) closeSync(incoming);
      closeSync(filterFd);
    }
    await this.awaitAgent(qemu, sock, consoleLog, signal, restore?.vm, bake);
    this.started = restore ? 'restored' : 'booted';
  }

  private startVm(
    a: VmAssets,
    tap: number | undefined,
    incoming: number | undefined,
    filterFd: number,
  ): Promise<QemuProcess> {
    const p = this.host.p;
    const vm = this.vm!;
    return startQemu({
      qemu: a.qemu,
      args: qemuArgs({
        accel: a.accel,
        name: this.id,
        ...JAILED,
        memoryBytes: vm.memoryBytes,
        pids: vm.pids,
        vcpus: vm.vcpus,
        diskBytes: vm.diskBytes,
        ...(incoming !== undefined ? { incomingFd: INCOMING_FD } : {}),
        ...(tap !== undefined
          ? { net: { fd: TAP_FD, guest: GUEST_ADDRESS, gateway: TAP_HOST_ADDRESS } }
          : {}),
      }),
      uid: this.hostUid,
      enroll: (pid) => this.host.enroll(pid),
      enterNetns: (f) => withNetns(p.netns, f),
      ...(tap !== undefined ? { tapFd: tap } : {}),
      ...(incoming !== undefined ? { incomingFd: incoming } : {}),
      seccomp: { helper: a.vmmSeccomp, filterFd },
      jail: {
        dir: join(p.res.dir, 'jail'),
        kernel: vm.kernel,
        initramfs: vm.initramfs,
        rootfs: vm.rootfs,
        vmDir: join(p.res.dir, 'vm'),
        spillDir: this.spillDir!,
        kvm: a.accel === 'kvm',
      },
    });
  }

  private async awaitAgent(
    qemu: QemuProcess,
    sock: string,
    consoleLog: string,
    signal?: AbortSignal,
    restored?: VmRecord,
    bake?: BakeClaim,
  ): Promise<void> {
    this.qemu = qemu;
    // The whole VM is one process of the sandbox: destroy() kills it and waits for it.
    this.host.track({
      stdout: Readable.from([]),
      stderr: Readable.from([]),
      stdin: null,
      exited: qemu.exited,
      kill: qemu.kill,
    });
    let gone = false;
    void qemu.exited.then(() => (gone = true));
    const fail = (why: string): AirlockError => {
      const tail = existsSync(consoleLog) ? readFileSync(consoleLog, 'utf8').slice(-1500) : '';
      const detail = [qemu.stderr().trim(), tail.trim()].filter(Boolean).join(' | ');
      return new AirlockError(
        'BACKEND_UNAVAILABLE',
        `microVM ${this.id} did not boot: ${why}${detail ? `: ${detail}` : ''}`,
      );
    };
    try {
      const deadline = Date.now() + BOOT_TIMEOUT_MS;
      const check = (): void => {
        if (gone) throw fail('QEMU exited');
        if (this.host.destroyed) throw new AirlockError('SANDBOX_GONE', `sandbox ${this.id} was killed`);
        if (signal?.aborted) throw new AirlockError('ABORTED', 'create aborted');
        if (Date.now() > deadline) throw fail(`no agent after ${BOOT_TIMEOUT_MS} ms`);
      };
      while (!existsSync(sock)) {
        check();
        await new Promise((r) => setTimeout(r, 10));
      }
      const s = await new Promise<Socket>((resolve, reject) => {
        const c = connect(sock);
        c.once('connect', () => resolve(c));
        c.once('error', reject);
      });
      const agent = new AgentConnection(s, restored ? { nextId: restored.nextId } : undefined);
      this.agent = agent;
      void qemu.exited.then(() =>
        agent.close(new AirlockError('SANDBOX_GONE', `the microVM of ${this.id} exited`)),
      );
      const timer = setInterval(() => {
        try {
          check();
        } catch (e) {
          agent.close(e as Error);
        }
      }, 100);
      try {
        if (restored) await this.restored(signal);
        else {
          await agent.ready();
          // Saved before it is this sandbox's (bake.ts); a failed bake never fails the create.
          if (bake)
            await bakeVm(
              bake,
              join(this.host.p.res.dir, 'vm', 'qmp.sock'),
              join(this.spillDir!, 'snapshot'),
              (qmp, dir) => this.saveStream(qmp, dir, signal),
              signal,
            );
        }
        await this.identify(restored);
      } finally {
        clearInterval(timer);
      }
    } catch (e) {
      qemu.kill();
      await qemu.exited;
      if (AirlockError.isInstance(e) && e.code !== 'SANDBOX_GONE') throw e;
      throw gone ? fail('QEMU exited') : e;
    }
  }

  async spawn(req: SpawnRequest): Promise<BackendProcess> {
    this.host.assertAlive();
    const agent = this.agent;
    if (!agent || agent.closed)
      throw new AirlockError('SANDBOX_GONE', `the microVM of sandbox ${this.id} is gone`);
    await this.filesIn;
    const proc = await agent.exec({
      uid: SANDBOX_UID,
      argv: req.argv,
      env: this.networked ? guestEnv(req.env) : req.env,
      cwd: req.cwd,
      stdin: req.stdin,
    });
    this.host.track(proc);
    return proc;
  }

  /**
   * The guest's own counters (its sandbox cgroup's memory.events oom_kill and pids.events max), read
   * through the agent; the guest is untrusted, so they only ever classify its own results.
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
    return {
      oomKills: await count('memory.events', 'oom_kill'),
      pidsLimitHits: await count('pids.events', 'max'),
    };
  }

  snapshot(signal?: AbortSignal): Promise<SnapshotRecord> {
    return this.host.snapshot(signal);
  }

  /**
   * Save the whole VM for a snapshot (HostSandbox.snapshot calls this before its layer copy, which
   * finds no host files: everything the sandbox wrote is in guest RAM): QMP `stop`, migrate to a
   * stream in the VM dir, copy it out as root (snapshot.ts), and keep the VM stopped until `release`
   * (`cont`), so the layer's record and the stream are of the same instant.
   */
  private prepareCapture: PrepareCapture = (signal) => {
    const run = this.saving.then(() => this.saveVm(signal));
    this.saving = run.then(
      (r) => r.done,
      () => {},
    );
    return run.then((r) => r.capture);
  };

  private async saveVm(
    signal?: AbortSignal,
  ): Promise<{ capture: Awaited<ReturnType<PrepareCapture>>; done: Promise<void> }> {
    const agent = this.agent;
    if (!this.qemu || !agent || agent.closed || !this.vm)
      throw new AirlockError('SANDBOX_GONE', `the microVM of sandbox ${this.id} is gone`);
    if (this.host.paused) throw new AirlockError('INVALID_ARGUMENT', PAUSED_REASON);
    const vmDir = join(this.host.p.res.dir, 'vm');
    const stream = join(this.spillDir!, 'snapshot');
    rmSync(stream, { force: true });
    const qmp = await Qmp.open(join(vmDir, 'qmp.sock'), 10_000, signal);
    const owner = selfOwner();
    // Named like a layer capture in progress: the layer store's reaper removes it if we die.
    const dir = join(
      this.host.p.store.root,
      `.tmp-${owner.pid}-${owner.startTicks}-${randomBytes(6).toString('hex')}`,
    );
    let finish!: () => void;
    const done = new Promise<void>((r) => (finish = r));
    const cont = async (): Promise<void> => {
      try {
        if (!this.host.destroyed) await qmp.execute('cont');
      } catch {
        // QEMU is gone (killed meanwhile): nothing to continue.
      } finally {
        qmp.close();
        rmSync(stream, { force: true });
        finish();
      }
    };
    try {
      await qmp.execute('stop');
      mkdirSync(dir, { recursive: true, mode: 0o700 });
      const { bytes, hash, vm } = await this.saveStream(qmp, dir, signal);
      return {
        capture: {
          memory: { dir, hash, record: { processes: vm.processes, bytes } },
          release: async () => {
            rmSync(dir, { recursive: true, force: true }); // moved into the layer unless it failed
            await cont();
          },
        },
        done,
      };
    } catch (e) {
      rmSync(dir, { recursive: true, force: true });
      await cont();
      throw e;
    }
  }

  /**
   * A VM just loaded from a snapshot: wait for QEMU to have read the whole stream and run it (then
   * identify() makes it this sandbox's).
   */
  private async restored(signal?: AbortSignal): Promise<void> {
    const vmDir = join(this.host.p.res.dir, 'vm');
    const qmp = await Qmp.open(join(vmDir, 'qmp.sock'), BOOT_TIMEOUT_MS, signal);
    try {
      await qmp.migrated(MIGRATE_TIMEOUT_MS, signal);
      await qmp.execute('cont');
    } finally {
      qmp.close();
    }
  }

  /**
   * Give the VM this sandbox's identity (guest/agent.c do_identity): the host's wall clock (a
   * restored guest's stopped when it was saved), a fresh RNG seed (restored guests must not share the
   * saved CRNG), the hostname and the limits. A restored VM keeps the RAM it was saved with, so its
   * memory limit is at most that.
   */
  private async identify(restored?: VmRecord): Promise<void> {
    const l = this.host.p.spec.limits;
    await this.agent!.identify({
      nowMs: Date.now(),
      seed: randomBytes(SEED_BYTES),
      hostname: SANDBOX_HOSTNAME,
      pids: l.pids,
      memoryBytes: restored ? Math.min(l.memoryBytes, restored.memoryBytes) : l.memoryBytes,
    });
  }

  /** The stopped VM's stream and record into `dir` (snapshot.ts saveStream). */
  private saveStream(
    qmp: Qmp,
    dir: string,
    signal?: AbortSignal,
  ): Promise<{ bytes: number; hash: string; vm: VmRecord }> {
    const agent = this.agent!;
    return saveStream(qmp, {
      spillDir: this.spillDir!,
      uid: this.hostUid,
      vm: { version: 2, ...this.vm!, nextId: agent.nextRequestId, processes: agent.running },
      dir,
      gone: () => (this.host.destroyed ? `sandbox ${this.id} was killed` : undefined),
      ...(signal ? { signal } : {}),
    });
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
