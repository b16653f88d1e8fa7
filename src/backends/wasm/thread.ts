// The main thread's handle on one WASM worker thread: started with V8 heap limits and an empty
// environment, its messages parsed (the worker runs user code in the realm that sends them), its
// stop flag in shared memory, its end observed. One sandbox owns a thread; a thread is never reused.
import { Worker } from 'node:worker_threads';
import type { Logger } from '../../core/backend.js';
import { AirlockError } from '../../core/errors.js';
import { moduleWorker } from '../../core/worker.js';
import { CTL, CTL_SLOTS, FromWorkerSchema, type FromWorker, type ToWorker } from './protocol.js';

const MiB = 1024 * 1024;

/** Live worker threads of this process (the tests' residue check counts them). */
let liveThreads = 0;
export function wasmThreads(): number {
  return liveThreads;
}

/** V8 heap limits of a worker for a sandbox of `memoryBytes` (its interpreters' JS side). */
export function heapLimits(
  memoryBytes: number,
): NonNullable<ConstructorParameters<typeof Worker>[1]>['resourceLimits'] {
  return {
    maxOldGenerationSizeMb: Math.max(128, Math.ceil(memoryBytes / MiB)),
    maxYoungGenerationSizeMb: 32,
    codeRangeSizeMb: 64,
    stackSizeMb: 4,
  };
}

/**
 * A memory snapshot of a freshly loaded Pyodide, made by a worker that runs nothing else (no user
 * code, no Airlock setup), in shared memory for every later worker to restore from.
 */
export function makeSnapshot(logger: Logger): Promise<SharedArrayBuffer> {
  const worker = moduleWorker(import.meta.url, './wasm-worker', {
    workerData: { ctl: new SharedArrayBuffer(CTL_SLOTS * 4), makeSnapshot: true },
    env: {},
    argv: [],
    stdout: true,
    stderr: true,
  });
  liveThreads++;
  worker.stdout.resume();
  worker.stderr.resume();
  return new Promise((resolve, reject) => {
    let got: SharedArrayBuffer | undefined;
    worker.on('message', (raw: unknown) => {
      const m = FromWorkerSchema.safeParse(raw);
      if (m.success && m.data.t === 'snapshot') {
        got = new SharedArrayBuffer(m.data.data.length);
        new Uint8Array(got).set(m.data.data);
      } else if (m.success && m.data.t === 'failed')
        logger.debug({ err: m.data.message }, 'wasm snapshot failed');
    });
    worker.on('error', (e) => logger.debug({ err: e.message }, 'wasm snapshot worker error'));
    worker.on('exit', () => {
      liveThreads--;
      if (got) resolve(got);
      else
        reject(new AirlockError('BACKEND_UNAVAILABLE', 'the wasm snapshot worker ended without a snapshot'));
    });
  });
}

export class WasmThread {
  readonly ctl = new Int32Array(new SharedArrayBuffer(CTL_SLOTS * 4));
  readonly ready: Promise<{ python: string; pyodide: string }>;
  /** Resolves once the thread is gone; `oom` when V8's heap limit ended it. */
  readonly gone: Promise<{ oom: boolean }>;
  private readonly worker: Worker;
  private handler: ((m: FromWorker) => void) | undefined;
  private dead = false;

  constructor(
    readonly memoryBytes: number,
    private readonly logger: Logger,
    /** Pyodide's memory right after a load (makeSnapshot): restoring it is faster than loading. */
    snapshot?: SharedArrayBuffer,
  ) {
    this.worker = moduleWorker(import.meta.url, './wasm-worker', {
      workerData: { ctl: this.ctl.buffer, ...(snapshot ? { snapshot } : {}) },
      resourceLimits: heapLimits(memoryBytes),
      env: {}, // the worker's process.env: nothing of the host
      argv: [],
      stdout: true,
      stderr: true,
    });
    liveThreads++;
    // Nothing of the worker reaches the console (library code is silent); logged at debug.
    for (const s of [this.worker.stdout, this.worker.stderr])
      s.on('data', (b: Buffer) =>
        this.logger.debug({ wasm: b.toString('utf8').slice(0, 500) }, 'wasm worker output'),
      );
    let exitedOom = false;
    this.gone = new Promise((resolve) => {
      this.worker.on('error', (e: Error & { code?: string }) => {
        if (e.code === 'ERR_WORKER_OUT_OF_MEMORY') exitedOom = true;
        else this.logger.debug({ err: e.message }, 'wasm worker error');
      });
      this.worker.on('exit', () => {
        this.dead = true;
        liveThreads--;
        resolve({ oom: exitedOom });
      });
    });
    this.ready = new Promise((resolve, reject) => {
      this.handler = (m) => {
        if (m.t === 'ready') resolve(m.versions);
        else if (m.t === 'failed')
          reject(
            new AirlockError('BACKEND_UNAVAILABLE', `the wasm interpreters failed to load: ${m.message}`),
          );
      };
      void this.gone.then(() =>
        reject(new AirlockError('BACKEND_UNAVAILABLE', 'the wasm worker ended while loading')),
      );
    });
    this.ready.catch(() => {});
    this.worker.on('message', (raw: unknown) => {
      const m = FromWorkerSchema.safeParse(raw);
      if (!m.success) {
        this.logger.warn(
          { issue: m.error.issues[0]?.message },
          'dropped a malformed message from a wasm worker',
        );
        return;
      }
      this.handler?.(m.data);
    });
  }

  get alive(): boolean {
    return !this.dead;
  }

  onMessage(h: (m: FromWorker) => void): void {
    this.handler = h;
  }

  send(m: ToWorker): void {
    if (!this.dead) this.worker.postMessage(m);
  }

  /** Ask the running job to stop: Python gets KeyboardInterrupt, QuickJS an uncatchable interrupt, sleep wakes. */
  stop(): void {
    Atomics.store(this.ctl, CTL.STOP, 1);
    Atomics.store(this.ctl, CTL.PY_SIGNAL, 2);
    Atomics.notify(this.ctl, CTL.STOP);
  }

  /** Clear the stop flags before the next job. */
  clearStop(): void {
    Atomics.store(this.ctl, CTL.STOP, 0);
    Atomics.store(this.ctl, CTL.PY_SIGNAL, 0);
  }

  /** End the thread (whatever it runs). Resolves once it is gone. */
  async terminate(): Promise<void> {
    if (!this.dead) await this.worker.terminate();
    await this.gone;
  }
}
