// Bisecting the microVM restore gap (issue 33): a RAW QEMU restore (the bench's raw row: no Airlock
// in between) run under one piece of the VMM jail at a time, so each piece's cost shows on its own.
// Pieces (composable, comma-separated in a variant name; `raw` is none):
//   mapped   the stream saved and loaded with QEMU's mapped-ram capability (zero pages are holes the
//            load never touches; with `fd` the fd goes in an fdset, as fd: is never seekable)
//   fd       -incoming fd:5 (a read-only fd opened by root, as Airlock passes it) instead of file:PATH
//   serial   -serial file:console.log (Airlock's console log) instead of -serial none (its own stream)
//   mem      inside a memory cgroup under airlock/ with the sandbox's limit (microvmHostLimits)
//   cpu      inside a CPU cgroup under airlock/ with the sandbox's CFS quota (1 CPU of 100 ms periods)
//   uid      as an unprivileged uid (setpriv: no groups, no caps, no_new_privs; the jail itself
//            drops in its helper, guest/vmm-jail.c, which needs the whole jail and runs in the
//            microvm bench's Airlock row, so Airlock's seccomp filter has no piece here)
//   ns       in fresh mount, PID and network namespaces (unshare)
// Each round runs every variant once, interleaved; each prints QEMU start → migrated → first exec
// done (ms), QEMU's CPU time, and the cgroups' counters (memory.failcnt, pgmajfault, cache, CFS
// throttling). Run: `flock /work/bench.lock npx tsx bench/microvm-jail.ts [rounds] [variant...]
// [--gap=MS]` (MS idle before each restore: see GAP_MS).
import { spawn } from 'node:child_process';
import {
  chmodSync,
  chownSync,
  closeSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  readFileSync,
  readdirSync,
  rmSync,
  rmdirSync,
  writeFileSync,
} from 'node:fs';
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
import { microvmHostLimits } from '../src/backends/microvm/index.js';
import { INCOMING_FD, findQemu, qemuArgs } from '../src/backends/microvm/qemu.js';
import { Qmp } from '../src/backends/microvm/qmp.js';
import { connectUnix } from '../src/backends/microvm/start.js';
import { ensureEtc } from '../src/backends/host/rootfs.js';
import { LimitsSchema } from '../src/core/spec.js';
import { BENCH_STATE_DIR, JAIL_BENCH_UID as JAIL_UID } from './common.js';

const MiB = 1024 * 1024;
const PIECES = ['mapped', 'fd', 'serial', 'mem', 'cpu', 'uid', 'ns'] as const;
type Piece = (typeof PIECES)[number];
/** setpriv's options for the `uid` piece: the drop the jail helper makes, as a raw baseline. */
const SETPRIV_DROP = [
  `--reuid=${JAIL_UID}`,
  `--regid=${JAIL_UID}`,
  '--clear-groups',
  '--inh-caps=-all',
  '--bounding-set=-all',
  '--no-new-privs',
  '--pdeathsig',
  'KILL',
  '--',
];

interface Machine {
  readonly qemu: string;
  readonly kernel: string;
  readonly initramfs: string;
  readonly rootfs: string;
}

function args(m: Machine, dir: string, serial: boolean, mapped: boolean, incoming?: string): string[] {
  const l = LimitsSchema.parse({});
  return [
    ...qemuArgs({
      accel: 'tcg',
      kernel: m.kernel,
      initramfs: m.initramfs,
      rootfs: m.rootfs,
      memoryBytes: l.memoryBytes,
      pids: l.pids,
      vcpus: l.cpus,
      diskBytes: l.diskBytes,
      agentSocket: join(dir, 'agent.sock'),
      qmpSocket: join(dir, 'qmp.sock'),
      ...(serial ? { consoleLog: join(dir, 'console.log') } : {}),
    }),
    ...(mapped ? ['-global', 'migration.mapped-ram=on'] : []),
    ...(incoming ? ['-incoming', incoming] : []),
  ];
}

/** Boot a raw QEMU to its agent's hello, save it to `<dir>/vm.mig` (world-readable: the uid piece). */
async function save(m: Machine, dir: string, serial: boolean, mapped: boolean): Promise<string> {
  const file = join(dir, 'vm.mig');
  const q = spawn(m.qemu, args(m, dir, serial, mapped), { stdio: 'ignore' });
  const gone = new Promise((r) => q.on('exit', r));
  try {
    const agent = new AgentConnection(await connectUnix(join(dir, 'agent.sock'), 5));
    await agent.ready();
    const qmp = await Qmp.open(join(dir, 'qmp.sock'), 60_000);
    await qmp.execute('stop');
    await qmp.execute('migrate', { uri: `file:${file}` });
    await qmp.migrated(300_000);
    qmp.close();
    agent.close(new Error('saved'));
  } finally {
    q.kill('SIGKILL');
    await gone;
  }
  chmodSync(file, 0o644);
  return file;
}

/** A cgroup v1 dir under airlock/ of `ctl`, with `limits` written (like cgroups.privileged.ts). */
function cgroup(ctl: 'memory' | 'cpu', name: string): string {
  const dir = join('/sys/fs/cgroup', ctl, 'airlock', name);
  mkdirSync(dir, { recursive: true });
  const l = microvmHostLimits(LimitsSchema.parse({}));
  if (ctl === 'memory') {
    // Lowering from unlimited: the limit first (v1 wants limit <= memsw at every step).
    writeFileSync(join(dir, 'memory.limit_in_bytes'), String(l.memoryBytes));
    const memsw = join(dir, 'memory.memsw.limit_in_bytes');
    if (existsSync(memsw)) writeFileSync(memsw, String(l.memoryBytes));
  } else {
    writeFileSync(join(dir, 'cpu.cfs_period_us'), '100000');
    writeFileSync(join(dir, 'cpu.cfs_quota_us'), String(Math.round(l.cpus * 100_000)));
  }
  return dir;
}

function read(path: string): string {
  try {
    return readFileSync(path, 'utf8');
  } catch {
    return '';
  }
}

function stat(text: string, key: string): number {
  return Number(new RegExp(`^${key} (\\d+)$`, 'm').exec(text)?.[1] ?? 0);
}

/** user/system CPU time (ms) of the QEMU process under `root` (itself or a descendant). */
function qemuCpu(root: number): string {
  const kids = new Map<number, number[]>();
  let comm = new Map<number, string>();
  const stats = new Map<number, string[]>();
  for (const p of readdirSync('/proc')) {
    if (!/^\d+$/.test(p)) continue;
    const s = read(`/proc/${p}/stat`);
    const close = s.lastIndexOf(')');
    if (close < 0) continue;
    const f = s.slice(close + 2).split(' ');
    const pid = Number(p);
    comm = comm.set(pid, s.slice(s.indexOf('(') + 1, close));
    stats.set(pid, f);
    const ppid = Number(f[1]);
    kids.set(ppid, [...(kids.get(ppid) ?? []), pid]);
  }
  const todo = [root];
  while (todo.length) {
    const p = todo.pop()!;
    if (comm.get(p)?.startsWith('qemu')) {
      const f = stats.get(p)!;
      return `${Number(f[11]) * 10}/${Number(f[12]) * 10}`;
    }
    todo.push(...(kids.get(p) ?? []));
  }
  return '?';
}

async function restore(
  m: Machine,
  pieces: ReadonlySet<Piece>,
  stream: string,
  round: number,
): Promise<string> {
  const dir = mkdtempSync('/var/tmp/airlock-bench-jail-');
  chmodSync(dir, 0o755);
  if (pieces.has('uid')) chownSync(dir, JAIL_UID, JAIL_UID);
  const cgs = [
    ...(pieces.has('mem') ? [cgroup('memory', `bench-jail-${process.pid}-${round}`)] : []),
    ...(pieces.has('cpu') ? [cgroup('cpu', `bench-jail-${process.pid}-${round}`)] : []),
  ];
  const fds: number[] = [];
  const cmd: string[] = [];
  if (cgs.length)
    cmd.push('/bin/sh', '-c', 'for d in $CGS; do echo $$ > "$d/cgroup.procs"; done; exec "$@"', 'cg');
  if (pieces.has('ns'))
    cmd.push('/usr/bin/unshare', '--mount', '--pid', '--net', '--fork', '--kill-child', '--');
  if (pieces.has('uid')) cmd.push('/usr/bin/setpriv', ...SETPRIV_DROP);
  // mapped-ram needs a seekable channel, which QEMU's fd: never is: the fd goes in an fdset instead.
  const incoming = !pieces.has('fd')
    ? `file:${stream}`
    : pieces.has('mapped')
      ? `file:/dev/fdset/1`
      : `fd:${INCOMING_FD}`;
  cmd.push(m.qemu, ...args(m, dir, pieces.has('serial'), pieces.has('mapped'), incoming));
  if (pieces.has('fd') && pieces.has('mapped')) cmd.push('-add-fd', `fd=${INCOMING_FD},set=1`);
  const stdio: Array<'ignore' | number> = [
    'ignore',
    'ignore',
    'ignore',
    'ignore',
    'ignore',
    'ignore',
    'ignore',
  ];
  if (pieces.has('fd')) fds.push((stdio[INCOMING_FD] = openSync(stream, 'r')));
  await new Promise((r) => setTimeout(r, GAP_MS));
  const resident = (await out('fincore', ['-nb', '-o', 'RES', stream])).trim();
  const t0 = performance.now();
  stdio[2] = 'pipe' as unknown as number;
  const q = spawn(cmd[0]!, cmd.slice(1), { stdio, env: { CGS: cgs.join(' ') } });
  for (const fd of fds) closeSync(fd);
  let err = '';
  q.stderr!.on('data', (b: Buffer) => (err += b.toString()));
  const gone = new Promise((r) => q.on('exit', r));
  const at = (): string => (performance.now() - t0).toFixed(0);
  const marks: string[] = [];
  try {
    const agent = new AgentConnection(await connectUnix(join(dir, 'agent.sock'), 5), { nextId: 1 });
    const qmp = await Qmp.open(join(dir, 'qmp.sock'), 60_000);
    marks.push(`open=${at()}`);
    await qmp.migrated(300_000);
    marks.push(`migrated=${at()}`);
    await qmp.execute('cont');
    qmp.close();
    const cpuMigrated = qemuCpu(q.pid!);
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
    marks.push(`exec-done=${at()}`);
    marks.push(`cpu(user/sys)@migrated=${cpuMigrated} cpu=${qemuCpu(q.pid!)}`);
    agent.close(new Error('done'));
    for (const d of cgs) {
      if (d.includes('/memory/')) {
        const s = read(join(d, 'memory.stat'));
        marks.push(
          `failcnt=${read(join(d, 'memory.failcnt')).trim()} max=${(Number(read(join(d, 'memory.max_usage_in_bytes'))) / MiB).toFixed(0)}M ` +
            `cache=${(stat(s, 'cache') / MiB).toFixed(0)}M rss=${(stat(s, 'rss') / MiB).toFixed(0)}M pgmajfault=${stat(s, 'pgmajfault')}`,
        );
      } else {
        const s = read(join(d, 'cpu.stat'));
        marks.push(
          `throttled=${stat(s, 'nr_throttled')}/${stat(s, 'nr_periods')} ${(stat(s, 'throttled_time') / 1e6).toFixed(0)}ms`,
        );
      }
    }
  } catch (e) {
    throw new Error(`${(e as Error).message}: QEMU said ${err.trim()}`);
  } finally {
    q.kill('SIGKILL');
    await gone;
    // unshare --kill-child: QEMU dies with it; wait for the cgroups to empty before removing them.
    for (const d of cgs) await removeCgroup(d);
    rmSync(dir, { recursive: true, force: true });
  }
  return `stream resident ${resident} B; ${marks.join(' ')}`;
}

/** rmdir a cgroup once its (killed) processes are gone; gives up after ~5 s. */
async function removeCgroup(d: string): Promise<void> {
  for (let i = 0; ; i++)
    try {
      rmdirSync(d);
      return;
    } catch (e) {
      if (i > 500) throw e;
      await new Promise((r) => setTimeout(r, 10));
    }
}

function out(cmd: string, a: string[]): Promise<string> {
  return new Promise((resolve) => {
    const c = spawn(cmd, a, { stdio: ['ignore', 'pipe', 'ignore'] });
    let s = '';
    c.stdout.on('data', (b: Buffer) => (s += b.toString()));
    c.on('close', () => resolve(s));
  });
}

const argv = process.argv.slice(2).filter((a) => !a.startsWith('--gap='));
/**
 * Idle ms before each restore. This host is a VM with free page reporting: RAM another QEMU freed a
 * moment ago is still backed, RAM freed seconds ago went back to the outer hypervisor and faults slowly.
 */
const GAP_MS = Number(process.argv.find((a) => a.startsWith('--gap='))?.slice(6) ?? 0);
const rounds = Number(argv.find((a) => /^\d+$/.test(a)) ?? 3);
const variants = argv.filter((a) => !/^\d+$/.test(a));
if (!variants.length) variants.push('raw', ...PIECES, PIECES.join(','));
const parsed = variants.map((v) => {
  const ps = v === 'raw' ? [] : v.split(',');
  const bad = ps.find((p) => !(PIECES as readonly string[]).includes(p));
  if (bad) throw new Error(`unknown piece ${bad} (pieces: ${PIECES.join(' ')})`);
  return { name: v, pieces: new Set(ps as Piece[]) };
});
const qemu = findQemu();
const kernel = findKernel(DEFAULT_CACHE_DIR);
if (!qemu || typeof kernel === 'string') throw new Error('no QEMU or guest kernel: run scripts/setup.sh');
const agentBin = await ensureAgent(DEFAULT_CACHE_DIR);
const m: Machine = {
  qemu,
  kernel: kernel.vmlinuz,
  initramfs: await ensureInitramfs(DEFAULT_CACHE_DIR, kernel, agentBin),
  rootfs: await ensureRootfs(DEFAULT_CACHE_DIR, [
    { dir: await ensurePackageLayer(DEFAULT_CACHE_DIR) },
    { dir: ensureEtc(BENCH_STATE_DIR), at: '/etc' },
  ]),
};
const work = mkdtempSync('/var/tmp/airlock-bench-jail-');
chmodSync(work, 0o755);
try {
  const streams: Record<string, string> = {};
  const key = (p: ReadonlySet<Piece>): string => `${p.has('serial')}-${p.has('mapped')}`;
  for (const v of parsed) {
    const k = key(v.pieces);
    if (streams[k]) continue;
    const d = join(work, k);
    mkdirSync(d, { mode: 0o755 });
    streams[k] = await save(m, d, v.pieces.has('serial'), v.pieces.has('mapped'));
    process.stdout.write(
      `stream ${k}: ${(await out('du', ['-k', '--apparent-size', streams[k]])).trim()} KiB apparent, ${(await out('du', ['-k', streams[k]])).trim()} KiB on disk\n`,
    );
  }
  for (let i = 0; i < rounds; i++)
    for (const v of parsed) {
      const line = await restore(m, v.pieces, streams[key(v.pieces)]!, i);
      process.stdout.write(`round ${i} ${v.name.padEnd(12)} ${line}\n`);
    }
} finally {
  rmSync(work, { recursive: true, force: true });
}
