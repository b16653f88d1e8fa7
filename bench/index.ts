// `npm run bench [-- NAME... ] [--quick] [--runs N]`: runs the named benchmarks (or all) and writes ONE
// report: bench/results/<timestamp>.json (every raw result), bench/results/<timestamp>.md (machine
// facts, a table per measure with each figure as an absolute value and a ratio to a baseline measured
// in the same run, the target and whether it holds) and SVG charts beside it, then rewrites
// docs/benchmarks.md from that run (bench/report.ts). Progress goes to stderr.
// `--quick` keeps the whole run within 2 minutes on the 2-core reference machine (the full run: 15).
// Benchmarks are never part of the test run.
import { spawn } from 'node:child_process';
import {
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { loadavg } from 'node:os';
import { basename, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { BENCH_STATE_DIR, runOut, type BenchContext } from './common.js';
import { densityBench, type DensityReport } from './density.js';
import { egressBench, formatEgress, type EgressReport } from './egress.js';
import { forkBench, formatFork, type ForkReport } from './fork.js';
import { formatLifecycle, lifecycle, type LifecycleReport } from './lifecycle.js';
import { airlockPaths, formatMcp, mcpBench, type McpReport } from './mcp.js';
import { peerBench, type PeerReport } from './peer.js';
import { formatServer, serverBench, serverFloors, type ServerReport } from './server.js';
import {
  machineFacts,
  mib,
  ms,
  notMeasured,
  ratioTo,
  renderMarkdown,
  row,
  writeBenchmarksDoc,
  verdict,
  type Chart,
  type Row,
  type Section,
} from './report.js';
import type { Summary } from './stats.js';
import { boxPlotSvg, lineChartSvg, type Distribution } from './svg.js';
import { throughputBench, type ThroughputReport } from './throughput.js';

const HERE = fileURLToPath(new URL('.', import.meta.url));
const GVISOR_PENDING = 'gVisor backend pending';
const GVISOR_CHILD = '--gvisor-child';

interface Results {
  lifecycle?: LifecycleReport;
  gvisor?: { data: unknown; text?: string };
  fork?: ForkReport;
  throughput?: ThroughputReport;
  density?: DensityReport;
  mcp?: McpReport;
  egress?: EgressReport;
  peer?: PeerReport;
  server?: ServerReport;
}

type Runner = (ctx: BenchContext & { runs: number }, r: Results) => Promise<void>;

/** In the report's order (P1 … P7, then the peer). */
const BENCHES: Record<string, Runner> = {
  lifecycle: async (c, r) => void (r.lifecycle = await lifecycle({ runs: c.runs, log: c.log })),
  gvisor: async (c, r) => {
    const g = await runGvisor(c);
    if (g) r.gvisor = g;
  },
  fork: async (c, r) =>
    void (r.fork = await forkBench({ runs: Math.min(c.runs, c.quick ? 15 : 300), log: c.log })),
  throughput: async (c, r) => void (r.throughput = await throughputBench(c)),
  density: async (c, r) => void (r.density = await densityBench(c)),
  mcp: async (c, r) => void (r.mcp = await mcpBench({ log: c.log, quick: c.quick })),
  egress: async (c, r) => void (r.egress = await egressBench({ log: c.log })),
  peer: async (c, r) => void (r.peer = await peerBench(c)),
  server: async (c, r) => void (r.server = await serverBench(c)),
};

/**
 * The order benchmarks run in (the report keeps P1 … P7): density last, since the kernel goes on
 * releasing 1,000 sandboxes' namespaces and cgroups for a while after it, which would skew the next.
 */
const RUN_ORDER = ['lifecycle', 'gvisor', 'fork', 'throughput', 'mcp', 'egress', 'peer', 'server', 'density'];

/** Busy and total jiffies of all CPUs since boot. */
function cpuJiffies(): { busy: number; total: number } {
  const f = readFileSync('/proc/stat', 'utf8').split('\n')[0]!.trim().split(/\s+/).slice(1).map(Number);
  const total = f.reduce((a, b) => a + b, 0);
  return { busy: total - f[3]! - (f[4] ?? 0), total };
}

/**
 * Wait (at most 60 s) until the host is quiet: under 10 % CPU busy over half a second. A benchmark
 * then never starts while the last one's aftermath (or other work) still runs.
 */
async function quietHost(log: (s: string) => void): Promise<void> {
  const t0 = performance.now();
  for (;;) {
    const a = cpuJiffies();
    await new Promise((r) => setTimeout(r, 500));
    const b = cpuJiffies();
    const busy = (b.busy - a.busy) / Math.max(1, b.total - a.total);
    const waited = performance.now() - t0;
    if (busy < 0.1 || waited > 60_000) {
      if (waited > 1_000)
        log(`waited ${(waited / 1000).toFixed(0)} s for a quiet host (${(busy * 100).toFixed(0)} % busy)`);
      return;
    }
  }
}

/**
 * P2/P3 on gVisor come from bench/gvisor.ts when it exists (built separately): its first exported
 * function named *Bench is called with { runs, log, quick }, and a format* function, if any, renders it.
 * It runs in a child process with a time budget (a hung runsc must not stall the report), with TMPDIR
 * pointed at a directory of this run's own so that whatever a killed child leaves is found and removed.
 */
async function runGvisor(
  c: BenchContext & { runs: number },
): Promise<{ data: unknown; text?: string } | undefined> {
  if (!existsSync(join(HERE, 'gvisor.ts'))) {
    c.log(`gvisor: bench/gvisor.ts not there (${GVISOR_PENDING})`);
    return undefined;
  }
  const budgetMs = c.quick ? 30_000 : 150_000;
  const tmp = mkdtempSync(join(BENCH_STATE_DIR + '-gvisor-tmp-'));
  const args = [
    '--import',
    'tsx',
    fileURLToPath(import.meta.url),
    GVISOR_CHILD,
    '--runs',
    String(c.quick ? 5 : c.runs),
  ];
  if (c.quick) args.push('--quick');
  const child = spawn(process.execPath, args, {
    env: { ...process.env, TMPDIR: tmp },
    stdio: ['ignore', 'pipe', 'inherit'],
    detached: true,
  });
  let out = '';
  child.stdout.setEncoding('utf8').on('data', (t: string) => (out += t));
  let timedOut = false;
  const timer = setTimeout(() => {
    timedOut = true;
    c.log(`gvisor: over its ${budgetMs / 1000} s budget; stopping it`);
    try {
      process.kill(-child.pid!, 'SIGKILL');
    } catch {
      /* gone */
    }
  }, budgetMs);
  const code = await new Promise<number | null>((r) => child.on('close', r));
  clearTimeout(timer);
  await cleanGvisorTmp(tmp);
  if (timedOut) throw new Error(`the gVisor bench did not finish within its ${budgetMs / 1000} s budget`);
  if (code !== 0) throw new Error(`the gVisor bench exited ${code}`);
  return JSON.parse(out.trim().split('\n').pop() ?? 'null') as { data: unknown; text?: string };
}

/** Remove runsc containers a killed gVisor child left under its own TMPDIR, then the dir. */
async function cleanGvisorTmp(tmp: string): Promise<void> {
  for (const d of readdirSync(tmp)) {
    const root = join(tmp, d, 'runsc-root');
    if (!existsSync(root)) continue;
    const ids = (await runOut('runsc', ['--root', root, 'list', '-quiet']).catch(() => ''))
      .split('\n')
      .filter(Boolean);
    for (const id of ids) await runOut('runsc', ['--root', root, 'delete', '--force', id]).catch(() => '');
  }
  rmSync(tmp, { recursive: true, force: true });
}

/** The child: run bench/gvisor.ts and print { data, text } as the last line of stdout. */
async function gvisorChild(runs: number, quick: boolean): Promise<void> {
  const log = (s: string): void => void process.stderr.write(`bench [gvisor] ${s}\n`);
  const mod = (await import(join(HERE, 'gvisor.js'))) as Record<string, unknown>;
  const fns = Object.entries(mod).filter(([, v]) => typeof v === 'function') as Array<
    [string, (a: unknown) => unknown]
  >;
  const bench = fns.find(([k]) => /bench$/i.test(k));
  if (!bench) throw new Error('bench/gvisor.ts exports no *Bench function');
  const data = await bench[1]({ runs, log, quick });
  const fmt = fns.find(([k]) => /^format/i.test(k));
  const text = fmt ? String(fmt[1](data)) : undefined;
  process.stdout.write(`${JSON.stringify({ data, ...(text !== undefined ? { text } : {}) })}\n`);
}

// ---- sections -----------------------------------------------------------------------------------

interface GvisorShape {
  oneShot: { airlock: Summary; runscDo: Summary; runscRun: Summary };
  fork?: { airlock: Summary; runscRestore: Summary };
  samples?: Partial<Record<'airlock' | 'runscDo' | 'fork' | 'restore', number[]>>;
}

/** bench/gvisor.ts's report, if it has the shape this report knows (else only its own text is shown). */
function gvisorShape(data: unknown): GvisorShape | undefined {
  const d = data as Partial<GvisorShape> | undefined;
  return d?.oneShot?.airlock?.p50 !== undefined && d.oneShot.runscDo?.p50 !== undefined
    ? (d as GvisorShape)
    : undefined;
}

/**
 * CLI start-up, measured in the same rounds as P1: `airlock run -- true` with the built CLI (dist/bin,
 * what the package installs) beside `node -e 0` and the library's warm one-shot. Target (issue 31):
 * at most 2× `node -e 0` plus the library one-shot.
 */
function cliStartupRows(r: LifecycleReport): Row[] {
  const node = r.nodeStartup;
  const target = '≤ 2× `node -e 0` + the library one-shot';
  const cli = r.cliRunTrue;
  return [
    row('`node -e 0` (floor of any Node CLI), p50', ms(node.p50), '1.00×'),
    ...(r.cliFloor
      ? [
          row(
            'the same one-shot from a plain node script, no Airlock code (bench/cli-floor.privileged.cjs), p50',
            ms(r.cliFloor.p50),
            ratioTo(r.cliFloor.p50, node.p50, 'node -e 0', ms(node.p50)),
          ),
        ]
      : []),
    'error' in cli
      ? notMeasured('`airlock run -- true`, built CLI', cli.error, target)
      : row(
          '`airlock run -- true`, built CLI (dist/bin, plain node), p50',
          ms(cli.p50),
          `${ratioTo(cli.p50, node.p50, 'node -e 0', ms(node.p50))}; limit ${ms(2 * node.p50 + r.airlock.p50)}`,
          target,
          verdict(cli.p50 <= 2 * node.p50 + r.airlock.p50),
        ),
  ];
}

function p1(
  r: LifecycleReport,
  peer: PeerReport | undefined,
  gv: Results['gvisor'],
  chart: (n: string, t: string, svg: string) => Chart,
): Section {
  // The issue's baseline: raw bwrap with the same isolation flags (Airlock's own flags and mounts,
  // generated by the same code, none of its host work). The minimal flags are shown beside it.
  const raw = r.rawBwrapSameLayout;
  const min = r.rawBwrap;
  const vs = (x: number): string => ratioTo(x, raw.p50, 'raw bwrap, same flags', ms(raw.p50));
  const vsBoth = (x: number): string =>
    `${vs(x)}; ${ratioTo(x, min.p50, 'raw bwrap, minimal flags', ms(min.p50))}`;
  const target = 'p50 ≤ 1.5× raw bwrap with the same isolation flags';
  const dists: Distribution[] = [
    { label: 'plain spawn of true', samples: r.samples.spawnTrue, baseline: true },
    { label: 'raw bwrap (minimal flags)', samples: r.samples.rawBwrap, baseline: true },
    { label: "raw bwrap (Airlock's layout)", samples: r.samples.rawBwrapSameLayout, baseline: true },
    { label: 'Airlock namespaces', samples: r.samples.airlock },
    { label: 'Airlock + egress + overlay', samples: r.samples.airlockFull },
    { label: 'Airlock, no warm pool', samples: r.samples.airlockNoWarmPool },
  ];
  if (peer?.srtLib.ok)
    dists.push({ label: 'sandbox-runtime (library)', samples: peer.samples['srt library']! });
  return {
    id: 'P1',
    title: 'one-shot create → exec `true` → kill, namespaces tier',
    intro:
      `${r.airlock.n} runs each after 10 warm-up runs` +
      (r.jitWarmup
        ? `, and before them ${r.jitWarmup} Airlock runs across its configurations, so that V8 runs the ` +
          "per-sandbox code optimised, as in a long-lived Airlock (a fresh process's figure is shown too)"
        : '') +
      ". The target's baseline, as the issue words it: raw bwrap " +
      "with the same isolation flags (exactly Airlock's flags and mounts, generated by the same code, but none " +
      'of its host work: no cgroup, disk, netns, uid lease or output capture). Beside it: plain spawn of `true`, ' +
      'and raw bwrap with minimal isolation flags (all namespaces, uid switch, read-only /usr, /proc, /dev, tmpfs ' +
      '/tmp, the same seccomp program), which Airlock is also compared with. Each is ' +
      'started the way Airlock starts bwrap (posix_spawn, as the sandbox uid: the bench process is not forked); ' +
      "raw bwrap through Node's child_process.spawn (which forks the Node process) is shown beside them.",
    rows: [
      row('plain spawn of `true`, p50', ms(r.spawnTrue.p50), vs(r.spawnTrue.p50)),
      row(
        "raw bwrap with the same isolation flags (Airlock's flags and mounts), p50 (baseline)",
        ms(raw.p50),
        '1.00×',
      ),
      row('raw bwrap, minimal flags, p50', ms(min.p50), vs(min.p50)),
      row(
        "raw bwrap, minimal flags, through Node's child_process.spawn (forks the bench process), p50",
        ms(r.rawBwrapForked.p50),
        vs(r.rawBwrapForked.p50),
      ),
      row(
        'Airlock, p50',
        ms(r.airlock.p50),
        vsBoth(r.airlock.p50),
        target,
        verdict(r.airlock.p50 <= 1.5 * raw.p50),
      ),
      ...(r.airlockFreshProcess
        ? [
            row(
              'Airlock in a fresh process (before the V8 warm-up), p50',
              ms(r.airlockFreshProcess.p50),
              vsBoth(r.airlockFreshProcess.p50),
            ),
          ]
        : []),
      row('Airlock, p99', ms(r.airlock.p99), ratioTo(r.airlock.p99, raw.p99, 'raw bwrap p99', ms(raw.p99))),
      row(
        'Airlock + egress bridge + overlay workspace, p50',
        ms(r.airlockFull.p50),
        vsBoth(r.airlockFull.p50),
        `${target} (everything included)`,
        verdict(r.airlockFull.p50 <= 1.5 * raw.p50),
      ),
      row('Airlock without warm pool, p50', ms(r.airlockNoWarmPool.p50), vs(r.airlockNoWarmPool.p50)),
      row('  part: create (warm pool)', ms(r.parts.create.p50), vs(r.parts.create.p50)),
      row('  part: exec `true`', ms(r.parts.exec.p50), vs(r.parts.exec.p50)),
      row('  part: kill', ms(r.parts.kill.p50), vs(r.parts.kill.p50)),
      row(
        '  part: egress bridge (network policy), added p50',
        ms(r.airlockEgress.p50 - r.airlock.p50),
        vs(r.airlockEgress.p50 - r.airlock.p50),
      ),
      row(
        '    of which transparent interception (address/route + nftables over netlink, made ahead in the warm slot)',
        ms(r.airlockEgress.p50 - r.airlockEgressProxyOnly.p50),
        vs(r.airlockEgress.p50 - r.airlockEgressProxyOnly.p50),
      ),
      row(
        '  part: overlay workspace (cow), added p50',
        ms(r.airlockOverlay.p50 - r.airlock.p50),
        vs(r.airlockOverlay.p50 - r.airlock.p50),
      ),
      row(
        '  part: host state on the path (uid, tmpfs, netns, cgroup; no warm pool), added p50',
        ms(r.airlockNoWarmPool.p50 - r.airlock.p50),
        vs(r.airlockNoWarmPool.p50 - r.airlock.p50),
      ),
      row(
        "  part: Airlock's work beyond its own bwrap command line (create, cgroup enrolment, kill, output capture, warm-pool refill)",
        ms(r.airlock.p50 - r.rawBwrapSameLayout.p50),
        vs(r.airlock.p50 - r.rawBwrapSameLayout.p50),
      ),
      row(
        "  part: Airlock's flags and mounts against the minimal flags (in raw bwrap)",
        ms(r.rawBwrapSameLayout.p50 - r.rawBwrap.p50),
        vs(r.rawBwrapSameLayout.p50 - r.rawBwrap.p50),
      ),
      ...cliStartupRows(r),
    ],
    notes: [
      'Cgroup creation is part of the prepared host state (warm pool) and cannot be switched off on its own; ' +
        'its cost is inside "host state on the path".',
    ],
    charts: [
      chart(
        'p1-latency',
        'one-shot `true` latency per tier beside its baselines',
        boxPlotSvg('One-shot create → exec true → kill', 'ms', dists),
      ),
    ],
    detail: formatLifecycle(r),
  };
}

function p2p3(
  f: ForkReport | undefined,
  gv: Results['gvisor'],
  gvisorWhy: string,
  chart: (n: string, t: string, svg: string) => Chart,
): Section[] {
  const g = gvisorShape(gv?.data);
  const p2rows = g
    ? [
        row('raw `runsc do true`, p50 (baseline)', ms(g.oneShot.runscDo.p50), '1.00×'),
        row(
          'raw `runsc run` of a minimal bundle, p50',
          ms(g.oneShot.runscRun.p50),
          ratioTo(g.oneShot.runscRun.p50, g.oneShot.runscDo.p50, 'runsc do', ms(g.oneShot.runscDo.p50)),
        ),
        row(
          'Airlock gVisor create → exec `true` → kill, p50',
          ms(g.oneShot.airlock.p50),
          ratioTo(g.oneShot.airlock.p50, g.oneShot.runscDo.p50, 'runsc do', ms(g.oneShot.runscDo.p50)),
          'p50 ≤ 1.2× `runsc do`',
          verdict(g.oneShot.airlock.p50 <= 1.2 * g.oneShot.runscDo.p50),
        ),
      ]
    : [
        notMeasured(
          'gVisor create → exec → kill, p50',
          gv ? 'bench/gvisor.ts gave no one-shot figures' : gvisorWhy,
          'p50 ≤ 1.2× raw `runsc do true`',
        ),
      ];
  const p2: Section = {
    id: 'P2',
    title: 'one-shot on gVisor vs raw `runsc do true`',
    rows: p2rows,
    ...(gv?.text ? { detail: gv.text } : {}),
    ...(g?.samples
      ? {
          charts: [
            chart(
              'p2-gvisor',
              'gVisor one-shot beside runsc',
              boxPlotSvg('gVisor: one-shot and memory-snapshot fork', 'ms', [
                { label: 'runsc do true', samples: g.samples.runscDo ?? [], baseline: true },
                { label: 'Airlock gVisor one-shot', samples: g.samples.airlock ?? [] },
                { label: 'runsc restore', samples: g.samples.restore ?? [], baseline: true },
                { label: 'Airlock gVisor fork', samples: g.samples.fork ?? [] },
              ]),
            ),
          ],
        }
      : {}),
  };
  const rows = [];
  const charts: Chart[] = [];
  if (f) {
    const vs = (x: number): string => ratioTo(x, f.create.p50, 'Sandbox.create', ms(f.create.p50));
    rows.push(
      row('Sandbox.create (warm pool), p50 (baseline)', ms(f.create.p50), '1.00×'),
      row(
        'namespaces snap.fork(), 1 layer, p50',
        ms(f.fork.p50),
        vs(f.fork.p50),
        '≤ 15 ms',
        verdict(f.fork.p50 <= 15),
      ),
      row(
        'namespaces snap.fork(), 4-layer chain, p50',
        ms(f.forkDeep.p50),
        vs(f.forkDeep.p50),
        '≤ 15 ms',
        verdict(f.forkDeep.p50 <= 15),
      ),
      row(
        'namespaces snap.fork(), 1 layer, p99',
        ms(f.fork.p99),
        ratioTo(f.fork.p99, f.create.p99, 'create p99', ms(f.create.p99)),
      ),
      row(
        'fork → exec → kill, p50',
        ms(f.forkExecKill.p50),
        ratioTo(f.forkExecKill.p50, f.createExecKill.p50, 'create → exec → kill', ms(f.createExecKill.p50)),
      ),
      row('sbx.snapshot(), p50', ms(f.snapshot.p50), vs(f.snapshot.p50)),
    );
    charts.push(
      chart(
        'p3-fork',
        'fork latency beside Sandbox.create',
        boxPlotSvg('Namespaces fork from snapshot', 'ms', [
          { label: 'Sandbox.create (warm pool)', samples: f.samples.create, baseline: true },
          { label: 'snap.fork(), 1 layer', samples: f.samples.fork },
          { label: 'snap.fork(), 4 layers', samples: f.samples.forkDeep },
        ]),
      ),
    );
  } else rows.push(notMeasured('namespaces fork', 'not selected in this run', '≤ 15 ms'));
  if (g?.fork)
    rows.push(
      row(
        'raw `runsc restore` of a checkpointed `sleep`, p50 (baseline)',
        ms(g.fork.runscRestore.p50),
        '1.00×',
      ),
      row(
        'Airlock gVisor memory-snapshot fork, p50',
        ms(g.fork.airlock.p50),
        ratioTo(g.fork.airlock.p50, g.fork.runscRestore.p50, 'runsc restore', ms(g.fork.runscRestore.p50)),
        '≤ 1.2× raw `runsc restore`',
        verdict(g.fork.airlock.p50 <= 1.2 * g.fork.runscRestore.p50),
      ),
    );
  else
    rows.push(
      notMeasured(
        'gVisor memory-snapshot fork, p50',
        gv ? 'bench/gvisor.ts gave no fork figures' : gvisorWhy,
        '≤ 1.2× raw `runsc restore`',
      ),
    );
  return [
    p2,
    { id: 'P3', title: 'fork from snapshot', rows, charts, ...(f ? { detail: formatFork(f) } : {}) },
  ];
}

function p4(t: ThroughputReport, chart: (n: string, t: string, svg: string) => Chart): Section {
  const rawAt = (c: number): number => t.rawBwrap.find((p) => p.concurrency === c)?.perS ?? NaN;
  return {
    id: 'P4',
    title: 'sustained throughput of one-shot sandboxes',
    intro:
      `create → exec \`true\` → kill in N concurrent loops for ${t.durationMs / 1000} s per level (warm pool as deep as N), ` +
      'beside raw bwrap (minimal flags) in N concurrent loops.',
    rows: [
      row(
        `Airlock, best rate (at concurrency ${t.best.concurrency})`,
        `${t.best.perS.toFixed(0)}/s`,
        ratioTo(
          t.best.perS,
          t.bestRaw.perS,
          `raw bwrap's best (at ${t.bestRaw.concurrency})`,
          `${t.bestRaw.perS.toFixed(0)}/s`,
        ),
        '≥ 150/s',
        verdict(t.best.perS >= 150),
      ),
      ...t.airlock.map((p) =>
        row(
          `Airlock at concurrency ${p.concurrency}`,
          `${p.perS.toFixed(0)}/s (${p.completed} in ${p.seconds.toFixed(1)} s)`,
          ratioTo(p.perS, rawAt(p.concurrency), 'raw bwrap', `${rawAt(p.concurrency).toFixed(0)}/s`),
        ),
      ),
    ],
    charts: [
      chart(
        'p4-throughput',
        'one-shot rate vs concurrent sandboxes',
        lineChartSvg(
          'One-shot sandboxes per second vs concurrency',
          'concurrent create → exec → kill loops (live sandboxes)',
          'completed per second',
          [
            { label: 'Airlock', points: t.airlock.map((p) => [p.concurrency, p.perS] as const) },
            {
              label: 'raw bwrap',
              points: t.rawBwrap.map((p) => [p.concurrency, p.perS] as const),
              dashed: true,
            },
            {
              label: 'target 150/s',
              points: t.airlock.map((p) => [p.concurrency, 150] as const),
              dashed: true,
            },
          ],
          true,
        ),
      ),
    ],
  };
}

function p5(d: DensityReport, chart: (n: string, t: string, svg: string) => Chart): Section {
  const a = d.airlock;
  const raw = d.rawBwrap;
  const ok = a.failures === 0 && a.started === d.n;
  // MemAvailable is host-wide: with other work running it can move more than N small sandboxes do;
  // with few sandboxes that noise is larger than what they use: no verdict from it below 200.
  const memTrusted = d.n >= 200 && a.memAvailFitR2 >= 0.8 && a.memAvailSlopeMiB > 0;
  return {
    id: 'P5',
    title: `density: ${d.n} concurrent idle sandboxes`,
    intro:
      `${d.n} Airlock sandboxes, each with an egress bridge (network policy) and a background \`sleep\`, started 8 at a time; ` +
      `beside ${d.n} plain \`sleep\` processes and ${d.n} raw bwrap sandboxes running \`sleep\`, started the same way. ` +
      'Memory per sandbox: the drop of MemAvailable after a 1 s settle, and PSS of every process of a sandbox ' +
      "(all run as its host uid) plus the growth of Airlock's own process (where the egress bridge lives). " +
      'MemAvailable moves with anything else running on the host: read it beside PSS.',
    rows: [
      row(
        `sandboxes live / failures`,
        `${a.started} / ${a.failures}`,
        `${raw.started} raw bwrap, ${d.plainSleep.started} plain`,
        `${d.n} live, no failure`,
        verdict(ok),
      ),
      row(
        `time to start all ${d.n}`,
        `${a.startSeconds.toFixed(2)} s`,
        ratioTo(a.startSeconds, raw.startSeconds, 'raw bwrap', `${raw.startSeconds.toFixed(2)} s`),
      ),
      row(
        'host memory per sandbox, marginal (slope of the MemAvailable drop over the ramp)',
        mib(a.memAvailSlopeMiB),
        ratioTo(a.memAvailSlopeMiB, raw.memAvailSlopeMiB, 'raw bwrap', mib(raw.memAvailSlopeMiB)) +
          `; ${ratioTo(a.memAvailSlopeMiB, d.plainSleep.memAvailSlopeMiB, 'plain sleep', mib(d.plainSleep.memAvailSlopeMiB))}`,
        '≤ 2 MiB',
        memTrusted ? verdict(a.memAvailSlopeMiB <= 2) : '',
      ),
      row(
        'host memory per sandbox, average (MemAvailable drop / N, one-time costs included)',
        mib(a.memAvailPerMiB),
        ratioTo(a.memAvailPerMiB, raw.memAvailPerMiB, 'raw bwrap', mib(raw.memAvailPerMiB)) +
          `; ${ratioTo(a.memAvailPerMiB, d.plainSleep.memAvailPerMiB, 'plain sleep', mib(d.plainSleep.memAvailPerMiB))}`,
      ),
      row(
        'memory per sandbox (PSS of its processes + Airlock growth)',
        mib(a.pssPerMiB),
        ratioTo(a.pssPerMiB, raw.pssPerMiB, 'raw bwrap', mib(raw.pssPerMiB)) +
          `; ${ratioTo(a.pssPerMiB, d.plainSleep.pssPerMiB, 'plain sleep', mib(d.plainSleep.pssPerMiB))}`,
        '≤ 2 MiB',
        verdict(a.pssPerMiB <= 2),
      ),
      row(
        '  of which the sandbox processes (PSS)',
        mib(a.sandboxProcsPerMiB),
        ratioTo(a.sandboxProcsPerMiB, raw.pssPerMiB, 'raw bwrap', mib(raw.pssPerMiB)),
      ),
      row("  of which Airlock's own process (PSS growth)", mib(a.airlockSelfPerMiB), '—'),
      row(
        'processes per sandbox',
        (a.processes / Math.max(1, a.started)).toFixed(2),
        `${(raw.processes / Math.max(1, raw.started)).toFixed(2)} raw bwrap`,
      ),
      row(
        `exec \`true\` p50 on one sandbox while ${a.started} are live`,
        ms(d.execWhileLive.p50),
        ratioTo(d.execWhileLive.p50, d.execLone.p50, 'the same on a lone sandbox', ms(d.execLone.p50)),
      ),
    ],
    notes: [
      `Host limits seen: ${Object.entries(d.limits)
        .map(([k, v]) => `${k}: ${v}`)
        .join('; ')}.`,
      ...(a.firstError ? [`First failure: ${a.firstError}`] : []),
      `MemAvailable over the ramp fits a line with R² ${a.memAvailFitR2.toFixed(2)}` +
        (memTrusted
          ? '.'
          : d.n < 200
            ? `; with only ${d.n} sandboxes other work on the host moves it as much as they do, so no verdict is drawn from it (the full run's 1,000 gives one; PSS holds).`
            : ': other work on the host moved it more than the sandboxes did, so no verdict is drawn from it (PSS holds).'),
    ],
    charts: [
      chart(
        'p5-memory',
        'host memory vs number of live sandboxes',
        lineChartSvg(
          'Host memory vs live sandboxes',
          'live sandboxes / processes',
          'MiB in use (since before the ramp)',
          [
            {
              label: 'Airlock, MemAvailable',
              points: a.ramp.map((p) => [p.live, p.memAvailDeltaMiB] as const),
            },
            { label: 'Airlock, PSS', points: a.ramp.map((p) => [p.live, p.pssMiB] as const), dashed: true },
            {
              label: 'raw bwrap, MemAvailable',
              points: raw.ramp.map((p) => [p.live, p.memAvailDeltaMiB] as const),
            },
            {
              label: 'raw bwrap, PSS',
              points: raw.ramp.map((p) => [p.live, p.pssMiB] as const),
              dashed: true,
            },
            {
              label: 'plain sleep, MemAvailable',
              points: d.plainSleep.ramp.map((p) => [p.live, p.memAvailDeltaMiB] as const),
            },
            {
              label: '2 MiB per sandbox',
              points: a.ramp.map((p) => [p.live, 2 * p.live] as const),
              dashed: true,
            },
          ],
        ),
      ),
    ],
  };
}

function p6(m: McpReport): Section {
  const base = m.direct;
  const best = (p: McpReport['direct']): number => Math.max(...p.throughput.map((t) => t.callsPerS));
  const paths = airlockPaths(m);
  return {
    id: 'P6',
    title: 'MCP: added latency per tools/call and calls/s',
    intro: `The same fixture server spoken to directly over stdio (the baseline) and through each Airlock path; ${base.sequential.n} sequential calls; throughput with 16 and 64 calls in flight.`,
    rows: [
      row('direct stdio p50 (baseline)', ms(base.sequential.p50), '1.00×'),
      row('direct stdio, best calls/s (baseline)', `${best(base).toFixed(0)}/s`, '1.00×'),
      ...paths.flatMap((p) => [
        row(
          `${p.label}: added p50`,
          ms(p.sequential.p50 - base.sequential.p50),
          ratioTo(p.sequential.p50, base.sequential.p50, 'direct p50', ms(base.sequential.p50)),
          '≤ 1 ms added',
          verdict(p.sequential.p50 - base.sequential.p50 <= 1),
        ),
        row(
          `${p.label}: best calls/s`,
          `${best(p).toFixed(0)}/s`,
          ratioTo(best(p), best(base), 'direct', `${best(base).toFixed(0)}/s`),
          '≥ 2,000/s',
          verdict(best(p) >= 2000),
        ),
      ]),
    ],
    detail: formatMcp(m),
  };
}

/** The CONNECT and SOCKS5 rows, where bench/egress.ts measures them. */
function tunnels(e: EgressReport): Array<{ label: string; mibPerS: number }> {
  const x = e as unknown as Partial<Record<'connect' | 'socks5', { label: string; mibPerS: number }>>;
  const out: Array<{ label: string; mibPerS: number }> = [];
  for (const t of [x.connect, x.socks5]) if (t) out.push(t);
  return out;
}

function p7(e: EgressReport): Section {
  const base = e.direct.mibPerS;
  const pct = (x: number): string =>
    `${((100 * x) / base).toFixed(0)} % of direct (${base.toFixed(0)} MiB/s)`;
  // The target's baseline is Node's client direct (issue 3's "direct loopback"). Beside it, for the
  // sandbox rows: the same client as in the sandbox (curl) direct, and through a bare relay that vets
  // nothing (the floor of any proxy on this machine).
  const viaProxy = (x: number): string =>
    e.relayFloor
      ? `${pct(x)}; ${((100 * x) / e.hostCurl.mibPerS).toFixed(0)} % of host curl; ` +
        `${(x / e.relayFloor.mibPerS).toFixed(2)}× a bare relay (${e.relayFloor.mibPerS.toFixed(0)} MiB/s)`
      : pct(x);
  const l = e.latency;
  return {
    id: 'P7',
    title: 'egress: proxy throughput and added latency',
    intro: `A ${e.downloadMiB} MiB download and 3-byte GETs in a private network namespace (bench/egress.ts).`,
    rows: [
      row('direct download, Node on the host (baseline)', `${base.toFixed(0)} MiB/s`, '1.00×'),
      row(
        'sandbox curl through the proxy',
        `${e.proxy.mibPerS.toFixed(0)} MiB/s`,
        viaProxy(e.proxy.mibPerS),
        '≥ 80 %',
        verdict(e.proxy.mibPerS >= 0.8 * base),
      ),
      row(
        'sandbox curl, transparent path',
        `${e.transparent.mibPerS.toFixed(0)} MiB/s`,
        viaProxy(e.transparent.mibPerS),
        '≥ 80 %',
        verdict(e.transparent.mibPerS >= 0.8 * base),
      ),
      row('curl on the host, direct', `${e.hostCurl.mibPerS.toFixed(0)} MiB/s`, pct(e.hostCurl.mibPerS)),
      ...(e.relayFloor
        ? [
            row(
              'curl on the host through a bare relay (socat; the floor of any proxy)',
              `${e.relayFloor.mibPerS.toFixed(0)} MiB/s`,
              `${pct(e.relayFloor.mibPerS)}; ${((100 * e.relayFloor.mibPerS) / e.hostCurl.mibPerS).toFixed(0)} % of host curl`,
            ),
          ]
        : []),
      ...tunnels(e).map((t) =>
        row(
          `sandbox curl, ${t.label.replace(/^sandbox curl,? ?/, '')}`,
          `${t.mibPerS.toFixed(0)} MiB/s`,
          viaProxy(t.mibPerS),
          '≥ 80 %',
          verdict(t.mibPerS >= 0.8 * base),
        ),
      ),
      row(
        'request through the proxy: added p50',
        ms(l.proxy.p50 - l.hostDirect.p50),
        ratioTo(l.proxy.p50, l.hostDirect.p50, 'host direct p50', ms(l.hostDirect.p50)),
        '≤ 1 ms added',
        verdict(l.proxy.p50 - l.hostDirect.p50 <= 1),
      ),
    ],
    detail: formatEgress(e),
  };
}

function peerSection(p: PeerReport, chart: (n: string, t: string, svg: string) => Chart): Section {
  const why = (m: { ok: false; reason: string }): string => `cannot run here: ${m.reason}`;
  const rows = [
    row('`node -e 0` (floor of any Node CLI), p50', ms(p.nodeStartup.p50), '1.00×'),
    p.srtCli.ok
      ? row(
          '`srt true` (sandbox-runtime CLI), p50',
          ms(p.srtCli.value.p50),
          ratioTo(p.srtCli.value.p50, p.nodeStartup.p50, 'node -e 0', ms(p.nodeStartup.p50)),
        )
      : notMeasured('`srt true` (sandbox-runtime CLI)', why(p.srtCli)),
    p.airlockCli.ok
      ? row(
          '`airlock run -- true` (Airlock CLI), p50',
          ms(p.airlockCli.value.p50),
          ratioTo(p.airlockCli.value.p50, p.nodeStartup.p50, 'node -e 0', ms(p.nodeStartup.p50)) +
            (p.srtCli.ok
              ? `; ${ratioTo(p.airlockCli.value.p50, p.srtCli.value.p50, 'srt', ms(p.srtCli.value.p50))}`
              : ''),
        )
      : notMeasured('`airlock run -- true`', why(p.airlockCli)),
    row('raw bwrap, minimal flags, p50 (baseline)', ms(p.rawBwrap.p50), '1.00×'),
    p.srtLib.ok
      ? row(
          'sandbox-runtime library: wrapWithSandbox(`true`) + spawn, p50',
          ms(p.srtLib.value.p50),
          ratioTo(p.srtLib.value.p50, p.rawBwrap.p50, 'raw bwrap', ms(p.rawBwrap.p50)),
        )
      : notMeasured('sandbox-runtime library', why(p.srtLib)),
    row(
      'Airlock library: create → exec `true` → kill, p50',
      ms(p.airlockLib.p50),
      ratioTo(p.airlockLib.p50, p.rawBwrap.p50, 'raw bwrap', ms(p.rawBwrap.p50)) +
        (p.srtLib.ok
          ? `; ${ratioTo(p.airlockLib.p50, p.srtLib.value.p50, 'sandbox-runtime', ms(p.srtLib.value.p50))}`
          : ''),
    ),
    row(
      'curl GET on the host straight to the loopback server, p50 (baseline)',
      ms(p.proxy.hostDirect.p50),
      '1.00×',
    ),
    p.proxy.srt.ok
      ? row(
          'curl GET inside sandbox-runtime through its proxy, p50',
          ms(p.proxy.srt.value.p50),
          ratioTo(p.proxy.srt.value.p50, p.proxy.hostDirect.p50, 'host direct', ms(p.proxy.hostDirect.p50)),
        )
      : notMeasured('sandbox-runtime proxy request', why(p.proxy.srt)),
    p.proxy.airlock.ok
      ? row(
          'curl GET inside Airlock through its proxy, p50',
          ms(p.proxy.airlock.value.p50),
          ratioTo(
            p.proxy.airlock.value.p50,
            p.proxy.hostDirect.p50,
            'host direct',
            ms(p.proxy.hostDirect.p50),
          ) +
            (p.proxy.srt.ok
              ? `; ${ratioTo(p.proxy.airlock.value.p50, p.proxy.srt.value.p50, 'sandbox-runtime', ms(p.proxy.srt.value.p50))}`
              : ''),
        )
      : notMeasured('Airlock proxy request', why(p.proxy.airlock)),
  ];
  const dist = (label: string, baseline = false): Distribution => ({
    label,
    samples: p.samples[label] ?? [],
    baseline,
  });
  return {
    id: 'Peer',
    title: `Anthropic sandbox-runtime ${p.srtVersion} beside Airlock`,
    intro:
      'The same machine, the same run. sandbox-runtime on Linux: bwrap with no network namespace route, its HTTP/SOCKS ' +
      'proxies on the host reached over bind-mounted Unix sockets; Airlock: a sandbox per call with its own netns, ' +
      'cgroup, uid and tmpfs disk. Proxy rows: sequential curl GETs of 3 bytes (time_total of each, after 3 warm-up ' +
      `requests; ${p.proxy.requests} requests) to a server on this host's loopback.`,
    rows,
    notes: p.srtLib.ok
      ? [`sandbox-runtime SandboxManager.initialize() (once): ${ms(p.srtLib.value.initMs)}.`]
      : [],
    charts: [
      chart(
        'peer-latency',
        'one-shot `true`: CLIs and libraries',
        boxPlotSvg('One-shot sandboxed true: Airlock and sandbox-runtime', 'ms', [
          dist('node -e 0', true),
          dist('srt true (CLI)'),
          dist('airlock run true (CLI)'),
          dist('raw bwrap', true),
          dist('srt library'),
          dist('Airlock library'),
        ]),
      ),
    ],
  };
}

/**
 * S1 (issue 36): the sandbox server beside the library, in the same run: the p50 each client adds to
 * create → exec `true` → kill (target ≤ 2 ms on loopback), 100 concurrent creates, and memory.
 */
function serverSection(r: ServerReport, chart: (n: string, t: string, svg: string) => Chart): Section {
  const base = r.library;
  const vs = (x: number): string => ratioTo(x, base.p50, 'library p50', ms(base.p50));
  const added = (name: string, l: ServerReport['library']): Row =>
    row(
      `${name}: added p50 (p50 ${ms(l.p50)}, p90 ${ms(l.p90)})`,
      ms(l.p50 - base.p50),
      vs(l.p50),
      '≤ 2 ms added p50 on loopback',
      verdict(l.p50 - base.p50 <= 2),
    );
  const fl = serverFloors(r);
  // Beside each target, the floor measured in the same run (bench/server.ts serverFloors): no server
  // with a front and a supervisor hop could add less than it on this host.
  const floorRows = (name: string, w: 'remoteSdk' | 'e2b'): Row[] =>
    fl && r.stub
      ? [
          row(
            `${name}: floor of its added time (canned-answer stub p50 ${ms(r.stub[w].p50)} + 3 × bare unix round trip)`,
            ms(fl.sdk[w].floor),
            ratioTo(fl.sdk[w].floor, base.p50, 'library p50', ms(base.p50)),
          ),
          row(
            `${name}: added p50 above that floor (the servers' own work)`,
            ms(fl.sdk[w].aboveFloor),
            `added ${ms(r[w].p50 - base.p50)} − floor ${ms(fl.sdk[w].floor)}`,
          ),
        ]
      : [];
  const c = r.concurrent;
  const m = r.memory;
  return {
    id: 'S1',
    title: 'the sandbox server: API overhead, 100 concurrent creates, memory',
    intro:
      `\`airlock serve\` (front server + supervisor, run from the source through tsx) on loopback. ${r.rounds} rounds of ` +
      'create → exec `true` → kill, the library in-process, the remote TypeScript SDK (native API) and the ' +
      `e2b SDK (/e2b) taking turns each round, after ${r.warmUp ?? 10} warm-up runs each (bench/server.ts).`,
    rows: [
      row(`library in-process, p50 (baseline; p90 ${ms(base.p90)})`, ms(base.p50), '1.00×'),
      ...(fl && r.hops
        ? [
            row(
              'floor: 3 × (bare TCP + bare unix) round trips, back to back, same run',
              ms(fl.transport),
              `first after an idle gap: ${ms(3 * (r.hops.bareTcp + r.hops.bareUnix))}`,
              'what two hops cost before any work',
            ),
          ]
        : []),
      added('remote TypeScript SDK', r.remoteSdk),
      ...floorRows('remote TypeScript SDK', 'remoteSdk'),
      added('e2b SDK', r.e2b),
      ...floorRows('e2b SDK', 'e2b'),
      row(
        `${c.n} concurrent creates through the API: wall time`,
        ms(c.wallMs),
        `${c.errors} errors${c.firstError ? ` (first: ${c.firstError})` : ''}`,
      ),
      row(
        `${c.n} concurrent creates: per create p50 / p99`,
        `${ms(c.perCreate.p50)} / ${ms(c.perCreate.p99)}`,
        ratioTo(c.perCreate.p50, base.p50, 'library one-shot p50', ms(base.p50)),
      ),
      row(
        'server RSS, no sandbox (front + supervisor)',
        mib(m.idle.frontMiB + m.idle.supervisorMiB),
        `front ${mib(m.idle.frontMiB)}, supervisor ${mib(m.idle.supervisorMiB)}; at start ${mib(m.idleAtStart.frontMiB + m.idleAtStart.supervisorMiB)}`,
      ),
      row(
        `server RSS per live sandbox (front + supervisor, ${m.live} live)`,
        `${m.perSandboxKiB.toFixed(0)} KiB`,
        `${mib(m.loaded.frontMiB + m.loaded.supervisorMiB)} with ${m.live} live`,
      ),
    ],
    charts: [
      chart(
        'server-latency',
        'create → exec `true` → kill: library, remote SDK, e2b SDK',
        boxPlotSvg('create → exec true → kill', 'ms', [
          { label: 'library in-process', samples: r.samples.library, baseline: true },
          { label: 'remote TypeScript SDK', samples: r.samples.remoteSdk },
          { label: 'e2b SDK', samples: r.samples.e2b },
        ]),
      ),
    ],
    detail: formatServer(r),
  };
}

// ---- main ---------------------------------------------------------------------------------------

function parseArgs(argv: string[]): { names: string[]; quick: boolean; runs: number } {
  const quick = argv.includes('--quick');
  const i = argv.indexOf('--runs');
  const runs = i >= 0 ? Number(argv[i + 1]) : quick ? 30 : 300;
  const names = argv.filter((a, k) => !a.startsWith('--') && argv[k - 1] !== '--runs');
  return { names, quick, runs };
}

async function main(): Promise<void> {
  const { names, quick, runs } = parseArgs(process.argv.slice(2));
  if (process.argv.includes(GVISOR_CHILD)) return gvisorChild(runs, quick);
  const selected = names.length ? names : Object.keys(BENCHES);
  if (RUN_ORDER.length !== Object.keys(BENCHES).length)
    throw new Error('RUN_ORDER must list every benchmark');
  for (const n of selected) {
    if (!BENCHES[n]) {
      console.error(`bench: unknown benchmark "${n}"; choose from ${Object.keys(BENCHES).join(', ')}`);
      process.exit(2);
    }
  }
  const t0 = performance.now();
  const log = (s: string): void =>
    void process.stderr.write(`bench [${((performance.now() - t0) / 1000).toFixed(0).padStart(4)} s] ${s}\n`);
  const facts = machineFacts();
  log(
    `${quick ? 'quick' : 'full'} run of ${selected.join(', ')} on ${facts.cores} cores, kernel ${facts.kernel}`,
  );
  const results: Results = {};
  const errors: Record<string, string> = {};
  for (const name of RUN_ORDER.filter((n) => selected.includes(n))) {
    await quietHost(log);
    const s = performance.now();
    try {
      await BENCHES[name]!({ quick, runs, log }, results);
    } catch (e) {
      errors[name] = e instanceof Error ? e.message : String(e);
      log(`${name} FAILED: ${errors[name]}`);
    }
    log(`${name} done in ${((performance.now() - s) / 1000).toFixed(1)} s`);
  }
  const seconds = (performance.now() - t0) / 1000;

  const dir = join(HERE, 'results');
  mkdirSync(dir, { recursive: true });
  const stamp = new Date().toISOString().replace(/[:.]/g, '-');
  const charts: Chart[] = [];
  const chart = (name: string, title: string, svg: string): Chart => {
    const c = { file: `${stamp}-${name}.svg`, title, svg };
    charts.push(c);
    return c;
  };
  const sections: Section[] = [];
  const errorSection = (id: string, title: string, name: string): Section => ({
    id,
    title,
    rows: [
      notMeasured(
        title,
        errors[name] ? `failed: ${errors[name]!.split('\n')[0]}` : 'not selected in this run',
      ),
    ],
  });
  sections.push(
    results.lifecycle
      ? p1(results.lifecycle, results.peer, results.gvisor, chart)
      : errorSection('P1', 'one-shot, namespaces tier', 'lifecycle'),
  );
  const gvisorWhy = errors.gvisor
    ? `gVisor bench failed: ${errors.gvisor.split('\n')[0]}`
    : selected.includes('gvisor')
      ? GVISOR_PENDING
      : 'not selected in this run';
  sections.push(...p2p3(results.fork, results.gvisor, gvisorWhy, chart));
  sections.push(
    results.throughput ? p4(results.throughput, chart) : errorSection('P4', 'throughput', 'throughput'),
  );
  sections.push(results.density ? p5(results.density, chart) : errorSection('P5', 'density', 'density'));
  sections.push(results.mcp ? p6(results.mcp) : errorSection('P6', 'MCP', 'mcp'));
  sections.push(results.egress ? p7(results.egress) : errorSection('P7', 'egress', 'egress'));
  sections.push(
    results.peer ? peerSection(results.peer, chart) : errorSection('Peer', 'sandbox-runtime', 'peer'),
  );
  sections.push(
    results.server
      ? serverSection(results.server, chart)
      : errorSection('S1', 'the sandbox server', 'server'),
  );

  const extraFacts: Record<string, string> = {
    'load average at end (1/5/15 min; other work on the host skews every figure)': loadavg()
      .map((l) => l.toFixed(2))
      .join(' / '),
  };
  if (results.peer) extraFacts['@anthropic-ai/sandbox-runtime'] = results.peer.srtVersion;
  const md = renderMarkdown({ stamp, facts, extraFacts, mode: quick ? 'quick' : 'full', seconds, sections });
  const base = join(dir, stamp);
  writeFileSync(
    `${base}.json`,
    JSON.stringify(
      { stamp, mode: quick ? 'quick' : 'full', seconds, facts, errors, sections, results },
      null,
      2,
    ),
  );
  writeFileSync(`${base}.md`, md);
  for (const c of charts) writeFileSync(join(dir, c.file), c.svg);
  writeBenchmarksDoc(`${base}.json`, join(HERE, '..', 'docs', 'benchmarks.md'));
  const summary = sections.flatMap((s) =>
    s.rows.filter((r) => r.verdict).map((r) => `${s.id} ${r.verdict} ${r.measure}: ${r.value}`),
  );
  console.log(summary.join('\n'));
  log(
    `wrote ${basename(base)}.md, .json and ${charts.length} SVG charts in bench/results/ (${seconds.toFixed(0)} s)`,
  );
  // Exit now: a peer's leftover handle (its proxies, a helper process) must not hold the run open.
  process.exit(Object.keys(errors).length ? 1 : 0);
}

await main();
