// The AI SDK 7 sandbox provider: `Experimental_SandboxSession` (the `ai` package) over an Airlock
// sandbox, local (the library's Sandbox) or remote (the remote SDK's RemoteSandbox): run, spawn, the
// file reads and writes, stat, listDirectory, deleteFile, and beyond the interface getPortUrl,
// setNetworkPolicy and stop. Only types come from `ai` (import type): the package works without it.
//
// Paths: relative ones resolve against /workspace, the directory commands start in (the interface's
// "base directory"); absolute ones are used as they are. Every operation runs inside the sandbox
// through its exec or file API, so what the session can touch is exactly what the sandbox can.
import { Readable, Writable } from 'node:stream';
import type {
  Experimental_SandboxDirectoryEntry as SandboxDirectoryEntry,
  Experimental_SandboxFileStat as SandboxFileStat,
  Experimental_SandboxProcess as SandboxProcessHandle,
  Experimental_SandboxSession as SandboxSession,
} from 'ai';
import { AirlockError } from '../../core/errors.js';
import type { NetworkPolicyInput } from '../../core/network-spec.js';
import type { SandboxSpecInput } from '../../core/spec.js';
import type { PortableSandbox } from '../../sandbox/portable.js';
import type { SandboxProcess } from '../../sandbox/sandbox.js';
import { PortForwards, type PortConnector } from './ports.js';

/** The directory commands start in and relative paths resolve against. */
export const SESSION_BASE_DIR = '/workspace';
/** Output of one `run` kept per stream (the rest is cut; a session is for agents, not bulk data). */
const RUN_MAX_OUTPUT_BYTES = 8 * 1024 * 1024;
/** The largest file a read returns (larger: FILE_TOO_LARGE). */
const MAX_READ_BYTES = 256 * 1024 * 1024;

/** A runtime that creates sandboxes: the library's Airlock or the remote SDK's RemoteAirlock. */
export interface SessionRuntime {
  create(spec?: SandboxSpecInput): Promise<PortableSandbox>;
  /** A remote runtime's API (RemoteAirlock.api): its port route carries getPortUrl's connections. */
  readonly api?: {
    connectPort?(
      id: string,
      port: number,
      caller: { tenant: string },
      signal?: AbortSignal,
    ): Promise<import('node:stream').Duplex>;
  };
  readonly caller?: { tenant: string };
}

/** Options of `airlockSandboxSession`. */
export interface AirlockSessionOptions {
  /**
   * The runtime the sandbox belongs to. Needed for getPortUrl on a remote sandbox (its connections
   * go through the server's port route); a local sandbox connects by itself.
   */
  readonly airlock?: SessionRuntime;
  /** Ports the agent is told about in `description` (getPortUrl works for any port). */
  readonly ports?: readonly number[];
}

/** A spawned process as the AI SDK sees it, with a writable stdin when asked for. */
type WritableProcessHandle = SandboxProcessHandle & { readonly stdin: WritableStream<Uint8Array> };

/** `Experimental_SandboxSession` over one Airlock sandbox (see the file comment). */
export class AirlockSandboxSession implements SandboxSession {
  readonly description: string;
  /** The sandbox this session runs in. */
  readonly sandbox: PortableSandbox;
  private readonly forwards: PortForwards | undefined;
  private readonly declaredPorts: readonly number[];

  constructor(sandbox: PortableSandbox, opts: AirlockSessionOptions = {}) {
    this.sandbox = sandbox;
    this.declaredPorts = [...(opts.ports ?? [])];
    for (const p of this.declaredPorts) checkPort(p);
    const connect = connectorFor(sandbox, opts.airlock);
    this.forwards = connect ? new PortForwards(connect) : undefined;
    this.description = describe(sandbox, this.declaredPorts);
  }

  /** Ports declared up front and every port getPortUrl has opened, ascending. */
  get ports(): number[] {
    return [...new Set([...this.declaredPorts, ...(this.forwards?.ports ?? [])])].sort((a, b) => a - b);
  }

  readonly run = async (o: {
    command: string;
    workingDirectory?: string;
    env?: Record<string, string>;
    abortSignal?: AbortSignal;
  }): Promise<{ exitCode: number; stdout: string; stderr: string }> => {
    const r = await this.sandbox.exec(['/bin/sh', '-c', o.command], {
      cwd: this.resolve(o.workingDirectory ?? SESSION_BASE_DIR),
      ...(o.env ? { env: o.env } : {}),
      ...(o.abortSignal ? { signal: o.abortSignal } : {}),
      maxOutputBytes: RUN_MAX_OUTPUT_BYTES,
    });
    return { exitCode: exitStatus(r), stdout: r.stdout, stderr: r.stderr };
  };

  readonly spawn = (async (o: {
    command: string;
    workingDirectory?: string;
    env?: Record<string, string>;
    abortSignal?: AbortSignal;
    stdin?: boolean;
  }): Promise<SandboxProcessHandle | WritableProcessHandle> => {
    if (o.abortSignal?.aborted) throw abortReason(o.abortSignal);
    const proc = await this.sandbox.spawn(['/bin/sh', '-c', o.command], {
      cwd: this.resolve(o.workingDirectory ?? SESSION_BASE_DIR),
      ...(o.env ? { env: o.env } : {}),
    });
    return processHandle(proc, o.stdin === true, o.abortSignal);
  }) as SandboxSession['spawn'];

  readonly readFile = async (o: {
    path: string;
    abortSignal?: AbortSignal;
  }): Promise<ReadableStream<Uint8Array> | null> => {
    const bytes = await this.readBinaryFile(o);
    if (bytes === null) return null;
    return new ReadableStream<Uint8Array>({
      start(c) {
        if (bytes.length) c.enqueue(bytes);
        c.close();
      },
    });
  };

  readonly readBinaryFile = async (o: {
    path: string;
    abortSignal?: AbortSignal;
  }): Promise<Uint8Array | null> => {
    throwIfAborted(o.abortSignal);
    const p = this.resolve(o.path);
    try {
      return await this.sandbox.files.read(p, { format: 'bytes', maxBytes: MAX_READ_BYTES });
    } catch (e) {
      if (AirlockError.is(e, 'FILE_NOT_FOUND')) return null;
      throw e;
    }
  };

  readonly readTextFile = async (o: {
    path: string;
    abortSignal?: AbortSignal;
    encoding?: string;
    startLine?: number;
    endLine?: number;
  }): Promise<string | null> => {
    const bytes = await this.readBinaryFile(o);
    if (bytes === null) return null;
    const text = decoder(o.encoding).decode(bytes);
    if (o.startLine === undefined && o.endLine === undefined) return text;
    const from = lineNumber(o.startLine ?? 1, 'startLine');
    const lines = text.split('\n');
    const to = o.endLine === undefined ? lines.length : lineNumber(o.endLine, 'endLine');
    return lines.slice(from - 1, to).join('\n');
  };

  readonly writeFile = async (o: {
    path: string;
    content: ReadableStream<Uint8Array>;
    abortSignal?: AbortSignal;
  }): Promise<void> => {
    const parts: Uint8Array[] = [];
    let n = 0;
    const reader = o.content.getReader();
    try {
      for (;;) {
        throwIfAborted(o.abortSignal);
        const { done, value } = await reader.read();
        if (done) break;
        n += value.length;
        if (n > MAX_READ_BYTES) {
          throw new AirlockError(
            'FILE_TOO_LARGE',
            `a session writes files of at most ${MAX_READ_BYTES} bytes`,
            {
              field: 'content',
            },
          );
        }
        parts.push(value);
      }
    } finally {
      await reader.cancel().catch(() => {});
    }
    await this.writeBinaryFile({ path: o.path, content: Buffer.concat(parts), ...abortOf(o) });
  };

  readonly writeBinaryFile = async (o: {
    path: string;
    content: Uint8Array;
    abortSignal?: AbortSignal;
  }): Promise<void> => {
    throwIfAborted(o.abortSignal);
    const p = this.resolve(o.path);
    // The interface says: a directory there is an error (files.write would fail less clearly).
    if ((await this.stat({ path: p }))?.type === 'directory') {
      throw new AirlockError('INVALID_ARGUMENT', `${p} is a directory; write to a file path`, {
        field: 'path',
      });
    }
    await this.sandbox.files.write(p, o.content);
  };

  readonly writeTextFile = async (o: {
    path: string;
    content: string;
    abortSignal?: AbortSignal;
    encoding?: string;
  }): Promise<void> => {
    const enc = (o.encoding ?? 'utf-8').toLowerCase();
    if (enc !== 'utf-8' && enc !== 'utf8') {
      throw new AirlockError('INVALID_ARGUMENT', `writeTextFile encodes utf-8 only, not "${o.encoding}"`, {
        field: 'encoding',
      });
    }
    await this.writeBinaryFile({ path: o.path, content: Buffer.from(o.content, 'utf8'), ...abortOf(o) });
  };

  readonly stat = async (o: { path: string; abortSignal?: AbortSignal }): Promise<SandboxFileStat | null> => {
    throwIfAborted(o.abortSignal);
    // stat -L follows links, as the interface asks; a dangling link is "does not exist".
    const r = await this.sandbox.exec(
      [
        '/bin/sh',
        '-c',
        'exec stat -L -c "%F|%s" -- "$1" 2>/dev/null || echo missing',
        'sh',
        this.resolve(o.path),
      ],
      { timeoutMs: 30_000 },
    );
    const out = r.stdout.trim();
    if (out === 'missing' || out === '') return null;
    const [kind = '', size = '0'] = out.split('|');
    const type = kind.startsWith('regular') ? 'file' : kind === 'directory' ? 'directory' : 'other';
    return { type, size: Number(size) };
  };

  readonly listDirectory = async (o: {
    path: string;
    abortSignal?: AbortSignal;
  }): Promise<SandboxDirectoryEntry[] | null> => {
    throwIfAborted(o.abortSignal);
    const p = this.resolve(o.path);
    const s = await this.stat({ path: p });
    if (s === null) return null;
    if (s.type !== 'directory') {
      throw new AirlockError('INVALID_ARGUMENT', `${p} is not a directory`, { field: 'path' });
    }
    const entries = await this.sandbox.files.list(p);
    return entries.map((e) => ({ name: e.name, type: e.type === 'dir' ? 'directory' : e.type }));
  };

  readonly deleteFile = async (o: { path: string; abortSignal?: AbortSignal }): Promise<boolean> => {
    throwIfAborted(o.abortSignal);
    const p = this.resolve(o.path);
    // A link is removed itself (never its target); a real directory is refused.
    const r = await this.sandbox.exec(
      [
        '/bin/sh',
        '-c',
        'if [ -d "$1" ] && [ ! -L "$1" ]; then echo dir; elif [ -e "$1" ] || [ -L "$1" ]; then rm -f -- "$1" && echo deleted; else echo missing; fi',
        'sh',
        p,
      ],
      { timeoutMs: 30_000 },
    );
    const out = r.stdout.trim();
    if (out === 'dir') {
      throw new AirlockError('INVALID_ARGUMENT', `${p} is a directory; deleteFile removes files only`, {
        field: 'path',
      });
    }
    if (out !== 'deleted' && out !== 'missing') {
      throw new AirlockError('INTERNAL', `deleting ${p} failed: ${r.stderr.trim().slice(0, 200)}`);
    }
    return out === 'deleted';
  };

  /**
   * A URL on this host's loopback that reaches `port` on the sandbox's own loopback (a server the
   * agent started there). The listener starts on the first call and stops with the session.
   */
  async getPortUrl(port: number): Promise<string> {
    checkPort(port);
    if (!this.sandbox.alive) {
      throw new AirlockError('SANDBOX_GONE', `sandbox ${this.sandbox.id} is gone; start a new session`);
    }
    if (!this.forwards) {
      throw new AirlockError(
        'INVALID_ARGUMENT',
        'getPortUrl on a remote sandbox needs its runtime: create the session with { airlock: remoteAirlock }',
        { field: 'airlock' },
      );
    }
    return this.forwards.url(port);
  }

  /**
   * Replace the sandbox's egress policy now (sbx.setNetworkPolicy: the gateway swaps it atomically
   * and closes open connections the new policy denies). `null` means no network access: an empty
   * allow list (a sandbox created with no network already has none). A sandbox created with no
   * network cannot be given one (INVALID_ARGUMENT, field "network": create the session with
   * spec.network set).
   */
  async setNetworkPolicy(policy: NetworkPolicyInput | null): Promise<void> {
    if (policy !== null && policy !== undefined) {
      await this.sandbox.setNetworkPolicy(policy);
      return;
    }
    try {
      await this.sandbox.setNetworkPolicy({ allow: [] });
    } catch (e) {
      // Created with no network: it already has no network access, which is what null asks for.
      if (AirlockError.is(e, 'INVALID_ARGUMENT') && (e as AirlockError).field === 'network') return;
      throw e;
    }
  }

  /** Stop the session: close its port listeners and kill the sandbox. Idempotent. */
  async stop(): Promise<void> {
    await this.forwards?.close();
    await this.sandbox.kill();
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.stop();
  }

  private resolve(p: string): string {
    if (typeof p !== 'string' || p === '' || p.includes('\0')) {
      throw new AirlockError('INVALID_ARGUMENT', 'path must be a non-empty string without NUL', {
        field: 'path',
      });
    }
    return p.startsWith('/') ? p : `${SESSION_BASE_DIR}/${p}`;
  }
}

/** A session over `sandbox` (it is killed by `stop()`). */
export function airlockSandboxSession(
  sandbox: PortableSandbox,
  opts: AirlockSessionOptions = {},
): AirlockSandboxSession {
  return new AirlockSandboxSession(sandbox, opts);
}

/** Create a sandbox on `airlock` (local or remote) and a session over it. */
export async function createAirlockSandboxSession(
  opts: { readonly airlock: SessionRuntime; readonly spec?: SandboxSpecInput } & Omit<
    AirlockSessionOptions,
    'airlock'
  >,
): Promise<AirlockSandboxSession> {
  const sbx = await opts.airlock.create(opts.spec);
  try {
    return new AirlockSandboxSession(sbx, opts);
  } catch (e) {
    await sbx.kill();
    throw e;
  }
}

function connectorFor(sbx: PortableSandbox, runtime: SessionRuntime | undefined): PortConnector | undefined {
  const own = (
    sbx as {
      connectPort?: (port: number, o?: { signal?: AbortSignal }) => Promise<import('node:stream').Duplex>;
    }
  ).connectPort;
  if (typeof own === 'function') return (port, signal) => own.call(sbx, port, signal ? { signal } : {});
  const api = runtime?.api;
  if (api?.connectPort) {
    const caller = runtime?.caller ?? { tenant: 'remote-client' };
    return (port, signal) => api.connectPort!(sbx.id, port, caller, signal);
  }
  return undefined;
}

function describe(sbx: PortableSandbox, ports: readonly number[]): string {
  const parts = [
    `An isolated Linux sandbox (Airlock ${sbx.info.backend} tier, id ${sbx.id}).`,
    `Commands run with /bin/sh in ${SESSION_BASE_DIR}; relative paths are under ${SESSION_BASE_DIR}.`,
    (sbx as { spec?: { network?: unknown } }).spec?.network === undefined
      ? 'It has no network access.'
      : 'Its network access goes through an egress proxy that reaches only the allowed hosts.',
  ];
  if (ports.length) parts.push(`Servers started on ports ${ports.join(', ')} can be reached by the user.`);
  return parts.join(' ');
}

/** The wrapper the AI SDK gets for a spawned process. */
function processHandle(
  proc: SandboxProcess,
  withStdin: boolean,
  signal: AbortSignal | undefined,
): SandboxProcessHandle | WritableProcessHandle {
  if (!withStdin) proc.stdin.end();
  proc.stdin.on('error', () => {});
  let abortedBy: unknown;
  const onAbort = (): void => {
    abortedBy = abortReason(signal!);
    void proc.kill();
  };
  signal?.addEventListener('abort', onAbort, { once: true });
  const exited = proc.exited.then((x) => {
    signal?.removeEventListener('abort', onAbort);
    if (abortedBy !== undefined) throw abortedBy;
    return { exitCode: exitStatus(x) };
  });
  exited.catch(() => {});
  const handle: SandboxProcessHandle = {
    stdout: Readable.toWeb(proc.stdout) as ReadableStream<Uint8Array>,
    stderr: Readable.toWeb(proc.stderr) as ReadableStream<Uint8Array>,
    wait: () => exited,
    kill: () => proc.kill(),
  };
  if (!withStdin) return handle;
  return { ...handle, stdin: Writable.toWeb(proc.stdin) as WritableStream<Uint8Array> };
}

function exitStatus(r: { exitCode: number | null; signal?: NodeJS.Signals | null }): number {
  if (r.exitCode !== null) return r.exitCode;
  return 128 + (r.signal === 'SIGTERM' ? 15 : r.signal === 'SIGINT' ? 2 : 9);
}

function checkPort(port: number): void {
  if (!Number.isInteger(port) || port < 1 || port > 65535) {
    throw new AirlockError(
      'INVALID_ARGUMENT',
      `port must be an integer from 1 to 65535, not ${String(port)}`,
      {
        field: 'port',
      },
    );
  }
}

function lineNumber(n: number, field: string): number {
  if (!Number.isInteger(n) || n < 1) {
    throw new AirlockError('INVALID_ARGUMENT', `${field} is a 1-based line number`, { field });
  }
  return n;
}

function decoder(encoding: string | undefined): InstanceType<typeof TextDecoder> {
  try {
    return new TextDecoder(encoding ?? 'utf-8');
  } catch {
    throw new AirlockError('INVALID_ARGUMENT', `unknown text encoding "${encoding}"`, { field: 'encoding' });
  }
}

function throwIfAborted(signal: AbortSignal | undefined): void {
  if (signal?.aborted) throw abortReason(signal);
}

function abortReason(signal: AbortSignal): unknown {
  return signal.reason ?? new AirlockError('ABORTED', 'aborted');
}

function abortOf(o: { abortSignal?: AbortSignal }): { abortSignal?: AbortSignal } {
  return o.abortSignal ? { abortSignal: o.abortSignal } : {};
}
