// One WASM sandbox: a worker thread (thread.ts) it alone owns, and the queue of its jobs (execs,
// runCode cells), run one at a time. A stop asks the running job to end (KeyboardInterrupt in
// Python, an uncatchable interrupt in QuickJS); a job that ignores it for STOP_GRACE_MS (Python
// catching KeyboardInterrupt, a C-level loop) costs the sandbox its thread: it is terminated and a
// fresh one takes its place, and the in-memory files and code contexts of the old one are gone.
import { randomBytes } from 'node:crypto';
import { PassThrough, Writable } from 'node:stream';
import type {
  BackendProcess,
  BackendSandbox,
  LimitCounters,
  ProcessExit,
  SpawnRequest,
} from '../../core/backend.js';
import type { BackendExecution, BackendRunCodeRequest, CodeError, CodeResult } from '../../core/code.js';
import { AirlockError } from '../../core/errors.js';
import type { FromWorker, ToWorker } from './protocol.js';
import type { WasmThread } from './thread.js';

export const STOP_GRACE_MS = 2000;

type Job = {
  readonly msg: ToWorker & { id: number };
  /** Called as the job is sent to the worker (a runCode's timeout counts from there, not from the queue). */
  readonly onStart?: () => void;
  readonly onOut: (fd: 1 | 2, data: Uint8Array) => void;
  readonly onResult?: (r: CodeResult) => void;
  readonly finish: (d: {
    exitCode: number;
    stopped: boolean;
    error: CodeError | null;
    lost: boolean;
  }) => void;
};

let nextJobId = 1;

export class WasmSandbox implements BackendSandbox {
  readonly id = `wasm-${randomBytes(8).toString('hex')}`;
  /** Code runs in this process's worker threads: as the uid of the Airlock process itself. */
  readonly hostUid = process.getuid?.() ?? 0;
  private readonly queue: Job[] = [];
  private current: Job | undefined;
  private oomKills = 0;
  private destroyed = false;
  /** While a fresh thread is being made: nothing is sent, the old thread's end is expected. */
  private replacing = false;
  private readonly knownContexts = new Set<string>();
  private readonly lostContexts = new Set<string>();

  constructor(
    private thread: WasmThread,
    private readonly replacement: () => Promise<WasmThread>,
  ) {
    this.attach(thread);
  }

  private attach(t: WasmThread): void {
    t.onMessage((m) => this.onMessage(t, m));
    void t.gone.then(({ oom }) => {
      if (t !== this.thread || this.destroyed || this.replacing) return;
      // The thread died under a job (V8's heap limit): the job ends as an OOM kill.
      if (oom) this.oomKills++;
      void this.replaceThread(oom);
    });
  }

  private onMessage(t: WasmThread, m: FromWorker): void {
    const job = this.current;
    if (t !== this.thread || !job || !('id' in m) || m.id !== job.msg.id) return;
    if (m.t === 'out') job.onOut(m.fd, m.data);
    else if (m.t === 'result') job.onResult?.(m.result);
    else if (m.t === 'done') {
      if (m.oom) this.oomKills++;
      this.current = undefined;
      job.finish({ exitCode: m.exitCode, stopped: m.stopped, error: m.error, lost: false });
      this.pump();
    }
  }

  private pump(): void {
    if (this.current || this.destroyed || this.replacing) return;
    const job = this.queue.shift();
    if (!job) return;
    this.current = job;
    this.thread.clearStop();
    job.onStart?.();
    this.thread.send(job.msg);
  }

  private enqueue(job: Job): void {
    this.queue.push(job);
    this.pump();
  }

  /** Stop `job`: dequeue it, or interrupt it and, if it does not end in time, replace the thread. */
  private stopJob(job: Job): void {
    const i = this.queue.indexOf(job);
    if (i >= 0) {
      this.queue.splice(i, 1);
      job.finish({ exitCode: 137, stopped: true, error: null, lost: false });
      return;
    }
    if (this.current !== job) return;
    const t = this.thread;
    t.stop();
    const timer = setTimeout(() => {
      if (this.current === job && this.thread === t) void this.replaceThread(false);
    }, STOP_GRACE_MS);
    timer.unref();
  }

  private async replaceThread(oom: boolean): Promise<void> {
    if (this.replacing) return;
    this.replacing = true;
    const old = this.thread;
    const job = this.current;
    this.current = undefined;
    for (const c of this.knownContexts) this.lostContexts.add(c);
    this.knownContexts.clear();
    job?.finish({ exitCode: oom ? 1 : 137, stopped: !oom, error: null, lost: true });
    void old.terminate();
    if (this.destroyed) return;
    try {
      const fresh = await this.replacement();
      if (this.destroyed) return void (await fresh.terminate());
      this.thread = fresh;
      this.attach(fresh);
    } catch {
      for (const j of this.queue.splice(0))
        j.finish({ exitCode: 1, stopped: false, error: null, lost: true });
    } finally {
      this.replacing = false;
    }
    this.pump();
  }

  async spawn(req: SpawnRequest): Promise<BackendProcess> {
    if (this.destroyed) throw new AirlockError('SANDBOX_GONE', `sandbox ${this.id} is gone`);
    const stdout = new PassThrough();
    const stderr = new PassThrough();
    let resolveExit!: (e: ProcessExit) => void;
    const exited = new Promise<ProcessExit>((r) => (resolveExit = r));
    let job: Job | undefined;
    let killed = false;
    const start = (stdin: Uint8Array | null): void => {
      if (killed) return;
      job = {
        msg: { t: 'exec', id: nextJobId++, argv: req.argv, env: req.env, cwd: req.cwd, stdin },
        onOut: (fd, data) => (fd === 1 ? stdout : stderr).write(data),
        finish: (d) => {
          stdout.end();
          stderr.end();
          resolveExit(
            d.stopped ? { exitCode: null, signal: 'SIGKILL' } : { exitCode: d.exitCode, signal: null },
          );
        },
      };
      this.enqueue(job);
    };
    // stdin is read whole before the job starts (the interpreters read it synchronously).
    let stdin: Writable | null = null;
    if (req.stdin) {
      const chunks: Buffer[] = [];
      stdin = new Writable({
        write(chunk: Buffer, _enc, cb) {
          chunks.push(Buffer.from(chunk));
          cb();
        },
        final(cb) {
          start(new Uint8Array(Buffer.concat(chunks)));
          cb();
        },
      });
      stdin.on('error', () => {});
    } else start(null);
    return {
      stdout,
      stderr,
      stdin,
      exited,
      kill: () => {
        if (killed) return;
        killed = true;
        if (job) this.stopJob(job);
        else {
          stdout.end();
          stderr.end();
          resolveExit({ exitCode: null, signal: 'SIGKILL' });
        }
      },
    };
  }

  async runCode(req: BackendRunCodeRequest): Promise<BackendExecution> {
    if (this.destroyed) throw new AirlockError('SANDBOX_GONE', `sandbox ${this.id} is gone`);
    if (req.signal?.aborted) throw new AirlockError('ABORTED', 'runCode aborted before it started');
    let language = req.language;
    let code = req.code;
    if (language === 'bash') {
      throw new AirlockError(
        'INVALID_ARGUMENT',
        'the wasm tier runs python, javascript and typescript, not bash (there is no shell); use the namespaces tier',
        { field: 'language' },
      );
    }
    if (language === 'typescript') {
      const { transform } = await import('esbuild');
      code = (await transform(code, { loader: 'ts', format: 'esm', target: 'es2020' })).code;
      language = 'javascript';
    }
    const ctx = req.contextId;
    if (ctx !== undefined && this.lostContexts.has(ctx)) {
      throw new AirlockError(
        'CODE_CONTEXT_NOT_FOUND',
        `code context ${ctx} is gone: a run in sandbox ${this.id} ignored its stop and the worker holding the context was replaced; create a new context`,
        { field: 'context' },
      );
    }
    if (ctx !== undefined) this.knownContexts.add(ctx);
    const decoders = { 1: new TextDecoder(), 2: new TextDecoder() };
    const text = { 1: '', 2: '' };
    const results: CodeResult[] = [];
    let timedOut = false;
    let deadline = Number.POSITIVE_INFINITY;
    const outcome = await new Promise<{ error: CodeError | null; stopped: boolean; lost: boolean }>(
      (resolve) => {
        let timer: NodeJS.Timeout | undefined;
        const msg = {
          t: 'code' as const,
          id: nextJobId++,
          language: language === 'javascript' ? ('javascript' as const) : ('python' as const),
          code,
          ...(ctx !== undefined ? { contextId: ctx } : {}),
          env: req.envs,
          deadline,
        };
        const job: Job = {
          msg,
          onStart: () => {
            deadline = Date.now() + req.timeoutMs;
            msg.deadline = deadline; // QuickJS's interrupt handler checks it itself
            timer = setTimeout(() => {
              timedOut = true;
              this.stopJob(job);
            }, req.timeoutMs);
            timer.unref();
          },
          onOut: (fd, data) => {
            const s = decoders[fd].decode(data, { stream: true });
            text[fd] += s;
            if (s) (fd === 1 ? req.onStdout : req.onStderr)?.(s);
          },
          onResult: (r) => {
            results.push(r);
            req.onResult?.(r);
          },
          finish: (d) => {
            clearTimeout(timer);
            req.signal?.removeEventListener('abort', onAbort);
            resolve(d);
          },
        };
        const onAbort = (): void => this.stopJob(job);
        req.signal?.addEventListener('abort', onAbort, { once: true });
        this.enqueue(job);
      },
    );
    // QuickJS ends a run at its deadline itself (before the timer above fires).
    const e = outcome.error;
    if (e?.name === 'InternalError' && e.value === 'interrupted' && Date.now() >= deadline) timedOut = true;
    let error = outcome.error;
    // As the kernels of the other tiers report it (src/sandbox/code/): an error of the run, not a throw.
    if (req.signal?.aborted && !timedOut) {
      error = { name: 'AbortError', value: 'the run was aborted and stopped', traceback: '' };
    }
    if (timedOut || (outcome.lost && !req.signal?.aborted)) {
      const lost = outcome.lost
        ? ' It ignored the stop, so the sandbox worker was replaced: its code contexts and in-memory files are gone.'
        : '';
      error = {
        name: 'TimeoutError',
        value: `the code ran longer than its timeout (${req.timeoutMs} ms) and was stopped.${lost}`,
        traceback: '',
      };
    }
    return { results, stdout: text[1], stderr: text[2], error };
  }

  async closeCodeContext(contextId: string): Promise<void> {
    this.lostContexts.delete(contextId);
    if (this.destroyed) return;
    await new Promise<void>((resolve) =>
      this.enqueue({
        msg: { t: 'closeContext', id: nextJobId++, contextId },
        onOut: () => {},
        finish: () => resolve(),
      }),
    );
  }

  counters(): Promise<LimitCounters> {
    return Promise.resolve({ oomKills: this.oomKills, pidsLimitHits: 0 });
  }

  async destroy(): Promise<void> {
    if (this.destroyed) return this.thread.gone.then(() => {});
    this.destroyed = true;
    const jobs = [...this.queue.splice(0), ...(this.current ? [this.current] : [])];
    this.current = undefined;
    for (const j of jobs) j.finish({ exitCode: 137, stopped: true, error: null, lost: true });
    await this.thread.terminate();
  }
}
