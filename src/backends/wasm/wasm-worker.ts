// The worker thread of one WASM sandbox: Pyodide (CPython compiled to WebAssembly) and QuickJS, an
// in-memory filesystem (Pyodide's MEMFS) and nothing of the host. Loaded ahead (a warm worker holds
// only the loaded interpreters), claimed by exactly one sandbox, never reused. Jobs arrive one at a
// time (the sandbox queues them); a stop is a flag in shared memory the interpreters poll.
import { createRequire } from 'node:module';
import { dirname } from 'node:path';
import { parentPort, workerData } from 'node:worker_threads';
import { loadPyodide, type PyodideAPI } from 'pyodide';
import { getQuickJS, type QuickJSWASMModule } from 'quickjs-emscripten';
import { runBuiltin, type Io, type MemFs } from './builtins.js';
import { commandOf } from './commands.js';
import { lockRealm } from './lockdown.js';
import { CTL, type FromWorker, type ToWorker } from './protocol.js';
import { PYTHON_HELPER } from './python.js';
import { JsRunner } from './quickjs.js';

const port = parentPort!;
const post = (m: FromWorker): void => port.postMessage(m);
const data = workerData as { ctl: SharedArrayBuffer; snapshot?: SharedArrayBuffer; makeSnapshot?: boolean };
const ctl = new Int32Array(data.ctl);

// ---- memory cap on every WebAssembly memory of this worker ------------------------------------
// Pyodide's heap lives in a WebAssembly.Memory that grows on demand (V8's heap limits do not see
// it). A grow past the cap is refused: Emscripten's allocator then fails and Python raises
// MemoryError. Patched before anything loads; the original function stays in this closure only.
let memoryCap = Number.POSITIVE_INFINITY;
let oomHit = false;
interface WasmMemory {
  readonly buffer: ArrayBuffer;
  grow(delta: number): number;
}
const memoryProto = (globalThis as unknown as { WebAssembly: { Memory: { prototype: WasmMemory } } })
  .WebAssembly.Memory.prototype;
const realGrow = memoryProto.grow;
Object.defineProperty(memoryProto, 'grow', {
  value: function grow(this: WasmMemory, delta: number): number {
    if (this.buffer.byteLength + delta * 65536 > memoryCap) {
      oomHit = true;
      throw new RangeError('the sandbox memory limit (limits.memoryBytes) is reached');
    }
    return realGrow.call(this, delta);
  },
  writable: false,
  configurable: false,
});

// ---- the job being run: where its output goes ---------------------------------------------------
let jobId = -1;
const emit = (fd: 1 | 2, data: Uint8Array): void => {
  if (data.length) post({ t: 'out', id: jobId, fd, data: new Uint8Array(data) });
};
let stdinBytes = new Uint8Array(0);
let stdinAt = 0;

const pyodideDir = dirname(createRequire(import.meta.url).resolve('pyodide'));

async function load(): Promise<{ py: PyodideAPI; qjs: QuickJSWASMModule; helper: HelperFns }> {
  // Only from the package dir on disk (indexURL), nothing fetched: no packages are loaded, and
  // loadPackage/micropip are taken away below. A memory snapshot of a freshly loaded Pyodide (made
  // once per backend by a worker that runs nothing else) makes the load several times faster.
  const py = await loadPyodide({
    indexURL: `${pyodideDir}/`,
    ...(data.snapshot ? { _loadSnapshot: new Uint8Array(data.snapshot).slice() } : {}),
    packages: [],
    env: { HOME: '/home/user' },
    // The `js` module Python sees: nothing of the worker's globals (no fetch, no process).
    jsglobals: Object.create(null) as object,
    stdout: () => {},
    stderr: () => {},
  });
  py.setStdout({ write: (b: Uint8Array) => (emit(1, b), b.length), isatty: false });
  py.setStderr({ write: (b: Uint8Array) => (emit(2, b), b.length), isatty: false });
  py.setStdin({
    read: (buf: Uint8Array) => {
      const n = Math.min(buf.length, stdinBytes.length - stdinAt);
      buf.set(stdinBytes.subarray(stdinAt, stdinAt + n));
      stdinAt += n;
      return n;
    },
    isatty: false,
  });
  py.setInterruptBuffer(ctl.subarray(CTL.PY_SIGNAL, CTL.PY_SIGNAL + 1));
  const FS = py.FS;
  for (const d of ['/workspace', '/home/user', '/tmp']) FS.mkdirTree(d);
  // The root is read-only (no new top-level entries): what is writable is /workspace, /home/user,
  // /tmp, as on the other tiers. It is the sandbox's own memory either way; this keeps paths honest.
  FS.chmod('/', 0o555);
  const ns = py.globals.get('dict')();
  py.runPython(PYTHON_HELPER, { globals: ns, filename: '<airlock>' });
  const helper = {
    runMain: ns.get('run_main'),
    runCell: ns.get('run_cell'),
    closeContext: ns.get('close_context'),
  } as HelperFns;
  // Nothing may load code or files from outside: packages, host mounts, the JS eval bridge.
  const api = py as unknown as Record<string, unknown>;
  for (const k of [
    'loadPackage',
    'loadPackagesFromImports',
    'mountNodeFS',
    'mountNativeFS',
    'unpackArchive',
  ]) {
    Object.defineProperty(api, k, {
      value: () => {
        throw new Error(`pyodide.${k} is not available in the wasm sandbox`);
      },
      writable: false,
      configurable: false,
    });
  }
  const filesystems = (FS as unknown as { filesystems: Record<string, unknown> }).filesystems;
  for (const k of Object.keys(filesystems)) if (k !== 'MEMFS') delete filesystems[k];
  py.runPython(
    'import sys\nfor m in ("micropip", "pyodide_js._api"):\n    sys.modules.pop(m, None)\n' +
      'import pyodide.http\n',
  );
  const qjs = await getQuickJS();
  return { py, qjs, helper };
}

interface HelperFns {
  runMain(code: string, filename: string, argv: string[], env: unknown, cwd: string): number;
  runCell(code: string, contextId: string | undefined, env: unknown): { toJs(o: object): unknown[] };
  closeContext(id: string): void;
}

/** A snapshot-making worker: load, snapshot, hand it over, end. */
async function makeSnapshot(): Promise<void> {
  try {
    const py = await loadPyodide({ indexURL: `${pyodideDir}/`, packages: [], _makeSnapshot: true });
    const snap = (py as unknown as { makeMemorySnapshot(): Uint8Array }).makeMemorySnapshot();
    port.postMessage({ t: 'snapshot', data: snap }, [snap.buffer as ArrayBuffer]);
  } catch (e) {
    post({ t: 'failed', message: (e as Error)?.message ?? String(e) });
  }
  port.close();
}

const loaded = data.makeSnapshot ? new Promise<never>(() => void makeSnapshot()) : load();
let state: Awaited<typeof loaded> | undefined;
let js: JsRunner | undefined;

loaded.then(
  (s) => {
    state = s;
    lockRealm();
    post({
      t: 'ready',
      versions: {
        python: s.py.runPython('import sys; sys.version.split()[0]') as string,
        pyodide: s.py.version,
      },
    });
  },
  (e: unknown) => post({ t: 'failed', message: (e as Error)?.message ?? String(e) }),
);

port.on('message', (m: ToWorker) => {
  if (!state) return;
  if (m.t === 'claim') {
    memoryCap = m.memoryBytes;
    js = new JsRunner(state.qjs, ctl, m.memoryBytes, emit);
    return;
  }
  jobId = m.id;
  oomHit = false;
  // Stopped before it began (the flags are cleared by the main thread before each job).
  if (Atomics.load(ctl, CTL.STOP) !== 0) return done(m.id, 137);
  if (m.t === 'exec') return done(m.id, runExec(m));
  if (m.t === 'code') return runCode(m);
  if (m.t === 'closeContext') {
    state.helper.closeContext(m.contextId);
    js?.close(m.contextId);
    return done(m.id, 0);
  }
});

type CodeErr = { name: string; value: string; traceback: string } | null;

function done(id: number, exitCode: number, error: CodeErr = null): void {
  const stopped = Atomics.load(ctl, CTL.STOP) !== 0;
  post({ t: 'done', id, exitCode, stopped, oom: oomHit, error });
}

function pyEnv(env: Readonly<Record<string, string>>): unknown {
  return state!.py.toPy(env);
}

function runExec(m: ToWorker & { t: 'exec' }): number {
  const { py, helper } = state!;
  stdinBytes = m.stdin ? new Uint8Array(m.stdin) : new Uint8Array(0);
  stdinAt = 0;
  const io: Io = {
    fs: py.FS as unknown as MemFs,
    emit,
    stdin: stdinBytes,
    cwd: m.cwd,
    sleep: (ms) => Atomics.wait(ctl, CTL.STOP, 0, ms) !== 'timed-out',
  };
  const cmd = commandOf(m.argv);
  switch (cmd.kind) {
    case 'refuse':
      emit(2, new TextEncoder().encode(`${cmd.message}\n`));
      return cmd.exitCode;
    case 'builtin':
      return runBuiltin(cmd.argv, io);
    case 'javascript': {
      const source = cmd.code ?? readScript(io, cmd.path!);
      if (source === undefined) return 2;
      return js!.runScript(source, cmd.path ?? '<eval>');
    }
    case 'python': {
      const source = cmd.code ?? readScript(io, cmd.path!);
      if (source === undefined) return 2;
      const status = helper.runMain(source, cmd.path ?? '<string>', cmd.argv, pyEnv(m.env), m.cwd);
      if (status === -2) {
        oomHit = true;
        return 1;
      }
      return status;
    }
  }
}

function readScript(io: Io, path: string): string | undefined {
  if (path === '/dev/stdin') return new TextDecoder().decode(io.stdin);
  try {
    return new TextDecoder().decode(io.fs.readFile(path.startsWith('/') ? path : `${io.cwd}/${path}`));
  } catch {
    emit(2, new TextEncoder().encode(`airlock: can't open file '${path}': No such file or directory\n`));
    return undefined;
  }
}

function runCode(m: ToWorker & { t: 'code' }): void {
  if (m.language === 'javascript') {
    const r = js!.runCell(m.code, m.contextId, m.deadline);
    if (r.result) post({ t: 'result', id: m.id, result: r.result });
    if (r.oom) oomHit = true;
    return done(m.id, r.error ? 1 : 0, r.error);
  }
  const { helper } = state!;
  const proxy = helper.runCell(m.code, m.contextId, pyEnv(m.env));
  const [result, error, oom] = proxy.toJs({ dict_converter: Object.fromEntries }) as [
    { text: string; json?: unknown; isMainResult: boolean } | undefined,
    { name: string; value: string; traceback: string } | undefined,
    boolean,
  ];
  if (result) post({ t: 'result', id: m.id, result });
  if (oom) oomHit = true;
  done(m.id, error ? 1 : 0, error ?? null);
}
