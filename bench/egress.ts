// E1: egress cost, beside its baselines measured in the same run.
//   Throughput: a 100 MB download from a test server on 203.0.113.10:80 (a separate Node process), read
//   directly by this process (Node http.get) and by curl on the host, by the same curl through a bare
//   userspace relay on the host (socat with 1 MiB buffers: the least any proxy must add, the floor of a
//   relay on this machine), vs curl inside a sandbox through
//   the proxy (HTTP_PROXY) and through the transparent path (--noproxy '*': nftables + DNS); both are
//   plain HTTP, which the gateway vets request by request (response bodies of a sandbox without secrets
//   are then moved by the fd relay, see src/egress/plain-http.ts). The same download through a CONNECT
//   tunnel (curl --proxytunnel) and through SOCKS5 measures the tunnel relay (the fd relay when
//   nothing needs inspecting), which is what HTTPS and other TCP take.
//   Latency: 1,000 sequential small requests by one python client (a new connection each), from inside
//   a sandbox through the proxy, vs the same client on the host straight to the same server (those two
//   in 5 interleaved rounds, after 2,000 warm-up requests through the proxy), vs the same client in
//   the sandbox to a python http.server on the sandbox's own 127.0.0.1 (no proxy).
//   Targets (issue 3): >= 80 % of direct throughput, <= 1 ms added p50.
//
// NETWORK SAFETY: the measurement runs only inside a network namespace made for it (unshare -n, lo
// only, 203.0.113.10/32 on lo), exactly like scripts/egress-test.sh; egressBench() re-execs this file
// there, and the child refuses to run anywhere else. The dialer refuses every address but the test one.
import { spawn, type ChildProcess } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { get } from 'node:http';
import { connect, type Socket } from 'node:net';
import { fileURLToPath } from 'node:url';
import { Airlock, type Sandbox } from '../src/index.js';
import { fmt, summarize, type Summary } from './stats.js';

const SERVER_ADDRESS = '203.0.113.10';
const NAME = 'bench.test';
const DOWNLOAD_MIB = 100;
/** Runs per path, the paths taking turns (medians of 5 moved by ±20 % from run to run on this VM). */
const DOWNLOAD_RUNS = 9;
const REQUESTS = 1000;
const WARMUP = 10;
/**
 * Requests through the proxy before the latency rows: V8 optimises the gateway's per-request code
 * over the first thousands of requests, as in a long-lived Airlock (the downloads before do not run
 * that code often).
 */
const PROXY_WARMUP = 2000;
/** The proxy and host-direct rows alternate in this many rounds (this VM's speed drifts). */
const LATENCY_ROUNDS = 5;
const CHILD_ENV = 'AIRLOCK_EGRESS_BENCH_NETNS';

export interface Throughput {
  readonly label: string;
  /** MiB/s of each run. */
  readonly runs: number[];
  /** Median MiB/s. */
  readonly mibPerS: number;
  /**
   * Median CPU time of this process (every thread: the gateway and its relay worker, or the Node
   * client for `direct`) per GiB moved, in ms. Less noisy than MiB/s on a shared machine.
   */
  readonly cpuMsPerGiB?: number;
}

export interface EgressReport {
  readonly downloadMiB: number;
  readonly direct: Throughput; // Node http.get from this process
  readonly hostCurl: Throughput; // curl on the host, same client as in the sandbox
  /**
   * The same curl on the host through socat (1 MiB buffers) to the same server: a relay that vets
   * nothing, the floor of any proxy. Absent when socat is not installed (or in older reports).
   */
  readonly relayFloor?: Throughput;
  readonly proxy: Throughput;
  readonly transparent: Throughput;
  /** The same download through a CONNECT tunnel (curl --proxytunnel): the tunnel relay. */
  readonly connect: Throughput;
  /** The same download through SOCKS5: the tunnel relay. */
  readonly socks5: Throughput;
  readonly latency: {
    readonly requests: number;
    readonly proxy: Summary;
    readonly hostDirect: Summary;
    readonly sandboxLocal: Summary;
  };
}

// ---- parent: re-exec in a private network namespace --------------------------------------------

/** Runs the benchmark in a fresh `unshare -n` namespace and returns its report. */
export async function egressBench(opts: { log: (s: string) => void }): Promise<EgressReport> {
  if (process.getuid?.() !== 0) throw new Error('the egress benchmark needs root (sandboxes and unshare -n)');
  const self = fileURLToPath(import.meta.url);
  const script = [
    'set -e',
    'ip link set lo up',
    `ip addr add ${SERVER_ADDRESS}/32 dev lo`,
    `export ${CHILD_ENV}=1`,
    `exec "$0" --import tsx "$1"`,
  ].join('\n');
  opts.log('egress: running in a private network namespace (unshare -n)');
  const child = spawn('unshare', ['--net', '--', '/bin/sh', '-c', script, process.execPath, self], {
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  let out = '';
  child.stdout.setEncoding('utf8').on('data', (t: string) => (out += t));
  const code = await new Promise<number | null>((r) => child.on('close', r));
  if (code !== 0) throw new Error(`egress benchmark child exited ${code}`);
  const last = out.trim().split('\n').pop() ?? '';
  return JSON.parse(last) as EgressReport;
}

// ---- child: the measurement -----------------------------------------------------------------------

function assertPrivateNetns(): void {
  const ifaces = readFileSync('/proc/self/net/dev', 'utf8')
    .split('\n')
    .slice(2)
    .map((l) => l.split(':')[0]!.trim())
    .filter(Boolean);
  if (process.env[CHILD_ENV] !== '1' || ifaces.length !== 1 || ifaces[0] !== 'lo') {
    throw new Error(
      `the egress benchmark runs only in its own network namespace (interfaces: ${ifaces.join(', ')})`,
    );
  }
}

const SERVER_JS = `
const http = require('node:http');
const chunk = Buffer.alloc(1 << 20, 97);
http.createServer((req, res) => {
  if (req.url === '/small') {
    res.writeHead(200, { 'content-type': 'text/plain', 'content-length': 3 });
    return res.end('ok\\n');
  }
  res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': ${DOWNLOAD_MIB} * chunk.length });
  let n = 0;
  const pump = () => {
    while (n < ${DOWNLOAD_MIB}) {
      n++;
      if (!res.write(chunk)) return void res.once('drain', pump);
    }
    res.end();
  };
  pump();
}).listen(80, '${SERVER_ADDRESS}', () => process.stdout.write('ready\\n'));
`;

function startServer(): Promise<ChildProcess> {
  return new Promise((resolve, reject) => {
    const c = spawn(process.execPath, ['-e', SERVER_JS], { stdio: ['ignore', 'pipe', 'inherit'] });
    c.on('error', reject);
    c.stdout!.once('data', () => resolve(c));
  });
}

const median = (xs: number[]): number => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
const throughput = (label: string, runs: number[], cpu: number[]): Throughput => ({
  label,
  runs,
  mibPerS: median(runs),
  cpuMsPerGiB: median(cpu),
});

function nodeDownload(): Promise<number> {
  return new Promise((resolve, reject) => {
    const t0 = performance.now();
    let bytes = 0;
    get(`http://${SERVER_ADDRESS}/big`, (res) => {
      res.on('data', (d: Buffer) => (bytes += d.length));
      res.on('end', () => resolve(bytes / 2 ** 20 / ((performance.now() - t0) / 1000)));
      res.on('error', reject);
    }).on('error', reject);
  });
}

const CURL_FMT = `-w '%{size_download} %{time_total}'`;

/** Where the bare relay (the floor row) listens, on this private namespace's loopback. */
const RELAY_FLOOR_PORT = 8081;

/** socat relaying 127.0.0.1:RELAY_FLOOR_PORT to the test server, or undefined without socat. */
async function startRelayFloor(log: (s: string) => void): Promise<ChildProcess | undefined> {
  const argv = [
    '-b',
    String(1 << 20),
    `TCP-LISTEN:${RELAY_FLOOR_PORT},bind=127.0.0.1,reuseaddr,fork`,
    `TCP:${SERVER_ADDRESS}:80`,
  ];
  const c = spawn('socat', argv, { stdio: ['ignore', 'ignore', 'inherit'] });
  const failed = await new Promise<boolean>((resolve) => {
    c.once('error', () => resolve(true));
    c.once('spawn', () => resolve(false));
  });
  if (failed) {
    log('egress: socat is not installed (scripts/bench-setup.sh installs it): no bare-relay floor row');
    return undefined;
  }
  // Wait until it listens (a refused connect means not yet).
  for (let i = 0; i < 100; i++) {
    const up = await new Promise<boolean>((resolve) => {
      const s = connect({ host: '127.0.0.1', port: RELAY_FLOOR_PORT });
      s.once('connect', () => (s.destroy(), resolve(true)));
      s.once('error', () => resolve(false));
    });
    if (up) return c;
    await new Promise((r) => setTimeout(r, 20));
  }
  c.kill();
  throw new Error('socat (the bare-relay floor) did not listen within 2 s');
}

function parseCurl(out: string): number {
  const [size, secs] = out.trim().split(/\s+/).map(Number) as [number, number];
  if (size !== DOWNLOAD_MIB * 2 ** 20) throw new Error(`curl downloaded ${size} bytes: ${out}`);
  return size / 2 ** 20 / secs;
}

function hostRun(argv: string[]): Promise<string> {
  return new Promise((resolve, reject) => {
    const c = spawn(argv[0]!, argv.slice(1), { stdio: ['ignore', 'pipe', 'inherit'] });
    let out = '';
    c.stdout.setEncoding('utf8').on('data', (t: string) => (out += t));
    c.on('error', reject);
    c.on('close', (code) => (code === 0 ? resolve(out) : reject(new Error(`${argv[0]} exited ${code}`))));
  });
}

async function sandboxCurl(s: Sandbox, flags: string): Promise<number> {
  const r = await s.exec(`curl -sS -o /dev/null ${flags} ${CURL_FMT} http://${NAME}/big`, {
    timeoutMs: 300_000,
  });
  if (r.exitCode !== 0) throw new Error(`sandbox curl failed: ${r.stderr}`);
  return parseCurl(r.stdout);
}

/** One python client for every latency row: argv host port url; prints per-request ms as JSON. */
const LATENCY_PY = String.raw`
import http.client, json, sys, time
host, port, url, n, warm = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
out = []
for i in range(warm + n):
    t0 = time.perf_counter()
    c = http.client.HTTPConnection(host, port, timeout=10)
    c.request('GET', url, headers={'Connection': 'close'})
    r = c.getresponse()
    body = r.read()
    c.close()
    if r.status != 200:
        raise SystemExit('status %d: %r' % (r.status, body[:200]))
    if i >= warm:
        out.append((time.perf_counter() - t0) * 1000)
print(json.dumps(out))
`;

/** `n` timed requests (after `warm` untimed ones) from inside the sandbox: ms each. */
async function sandboxLatency(
  s: Sandbox,
  host: string,
  port: number,
  url: string,
  n = REQUESTS,
  warm = WARMUP,
): Promise<number[]> {
  const r = await s.exec(['python3', '-c', LATENCY_PY, host, String(port), url, String(n), String(warm)], {
    timeoutMs: 120_000,
  });
  if (r.exitCode !== 0) throw new Error(`latency client failed: ${r.stderr}`);
  return JSON.parse(r.stdout) as number[];
}

/** The same from the host, straight to the server (no proxy). */
async function hostLatency(n: number): Promise<number[]> {
  const argv = [
    '/usr/bin/python3',
    '-c',
    LATENCY_PY,
    SERVER_ADDRESS,
    '80',
    '/small',
    String(n),
    String(WARMUP),
  ];
  return JSON.parse(await hostRun(argv)) as number[];
}

async function measure(log: (s: string) => void): Promise<EgressReport> {
  assertPrivateNetns();
  const server = await startServer();
  const relayFloor = await startRelayFloor(log).catch((e: unknown) => {
    server.kill(); // the finally below is not reached
    throw e;
  });
  const airlock = new Airlock({
    stateDir: '/var/tmp/airlock-egress-bench',
    uidRange: { first: 3_810_000, count: 4096 },
    egress: {
      resolver: async (name) => {
        if (name !== NAME) throw new Error(`ENOTFOUND ${name}`);
        return [SERVER_ADDRESS];
      },
      dialer: (address, port) =>
        new Promise<Socket>((resolve, reject) => {
          if (address !== SERVER_ADDRESS) return reject(new Error(`bench dialer refuses ${address}`));
          const s = connect({ host: address, port });
          s.once('connect', () => resolve(s));
          s.once('error', reject);
        }),
    },
    warmPool: 0,
  });
  try {
    const s = await airlock.create({ network: { allow: [NAME] }, ttlMs: 1_800_000 });
    try {
      // Every path once per round, rounds one after the other: a change in the machine's load (other
      // work on the same cores) then hits every path alike instead of skewing the ratios.
      const paths: Array<[string, () => Promise<number>]> = [
        ['direct (Node http.get on the host)', nodeDownload],
        [
          'curl on the host, direct',
          async () =>
            parseCurl(
              await hostRun(['sh', '-c', `curl -sS -o /dev/null ${CURL_FMT} http://${SERVER_ADDRESS}/big`]),
            ),
        ],
        ...(relayFloor
          ? ([
              [
                'curl on the host through a bare relay (socat)',
                async () =>
                  parseCurl(
                    await hostRun([
                      'sh',
                      '-c',
                      `curl -sS -o /dev/null ${CURL_FMT} http://127.0.0.1:${RELAY_FLOOR_PORT}/big`,
                    ]),
                  ),
              ],
            ] as Array<[string, () => Promise<number>]>)
          : []),
        ['sandbox curl through the proxy', () => sandboxCurl(s, '')],
        ['sandbox curl, transparent path', () => sandboxCurl(s, "--noproxy '*'")],
        [
          'sandbox curl through a CONNECT tunnel',
          () => sandboxCurl(s, '--proxytunnel -x http://127.0.0.1:3128'),
        ],
        ['sandbox curl through SOCKS5', () => sandboxCurl(s, '--socks5-hostname 127.0.0.1:3128')],
      ];
      for (const [, f] of paths) await f(); // warm-up
      const xs = paths.map(() => [] as number[]);
      const cpu = paths.map(() => [] as number[]);
      for (let i = 0; i < DOWNLOAD_RUNS; i++) {
        for (const [j, [, f]] of paths.entries()) {
          const c0 = process.cpuUsage();
          xs[j]!.push(await f());
          const c = process.cpuUsage(c0);
          cpu[j]!.push((c.user + c.system) / 1000 / (DOWNLOAD_MIB / 1024));
        }
      }
      const measured = paths.map(([label], j) => {
        log(
          `egress: ${label}: ${xs[j]!.map((x) => x.toFixed(0)).join(', ')} MiB/s; ` +
            `CPU of this process ${median(cpu[j]!).toFixed(0)} ms/GiB`,
        );
        return throughput(label, xs[j]!, cpu[j]!);
      });
      const floor = relayFloor ? measured.splice(2, 1)[0] : undefined;
      const [direct, hostCurl, proxy, transparent, viaConnect, viaSocks5] = measured as [
        Throughput,
        Throughput,
        Throughput,
        Throughput,
        Throughput,
        Throughput,
      ];

      log(`egress: latency: ${PROXY_WARMUP} warm-up requests through the proxy`);
      await sandboxLatency(s, '127.0.0.1', 3128, `http://${NAME}/small`, 0, PROXY_WARMUP);
      log(`egress: latency, ${REQUESTS} requests each, in ${LATENCY_ROUNDS} interleaved rounds`);
      const viaProxy: number[] = [];
      const fromHost: number[] = [];
      for (let r = 0; r < LATENCY_ROUNDS; r++) {
        const n = REQUESTS / LATENCY_ROUNDS;
        viaProxy.push(...(await sandboxLatency(s, '127.0.0.1', 3128, `http://${NAME}/small`, n)));
        fromHost.push(...(await hostLatency(n)));
      }
      const proxyLat = summarize(viaProxy);
      const hostDirect = summarize(fromHost);
      const srv = await s.exec(
        'cd /tmp && echo ok > small && exec python3 -m http.server 8000 --bind 127.0.0.1',
        {
          background: true,
        },
      );
      try {
        await s.exec(
          'for i in $(seq 50); do curl -s --noproxy "*" -o /dev/null http://127.0.0.1:8000/small && exit 0; sleep 0.1; done; exit 1',
        );
        const sandboxLocal = summarize(await sandboxLatency(s, '127.0.0.1', 8000, '/small'));
        return {
          downloadMiB: DOWNLOAD_MIB,
          direct,
          hostCurl,
          ...(floor ? { relayFloor: floor } : {}),
          proxy,
          transparent,
          connect: viaConnect,
          socks5: viaSocks5,
          latency: { requests: REQUESTS, proxy: proxyLat, hostDirect, sandboxLocal },
        };
      } finally {
        await srv.kill();
      }
    } finally {
      await s.kill();
    }
  } finally {
    await airlock.close();
    relayFloor?.kill();
    server.kill();
  }
}

// ---- report ---------------------------------------------------------------------------------------

const pct = (x: number, base: number): string => `${((100 * x) / base).toFixed(0)} %`;
const verdict = (ok: boolean): string => (ok ? 'meets target' : 'MISSES target');

export function formatEgress(r: EgressReport): string {
  const base = r.direct.mibPerS;
  const row = (t: Throughput): string =>
    `| ${t.label} | ${t.mibPerS.toFixed(0)} MiB/s | ${pct(t.mibPerS, base)} | ${pct(t.mibPerS, r.hostCurl.mibPerS)} | ${t.cpuMsPerGiB === undefined ? '–' : `${t.cpuMsPerGiB.toFixed(0)} ms`} |`;
  const l = r.latency;
  const lrow = (label: string, s: Summary): string =>
    `| ${label} | ${fmt(s.p50)} | ${fmt(s.p99)} | ${fmt(s.min)} |`;
  const addedHost = l.proxy.p50 - l.hostDirect.p50;
  const addedLocal = l.proxy.p50 - l.sandboxLocal.p50;
  return [
    `Throughput: ${r.downloadMiB} MiB download, median of ${r.direct.runs.length} runs (after one warm-up), ` +
      'the paths taking turns run by run. CPU: of the Airlock process (gateway and relay worker; for the ' +
      'direct row, the Node client itself) per GiB downloaded, median.',
    '',
    '| path | throughput | vs Node direct | vs host curl | CPU per GiB |',
    '|---|---|---|---|---|',
    row(r.direct),
    row(r.hostCurl),
    ...(r.relayFloor ? [row(r.relayFloor)] : []),
    row(r.proxy),
    row(r.transparent),
    row(r.connect),
    row(r.socks5),
    '',
    `Target >= 80 % of direct: proxy ${pct(r.proxy.mibPerS, base)} (${verdict(r.proxy.mibPerS >= 0.8 * base)}), ` +
      `transparent ${pct(r.transparent.mibPerS, base)} (${verdict(r.transparent.mibPerS >= 0.8 * base)}), ` +
      `CONNECT tunnel ${pct(r.connect.mibPerS, base)} (${verdict(r.connect.mibPerS >= 0.8 * base)}), ` +
      `SOCKS5 ${pct(r.socks5.mibPerS, base)} (${verdict(r.socks5.mibPerS >= 0.8 * base)}).`,
    '(proxy and transparent are plain HTTP, vetted request by request, their Content-Length bodies moved by ' +
      'the fd relay; CONNECT and SOCKS5 are tunnels.)',
    ...(r.relayFloor
      ? [
          `Beside the same client (curl) on the host: direct ${r.hostCurl.mibPerS.toFixed(0)} MiB/s; through a ` +
            `bare relay that vets nothing (socat, 1 MiB buffers) ${r.relayFloor.mibPerS.toFixed(0)} MiB/s ` +
            `(${pct(r.relayFloor.mibPerS, r.hostCurl.mibPerS)}): a relay is a third process on the bytes' path, ` +
            `on 2 cores beside the server and the client. The proxy moves ` +
            `${pct(r.proxy.mibPerS, r.hostCurl.mibPerS)} of host curl direct, ` +
            `${(r.proxy.mibPerS / r.relayFloor.mibPerS).toFixed(2)}× the bare relay.`,
        ]
      : []),
    '',
    `Latency: ${l.requests} sequential GETs of 3 bytes, one python http.client, a new connection each.`,
    '',
    '| path | p50 | p99 | min |',
    '|---|---|---|---|',
    lrow('sandbox → proxy → test server', l.proxy),
    lrow('host → test server (no sandbox, no proxy)', l.hostDirect),
    lrow('sandbox → python http.server on its own 127.0.0.1', l.sandboxLocal),
    '',
    `Added p50 by the proxy: ${fmt(addedHost)} vs the host-direct baseline (same client, same server; ` +
      `${verdict(addedHost <= 1)} <= 1 ms), ${fmt(addedLocal)} vs the in-sandbox baseline (different server).`,
  ].join('\n');
}

// ---- entry point of the re-exec'd child -------------------------------------------------------------

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  const log = (s: string): void => void process.stderr.write(`bench: ${s}\n`);
  measure(log).then(
    (r) => process.stdout.write(`${JSON.stringify(r)}\n`),
    (e: unknown) => {
      log(`egress: ${e instanceof Error ? (e.stack ?? e.message) : String(e)}`);
      process.exitCode = 1;
    },
  );
}
