// The microVM tier beside raw QEMU, same run, same kernel, initramfs and rootfs image:
//  - boot-to-first-exec: Airlock create → exec `true` finished (then kill, not timed);
//  - restore-to-first-exec: Airlock fork of a snapshot of a booted VM (QEMU -incoming from the saved
//    stream, in a fresh jail, netns and uid) → exec `true` finished, interleaved with the boots;
//  - raw: QEMU started directly (as root, no cgroup, no netns) with the same command line → its agent's
//    hello → EXEC `true` → EXIT, no Airlock in between;
//  - raw in a cgroup: the same, started inside a CPU cgroup beside the sandboxes' (under `airlock/`).
//    On a loaded host the scheduler weighs the whole `airlock/` group as one task against every
//    root-level one, so a sandbox's QEMU gets less CPU than a raw QEMU in the root group: this row
//    shows how much of the gap is that weight, not Airlock's work (with it, the ratio here is 1.0).
// Target (issue 33): Airlock ≤ 1.2× raw. The report names the accelerator (TCG here: no usable KVM).
// Run: `npx tsx bench/microvm.ts [rounds]` (as root, after scripts/setup.sh). VMs run one at a time.
import { spawn } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, rmSync, rmdirSync } from 'node:fs';
import { connect } from 'node:net';
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
import { qemuArgs, findQemu } from '../src/backends/microvm/qemu.js';
import { ensureEtc } from '../src/backends/host/rootfs.js';
import { Airlock, Sandbox } from '../src/index.js';
import { BENCH_STATE_DIR, BENCH_UID_RANGE } from './common.js';
import { fmt, summarize, type Summary } from './stats.js';

const MiB = 1024 * 1024;

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

async function rawBoot(
  qemu: string,
  kernel: string,
  initramfs: string,
  rootfs: string,
  cgroup?: string,
): Promise<number> {
  const dir = mkdtempSync('/var/tmp/airlock-bench-microvm-');
  const sock = join(dir, 'agent.sock');
  const t0 = performance.now();
  // In a cgroup: a shell enters it, then execs QEMU (so all of QEMU runs inside).
  const [cmd, pre] = cgroup
    ? ['/bin/sh', ['-c', 'echo $$ > "$0/cgroup.procs" && exec "$@"', cgroup, qemu]]
    : [qemu, []];
  const q = spawn(
    cmd,
    [
      ...pre,
      ...qemuArgs({
        accel: 'tcg',
        kernel,
        initramfs,
        rootfs,
        memoryBytes: 512 * MiB,
        pids: 256,
        vcpus: 1,
        diskBytes: 512 * MiB,
        agentSocket: sock,
      }),
    ],
    { stdio: 'ignore' },
  );
  const gone = new Promise((r) => q.on('exit', r));
  try {
    while (!existsSync(sock)) await new Promise((r) => setTimeout(r, 5));
    const s = connect(sock);
    await new Promise((r, j) => s.once('connect', r).once('error', j));
    const agent = new AgentConnection(s);
    const p = await agent.exec({
      uid: 1000,
      argv: ['true'],
      env: { PATH: '/usr/bin:/bin' },
      cwd: '/',
      stdin: false,
    });
    p.stdout.resume();
    p.stderr.resume();
    await p.exited;
    const ms = performance.now() - t0;
    agent.close(new Error('done'));
    return ms;
  } finally {
    q.kill('SIGKILL');
    await gone;
    rmSync(dir, { recursive: true, force: true });
  }
}

export interface MicrovmReport {
  readonly accel: 'tcg';
  readonly airlock: Summary;
  readonly raw: Summary;
  readonly ratio: number;
  /** Raw QEMU in a cgroup beside the sandboxes' (undefined without a cgroup hierarchy). */
  readonly rawInCgroup?: Summary;
  readonly ratioInCgroup?: number;
  /** Fork of a snapshot → first exec finished (the same VM restored from its migration stream). */
  readonly restore: Summary;
}

export async function microvmBench(rounds = 5): Promise<MicrovmReport> {
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
  const airlock = new Airlock({ stateDir: BENCH_STATE_DIR, uidRange: BENCH_UID_RANGE, warmPool: 0 });
  const a: number[] = [];
  const r: number[] = [];
  const rc: number[] = [];
  const cg = benchCgroup();
  const f: number[] = [];
  const parent = await Sandbox.create({ backend: 'microvm' }, { airlock });
  const snap = await parent.snapshot();
  await parent.kill();
  try {
    // Interleaved, so a change in host load hits both rows alike.
    for (let i = 0; i < rounds; i++) {
      const t0 = performance.now();
      const sbx = await Sandbox.create({ backend: 'microvm' }, { airlock });
      await sbx.exec(['true']);
      a.push(performance.now() - t0);
      await sbx.kill();
      const t1 = performance.now();
      const fork = await snap.fork();
      await fork.exec(['true']);
      f.push(performance.now() - t1);
      await fork.kill();
      r.push(await rawBoot(qemu, kernel.vmlinuz, initramfs, rootfs));
      if (cg) rc.push(await rawBoot(qemu, kernel.vmlinuz, initramfs, rootfs, cg));
    }
  } finally {
    await airlock.killAll();
    await snap.remove();
    if (cg) rmdirSync(cg);
  }
  const airlockS = summarize(a);
  const rawS = summarize(r);
  const rawCg = rc.length ? summarize(rc) : undefined;
  return {
    accel: 'tcg',
    airlock: airlockS,
    raw: rawS,
    ratio: airlockS.p50 / rawS.p50,
    ...(rawCg ? { rawInCgroup: rawCg, ratioInCgroup: airlockS.p50 / rawCg.p50 } : {}),
    restore: summarize(f),
  };
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const rep = await microvmBench(Number(process.argv[2] ?? 5));
  process.stdout.write(
    `microvm (${rep.accel}) boot-to-first-exec p50 ${fmt(rep.airlock.p50)} p99 ${fmt(rep.airlock.p99)}; ` +
      `raw QEMU p50 ${fmt(rep.raw.p50)} p99 ${fmt(rep.raw.p99)}; ratio ${rep.ratio.toFixed(2)}` +
      (rep.rawInCgroup
        ? `; raw QEMU in a cgroup beside the sandboxes' p50 ${fmt(rep.rawInCgroup.p50)} p99 ${fmt(rep.rawInCgroup.p99)}; ratio ${rep.ratioInCgroup!.toFixed(2)}`
        : '') +
      `; restore-to-first-exec p50 ${fmt(rep.restore.p50)} p99 ${fmt(rep.restore.p99)}\n`,
  );
}
