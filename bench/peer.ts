// The peer, side by side in the same run: Anthropic's sandbox-runtime (`@anthropic-ai/sandbox-runtime`,
// a bench-only dev dependency; bwrap + a host-side proxy reached over Unix sockets on Linux) beside
// Airlock's equivalents:
//   CLI      `srt true` vs `airlock run -- true` (Airlock's built CLI, dist/bin as the package ships it,
//            so neither pays a TypeScript loader), beside `node -e 0` (the floor of any Node CLI)
//   library  SandboxManager.wrapWithSandbox('true') + spawning the wrapped command vs Airlock's
//            create → exec `true` → kill, beside raw bwrap (minimal flags + seccomp)
//   proxy    sequential HTTP GETs by curl inside one sandbox through each one's proxy to a server on
//            this host's loopback, beside the same curl loop on the host straight to the server
// Anything of the peer that cannot run here is detected and reported with its reason; the rest goes on.
// NETWORK SAFETY: the only server is on 127.0.0.1; Airlock's dialer is replaced by one that connects
// only to it, and srt's allow-list names only it.
import { spawn } from 'node:child_process';
import { mkdirSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import { connect, type AddressInfo, type Socket } from 'node:net';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Airlock, Sandbox } from '../src/index.js';
import { buildSeccompFilter } from '../src/backends/host/seccomp.privileged.js';
import {
  BENCH_STATE_DIR,
  BENCH_UID_RANGE,
  BUILT_CLI,
  buildCli,
  cliEnv,
  runOut,
  runQuiet,
  type BenchContext,
} from './common.js';
import { rawBwrapOnce } from './lifecycle.js';
import { sample, summarize, type Summary } from './stats.js';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const SRT_CLI = join(ROOT, 'node_modules/@anthropic-ai/sandbox-runtime/dist/cli.js');
/** An empty cwd and HOME for srt: it scans the cwd with ripgrep for files to protect. */
const SRT_DIR = `${BENCH_STATE_DIR}-srt`;
const FAKE_ADDRESS = '203.0.113.10';
const PEER_NAME = 'peer.test';

export interface Measured<T> {
  readonly ok: true;
  readonly value: T;
}
export interface NotRun {
  readonly ok: false;
  readonly reason: string;
}
export type Maybe<T> = Measured<T> | NotRun;

export interface PeerReport {
  readonly srtVersion: string;
  readonly nodeStartup: Summary;
  readonly srtCli: Maybe<Summary>;
  readonly airlockCli: Maybe<Summary>;
  readonly rawBwrap: Summary;
  readonly srtLib: Maybe<Summary & { initMs: number }>;
  readonly airlockLib: Summary;
  readonly proxy: {
    readonly requests: number;
    readonly hostDirect: Summary;
    readonly srt: Maybe<Summary>;
    readonly airlock: Maybe<Summary>;
  };
  readonly samples: Record<string, number[]>;
}

const attempt = async <T>(f: () => Promise<T>): Promise<Maybe<T>> => {
  try {
    return { ok: true, value: await f() };
  } catch (e) {
    return { ok: false, reason: ((e as Error).message || String(e)).split('\n')[0]!.slice(0, 300) };
  }
};

/** The curl loop used for every proxy row: prints time_total (s) of each request. */
const curlLoop = (url: string, n: number, proxyFlags: string): string =>
  `for i in $(seq ${n}); do curl -sS ${proxyFlags} -o /dev/null -w '%{time_total}\\n' ${url} || exit 1; done`;

const parseCurlTimes = (out: string, skip: number): Summary => {
  const xs = out
    .trim()
    .split('\n')
    .map((l) => Number(l) * 1000)
    .filter((x) => Number.isFinite(x));
  if (xs.length <= skip) throw new Error(`curl loop printed ${xs.length} times: ${out.slice(0, 200)}`);
  return summarize(xs.slice(skip));
};

function spawnShell(cmd: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const c = spawn('/bin/bash', ['-c', cmd], { cwd: SRT_DIR, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    c.stdout.setEncoding('utf8').on('data', (t: string) => (out += t));
    c.stderr.setEncoding('utf8').on('data', (t: string) => (err = (err + t).slice(-2000)));
    c.on('error', reject);
    c.on('close', (code) => (code === 0 ? resolve(out) : reject(new Error(`exited ${code}: ${err.trim()}`))));
  });
}

export async function peerBench(ctx: BenchContext): Promise<PeerReport> {
  const cliRuns = ctx.quick ? 4 : 40;
  const libRuns = ctx.quick ? 20 : 200;
  const requests = ctx.quick ? 20 : 100;
  mkdirSync(SRT_DIR, { recursive: true });
  const srtEnv = { PATH: '/usr/local/bin:/usr/bin:/bin', HOME: SRT_DIR };
  const srtVersion = (await attempt(() => runOut(process.execPath, [SRT_CLI, '--version'], srtEnv))).ok
    ? (await runOut(process.execPath, [SRT_CLI, '--version'], srtEnv)).trim()
    : 'not runnable';

  ctx.log(`peer: node -e 0 ×${cliRuns}`);
  const nodeS = await sample(cliRuns, () => runQuiet(process.execPath, ['-e', '0']), 2);
  ctx.log(`peer: srt true (CLI) ×${cliRuns}`);
  let srtCliS: number[] = [];
  const srtCli = await attempt(async () => {
    srtCliS = await sample(cliRuns, () => runQuiet(process.execPath, [SRT_CLI, 'true'], { env: srtEnv }), 2);
    return summarize(srtCliS);
  });
  ctx.log(`peer: airlock run -- true (built CLI, dist/bin) ×${cliRuns}`);
  let airlockCliS: number[] = [];
  const airlockCli = await attempt(async () => {
    await buildCli();
    airlockCliS = await sample(
      cliRuns,
      () => runQuiet(process.execPath, [BUILT_CLI, 'run', '--', 'true'], { env: cliEnv() }),
      2,
    );
    return summarize(airlockCliS);
  });

  ctx.log(`peer: raw bwrap ×${libRuns}`);
  const seccomp = buildSeccompFilter();
  const rawS = await sample(libRuns, () => rawBwrapOnce(seccomp));

  const server = await startServer();
  const port = (server.address() as AddressInfo).port;
  let srtLibS: number[] = [];
  let srtLib: PeerReport['srtLib'];
  let srtProxy: Maybe<Summary>;
  const { SandboxManager } = await import('@anthropic-ai/sandbox-runtime');
  try {
    ctx.log(`peer: srt library (wrapWithSandbox + spawn) ×${libRuns}`);
    const t0 = performance.now();
    const init = await attempt(async () => {
      const deps = SandboxManager.checkDependencies();
      if (deps.errors.length) throw new Error(`srt dependencies: ${deps.errors.join('; ')}`);
      await SandboxManager.initialize({
        network: { allowedDomains: ['127.0.0.1', `127.0.0.1:${port}`], deniedDomains: [] },
        filesystem: { denyRead: [], allowWrite: [], denyWrite: [] },
      });
      return performance.now() - t0;
    });
    if (!init.ok) {
      srtLib = init;
      srtProxy = init;
    } else {
      srtLib = await attempt(async () => {
        srtLibS = await sample(libRuns, async () => {
          const cmd = await SandboxManager.wrapWithSandbox('true');
          await spawnShell(cmd);
          SandboxManager.cleanupAfterCommand();
        });
        return { ...summarize(srtLibS), initMs: init.value };
      });
      ctx.log(`peer: srt proxy, ${requests} requests`);
      srtProxy = await attempt(async () => {
        const cmd = await SandboxManager.wrapWithSandbox(
          curlLoop(`http://127.0.0.1:${port}/`, requests + 3, "--noproxy ''"),
        );
        const out = await spawnShell(cmd);
        SandboxManager.cleanupAfterCommand();
        return parseCurlTimes(out, 3);
      });
    }
  } finally {
    await SandboxManager.reset().catch(() => {});
  }

  ctx.log(`peer: airlock create→exec true→kill ×${libRuns}`);
  const airlock = new Airlock({
    stateDir: BENCH_STATE_DIR,
    uidRange: BENCH_UID_RANGE,
    egress: {
      resolver: async (name) => {
        if (name !== PEER_NAME) throw new Error(`ENOTFOUND ${name}`);
        return [FAKE_ADDRESS];
      },
      // The sandbox asks for peer.test; this dialer connects only to the loopback test server.
      dialer: (address, p) =>
        new Promise<Socket>((resolve, reject) => {
          if (address !== FAKE_ADDRESS || p !== port)
            return reject(new Error(`bench dialer refuses ${address}:${p}`));
          const s = connect({ host: '127.0.0.1', port });
          s.once('connect', () => resolve(s));
          s.once('error', reject);
        }),
    },
  });
  let airlockLibS: number[] = [];
  let airlockProxy: Maybe<Summary>;
  try {
    airlockLibS = await sample(libRuns, async () => {
      const sbx = await Sandbox.create({}, { airlock });
      const r = await sbx.exec(['/usr/bin/true']);
      await sbx.kill();
      if (r.exitCode !== 0) throw new Error(`exec failed: ${r.stderr}`);
    });
    ctx.log(`peer: airlock proxy, ${requests} requests`);
    airlockProxy = await attempt(async () => {
      const sbx = await airlock.create({ network: { allow: [`${PEER_NAME}:${port}`] } });
      try {
        const r = await sbx.exec(curlLoop(`http://${PEER_NAME}:${port}/`, requests + 3, ''), {
          timeoutMs: 120_000,
        });
        if (r.exitCode !== 0) throw new Error(`curl loop failed: ${r.stderr.trim()}`);
        return parseCurlTimes(r.stdout, 3);
      } finally {
        await sbx.kill();
      }
    });
  } finally {
    await airlock.close();
  }
  ctx.log(`peer: host curl straight to the server, ${requests} requests`);
  const hostDirect = parseCurlTimes(
    await runOut('/bin/bash', ['-c', curlLoop(`http://127.0.0.1:${port}/`, requests + 3, "--noproxy '*'")]),
    3,
  );
  await new Promise<void>((r) => server.close(() => r()));

  return {
    srtVersion,
    nodeStartup: summarize(nodeS),
    srtCli,
    airlockCli,
    rawBwrap: summarize(rawS),
    srtLib,
    airlockLib: summarize(airlockLibS),
    proxy: { requests, hostDirect, srt: srtProxy, airlock: airlockProxy },
    samples: {
      'node -e 0': nodeS,
      'srt true (CLI)': srtCliS,
      'airlock run true (CLI)': airlockCliS,
      'raw bwrap': rawS,
      'srt library': srtLibS,
      'Airlock library': airlockLibS,
    },
  };
}

function startServer(): Promise<Server> {
  return new Promise((resolve) => {
    const s = createServer((_req, res) => {
      res.writeHead(200, { 'content-type': 'text/plain', 'content-length': 3 });
      res.end('ok\n');
    });
    s.listen(0, '127.0.0.1', () => resolve(s));
  });
}
