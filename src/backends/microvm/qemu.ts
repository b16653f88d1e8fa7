// QEMU's command line for one microVM (pure: no I/O). `-M microvm` with no default devices, no
// network device unless the sandbox has a network policy (then one virtio-net on a tap, tap.privileged.ts), the kernel booted directly (bzImage through qboot), the read-only rootfs on
// a virtio-blk device and the agent's virtio-serial port on a unix socket QEMU listens on.
import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { promisify } from 'node:util';

const run = promisify(execFile);

export type Accel = 'kvm' | 'tcg';

/**
 * Guest RAM beyond the sandbox's memory limit: the guest kernel, the agent and page cache of the
 * rootfs. The limit itself is enforced inside the guest (the sandbox cgroup's memory.max), so an
 * exec that exceeds it meets the guest's OOM killer, not the VM's.
 */
export const GUEST_KERNEL_BYTES = 128 * 1024 * 1024;
/** Host memory QEMU needs beyond the guest's RAM (its own heap plus TCG's translation cache). */
export const QEMU_OVERHEAD_BYTES = 192 * 1024 * 1024;
/** Host tasks (threads) one QEMU uses beyond nothing: its main loop, vCPU, RCU and I/O threads. */
export const QEMU_TASKS = 64;
/** TCG translation block cache in MiB (QEMU's default is 1 GiB in system mode). */
const TCG_TB_MIB = 64;

export interface VmConfig {
  readonly accel: Accel;
  readonly kernel: string;
  readonly initramfs: string;
  readonly rootfs: string;
  /** The sandbox's memory limit (the guest gets GUEST_KERNEL_BYTES more RAM than this). */
  readonly memoryBytes: number;
  /** The sandbox's process limit, enforced in the guest. */
  readonly pids: number;
  readonly vcpus: number;
  /** Size of the guest's writable tmpfs (its overlay's upper layer): the sandbox's disk limit. */
  readonly diskBytes: number;
  /** Unix socket QEMU listens on for the agent's port (Airlock connects). */
  readonly agentSocket: string;
  /** File the guest's serial console is written to, or undefined for none. */
  readonly consoleLog?: string;
  /** Boot only far enough to say init runs (the accelerator probe). */
  readonly probe?: boolean;
  /**
   * The guest's one NIC (a sandbox with a network policy): a tap QEMU inherits as fd `fd`, and the
   * addresses the guest's eth0 gets. Absent: no network device at all.
   */
  readonly net?: { readonly fd: number; readonly guest: string; readonly gateway: string };
  /** The VM's name (the sandbox id): QEMU's command line then says whose VM it is. */
  readonly name?: string;
  /** Unix socket QEMU listens on for QMP (snapshots: stop, migrate, cont). */
  readonly qmpSocket?: string;
  /** Restore: load the VM's state from the migration stream QEMU inherits as fd `incomingFd`. */
  readonly incomingFd?: number;
}

/** Where the jail (qemu.privileged.ts) shows QEMU its files: the paths its command line names. */
export const JAILED = {
  kernel: '/boot/vmlinuz',
  initramfs: '/boot/initramfs',
  rootfs: '/boot/rootfs',
  agentSocket: '/vm/agent.sock',
  consoleLog: '/vm/console.log',
  qmpSocket: '/vm/qmp.sock',
  /** Where QEMU writes a snapshot's migration stream (then copied out by root: snapshot.ts). */
  snapshotFile: '/spill/snapshot',
} as const;

/** Where QEMU finds the tap fd it inherits (after stdin/stdout/stderr and the start gate). */
export const TAP_FD = 4;
/** Where a restoring QEMU finds the migration stream it inherits (opened by root, read-only). */
export const INCOMING_FD = 5;
/**
 * The fdset QEMU puts INCOMING_FD in. A mapped-ram stream is loaded by offset (pread), which QEMU
 * allows only on a channel it opened as a file: `fd:N` never is one, `file:/dev/fdset/N` is (QEMU's
 * open of an fdset path dups the inherited fd, so nothing is opened by path in the jail).
 */
export const INCOMING_FDSET = 1;

/**
 * The guest kernel's command line. Under TCG the guest has no clock it can calibrate (microvm has no
 * HPET or PM timer and TCG no kvmclock): tsc_early_khz gives the TSC a nominal rate, tsc=reliable
 * skips the watchdog that would otherwise stall boot for seconds.
 */
export function kernelCmdline(
  c: Pick<VmConfig, 'accel' | 'diskBytes' | 'probe' | 'memoryBytes' | 'pids' | 'net'>,
): string {
  return [
    'console=ttyS0',
    'quiet',
    'panic=-1',
    'reboot=t',
    ...(c.accel === 'tcg' ? ['tsc_early_khz=2000000', 'tsc=reliable'] : []),
    `airlock.disk=${Math.max(1 << 20, Math.floor(c.diskBytes))}`,
    'airlock.uid=1000',
    `airlock.mem=${Math.floor(c.memoryBytes)}`,
    `airlock.pids=${Math.floor(c.pids)}`,
    ...(c.probe ? ['airlock.probe=1'] : []),
    ...(c.net ? [`airlock.ip=${c.net.guest}`, `airlock.gw=${c.net.gateway}`] : []),
  ].join(' ');
}

export function qemuArgs(c: VmConfig): string[] {
  const mib = Math.ceil((c.memoryBytes + GUEST_KERNEL_BYTES) / (1024 * 1024));
  return [
    ...(c.name ? ['-name', c.name] : []),
    '-M',
    'microvm',
    '-accel',
    c.accel === 'kvm' ? 'kvm' : `tcg,tb-size=${TCG_TB_MIB}`,
    '-cpu',
    c.accel === 'kvm' ? 'host' : 'max',
    '-smp',
    String(Math.max(1, Math.ceil(c.vcpus))),
    '-m',
    `${mib}M`,
    '-nodefaults',
    '-no-user-config',
    '-nographic',
    '-no-reboot',
    ...(c.net && !c.probe
      ? [
          '-netdev',
          `tap,id=net0,fd=${c.net.fd}`,
          '-device',
          'virtio-net-device,netdev=net0,mac=52:54:00:12:34:56',
        ]
      : ['-nic', 'none']),
    // QEMU's own seccomp filter: no exec, no privilege changes, no obsolete syscalls.
    '-sandbox',
    'on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny',
    '-kernel',
    c.kernel,
    '-initrd',
    c.initramfs,
    '-append',
    kernelCmdline(c),
    '-serial',
    c.consoleLog ? `file:${c.consoleLog}` : 'none',
    ...(c.probe
      ? []
      : [
          '-drive',
          `if=none,id=root,file=${c.rootfs},format=raw,readonly=on`,
          '-device',
          'virtio-blk-device,drive=root',
          '-device',
          'virtio-serial-device,max_ports=2',
          '-chardev',
          `socket,id=agent,path=${c.agentSocket},server=on,wait=off`,
          '-device',
          'virtserialport,chardev=agent,name=airlock.agent',
        ]),
    ...(c.qmpSocket && !c.probe ? ['-qmp', `unix:${c.qmpSocket},server=on,wait=off`] : []),
    // Snapshots (save and restore alike) in QEMU's mapped-ram format: each RAM page at its own offset
    // of the file, zero pages left as holes. A restore then reads only the pages the guest wrote and
    // never touches the rest of its RAM; the plain stream has every zero page checked, which faults in
    // the whole RAM (here, where a read fault allocates, all of it: slow, and slower still on memory
    // the host's free page reporting handed back).
    ...(c.probe ? [] : ['-global', 'migration.mapped-ram=on']),
    ...(c.incomingFd !== undefined
      ? [
          '-add-fd',
          `fd=${c.incomingFd},set=${INCOMING_FDSET}`,
          '-incoming',
          `file:/dev/fdset/${INCOMING_FDSET}`,
        ]
      : []),
  ];
}

/** The qemu-system-x86_64 binary, if installed. */
export function findQemu(): string | undefined {
  for (const p of ['/usr/bin/qemu-system-x86_64', '/usr/local/bin/qemu-system-x86_64'])
    if (existsSync(p)) return p;
  return undefined;
}

export async function qemuVersion(qemu: string): Promise<string> {
  const { stdout } = await run(qemu, ['--version'], { timeout: 10_000, env: {} });
  return /version (\S+)/.exec(stdout)?.[1] ?? 'unknown';
}
