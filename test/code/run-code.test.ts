// sbx.runCode and code contexts on the namespaces tier (issue 34): real kernels (python3 and node
// from the host's /usr, seen read-only by the sandbox; bash) inside real sandboxes.
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import {
  Airlock,
  AirlockError,
  CodeDeniedError,
  type CodeAuditEvent,
  type Sandbox,
} from '../../src/index.js';
import {
  NO_RESIDUE,
  SKIP_REASON,
  TEST_STATE_DIR,
  TEST_UID_RANGE,
  canRunNamespaces,
  settledResidue,
} from '../helpers.js';

// The deny tests need the real analysis (src/guard/code, landing in parallel): they run once it finds
// the obfuscated exec below.
const OBFUSCATED = 'import base64\nexec(base64.b64decode("cHJpbnQoMSk="))';

const PNG_SIGNATURE = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);

describe.skipIf(!canRunNamespaces)(`runCode on namespaces (${SKIP_REASON})`, () => {
  let airlock: Airlock;
  let sbx: Sandbox;
  const audit: CodeAuditEvent[] = [];

  beforeAll(async () => {
    // The runtime's audit option gets every decision (tested below).
    airlock = new Airlock({
      stateDir: TEST_STATE_DIR,
      uidRange: TEST_UID_RANGE,
      audit: (e) => {
        if (e.kind === 'code') audit.push(e);
      },
    });
    sbx = await airlock.create({});
  });

  afterAll(async () => {
    await sbx?.kill();
    await airlock?.close();
    expect(await settledResidue()).toEqual(NO_RESIDUE);
  });

  test('python: the last expression is the main result, print is stdout', async () => {
    const r = await sbx.runCode('x = 41\nprint("hello")\nx + 1');
    expect(r.error).toBeNull();
    expect(r.stdout).toBe('hello\n');
    expect(r.results).toEqual([{ isMainResult: true, text: '42' }]);
    const none = await sbx.runCode('y = 1');
    expect(none.results).toEqual([]);
  });

  test('python: an exception is the Execution error with a traceback from the cell', async () => {
    const r = await sbx.runCode('def f():\n    return 1 / 0\nf()');
    expect(r.error?.name).toBe('ZeroDivisionError');
    expect(r.error?.value).toBe('division by zero');
    expect(r.error?.traceback).toContain('line 2, in f');
    expect(r.error?.traceback).not.toContain('_run'); // no kernel frames
    const syntax = await sbx.runCode('def (:');
    expect(syntax.error?.name).toBe('SyntaxError');
  });

  test('python: display() and _repr_html_ give rich results; subprocess output is stdout', async () => {
    const code = [
      'class T:',
      '    def _repr_html_(self): return "<b>t</b>"',
      '    def __repr__(self): return "T()"',
      'display(T())',
      'import subprocess; subprocess.run(["echo", "from-child"])',
      'T()',
    ].join('\n');
    const r = await sbx.runCode(code);
    expect(r.results).toEqual([
      { isMainResult: false, html: '<b>t</b>', text: 'T()' },
      { isMainResult: true, html: '<b>t</b>', text: 'T()' },
    ]);
    expect(r.stdout).toBe('from-child\n');
  });

  test('python: a matplotlib figure comes back as a PNG (Debian python3-matplotlib)', async () => {
    const r = await sbx.runCode('import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.title("t")', {
      timeoutMs: 120_000,
    });
    expect(r.error).toBeNull();
    const figs = r.results.filter((x) => x.png !== undefined && !x.isMainResult);
    expect(figs).toHaveLength(1);
    expect(Buffer.from(figs[0]!.png!, 'base64').subarray(0, 8)).toEqual(PNG_SIGNATURE);
    // Figures are closed after the cell: the next cell returns none.
    const next = await sbx.runCode('import matplotlib.pyplot as plt\nlen(plt.get_fignums())');
    expect(next.results).toEqual([{ isMainResult: true, text: '0' }]);
  });

  test('contexts keep state; two contexts and two sandboxes are independent', async () => {
    const a = await sbx.createCodeContext({ language: 'python' });
    const b = await sbx.createCodeContext();
    expect(b.language).toBe('python');
    await sbx.runCode('secret = "a"\nimport json', { context: a });
    await sbx.runCode('secret = "b"', { context: b });
    expect((await sbx.runCode('secret + json.dumps(1)', { context: a })).results[0]?.text).toBe("'a1'");
    expect((await sbx.runCode('secret', { context: b })).results[0]?.text).toBe("'b'");
    // A one-shot run sees neither.
    expect((await sbx.runCode('secret')).error?.name).toBe('NameError');
    const other = await airlock.create({});
    try {
      const c = await other.createCodeContext();
      expect((await other.runCode('secret', { context: c })).error?.name).toBe('NameError');
      // A context of one sandbox is unknown to another.
      await expect(other.runCode('1', { context: a })).rejects.toMatchObject({
        code: 'CODE_CONTEXT_NOT_FOUND',
      });
    } finally {
      await other.kill();
    }
    expect((await sbx.listCodeContexts()).map((c) => c.id).sort()).toEqual([a.id, b.id].sort());
    await sbx.closeCodeContext(a);
    await expect(sbx.runCode('secret', { context: a })).rejects.toMatchObject({
      code: 'CODE_CONTEXT_NOT_FOUND',
    });
    await expect(sbx.closeCodeContext(a)).rejects.toMatchObject({ code: 'CODE_CONTEXT_NOT_FOUND' });
    await sbx.closeCodeContext(b.id);
    expect(await sbx.listCodeContexts()).toEqual([]);
  });

  test('a context runs in its cwd with its envs; per-run envs do not stay (python)', async () => {
    const ctx = await sbx.createCodeContext({ cwd: '/tmp', envs: { CTX_VAR: 'c' } });
    const r = await sbx.runCode(
      'import os\n(os.getcwd(), os.environ["CTX_VAR"], os.environ.get("RUN_VAR"))',
      {
        context: ctx,
        envs: { RUN_VAR: 'r' },
      },
    );
    expect(r.results[0]?.text).toBe("('/tmp', 'c', 'r')");
    expect((await sbx.runCode('os.environ.get("RUN_VAR")', { context: ctx })).results).toEqual([]);
    await sbx.closeCodeContext(ctx);
  });

  test('javascript: completion value, JSON results, persistent state, top-level await, errors', async () => {
    const one = await sbx.runCode('console.log("hi"); ({ a: [1, 2] })', { language: 'javascript' });
    expect(one.stdout).toBe('hi\n');
    expect(one.results).toEqual([{ isMainResult: true, text: '{ a: [ 1, 2 ] }', json: { a: [1, 2] } }]);
    const ctx = await sbx.createCodeContext({ language: 'javascript' });
    await sbx.runCode('let n = 2; function twice(x) { return x * 2 }', { context: ctx });
    const awaited = await sbx.runCode('const v = await Promise.resolve(twice(n))\nv + 1', { context: ctx });
    expect(awaited.results[0]?.text).toBe('5');
    expect((await sbx.runCode('v * 10', { context: ctx })).results[0]?.text).toBe('40');
    const err = await sbx.runCode('null.x', { context: ctx });
    expect(err.error?.name).toBe('TypeError');
    expect(err.error?.traceback).toContain('TypeError');
    expect(err.error?.traceback).not.toContain('[eval]');
    const thrown = await sbx.runCode('throw "plain"', { context: ctx });
    expect(thrown.error).toMatchObject({ name: 'Error', value: 'plain' });
    await sbx.closeCodeContext(ctx);
  });

  test('typescript: transpiled, not type-checked; a syntax error is the run error', async () => {
    const r = await sbx.runCode('const n: number = "not a number" as unknown as number\ntypeof n', {
      language: 'typescript',
    });
    expect(r.error).toBeNull();
    expect(r.results[0]?.text).toBe('string');
    const ctx = await sbx.createCodeContext({ language: 'typescript' });
    await sbx.runCode('interface P { x: number }\nvar p: P = { x: 3 }', { context: ctx });
    expect((await sbx.runCode('p.x * 2', { context: ctx })).results[0]?.text).toBe('6');
    const bad = await sbx.runCode('const = ;', { language: 'typescript' });
    expect(bad.error?.name).toBe('SyntaxError');
    await expect(sbx.runCode('1', { context: ctx, language: 'javascript' })).rejects.toMatchObject({
      code: 'INVALID_ARGUMENT',
      field: 'language',
    });
  });

  test('bash: env, cwd and functions persist in a context; a failing last command is the error', async () => {
    const ctx = await sbx.createCodeContext({ language: 'bash' });
    await sbx.runCode('export GREETING=hi\ncd /tmp\nsay() { echo "$GREETING $1"; }', { context: ctx });
    const r = await sbx.runCode('say there; pwd', { context: ctx });
    expect(r.stdout).toBe('hi there\n/tmp\n');
    expect(r.error).toBeNull();
    const fail = await sbx.runCode('echo out; echo err >&2; false', { context: ctx });
    expect(fail.stdout).toBe('out\n');
    expect(fail.stderr).toBe('err\n');
    expect(fail.error?.name).toBe('ExitError');
    // The cell cannot read the commands: its stdin is /dev/null.
    expect((await sbx.runCode('cat; echo done', { context: ctx })).stdout).toBe('done\n');
    await sbx.closeCodeContext(ctx);
  });

  test('streaming: stdout and results arrive while the cell runs, in order', async () => {
    const events: string[] = [];
    const code = [
      'import os, time',
      'print("ready", flush=True)',
      'display(1)',
      'while not os.path.exists("/tmp/go-stream"): time.sleep(0.01)',
      'print("after")',
    ].join('\n');
    const r = await sbx.runCode(code, {
      onStdout: (t) => {
        events.push(`out:${t}`);
        // The cell waits for this file: it exists only because the first line streamed.
        if (t.includes('ready')) void sbx.files.write('/tmp/go-stream', 'x');
      },
      onResult: (res) => events.push(`result:${res.text ?? ''}`),
    });
    expect(r.error).toBeNull();
    // Consecutive stdout chunks joined (the kernel's stdout is unbuffered: print may write twice).
    const joined = events.reduce<string[]>((acc, e) => {
      const last = acc.at(-1);
      if (last?.startsWith('out:') && e.startsWith('out:')) acc[acc.length - 1] = last + e.slice(4);
      else acc.push(e);
      return acc;
    }, []);
    expect(joined).toEqual(['out:ready\n', 'result:1', 'out:after\n']);
  });

  test('a timeout kills the context and restarts it empty on its next use', async () => {
    const ctx = await sbx.createCodeContext();
    await sbx.runCode('kept = 1', { context: ctx });
    const r = await sbx.runCode('print("started", flush=True)\nimport time\ntime.sleep(600)', {
      context: ctx,
      timeoutMs: 1000,
    });
    expect(r.error?.name).toBe('TimeoutError');
    expect(r.error?.value).toContain('state');
    expect(r.stdout).toBe('started\n');
    const after = await sbx.runCode('kept', { context: ctx });
    expect(after.error?.name).toBe('NameError');
    expect((await sbx.runCode('1 + 1', { context: ctx })).results[0]?.text).toBe('2');
    await sbx.closeCodeContext(ctx);
  });

  test('abort kills the run like a timeout; aborted before it starts is ABORTED', async () => {
    const ctx = await sbx.createCodeContext({ language: 'javascript' });
    await sbx.runCode('globalThis.kept = 1', { context: ctx });
    const ac = new AbortController();
    const r = await sbx.runCode('console.log("spin"); for (;;) {}', {
      context: ctx,
      signal: ac.signal,
      onStdout: () => ac.abort(),
    });
    expect(r.error?.name).toBe('AbortError');
    expect((await sbx.runCode('typeof kept', { context: ctx })).results[0]?.text).toBe('undefined');
    await expect(sbx.runCode('1', { signal: ac.signal })).rejects.toMatchObject({ code: 'ABORTED' });
    await sbx.closeCodeContext(ctx);
  });

  test('output the code writes cannot forge frames: fake frames on stdout or fd 3 are data', async () => {
    const fake = '\\x1e\\x1eAL:00112233445566778899aabb:{"t":"result","isMainResult":true,"text":"forged"}';
    const code = [
      'import os',
      `print('${fake}')`,
      `os.write(1, b'${fake}\\n\\x1e\\x1eAL:00112233445566778899aabb:{"t":"end"}\\n')`,
      'try:',
      `    os.write(3, b'${fake}\\n')`,
      'except OSError as e:',
      '    print("fd3", e.errno)',
      '"real"',
    ].join('\n');
    const r = await sbx.runCode(code);
    expect(r.results).toEqual([{ isMainResult: true, text: "'real'" }]);
    expect(r.stdout.split('forged').length - 1).toBe(2);
    expect(r.stdout).toContain('fd3 9'); // EBADF: fd 3 is the read end of the command pipe
    const js = await sbx.runCode(
      `require('fs').writeSync(1, '${fake}\\n'); process.stdout.write('${fake}\\n'); 7`,
      { language: 'javascript' },
    );
    expect(js.results).toEqual([{ isMainResult: true, text: '7' }]);
    const sh = await sbx.runCode(`printf '%b\\n' '${fake.replace(/\\x1e/g, '\\036')}'; echo ok`, {
      language: 'bash',
    });
    expect(sh.results).toEqual([]);
    expect(sh.stdout).toContain('forged');
  });

  test('a kernel that breaks the protocol is killed with a typed run error, never a hang', async () => {
    const ctx = await sbx.createCodeContext();
    await sbx.runCode('kept = 1', { context: ctx });
    // Code that steals the run id (it runs in the kernel's process) can send garbage frames.
    const garbage = await sbx.runCode(
      'import __main__, os\nos.write(1, ("\\x1e\\x1eAL:%s:not json\\n" % __main__._run_id).encode())',
      { context: ctx },
    );
    expect(garbage.error?.name).toBe('KernelProtocolError');
    expect((await sbx.runCode('kept', { context: ctx })).error?.name).toBe('NameError');
    // A frame that never ends is cut at the frame bound.
    const huge = await sbx.runCode(
      'import __main__, os\nos.write(1, ("\\x1e\\x1eAL:%s:" % __main__._run_id).encode())\nchunk = b"x" * (1 << 20)\nfor _ in range(40): os.write(1, chunk)',
      { context: ctx },
    );
    expect(huge.error?.name).toBe('KernelProtocolError');
    expect(huge.error?.value).toContain('longer than');
    await sbx.closeCodeContext(ctx);
  });

  test('huge output is capped in the Execution (the callback sees it stream)', async () => {
    let streamed = 0;
    const r = await sbx.runCode('import sys\nfor _ in range(8): sys.stdout.write("y" * (1 << 20))\n"end"', {
      onStdout: (t) => (streamed += t.length),
    });
    expect(r.error).toBeNull();
    expect(streamed).toBe(8 << 20);
    expect(r.stdout.length).toBeLessThan((1 << 20) + 200);
    expect(r.stdout).toContain('bytes of stdout omitted');
    expect(r.results[0]?.text).toBe("'end'");
  });

  test('bad input: unknown context, unknown language, bad timeout, bad envs', async () => {
    await expect(sbx.runCode('1', { context: { id: 'ctx-nope', language: 'python' } })).rejects.toMatchObject(
      {
        code: 'CODE_CONTEXT_NOT_FOUND',
      },
    );
    await expect(sbx.runCode('1', { language: 'ruby' as never })).rejects.toMatchObject({
      code: 'INVALID_ARGUMENT',
      field: 'language',
    });
    await expect(sbx.createCodeContext({ language: 'cobol' as never })).rejects.toMatchObject({
      code: 'INVALID_ARGUMENT',
    });
    await expect(sbx.runCode('1', { timeoutMs: -1 })).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    await expect(sbx.runCode('1', { envs: { 'A=B': 'x' } })).rejects.toMatchObject({
      code: 'INVALID_ARGUMENT',
    });
    await expect(sbx.createCodeContext({ cwd: 'relative' })).rejects.toMatchObject({
      code: 'INVALID_ARGUMENT',
    });
    await expect(sbx.runCode(42 as never)).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
  });

  test('every run is reported to the code events and the audit sink', async () => {
    const seen: CodeAuditEvent[] = [];
    const off = sbx.onCode((e) => seen.push(e));
    audit.length = 0;
    await sbx.runCode('1 + 1', { language: 'python' });
    off();
    await sbx.runCode('2');
    expect(seen).toHaveLength(1);
    expect(seen[0]).toMatchObject({ kind: 'code', sandboxId: sbx.id, language: 'python', decision: 'allow' });
    expect(audit.map((e) => e.kind)).toEqual(['code', 'code']);
  });

  test('a denied run never executes; its findings go to the events and the audit', async () => {
    const seen: CodeAuditEvent[] = [];
    const off = sbx.onCode((e) => seen.push(e));
    audit.length = 0;
    const code = `open("/tmp/denied-ran", "w").write("x")\n${OBFUSCATED}`;
    const policy = { rules: { 'obfuscated-exec': 'deny' as const } };
    const err = await sbx.runCode(code, { policy }).catch((e: unknown) => e);
    off();
    expect(AirlockError.is(err, 'CODE_DENIED')).toBe(true);
    expect(err).toBeInstanceOf(CodeDeniedError);
    const denied = err as CodeDeniedError;
    expect(denied.message).toContain('obfuscated-exec');
    expect(denied.findings.some((f) => f.rule === 'obfuscated-exec' && f.action === 'deny')).toBe(true);
    expect(denied.toJSON().findings).toEqual(denied.findings);
    expect(await sbx.files.exists('/tmp/denied-ran')).toBe(false);
    expect(seen).toEqual([expect.objectContaining({ decision: 'deny', code: 'CODE_DENIED' })]);
    expect(audit).toEqual([expect.objectContaining({ kind: 'code', decision: 'deny', sandboxId: sbx.id })]);
    // warn: it runs, and the findings come back with the Execution.
    const warned = await sbx.runCode(code, { policy: { rules: { 'obfuscated-exec': 'warn' } } });
    expect(warned.error).toBeNull();
    expect(warned.stdout).toBe('1\n');
    expect(warned.findings.some((f) => f.rule === 'obfuscated-exec' && f.action === 'warn')).toBe(true);
  });

  test('the spec codePolicy applies; a run policy wins over it', async () => {
    const strict = await airlock.create({ codePolicy: { rules: { 'obfuscated-exec': 'deny' } } });
    try {
      await expect(strict.runCode(OBFUSCATED)).rejects.toMatchObject({ code: 'CODE_DENIED' });
      const allowed = await strict.runCode(OBFUSCATED, { policy: { rules: { 'obfuscated-exec': 'allow' } } });
      expect(allowed.stdout).toBe('1\n');
    } finally {
      await strict.kill();
    }
  });

  test('a codePolicy that is not a policy is INVALID_SPEC', async () => {
    await expect(
      airlock.create({ codePolicy: { rules: { 'Bad Rule': 'deny' } } as never }),
    ).rejects.toMatchObject({
      code: 'INVALID_SPEC',
    });
  });

  test('kill during a run rejects with SANDBOX_GONE and leaves nothing', async () => {
    const victim = await airlock.create({});
    const ctx = await victim.createCodeContext();
    const run = victim.runCode('print("up", flush=True)\nimport time\ntime.sleep(600)', {
      context: ctx,
      onStdout: () => void victim.kill(),
    });
    await expect(run).rejects.toSatisfy((e) => AirlockError.is(e, 'SANDBOX_GONE'));
    await expect(victim.runCode('1')).rejects.toMatchObject({ code: 'SANDBOX_GONE' });
  });
});
