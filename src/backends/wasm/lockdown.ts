// Runs inside a WASM sandbox's worker thread, once its interpreters are loaded and before any user
// code: takes from the worker's JS realm everything that reaches outside it. Pyodide's FFI lets
// Python call any JS function it can reach (`from js import …`, `.constructor` of any proxy → the
// Function constructor → any JS source), so the realm itself must be harmless, not only the `js`
// module Python sees:
// - the globals that do I/O (fetch, XMLHttpRequest, WebSocket, BroadcastChannel, process, …) go;
// - Node's built-in modules that reach the host (fs, child_process, net, worker_threads, …) have
//   every function replaced by one that throws, in this worker's own copies (each worker thread has
//   its own module instances; the main thread's are untouched) — a dynamic `import('node:fs')` or a
//   function Pyodide captured at load time gets the same replaced functions;
// - `process` loses binding/dlopen/kill/env before it leaves the global scope.
// What stays: pure computation, WebAssembly, timers, the worker's own message port held in the
// worker module's closure.
import { createRequire, syncBuiltinESMExports } from 'node:module';

const require = createRequire(import.meta.url);
const sync = syncBuiltinESMExports;

/** Built-in modules whose functions are replaced in this worker. */
const HOST_MODULES = [
  'fs',
  'fs/promises',
  'child_process',
  'net',
  'tls',
  'dgram',
  'dns',
  'dns/promises',
  'http',
  'https',
  'http2',
  'inspector',
  'worker_threads',
  'cluster',
  'module',
  'os',
  'v8',
  'vm',
  'wasi',
  'repl',
  'trace_events',
];

/** Globals that do I/O or talk to other threads. */
const IO_GLOBALS = [
  'fetch',
  'XMLHttpRequest',
  'WebSocket',
  'EventSource',
  'BroadcastChannel',
  'MessageChannel',
  'MessagePort',
  'Request',
  'Response',
  'Headers',
  'FormData',
  'navigator',
  'require',
  'module',
  'exports',
  '__filename',
  '__dirname',
  'Buffer',
  'process',
  'global',
];

function denied(name: string): () => never {
  return () => {
    throw new Error(`${name} is not available in the wasm sandbox (no host access)`);
  };
}

/** Replace every function (and class) of `obj`, own and inherited-from-module, with a denial. */
function neuter(obj: Record<string, unknown>, label: string): void {
  for (const key of Object.getOwnPropertyNames(obj)) {
    const d = Object.getOwnPropertyDescriptor(obj, key);
    if (!d?.configurable && !d?.writable) continue;
    const v = d.get ? undefined : d.value;
    if (typeof v === 'function' || d.get) {
      try {
        Object.defineProperty(obj, key, {
          value: denied(`${label}.${key}`),
          writable: false,
          configurable: false,
        });
      } catch {
        // A non-configurable accessor: leave it (checked by the tests for what matters).
      }
    } else if (v && typeof v === 'object' && key === 'promises') {
      neuter(v as Record<string, unknown>, `${label}.promises`);
    }
  }
}

/**
 * No code from strings: `eval`, and the Function constructors (reachable from any function as
 * `.constructor`, which is how Python would get them through the FFI) are replaced by stand-ins that
 * refuse to run, keep `instanceof Function` working, and cannot be told apart by `.prototype`.
 */
function noCodeFromStrings(): void {
  const protos = [
    Function.prototype,
    Object.getPrototypeOf(async function () {}) as object,
    Object.getPrototypeOf(function* () {}) as object,
    Object.getPrototypeOf(async function* () {}) as object,
  ];
  for (const proto of protos) {
    const real = (proto as { constructor: (...a: unknown[]) => unknown }).constructor;
    const stub = new Proxy(real, {
      apply: denied('the Function constructor'),
      construct: denied('the Function constructor'),
    });
    Object.defineProperty(proto, 'constructor', { value: stub, writable: false, configurable: false });
    if (proto === Function.prototype)
      Object.defineProperty(globalThis, 'Function', { value: stub, writable: false, configurable: false });
  }
  Object.defineProperty(globalThis, 'eval', { value: denied('eval'), writable: false, configurable: false });
}

/** Make this worker's realm harmless. Call once, after the interpreters loaded, before user code. */
export function lockRealm(): void {
  const proc = process as unknown as Record<string, unknown>;
  for (const k of ['binding', '_linkedBinding', 'dlopen', 'kill', 'chdir', 'setuid', 'setgid', 'abort']) {
    try {
      Object.defineProperty(proc, k, { value: denied(`process.${k}`), writable: false, configurable: false });
    } catch {
      /* already locked */
    }
  }
  try {
    Object.defineProperty(proc, 'env', { value: Object.freeze({}), writable: false, configurable: false });
  } catch {
    /* already locked */
  }
  for (const m of HOST_MODULES) {
    let mod: Record<string, unknown> | undefined;
    try {
      mod = require(`node:${m}`) as Record<string, unknown>;
    } catch {
      continue; // not in this Node
    }
    neuter(mod, m);
  }
  // The ESM views (`import('node:fs')`) follow the CommonJS objects only when asked to. `sync` is
  // this module's binding to the original function (taken before `module` was neutered).
  sync();
  noCodeFromStrings();
  const g = globalThis as unknown as Record<string, unknown>;
  for (const k of IO_GLOBALS) {
    try {
      Object.defineProperty(g, k, { value: undefined, writable: false, configurable: false });
    } catch {
      delete g[k];
    }
  }
}
