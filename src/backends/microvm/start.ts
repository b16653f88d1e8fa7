// Starting one sandbox's VM (sandbox.ts boot): its dirs, the machine it is (a cold boot's from the
// spec, a restore's exactly the saved one), QEMU started in its jail (qemu.privileged.ts) with the
// tap, the migration stream and the seccomp filter it inherits, then the guest agent's connection,
// watched until the VM is this sandbox's (restore: migration done and `cont`; then the IDENTITY frame).
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
import { AirlockError } from '../../core/errors.js';
import type { Limits } from '../../core/spec.js';
import type { HostSandbox } from '../host/index.js';
import { withNetns } from '../host/netns.privileged.js';
import { SANDBOX_HOSTNAME } from '../host/rootfs.js';
import { selfOwner } from '../host/state.js';
import { AgentConnection } from './agent.js';
import { SEED_BYTES } from './protocol.js';
import { INCOMING_FD, JAILED, TAP_FD, qemuArgs, type Accel } from './qemu.js';
import { Qmp } from './qmp.js';
import { vmmSeccompFilter } from './seccomp.js';
import { MIGRATE_TIMEOUT_MS, RAM_FILE, type VmRecord } from './snapshot.js';
import { startQemu, type QemuProcess } from './qemu.privileged.js';
import { GUEST_ADDRESS, TAP_HOST_ADDRESS, makeTap } from './tap.privileged.js';

/** How long a guest may take from QEMU's start to its agent's hello (TCG on a loaded host is slow). */
export const BOOT_TIMEOUT_MS = 180_000;

export interface VmAssets {
  readonly qemu: string;
  readonly accel: Accel;
  readonly kernel: string;
  readonly initramfs: string;
  readonly rootfs: string;
  /** The VMM jail helper (assets.ts ensureVmmJail): namespaces, mounts, the drop, the seccomp filter. */
  readonly vmmJail: string;
}

/** The machine a VM is: what a snapshot records and a restore must reproduce. */
export type VmShape = Omit<VmRecord, 'version' | 'nextId' | 'processes'>;

/** A snapshot's VM to load: its memory dir and record, and its stream if the caller opened it. */
export interface VmRestore {
  readonly memoryDir: string;
  readonly vm: VmRecord;
  /** The stream, already open (bake.ts find; the caller closes it), else opened from memoryDir. */
  readonly ramFd?: number;
}

/**
 * The VM to start: a cold boot's from the sandbox's limits; a restore's exactly the saved one (QEMU
 * refuses a stream of another machine; the fork's own limits are then set inside the guest), refused
 * with a typed error if its image is gone or its NIC does not match the spec's network policy.
 */
export function vmShape(l: Limits, networked: boolean, a: VmAssets, restore?: VmRestore): VmShape {
  if (!restore)
    return {
      memoryBytes: l.memoryBytes,
      vcpus: l.cpus,
      pids: l.pids,
      diskBytes: l.diskBytes,
      net: networked,
      kernel: a.kernel,
      initramfs: a.initramfs,
      rootfs: a.rootfs,
    };
  const { version: _v, nextId: _n, processes: _p, ...vm } = restore.vm;
  const lost = [vm.kernel, vm.initramfs, vm.rootfs].find((f) => !existsSync(f));
  if (lost)
    throw new AirlockError(
      'INVALID_SPEC',
      `layers.0: the guest image this microVM snapshot was taken on is gone (${lost}); take the snapshot again`,
      { field: 'layers.0' },
    );
  if (vm.net !== networked)
    throw new AirlockError(
      'INVALID_SPEC',
      `network: a fork of this microVM snapshot ${vm.net ? 'needs a network policy (the VM had a NIC)' : 'cannot have a network policy (the VM had no NIC)'}`,
      { field: 'network' },
    );
  return vm;
}

/**
 * The VM's dirs, made afresh (a second start of a sandbox, after a baked snapshot QEMU refused,
 * starts clean): `<sandbox>/vm` (the sockets and console log, owned by the sandbox uid), the jail's
 * empty mount point, and the spill dir (snapshot streams, on the state dir's disk), named like a
 * layer capture in progress so the layer store's reaper removes it if Airlock dies.
 */
export function makeVmDirs(
  resDir: string,
  storeRoot: string,
  uid: number,
  oldSpillDir: string | undefined,
): { vmDir: string; spillDir: string } {
  const vmDir = join(resDir, 'vm');
  rmSync(vmDir, { recursive: true, force: true });
  if (oldSpillDir) rmSync(oldSpillDir, { recursive: true, force: true });
  mkdirSync(vmDir, { mode: 0o700 });
  chownSync(vmDir, uid, uid); // QEMU (as the sandbox uid) makes its sockets here
  // QEMU's root, mounted in its namespace only (so it is an empty dir here).
  mkdirSync(join(resDir, 'jail'), { recursive: true, mode: 0o755 });
  const owner = selfOwner();
  const spillDir = join(storeRoot, `.tmp-${owner.pid}-${owner.startTicks}-${randomBytes(6).toString('hex')}`);
  mkdirSync(spillDir, { recursive: true, mode: 0o700 });
  chownSync(spillDir, uid, uid);
  return { vmDir, spillDir };
}

/**
 * QEMU started in its jail as the sandbox's uid, in its cgroup and netns, with the guest's one NIC
 * only with a network policy (a tap in the sandbox's netns; QEMU keeps the only other reference, so
 * it goes when QEMU does) and, for a restore, the migration stream on its INCOMING_FD.
 */
export async function launchVm(o: {
  readonly id: string;
  readonly host: HostSandbox;
  readonly assets: VmAssets;
  readonly vm: VmShape;
  readonly spillDir: string;
  readonly restore?: VmRestore;
}): Promise<QemuProcess> {
  const { host, assets: a, vm } = o;
  const p = host.p;
  let tap: number | undefined;
  let opened: number | undefined;
  let filterFd: number | undefined;
  try {
    tap = vm.net ? makeTap(p.netns) : undefined;
    if (o.restore && o.restore.ramFd === undefined)
      opened = openSync(join(o.restore.memoryDir, RAM_FILE), 'r');
    const incoming = opened ?? o.restore?.ramFd;
    // The filter reaches the helper as an fd of a root-owned file in the sandbox's (root) dir.
    const filterFile = join(p.res.dir, 'vmm-seccomp.bpf');
    writeFileSync(filterFile, vmmSeccompFilter(), { mode: 0o600 });
    filterFd = openSync(filterFile, 'r');
    return await startQemu({
      qemu: a.qemu,
      args: qemuArgs({
        accel: a.accel,
        name: o.id,
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
      uid: o.host.p.hostUid,
      enroll: (pid) => host.enroll(pid),
      enterNetns: (f) => withNetns(p.netns, f),
      ...(tap !== undefined ? { tapFd: tap } : {}),
      ...(incoming !== undefined ? { incomingFd: incoming } : {}),
      seccomp: { helper: a.vmmJail, filterFd },
      jail: {
        dir: join(p.res.dir, 'jail'),
        kernel: vm.kernel,
        initramfs: vm.initramfs,
        rootfs: vm.rootfs,
        vmDir: join(p.res.dir, 'vm'),
        spillDir: o.spillDir,
        kvm: a.accel === 'kvm',
      },
    });
  } finally {
    if (tap !== undefined) closeSync(tap);
    if (opened !== undefined) closeSync(opened);
    if (filterFd !== undefined) closeSync(filterFd);
  }
}

/**
 * Connect to the started VM's agent and run `ready` (the steps that make it this sandbox's) under a
 * watchdog: QEMU exiting, the sandbox killed, the create aborted or BOOT_TIMEOUT_MS passing ends the
 * wait with a typed error. The whole VM is one tracked process of the sandbox. On failure QEMU is
 * killed and reaped.
 */
export async function connectVm(o: {
  readonly id: string;
  readonly host: HostSandbox;
  readonly qemu: QemuProcess;
  /** A restored VM's record: its agent is past HELLO, its requests ids continue from nextId. */
  readonly restored?: VmRecord;
  readonly signal?: AbortSignal;
  readonly ready: (agent: AgentConnection) => Promise<void>;
}): Promise<void> {
  const { qemu, host, signal } = o;
  const vmDir = join(host.p.res.dir, 'vm');
  const consoleLog = join(vmDir, 'console.log');
  const sock = join(vmDir, 'agent.sock');
  // The whole VM is one process of the sandbox: destroy() kills it and waits for it.
  host.track({
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
      `microVM ${o.id} did not boot: ${why}${detail ? `: ${detail}` : ''}`,
    );
  };
  try {
    const deadline = Date.now() + BOOT_TIMEOUT_MS;
    const check = (): void => {
      if (gone) throw fail('QEMU exited');
      if (host.destroyed) throw new AirlockError('SANDBOX_GONE', `sandbox ${o.id} was killed`);
      if (signal?.aborted) throw new AirlockError('ABORTED', 'create aborted');
      if (Date.now() > deadline) throw fail(`no agent after ${BOOT_TIMEOUT_MS} ms`);
    };
    const s = await connectUnix(sock, 10, check);
    const agent = new AgentConnection(s, o.restored ? { nextId: o.restored.nextId } : undefined);
    void qemu.exited.then(() =>
      agent.close(new AirlockError('SANDBOX_GONE', `the microVM of ${o.id} exited`)),
    );
    const timer = setInterval(() => {
      try {
        check();
      } catch (e) {
        agent.close(e as Error);
      }
    }, 100);
    try {
      await o.ready(agent);
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

/**
 * Connect to a unix socket QEMU makes, polling every `pollMs`: its file appears at QEMU's bind(), a
 * moment before its listen(), so a refused connect is retried too. `check` throws to stop waiting.
 */
export async function connectUnix(path: string, pollMs: number, check = (): void => {}): Promise<Socket> {
  for (;;) {
    check();
    if (existsSync(path)) {
      const c = connect(path);
      const s = await new Promise<Socket | undefined>((resolve, reject) => {
        c.once('connect', () => resolve(c));
        c.once('error', (e: NodeJS.ErrnoException) =>
          e.code === 'ECONNREFUSED' ? resolve(undefined) : reject(e),
        );
      });
      if (s) return s;
    }
    await new Promise((r) => setTimeout(r, pollMs));
  }
}

/**
 * A VM just loaded from a snapshot: wait for QEMU to have read the whole stream and run it (then
 * identify() makes it this sandbox's).
 */
export async function resumeRestored(
  vmDir: string,
  signal?: AbortSignal,
  phase: (name: string) => void = () => {},
): Promise<void> {
  const qmp = await Qmp.open(join(vmDir, 'qmp.sock'), BOOT_TIMEOUT_MS, signal);
  phase('monitor-open');
  try {
    await qmp.migrated(MIGRATE_TIMEOUT_MS, signal);
    phase('migrated');
    await qmp.execute('cont');
    phase('running');
  } finally {
    qmp.close();
  }
}

/**
 * Give the VM this sandbox's identity (guest/agent.c do_identity): the host's wall clock (a
 * restored guest's stopped when it was saved), a fresh RNG seed (restored guests must not share the
 * saved CRNG), the hostname and the limits. A restored VM keeps the RAM it was saved with, so its
 * memory limit is at most that.
 *
 * Pipelined: the create does not wait for the answer (one host-guest round trip less before the
 * first exec). The agent handles frames in order and powers the VM off on a refused IDENTITY before
 * it reads the next frame (refuse_identity), so no exec ever runs in a VM that has not become this
 * sandbox. The returned promise is the answer; the sandbox's first exec and snapshot wait for it. A
 * refusal, or no answer in BOOT_TIMEOUT_MS, ends the connection with that error and kills the VM.
 */
export function identify(
  agent: AgentConnection,
  qemu: QemuProcess,
  l: Limits,
  restored?: VmRecord,
): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  const answered = agent.identify({
    nowMs: Date.now(),
    seed: randomBytes(SEED_BYTES),
    hostname: SANDBOX_HOSTNAME,
    pids: l.pids,
    memoryBytes: restored ? Math.min(l.memoryBytes, restored.memoryBytes) : l.memoryBytes,
  });
  const silent = new Promise<never>((_, reject) => {
    timer = setTimeout(
      () =>
        reject(
          new AirlockError(
            'BACKEND_UNAVAILABLE',
            `the guest agent did not answer IDENTITY in ${BOOT_TIMEOUT_MS} ms`,
          ),
        ),
      BOOT_TIMEOUT_MS,
    );
    timer.unref();
  });
  const done = Promise.race([answered, silent]).finally(() => clearTimeout(timer));
  done.catch((e: Error) => {
    agent.close(e);
    qemu.kill();
  });
  return done;
}
