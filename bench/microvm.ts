// The microVM tier beside raw QEMU, same run, same kernel, initramfs and rootfs image:
//  - boot-to-first-exec: Airlock create with boot snapshots off (a cold boot) → exec `true` finished
//    (then kill, not timed);
//  - restore-to-first-exec: Airlock create that restores the baked boot snapshot of its shape (QEMU
//    -incoming from the saved stream, in a fresh jail, netns and uid, then the identity frame) → exec
//    `true` finished; and a fork of a user snapshot the same way; all interleaved with the boots;
//  - raw: QEMU started directly (as root, no cgroup, no netns) with the same command line → its agent's
//    hello → EXEC `true` → EXIT, no Airlock in between;
//  - raw restore: QEMU started directly with the same command line plus `-incoming` of a migration
//    file saved once from a raw boot (QMP stop + migrate) → migration done → `cont` → EXEC → EXIT;
//  - raw in a cgroup: the same, started inside a CPU cgroup beside the sandboxes' (under `airlock/`).
//    On a loaded host the scheduler weighs the whole `airlock/` group as one task against every
//    root-level one, so a sandbox's QEMU gets less CPU than a raw QEMU in the root group: this row
//    shows how much of the gap is that weight, not Airlock's work (with it, the ratio here is 1.0);
//    and the raw restore the same way (the restore's row beside it).
// Target (issue 33): Airlock ≤ 1.2× raw. The report names the accelerator (TCG here: no usable KVM).
// Run: `npx tsx bench/microvm.ts [rounds] [--trace]` (as root, after scripts/setup.sh). VMs run one at a
// time. --trace prints, per round, when each step of the Airlock restore and of the raw restore happened
// (ms from the start of the row, one clock): the backend's debug-level 'microvm phase' log entries and
// the same steps of the raw path.
import { spawn } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, rmSync, rmdirSync } from 'node:fs';
import { join } from 'node:path';
import { AgentConnection } from '../src/backends/microvm/agent.js';
import {
  DEFAULT_CACHE_DIR,
  ensureAgent,
  ensureInitramfs,
  ensurePackageLayer,
  ensureRootfs,
  findKernel,
} from '../src/backends/microvm/assets.js';
import { qemuArgs, findQemu, type Accel } from '../src/backends/microvm/qemu.js';
import { Qmp } from '../src/backends/microvm/qmp.js';
import { connectUnix } from '../src/backends/microvm/start.js';
import { ensureEtc } from '../src/backends/host/rootfs.js';
import { Airlock, Sandbox } from '../src/index.js';
import type { Logger } from '../src/core/backend.js';
import { BENCH_STATE_DIR, BENCH_UID_RANGE } from './common.js';
import { fmt, summarize, type Summary } from './stats.js';

const MiB = 1024 * 1024;

/** Marks of one traced row: each step's name and when it happened, ms from the row's start. */
class Phases {
  private readonly t0 = performance.now();
  private readonly marks: string[] = [];
  mark = (name: string): void => void this.marks.push(`${name}=${(performance.now() - this.t0).toFixed(0)}`);
  toString(): string {
    return this.marks.join(' ');
  }
}

/** A logger that records the microVM backend's phase entries into the row being traced, if any. */
function phaseLogger(current: () => Phases | undefined): Logger {
  const none = (): void => {};
  return {
    debug: (o) => {
      const phase = (o as { phase?: unknown }).phase;
      if (typeof phase === 'string') current()?.mark(phase);
    },
    info: none,
    warn: none,
    error: none,
  };
}

/** A CPU cgroup beside the sandboxes' (cgroup v1 `cpu` hierarchy, else the v2 unified one). */
function benchCgroup(): string | undefined {
  for (const base of ['/sys/fs/cgroup/cpu/airlock', '/sys/fs/cgroup/airlock']) {
    if (!existsSync(base)) continue;
    const dir = join(base, `bench-raw-${process.pid}`);
    mkdirSync(dir, { recursive: true });
    return dir;
  }
  return undefined;
}

interface RawVm {
  readonly qemu: string;
  readonly accel: Accel;
  readonly kernel: string;
  readonly initramfs: string;
  readonly rootfs: string;
}

/** A raw QEMU (no Airlock), booted or restored (`incoming`: a migration file), up to its agent. */
async function rawStart(
  vm: RawVm,
  o: { cgroup?: string; incoming?: string; dir: string; phase?: (name: string) => void },
): Promise<{ agent: AgentConnection; qmp: string; stop: () => Promise<void> }> {
  const phase = o.phase ?? ((): void => {});
  const sock = join(o.dir, 'agent.sock');
  const qmp = join(o.dir, 'qmp.sock');
  // In a cgroup: a shell enters it, then execs QEMU (so all of QEMU runs inside).
  const [cmd, pre] = o.cgroup
    ? ['/bin/sh', ['-c', 'echo $$ > "$0/cgroup.procs" && exec "$@"', o.cgroup, vm.qemu]]
    : [vm.qemu, []];
  const args = qemuArgs({
    accel: vm.accel,
    kernel: vm.kernel,
    initramfs: vm.initramfs,
    rootfs: vm.rootfs,
    memoryBytes: 512 * MiB,
    pids: 256,
    vcpus: 1,
    diskBytes: 512 * MiB,
    agentSocket: sock,
    qmpSocket: qmp,
  });
  const q = spawn(cmd, [...pre, ...args, ...(o.incoming ? ['-incoming', `file:${o.incoming}`] : [])], {
    stdio: 'ignore',
  });
  phase('qemu-started');
  const gone = new Promise((r) => q.on('exit', r));
  const stop = async (): Promise<void> => {
    q.kill('SIGKILL');
    await gone;
  };
  try {
    const s = await connectUnix(sock, 5);
    phase('agent-connected');
    if (!o.incoming) {
      const agent = new AgentConnection(s);
      await agent.ready();
      return { agent, qmp, stop };
    }
    const agent = new AgentConnection(s, { nextId: 1 });
    const m = await Qmp.open(qmp, 60_000);
    phase('monitor-open');
    try {
      await m.migrated(300_000);
      phase('migrated');
      await m.execute('cont');
      phase('running');
    } finally {
      m.close();
    }
    return { agent, qmp, stop };
  } catch (e) {
    await stop();
    throw e;
  }
}

/** Start (boot or restore) → EXEC `true` → EXIT, in ms. */
async function rawToFirstExec(
  vm: RawVm,
  cgroup?: string,
  incoming?: string,
  phases?: Phases,
): Promise<number> {
  const dir = mkdtempSync('/var/tmp/airlock-bench-microvm-');
  const t0 = performance.now();
  let stop: (() => Promise<void>) | undefined;
  try {
    const r = await rawStart(vm, {
      dir,
      ...(cgroup ? { cgroup } : {}),
      ...(incoming ? { incoming } : {}),
      ...(phases ? { phase: phases.mark } : {}),
    });
    stop = r.stop;
    const exec = r.agent.exec({
      uid: 1000,
      argv: ['true'],
      env: { PATH: '/usr/bin:/bin' },
      cwd: '/',
      stdin: false,
    });
    phases?.mark('exec-sent');
    const p = await exec;
    phases?.mark('exec-started');
    p.stdout.resume();
    p.stderr.resume();
    await p.exited;
    const ms = performance.now() - t0;
    phases?.mark('exec-done');
    r.agent.close(new Error('done'));
    return ms;
  } finally {
    await stop?.();
    rmSync(dir, { recursive: true, force: true });
  }
}

/** Boot a raw QEMU to its agent's hello and save it (stop, migrate) to `<dir>/vm.mig`. */
async function rawSave(vm: RawVm, dir: string): Promise<string> {
  const file = join(dir, 'vm.mig');
  const r = await rawStart(vm, { dir });
  try {
    const m = await Qmp.open(r.qmp, 60_000);
    try {
      await m.execute('stop');
      await m.execute('migrate', { uri: `file:${file}` });
      await m.migrated(300_000);
    } finally {
      m.close();
    }
  } finally {
    r.agent.close(new Error('saved'));
    await r.stop();
  }
  return file;
}

export interface MicrovmReport {
  /** The accelerator every row ran on, and why (the backend's probe). */
  readonly accel: Accel;
  readonly accelDetail: string;
  /** Airlock create (boot snapshots off: a cold boot) → first exec finished. */
  readonly airlock: Summary;
  readonly raw: Summary;
  readonly ratio: number;
  /** Raw QEMU in a cgroup beside the sandboxes' (undefined without a cgroup hierarchy). */
  readonly rawInCgroup?: Summary;
  readonly ratioInCgroup?: number;
  /** Airlock create restoring the baked boot snapshot → first exec finished. */
  readonly restore: Summary;
  /** Raw QEMU `-incoming` of a migration file of the same VM → first exec finished. */
  readonly rawRestore: Summary;
  readonly restoreRatio: number;
  /** The raw restore in a cgroup beside the sandboxes' (undefined without a cgroup hierarchy). */
  readonly rawRestoreInCgroup?: Summary;
  readonly restoreRatioInCgroup?: number;
  /** Fork of a user snapshot → first exec finished (the same VM restored from its stream). */
  readonly fork: Summary;
}

export async function microvmBench(
  rounds = 5,
  /** Given: each round's traces of the Airlock restore and the raw restore (see the top). */
  trace?: (line: string) => void,
): Promise<MicrovmReport> {
  const qemu = findQemu();
  const kernel = findKernel(DEFAULT_CACHE_DIR);
  if (!qemu || typeof kernel === 'string') throw new Error(`microvm bench: ${qemu ? kernel : 'no QEMU'}`);
  const agent = await ensureAgent(DEFAULT_CACHE_DIR);
  const initramfs = await ensureInitramfs(DEFAULT_CACHE_DIR, kernel, agent);
  const packages = await ensurePackageLayer(DEFAULT_CACHE_DIR);
  const rootfs = await ensureRootfs(DEFAULT_CACHE_DIR, [
    { dir: packages },
    { dir: ensureEtc(BENCH_STATE_DIR), at: '/etc' },
  ]);
  let traced: Phases | undefined;
  const opts = {
    stateDir: BENCH_STATE_DIR,
    uidRange: BENCH_UID_RANGE,
    warmPool: 0,
    ...(trace ? { logger: phaseLogger(() => traced) } : {}),
  };
  const cold = new Airlock({ ...opts, microvmBootSnapshots: false });
  const airlock = new Airlock(opts);
  const probe = await airlock.probe('microvm');
  const accelDetail = probe.checks?.find((c) => c.name === 'accelerator')?.detail ?? 'unknown';
  const accel: Accel = accelDetail.startsWith('KVM') ? 'kvm' : 'tcg';
  const vm: RawVm = { qemu, accel, kernel: kernel.vmlinuz, initramfs, rootfs };
  const a: number[] = [];
  const r: number[] = [];
  const rc: number[] = [];
  const b: number[] = [];
  const rr: number[] = [];
  const rrc: number[] = [];
  const cg = benchCgroup();
  const f: number[] = [];
  const saved = mkdtempSync('/var/tmp/airlock-bench-microvm-');
  // Bakes the boot snapshot of this shape (the first create of it boots and saves its VM).
  const parent = await Sandbox.create({ backend: 'microvm' }, { airlock });
  const snap = await parent.snapshot();
  await parent.kill();
  try {
    const mig = await rawSave(vm, saved);
    // Interleaved, so a change in host load hits every row alike.
    for (let i = 0; i < rounds; i++) {
      for (const [rt, out] of [
        [cold, a],
        [airlock, b],
      ] as const) {
        if (trace && rt === airlock) traced = new Phases();
        const t0 = performance.now();
        const sbx = await Sandbox.create({ backend: 'microvm' }, { airlock: rt });
        traced?.mark('created');
        await sbx.exec(['true']);
        out.push(performance.now() - t0);
        traced?.mark('exec-done');
        if (traced) trace?.(`round ${i} airlock restore: ${traced.toString()}`);
        traced = undefined;
        await sbx.kill();
      }
      const t1 = performance.now();
      const fork = await snap.fork();
      await fork.exec(['true']);
      f.push(performance.now() - t1);
      await fork.kill();
      r.push(await rawToFirstExec(vm));
      const rawPhases = trace ? new Phases() : undefined;
      rr.push(await rawToFirstExec(vm, undefined, mig, rawPhases));
      if (rawPhases) trace?.(`round ${i} raw restore:     ${rawPhases.toString()}`);
      if (cg) rc.push(await rawToFirstExec(vm, cg));
      if (cg) rrc.push(await rawToFirstExec(vm, cg, mig));
    }
  } finally {
    await airlock.killAll();
    await cold.killAll();
    await snap.remove();
    rmSync(saved, { recursive: true, force: true });
    if (cg) rmdirSync(cg);
  }
  const airlockS = summarize(a);
  const rawS = summarize(r);
  const rawCg = rc.length ? summarize(rc) : undefined;
  const restoreS = summarize(b);
  const rawRestoreS = summarize(rr);
  const rawRestoreCg = rrc.length ? summarize(rrc) : undefined;
  return {
    accel,
    accelDetail,
    airlock: airlockS,
    raw: rawS,
    ratio: airlockS.p50 / rawS.p50,
    ...(rawCg ? { rawInCgroup: rawCg, ratioInCgroup: airlockS.p50 / rawCg.p50 } : {}),
    restore: restoreS,
    rawRestore: rawRestoreS,
    restoreRatio: restoreS.p50 / rawRestoreS.p50,
    ...(rawRestoreCg
      ? { rawRestoreInCgroup: rawRestoreCg, restoreRatioInCgroup: restoreS.p50 / rawRestoreCg.p50 }
      : {}),
    fork: summarize(f),
  };
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const args = process.argv.slice(2);
  const rounds = Number(args.find((a) => !a.startsWith('--')) ?? 5);
  const rep = await microvmBench(
    rounds,
    args.includes('--trace') ? (line) => process.stdout.write(`${line}\n`) : undefined,
  );
  const row = (x: Summary): string => `p50 ${fmt(x.p50)} p99 ${fmt(x.p99)}`;
  process.stdout.write(
    `microvm accelerator: ${rep.accelDetail}\n` +
      `boot-to-first-exec: airlock ${row(rep.airlock)}; raw QEMU ${row(rep.raw)}; ratio ${rep.ratio.toFixed(2)}\n` +
      (rep.rawInCgroup
        ? `  raw QEMU in a cgroup beside the sandboxes' ${row(rep.rawInCgroup)}; ratio ${rep.ratioInCgroup!.toFixed(2)}\n`
        : '') +
      `restore-to-first-exec: airlock (baked boot snapshot) ${row(rep.restore)}; raw QEMU -incoming ${row(rep.rawRestore)}; ratio ${rep.restoreRatio.toFixed(2)}\n` +
      (rep.rawRestoreInCgroup
        ? `  raw QEMU -incoming in a cgroup beside the sandboxes' ${row(rep.rawRestoreInCgroup)}; ratio ${rep.restoreRatioInCgroup!.toFixed(2)}\n`
        : '') +
      `fork-to-first-exec: ${row(rep.fork)}\n`,
  );
}
