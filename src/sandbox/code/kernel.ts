// One kernel: an interpreter process inside the sandbox, started through the sandbox's own spawn
// (so it has the sandbox's identity, limits and lifetime: kill and the TTL end it), that runs cells
// one at a time and keeps their state. The programs are kernels/*.{py,js,sh}; protocol.ts parses
// what they send back. A kernel that times out, is aborted, breaks the protocol or exits is dead:
// its owner drops it and starts an empty one on the next run.
import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import type { BackendExecution, CodeError, CodeLanguage, CodeResult } from '../../core/code.js';
import type { Readable, Writable } from 'node:stream';
import { FrameSplitter, ProtocolViolation, parseFrame, type KernelFrame } from './protocol.js';

/** Bounds on what one run may send back (a hostile kernel never grows the host's memory past them). */
export interface KernelLimits {
  /** Bytes of stdout and of stderr kept in the Execution (the rest is counted and dropped). */
  readonly maxOutputBytes: number;
  /** Bytes of one frame (a result with a PNG is one frame). */
  readonly maxFrameBytes: number;
  /** Bytes of every result of the run together. */
  readonly maxResultBytes: number;
  /** Number of results of the run. */
  readonly maxResults: number;
}

export const DEFAULT_KERNEL_LIMITS: KernelLimits = {
  maxOutputBytes: 1024 * 1024,
  maxFrameBytes: 16 * 1024 * 1024,
  maxResultBytes: 32 * 1024 * 1024,
  maxResults: 1000,
};

/** The interpreter a language's kernel runs on (javascript also runs transpiled typescript). */
export type KernelKind = 'python' | 'javascript' | 'bash';

export function kernelKind(language: CodeLanguage): KernelKind {
  return language === 'typescript' ? 'javascript' : language;
}

const FILES: Record<KernelKind, string> = {
  python: 'python.py',
  javascript: 'javascript.js',
  bash: 'bash.sh',
};
const sources = new Map<KernelKind, string>();

/** A kernel program's source (read once; shipped beside this module, see scripts/build.ts). */
function kernelSource(kind: KernelKind): string {
  let src = sources.get(kind);
  if (src === undefined) {
    src = readFileSync(new URL(`./kernels/${FILES[kind]}`, import.meta.url), 'utf8');
    sources.set(kind, src);
  }
  return src;
}

/** The argv that starts a kernel (its program passed inline: nothing is written into the sandbox). */
export function kernelArgv(kind: KernelKind): string[] {
  const src = kernelSource(kind);
  switch (kind) {
    case 'python':
      return ['python3', '-u', '-c', src];
    case 'javascript':
      return ['node', '-e', src];
    case 'bash':
      return [
        '/bin/sh',
        '-c',
        'if command -v bash >/dev/null 2>&1; then exec bash -c "$1" airlock-kernel; fi; exec sh -c "$1" airlock-kernel',
        'airlock-kernel',
        src,
      ];
  }
}

/** How a run ended: normally, or by what killed its kernel. */
export type RunEnd = 'done' | 'timeout' | 'aborted' | 'exited' | 'protocol';

export interface KernelRun {
  readonly execution: BackendExecution;
  readonly end: RunEnd;
  /** For 'exited': the process's exit code; for 'protocol': what was wrong. */
  readonly exitCode?: number | null;
  readonly detail?: string;
}

export interface KernelRunRequest {
  readonly code: string;
  readonly envs: Readonly<Record<string, string>>;
  readonly timeoutMs: number;
  readonly signal?: AbortSignal;
  readonly onStdout?: (t: string) => void;
  readonly onStderr?: (t: string) => void;
  readonly onResult?: (r: CodeResult) => void;
}

/** What a kernel needs of a process the sandbox started (SandboxBase.spawn's SandboxProcess). */
export interface KernelProcess {
  readonly stdin: Writable;
  readonly stdout: Readable;
  readonly stderr: Readable;
  readonly exited: Promise<{ exitCode: number | null }>;
  kill(): Promise<void>;
}

/** Start a process in the sandbox (SandboxBase.spawn). */
export type KernelSpawn = (
  argv: string[],
  opts: { cwd?: string; env?: Record<string, string> },
) => Promise<KernelProcess>;

/** Text of one stream, kept up to a byte bound (the callback still sees all of it). */
class BoundedText {
  private parts: string[] = [];
  private bytes = 0;
  private dropped = 0;
  constructor(
    private readonly max: number,
    private readonly name: string,
    private readonly cb?: (t: string) => void,
  ) {}
  add(t: string): void {
    const n = Buffer.byteLength(t);
    if (this.bytes + n <= this.max) {
      this.parts.push(t);
      this.bytes += n;
    } else this.dropped += n;
    if (this.cb) {
      try {
        this.cb(t);
      } catch {
        /* the caller's bug; the run is unaffected */
      }
    }
  }
  text(): string {
    const s = this.parts.join('');
    return this.dropped ? `${s}\n…[airlock: ${this.dropped} bytes of ${this.name} omitted]…\n` : s;
  }
}

export class Kernel {
  private current: ((stream: 'out' | 'err', chunk: Buffer) => void) | undefined;
  private exitedWith: number | null | undefined;
  private busy = false;

  private constructor(
    readonly kind: KernelKind,
    private readonly proc: KernelProcess,
    private readonly limits: KernelLimits,
  ) {
    proc.stdout.on('data', (c: Buffer) => this.current?.('out', c));
    proc.stderr.on('data', (c: Buffer) => this.current?.('err', c));
    void proc.exited.then((e) => {
      this.exitedWith = e.exitCode;
    });
  }

  static async start(
    spawn: KernelSpawn,
    kind: KernelKind,
    opts: { cwd?: string; envs?: Readonly<Record<string, string>>; limits?: KernelLimits },
  ): Promise<Kernel> {
    const proc = await spawn(kernelArgv(kind), {
      ...(opts.cwd !== undefined ? { cwd: opts.cwd } : {}),
      ...(opts.envs ? { env: { ...opts.envs } } : {}),
    });
    return new Kernel(kind, proc, opts.limits ?? DEFAULT_KERNEL_LIMITS);
  }

  /** False once the process is gone (or was killed): the owner starts a new kernel. */
  get alive(): boolean {
    return this.exitedWith === undefined;
  }

  /** Kill the process tree; resolves once it is gone. */
  kill(): Promise<void> {
    this.exitedWith ??= null;
    return this.proc.kill();
  }

  /** Run one cell (one at a time: the owner queues them). */
  async run(req: KernelRunRequest): Promise<KernelRun> {
    if (this.busy) throw new Error('kernel busy'); // the owner's queue makes this unreachable
    this.busy = true;
    const id = randomBytes(12).toString('hex');
    const stdout = new BoundedText(this.limits.maxOutputBytes, 'stdout', req.onStdout);
    const stderr = new BoundedText(this.limits.maxOutputBytes, 'stderr', req.onStderr);
    const results: CodeResult[] = [];
    let resultBytes = 0;
    let error: CodeError | null = null;
    let outEnded = false;
    let errEnded = false;
    let exitStatus: number | undefined;

    let finish!: (end: RunEnd, detail?: string) => void;
    const ended = new Promise<{ end: RunEnd; detail?: string }>((resolve) => {
      finish = (end, detail) => resolve({ end, ...(detail !== undefined ? { detail } : {}) });
    });

    const onFrame = (f: KernelFrame, size: number): void => {
      if (f.t === 'result') {
        resultBytes += size;
        if (results.length >= this.limits.maxResults || resultBytes > this.limits.maxResultBytes) {
          throw new ProtocolViolation(
            `the run's results exceed ${this.limits.maxResults} results or ${this.limits.maxResultBytes} bytes`,
          );
        }
        const { t: _t, ...rest } = f;
        void _t;
        const r = rest as CodeResult;
        results.push(r);
        try {
          req.onResult?.(r);
        } catch {
          /* the caller's bug */
        }
      } else if (f.t === 'error') {
        error = { name: f.name, value: f.value, traceback: f.traceback };
      } else {
        outEnded = true;
        exitStatus = f.exit;
      }
    };
    const out = new FrameSplitter(
      id,
      this.limits.maxFrameBytes,
      (t) => stdout.add(t),
      (body) => onFrame(parseFrame(body), body.length),
    );
    const err = new FrameSplitter(
      id,
      64,
      (t) => stderr.add(t),
      (body) => {
        if (body.toString('latin1') !== 'end') throw new ProtocolViolation('an unknown frame on stderr');
        errEnded = true;
      },
    );
    this.current = (stream, chunk) => {
      try {
        (stream === 'out' ? out : err).push(chunk);
      } catch (e) {
        finish('protocol', e instanceof ProtocolViolation ? e.message : String(e));
        return;
      }
      if (outEnded && errEnded) finish('done');
    };

    const timer = setTimeout(() => finish('timeout'), req.timeoutMs);
    const onAbort = (): void => finish('aborted');
    req.signal?.addEventListener('abort', onAbort, { once: true });
    void this.proc.exited.then(() => finish('exited'));
    if (req.signal?.aborted) onAbort();

    this.proc.stdin.write(this.request(id, req));
    const { end, detail } = await ended;
    clearTimeout(timer);
    req.signal?.removeEventListener('abort', onAbort);
    if (end !== 'done') {
      await this.kill();
      // The streams' last bytes (a traceback printed as it died) are data of this run.
      out.flush();
      err.flush();
    }
    this.current = undefined;
    this.busy = false;
    if (
      end === 'done' &&
      this.kind === 'bash' &&
      error === null &&
      exitStatus !== undefined &&
      exitStatus !== 0
    ) {
      error = {
        name: 'ExitError',
        value: `the cell's last command exited with status ${exitStatus}`,
        traceback: '',
      };
    }
    return {
      execution: { results, stdout: stdout.text(), stderr: stderr.text(), error },
      end,
      ...(end === 'exited' ? { exitCode: this.exitedWith ?? null } : {}),
      ...(detail !== undefined ? { detail } : {}),
    };
  }

  private request(id: string, req: KernelRunRequest): string {
    if (this.kind !== 'bash') return JSON.stringify({ id, code: req.code, envs: req.envs }) + '\n';
    // The shell kernel reads lines up to the id; the run's envs are exported first (they persist).
    const exports = Object.entries(req.envs)
      .map(([k, v]) => `export ${k}='${v.replace(/'/g, `'\\''`)}'\n`)
      .join('');
    const code = exports + req.code;
    return `${id}\n${code}${code.endsWith('\n') ? '' : '\n'}${id}\n`;
  }
}
