// M1: what the MCP gateway adds to a tools/call, beside its baseline measured in the same run. One
// cheap tool (the hostile fixture's `echo`), the same server program spoken to four ways:
//   direct       SDK Client + StdioClientTransport running the fixture on the host: no sandbox, no
//                gateway (the baseline)
//   cli          SDK Client on the stdio of the real `airlock mcp` CLI (a child process) running the
//                fixture in a sandbox, per-server boundary (`airlock mcp`'s default)
//   http         SDK Client + StreamableHTTPClientTransport to a gateway in this process (the test
//                harness's startGateway: HttpFront + GatewayCore), fixture in a sandbox, per-server,
//                no namespace. Client and gateway share this process's CPU and event loop.
//   http-process the same HTTP gateway as its own process (`airlock gateway --config`), so the CPU
//                columns separate the client's cost from the gateway's
// Each HTTP gateway path three times: the SDK client with Node's global fetch (the SDK's default),
// the SDK client with Airlock's gatewayFetch (src/mcp/client-fetch.ts, what the README recommends:
// on the global fetch the client spends 0.2-0.3 ms more CPU per call), and a lean client of node:http.
// And, to tell Airlock's cost from the protocol's, no Airlock at all: the SDK's Client +
// StreamableHTTPClientTransport to the SDK's own StreamableHTTPServerTransport serving an `echo` tool
// in the Server's handler (no sandbox, no stdio hop): in this process with SSE answers (the SDK
// server's default) and with JSON answers (enableJsonResponse), and in a child process (JSON answers;
// with the global fetch and with gatewayFetch).
// What the SDK client and server cost there is the floor of any Streamable HTTP path with that client.
// Latency: SEQUENTIAL calls one at a time after WARMUP, p50/p99, in interleaved rounds across the paths
// (all open at once). Throughput: N calls kept in flight on
// one session for DURATION_MS each, calls/s. CPU per call: CPU time (user + sys) each process used
// during the throughput phases, divided by the calls made: where the time goes. Targets (issue):
// <= 1 ms added p50 for a per-server boundary, >= 2,000 calls/s.
//
// The SDK clients on the global fetch give it no AbortSignal: the SDK's client transport passes one
// signal to every fetch, and undici keeps a listener on it per request until GC (a client-side leak that prints
// thousands of MaxListenersExceededWarning lines under load; the bench never aborts a call).
// gatewayFetch gets the signal: one listener per signal, removed once no call is in flight.
// AIRLOCK_MCP_BENCH_CPU_PROF=<dir> writes V8 CPU profiles of the `airlock mcp` and `airlock gateway`
// children.
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { mkdirSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { Agent as HttpAgent, request as httpRequest, type IncomingHttpHeaders } from 'node:http';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import type { CallToolResult } from '@modelcontextprotocol/sdk/types.js';
import { Airlock, gatewayFetch, type GatewayFetch } from '../src/index.js';
import { FIXTURE, ROOT, startGateway } from '../test/mcp/harness.js';
import { fmt, summarize, type Summary } from './stats.js';

const STATE_DIR = '/var/tmp/airlock-mcp-bench';
const UID_RANGE = { first: 3_820_000, count: 4096 } as const;
const TOOL = 'echo';
const ARGS = { text: 'bench' } as const;
const IN_FLIGHT = [16, 64] as const;
/** Interleaved rounds of the sequential calls of every path (see mcpBench). */
const SEQUENTIAL_ROUNDS = 5;
/**
 * Calls and durations of a full run; `--quick` uses the second set (the whole bench within 2 min).
 * The warm-up is long enough for V8 to optimise both ends of every path, as in long-lived processes:
 * after 200 calls the own-process gateway, the fixture server and the clients still run partly
 * unoptimised code (measured: direct stdio p50 0.23-0.35 ms after 200 calls, 0.06-0.14 ms after 2,000).
 */
const FULL = { warmup: 2000, sequential: 2000, durationMs: 5000 } as const;
const QUICK = { warmup: 20, sequential: 100, durationMs: 300 } as const;
let WARMUP: number = FULL.warmup;
let SEQUENTIAL: number = FULL.sequential;
let DURATION_MS: number = FULL.durationMs;
const TARGET_ADDED_P50_MS = 1;
const TARGET_CALLS_PER_S = 2000;

export interface CpuPerCall {
  /** This process: the client, and for `http` the gateway too. */
  readonly benchMs: number;
  /** The gateway's own process (`airlock mcp` / `airlock gateway`), when it has one. */
  readonly gatewayMs?: number;
  /** The MCP server: the fixture process (direct) or every process of its sandbox. */
  readonly serverMs: number;
}

export interface Throughput {
  readonly inFlight: number;
  readonly calls: number;
  readonly seconds: number;
  readonly callsPerS: number;
  /** Latency of each call while N were in flight. */
  readonly latency: Summary;
  readonly cpu: CpuPerCall;
}

export interface PathReport {
  readonly label: string;
  readonly sequential: Summary;
  readonly throughput: Throughput[];
}

export interface McpReport {
  readonly tool: string;
  readonly warmup: number;
  readonly durationMs: number;
  readonly direct: PathReport;
  readonly cli: PathReport;
  /** The SDK client with Node's global fetch (its default). */
  readonly http: PathReport;
  /** The SDK client with Airlock's gatewayFetch (what the README recommends). */
  readonly httpFetch?: PathReport;
  /** The same gateway with a lean HTTP client (no SDK client cost on these 2 shared cores). */
  readonly httpLean: PathReport;
  readonly httpProcess: PathReport;
  readonly httpProcessFetch?: PathReport;
  readonly httpProcessLean: PathReport;
  /** No Airlock: SDK client to an SDK Streamable HTTP server (the protocol's own cost). */
  readonly sdkOnly: PathReport[];
}

// ---- CPU accounting -------------------------------------------------------------------------------

const CLK_TCK = Number(spawnSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).stdout.trim()) || 100;

/** utime + stime of a process, ms (0 if it is gone). */
function processCpuMs(pid: number): number {
  try {
    // The command name (field 2) may hold spaces: count fields after its closing parenthesis.
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return ((Number(f[11]) + Number(f[12])) * 1000) / CLK_TCK;
  } catch {
    return 0;
  }
}

/** CPU ms of every process running under a uid of the bench's range (the sandboxed servers). */
function sandboxCpuMs(): number {
  let ms = 0;
  for (const p of readdirSync('/proc')) {
    if (!/^\d+$/.test(p)) continue;
    try {
      const uid = Number(/^Uid:\s+(\d+)/m.exec(readFileSync(`/proc/${p}/status`, 'utf8'))?.[1]);
      if (uid >= UID_RANGE.first && uid < UID_RANGE.first + UID_RANGE.count) ms += processCpuMs(Number(p));
    } catch {
      /* exited */
    }
  }
  return ms;
}

interface CpuProbe {
  readonly gatewayPid?: () => number | null | undefined;
  readonly server: () => number;
}

interface CpuSnapshot {
  readonly bench: number;
  readonly gateway?: number;
  readonly server: number;
}

function snapshot(probe: CpuProbe): CpuSnapshot {
  const u = process.cpuUsage();
  const pid = probe.gatewayPid?.();
  return {
    bench: (u.user + u.system) / 1000,
    ...(pid ? { gateway: processCpuMs(pid) } : {}),
    server: probe.server(),
  };
}

// ---- measurement ----------------------------------------------------------------------------------

/** What measure() needs of a client: the SDK Client, or the lean HTTP client below. */
type Caller = Pick<Client, 'callTool'>;

/**
 * A minimal MCP client over Streamable HTTP: keep-alive node:http, one POST per request, reads the
 * JSON or SSE answer. It does what the SDK client does on the wire for a call, without its
 * web-streams machinery (≈0.65 ms of CPU per call on this machine): the gateway's own cost shows.
 */
async function leanHttpClient(url: string, token: string): Promise<Caller & { close(): void }> {
  const agent = new HttpAgent({ keepAlive: true, maxSockets: 128 });
  const u = new URL(url);
  const state: { session?: string } = {};
  let nextId = 1;
  const post = (body: unknown): Promise<{ headers: IncomingHttpHeaders; text: string }> =>
    new Promise((resolve, reject) => {
      const req = httpRequest(
        {
          agent,
          host: u.hostname,
          port: u.port,
          path: u.pathname,
          method: 'POST',
          headers: {
            'content-type': 'application/json',
            accept: 'application/json, text/event-stream',
            authorization: `Bearer ${token}`,
            ...(state.session
              ? { 'mcp-session-id': state.session, 'mcp-protocol-version': '2025-06-18' }
              : {}),
          },
        },
        (res) => {
          let text = '';
          res.setEncoding('utf8');
          res.on('data', (c: string) => (text += c));
          res.on('end', () => resolve({ headers: res.headers, text }));
        },
      );
      req.on('error', reject);
      req.end(JSON.stringify(body));
    });
  const answer = (text: string, id: number): Record<string, unknown> => {
    const bodies = text.startsWith('{')
      ? [text]
      : text.split('\n').flatMap((l) => (l.startsWith('data:') ? [l.slice(5).trim()] : []));
    for (const b of bodies) {
      if (!b) continue;
      const m = JSON.parse(b) as { id?: number; result?: Record<string, unknown>; error?: unknown };
      if (m.id === id) {
        if (m.error) throw new Error(`MCP error: ${JSON.stringify(m.error)}`);
        return m.result!;
      }
    }
    throw new Error(`no answer to request ${id}: ${text.slice(0, 200)}`);
  };
  const init = await post({
    jsonrpc: '2.0',
    id: 0,
    method: 'initialize',
    params: {
      protocolVersion: '2025-06-18',
      capabilities: {},
      clientInfo: { name: 'bench-lean', version: '1' },
    },
  });
  answer(init.text, 0);
  state.session = String(init.headers['mcp-session-id']);
  await post({ jsonrpc: '2.0', method: 'notifications/initialized' });
  return {
    callTool: (async (params: { name: string; arguments?: Record<string, unknown> }) => {
      const id = nextId++;
      const r = await post({ jsonrpc: '2.0', id, method: 'tools/call', params });
      return answer(r.text, id);
    }) as Caller['callTool'],
    close: () => agent.destroy(),
  };
}

async function callOnce(client: Caller): Promise<void> {
  const r = (await client.callTool({ name: TOOL, arguments: ARGS })) as CallToolResult;
  if (r.isError) throw new Error(`${TOOL} failed: ${JSON.stringify(r.content).slice(0, 300)}`);
}

/** The first call's answer is checked, then WARMUP calls. */
async function warm(label: string, client: Caller): Promise<void> {
  const first = (await client.callTool({ name: TOOL, arguments: ARGS })) as CallToolResult;
  const text = first.content.map((c) => (c.type === 'text' ? c.text : '')).join('');
  if (!text.includes(ARGS.text)) throw new Error(`${label}: ${TOOL} returned ${JSON.stringify(first)}`);
  for (let i = 0; i < WARMUP; i++) await callOnce(client);
}

/** `n` calls one at a time: the latency of each (ms). */
async function sequentialCalls(client: Caller, n: number): Promise<number[]> {
  const out: number[] = [];
  for (let i = 0; i < n; i++) {
    const t0 = performance.now();
    await callOnce(client);
    out.push(performance.now() - t0);
  }
  return out;
}

/** N calls kept in flight for DURATION_MS, for each N of IN_FLIGHT. */
async function throughputOf(
  label: string,
  client: Caller,
  probe: CpuProbe,
  log: (s: string) => void,
): Promise<Throughput[]> {
  const throughput: Throughput[] = [];
  for (const n of IN_FLIGHT) {
    log(`mcp: ${label}: ${n} in flight for ${DURATION_MS / 1000} s`);
    const lat: number[] = [];
    const cpu0 = snapshot(probe);
    const start = performance.now();
    const deadline = start + DURATION_MS;
    await Promise.all(
      Array.from({ length: n }, async () => {
        while (performance.now() < deadline) {
          const t0 = performance.now();
          await callOnce(client);
          lat.push(performance.now() - t0);
        }
      }),
    );
    const seconds = (performance.now() - start) / 1000;
    const cpu1 = snapshot(probe);
    const per = (a: number, b: number): number => (b - a) / lat.length;
    throughput.push({
      inFlight: n,
      calls: lat.length,
      seconds,
      callsPerS: lat.length / seconds,
      latency: summarize(lat),
      cpu: {
        benchMs: per(cpu0.bench, cpu1.bench),
        ...(cpu0.gateway !== undefined && cpu1.gateway !== undefined
          ? { gatewayMs: per(cpu0.gateway, cpu1.gateway) }
          : {}),
        serverMs: per(cpu0.server, cpu1.server),
      },
    });
  }
  return throughput;
}

/** `f` once: later calls get the first call's promise. */
function once(f: () => unknown): () => Promise<void> {
  let p: Promise<void> | undefined;
  return () =>
    (p ??= Promise.resolve()
      .then(f)
      .then(() => {}));
}

// ---- the four paths -------------------------------------------------------------------------------

const baseEnv = (): Record<string, string> => ({
  PATH: process.env.PATH ?? '/usr/bin:/bin',
  HOME: process.env.HOME ?? '/root',
});
const airlockEnv = (): Record<string, string> => ({
  ...baseEnv(),
  AIRLOCK_STATE_DIR: STATE_DIR,
  AIRLOCK_UID_RANGE: `${UID_RANGE.first}:${UID_RANGE.count}`,
});
const profFlags = (): string[] => {
  const dir = process.env.AIRLOCK_MCP_BENCH_CPU_PROF;
  return dir ? ['--cpu-prof', '--cpu-prof-dir', dir] : [];
};
const cli = (args: string[]): string[] => [
  ...profFlags(),
  '--import',
  'tsx',
  `${ROOT}/src/cli/main.ts`,
  ...args,
];

/** A connected stdio client, the pid of the process it launched, and that process's stderr tail. */
async function openStdioClient(
  command: string,
  args: string[],
  env: Record<string, string>,
): Promise<{ client: Client; pid: () => number | null; close: () => Promise<void> }> {
  const transport = new StdioClientTransport({ command, args, cwd: ROOT, env, stderr: 'pipe' });
  let tail = '';
  transport.stderr?.on('data', (b: Buffer) => (tail = (tail + b.toString()).slice(-4000)));
  const client = new Client({ name: 'bench', version: '1' });
  try {
    await client.connect(transport);
  } catch (e) {
    await client.close();
    throw new Error(`${(e as Error).message}\n--- stderr of ${args.join(' ')}:\n${tail}`, { cause: e });
  }
  return { client, pid: () => transport.pid, close: () => client.close() };
}

/**
 * The SDK's client over its Streamable HTTP transport, with Node's global fetch (the SDK's default),
 * or with `f` (Airlock's gatewayFetch, which the README recommends for the gateway).
 */
async function httpClient(url: string, token: string, f?: GatewayFetch): Promise<Client> {
  const client = new Client({ name: 'bench', version: '1' });
  await client.connect(
    new StreamableHTTPClientTransport(new URL(url), {
      requestInit: { headers: { authorization: `Bearer ${token}` } },
      fetch: f ?? ((input, init) => fetch(input, { ...init, signal: null })),
    }),
  );
  return client;
}

/** httpClient() with a gatewayFetch of its own, closed with it. */
async function httpClientGatewayFetch(
  url: string,
  token: string,
): Promise<{ client: Client; close(): Promise<void> }> {
  const f = gatewayFetch();
  const client = await httpClient(url, token, f);
  return {
    client,
    close: async () => {
      await client.close();
      f.close();
    },
  };
}

/**
 * The SDK's own Streamable HTTP server (stateful sessions, like the gateway) serving `echo` from the
 * low-level Server's tools/call handler. Runs in this process (`inline`) or as a child process (the
 * same source through `node --input-type=module`); prints its URL.
 */
const sdkServerSource = (): string => `
import { createServer } from 'node:http';
import { randomUUID } from 'node:crypto';
import { Server } from '${import.meta.resolve('@modelcontextprotocol/sdk/server/index.js')}';
import { StreamableHTTPServerTransport } from '${import.meta.resolve('@modelcontextprotocol/sdk/server/streamableHttp.js')}';
import { CallToolRequestSchema, ListToolsRequestSchema } from '${import.meta.resolve('@modelcontextprotocol/sdk/types.js')}';
export async function serve(json) {
  const sessions = new Map();
  const http = createServer(async (req, res) => {
    const chunks = [];
    for await (const c of req) chunks.push(c);
    const body = chunks.length ? JSON.parse(Buffer.concat(chunks).toString('utf8')) : undefined;
    const sid = req.headers['mcp-session-id'];
    if (sid) return sessions.get(sid).handleRequest(req, res, body);
    const t = new StreamableHTTPServerTransport({
      sessionIdGenerator: () => randomUUID(),
      enableJsonResponse: json,
      onsessioninitialized: (id) => sessions.set(id, t),
    });
    const s = new Server({ name: 'sdk-only', version: '1' }, { capabilities: { tools: {} } });
    s.setRequestHandler(ListToolsRequestSchema, async () => ({
      tools: [{ name: 'echo', inputSchema: { type: 'object', properties: { text: { type: 'string' } } } }],
    }));
    s.setRequestHandler(CallToolRequestSchema, async (r) => ({
      content: [{ type: 'text', text: String(r.params.arguments?.text ?? '') }],
    }));
    await s.connect(t);
    await t.handleRequest(req, res, body);
  });
  await new Promise((r) => http.listen(0, '127.0.0.1', r));
  return { url: 'http://127.0.0.1:' + http.address().port + '/mcp', close: () => { http.closeAllConnections(); http.close(); } };
}
if (process.argv[2] === 'serve') serve(true).then((s) => process.stdout.write(s.url + '\\n'));
`;

/** The SDK-only server as a file (its imports are absolute file URLs into this repository's SDK). */
function sdkServerFile(): string {
  const dir = `${STATE_DIR}/sdk-only`;
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  const file = `${dir}/server.mjs`;
  writeFileSync(file, sdkServerSource(), { mode: 0o600 });
  return file;
}

async function sdkServerInline(json: boolean): Promise<{ url: string; close(): void }> {
  const mod = (await import(sdkServerFile())) as {
    serve(json: boolean): Promise<{ url: string; close(): void }>;
  };
  return mod.serve(json);
}

async function sdkServerProcess(): Promise<{ child: ChildProcess; url: string }> {
  const child = spawn(process.execPath, [sdkServerFile(), 'serve'], {
    cwd: ROOT,
    env: baseEnv(),
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  const url = await new Promise<string>((resolve, reject) => {
    let out = '';
    child.stdout!.setEncoding('utf8').on('data', (t: string) => {
      out += t;
      if (out.includes('\n')) resolve(out.trim());
    });
    child.once('exit', (code) => reject(new Error(`SDK-only server exited ${code}`)));
  });
  return { child, url };
}

/** `airlock gateway --config` as a child process; resolves once it prints its URL. */
async function startGatewayProcess(
  command: string[],
): Promise<{ child: ChildProcess; url: string; token: string; tail: () => string }> {
  const dir = `${STATE_DIR}/bench-gateway`;
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  const token = randomBytes(32).toString('hex');
  const config = `${dir}/gateway.json`;
  writeFileSync(
    config,
    JSON.stringify({
      mcpServers: {
        bench: {
          command: command[0],
          args: command.slice(1),
          airlock: { boundary: 'per-server', namespace: false },
        },
      },
      airlock: {
        tenants: [{ name: 'bench', tokenEnv: 'AIRLOCK_BENCH_TOKEN' }],
        lockfile: `${dir}/no-lockfile.json`,
      },
    }),
    { mode: 0o600 },
  );
  const child = spawn(process.execPath, cli(['gateway', '--config', config, '--listen', '127.0.0.1:0']), {
    cwd: ROOT,
    env: { ...airlockEnv(), AIRLOCK_BENCH_TOKEN: token },
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  let err = '';
  const url = await new Promise<string>((resolve, reject) => {
    child.stderr!.setEncoding('utf8').on('data', (t: string) => {
      err = (err + t).slice(-8000);
      const m = / at (http:\/\/\S+\/mcp) /.exec(err);
      if (m) resolve(m[1]!);
    });
    child.once('exit', (code) => reject(new Error(`airlock gateway exited ${code}: ${err}`)));
  });
  return { child, url, token, tail: () => err };
}

async function stopChild(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise((r) => child.once('exit', r));
  child.kill('SIGTERM');
  await exited;
}

export async function mcpBench(opts: { log: (s: string) => void; quick?: boolean }): Promise<McpReport> {
  const { log } = opts;
  const sizes = opts.quick ? QUICK : FULL;
  WARMUP = sizes.warmup;
  SEQUENTIAL = sizes.sequential;
  DURATION_MS = sizes.durationMs;
  if (process.getuid?.() !== 0) throw new Error('the mcp benchmark needs root (sandboxes)');
  const server = FIXTURE('hostile-server.ts');
  const [node, ...fixtureArgs] = server;

  // Every path is opened first and stays open, so that their sequential calls can be measured in
  // interleaved rounds (as P1's): a host whose speed drifts within the run (this VM's does, by ±20 %
  // within minutes) then moves every path alike, and "added to direct" compares like with like.
  const paths: Array<{ label: string; client: Caller; probe: CpuProbe }> = [];
  const closers: Array<() => Promise<void>> = [];
  const close = (f: () => unknown): number => closers.push(once(f));
  /** Paths that share what they opened (closers[from, to)), closed once their throughput is measured. */
  const groups: Array<{ paths: number; from: number; to: number }> = [];
  let mark = { paths: 0, from: 0 };
  const group = (): void => {
    groups.push({ paths: paths.length - mark.paths, from: mark.from, to: closers.length });
    mark = { paths: paths.length, from: closers.length };
  };
  let gatewayTail = (): string => '';
  const seq = new Map<string, number[]>();
  const reports = new Map<string, PathReport>();
  try {
    log('mcp: opening every path');
    // No Airlock: the fixture over stdio (the baseline), then the SDK's own client and server.
    const direct = await openStdioClient(node!, fixtureArgs, baseEnv());
    close(direct.close);
    paths.push({
      label: 'direct stdio (baseline)',
      client: direct.client,
      probe: { server: () => processCpuMs(direct.pid() ?? 0) },
    });
    group();
    for (const json of [false, true]) {
      const srv = await sdkServerInline(json);
      close(() => srv.close());
      const c = await httpClient(srv.url, 'none');
      close(() => c.close());
      paths.push({
        label: `SDK only (no Airlock), in-process, ${json ? 'JSON' : 'SSE'} answers`,
        client: c,
        probe: { server: () => 0 },
      });
      group();
    }
    const sdkProc = await sdkServerProcess();
    close(() => stopChild(sdkProc.child));
    const sdkProcClient = await httpClient(sdkProc.url, 'none');
    close(() => sdkProcClient.close());
    paths.push({
      label: 'SDK only (no Airlock), own process, JSON answers',
      client: sdkProcClient,
      probe: { gatewayPid: () => sdkProc.child.pid, server: () => 0 },
    });
    const sdkProcFetch = await httpClientGatewayFetch(sdkProc.url, 'none');
    close(sdkProcFetch.close);
    paths.push({
      label: 'SDK only (no Airlock), own process, JSON answers, gatewayFetch',
      client: sdkProcFetch.client,
      probe: { gatewayPid: () => sdkProc.child.pid, server: () => 0 },
    });
    group();
    // `airlock mcp`: a child process; per-server boundary.
    const viaCli = await openStdioClient(
      process.execPath,
      cli(['mcp', '--lockfile', `${STATE_DIR}/no-lockfile/airlock.lock.json`, '--', ...server]),
      airlockEnv(),
    );
    close(viaCli.close);
    paths.push({
      label: 'airlock mcp (stdio)',
      client: viaCli.client,
      probe: { gatewayPid: viaCli.pid, server: sandboxCpuMs },
    });
    group();
    // The HTTP gateway in this process; per-server boundary.
    const airlock = new Airlock({ stateDir: STATE_DIR, uidRange: UID_RANGE });
    close(() => airlock.close());
    const gw = await startGateway(airlock, {
      bench: { command: node, args: fixtureArgs, airlock: { boundary: 'per-server', namespace: false } },
    });
    close(() => gw.close());
    const gwSdk = await httpClient(gw.url, gw.tokens.alice!);
    close(() => gwSdk.close());
    paths.push({ label: 'HTTP gateway, in-process', client: gwSdk, probe: { server: sandboxCpuMs } });
    const gwFetch = await httpClientGatewayFetch(gw.url, gw.tokens.alice!);
    close(gwFetch.close);
    paths.push({
      label: 'HTTP gateway, in-process, gatewayFetch',
      client: gwFetch.client,
      probe: { server: sandboxCpuMs },
    });
    const gwLean = await leanHttpClient(gw.url, gw.tokens.alice!);
    close(() => gwLean.close());
    paths.push({
      label: 'HTTP gateway, in-process, lean client',
      client: gwLean,
      probe: { server: sandboxCpuMs },
    });
    group();
    // `airlock gateway`: HTTP, its own process; per-server boundary.
    const gp = await startGatewayProcess(server);
    gatewayTail = gp.tail;
    close(() => stopChild(gp.child));
    const gpProbe: CpuProbe = { gatewayPid: () => gp.child.pid, server: sandboxCpuMs };
    const gpSdk = await httpClient(gp.url, gp.token);
    close(() => gpSdk.close());
    paths.push({ label: 'HTTP gateway, own process', client: gpSdk, probe: gpProbe });
    const gpFetch = await httpClientGatewayFetch(gp.url, gp.token);
    close(gpFetch.close);
    paths.push({ label: 'HTTP gateway, own process, gatewayFetch', client: gpFetch.client, probe: gpProbe });
    const gpLean = await leanHttpClient(gp.url, gp.token);
    close(() => gpLean.close());
    paths.push({ label: 'HTTP gateway, own process, lean client', client: gpLean, probe: gpProbe });
    group();

    for (const p of paths) {
      log(`mcp: ${p.label}: ${WARMUP} warm-up calls`);
      await warm(p.label, p.client);
      seq.set(p.label, []);
    }
    const rounds = SEQUENTIAL >= 500 ? SEQUENTIAL_ROUNDS : 1;
    for (let r = 0; r < rounds; r++) {
      log(`mcp: sequential calls, round ${r + 1}/${rounds}: ${paths.length} paths ×${SEQUENTIAL / rounds}`);
      for (const p of paths)
        seq.get(p.label)!.push(...(await sequentialCalls(p.client, SEQUENTIAL / rounds)));
    }
    // Throughput, one path at a time; each group's resources are closed once its paths are done, so
    // that no later path shares this process with clients and servers it does not use.
    let at = 0;
    for (const g of groups) {
      for (const p of paths.slice(at, at + g.paths)) {
        const report: PathReport = {
          label: p.label,
          sequential: summarize(seq.get(p.label)!),
          throughput: await throughputOf(p.label, p.client, p.probe, log),
        };
        reports.set(p.label, report);
        log(
          `mcp: ${p.label}: p50 ${fmt(report.sequential.p50)}, ` +
            report.throughput.map((t) => `${t.callsPerS.toFixed(0)} calls/s @${t.inFlight}`).join(', '),
        );
      }
      at += g.paths;
      for (const c of closers.slice(g.from, g.to).reverse()) await c().catch(() => {});
    }
  } catch (e) {
    const tail = gatewayTail();
    throw tail
      ? new Error(`${(e as Error).message}\n--- stderr of airlock gateway:\n${tail}`, { cause: e })
      : e;
  } finally {
    for (const close of closers.reverse())
      await Promise.resolve()
        .then(close)
        .catch(() => {});
  }
  const get = (label: string): PathReport => reports.get(label)!;
  return {
    tool: TOOL,
    warmup: WARMUP,
    durationMs: DURATION_MS,
    direct: get('direct stdio (baseline)'),
    cli: get('airlock mcp (stdio)'),
    http: get('HTTP gateway, in-process'),
    httpFetch: get('HTTP gateway, in-process, gatewayFetch'),
    httpLean: get('HTTP gateway, in-process, lean client'),
    httpProcess: get('HTTP gateway, own process'),
    httpProcessFetch: get('HTTP gateway, own process, gatewayFetch'),
    httpProcessLean: get('HTTP gateway, own process, lean client'),
    sdkOnly: [
      get('SDK only (no Airlock), in-process, SSE answers'),
      get('SDK only (no Airlock), in-process, JSON answers'),
      get('SDK only (no Airlock), own process, JSON answers'),
      get('SDK only (no Airlock), own process, JSON answers, gatewayFetch'),
    ],
  };
}

// ---- report ---------------------------------------------------------------------------------------

const verdict = (ok: boolean): string => (ok ? 'meets target' : 'MISSES target');
const ratio = (x: number, base: number): string => `${(x / base).toFixed(2)}×`;
const added = (x: number, base: number): string => `${x - base >= 0 ? '+' : ''}${(x - base).toFixed(2)} ms`;
const ms3 = (x: number | undefined): string => (x === undefined ? '—' : x.toFixed(3));

/** Every path through Airlock, in report order (a report from before gatewayFetch has fewer). */
export function airlockPaths(r: McpReport): PathReport[] {
  return [
    r.cli,
    r.http,
    r.httpFetch,
    r.httpLean,
    r.httpProcess,
    r.httpProcessFetch,
    r.httpProcessLean,
  ].filter((p): p is PathReport => p !== undefined);
}

export function formatMcp(r: McpReport): string {
  const base = r.direct;
  const paths = [r.direct, ...(r.sdkOnly ?? []), ...airlockPaths(r)];
  const seqRow = (p: PathReport): string => {
    const s = p.sequential;
    const b = base.sequential;
    return p === base
      ? `| ${p.label} | ${fmt(s.p50)} | ${fmt(s.p99)} | ${fmt(s.mean)} | — | — | — |`
      : `| ${p.label} | ${fmt(s.p50)} | ${fmt(s.p99)} | ${fmt(s.mean)} | ${added(s.p50, b.p50)} | ` +
          `${added(s.p99, b.p99)} | ${ratio(s.p50, b.p50)} |`;
  };
  const tputRow = (p: PathReport): string =>
    `| ${p.label} | ` +
    p.throughput
      .map((t, k) => {
        const b = base.throughput[k]!;
        const rel = p === base ? '' : ` (${ratio(t.callsPerS, b.callsPerS)})`;
        return `${t.callsPerS.toFixed(0)}${rel} | ${fmt(t.latency.p50)} / ${fmt(t.latency.p99)}`;
      })
      .join(' | ') +
    ' |';
  const cpuRow = (p: PathReport): string => {
    const t = p.throughput[p.throughput.length - 1]!;
    const total = t.cpu.benchMs + (t.cpu.gatewayMs ?? 0) + t.cpu.serverMs;
    return `| ${p.label} | ${ms3(t.cpu.benchMs)} | ${ms3(t.cpu.gatewayMs)} | ${ms3(t.cpu.serverMs)} | ${ms3(total)} |`;
  };
  const head = IN_FLIGHT.map((n) => `calls/s @${n} (vs direct) | p50 / p99 @${n}`).join(' | ');
  const lastN = IN_FLIGHT[IN_FLIGHT.length - 1];
  const lines = [
    `Tool \`${r.tool}\` of the hostile fixture; ${base.sequential.n} sequential calls after ${r.warmup} ` +
      `warm-up calls; throughput with N calls in flight on one session for ${r.durationMs / 1000} s each.`,
    '',
    '| path | p50 | p99 | mean | added p50 | added p99 | p50 ratio |',
    '|---|---|---|---|---|---|---|',
    ...paths.map(seqRow),
    '',
    `| path | ${head} |`,
    `|---|${IN_FLIGHT.map(() => '---|---|').join('')}`,
    ...paths.map(tputRow),
    '',
    `CPU ms per call (user + sys) during the @${lastN} phase, by process (in-process: the bench ` +
      'process runs the client and the gateway):',
    '',
    '| path | bench process (client) | gateway process | MCP server | total |',
    '|---|---|---|---|---|',
    ...paths.map(cpuRow),
    '',
  ];
  const sdkIn = r.sdkOnly?.find((p) => p.label.includes('in-process, JSON'));
  const sdkOwn = r.sdkOnly?.find((p) => p.label === 'SDK only (no Airlock), own process, JSON answers');
  const sdkOwnFetch = r.sdkOnly?.find((p) => p.label.endsWith('own process, JSON answers, gatewayFetch'));
  if (sdkIn && sdkOwn) {
    lines.push(
      'What Airlock adds over the SDK alone (same SDK client, same JSON answers; the SDK-only server ' +
        'answers from its handler, Airlock forwards to a sandboxed server over stdio):',
      '',
      '| path | vs | added p50 | calls/s @16 | calls/s @64 |',
      '|---|---|---|---|---|',
      ...(
        [
          [r.http, sdkIn],
          [r.httpProcess, sdkOwn],
          ...(r.httpProcessFetch && sdkOwnFetch ? [[r.httpProcessFetch, sdkOwnFetch] as const] : []),
        ] as const
      ).map(
        ([p, b]) =>
          `| ${p.label} | ${b.label} | ${added(p.sequential.p50, b.sequential.p50)} | ` +
          p.throughput
            .map((t, k) => `${t.callsPerS.toFixed(0)} (${ratio(t.callsPerS, b.throughput[k]!.callsPerS)})`)
            .join(' | ') +
          ' |',
      ),
      '',
    );
  }
  for (const p of airlockPaths(r)) {
    const add = p.sequential.p50 - base.sequential.p50;
    const best = Math.max(...p.throughput.map((t) => t.callsPerS));
    lines.push(
      `${p.label}: added p50 ${fmt(add)} (${verdict(add <= TARGET_ADDED_P50_MS)} <= ${TARGET_ADDED_P50_MS} ms); ` +
        `best throughput ${best.toFixed(0)} calls/s (${verdict(best >= TARGET_CALLS_PER_S)} >= ${TARGET_CALLS_PER_S}).`,
    );
  }
  return lines.join('\n');
}
