// One live sandbox of the microVM tier: its host state comes from backends/host/ (HostSandbox: uid
// lease, cgroup, routeless netns, size-capped dir); what this tier adds is a VM: one QEMU per sandbox,
// running as the leased uid in the sandbox's cgroup, whose guest kernel runs every process. Execs go
// through the guest agent (agent.ts) over the VM's virtio-serial port; kill is QEMU's SIGKILL.
import { chownSync, closeSync, existsSync, mkdirSync, readFileSync } from 'node:fs';
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
import { HostSandbox, type HostSandboxParts } from '../host/index.js';
import { withNetns } from '../host/netns.privileged.js';
import { SANDBOX_UID } from '../host/rootfs.js';
import { AgentConnection } from './agent.js';
import { JAILED, TAP_FD, qemuArgs, type Accel } from './qemu.js';
import { startQemu, type QemuProcess } from './qemu.privileged.js';
import { GUEST_ADDRESS, TAP_HOST_ADDRESS, interceptGuestTcp, makeTap } from './tap.privileged.js';

/** The proxy URL's authority as the gateway's env names it, and as the guest reaches it. */
const PROXY_AT = `//${PROXY_ADDRESS}:${PROXY_PORT}`;
const GUEST_PROXY_AT = `//${TAP_HOST_ADDRESS}:${PROXY_PORT}`;

/** How long a guest may take from QEMU's start to its agent's hello (TCG on a loaded host is slow). */
export const BOOT_TIMEOUT_MS = 180_000;

export interface VmAssets {
  readonly qemu: string;
  readonly accel: Accel;
  readonly kernel: string;
  readonly initramfs: string;
  readonly rootfs: string;
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
  /**
   * Egress plumbing (only with a network policy): the gateway's listeners sit in the sandbox's netns
   * as on every tier, but at the tap's host address (the guest's gateway) instead of 127.0.0.1,
   * which inside the guest is the guest's own loopback; interception hooks prerouting.
   */
  readonly egress?: EgressPlumbing;

  constructor(parts: HostSandboxParts) {
    this.host = new HostSandbox(parts);
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

  /** Boot the VM and wait for its agent. On failure QEMU is gone; the caller releases the host state. */
  async boot(a: VmAssets, signal?: AbortSignal): Promise<void> {
    const p = this.host.p;
    const vmDir = join(p.res.dir, 'vm');
    mkdirSync(vmDir, { mode: 0o700 });
    chownSync(vmDir, this.hostUid, this.hostUid); // QEMU (as the sandbox uid) makes its socket here
    const sock = join(vmDir, 'agent.sock');
    const consoleLog = join(vmDir, 'console.log');
    mkdirSync(join(p.res.dir, 'jail'), { mode: 0o755 }); // QEMU's root, mounted in its namespace only
    // The guest's one NIC, only with a network policy: a tap in the sandbox's netns (QEMU keeps the
    // only other reference, so it goes when QEMU does).
    const tap = this.networked ? makeTap(p.netns) : undefined;
    let qemu: QemuProcess;
    try {
      qemu = await this.startVm(a, tap);
    } finally {
      if (tap !== undefined) closeSync(tap);
    }
    await this.awaitAgent(qemu, sock, consoleLog, signal);
  }

  private startVm(a: VmAssets, tap: number | undefined): Promise<QemuProcess> {
    const p = this.host.p;
    return startQemu({
      qemu: a.qemu,
      args: qemuArgs({
        accel: a.accel,
        name: this.id,
        ...JAILED,
        memoryBytes: p.spec.limits.memoryBytes,
        pids: p.spec.limits.pids,
        vcpus: p.spec.limits.cpus,
        diskBytes: p.spec.limits.diskBytes,
        ...(tap !== undefined
          ? { net: { fd: TAP_FD, guest: GUEST_ADDRESS, gateway: TAP_HOST_ADDRESS } }
          : {}),
      }),
      uid: this.hostUid,
      enroll: (pid) => this.host.enroll(pid),
      enterNetns: (f) => withNetns(p.netns, f),
      ...(tap !== undefined ? { tapFd: tap } : {}),
      jail: {
        dir: join(p.res.dir, 'jail'),
        kernel: a.kernel,
        initramfs: a.initramfs,
        rootfs: a.rootfs,
        vmDir: join(p.res.dir, 'vm'),
        kvm: a.accel === 'kvm',
      },
    });
  }

  private async awaitAgent(
    qemu: QemuProcess,
    sock: string,
    consoleLog: string,
    signal?: AbortSignal,
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
      const agent = new AgentConnection(s);
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
        await agent.ready();
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

  pause(): Promise<void> {
    return this.host.pause();
  }

  resume(): Promise<void> {
    return this.host.resume();
  }

  destroy(): Promise<void> {
    // Killing QEMU (one of the tracked processes) ends every exec: the agent connection closes.
    return this.host.destroy();
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
