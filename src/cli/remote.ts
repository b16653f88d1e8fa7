// The CLI against a server (`airlock serve`): ps, create, exec ID -- CMD, logs ID PID, kill ID, cp.
// These commands act on sandboxes that outlive the CLI process, so they need a server: AIRLOCK_API_URL
// or --api URL (the API key only from AIRLOCK_API_KEY: never on the command line, where `ps` shows it).
import { createReadStream, createWriteStream, statSync } from 'node:fs';
import { Readable, Writable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { StringDecoder } from 'node:string_decoder';
import { constants } from 'node:os';
import { AirlockError } from '../core/errors.js';
import { parseBytes, parseDurationMs } from '../core/units.js';
import type { CreateRequest, ExecEvent, ExecRequest } from '../server/contract.js';
import { RemoteAirlock } from '../server/remote/airlock.js';
import type { Io } from './defaults.js';
import { commandFromArgs, parseEnvPairs } from './flags.js';
import { table } from './table.js';

export interface ApiFlags {
  readonly api?: string;
}

/** The server the command talks to, or a typed error saying how to name one. */
export function serverFor(flags: ApiFlags, what: string): RemoteAirlock {
  const apiUrl = flags.api ?? (process.env.AIRLOCK_API_URL || undefined);
  if (apiUrl === undefined) {
    throw new AirlockError(
      'INVALID_ARGUMENT',
      `${what} needs a server: its sandboxes outlive this process. Set AIRLOCK_API_URL or pass --api URL ` +
        '(start one with "airlock serve"); to run one command in a local sandbox use "airlock run"',
      { field: '--api' },
    );
  }
  const apiKey = process.env.AIRLOCK_API_KEY || undefined;
  return new RemoteAirlock({ apiUrl, ...(apiKey ? { apiKey } : {}) });
}

export async function psCommand(
  flags: ApiFlags & { json?: boolean; metadata: string[] },
  io: Io,
): Promise<number> {
  const remote = serverFor(flags, 'airlock ps');
  const metadata = parseEnvLike(flags.metadata, '--metadata');
  const views = await remote.query(Object.keys(metadata).length ? { metadata } : {});
  if (flags.json) {
    io.out(`${JSON.stringify(views, null, 2)}\n`);
    return 0;
  }
  const rows = [['ID', 'STATE', 'BACKEND', 'TEMPLATE', 'EXPIRES', 'METADATA']];
  for (const v of views) {
    rows.push([
      v.id,
      v.state,
      v.backend,
      v.template ?? '-',
      v.expiresAt ?? '-',
      Object.entries(v.metadata)
        .map(([k, x]) => `${k}=${x}`)
        .join(',') || '-',
    ]);
  }
  io.out(table(rows));
  return 0;
}

export interface CreateFlags extends ApiFlags {
  backend?: 'namespaces' | 'gvisor';
  template?: string;
  ttl?: string;
  memory?: string;
  cpus?: string;
  pids?: string;
  disk?: string;
  env: string[];
  metadata: string[];
  json?: boolean;
}

export async function createCommand(flags: CreateFlags, io: Io): Promise<number> {
  const remote = serverFor(flags, 'airlock create');
  const limits = {
    ...(flags.memory ? { memoryBytes: parseBytes(flags.memory) } : {}),
    ...(flags.cpus ? { cpus: Number(flags.cpus) } : {}),
    ...(flags.pids ? { pids: Number(flags.pids) } : {}),
    ...(flags.disk ? { diskBytes: parseBytes(flags.disk) } : {}),
  };
  const env = parseEnvPairs(flags.env);
  const metadata = parseEnvLike(flags.metadata, '--metadata');
  const req: CreateRequest = {
    ...(flags.backend ? { backend: flags.backend } : {}),
    ...(flags.template ? { template: flags.template } : {}),
    ...(flags.ttl ? { ttlMs: parseDurationMs(flags.ttl) } : {}),
    ...(Object.keys(limits).length ? { limits } : {}),
    ...(Object.keys(env).length ? { env } : {}),
    ...(Object.keys(metadata).length ? { metadata } : {}),
  };
  const view = await remote.api.create(req, remote.caller);
  io.out(flags.json ? `${JSON.stringify(view, null, 2)}\n` : `${view.id}\n`);
  return 0;
}

export async function killCommand(ids: string[], flags: ApiFlags): Promise<number> {
  const remote = serverFor(flags, 'airlock kill');
  for (const id of ids) await remote.api.kill(id, remote.caller);
  return 0;
}

export interface ExecFlags extends ApiFlags {
  env: string[];
  cwd?: string;
  timeout?: string;
  stdin?: boolean;
  background?: boolean;
}

/**
 * Runs CMD in sandbox ID, streaming its output; resolves to its exit status (128 + signal number if
 * a signal ended it). With --background, prints the process id (for `airlock logs`) and returns 0.
 */
export async function execCommand(
  id: string,
  args: string[],
  flags: ExecFlags,
  io: Io,
  signal?: AbortSignal,
): Promise<number> {
  const remote = serverFor(flags, 'airlock exec');
  // Options end at ID (passThroughOptions), so a "--" after it arrives as an argument: drop it.
  if (args[0] === '--') args = args.slice(1);
  if (args.length === 0) {
    throw new AirlockError(
      'INVALID_ARGUMENT',
      'exec needs a command after the sandbox id: airlock exec ID -- CMD',
      {
        field: 'CMD',
      },
    );
  }
  const env = parseEnvPairs(flags.env);
  const req: ExecRequest = {
    cmd: commandFromArgs(args),
    ...(flags.cwd ? { cwd: flags.cwd } : {}),
    ...(Object.keys(env).length ? { env } : {}),
    ...(flags.timeout ? { timeoutMs: parseDurationMs(flags.timeout) } : {}),
  };
  const { api, caller } = remote;
  if (flags.background) {
    const p = await api.startProcess(id, req, caller);
    await api.closeStdin(id, p.pid, caller).catch(() => {});
    io.out(`${p.pid}\n`);
    return 0;
  }
  if (!flags.stdin) return streamEvents(api.exec(id, req, caller, signal), io, signal);
  // stdin forwarded: a process whose input is sent as it is read.
  const p = await api.startProcess(id, req, caller);
  const onAbort = (): void => void api.killProcess(id, p.pid, caller).catch(() => {});
  signal?.addEventListener('abort', onAbort, { once: true });
  const feed = (async () => {
    try {
      for await (const chunk of process.stdin as AsyncIterable<Buffer>)
        await api.sendStdin(id, p.pid, chunk, caller);
      await api.closeStdin(id, p.pid, caller);
    } catch {
      /* the process exited: its status says why */
    }
  })();
  try {
    return await streamEvents(api.connectProcess(id, p.pid, caller), io);
  } finally {
    signal?.removeEventListener('abort', onAbort);
    process.stdin.pause();
    void feed;
  }
}

/** Output of background process PID (what it printed so far, then live) until it exits; its status. */
export async function logsCommand(
  id: string,
  pid: string,
  flags: ApiFlags,
  io: Io,
  signal?: AbortSignal,
): Promise<number> {
  const remote = serverFor(flags, 'airlock logs');
  return streamEvents(remote.api.connectProcess(id, pid, remote.caller, signal), io, signal);
}

/** Writes stdout/stderr events as they come; the exit status of the `exit` event. */
async function streamEvents(events: AsyncIterable<ExecEvent>, io: Io, signal?: AbortSignal): Promise<number> {
  const dec = { stdout: new StringDecoder('utf8'), stderr: new StringDecoder('utf8') };
  const write = { stdout: (t: string) => io.out(t), stderr: (t: string) => io.err(t) };
  try {
    for await (const e of events) {
      if (e.type === 'stdout' || e.type === 'stderr') {
        const t = dec[e.type].write(Buffer.from(e.data, 'base64'));
        if (t) write[e.type](t);
      } else if (e.type === 'exit') {
        flush();
        if (e.killedBy && e.killedBy !== 'killed') io.err(`airlock: killed by ${e.killedBy}\n`);
        if (e.exitCode !== null) return e.exitCode;
        const n = e.signal ? (constants.signals as Record<string, number>)[e.signal] : undefined;
        return 128 + (n ?? constants.signals.SIGKILL);
      } else if (e.type === 'error') {
        throw new AirlockError(e.code as never, e.message);
      }
    }
  } catch (e) {
    if (signal?.aborted) return 130;
    throw e;
  }
  flush();
  if (signal?.aborted) return 130;
  throw new AirlockError('INTERNAL', 'the server ended the stream without an exit status');

  function flush(): void {
    const o = dec.stdout.end();
    if (o) io.out(o);
    const r = dec.stderr.end();
    if (r) io.err(r);
  }
}

/** `ID:/path` names a path in a sandbox; anything else is a local path ("-": stdin or stdout). */
function parseCpArg(arg: string): { id: string; path: string } | { local: string } {
  const m = /^([A-Za-z0-9_-]+):(.*)$/.exec(arg);
  if (m && m[2] !== '') return { id: m[1]!, path: m[2]! };
  return { local: arg };
}

/** Copies one file between this machine and a sandbox (either way; streamed, binary-safe). */
export async function cpCommand(
  src: string,
  dst: string,
  flags: ApiFlags,
  io: Io,
  stdout: Writable,
): Promise<number> {
  const remote = serverFor(flags, 'airlock cp');
  const from = parseCpArg(src);
  const to = parseCpArg(dst);
  const { api, caller } = remote;
  if ('id' in from && 'local' in to) {
    const body = await api.readFile(from.id, from.path, caller);
    const sink = to.local === '-' ? stdout : createWriteStream(to.local);
    await pipeline(Readable.fromWeb(body as Parameters<typeof Readable.fromWeb>[0]), sink, {
      end: to.local !== '-',
    });
    return 0;
  }
  if ('local' in from && 'id' in to) {
    if (from.local !== '-' && !statSync(from.local, { throwIfNoEntry: false })?.isFile()) {
      throw new AirlockError('FILE_NOT_FOUND', `cp: ${from.local} is not a file on this machine`, {
        field: 'SRC',
      });
    }
    const source = from.local === '-' ? process.stdin : createReadStream(from.local);
    const entry = await api.writeFile(
      to.id,
      to.path,
      Readable.toWeb(source) as ReadableStream<Uint8Array>,
      caller,
    );
    io.err(`${entry.path}: ${entry.size} bytes\n`);
    return 0;
  }
  throw new AirlockError(
    'INVALID_ARGUMENT',
    'cp copies between this machine and a sandbox: one of SRC and DST is ID:/path, the other a local path or "-"',
    { field: 'SRC' },
  );
}

/** NAME=VALUE pairs (metadata keys are free-form, unlike env names). */
function parseEnvLike(pairs: readonly string[], flag: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const p of pairs) {
    const i = p.indexOf('=');
    if (i <= 0)
      throw new AirlockError('INVALID_ARGUMENT', `${flag} takes KEY=VALUE (got "${p}")`, { field: flag });
    out[p.slice(0, i)] = p.slice(i + 1);
  }
  return out;
}
