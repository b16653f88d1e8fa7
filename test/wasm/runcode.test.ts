// The WASM tier's runCode hook (BackendSandbox.runCode, src/backends/wasm/) called on the backend
// directly, and what the tier promises about isolation, attacked from inside: no network (a loopback
// server the test runs sees no connection), no host filesystem, no Node APIs, no code from strings
// (the Function constructor Python could reach through Pyodide's FFI), nothing loaded from outside.
import { createServer, type Server } from 'node:net';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import type { BackendSandbox } from '../../src/core/backend.js';
import type { BackendExecution, BackendRunCodeRequest } from '../../src/core/code.js';
import { silentLogger } from '../../src/core/backend.js';
import { parseSandboxSpec } from '../../src/core/spec.js';
import { WasmBackend } from '../../src/backends/wasm/index.js';
import { wasmThreads } from '../../src/backends/wasm/thread.js';
import { Sandbox } from '../../src/index.js';
import { TEST_STATE_DIR, testAirlock } from '../helpers.js';
import { expectError } from '../contract/support.js';

vi.setConfig({ testTimeout: 180_000, hookTimeout: 240_000 });

describe('wasm tier: runCode and isolation', () => {
  let backend: WasmBackend;
  let sbx: BackendSandbox;
  let server: Server;
  let port = 0;
  let connections = 0;

  const run = (code: string, o: Partial<BackendRunCodeRequest> = {}): Promise<BackendExecution> =>
    sbx.runCode!({ code, language: 'python', timeoutMs: 30_000, envs: {}, ...o });

  beforeAll(async () => {
    server = createServer((s) => {
      connections++;
      s.destroy();
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    port = (server.address() as { port: number }).port;
    backend = new WasmBackend({ stateDir: TEST_STATE_DIR, logger: silentLogger });
    sbx = await backend.create(parseSandboxSpec({ backend: 'wasm' }));
  });
  afterAll(async () => {
    await sbx?.destroy();
    await backend?.close();
    await new Promise((r) => server?.close(r));
  });

  it('python: the last expression is the result (text and json), stdout and stderr are captured and streamed', async () => {
    const chunks: string[] = [];
    const r = await run('import sys\nprint("hello")\nprint("warn", file=sys.stderr)\n{"a": [1, 2]}', {
      onStdout: (c) => chunks.push(c),
    });
    expect(r).toEqual({
      results: [{ text: "{'a': [1, 2]}", json: { a: [1, 2] }, isMainResult: true }],
      stdout: 'hello\n',
      stderr: 'warn\n',
      error: null,
    });
    expect(chunks.join('')).toBe('hello\n');
    expect((await run('x = 1')).results).toEqual([]);
    expect((await run('object()')).results[0]?.text).toMatch(/^<object object at/);
  });

  it('python errors come back as { name, value, traceback } with the user’s frames only', async () => {
    const r = await run('def f(x):\n    return 1 / x\nf(0)');
    expect(r.error).toMatchObject({ name: 'ZeroDivisionError', value: 'division by zero' });
    expect(r.error!.traceback).toContain('File "<cell>", line 2, in f');
    expect(r.error!.traceback).not.toMatch(/<airlock>|_base\.py/);
    expect((await run('def (')).error?.name).toBe('SyntaxError');
  });

  it('contexts keep state, are independent, and closeCodeContext drops them', async () => {
    await run('x = 41\nimport math', { contextId: 'a' });
    await run('x = "other"', { contextId: 'b' });
    expect((await run('x + 1', { contextId: 'a' })).results[0]?.text).toBe('42');
    expect((await run('x', { contextId: 'b' })).results[0]?.text).toBe("'other'");
    expect((await run('x')).error?.name).toBe('NameError'); // a one-shot context is fresh
    await sbx.closeCodeContext!('a');
    expect((await run('x', { contextId: 'a' })).error?.name).toBe('NameError');
    await sbx.closeCodeContext!('never-was');
  });

  it('javascript runs in QuickJS with its own contexts; typescript is transpiled; bash is refused', async () => {
    const js = (code: string, contextId?: string): Promise<BackendExecution> =>
      run(code, { language: 'javascript', ...(contextId ? { contextId } : {}) });
    expect(await js('console.log("hi", {a: 1}); let y = 5; ({ y, list: [1, 2] })', 'j')).toEqual({
      results: [{ text: '{"y":5,"list":[1,2]}', json: { y: 5, list: [1, 2] }, isMainResult: true }],
      stdout: 'hi {"a":1}\n',
      stderr: '',
      error: null,
    });
    expect((await js('y * 3', 'j')).results[0]?.json).toBe(15);
    expect((await js('Promise.resolve(7)')).results[0]?.json).toBe(7);
    const err = await js('function f() { throw new RangeError("too far") }\nf()');
    expect(err.error).toMatchObject({ name: 'RangeError', value: 'too far' });
    expect(err.error!.traceback).toContain('at f');
    const ts = await run('const n: number = 2; interface P { q: string }\nn * 21', {
      language: 'typescript',
    });
    expect(ts.results[0]?.json).toBe(42);
    await expectError(run('echo hi', { language: 'bash' }), 'INVALID_ARGUMENT', 'language');
  });

  it('a timeout interrupts the run (python and javascript) and the context lives on', async () => {
    await run('kept = "yes"', { contextId: 't' });
    const py = await run('while True: pass', { contextId: 't', timeoutMs: 500 });
    expect(py.error?.name).toBe('TimeoutError');
    expect((await run('kept', { contextId: 't' })).results[0]?.text).toBe("'yes'");
    const js = await run('for (;;) {}', { language: 'javascript', timeoutMs: 500 });
    expect(js.error?.name).toBe('TimeoutError');
    const ac = new AbortController();
    const p = run('while True: pass', { signal: ac.signal });
    setTimeout(() => ac.abort(), 300);
    expect((await p).error?.name).toBe('AbortError');
    await expectError(run('1', { signal: AbortSignal.abort() }), 'ABORTED');
  });

  it('code that swallows the interrupt costs the worker: its contexts are then CODE_CONTEXT_NOT_FOUND', async () => {
    const before = wasmThreads();
    await run('v = 1', { contextId: 'doomed' });
    const r = await run(
      'while True:\n    try:\n        while True: pass\n    except BaseException:\n        pass',
      {
        contextId: 'doomed',
        timeoutMs: 300,
      },
    );
    expect(r.error?.name).toBe('TimeoutError');
    expect(r.error?.value).toContain('contexts and in-memory files are gone');
    await expectError(run('v', { contextId: 'doomed' }), 'CODE_CONTEXT_NOT_FOUND', 'context');
    expect((await run('2 + 2')).results[0]?.text).toBe('4');
    expect(wasmThreads()).toBeLessThanOrEqual(before + 1); // the old worker is gone (a warm one may wait)
  });

  it('no network: fetch, pyfetch and XMLHttpRequest fail, and the loopback server sees nothing', async () => {
    const url = `http://127.0.0.1:${port}/`;
    const probes = [
      'from js import fetch',
      'import js; js.XMLHttpRequest',
      'import pyodide_js; pyodide_js.loadPackage("micropip")',
      'import micropip',
      `import pyodide.http\nimport asyncio\nasyncio.get_event_loop().run_until_complete(pyodide.http.pyfetch("${url}"))`,
      `import pyodide.http\npyodide.http.open_url("${url}")`,
      `import urllib.request\nurllib.request.urlopen("${url}", timeout=2)`,
      `import socket\nsocket.create_connection(("127.0.0.1", ${port}), timeout=2)`,
    ];
    for (const code of probes) {
      const r = await run(code);
      expect({ code, failed: r.error !== null }).toEqual({ code, failed: true });
    }
    const js = await run(`fetch("${url}")`, { language: 'javascript' });
    expect(js.error?.name).toBe('ReferenceError');
    expect(connections).toBe(0);
  });

  it('no Node from Python: no js.require/js.process, no Function constructor, no host mounts or eval bridge', async () => {
    const probes: Array<[string, RegExp]> = [
      ['from js import require', /ImportError/],
      ['import js; js.process', /AttributeError/],
      ['import js; js.globalThis', /AttributeError/],
      [
        'import pyodide_js; pyodide_js.runPython.constructor("return 1")()',
        /not available in the wasm sandbox/,
      ],
      [
        'import pyodide_js; pyodide_js.runPython.constructor.new("return 1")',
        /not available in the wasm sandbox/,
      ],
      [
        'import pyodide_js; f = pyodide_js.runPython\nf.constructor.prototype.constructor("return 1")()',
        /not available in the wasm sandbox/,
      ],
      ['import pyodide_js; pyodide_js.mountNodeFS("/host", "/")', /not available in the wasm sandbox/],
      ['import pyodide_js; pyodide_js.FS.filesystems.NODEFS', /AttributeError/],
      ['from pyodide.code import run_js; run_js("1")', /ImportError|not available/],
    ];
    for (const [code, expected] of probes) {
      const r = await run(code);
      expect({ code, error: `${r.error?.name}: ${r.error?.value}` }).toEqual({
        code,
        error: expect.stringMatching(expected),
      });
    }
  });

  it("Node's host modules are dead in the worker: a file load Pyodide would do through them fails", async () => {
    // loadBinaryFile reads through the fs module Pyodide took at load time: the lockdown replaced
    // its functions in this worker, so the read fails (asynchronously: checked in a second cell).
    await run(
      'import pyodide_js\nout = []\npyodide_js._api.loadBinaryFile("/etc/passwd")' +
        '.then(lambda b: out.append("read %d bytes" % b.length), lambda e: out.append("failed: " + str(e)))',
      { contextId: 'lb' },
    );
    let out: unknown;
    for (let i = 0; i < 50 && !(Array.isArray(out) && out.length); i++) {
      await new Promise((r) => setTimeout(r, 100));
      out = (await run('out', { contextId: 'lb' })).results[0]?.json;
    }
    expect(out).toEqual([expect.stringMatching(/^failed: .*not available in the wasm sandbox/)]);
  });

  it('the host environment does not leak (os.environ is the spec env, and the worker has no process.env)', async () => {
    process.env.AIRLOCK_WASM_HOST_CANARY = 'host-secret';
    try {
      const r = await run('import os\nsorted(os.environ.items())', { envs: { ONLY: 'me' } });
      expect(r.results[0]?.json).toEqual([['ONLY', 'me']]);
    } finally {
      delete process.env.AIRLOCK_WASM_HOST_CANARY;
    }
  });

  it('sbx.runCode runs on the wasm tier', async () => {
    const airlock = testAirlock();
    try {
      const s = await Sandbox.create({ backend: 'wasm' }, { airlock });
      const exec = await (s as unknown as { runCode(c: string): Promise<BackendExecution> }).runCode('1 + 1');
      expect(exec.results[0]?.text).toBe('2');
    } finally {
      await airlock.killAll();
      await airlock.close();
    }
  });
});
