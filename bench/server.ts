// S1: the sandbox server (`airlock serve`: front server + supervisor) against the
// library in-process, all in one run:
//   - create → exec `true` → kill, N rounds, the ways taking turns each round: (a) the library
//     in this process, (b) the remote TypeScript SDK over the native API (`new Airlock({ apiUrl })`:
//     the same calls as (a)), (c) the official e2b SDK against /e2b, and (d) the supervisor's own API
//     on its unix socket (the front server's hop, without the front server). p50/p90 each, the p50
//     that (b) and (c) add to (a), beside the target (≤ 2 ms added p50 on loopback), and
//     each phase (create, exec, kill) apart;
//   - the floor of a hop, in the same rounds: an HTTP request to a bare node:http server in another
//     process over loopback TCP and over a unix socket (keep-alive), GET /healthz of the front server
//     and GET /v1/supervisor of the supervisor (the framework's own cost on top of the bare hop);
//   - 100 creates at once through the API (remote SDK): wall time, p50/p99 per create, errors;
//   - CPU time per create → exec → kill of each way, per process: this process (the client: the
//     library itself, the remote SDK or the e2b SDK), the front server and the supervisor (all their
//     threads, from /proc/PID/task/*/schedstat), so that the time each way adds can be told apart
//     into client work, server work and waiting (transport, scheduling);
//   - the server's memory: RSS of the front server and of the supervisor with no sandbox (at start,
//     and after the rounds above), and with N live sandboxes; the overhead per sandbox from those
//     (the sandboxes' own processes are not in it: see P5 for what a sandbox costs the host).
// Everything on loopback; the e2b SDK's own domain is an unresolvable .invalid name.
// The server runs from the source through tsx, not from the built CLI: the bundle (dist/bin) does not
// find better-sqlite3's native binding, so a built `airlock serve` cannot open its store yet. Its RSS
// therefore includes the TypeScript loader.
import { spawn, type ChildProcess } from 'node:child_process';
import http from 'node:http';
import { mkdirSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { Sandbox as E2bSandbox } from 'e2b';
import { Airlock, Sandbox, type RemoteAirlock } from '../src/index.js';
import { RemoteSandboxApi } from '../src/server/client.js';
import { Store } from '../src/server/store.js';
import { supervisorInfo, supervisorPaths } from '../src/server/supervisor-client.js';
import { BENCH_STATE_DIR, BENCH_UID_RANGE, sleepMs, type BenchContext } from './common.js';
import { percentile, summarize, type Summary } from './stats.js';

/** The server's own state dir and uids (apart from the library's, so neither reaps the other). */
const SERVER_STATE_DIR = `${BENCH_STATE_DIR}-server`;
const LIBRARY_UIDS = { first: BENCH_UID_RANGE.first, count: 1024 };
const SERVER_UIDS = { first: BENCH_UID_RANGE.first + 1024, count: BENCH_UID_RANGE.count - 1024 };
const CONCURRENT = 100;
const E2B_DOMAIN = 'airlock-bench.invalid';
/** create → exec → kill of each way before the rounds are timed. */
const WARM_UP = 40;
/** Round trips of each hop sent back to back after the first of a round. */
const WARM_HOPS = 5;
const ROOT = fileURLToPath(new URL('..', import.meta.url));
const TSX = pathToFileURL(join(ROOT, 'node_modules', 'tsx', 'dist', 'loader.mjs')).href;
const CLI_MAIN = join(ROOT, 'src', 'cli', 'main.ts');

export interface Latency extends Summary {
  readonly p90: number;
}

export interface Rss {
  readonly frontMiB: number;
  readonly supervisorMiB: number;
}

/** The ways create → exec → kill is timed, each phase apart. */
export type Way = 'library' | 'remoteSdk' | 'e2b' | 'supervisor' | 'remoteStub' | 'e2bStub';
/** The SDK ways, each also timed against the canned-answer stub (bench/canned-server.ts). */
const STUBBED = { remoteSdk: 'remoteStub', e2b: 'e2bStub' } as const;
export type Phase = 'create' | 'exec' | 'kill';
/** One HTTP round trip: bare node:http over TCP and unix socket, the front server's and the supervisor's. */
export type Hop = 'bareTcp' | 'bareUnix' | 'frontHealthz' | 'supervisorInfo';

/** CPU time (ms, all threads) of one create → exec → kill in each process. */
export interface CpuSplit {
  readonly client: number;
  readonly front: number;
  readonly supervisor: number;
}

export interface ServerReport {
  readonly rounds: number;
  /** create → exec → kill of each way run before the timed rounds. */
  readonly warmUp?: number;
  readonly library: Latency;
  readonly remoteSdk: Latency;
  readonly e2b: Latency;
  /** The supervisor's native API on its unix socket (RemoteSandboxApi), no front server. */
  readonly supervisor?: Latency;
  /**
   * The same SDK calls against a stub in another process that answers each with a canned copy of the
   * real server's answer (bench/canned-server.ts): the SDK's own work and one loopback TCP round trip
   * per call, no server work, no sandbox. The floor under each SDK's time.
   */
  readonly stub?: { readonly remoteSdk: Latency; readonly e2b: Latency };
  /** p50 of each phase of each way. */
  readonly phases?: Record<Way, Record<Phase, number>>;
  /** p50 of one round trip of each kind (the floor under each hop): the first after the round's idle gap. */
  readonly hops?: Record<Hop, number>;
  /** p50 of the same round trip sent again at once, back to back (both processes awake). */
  readonly hopsWarm?: Record<Hop, number>;
  /** Mean CPU ms per create → exec → kill of each way, in each process. */
  readonly cpu?: Record<Way, CpuSplit>;
  readonly concurrent: {
    readonly n: number;
    readonly wallMs: number;
    readonly perCreate: Latency;
    readonly errors: number;
    readonly firstError?: string;
  };
  readonly memory: {
    readonly idleAtStart: Rss;
    readonly idle: Rss;
    readonly live: number;
    readonly loaded: Rss;
    /** (loaded − idle) / live, front and supervisor together. */
    readonly perSandboxKiB: number;
  };
  readonly samples: Record<'library' | 'remoteSdk' | 'e2b' | 'concurrent', number[]>;
}

const latency = (xs: readonly number[]): Latency => ({
  ...summarize(xs),
  p90: percentile(
    [...xs].sort((a, b) => a - b),
    90,
  ),
});

/** VmRSS of a process, in MiB. */
function rssMiB(pid: number): number {
  const m = /^VmRSS:\s+(\d+) kB$/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  if (!m) throw new Error(`no VmRSS for pid ${pid}`);
  return Number(m[1]) / 1024;
}

/** CPU time (ms) a process has used so far, all its threads (schedstat: nanoseconds on a CPU). */
function cpuMsOf(pid: number): number {
  let ns = 0;
  for (const task of readdirSync(`/proc/${pid}/task`)) {
    try {
      ns += Number(readFileSync(`/proc/${pid}/task/${task}/schedstat`, 'utf8').split(' ')[0]);
    } catch {
      /* the thread ended meanwhile */
    }
  }
  return ns / 1e6;
}

/** CPU ms so far of this process (the client), the front server and the supervisor. */
function cpuNow(s: Served): CpuSplit {
  const own = process.cpuUsage();
  return {
    client: (own.user + own.system) / 1000,
    front: cpuMsOf(s.child.pid!),
    supervisor: cpuMsOf(s.supervisorPid),
  };
}

interface Served {
  readonly child: ChildProcess;
  readonly url: string;
  readonly supervisorPid: number;
}

/** `airlock serve` (the source, through tsx) on 127.0.0.1:0 with the bench's state dir; resolves once it listens. */
async function startServe(): Promise<Served> {
  mkdirSync(SERVER_STATE_DIR, { recursive: true, mode: 0o711 });
  const config = join(SERVER_STATE_DIR, 'bench-serve.json');
  // Quotas out of the way: this measures the server, not a tenant's limits.
  const quota = { maxSandboxes: 10_000, maxMemoryBytes: 2 ** 50, maxCpus: 100_000, createsPerMinute: 1e6 };
  writeFileSync(
    config,
    JSON.stringify({ defaultQuota: quota, maxQueue: 1000, defaultQueueTimeoutMs: 60_000 }),
  );
  const child = spawn(
    process.execPath,
    [
      // AIRLOCK_SERVER_BENCH_CPU_PROF=DIR: V8 CPU profiles of the front server and (through its
      // execArgv, which it starts the supervisor with) of the supervisor, written when they exit.
      ...(process.env.AIRLOCK_SERVER_BENCH_CPU_PROF
        ? ['--cpu-prof', '--cpu-prof-dir', process.env.AIRLOCK_SERVER_BENCH_CPU_PROF]
        : []),
      '--import',
      TSX,
      CLI_MAIN,
      'serve',
      '--listen',
      '127.0.0.1:0',
      '--state-dir',
      SERVER_STATE_DIR,
      '--config',
      config,
    ],
    {
      env: {
        PATH: '/usr/local/bin:/usr/bin:/bin',
        AIRLOCK_STATE_DIR: SERVER_STATE_DIR,
        AIRLOCK_UID_RANGE: `${SERVER_UIDS.first}:${SERVER_UIDS.count}`,
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    },
  );
  let out = '';
  let err = '';
  child.stderr!.setEncoding('utf8').on('data', (t: string) => (err = (err + t).slice(-4000)));
  const url = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`airlock serve did not start: ${err}`)), 120_000);
    child.stdout!.setEncoding('utf8').on('data', (t: string) => {
      out += t;
      const m = /listening on (http\S+)/.exec(out);
      if (m) {
        clearTimeout(timer);
        resolve(m[1]!);
      }
    });
    child.on('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`airlock serve exited ${code}: ${err}`));
    });
  });
  child.stdout!.resume();
  const info = await supervisorInfo(supervisorPaths(SERVER_STATE_DIR).socket);
  if (!info) throw new Error('airlock serve is listening but its supervisor does not answer');
  return { child, url, supervisorPid: info.pid };
}

/** SIGTERM the front server, then the supervisor (it kills what is left), and wait for both. */
async function stopServe(s: Served): Promise<void> {
  const gone = (pid: number): boolean => {
    try {
      process.kill(pid, 0);
      return false;
    } catch {
      return true;
    }
  };
  if (s.child.exitCode === null) {
    const exited = new Promise((r) => s.child.once('exit', r));
    s.child.kill('SIGTERM');
    await exited;
  }
  try {
    process.kill(s.supervisorPid, 'SIGTERM');
  } catch {
    /* already gone */
  }
  for (let i = 0; i < 600 && !gone(s.supervisorPid); i++) await sleepMs(50);
}

/**
 * A bare node:http server (answers `{}`) in its own process, on 127.0.0.1:0 and on a unix socket: the
 * floor of one HTTP round trip between two processes, apart from any framework.
 */
async function startBareServer(): Promise<{ port: number; socketPath: string; stop: () => Promise<void> }> {
  const socketPath = join(SERVER_STATE_DIR, 'bench-bare.sock');
  const code = `
    const http = require('node:http');
    const fs = require('node:fs');
    const serve = () => http.createServer((q, r) => { q.resume(); r.setHeader('content-type', 'application/json'); r.end('{}'); });
    fs.rmSync(${JSON.stringify(socketPath)}, { force: true });
    const tcp = serve().listen(0, '127.0.0.1', () =>
      serve().listen(${JSON.stringify(socketPath)}, () => process.stdout.write(tcp.address().port + '\\n')));
  `;
  const child = spawn(process.execPath, ['-e', code], { stdio: ['ignore', 'pipe', 'inherit'] });
  return { ...(await listening(child, 'the bare HTTP server')), socketPath };
}

/** A child that prints its TCP port on its first stdout line: that port, and how to stop it. */
async function listening(
  child: ChildProcess,
  what: string,
): Promise<{ port: number; stop: () => Promise<void> }> {
  const port = await new Promise<number>((resolve, reject) => {
    let out = '';
    child.stdout!.setEncoding('utf8').on('data', (t: string) => {
      out += t;
      if (out.includes('\n')) resolve(Number(out.trim()));
    });
    child.once('exit', (code) => reject(new Error(`${what} exited ${code}`)));
  });
  return {
    port,
    stop: async () => {
      if (child.exitCode !== null) return;
      const exited = new Promise((r) => child.once('exit', r));
      child.kill('SIGTERM');
      await exited;
    },
  };
}

/**
 * The canned-answer stub (bench/canned-server.ts) in its own process, recording from `target` until
 * `replay()` switches it to answering from what it kept.
 */
async function startCannedServer(
  target: string,
): Promise<{ url: string; replay: () => Promise<void>; stop: () => Promise<void> }> {
  const child = spawn(process.execPath, ['--import', TSX, join(ROOT, 'bench', 'canned-server.ts')], {
    env: { PATH: process.env.PATH ?? '/usr/bin:/bin', AIRLOCK_CANNED_TARGET: target },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  const { port, stop } = await listening(child, 'the canned-answer stub');
  const url = `http://127.0.0.1:${port}`;
  const replay = async (): Promise<void> => {
    const r = await fetch(`${url}/__canned/replay`, { method: 'POST' });
    if (!r.ok) throw new Error(`the canned-answer stub did not switch to replay: HTTP ${r.status}`);
  };
  return { url, replay, stop };
}

const rssOf = (s: Served): Rss => ({
  frontMiB: rssMiB(s.child.pid!),
  supervisorMiB: rssMiB(s.supervisorPid),
});

export async function serverBench(c: BenchContext & { runs: number }): Promise<ServerReport> {
  const rounds = c.quick ? Math.min(c.runs, 20) : Math.min(c.runs, 200);
  const live = c.quick ? 20 : 100;
  c.log('server: starting airlock serve');
  const served = await startServe();
  const library = new Airlock({ stateDir: BENCH_STATE_DIR, uidRange: LIBRARY_UIDS });
  let remote: RemoteAirlock | undefined;
  const closers: Array<() => unknown> = [];
  try {
    await sleepMs(1000); // the server's start-up work settled
    const idleAtStart = rssOf(served);
    const store = new Store(join(SERVER_STATE_DIR, 'server.db'));
    const { key } = (() => {
      try {
        return store.createKey('bench');
      } finally {
        store.close();
      }
    })();
    remote = new Airlock({ apiUrl: served.url, apiKey: key });
    Object.assign(process.env, {
      E2B_API_URL: `${served.url}/e2b`,
      E2B_SANDBOX_URL: `${served.url}/e2b/envd`,
      E2B_DOMAIN,
    });
    const supervisorApi = new RemoteSandboxApi({ socketPath: supervisorPaths(SERVER_STATE_DIR).socket });
    closers.push(() => supervisorApi.close());
    const SUPERVISOR_CALLER = { tenant: 'bench' };
    // The canned-answer stub records from the front server until the SDKs' first cycles through it
    // are done (below), then answers from what it kept.
    const canned = await startCannedServer(served.url);
    closers.push(() => canned.stop());
    const stubRemote = new Airlock({ apiUrl: canned.url, apiKey: key });
    const WAYS = ['library', 'remoteSdk', 'e2b', 'supervisor', 'remoteStub', 'e2bStub'] as const;
    const phaseSamples = {} as Record<Way, Record<Phase, number[]>>;
    for (const w of WAYS) phaseSamples[w] = { create: [], exec: [], kill: [] };
    /** create → exec → kill, each phase timed into `w`'s samples. */
    const phased =
      <S>(
        w: Way,
        create: () => Promise<S>,
        exec: (s: S) => Promise<unknown>,
        kill: (s: S) => Promise<void>,
      ) =>
      async (): Promise<void> => {
        let t = performance.now();
        const lap = (p: Phase): void => {
          const now = performance.now();
          phaseSamples[w][p].push(now - t);
          t = now;
        };
        const sbx = await create();
        lap('create');
        await exec(sbx);
        lap('exec');
        await kill(sbx);
        lap('kill');
      };
    const e2bVia = (apiUrl?: string) => (): Promise<E2bSandbox> =>
      E2bSandbox.create({
        apiKey: key,
        timeoutMs: 120_000,
        ...(apiUrl ? { apiUrl: `${apiUrl}/e2b`, sandboxUrl: `${apiUrl}/e2b/envd` } : {}),
      });
    const e2bExec = (s: E2bSandbox): Promise<unknown> => s.commands.run('true');
    const e2bKill = async (s: E2bSandbox): Promise<void> => void (await s.kill());
    const ways: Record<Way, () => Promise<void>> = {
      library: phased(
        'library',
        () => Sandbox.create({}, { airlock: library }),
        (s) => s.exec('true'),
        (s) => s.kill(),
      ),
      remoteSdk: phased(
        'remoteSdk',
        () => Sandbox.create({}, { airlock: remote! }),
        (s) => s.exec('true'),
        (s) => s.kill(),
      ),
      e2b: phased('e2b', e2bVia(), e2bExec, e2bKill),
      supervisor: phased(
        'supervisor',
        () => supervisorApi.create({}, SUPERVISOR_CALLER),
        async (v) => {
          for await (const e of supervisorApi.exec(v.id, { cmd: 'true' }, SUPERVISOR_CALLER))
            if (e.type === 'exit') break;
        },
        (v) => supervisorApi.kill(v.id, SUPERVISOR_CALLER),
      ),
      remoteStub: phased(
        'remoteStub',
        () => Sandbox.create({}, { airlock: stubRemote }),
        (s) => s.exec('true'),
        (s) => s.kill(),
      ),
      e2bStub: phased('e2bStub', e2bVia(canned.url), e2bExec, e2bKill),
    };
    // Record: two real cycles of each SDK through the stub (a one-time call of the first is kept too).
    for (let i = 0; i < 2; i++) for (const w of Object.values(STUBBED)) await ways[w]();
    await canned.replay();
    const bare = await startBareServer();
    closers.push(() => bare.stop());
    const agent = new http.Agent({ keepAlive: true });
    closers.push(() => agent.destroy());
    const frontUrl = new URL(served.url);
    const hopOptions: Record<Hop, http.RequestOptions> = {
      bareTcp: { host: '127.0.0.1', port: bare.port, path: '/' },
      bareUnix: { socketPath: bare.socketPath, path: '/' },
      frontHealthz: { host: frontUrl.hostname, port: frontUrl.port, path: '/healthz' },
      supervisorInfo: { socketPath: supervisorPaths(SERVER_STATE_DIR).socket, path: '/v1/supervisor' },
    };
    const hopSamples: Record<Hop, number[]> = {
      bareTcp: [],
      bareUnix: [],
      frontHealthz: [],
      supervisorInfo: [],
    };
    const warmHopSamples: Record<Hop, number[]> = {
      bareTcp: [],
      bareUnix: [],
      frontHealthz: [],
      supervisorInfo: [],
    };
    // The client the SDK uses (RemoteSandboxApi): node:http, a keep-alive http.Agent, Nagle off (Node's
    // default on both ends).
    const hop = (o: http.RequestOptions): Promise<void> =>
      new Promise((resolve, reject) => {
        const req = http.request({ ...o, agent }, (res) => {
          res.resume();
          res.once('end', resolve);
        });
        req.once('error', reject);
        req.end();
      });
    const samples: ServerReport['samples'] = { library: [], remoteSdk: [], e2b: [], concurrent: [] };
    const supervisorSamples: number[] = [];
    const stubSamples: Record<(typeof STUBBED)[keyof typeof STUBBED], number[]> = {
      remoteStub: [],
      e2bStub: [],
    };
    c.log(
      `server: ${rounds} rounds of create → exec true → kill, library / remote SDK / e2b / supervisor in turn`,
    );
    // Warm-up, taking turns as the rounds do: the servers are fresh processes, and their HTTP, Hono and
    // store paths are still being optimised for the first few dozen calls (create and kill p50 through
    // the front fell by a third between calls 1-40 and 160-200 of one run), where a served API is a
    // long-lived process. The library runs in this process, warm from the start.
    for (let i = 0; i < WARM_UP; i++) for (const f of Object.values(ways)) await f();
    for (const p of Object.values(phaseSamples)) for (const k of Object.keys(p)) p[k as Phase].length = 0;
    const cpuSum = {} as Record<Way, { client: number; front: number; supervisor: number }>;
    for (const w of Object.keys(ways) as Way[]) cpuSum[w] = { client: 0, front: 0, supervisor: 0 };
    for (let i = 0; i < rounds; i++) {
      for (const [name, f] of Object.entries(ways) as Array<[Way, () => Promise<void>]>) {
        const c0 = cpuNow(served);
        const t0 = performance.now();
        await f();
        const took = performance.now() - t0;
        if (name === 'supervisor') supervisorSamples.push(took);
        else if (name === 'remoteStub' || name === 'e2bStub') stubSamples[name].push(took);
        else samples[name].push(took);
        const c1 = cpuNow(served);
        for (const k of ['client', 'front', 'supervisor'] as const) cpuSum[name][k] += c1[k] - c0[k];
      }
      // The first request after the round (the server idle since) and WARM_HOPS more back to back:
      // on a busy host the first pays for waking the server (and this process) up.
      for (const [name, o] of Object.entries(hopOptions) as Array<[Hop, http.RequestOptions]>) {
        for (let k = 0; k <= WARM_HOPS; k++) {
          const t0 = performance.now();
          await hop(o);
          (k === 0 ? hopSamples : warmHopSamples)[name].push(performance.now() - t0);
        }
      }
    }
    const p50 = (xs: readonly number[]): number => summarize(xs).p50;
    const phases = Object.fromEntries(
      Object.entries(phaseSamples).map(([w, p]) => [
        w,
        { create: p50(p.create), exec: p50(p.exec), kill: p50(p.kill) },
      ]),
    ) as Record<Way, Record<Phase, number>>;
    const cpu = Object.fromEntries(
      Object.entries(cpuSum).map(([w, c]) => [
        w,
        { client: c.client / rounds, front: c.front / rounds, supervisor: c.supervisor / rounds },
      ]),
    ) as Record<Way, CpuSplit>;
    const hops = Object.fromEntries(Object.entries(hopSamples).map(([h, xs]) => [h, p50(xs)])) as Record<
      Hop,
      number
    >;
    const hopsWarm = Object.fromEntries(
      Object.entries(warmHopSamples).map(([h, xs]) => [h, p50(xs)]),
    ) as Record<Hop, number>;

    c.log(`server: ${CONCURRENT} creates at once through the API`);
    const t0 = performance.now();
    const made = await Promise.allSettled(
      Array.from({ length: CONCURRENT }, async () => {
        const s = performance.now();
        const sbx = await remote!.create({ ttlMs: 600_000 });
        samples.concurrent.push(performance.now() - s);
        return sbx;
      }),
    );
    const wallMs = performance.now() - t0;
    const failed = made.filter((r): r is PromiseRejectedResult => r.status === 'rejected');
    await remote.killAll();

    c.log(`server: memory with no sandbox and with ${live} live`);
    await sleepMs(1000);
    const idle = rssOf(served);
    for (let i = 0; i < live; i += 10) {
      await Promise.all(
        Array.from({ length: Math.min(10, live - i) }, () => remote!.create({ ttlMs: 600_000 })),
      );
    }
    await sleepMs(1000);
    const loaded = rssOf(served);
    await remote.killAll();
    const total = (r: Rss): number => r.frontMiB + r.supervisorMiB;
    return {
      rounds,
      library: latency(samples.library),
      remoteSdk: latency(samples.remoteSdk),
      e2b: latency(samples.e2b),
      supervisor: latency(supervisorSamples),
      stub: { remoteSdk: latency(stubSamples.remoteStub), e2b: latency(stubSamples.e2bStub) },
      phases,
      hops,
      hopsWarm,
      warmUp: WARM_UP,
      cpu,
      concurrent: {
        n: CONCURRENT,
        wallMs,
        perCreate: latency(samples.concurrent),
        errors: failed.length,
        ...(failed[0] ? { firstError: String((failed[0].reason as Error).message ?? failed[0].reason) } : {}),
      },
      memory: {
        idleAtStart,
        idle,
        live,
        loaded,
        perSandboxKiB: ((total(loaded) - total(idle)) * 1024) / live,
      },
      samples,
    };
  } finally {
    for (const k of ['E2B_API_URL', 'E2B_SANDBOX_URL', 'E2B_DOMAIN']) delete process.env[k];
    for (const close of closers) await close();
    await remote?.killAll().catch(() => {});
    await library.close();
    await stopServe(served);
  }
}

/**
 * What no server could go below, measured in the same run (p50s, ms; undefined in a report without
 * the hop or stub rounds):
 *  - transport: 3 × (bare TCP + bare unix round trip, back to back): create, exec and kill each cross
 *    the client → front (TCP) and the front → supervisor (unix socket) hop once;
 *  - per SDK: its canned-answer stub's p50 (the SDK's own work and the TCP hops) + 3 × bare unix;
 *  - aboveFloor: what the SDK adds over the library, less that SDK floor: the servers' own work.
 */
export function serverFloors(r: ServerReport):
  | {
      transport: number;
      sdk: Record<keyof typeof STUBBED, { floor: number; aboveFloor: number }>;
    }
  | undefined {
  if (!r.hopsWarm || !r.stub) return undefined;
  const unix3 = 3 * r.hopsWarm.bareUnix;
  const sdk = (w: keyof typeof STUBBED): { floor: number; aboveFloor: number } => {
    const floor = r.stub![w].p50 + unix3;
    return { floor, aboveFloor: r[w].p50 - r.library.p50 - floor };
  };
  return {
    transport: 3 * (r.hopsWarm.bareTcp + r.hopsWarm.bareUnix),
    sdk: { remoteSdk: sdk('remoteSdk'), e2b: sdk('e2b') },
  };
}

/** Each way's row name in the detail tables. */
const WAY_NAMES = [
  ['library, in-process', 'library'],
  ['supervisor API, unix socket (no front server)', 'supervisor'],
  ['remote TypeScript SDK → front → supervisor', 'remoteSdk'],
  ['e2b SDK → front (/e2b) → supervisor', 'e2b'],
  ['remote TypeScript SDK → canned-answer stub (floor)', 'remoteStub'],
  ['e2b SDK → canned-answer stub (floor)', 'e2bStub'],
] as const;

/** The bench's own table (the report's detail). */
export function formatServer(r: ServerReport): string {
  const f = (x: number): string => `${x.toFixed(2)} ms`;
  const line = (name: string, l: Latency): string =>
    `| ${name} | ${f(l.p50)} | ${f(l.p90)} | ${f(l.p99)} | ${f(l.min)} | ${l.n} |`;
  const m = r.memory;
  const phaseRows = r.phases
    ? [
        '',
        '| p50 per phase | create | exec `true` | kill |',
        '|---|---|---|---|',
        ...WAY_NAMES.filter(([, w]) => w in r.phases!).map(([name, w]) => {
          const p = r.phases![w];
          return `| ${name} | ${f(p.create)} | ${f(p.exec)} | ${f(p.kill)} |`;
        }),
      ]
    : [];
  const hopRows = r.hops
    ? [
        '',
        '| one HTTP round trip, p50 (the floor under each hop) | first after a round | back to back |',
        '|---|---|---|',
        ...(
          [
            ['bare node:http, another process, loopback TCP (keep-alive)', 'bareTcp'],
            ['bare node:http, another process, unix socket (keep-alive)', 'bareUnix'],
            ['front server GET /healthz (TCP)', 'frontHealthz'],
            ['supervisor GET /v1/supervisor (unix socket)', 'supervisorInfo'],
          ] as const
        ).map(([name, h]) => `| ${name} | ${f(r.hops![h])} | ${r.hopsWarm ? f(r.hopsWarm[h]) : ''} |`),
        // What create → exec → kill through the front costs in transport alone: 3 calls, each a TCP
        // hop (client → front) and a unix-socket hop (front → supervisor), before any work.
        `| floor of create → exec → kill through the front: 3 × (TCP + unix) | ${f(3 * (r.hops.bareTcp + r.hops.bareUnix))} | ${r.hopsWarm ? f(3 * (r.hopsWarm.bareTcp + r.hopsWarm.bareUnix)) : ''} |`,
      ]
    : [];
  const cpuRows = r.cpu
    ? [
        '',
        '| CPU ms per create → exec → kill (mean, all threads) | client (this process) | front server | supervisor |',
        '|---|---|---|---|',
        ...WAY_NAMES.filter(([, w]) => w in r.cpu!).map(([name, w]) => {
          const c = r.cpu![w];
          return `| ${name} | ${f(c.client)} | ${f(c.front)} | ${f(c.supervisor)} |`;
        }),
      ]
    : [];
  return [
    '| create → exec `true` → kill | p50 | p90 | p99 | min | n |',
    '|---|---|---|---|---|---|',
    line('library, in-process', r.library),
    line('remote TypeScript SDK, native API', r.remoteSdk),
    line('e2b SDK, /e2b', r.e2b),
    ...(r.supervisor ? [line('supervisor API, unix socket (no front server)', r.supervisor)] : []),
    ...(r.stub
      ? [
          line('remote TypeScript SDK → canned-answer stub (no server, no sandbox)', r.stub.remoteSdk),
          line('e2b SDK → canned-answer stub (no server, no sandbox)', r.stub.e2b),
        ]
      : []),
    line(`one of ${r.concurrent.n} concurrent creates (API)`, r.concurrent.perCreate),
    '',
    '| RSS (MiB) | front server | supervisor |',
    '|---|---|---|',
    `| no sandbox, at start | ${m.idleAtStart.frontMiB.toFixed(1)} | ${m.idleAtStart.supervisorMiB.toFixed(1)} |`,
    `| no sandbox, after the rounds | ${m.idle.frontMiB.toFixed(1)} | ${m.idle.supervisorMiB.toFixed(1)} |`,
    `| ${m.live} live sandboxes | ${m.loaded.frontMiB.toFixed(1)} | ${m.loaded.supervisorMiB.toFixed(1)} |`,
    ...phaseRows,
    ...hopRows,
    ...cpuRows,
  ].join('\n');
}
