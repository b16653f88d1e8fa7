// The gVisor tier beside raw runsc, measured in the same run with the same runsc and platform:
//  - one-shot: Airlock create → exec `true` → kill vs `runsc do /bin/true` and vs `runsc run` of a
//    minimal bundle (target, issue 5/6 P2: ≤ 1.2× `runsc do`);
//  - exec on a live sandbox;
//  - memory-snapshot fork: `snap.fork()` until the restored process runs vs `runsc restore` (until
//    `runsc state` says running, as Airlock waits) of a checkpoint of the same program (`sleep`) from a raw bundle (target P3: ≤ 1.2×).
import { execFile, spawn } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { cachedPlatform, findRunsc, runscInfo } from '../src/backends/gvisor/runsc.js';
import { Airlock, Sandbox, type Snapshot } from '../src/index.js';
import { BENCH_STATE_DIR, BENCH_UID_RANGE } from './common.js';
import { fmt, summarize, type Summary } from './stats.js';

const run = promisify(execFile);

/**
 * runsc for detached containers: their gofer and sentry inherit runsc's stdio, so wait for runsc's
 * exit (not for its pipes to close) and give it no pipes at all.
 */
function runDetached(cmd: string, args: readonly string[]): Promise<void> {
  return new Promise((resolve, reject) => {
    const c = spawn(cmd, args, { stdio: 'ignore' });
    c.on('error', reject);
    c.on('exit', (code) =>
      code === 0 ? resolve() : reject(new Error(`runsc ${args.join(' ')}: exit ${code}`)),
    );
  });
}
const WARMUP = 3;
/** Interleaved rounds of the one-shot and fork rows (see gvisorBench). */
const ROUNDS = 5;

export interface GvisorReport {
  readonly runsc: string;
  readonly platform: string;
  readonly oneShot: { readonly airlock: Summary; readonly runscDo: Summary; readonly runscRun: Summary };
  readonly exec: Summary;
  readonly fork: { readonly airlock: Summary; readonly runscRestore: Summary; readonly imageBytes: number };
  readonly samples: {
    readonly airlock: number[];
    readonly runscDo: number[];
    readonly fork: number[];
    readonly restore: number[];
  };
}

async function timed(
  n: number,
  f: () => Promise<void>,
  after?: () => Promise<void>,
  warmup = WARMUP,
): Promise<number[]> {
  const out: number[] = [];
  for (let i = 0; i < warmup + n; i++) {
    const t0 = performance.now();
    await f();
    const ms = performance.now() - t0;
    if (after) await after();
    if (i >= WARMUP) out.push(ms);
  }
  return out;
}

/** A raw bundle: read-only root with mount points, host /usr and /etc read-only, `args` as uid 1000. */
function rawBundle(dir: string, args: string[]): string {
  const root = join(dir, 'rootfs');
  for (const d of ['usr', 'etc', 'proc', 'dev', 'tmp', 'sys']) mkdirSync(join(root, d), { recursive: true });
  for (const [t, l] of [
    ['usr/bin', 'bin'],
    ['usr/lib', 'lib'],
    ['usr/lib64', 'lib64'],
    ['usr/sbin', 'sbin'],
  ] as const)
    symlinkSync(t, join(root, l));
  const ro = (p: string): object => ({ destination: p, type: 'bind', source: p, options: ['rbind', 'ro'] });
  writeFileSync(
    join(dir, 'config.json'),
    JSON.stringify({
      ociVersion: '1.0.2',
      process: {
        user: { uid: 1000, gid: 1000 },
        args,
        env: ['PATH=/usr/bin:/bin'],
        cwd: '/',
        noNewPrivileges: true,
      },
      root: { path: root, readonly: true },
      hostname: 'raw',
      mounts: [{ destination: '/proc', type: 'proc', source: 'proc' }, ro('/usr'), ro('/etc')],
      linux: { namespaces: ['pid', 'ipc', 'uts', 'mount', 'network'].map((type) => ({ type })) },
    }),
  );
  return dir;
}

export async function gvisorBench(opts: { runs: number; log: (s: string) => void }): Promise<GvisorReport> {
  const { log } = opts;
  const runsc = findRunsc();
  if (!runsc) throw new Error('runsc is not installed (scripts/setup.sh installs it)');
  const info = await runscInfo(runsc);
  const platform = (await cachedPlatform(info, join(BENCH_STATE_DIR, 'gvisor-platform.json'))).platform;
  if (!platform) throw new Error('no runsc platform works on this host (see airlock doctor)');
  const n = Math.max(5, Math.min(opts.runs, 40));
  const nFork = Math.max(5, Math.min(opts.runs, 20));
  const tmp = mkdtempSync(join(tmpdir(), 'airlock-bench-gvisor-'));
  const root = join(tmp, 'runsc-root');
  const g = [
    '--root',
    root,
    '--platform',
    platform,
    '--network',
    'none',
    '--overlay2',
    'none',
    '--ignore-cgroups',
  ];
  const airlock = new Airlock({ stateDir: BENCH_STATE_DIR, uidRange: BENCH_UID_RANGE });
  const snaps: Snapshot[] = [];
  let seq = 0;
  try {
    log(`gvisor: one-shot ×${n}: runsc do, runsc run, Airlock create→exec→kill (platform ${platform})`);
    // Interleaved rounds (as P1's): a host whose speed drifts within the run moves every row alike.
    const trueBundle = rawBundle(join(tmp, 'true'), ['/bin/true']);
    const rounds = n >= 10 ? ROUNDS : 1;
    const per = Math.ceil(n / rounds);
    const doSamples: number[] = [];
    const runSamples: number[] = [];
    const oneShot: number[] = [];
    for (let r = 0; r < rounds; r++) {
      const w = r === 0 ? WARMUP : 1;
      doSamples.push(
        ...(await timed(per, () => run(runsc, [...g, 'do', '/bin/true']).then(() => {}), undefined, w)),
      );
      runSamples.push(
        ...(await timed(
          per,
          () => run(runsc, [...g, 'run', '--bundle', trueBundle, `true-${++seq}`]).then(() => {}),
          undefined,
          w,
        )),
      );
      oneShot.push(
        ...(await timed(
          per,
          async () => {
            const sbx = await Sandbox.create({ backend: 'gvisor' }, { airlock });
            const r = await sbx.exec(['/usr/bin/true']);
            await sbx.kill();
            if (r.exitCode !== 0) throw new Error(`exec failed: ${r.stderr}`);
          },
          undefined,
          w,
        )),
      );
    }

    log(`gvisor: exec on a live sandbox ×${n}`);
    const live = await Sandbox.create({ backend: 'gvisor' }, { airlock });
    const execSamples = await timed(n, async () => {
      await live.exec(['/usr/bin/true']);
    });
    await live.kill();

    log(`gvisor: memory-snapshot fork ×${nFork} vs runsc restore of the same program`);
    // Raw: checkpoint a `sleep` container once, restore it again and again.
    const sleepBundle = rawBundle(join(tmp, 'sleep'), ['/bin/sleep', '100000']);
    const image = join(tmp, 'image');
    mkdirSync(image);
    await runDetached(runsc, [...g, 'run', '--detach', '--bundle', sleepBundle, 'ckpt-src']);
    await run(runsc, [...g, 'checkpoint', '--compression', 'none', '--image-path', image, 'ckpt-src']);
    await run(runsc, [...g, 'delete', '--force', 'ckpt-src']).catch(() => {});
    // Airlock: a sandbox running the same program, snapshotted with its memory, forked.
    const parent = await Sandbox.create({ backend: 'gvisor' }, { airlock });
    await parent.exec(['/bin/sleep', '100000'], { background: true, timeoutMs: 3_600_000 });
    await new Promise((r) => setTimeout(r, 300));
    const snap = await parent.snapshot();
    snaps.push(snap);
    if (!snap.memory?.processes)
      throw new Error(`the snapshot holds no process memory: ${snap.memory?.skipped}`);
    // Foreground `runsc restore` until `runsc state` says running: the same method Airlock uses.
    let restoring: ReturnType<typeof spawn> | undefined;
    let restored = '';
    const restoreOnce = async (): Promise<void> => {
      restored = `restored-${++seq}`;
      restoring = spawn(runsc, [...g, 'restore', '--image-path', image, '--bundle', sleepBundle, restored], {
        stdio: 'ignore',
      });
      for (;;) {
        const st = await run(runsc, [...g, 'state', restored]).catch(() => ({ stdout: '' }));
        if (/"status":\s*"running"/.test(st.stdout)) break;
        if (restoring.exitCode !== null) throw new Error('raw runsc restore failed');
        await new Promise((r) => setTimeout(r, 5));
      }
    };
    const unrestore = async (): Promise<void> => {
      const exited = new Promise((r) => restoring!.once('exit', r));
      restoring!.kill('SIGKILL');
      await exited;
      await run(runsc, [...g, 'delete', '--force', restored]).catch(() => {});
    };
    let fork: Sandbox | undefined;
    const restoreSamples: number[] = [];
    const forkSamples: number[] = [];
    const forkRounds = nFork >= 10 ? ROUNDS : 1;
    for (let r = 0; r < forkRounds; r++) {
      const w = r === 0 ? WARMUP : 1;
      const k = Math.ceil(nFork / forkRounds);
      restoreSamples.push(...(await timed(k, restoreOnce, unrestore, w)));
      forkSamples.push(
        ...(await timed(
          k,
          async () => {
            fork = await snap.fork();
          },
          async () => {
            await fork?.kill();
          },
          w,
        )),
      );
    }
    await parent.kill();
    return {
      runsc: info.version,
      platform,
      oneShot: {
        airlock: summarize(oneShot),
        runscDo: summarize(doSamples),
        runscRun: summarize(runSamples),
      },
      exec: summarize(execSamples),
      fork: {
        airlock: summarize(forkSamples),
        runscRestore: summarize(restoreSamples),
        imageBytes: snap.memory.bytes,
      },
      samples: { airlock: oneShot, runscDo: doSamples, fork: forkSamples, restore: restoreSamples },
    };
  } finally {
    for (const s of snaps) await s.remove().catch(() => {});
    await airlock.killAll();
    await run(runsc, ['--root', root, 'list', '-quiet'])
      .then(async ({ stdout }) => {
        for (const id of stdout.split('\n').filter(Boolean))
          await run(runsc, ['--root', root, 'delete', '--force', id]).catch(() => {});
      })
      .catch(() => {});
    rmSync(tmp, { recursive: true, force: true });
  }
}

export function formatGvisor(r: GvisorReport): string {
  const row = (name: string, s: Summary, base?: Summary): string =>
    `| ${name} | ${fmt(s.p50)} | ${fmt(s.p99)} | ${base ? `${(s.p50 / base.p50).toFixed(2)}×` : '—'} |`;
  const ratio = r.oneShot.airlock.p50 / r.oneShot.runscDo.p50;
  const forkRatio = r.fork.airlock.p50 / r.fork.runscRestore.p50;
  return [
    `runsc ${r.runsc}, platform ${r.platform}; rows measured in ${ROUNDS} interleaved rounds`,
    '',
    '| measure | p50 | p99 | vs baseline (p50) |',
    '|---|---|---|---|',
    row('raw `runsc do /bin/true` (baseline)', r.oneShot.runscDo),
    row('raw `runsc run` of a minimal bundle', r.oneShot.runscRun, r.oneShot.runscDo),
    row('Airlock gVisor create → exec `true` → kill', r.oneShot.airlock, r.oneShot.runscDo),
    row('Airlock gVisor exec `true` on a live sandbox', r.exec, r.oneShot.runscDo),
    row('raw `runsc restore` of a `sleep` checkpoint until running (baseline)', r.fork.runscRestore),
    row('Airlock gVisor `snap.fork()` until the restored `sleep` runs', r.fork.airlock, r.fork.runscRestore),
    '',
    `one-shot: ${ratio.toFixed(2)}× raw \`runsc do\` (target ≤ 1.2×: ${ratio <= 1.2 ? 'PASS' : 'MISS'}); ` +
      `memory fork: ${forkRatio.toFixed(2)}× raw \`runsc restore\` (target ≤ 1.2×: ${forkRatio <= 1.2 ? 'PASS' : 'MISS'}); ` +
      `checkpoint image ${(r.fork.imageBytes / 1024 / 1024).toFixed(1)} MiB`,
  ].join('\n');
}
