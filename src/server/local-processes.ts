// Processes of the server API over the library's raw spawn(): a foreground exec streamed as events,
// and the table of background processes per sandbox, whose output is kept in a bounded ring so that
// connect() replays what was said so far and then follows live.
import type { Readable } from 'node:stream';
import { AirlockError } from '../core/errors.js';
import type { SandboxProcess } from '../sandbox/sandbox.js';
import type { ExecEvent, ProcessView } from './contract.js';
import { PushQueue } from './queue.js';

type OutputEvent = Extract<ExecEvent, { type: 'stdout' | 'stderr' }>;
type ExitEvent = Extract<ExecEvent, { type: 'exit' }>;

/** Bytes of base64 output queued for a slow reader before the process's pipes are paused. */
const FOREGROUND_HIGH_WATER = 1024 * 1024;
/** A follower (connect) this far behind is cut off with an error rather than buffered without end. */
const FOLLOWER_MAX_QUEUED = 8 * 1024 * 1024;

/** Read both pipes of `proc` to the end; resolves with the exit event once the process is gone. */
function pump(
  proc: SandboxProcess,
  onChunk: (e: OutputEvent) => void,
  o: { timeoutMs?: number | undefined; maxOutputBytes?: number | undefined; started: number },
): { exit: Promise<ExitEvent>; pause: (paused: boolean) => void } {
  let timedOut = false;
  const timer =
    o.timeoutMs === undefined
      ? undefined
      : setTimeout(() => {
          timedOut = true;
          void proc.kill();
        }, o.timeoutMs);
  const read = (src: Readable, type: 'stdout' | 'stderr'): Promise<void> => {
    let left = o.maxOutputBytes ?? Infinity;
    src.on('data', (chunk: Buffer) => {
      if (left <= 0) return; // over maxOutputBytes: read on (an unread pipe stalls the process), drop
      const part = chunk.length > left ? chunk.subarray(0, left) : chunk;
      left -= part.length;
      onChunk({ type, data: part.toString('base64') });
    });
    return new Promise<void>((resolve) => {
      src.once('close', resolve);
      src.once('end', resolve);
      src.once('error', () => resolve());
    });
  };
  const done = Promise.all([read(proc.stdout, 'stdout'), read(proc.stderr, 'stderr')]);
  const exit = (async (): Promise<ExitEvent> => {
    const [x] = await Promise.all([proc.exited, done]);
    clearTimeout(timer);
    const killedBy = timedOut ? 'timeout' : x.killedBy;
    return {
      type: 'exit',
      exitCode: x.exitCode,
      signal: x.signal,
      ...(killedBy ? { killedBy } : {}),
      durationMs: Math.round(performance.now() - o.started),
      oomKills: x.oomKills ?? 0,
    };
  })();
  const pause = (paused: boolean): void => {
    for (const s of [proc.stdout, proc.stderr]) {
      if (paused) s.pause();
      else s.resume();
    }
  };
  return { exit, pause };
}

function feed(proc: SandboxProcess, stdin: string | undefined, keepOpen: boolean): void {
  if (stdin !== undefined) proc.stdin.end(stdin);
  else if (!keepOpen) proc.stdin.end();
}

/**
 * A foreground exec: `start`, then output as it comes, then `exit`. A consumer that stops early (or
 * aborts `signal`) kills the process.
 */
export async function* foregroundEvents(
  proc: SandboxProcess,
  o: {
    stdin?: string | undefined;
    timeoutMs?: number | undefined;
    maxOutputBytes?: number | undefined;
    signal?: AbortSignal | undefined;
  },
): AsyncGenerator<ExecEvent> {
  const started = performance.now();
  let exited = false;
  const onAbort = (): void => void proc.kill();
  o.signal?.addEventListener('abort', onAbort, { once: true });
  try {
    yield { type: 'start', pid: proc.id };
    let pausePipes: (p: boolean) => void = () => {};
    const q = new PushQueue<ExecEvent>({
      signal: o.signal,
      weigh: (e) => (e.type === 'stdout' || e.type === 'stderr' ? e.data.length : 0),
      highWater: FOREGROUND_HIGH_WATER,
      onPressure: (high) => pausePipes(high),
    });
    const p = pump(proc, (e) => q.push(e), { ...o, started });
    pausePipes = p.pause;
    feed(proc, o.stdin, false);
    p.exit.then(
      (e) => {
        exited = true;
        q.push(e);
        q.end();
      },
      (err: unknown) => q.end(err),
    );
    yield* q;
  } finally {
    o.signal?.removeEventListener('abort', onAbort);
    if (!exited) await proc.kill(); // the consumer went away mid-stream: nothing is left running
  }
}

/**
 * Append `e` to `ring` and keep the newest output of its stream within `max` base64 bytes. The
 * oldest events go first; the one that straddles the cap keeps its tail, so the newest bytes are
 * never lost (a single read bigger than the cap, e.g. 64 KiB from a pipe, keeps its last part).
 */
export function keepNewest(
  ring: OutputEvent[],
  bytes: Record<OutputEvent['type'], number>,
  e: OutputEvent,
  max: number,
): void {
  ring.push(e);
  bytes[e.type] += e.data.length;
  let excess = bytes[e.type] - max;
  while (excess > 0) {
    const i = ring.findIndex((x) => x.type === e.type);
    const old = ring[i]!;
    if (old.data.length <= excess) {
      ring.splice(i, 1);
      bytes[e.type] -= old.data.length;
    } else {
      // Keep whole 3-byte groups of the tail: base64 of k raw bytes is 4k/3 characters.
      const raw = Buffer.from(old.data, 'base64');
      const keep = Math.floor((old.data.length - excess) / 4) * 3;
      const data = raw.subarray(Math.max(0, raw.length - keep)).toString('base64');
      bytes[e.type] -= old.data.length - data.length;
      if (data.length === 0) ring.splice(i, 1);
      else ring[i] = { type: e.type, data };
    }
    excess = bytes[e.type] - max;
  }
}

/** One background process: its ring of output, its followers, its exit. */
class BackgroundProcess {
  private readonly ring: OutputEvent[] = [];
  private readonly ringBytes = { stdout: 0, stderr: 0 };
  private readonly followers = new Set<PushQueue<ExecEvent>>();
  exitEvent: ExitEvent | undefined;

  constructor(
    readonly pid: string,
    readonly cmd: string[],
    readonly proc: SandboxProcess,
    private readonly maxRingBytes: number,
  ) {}

  record(e: OutputEvent): void {
    keepNewest(this.ring, this.ringBytes, e, this.maxRingBytes);
    for (const f of this.followers) {
      if (f.weight > FOLLOWER_MAX_QUEUED) {
        f.end(
          new AirlockError('ABORTED', `process ${this.pid}: the reader fell too far behind; connect again`),
        );
        this.followers.delete(f);
      } else f.push(e);
    }
  }

  exited(e: ExitEvent): void {
    this.exitEvent = e;
    for (const f of this.followers) {
      f.push(e);
      f.end();
    }
    this.followers.clear();
  }

  /** start, the ring as it is now, then live output until exit. */
  async *follow(signal?: AbortSignal): AsyncGenerator<ExecEvent> {
    const q = new PushQueue<ExecEvent>({
      signal,
      weigh: (e) => (e.type === 'stdout' || e.type === 'stderr' ? e.data.length : 0),
    });
    // Replay and subscribe in one turn: no output falls between the two.
    q.push({ type: 'start', pid: this.pid });
    for (const e of this.ring) q.push(e);
    if (this.exitEvent) {
      q.push(this.exitEvent);
      q.end();
    } else this.followers.add(q);
    try {
      yield* q;
    } finally {
      this.followers.delete(q);
    }
  }

  view(): ProcessView {
    return {
      pid: this.pid,
      cmd: this.cmd,
      running: this.exitEvent === undefined,
      exitCode: this.exitEvent?.exitCode ?? null,
    };
  }
}

/** Exited processes kept per sandbox (for list and a late connect), oldest dropped first. */
const MAX_EXITED = 16;
/**
 * Background processes running at once per sandbox: each holds an output ring in the server's
 * memory, so their number is bounded here, not only by the sandbox's pids limit.
 */
export const MAX_RUNNING_PROCESSES = 32;

/** The background processes of one sandbox. */
export class ProcessTable {
  private readonly procs = new Map<string, BackgroundProcess>();
  private nextPid = 1;

  constructor(
    private readonly sandboxId: string,
    private readonly maxRingBytes: number,
  ) {}

  add(
    proc: SandboxProcess,
    cmd: string[],
    o: { stdin?: string | undefined; timeoutMs?: number | undefined; maxOutputBytes?: number | undefined },
  ): ProcessView {
    const pid = String(this.nextPid++);
    const bp = new BackgroundProcess(pid, cmd, proc, this.maxRingBytes);
    this.procs.set(pid, bp);
    const p = pump(proc, (e) => bp.record(e), { ...o, started: performance.now() });
    feed(proc, o.stdin, true);
    void p.exit.then((e) => {
      bp.exited(e);
      this.trim();
    });
    return bp.view();
  }

  /** CAPACITY_EXHAUSTED when the sandbox already runs MAX_RUNNING_PROCESSES background processes. */
  checkRoom(): void {
    const running = [...this.procs.values()].filter((p) => !p.exitEvent).length;
    if (running >= MAX_RUNNING_PROCESSES) {
      throw new AirlockError(
        'CAPACITY_EXHAUSTED',
        `sandbox ${this.sandboxId} already runs ${running} background processes (the most); kill one first`,
      );
    }
  }

  private trim(): void {
    const exited = [...this.procs.values()].filter((p) => p.exitEvent);
    for (const p of exited.slice(0, Math.max(0, exited.length - MAX_EXITED))) this.procs.delete(p.pid);
  }

  get(pid: string): BackgroundProcess {
    const p = this.procs.get(pid);
    if (!p) {
      throw new AirlockError(
        'PROCESS_NOT_FOUND',
        `no process ${JSON.stringify(pid.slice(0, 40))} in sandbox ${this.sandboxId}; list its processes`,
        { field: 'pid' },
      );
    }
    return p;
  }

  list(): ProcessView[] {
    return [...this.procs.values()].map((p) => p.view());
  }

  async sendStdin(pid: string, data: Uint8Array): Promise<void> {
    const p = this.get(pid);
    const stdin = p.proc.stdin;
    if (p.exitEvent || stdin.writableEnded || stdin.destroyed) {
      throw new AirlockError('INVALID_ARGUMENT', `process ${pid}: its stdin is closed`, { field: 'pid' });
    }
    await new Promise<void>((resolve, reject) =>
      stdin.write(data, (err) =>
        err
          ? reject(
              new AirlockError('INVALID_ARGUMENT', `process ${pid}: its stdin is closed`, { field: 'pid' }),
            )
          : resolve(),
      ),
    );
  }

  closeStdin(pid: string): void {
    this.get(pid).proc.stdin.end();
  }

  async kill(pid: string): Promise<void> {
    await this.get(pid).proc.kill();
  }

  /** Kill every process (the sandbox is going). */
  async killAll(): Promise<void> {
    await Promise.allSettled([...this.procs.values()].map((p) => p.proc.kill()));
  }
}
