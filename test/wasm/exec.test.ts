// The WASM tier through the public API (Sandbox.create({ backend: 'wasm' })): the exec subset
// (python- and node-like argv, a few builtins, 127 for the rest), the in-memory files, the memory
// cap, kill and TTL, and no worker thread left behind. Sandboxes are shared where that is honest:
// each one loads Pyodide (seconds on a loaded host).
import { randomBytes } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { Sandbox, type Airlock } from '../../src/index.js';
import { NOT_RUNNABLE } from '../../src/backends/wasm/commands.js';
import { wasmThreads } from '../../src/backends/wasm/thread.js';
import { testAirlock } from '../helpers.js';
import { expectError } from '../contract/support.js';

vi.setConfig({ testTimeout: 180_000, hookTimeout: 240_000 });
const MiB = 1024 * 1024;

describe('wasm tier: exec and files', () => {
  let airlock: Airlock;
  let sbx: Sandbox;

  beforeAll(async () => {
    airlock = testAirlock();
    sbx = await Sandbox.create({ backend: 'wasm', env: { SPEC_VAR: 'spec' } }, { airlock });
  });
  afterAll(async () => {
    await airlock?.killAll();
    await airlock?.close();
  });

  it('python: stdout, stderr, exit codes (SystemExit n, an uncaught error → 1 with its traceback)', async () => {
    const r = await sbx.exec([
      'python3',
      '-c',
      'import sys\nprint("out")\nprint("err", file=sys.stderr)\nsys.exit(3)',
    ]);
    expect(r).toMatchObject({ exitCode: 3, stdout: 'out\n', stderr: 'err\n', signal: null });
    expect(r.killedBy).toBeUndefined();
    const boom = await sbx.exec(['python', '-c', 'def f():\n    1/0\nf()']);
    expect(boom.exitCode).toBe(1);
    expect(boom.stderr).toMatch(/^Traceback \(most recent call last\):\n {2}File "<string>", line 3/);
    expect(boom.stderr).toContain('ZeroDivisionError: division by zero');
    expect(boom.stderr).not.toContain('<airlock>');
    expect((await sbx.exec(['python3', '-c', 'raise SystemExit("bye")'])).stderr).toBe('bye\n');
    expect((await sbx.exec(['python3', '-c', 'import sys; sys.exit(256 + 7)'])).exitCode).toBe(7);
  });

  it('argv arrives verbatim as sys.argv; only the spec and exec env are in os.environ', async () => {
    const canary = `AIRLOCK_WASM_CANARY_${randomBytes(4).toString('hex').toUpperCase()}`;
    process.env[canary] = 'host-secret';
    try {
      const r = await sbx.exec(
        [
          'python3',
          '-c',
          'import sys, os, json; print(json.dumps([sys.argv, dict(os.environ)]))',
          'a b',
          "$HOME '*'",
          '',
        ],
        { env: { EXTRA: 'x y' } },
      );
      const [argv, env] = JSON.parse(r.stdout) as [string[], Record<string, string>];
      expect(argv).toEqual(['-c', 'a b', "$HOME '*'", '']);
      expect(env).toEqual({
        PATH: expect.any(String),
        HOME: '/home/user',
        USER: 'user',
        LANG: 'C.UTF-8',
        SPEC_VAR: 'spec',
        EXTRA: 'x y',
      });
      const next = await sbx.exec(['python3', '-c', 'import os; print(sorted(os.environ))']);
      expect(next.stdout).not.toContain('EXTRA');
      expect(next.stdout).not.toContain(canary);
    } finally {
      delete process.env[canary];
    }
  });

  it('node-like argv runs in QuickJS: no require, no process, no fetch; an uncaught error exits 1', async () => {
    const r = await sbx.exec([
      'node',
      '-e',
      'console.log(typeof require, typeof process, typeof fetch, 6 * 7)',
    ]);
    expect(r).toMatchObject({ exitCode: 0, stdout: 'undefined undefined undefined 42\n' });
    const bad = await sbx.exec(['js', '-e', 'null.x']);
    expect(bad.exitCode).toBe(1);
    expect(bad.stderr).toContain('TypeError');
  });

  it('cwd, stdin (read whole), and scripts from the in-memory filesystem', async () => {
    expect((await sbx.exec('pwd')).stdout).toBe('/workspace\n');
    expect((await sbx.exec(['python3', '-c', 'import os; print(os.getcwd())'], { cwd: '/tmp' })).stdout).toBe(
      '/tmp\n',
    );
    const up = await sbx.exec(['python3', '-c', 'import sys; print(sys.stdin.read().upper(), end="")'], {
      stdin: 'héllo\nworld',
    });
    expect(up.stdout).toBe('HÉLLO\nWORLD');
    expect((await sbx.exec('cat', { stdin: Uint8Array.from([0, 1, 255]) })).stdout).toBe(
      Buffer.from([0, 1, 255]).toString(),
    );
    expect((await sbx.exec(['python3', '-c', 'import sys; print(repr(sys.stdin.read()))'])).stdout).toBe(
      "''\n",
    );
    await sbx.files.write('app/main.py', 'import sys\nprint("script", sys.argv[1:])\n');
    expect((await sbx.exec(['python3', 'app/main.py', '1'])).stdout).toBe("script ['1']\n");
    await sbx.files.write('/workspace/app/main.js', 'console.log("js script")');
    expect((await sbx.exec('node /workspace/app/main.js')).stdout).toBe('js script\n');
    expect((await sbx.exec(['python3', 'missing.py'])).exitCode).toBe(2);
    expect((await sbx.exec(['python3'], { stdin: 'print(2 + 2)' })).stdout).toBe('4\n');
  });

  it('builtins: echo, true, false, sleep, cat; anything else exits 127 with one line', async () => {
    expect((await sbx.exec("echo 'a  b' c")).stdout).toBe('a  b c\n');
    expect((await sbx.exec(['true'])).exitCode).toBe(0);
    expect((await sbx.exec(['false'])).exitCode).toBe(1);
    expect((await sbx.exec('sleep 0.05')).exitCode).toBe(0);
    for (const cmd of [
      'ls -la',
      ['sh', '-c', 'exit 7'],
      'echo a; echo b',
      ['/usr/bin/env'],
      'curl http://example.com',
    ]) {
      const r = await sbx.exec(cmd);
      expect({ cmd, exitCode: r.exitCode, stdout: r.stdout }).toEqual({ cmd, exitCode: 127, stdout: '' });
      expect(r.stderr.trimEnd().split('\n')).toHaveLength(1);
      expect(r.stderr).toContain(NOT_RUNNABLE);
    }
  });

  it('files: text and all 256 byte values round-trip, nested dirs, list, remove, exists', async () => {
    await sbx.files.write('/workspace/f/hello.txt', 'héllo wörld\n');
    expect(await sbx.files.read('f/hello.txt')).toBe('héllo wörld\n');
    expect((await sbx.exec('cat /workspace/f/hello.txt')).stdout).toBe('héllo wörld\n');
    const bytes = Uint8Array.from({ length: 512 }, (_, i) => i % 256);
    await sbx.files.write('f/deep/er/bytes.bin', bytes);
    expect(Buffer.from(await sbx.files.read('f/deep/er/bytes.bin', { format: 'bytes' }))).toEqual(
      Buffer.from(bytes),
    );
    const py = await sbx.exec([
      'python3',
      '-c',
      'import hashlib; print(hashlib.sha256(open("f/deep/er/bytes.bin","rb").read()).hexdigest())',
    ]);
    const { createHash } = await import('node:crypto');
    expect(py.stdout.trim()).toBe(createHash('sha256').update(bytes).digest('hex'));
    await sbx.exec([
      'python3',
      '-c',
      'import os; os.mkdir("f/d"); os.symlink("hello.txt", "f/l"); open("f/a\\nb", "w").close()',
    ]);
    const list = Object.fromEntries((await sbx.files.list('f')).map((e) => [e.name, e]));
    expect(Object.keys(list).sort()).toEqual(['a\nb', 'd', 'deep', 'hello.txt', 'l']);
    expect(list['hello.txt']).toMatchObject({
      type: 'file',
      size: Buffer.byteLength('héllo wörld\n'),
      path: '/workspace/f/hello.txt',
    });
    expect(list.l).toMatchObject({ type: 'symlink' });
    expect(list.d).toMatchObject({ type: 'dir' });
    expect(Math.abs(list['hello.txt']!.mtimeMs - Date.now())).toBeLessThan(10 * 60_000);
    await sbx.files.remove('f/deep');
    expect(await sbx.files.exists('f/deep')).toBe(false);
    expect(await sbx.files.exists('f/hello.txt')).toBe(true);
    await sbx.files.remove('f/never-was');
    await expectError(sbx.files.read('f/missing'), 'FILE_NOT_FOUND', 'path');
    await expectError(sbx.files.list('/workspace/nope'), 'FILE_NOT_FOUND', 'path');
    await expectError(
      sbx.files.read('f/big', { maxBytes: 10 }).catch(async (e: unknown) => {
        await sbx.files.write('f/big', Buffer.alloc(100));
        throw e;
      }),
      'FILE_NOT_FOUND',
    );
    await expectError(sbx.files.read('f/big', { maxBytes: 10 }), 'FILE_TOO_LARGE');
  });

  it('the filesystem is the sandbox’s own memory: no host files, and the root is not writable', async () => {
    await expectError(sbx.files.read('/etc/passwd'), 'FILE_NOT_FOUND', 'path');
    await expectError(sbx.files.write('/usr/airlock-wasm.txt', 'x'), 'PERMISSION_DENIED', 'path');
    await expectError(sbx.files.write('/etc/passwd', 'x'), 'PERMISSION_DENIED', 'path');
    const r = await sbx.exec([
      'python3',
      '-c',
      'import os\nfor p in ["/etc/passwd", "/proc/self/environ", "/proc/1/cmdline", "/root", "/var/tmp"]:\n' +
        '    print(p, os.path.exists(p))\nos.symlink("/etc/passwd", "/workspace/pw")\n',
    ]);
    expect(r.stdout).toBe(
      '/etc/passwd False\n/proc/self/environ False\n/proc/1/cmdline False\n/root False\n/var/tmp False\n',
    );
    await expectError(sbx.files.read('pw'), 'FILE_NOT_FOUND', 'path');
    // Another sandbox (from the warm worker) sees nothing of this one.
    const other = await Sandbox.create({ backend: 'wasm' }, { airlock });
    expect(await other.files.exists('/workspace/f/hello.txt')).toBe(false);
    expect(await other.files.list()).toEqual([]);
    await other.kill();
  });

  it('kill ends a running exec (also code that catches KeyboardInterrupt) and the sandbox', async () => {
    const s = await Sandbox.create({ backend: 'wasm' }, { airlock });
    const h = await s.exec(['python3', '-c', 'print("begun", flush=True)\nwhile True: pass'], {
      background: true,
    });
    await h.kill();
    const r = await h.wait();
    expect(r.killedBy).toBe('killed');
    expect(r.signal).toBe('SIGKILL');
    // Code that swallows the interrupt: the worker is replaced after the grace (its files are gone).
    await s.files.write('kept.txt', 'x');
    const stubborn = await s.exec(
      [
        'python3',
        '-c',
        'while True:\n    try:\n        while True: pass\n    except KeyboardInterrupt:\n        pass',
      ],
      {
        timeoutMs: 500,
      },
    );
    expect(stubborn.killedBy).toBe('timeout');
    expect((await s.exec('echo alive')).stdout).toBe('alive\n');
    expect(await s.files.exists('kept.txt')).toBe(false);
    const running = s.exec(['node', '-e', 'for (;;) {}'], { timeoutMs: 60_000 });
    await sleep(200);
    await s.kill();
    expect((await running).killedBy).toBe('killed');
    await expectError(s.exec('true'), 'SANDBOX_GONE');
  });

  it('memoryBytes: allocating past it is killedBy oom, and the sandbox lives on', async () => {
    const s = await Sandbox.create({ backend: 'wasm', limits: { memoryBytes: 96 * MiB } }, { airlock });
    const r = await s.exec(['python3', '-c', 'x = bytearray(200 * 1024 * 1024)']);
    expect(r.killedBy).toBe('oom');
    expect(r.exitCode).not.toBe(0);
    expect(r.oomKills).toBe(1);
    expect(r.stderr).toContain('MemoryError');
    const after = await s.exec(['python3', '-c', 'print(len(bytearray(1024)))']);
    expect([after.stdout, after.oomKills]).toEqual(['1024\n', 0]);
    const js = await s.exec(['node', '-e', 'const a = []; for (;;) a.push("x".repeat(1 << 20));']);
    expect(js.killedBy).toBe('oom');
    await s.kill();
  });

  it('the TTL ends the sandbox and its running exec', async () => {
    const s = await Sandbox.create({ backend: 'wasm', ttlMs: 3000 }, { airlock });
    const r = await s.exec(['python3', '-c', 'while True: pass'], { timeoutMs: 60_000 });
    expect(r.killedBy).toBe('ttl');
    expect(s.alive).toBe(false);
  });

  it('leaves no worker thread behind', async () => {
    await airlock.killAll();
    await airlock.close();
    for (let i = 0; i < 100 && wasmThreads() > 0; i++) await sleep(50);
    expect(wasmThreads()).toBe(0);
  });
});
