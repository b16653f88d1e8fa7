// The contract every backend must pass (STYLE.md habit 2): ONE suite, written against the public API
// as a user sees it (Sandbox.create, exec, files, kill, TTL), run by test/contract/<backend>.test.ts.
// A backend that cannot honour a test declares a skip with a reason; it never gets a weaker copy.
import { randomBytes } from 'node:crypto';
import {
  chmodSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  readdirSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { PassThrough, Readable } from 'node:stream';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import {
  Airlock,
  AirlockError,
  BACKEND_NAMES,
  Sandbox,
  type BackendName,
  type ExecOptions,
  type ExecResult,
  type SandboxSpecInput,
} from '../../src/index.js';
import { NO_RESIDUE, TEST_UID_RANGE, residue, testAirlock } from '../helpers.js';
import { unmount } from '../../src/backends/host/mount.privileged.js';
import { airlockError, contractRegistrar, expectError, picture, type ContractOptions } from './support.js';

const MiB = 1024 * 1024;

function lines(n: number): string {
  let s = '';
  for (let i = 1; i <= n; i++) s += `${i}\n`;
  return s;
}

function envOf(r: ExecResult): Record<string, string> {
  const env: Record<string, string> = {};
  for (const l of r.stdout.split('\n')) {
    const i = l.indexOf('=');
    if (i > 0) env[l.slice(0, i)] = l.slice(i + 1);
  }
  return env;
}

export function sandboxContract(backend: BackendName, opts: ContractOptions = {}): void {
  describe(`sandbox contract: ${backend}${opts.variant ? ` ${opts.variant}` : ''}`, () => {
    let airlock: Airlock;
    const owned: Sandbox[] = [];
    const hostPaths: string[] = [];

    beforeAll(() => {
      airlock = opts.airlock?.() ?? testAirlock();
    });
    afterEach(async () => {
      await Promise.allSettled(owned.splice(0).map((s) => s.kill()));
      for (const p of hostPaths.splice(0)) rmSync(p, { recursive: true, force: true });
    });
    afterAll(async () => {
      await airlock?.killAll();
    });

    /** A sandbox of the backend under test, killed after the test whatever happens. */
    const create = async (spec: Omit<SandboxSpecInput, 'backend'> = {}): Promise<Sandbox> => {
      const sbx = await Sandbox.create({ backend, ...spec }, { airlock });
      owned.push(sbx);
      return sbx;
    };

    /** A host dir shaped like a small project checkout (dirs 0755, files 0644), removed after the test. */
    const projectDir = (): string => {
      const d = mkdtempSync(join(tmpdir(), 'airlock-contract-'));
      hostPaths.push(d);
      chmodSync(d, 0o755);
      writeFileSync(join(d, 'README.md'), '# project\n');
      mkdirSync(join(d, 'src'));
      writeFileSync(join(d, 'src', 'main.py'), 'print("hello")\n');
      writeFileSync(join(d, 'data.bin'), Buffer.from([0, 1, 2, 254, 255]));
      symlinkSync('src/main.py', join(d, 'entry'));
      return d;
    };

    /** Register a test of the contract, or its declared skip. */
    const { test, unknownSkips } = contractRegistrar(opts);

    // ---- lifecycle ------------------------------------------------------------------------------

    describe('lifecycle', () => {
      test('create with defaults', async () => {
        const sbx = await create();
        expect(sbx.spec).toEqual({
          backend,
          ttlMs: 600_000,
          limits: { memoryBytes: 512 * MiB, cpus: 1, pids: 256, diskBytes: 512 * MiB },
          workspace: { mode: 'empty' },
          mounts: [],
          env: {},
          metadata: {},
          secrets: [],
          canaries: [],
        });
        const info = sbx.info;
        expect(info.id).toBe(sbx.id);
        expect(info.backend).toBe(backend);
        expect(info.hostUid).toBeGreaterThan(0);
        expect(info.expiresAt!.getTime() - info.createdAt.getTime()).toBeGreaterThanOrEqual(599_000);
        expect(sbx.alive).toBe(true);
        expect(airlock.get(sbx.id)).toBe(sbx);
        expect(airlock.list()).toContain(sbx);

        const r = await sbx.exec('echo hello');
        expect(r).toMatchObject({
          exitCode: 0,
          signal: null,
          stdout: 'hello\n',
          stderr: '',
          truncated: { stdout: false, stderr: false },
        });
        expect(r.killedBy).toBeUndefined();
        expect(r.spillPath).toBeUndefined();
        expect(r.durationMs).toBeGreaterThanOrEqual(0);
      });

      test('metadata round-trips in info', async () => {
        const sbx = await create({ metadata: { owner: 'contract', run: '1' } });
        expect(sbx.info.metadata).toEqual({ owner: 'contract', run: '1' });
      });

      test('await using disposes the sandbox', async () => {
        let outer: Sandbox | undefined;
        {
          await using sbx = await create();
          outer = sbx;
          expect((await sbx.exec('echo inside')).stdout).toBe('inside\n');
        }
        expect(outer.alive).toBe(false);
        await expectError(outer.exec('true'), 'SANDBOX_GONE');
        await expectError(outer.files.read('/etc/hostname'), 'SANDBOX_GONE');
        await expectError(() => airlock.get(outer.id), 'SANDBOX_NOT_FOUND');
      });

      test('kill is idempotent and ends running execs', async () => {
        const sbx = await create();
        const running = sbx.exec('sleep 30', { timeoutMs: 50_000 });
        await sleep(100);
        await Promise.all([sbx.kill(), sbx.kill()]);
        await sbx.kill();
        const r = await running;
        expect(r.killedBy).toBe('killed');
        expect(r.exitCode === 137 || r.signal === 'SIGKILL').toBe(true);
        await expectError(sbx.exec('true'), 'SANDBOX_GONE');
        expect(airlock.list()).not.toContain(sbx);
      });

      test('a sandbox whose kill has begun is no longer found or listed, before its teardown ends', async () => {
        const sbx = await create();
        const killing = sbx.kill(); // the teardown is still running (a microVM's takes a while)
        expect(sbx.alive).toBe(false);
        await expectError(() => airlock.get(sbx.id), 'SANDBOX_NOT_FOUND');
        expect(airlock.list()).not.toContain(sbx);
        await expectError(sbx.exec('true'), 'SANDBOX_GONE');
        await killing;
      });

      test('ids are unique per sandbox', async () => {
        const a = await create();
        const b = await create();
        expect(a.info.id).not.toBe(b.info.id);
        expect(a.info.hostUid).not.toBe(b.info.hostUid);
        await a.kill();
        const c = await create();
        expect(new Set([a.id, b.id, c.id]).size).toBe(3);
      });

      test('works on a fresh state dir', async () => {
        // First use on a host: the state dir does not exist yet and Airlock creates it.
        const stateDir = join('/var/tmp', `airlock-contract-fresh-${randomBytes(6).toString('hex')}`);
        const fresh = new Airlock({
          stateDir,
          // Inside the test range, so residue() watches these uids too. Leases are per state dir: a
          // testAirlock() sandbox may rarely hold the same uid at the same time (harmless in a test).
          uidRange: { first: TEST_UID_RANGE.first + TEST_UID_RANGE.count - 64, count: 64 },
        });
        try {
          const sbx = await Sandbox.create({ backend }, { airlock: fresh });
          const r = await sbx.exec('echo ok');
          expect(r.stderr).toBe('');
          expect(r.stdout).toBe('ok\n');
        } finally {
          await fresh.killAll();
          // Its sandboxes dir and /dev tree are mounts of their own (they outlive Airlock on a kept
          // state dir): this throwaway dir's go with it.
          unmount(join(stateDir, 'sandboxes'));
          unmount(join(stateDir, 'dev'));
          if (!readFileSync('/proc/self/mountinfo', 'utf8').includes(stateDir)) {
            rmSync(stateDir, { recursive: true, force: true });
          }
        }
      });
    });

    // ---- exec -----------------------------------------------------------------------------------

    describe('exec', () => {
      test('shell string: stdout, stderr and exit code', async () => {
        const sbx = await create();
        const r = await sbx.exec('echo out; echo err >&2; exit 3');
        expect(r).toMatchObject({ exitCode: 3, stdout: 'out\n', stderr: 'err\n' });
        expect(r.killedBy).toBeUndefined();
      });

      test('argv array arrives verbatim', async () => {
        const sbx = await create();
        const r = await sbx.exec(['printf', '%s|', 'a b', "c'd", '', '--x', '$HOME', '*', 'é\nz', '"q"']);
        expect(r.stdout).toBe('a b|c\'d||--x|$HOME|*|é\nz|"q"|');
        expect(r.exitCode).toBe(0);
      });

      test('exit codes propagate', async () => {
        const sbx = await create();
        for (const code of [0, 1, 2, 42, 255]) {
          expect((await sbx.exec(`exit ${code}`)).exitCode).toBe(code);
        }
        expect((await sbx.exec(['false'])).exitCode).toBe(1);
        expect((await sbx.exec(['sh', '-c', 'exit 7'])).exitCode).toBe(7);
        const missing = await sbx.exec('no-such-command-xyz');
        expect(missing.exitCode).toBe(127);
        expect(missing.stderr).toContain('no-such-command-xyz');
        const missingArgv = await sbx.exec(['/no/such/binary']);
        expect(missingArgv.exitCode).not.toBe(0);
        expect(missingArgv.killedBy).toBeUndefined();
      });

      test('a process killed by a signal reports it', async () => {
        const sbx = await create();
        const r = await sbx.exec('kill -9 $$');
        expect(r.exitCode === 137 || r.signal === 'SIGKILL').toBe(true);
        expect(r.killedBy).toBeUndefined();
      });

      test('threads work (a seccomp policy must not break pthread_create)', async () => {
        const sbx = await create();
        const r = await sbx.exec([
          'python3',
          '-c',
          'import threading\nout=[]\nts=[threading.Thread(target=out.append, args=(i,)) for i in range(8)]\n' +
            '[t.start() for t in ts]\n[t.join() for t in ts]\nprint(sorted(out))',
        ]);
        expect({ out: r.stdout, err: r.stderr }).toEqual({ out: '[0, 1, 2, 3, 4, 5, 6, 7]\n', err: '' });
      });

      test('stdin: string, Uint8Array and Readable', async () => {
        const sbx = await create();
        expect((await sbx.exec('cat', { stdin: 'hello\nworld' })).stdout).toBe('hello\nworld');
        const bytes = Uint8Array.from({ length: 256 }, (_, i) => i);
        const b64 = await sbx.exec(['base64', '-w0'], { stdin: bytes });
        expect(b64.stdout).toBe(Buffer.from(bytes).toString('base64'));
        const stream = Readable.from(['line 1\n', Buffer.from('line 2\n'), 'line 3\n']);
        expect((await sbx.exec(['cat'], { stdin: stream })).stdout).toBe('line 1\nline 2\nline 3\n');
        const big = Buffer.alloc(3 * MiB, 'x');
        expect((await sbx.exec('wc -c', { stdin: big })).stdout.trim()).toBe(String(big.length));
      });

      test('without stdin a reader sees EOF at once', async () => {
        const sbx = await create();
        const r = await sbx.exec('cat; echo eof', { timeoutMs: 10_000 });
        expect(r).toMatchObject({ exitCode: 0, stdout: 'eof\n' });
      });

      test('a process that ignores its stdin does not fail the exec', async () => {
        const sbx = await create();
        const r = await sbx.exec('echo ignored', { stdin: Buffer.alloc(4 * MiB, 'y') });
        expect(r).toMatchObject({ exitCode: 0, stdout: 'ignored\n' });
      });

      test('cwd', async () => {
        const sbx = await create();
        expect((await sbx.exec('pwd')).stdout).toBe('/workspace\n');
        expect((await sbx.exec('pwd', { cwd: '/tmp' })).stdout).toBe('/tmp\n');
        expect((await sbx.exec(['/bin/pwd'], { cwd: '/home' })).stdout).toBe('/home\n');
      });

      test('per-exec env overrides spec env', async () => {
        const sbx = await create({ env: { MODE: 'spec', KEEP: 'kept', HOME: '/tmp' } });
        const over = envOf(await sbx.exec(['/usr/bin/env'], { env: { MODE: 'exec', EXTRA: 'x y' } }));
        expect(over).toMatchObject({ MODE: 'exec', KEEP: 'kept', EXTRA: 'x y', HOME: '/tmp' });
        // Only for that exec.
        const next = envOf(await sbx.exec(['/usr/bin/env']));
        expect(next).toMatchObject({ MODE: 'spec', KEEP: 'kept' });
        expect(next.EXTRA).toBeUndefined();
        expect((await sbx.exec('echo "$MODE"', { env: { MODE: 'a;b $(id)' } })).stdout).toBe('a;b $(id)\n');
      });

      test('spec env is the only env: nothing of the host leaks', async () => {
        const canaryName = `AIRLOCK_CONTRACT_CANARY_${randomBytes(4).toString('hex').toUpperCase()}`;
        const canary = `host-secret-${randomBytes(8).toString('hex')}`;
        process.env[canaryName] = canary;
        try {
          const sbx = await create({ env: { SPEC_VAR: 'spec' } });
          const env = envOf(await sbx.exec(['/usr/bin/env']));
          expect(env[canaryName]).toBeUndefined();
          expect(Object.values(env)).not.toContain(canary);
          // The sandbox's defaults, the spec's variables and the cwd bwrap-style: nothing else.
          const allowed = new Set(['PATH', 'HOME', 'USER', 'LANG', 'PWD', 'SPEC_VAR']);
          expect(Object.keys(env).filter((k) => !allowed.has(k))).toEqual([]);
          expect(env.SPEC_VAR).toBe('spec');
          // Nor in the environment of any process inside the sandbox.
          const all = await sbx.exec('cat /proc/[0-9]*/environ 2>/dev/null | tr "\\0" "\\n"');
          expect(all.stdout).not.toContain(canary);
        } finally {
          delete process.env[canaryName];
        }
      });

      test('a command that cannot run exits 127 or 126 with one clear line, argv and shell form', async () => {
        const sbx = await create();
        await sbx.exec(
          "printf '#!/bin/sh\\necho ran\\n' > noexec && chmod 644 noexec && mkdir dir && ln -s /nowhere dangling",
        );
        const launcher = /bwrap|execvp|runsc|container|sandbox:/;
        const cases: Array<
          [Parameters<Sandbox['exec']>[0], number, string, Omit<ExecOptions, 'background'>?]
        > = [
          [['no-such-command-xyz', '--flag'], 127, 'no-such-command-xyz'],
          [['/workspace/no-such-file'], 127, '/workspace/no-such-file'],
          [['/no/such/dir/cmd'], 127, '/no/such/dir/cmd'],
          [['/workspace/dangling'], 127, '/workspace/dangling'],
          [['ls'], 127, 'ls', { env: { PATH: '/workspace' } }], // looked up in the exec's PATH
          [['/workspace/noexec'], 126, '/workspace/noexec'],
          [['./noexec'], 126, './noexec'],
          [['/workspace/dir'], 126, '/workspace/dir'],
          [['/tmp'], 126, '/tmp'],
          ['no-such-command-xyz --flag', 127, 'no-such-command-xyz'],
          ['/workspace/noexec', 126, '/workspace/noexec'],
          ['/workspace/dir', 126, '/workspace/dir'],
        ];
        for (const [cmd, code, name, o] of cases) {
          const r = await sbx.exec(cmd, o ?? {});
          const what = JSON.stringify(cmd);
          expect({ what, exitCode: r.exitCode, stdout: r.stdout }).toEqual({
            what,
            exitCode: code,
            stdout: '',
          });
          const errLines = r.stderr.split('\n').filter((l) => l !== '');
          expect({ what, n: errLines.length }).toEqual({ what, n: 1 });
          expect(errLines[0], what).toContain(name);
          expect(errLines[0], what).not.toMatch(launcher);
          expect(r.killedBy, what).toBeUndefined();
        }
        // In the background and through spawn as well.
        const h = await sbx.exec(['no-such-command-xyz'], { background: true });
        expect((await h.wait()).exitCode).toBe(127);
        const p = await sbx.spawn(['/workspace/noexec']);
        const err: Buffer[] = [];
        p.stdout.resume();
        p.stderr.on('data', (c: Buffer) => err.push(c));
        expect((await p.exited).exitCode).toBe(126);
        expect(Buffer.concat(err).toString()).not.toMatch(launcher);
        // What can run still runs exactly as given: argv[0], arguments, environment (also one named
        // like a shell variable), exit status.
        const ok = await sbx.exec(
          ['/bin/sh', '-c', 'echo "$0|$1|$#|$c|$1x"; exit 7', 'zero', '$HOME "q" *'],
          {
            env: { c: 'cval' },
          },
        );
        expect([ok.exitCode, ok.stdout]).toEqual([7, 'zero|$HOME "q" *|1|cval|$HOME "q" *x\n']);
        expect((await sbx.exec(['./noexec'], { cwd: '/tmp' })).exitCode).toBe(127);
        await sbx.exec('chmod 755 noexec');
        expect((await sbx.exec(['./noexec'])).stdout).toBe('ran\n');
        const env = envOf(await sbx.exec(['env'], { env: { PWD: '/custom', c: '1' } }));
        expect([env.PWD, env.c]).toEqual(['/custom', '1']);
      });

      test('concurrent execs in one sandbox keep their outputs apart', async () => {
        const sbx = await create();
        const rs = await Promise.all(
          Array.from({ length: 10 }, (_, i) =>
            sbx.exec(`sleep 0.0${i}; echo ${i}; echo e${i} >&2; exit ${i}`),
          ),
        );
        rs.forEach((r, i) => expect(r).toMatchObject({ stdout: `${i}\n`, stderr: `e${i}\n`, exitCode: i }));
      });
    });

    // ---- streaming ------------------------------------------------------------------------------

    describe('streaming', () => {
      test('onStdout/onStderr receive all output in order', async () => {
        const sbx = await create();
        let out = '';
        let err = '';
        const r = await sbx.exec(
          'i=1; while [ $i -le 3000 ]; do echo "out $i ü€😀"; echo "err $i" >&2; i=$((i+1)); done',
          { maxOutputBytes: 8 * MiB, onStdout: (t) => (out += t), onStderr: (t) => (err += t) },
        );
        expect(r.truncated).toEqual({ stdout: false, stderr: false });
        expect(out).toBe(r.stdout);
        expect(err).toBe(r.stderr);
        const expected = Array.from({ length: 3000 }, (_, i) => `out ${i + 1} ü€😀\n`).join('');
        expect(out).toBe(expected);
        expect(err.split('\n').slice(0, 3)).toEqual(['err 1', 'err 2', 'err 3']);
      });

      test('callbacks still see everything when the result is truncated', async () => {
        const sbx = await create();
        let out = '';
        const r = await sbx.exec('seq 1 50000', { maxOutputBytes: 1000, onStdout: (t) => (out += t) });
        expect(r.truncated.stdout).toBe(true);
        expect(out).toBe(lines(50000));
        if (r.spillPath) rmSync(r.spillPath, { force: true });
      });

      test('output streams while the process runs', async () => {
        // The process waits for input that is only sent once its first line has been seen.
        const sbx = await create();
        const stdin = new PassThrough();
        const r = await sbx.exec('echo ready; read x; echo "got $x"', {
          stdin,
          timeoutMs: 20_000,
          onStdout: (t) => {
            if (t.includes('ready')) stdin.end('go\n');
          },
        });
        expect(r.killedBy).toBeUndefined();
        expect(r.stdout).toBe('ready\ngot go\n');
      });
    });

    // ---- background -----------------------------------------------------------------------------

    describe('background', () => {
      test('background exec returns a handle; kill() ends it', async () => {
        const sbx = await create();
        const h = await sbx.exec('sleep 30', { background: true });
        expect(typeof h.id).toBe('string');
        await h.kill();
        const r = await h.wait();
        expect(r.killedBy).toBe('killed');
        expect(r.exitCode === 137 || r.signal === 'SIGKILL').toBe(true);
        expect(r.durationMs).toBeLessThan(30_000);
        // The sandbox itself lives on.
        expect((await sbx.exec('echo alive')).stdout).toBe('alive\n');
      });

      test('background wait() gives the full output', async () => {
        const sbx = await create();
        let streamed = '';
        const h = await sbx.exec(['sh', '-c', 'echo started; sleep 0.2; echo done'], {
          background: true,
          onStdout: (t) => (streamed += t),
        });
        const r = await h.wait();
        expect(r).toMatchObject({ exitCode: 0, stdout: 'started\ndone\n', stderr: '' });
        expect(r.killedBy).toBeUndefined();
        expect(streamed).toBe('started\ndone\n');
        expect(await h.wait()).toBe(r);
      });

      test('background execs run alongside foreground ones', async () => {
        const sbx = await create();
        const h = await sbx.exec('echo "$$" > /tmp/bg.pid; sleep 30', { background: true });
        const r = await sbx.exec(
          'for i in $(seq 1 100); do [ -s /tmp/bg.pid ] && break; sleep 0.05; done; echo fg',
        );
        expect(r.stdout).toBe('fg\n');
        await h.kill();
        expect((await h.wait()).killedBy).toBe('killed');
      });

      test('background timeoutMs applies when given', async () => {
        const sbx = await create();
        const h = await sbx.exec('sleep 30', { background: true, timeoutMs: 300 });
        const r = await h.wait();
        expect(r.killedBy).toBe('timeout');
      });

      test('killing the sandbox ends its background execs', async () => {
        const sbx = await create();
        const h = await sbx.exec('sleep 30', { background: true });
        await sbx.kill();
        const r = await h.wait();
        expect(r.killedBy).toBe('killed');
        await h.kill(); // harmless after the fact
      });
    });

    // ---- cancellation and timeouts --------------------------------------------------------------

    describe('cancellation', () => {
      test('aborting mid-exec kills it', async () => {
        const sbx = await create();
        const ac = new AbortController();
        const p = sbx.exec('echo begun; sleep 30', {
          signal: ac.signal,
          timeoutMs: 20_000,
          onStdout: () => ac.abort(),
        });
        const r = await p;
        expect(r.killedBy).toBe('killed');
        expect(r.stdout).toBe('begun\n');
        expect(r.exitCode === 137 || r.signal === 'SIGKILL').toBe(true);
      });

      test('aborting right after the call kills the exec', async () => {
        // The signal fires while exec is still starting the process: the abort must not be lost.
        const sbx = await create();
        const ac = new AbortController();
        const p = sbx.exec('sleep 30', { signal: ac.signal, timeoutMs: 5_000 });
        ac.abort();
        const r = await p.catch((e: unknown) => e);
        if (AirlockError.isInstance(r)) expect(r.code).toBe('ABORTED');
        else expect((r as ExecResult).killedBy).toBe('killed');
      });

      test('an already-aborted signal throws ABORTED', async () => {
        const sbx = await create();
        await expectError(sbx.exec('echo never', { signal: AbortSignal.abort() }), 'ABORTED');
        // And nothing ran.
        expect((await sbx.exec('echo still usable')).stdout).toBe('still usable\n');
      });

      test('timeout kills the whole process tree', async () => {
        const sbx = await create();
        // The timeout leaves a loaded host time to start the command (a gVisor exec starts a sentry).
        const r = await sbx.exec('sleep 30 & sleep 30 & echo forked; wait', { timeoutMs: 5000 });
        expect(r.killedBy).toBe('timeout');
        expect(r.exitCode === 137 || r.signal === 'SIGKILL').toBe(true);
        expect(r.stdout).toBe('forked\n');
        expect(r.durationMs).toBeLessThan(20_000);
        const ps = await sbx.exec('ls /proc | grep -c "^[0-9]"');
        // A fresh exec sees only its own processes: nothing of the timed-out tree survived.
        expect(Number(ps.stdout.trim())).toBeLessThan(6);
      });
    });

    // ---- output shaping -------------------------------------------------------------------------

    describe('output', () => {
      test('truncation keeps head and tail and spills the full output', async () => {
        const sbx = await create();
        const full = lines(200_000);
        const r = await sbx.exec('seq 1 200000', { maxOutputBytes: 1000 });
        try {
          expect(r.truncated).toEqual({ stdout: true, stderr: false });
          expect(r.spillPath).toBeDefined();
          expect(r.spillPaths?.stdout).toBe(r.spillPath);
          expect(r.spillPaths?.stderr).toBeUndefined();
          expect(r.stdout.startsWith(full.slice(0, 500))).toBe(true);
          expect(r.stdout.endsWith(full.slice(-500))).toBe(true);
          expect(r.stdout).toContain(r.spillPath!);
          expect(r.stdout.length).toBeLessThan(1000 + 400);
          expect(readFileSync(r.spillPath!, 'utf8')).toBe(full);
          expect(r.exitCode).toBe(0);
        } finally {
          if (r.spillPath) rmSync(r.spillPath, { force: true });
        }
      });

      test('stderr is truncated independently', async () => {
        const sbx = await create();
        const r = await sbx.exec('seq 1 100000 >&2; echo small', { maxOutputBytes: 2000 });
        try {
          expect(r.truncated).toEqual({ stdout: false, stderr: true });
          expect(r.stdout).toBe('small\n');
          expect(r.spillPaths?.stdout).toBeUndefined();
          expect(r.spillPaths?.stderr).toBeDefined();
          expect(r.spillPath).toBe(r.spillPaths?.stderr);
          expect(r.stderr).toContain(r.spillPaths!.stderr!);
          expect(r.stderr.startsWith('1\n2\n3\n')).toBe(true);
          expect(r.stderr.endsWith('99999\n100000\n')).toBe(true);
          expect(readFileSync(r.spillPaths!.stderr!, 'utf8')).toBe(lines(100_000));
        } finally {
          if (r.spillPath) rmSync(r.spillPath, { force: true });
        }
      });

      test('both streams truncated spill to separate files', async () => {
        const sbx = await create();
        const r = await sbx.exec('seq 1 30000; seq 1 20000 >&2', { maxOutputBytes: 500 });
        try {
          expect(r.truncated).toEqual({ stdout: true, stderr: true });
          expect(r.spillPath).toBe(r.spillPaths?.stdout);
          expect(r.spillPaths?.stdout).not.toBe(r.spillPaths?.stderr);
          expect(readFileSync(r.spillPaths!.stdout!, 'utf8')).toBe(lines(30_000));
          expect(readFileSync(r.spillPaths!.stderr!, 'utf8')).toBe(lines(20_000));
        } finally {
          for (const p of Object.values(r.spillPaths ?? {})) rmSync(p, { force: true });
        }
      });

      test('output exactly at the limit is not truncated', async () => {
        const sbx = await create();
        const at = await sbx.exec('head -c 1000 /dev/zero | tr "\\0" a', { maxOutputBytes: 1000 });
        expect(at.truncated.stdout).toBe(false);
        expect(at.stdout).toBe('a'.repeat(1000));
        const over = await sbx.exec('head -c 1001 /dev/zero | tr "\\0" a', { maxOutputBytes: 1000 });
        expect(over.truncated.stdout).toBe(true);
        if (over.spillPath) rmSync(over.spillPath, { force: true });
      });
    });

    // ---- files ----------------------------------------------------------------------------------

    describe('files', () => {
      test('write and read text', async () => {
        const sbx = await create();
        await sbx.files.write('/workspace/hello.txt', 'héllo wörld\n');
        expect(await sbx.files.read('/workspace/hello.txt')).toBe('héllo wörld\n');
        expect((await sbx.exec('cat /workspace/hello.txt')).stdout).toBe('héllo wörld\n');
        await sbx.files.write('/workspace/hello.txt', 'shorter');
        expect(await sbx.files.read('/workspace/hello.txt')).toBe('shorter');
        await sbx.files.write('/workspace/empty', '');
        expect(await sbx.files.read('/workspace/empty')).toBe('');
      });

      test('write and read bytes: all 256 values round-trip', async () => {
        const sbx = await create();
        const bytes = Uint8Array.from({ length: 512 }, (_, i) => i % 256);
        await sbx.files.write('/workspace/bytes.bin', bytes);
        const back = await sbx.files.read('/workspace/bytes.bin', { format: 'bytes' });
        expect(back).toBeInstanceOf(Uint8Array);
        expect(Buffer.from(back).equals(Buffer.from(bytes))).toBe(true);
        const sum = await sbx.exec(['sha256sum', '/workspace/bytes.bin']);
        const { createHash } = await import('node:crypto');
        expect(sum.stdout.split(' ')[0]).toBe(createHash('sha256').update(bytes).digest('hex'));
        const big = randomBytes(2 * MiB);
        await sbx.files.write('big.bin', big);
        expect(Buffer.from(await sbx.files.read('big.bin', { format: 'bytes' })).equals(big)).toBe(true);
      });

      test('nested directories are created', async () => {
        const sbx = await create();
        await sbx.files.write('/workspace/a/b/c/d.txt', 'deep');
        expect(await sbx.files.exists('/workspace/a/b/c')).toBe(true);
        expect(await sbx.files.read('/workspace/a/b/c/d.txt')).toBe('deep');
        expect((await sbx.exec('test -d /workspace/a/b && echo dir')).stdout).toBe('dir\n');
      });

      test('list returns entries with type and size', async () => {
        const sbx = await create();
        await sbx.exec(['sh', '-c', 'mkdir d && printf 12345 > f && ln -s f l && touch "my file é" "a\nb"']);
        const entries = await sbx.files.list('/workspace');
        const byName = Object.fromEntries(entries.map((e) => [e.name, e]));
        expect(Object.keys(byName).sort()).toEqual(['a\nb', 'd', 'f', 'l', 'my file é'].sort());
        expect(byName.f).toMatchObject({ type: 'file', size: 5, path: '/workspace/f' });
        expect(byName.d).toMatchObject({ type: 'dir', path: '/workspace/d' });
        expect(byName.l).toMatchObject({ type: 'symlink' });
        expect(byName['my file é']).toMatchObject({ type: 'file', size: 0 });
        expect(byName.f!.mode & 0o777).toBe(0o644);
        expect(Math.abs(byName.f!.mtimeMs - Date.now())).toBeLessThan(10 * 60_000);
        expect(await sbx.files.list('d')).toEqual([]);
      });

      test('remove and exists', async () => {
        const sbx = await create();
        await sbx.files.write('/workspace/gone.txt', 'x');
        await sbx.files.write('/workspace/tree/x/y.txt', 'y');
        expect(await sbx.files.exists('/workspace/gone.txt')).toBe(true);
        await sbx.files.remove('/workspace/gone.txt');
        expect(await sbx.files.exists('/workspace/gone.txt')).toBe(false);
        await sbx.files.remove('/workspace/tree');
        expect(await sbx.files.exists('/workspace/tree')).toBe(false);
        expect(await sbx.files.exists('/workspace/never-was')).toBe(false);
        await sbx.files.remove('/workspace/never-was'); // removing nothing is not an error
      });

      test('reading a missing file throws FILE_NOT_FOUND', async () => {
        const sbx = await create();
        await expectError(sbx.files.read('/workspace/missing.txt'), 'FILE_NOT_FOUND', 'path');
        await expectError(sbx.files.read('/nonexistent/dir/file'), 'FILE_NOT_FOUND', 'path');
        await expectError(sbx.files.list('/workspace/missing-dir'), 'FILE_NOT_FOUND', 'path');
      });

      test('relative paths resolve under /workspace', async () => {
        const sbx = await create();
        await sbx.files.write('rel/file.txt', 'relative');
        expect((await sbx.exec('cat /workspace/rel/file.txt')).stdout).toBe('relative');
        expect(await sbx.files.read('./rel/../rel/file.txt')).toBe('relative');
        expect((await sbx.files.list('rel')).map((e) => e.path)).toEqual(['/workspace/rel/file.txt']);
      });

      test('writing to /usr throws PERMISSION_DENIED', async () => {
        const sbx = await create();
        await expectError(sbx.files.write('/usr/airlock-contract.txt', 'x'), 'PERMISSION_DENIED', 'path');
        await expectError(sbx.files.write('/etc/passwd', 'x'), 'PERMISSION_DENIED', 'path');
        expect(existsSync('/usr/airlock-contract.txt')).toBe(false);
      });

      test('reading beyond maxBytes throws FILE_TOO_LARGE', async () => {
        const sbx = await create();
        await sbx.files.write('/workspace/k.bin', Buffer.alloc(2000, 7));
        await expectError(sbx.files.read('/workspace/k.bin', { maxBytes: 1999 }), 'FILE_TOO_LARGE');
        expect((await sbx.files.read('/workspace/k.bin', { maxBytes: 2000, format: 'bytes' })).length).toBe(
          2000,
        );
      });

      test('invalid paths throw INVALID_ARGUMENT', async () => {
        const sbx = await create();
        await expectError(sbx.files.read(''), 'INVALID_ARGUMENT', 'path');
        await expectError(sbx.files.write('a\0b', 'x'), 'INVALID_ARGUMENT', 'path');
      });

      test('files see the sandbox, not the host', async () => {
        const sbx = await create();
        const passwd = await sbx.files.read('/etc/passwd');
        expect(passwd).toBe((await sbx.exec('cat /etc/passwd')).stdout);
        expect(passwd).not.toBe(readFileSync('/etc/passwd', 'utf8'));
      });

      test('symlinks are resolved inside the sandbox', async () => {
        const sbx = await create();
        const tag = randomBytes(6).toString('hex');
        const hostTargets = [
          `/root/airlock-contract-${tag}`,
          join(opts.stateDir?.() ?? airlock.stateDir, `pwned-${tag}`),
        ];
        const hostDirTarget = mkdtempSync(join(tmpdir(), 'airlock-contract-target-'));
        hostPaths.push(...hostTargets, hostDirTarget);
        // Planted by the sandbox: a link to a host-style file, to host paths it must not reach, and
        // to a directory that exists on the host (with a file name in it).
        await sbx.exec([
          'sh',
          '-c',
          'ln -s /etc/passwd pw && ln -s "$1" evil1 && ln -s "$2" evil2 && ln -s "$3" evildir',
          'sh',
          ...hostTargets,
          hostDirTarget,
        ]);
        expect(await sbx.files.read('pw')).toBe(await sbx.files.read('/etc/passwd'));
        expect(await sbx.files.read('pw')).not.toBe(readFileSync('/etc/passwd', 'utf8'));
        for (const path of ['evil1', 'evil2', 'evildir/x']) {
          await sbx.files.write(path, 'pwned').catch((e: unknown) => {
            if (!AirlockError.isInstance(e)) throw e;
          });
        }
        for (const p of hostTargets) expect(existsSync(p)).toBe(false);
        expect(readdirSync(hostDirTarget)).toEqual([]);
        const types = Object.fromEntries((await sbx.files.list()).map((e) => [e.name, e.type]));
        expect(types).toMatchObject({ pw: 'symlink', evil1: 'symlink', evil2: 'symlink' });
        await sbx.files.remove('evil1');
        expect(await sbx.files.exists('evil1')).toBe(false);
      });
    });

    // ---- workspace modes ------------------------------------------------------------------------

    describe('workspace', () => {
      test("workspace 'empty' is empty and writable", async () => {
        const sbx = await create();
        expect(sbx.spec.workspace).toEqual({ mode: 'empty' });
        expect(await sbx.files.list('/workspace')).toEqual([]);
        const r = await sbx.exec('touch /workspace/new && mkdir /workspace/d && ls -A /workspace');
        expect(r).toMatchObject({ exitCode: 0, stdout: 'd\nnew\n' });
        // Owned by the sandbox's own (unprivileged) user.
        const owner = await sbx.exec('stat -c %u /workspace/new; id -u');
        const [fileUid, selfUid] = owner.stdout.trim().split('\n');
        expect(fileUid).toBe(selfUid);
        expect(selfUid).not.toBe('0');
      });

      test("workspace 'cow' sees the host files and keeps its writes", async () => {
        const dir = projectDir();
        const before = picture(dir);
        const sbx = await create({ workspace: { mode: 'cow', hostDir: dir } });
        expect(await sbx.files.read('README.md')).toBe('# project\n');
        expect(await sbx.files.read('entry')).toBe('print("hello")\n');
        expect(Buffer.from(await sbx.files.read('data.bin', { format: 'bytes' }))).toEqual(
          Buffer.from([0, 1, 2, 254, 255]),
        );
        const r = await sbx.exec(
          'echo new > /workspace/new.txt && mkdir /workspace/out && echo o > out/o.txt',
        );
        expect(r.stderr).toBe('');
        expect(r.exitCode).toBe(0);
        expect(await sbx.files.read('new.txt')).toBe('new\n');
        expect(await sbx.files.read('out/o.txt')).toBe('o\n');
        expect(picture(dir)).toEqual(before);
        await sbx.kill();
        expect(picture(dir)).toEqual(before);
      });

      test("workspace 'cow' lets the sandbox edit and delete the host files", async () => {
        const dir = projectDir();
        const before = picture(dir);
        const sbx = await create({ workspace: { mode: 'cow', hostDir: dir } });
        const r = await sbx.exec(
          'echo edited >> README.md && echo "print(1)" > src/main.py && echo n > src/new.py && rm data.bin && rm entry',
        );
        expect(r.stderr).toBe('');
        expect(r.exitCode).toBe(0);
        expect(await sbx.files.read('README.md')).toBe('# project\nedited\n');
        expect(await sbx.files.read('src/main.py')).toBe('print(1)\n');
        await sbx.files.write('src/main.py', 'print(2)\n');
        expect(await sbx.files.read('src/main.py')).toBe('print(2)\n');
        expect(await sbx.files.exists('data.bin')).toBe(false);
        expect(picture(dir)).toEqual(before);
        await sbx.kill();
        expect(picture(dir)).toEqual(before);
      });

      test("workspace 'ro' is readable and not writable", async () => {
        const dir = projectDir();
        const before = picture(dir);
        const sbx = await create({ workspace: { mode: 'ro', hostDir: dir } });
        expect(await sbx.files.read('README.md')).toBe('# project\n');
        expect((await sbx.files.list()).map((e) => e.name).sort()).toEqual([
          'README.md',
          'data.bin',
          'entry',
          'src',
        ]);
        const w = await sbx.exec('echo x > /workspace/new.txt');
        expect(w.exitCode).not.toBe(0);
        const edit = await sbx.exec('echo x >> /workspace/README.md');
        expect(edit.exitCode).not.toBe(0);
        expect((await sbx.exec('rm -f /workspace/src/main.py')).exitCode).not.toBe(0);
        await expectError(sbx.files.write('README.md', 'x'), 'PERMISSION_DENIED');
        await expectError(sbx.files.write('src/other.py', 'x'), 'PERMISSION_DENIED');
        expect(picture(dir)).toEqual(before);
        await sbx.kill();
        expect(picture(dir)).toEqual(before);
      });
    });

    // ---- read-only mounts -----------------------------------------------------------------------

    describe('mounts', () => {
      test('a host dir and a host file are mounted read-only at their paths', async () => {
        const dir = projectDir();
        const before = picture(dir);
        const sbx = await create({
          mounts: [
            { hostPath: dir, path: '/opt/project' },
            { hostPath: join(dir, 'README.md'), path: '/opt/readme' },
          ],
        });
        const r = await sbx.exec('cat /opt/project/src/main.py /opt/readme; ls /opt/project');
        expect(r).toMatchObject({
          exitCode: 0,
          stdout: 'print("hello")\n# project\nREADME.md\ndata.bin\nentry\nsrc\n',
        });
        for (const cmd of [
          'echo x > /opt/project/new',
          'echo x >> /opt/project/README.md',
          'rm /opt/project/data.bin',
          'echo x > /opt/readme',
          'chmod 777 /opt/project/src',
          'mkdir /opt/other',
        ]) {
          const w = await sbx.exec(cmd);
          expect({ cmd, exitCode: w.exitCode }).not.toEqual({ cmd, exitCode: 0 });
        }
        expect(picture(dir)).toEqual(before);
      });

      test('a mount defaults to the same path inside the sandbox', async () => {
        const dir = mkdtempSync('/var/tmp/airlock-contract-'); // /tmp itself is the sandbox's own
        hostPaths.push(dir);
        chmodSync(dir, 0o755);
        writeFileSync(join(dir, 'README.md'), '# project\n');
        const sbx = await create({ mounts: [{ hostPath: dir }] });
        expect(sbx.spec.mounts).toEqual([{ hostPath: dir, path: dir }]);
        expect((await sbx.exec(['cat', join(dir, 'README.md')])).stdout).toBe('# project\n');
      });

      test('mounts that would expose host config or cover the sandbox layout are refused', async () => {
        await expectError(create({ mounts: [{ hostPath: '/etc' }] }), 'INVALID_SPEC', 'mounts.0.hostPath');
        await expectError(
          create({ mounts: [{ hostPath: '/', path: '/opt/x' }] }),
          'INVALID_SPEC',
          'mounts.0.hostPath',
        );
        await expectError(
          create({ mounts: [{ hostPath: '/proc/self', path: '/opt/x' }] }),
          'INVALID_SPEC',
          'mounts.0.hostPath',
        );
        const dir = projectDir();
        await expectError(
          create({ mounts: [{ hostPath: dir, path: '/usr/lib/x' }] }),
          'INVALID_SPEC',
          'mounts.0.path',
        );
        await expectError(
          create({ mounts: [{ hostPath: dir, path: '/workspace' }] }),
          'INVALID_SPEC',
          'mounts.0.path',
        );
        await expectError(
          create({ mounts: [{ hostPath: join(dir, 'missing'), path: '/opt/x' }] }),
          'INVALID_SPEC',
          'mounts.0.hostPath',
        );
        // A symlink to a forbidden place is checked by where it leads.
        const link = join(dir, 'to-etc');
        symlinkSync('/etc', link);
        await expectError(
          create({ mounts: [{ hostPath: link, path: '/opt/x' }] }),
          'INVALID_SPEC',
          'mounts.0.hostPath',
        );
      });
    });

    // ---- spawn: raw pipes -----------------------------------------------------------------------

    describe('spawn', () => {
      test('spawn gives a live process with raw stdin/stdout/stderr pipes', async () => {
        const sbx = await create();
        const p = await sbx.spawn([
          '/bin/sh',
          '-c',
          'while read l; do echo "out:$l"; echo "err:$l" >&2; done; exit 3',
        ]);
        const out: Buffer[] = [];
        const err: Buffer[] = [];
        p.stdout.on('data', (b: Buffer) => out.push(b));
        p.stderr.on('data', (b: Buffer) => err.push(b));
        p.stdin.write('one\n');
        await new Promise<void>((resolve) => {
          const check = (): void => {
            if (Buffer.concat(out).toString().includes('out:one\n')) resolve();
            else setTimeout(check, 5);
          };
          check();
        });
        p.stdin.end('two\n');
        const exit = await p.exited;
        expect([exit.exitCode, exit.signal, exit.killedBy]).toEqual([3, null, undefined]);
        expect(Buffer.concat(out).toString()).toBe('out:one\nout:two\n');
        expect(Buffer.concat(err).toString()).toBe('err:one\nerr:two\n');
      });

      test('a spawned process dies with its sandbox', async () => {
        const sbx = await create();
        const p = await sbx.spawn('sleep 600');
        p.stdout.resume();
        p.stderr.resume();
        await sbx.kill();
        expect(await p.exited).toMatchObject({ signal: 'SIGKILL', killedBy: 'killed' });
      });
    });

    // ---- limits ---------------------------------------------------------------------------------

    describe('limits', () => {
      test('memoryBytes: exceeding it is killedBy oom', async () => {
        const sbx = await create({ limits: { memoryBytes: 64 * MiB } });
        const r = await sbx.exec('dd if=/dev/zero of=/dev/null bs=200M count=1', { timeoutMs: 30_000 });
        expect(r.killedBy).toBe('oom');
        expect(r.exitCode).not.toBe(0);
        expect((await sbx.exec('echo after')).stdout).toBe('after\n');
      });

      test('oomKills: a child killed by the OOM killer is reported while its parent lives on', async () => {
        const sbx = await create({ limits: { memoryBytes: 64 * MiB } });
        expect((await sbx.exec('echo before')).oomKills).toBe(0);
        const r = await sbx.exec(
          'dd if=/dev/zero of=/dev/null bs=200M count=1 2>/dev/null; echo "child $?"; ' +
            'dd if=/dev/zero of=/dev/null bs=200M count=1 2>/dev/null; echo "child $?"',
          { timeoutMs: 30_000 },
        );
        expect([r.exitCode, r.killedBy, r.stdout]).toEqual([0, undefined, 'child 137\nchild 137\n']);
        expect(r.oomKills).toBe(2);
        // In the background, in the argv form; and a later exec counts only its own.
        const h = await sbx.exec(
          ['/bin/sh', '-c', 'head -c 200000000 /dev/zero | tail -n 1 >/dev/null; true'],
          {
            background: true,
            timeoutMs: 30_000,
          },
        );
        const b = await h.wait();
        expect([b.exitCode, b.oomKills]).toEqual([0, 1]);
        expect((await sbx.exec(['true'])).oomKills).toBe(0);
      });

      test('oomKills: an exec the OOM killer ends reports it with killedBy oom', async () => {
        const sbx = await create({ limits: { memoryBytes: 64 * MiB } });
        const r = await sbx.exec(['dd', 'if=/dev/zero', 'of=/dev/null', 'bs=200M', 'count=1'], {
          timeoutMs: 30_000,
        });
        expect(r.killedBy).toBe('oom');
        expect(r.oomKills).toBeGreaterThanOrEqual(1);
        expect((await sbx.exec('echo after')).oomKills).toBe(0);
      });

      test('pids: a fork storm is held at the limit', async () => {
        const sbx = await create({ limits: { pids: 16 } });
        const r = await sbx.exec('for i in $(seq 1 100); do sleep 30 & done; wait', { timeoutMs: 10_000 });
        expect(r.killedBy === 'pids' || (r.exitCode !== 0 && r.killedBy !== 'timeout')).toBe(true);
        expect((await sbx.exec('echo after')).stdout).toBe('after\n');
      });

      test('diskBytes: writing beyond it fails with ENOSPC', async () => {
        const sbx = await create({ limits: { diskBytes: 8 * MiB } });
        const r = await sbx.exec('head -c 16777216 /dev/zero > /workspace/big');
        expect(r.exitCode).not.toBe(0);
        expect(r.stderr).toContain('No space left on device');
        const tmp = await sbx.exec('rm -f /workspace/big; head -c 16777216 /dev/zero > /tmp/big');
        expect(tmp.stderr).toContain('No space left on device');
        await expectError(sbx.files.write('/workspace/big2', Buffer.alloc(16 * MiB)), 'DISK_FULL');
        // Space comes back once the files are gone.
        await sbx.exec('rm -f /tmp/big /workspace/big2');
        await sbx.files.write('/workspace/ok', Buffer.alloc(2 * MiB));
        expect((await sbx.files.list()).find((e) => e.name === 'ok')?.size).toBe(2 * MiB);
      });

      test('limits round-trip in the spec', async () => {
        const limits = { memoryBytes: 96 * MiB, cpus: 0.5, pids: 32, diskBytes: 16 * MiB };
        const sbx = await create({ limits });
        expect(sbx.spec.limits).toEqual(limits);
        expect((await sbx.exec('echo ok')).stdout).toBe('ok\n');
      });
    });

    // ---- TTL ------------------------------------------------------------------------------------

    describe('ttl', () => {
      test('ttlMs: the sandbox is gone after it', async () => {
        // Long enough for a first exec on a loaded host (a gVisor exec starts a sentry), then wait
        // for the TTL to strike (bounded).
        const sbx = await create({ ttlMs: 5000 });
        expect((await sbx.exec('echo young')).stdout).toBe('young\n');
        for (const end = Date.now() + 30_000; sbx.alive && Date.now() < end;) await sleep(100);
        expect(sbx.alive).toBe(false);
        const e = await expectError(sbx.exec('true'), 'SANDBOX_GONE');
        expect(e.message).toMatch(/TTL/);
        await expectError(() => airlock.get(sbx.id), 'SANDBOX_NOT_FOUND');
      });

      test('the TTL kills a running exec with killedBy ttl', async () => {
        const sbx = await create({ ttlMs: 1000 });
        const r = await sbx.exec('sleep 30', { timeoutMs: 20_000 });
        expect(r.killedBy).toBe('ttl');
      });

      test('setTimeout extends the TTL', async () => {
        const sbx = await create({ ttlMs: 1500 });
        sbx.setTimeout(10_000);
        expect(sbx.info.expiresAt!.getTime()).toBeGreaterThan(Date.now() + 8_000);
        await sleep(2000);
        expect(sbx.alive).toBe(true);
        expect((await sbx.exec('echo extended')).stdout).toBe('extended\n');
      });

      test('setTimeout can shorten the TTL', async () => {
        const sbx = await create();
        sbx.setTimeout(1000);
        await sleep(1500);
        await expectError(sbx.exec('true'), 'SANDBOX_GONE');
        await expectError(() => sbx.setTimeout(10_000), 'SANDBOX_GONE');
      });
    });

    // ---- errors ---------------------------------------------------------------------------------

    describe('errors', () => {
      const invalid: Array<[string, unknown, string]> = [
        ['negative memory', { limits: { memoryBytes: -1 } }, 'limits.memoryBytes'],
        ['cow without hostDir', { workspace: { mode: 'cow' } }, 'workspace.hostDir'],
        ['relative hostDir', { workspace: { mode: 'cow', hostDir: 'project' } }, 'workspace.hostDir'],
        ['hostDir "/"', { workspace: { mode: 'ro', hostDir: '/' } }, 'workspace.hostDir'],
        ['hostDir resolving to "/"', { workspace: { mode: 'ro', hostDir: '/tmp/..' } }, 'workspace.hostDir'],
        ['hostDir /proc', { workspace: { mode: 'ro', hostDir: '/proc' } }, 'workspace.hostDir'],
        ['bad env name', { env: { '1BAD': 'x' } }, 'env.1BAD'],
        ['unknown top-level key', { memory: 1 }, 'memory'],
        ['unknown backend', { backend: 'nope' }, 'backend'],
      ];
      test('invalid specs throw INVALID_SPEC naming the field', async () => {
        for (const [what, spec, field] of invalid) {
          const e = await expectError(Sandbox.create(spec as SandboxSpecInput, { airlock }), 'INVALID_SPEC');
          expect({ what, field: e.field }).toEqual({ what, field });
          expect(e.message).toContain(field.split('.')[0]);
        }
      });

      test('hostDir must exist on the host and be a directory', async () => {
        const missing = join(tmpdir(), `airlock-contract-missing-${randomBytes(6).toString('hex')}`);
        await expectError(
          create({ workspace: { mode: 'cow', hostDir: missing } }),
          'INVALID_SPEC',
          'workspace.hostDir',
        );
        const file = join(mkdtempSync(join(tmpdir(), 'airlock-contract-')), 'file');
        hostPaths.push(join(file, '..'));
        writeFileSync(file, 'x');
        await expectError(
          create({ workspace: { mode: 'ro', hostDir: file } }),
          'INVALID_SPEC',
          'workspace.hostDir',
        );
      });

      test('a hostDir symlink to a forbidden host path is refused', async () => {
        const d = mkdtempSync(join(tmpdir(), 'airlock-contract-'));
        hostPaths.push(d);
        for (const target of ['/', '/proc', '/sys', '/dev']) {
          const link = join(d, `to-${target.replace(/\//g, '_')}`);
          symlinkSync(target, link);
          await expectError(
            create({ workspace: { mode: 'ro', hostDir: link } }),
            'INVALID_SPEC',
            'workspace.hostDir',
          );
        }
      });

      test('an unavailable backend throws BACKEND_UNAVAILABLE', async () => {
        let checked = 0;
        for (const other of BACKEND_NAMES.filter((b) => b !== backend)) {
          if ((await airlock.probe(other)).available) continue;
          await expectError(Sandbox.create({ backend: other }, { airlock }), 'BACKEND_UNAVAILABLE');
          checked++;
        }
        if (backend !== 'gvisor' && !(await airlock.probe('gvisor')).available)
          expect(checked).toBeGreaterThan(0);
      });

      test('airlock.get of an unknown id throws SANDBOX_NOT_FOUND', async () => {
        await expectError(() => airlock.get('nope'), 'SANDBOX_NOT_FOUND');
      });

      test('exec with an empty command throws INVALID_ARGUMENT', async () => {
        const sbx = await create();
        for (const cmd of ['', '   ', [], ['a\0b'], 'echo \0']) {
          await expectError(sbx.exec(cmd as string), 'INVALID_ARGUMENT', 'command');
        }
      });

      test('invalid exec options name the option', async () => {
        const sbx = await create();
        const cases: Array<[object, string]> = [
          [{ timeoutMs: -1 }, 'timeoutMs'],
          [{ maxOutputBytes: 10 }, 'maxOutputBytes'],
          [{ cwd: 'relative' }, 'cwd'],
          [{ env: { 'A-B': 'x' } }, 'env.A-B'],
          [{ timeout: 1000 }, 'timeout'],
        ];
        for (const [o, field] of cases) {
          const e = await airlockError(sbx.exec('true', o));
          expect(['INVALID_SPEC', 'INVALID_ARGUMENT']).toContain(e.code);
          expect(e.field).toBe(field);
        }
      });
    });

    // ---- concurrency ----------------------------------------------------------------------------

    describe('concurrency', () => {
      test('8 sandboxes created in parallel are independent', async () => {
        const sbxs = await Promise.all(Array.from({ length: 8 }, () => create()));
        expect(new Set(sbxs.map((s) => s.id)).size).toBe(8);
        expect(new Set(sbxs.map((s) => s.info.hostUid)).size).toBe(8);
        const rs = await Promise.all(
          sbxs.map((s, i) => s.exec(`echo ${i} > /workspace/me; cat /workspace/me; ls /workspace`)),
        );
        rs.forEach((r, i) => expect(r).toMatchObject({ exitCode: 0, stdout: `${i}\nme\n` }));
        await Promise.all(sbxs.map((s) => s.kill()));
        expect(sbxs.every((s) => !s.alive)).toBe(true);
      });
    });

    // ---- residue --------------------------------------------------------------------------------

    describe('host', () => {
      test('leaves no residue on the host', async () => {
        await Promise.allSettled(owned.splice(0).map((s) => s.kill()));
        await airlock.killAll();
        expect(airlock.list()).toEqual([]);
        let r = residue();
        for (
          let waited = 0;
          waited < 2000 && JSON.stringify(r) !== JSON.stringify(NO_RESIDUE);
          waited += 50
        ) {
          await sleep(50);
          r = residue();
        }
        expect(r).toEqual(NO_RESIDUE);
      });
    });

    // Checked when run: nested describes are collected after this body returns, so only then have
    // all of them registered their tests.
    it('every declared skip names a test of the suite', () => {
      expect(unknownSkips()).toEqual([]);
    });
  });
}
