// Escape suite: host resources a sandbox could reach or exhaust beyond its cgroup: inherited file
// descriptors, pseudo-terminals, sockets and FIFOs in a shared workspace, stdio handed to another
// exec, and limits applied to prepared (warm) sandboxes. Every test runs on each tier; where gVisor
// differs by design (its ptys and sockets are the sentry's own, one sentry per exec), its test says so.
import { spawn } from 'node:child_process';
import { chmodSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { connect, createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { GVISOR_EXEC_OVERHEAD } from '../../src/backends/gvisor/limits.js';
import { canRunNamespaces, TEST_STATE_DIR, TEST_UID_RANGE, testAirlock } from '../helpers.js';
import { canRunTier, expectNoResidue, fixture, readNumber, sandboxCgroupDir, TIERS } from './util.js';

const airlock = testAirlock();
afterAll(async () => {
  if (canRunNamespaces) await expectNoResidue(airlock);
});

for (const backend of TIERS) {
  const canRun = canRunTier(backend);

  describe(`inherited file descriptors [${backend}]`, () => {
    it.skipIf(!canRun)('a sandboxed process sees only its stdio, never fds Airlock inherited', async () => {
      const secretFile = join(mkdtempSync(join(tmpdir(), 'airlock-fd-')), 'host-secret');
      writeFileSync(secretFile, 'host secret', { mode: 0o600 });
      // A parent shell opens the file on fd 250 without close-on-exec, as a service manager or a
      // careless parent might; Airlock (the fixture) inherits it and must not pass it on.
      const child = spawn(
        '/bin/bash',
        [
          '-c',
          'exec 250<"$1"; exec "$0" --import tsx test/escape/list-fds.fixture.ts',
          process.execPath,
          secretFile,
        ],
        {
          env: {
            ...process.env,
            AIRLOCK_STATE_DIR: TEST_STATE_DIR,
            AIRLOCK_UID_FIRST: String(TEST_UID_RANGE.first),
            AIRLOCK_UID_COUNT: String(TEST_UID_RANGE.count),
          },
          stdio: ['ignore', 'pipe', 'inherit'],
        },
      );
      try {
        let out = '';
        child.stdout!.on('data', (d: Buffer) => (out += d.toString()));
        const code = await new Promise((r) => child.once('exit', r));
        expect(code).toBe(0);
        const fds = out
          .trim()
          .split('\n')
          .map((l) => l.split(' ')[0]);
        expect(fds.sort()).toEqual(['0', '1', '2']);
        expect(out).not.toContain('host-secret');
      } finally {
        rmSync(dirname(secretFile), { recursive: true, force: true });
      }
    });
  });

  describe(`pseudo-terminals [${backend}]`, () => {
    (backend === 'namespaces' ? it.skipIf(!canRun) : it.skip)(
      'a sandbox gets at most 64 ptys, and another sandbox still gets its own' +
        (backend === 'namespaces'
          ? ''
          : " [skipped: gVisor's ptys are the sentry's, not host ptys, and are not capped at 64: see the next test]"),
      async () => {
        const grab = [
          'python3',
          '-c',
          'import os\nn=0\nl=[]\ntry:\n  while True: l.append(os.openpty()); n+=1\nexcept OSError as e: print(n, e.errno)',
        ];
        const a = await airlock.create({ backend });
        const b = await airlock.create({ backend });
        let held!: () => void;
        const holding = new Promise<void>((r) => (held = r));
        const hold = await a.exec(
          [
            'python3',
            '-c',
            'import os,time\nl=[os.openpty() for _ in range(64)]\nprint("held", flush=True)\ntime.sleep(30)',
          ],
          {
            background: true,
            onStdout: (s) => s.includes('held') && held(),
          },
        );
        await holding; // the holder has all 64 before anyone else tries
        const r = await a.exec(grab);
        expect(r.stdout.trim()).toBe('0 28'); // ENOSPC: the 64 are taken by the holder
        const other = await b.exec(grab);
        expect(other.stdout.trim()).toBe('64 28');
        await hold.kill();
        await a.kill();
        await b.kill();
      },
    );

    (backend === 'gvisor' ? it.skipIf(!canRun) : it.skip)(
      "gVisor: ptys are each exec's sentry's own: holding thousands takes no host pty, and another sandbox still gets its own" +
        (backend === 'gvisor' ? '' : ' [skipped: gVisor only; see the previous test]'),
      async () => {
        // No 64-pty cap here: each exec's sentry has its own devpts, bounded per process by
        // RLIMIT_NOFILE (4096 fds: 2 per pty) and by the memory limit, never by host ptys.
        const grab = [
          'python3',
          '-c',
          'import os\nn=0\nl=[]\ntry:\n  while True: l.append(os.openpty()); n+=1\nexcept OSError as e: print(n, e.errno)',
        ];
        const hostPtys = (): number => readNumber('/proc/sys/kernel/pty/nr');
        const a = await airlock.create({ backend });
        const b = await airlock.create({ backend });
        const before = hostPtys();
        let held!: (n: number) => void;
        const holding = new Promise<number>((r) => (held = r));
        const hold = await a.exec(
          [
            'python3',
            '-c',
            'import os,time\nl=[]\ntry:\n  while True: l.append(os.openpty())\nexcept OSError: pass\nprint("held", len(l), flush=True)\ntime.sleep(30)',
          ],
          {
            background: true,
            onStdout: (s) => {
              const m = /held (\d+)/.exec(s);
              if (m) held(Number(m[1]));
            },
          },
        );
        const n = await holding;
        expect(n).toBeGreaterThanOrEqual(64); // at least what the namespaces tier allows
        expect(n).toBeLessThanOrEqual(2048); // bounded by RLIMIT_NOFILE
        // Host side: the holder's ptys are not host ptys (the count moves only by others' use).
        expect(hostPtys() - before).toBeLessThan(n / 2);
        // Another exec of the same sandbox, and another sandbox, still get their own.
        for (const s of [a, b]) {
          const r = await s.exec(grab);
          const m = /^(\d+) (\d+)$/.exec(r.stdout.trim());
          expect(m, r.stdout + r.stderr).not.toBeNull();
          expect(Number(m![1])).toBeGreaterThanOrEqual(64);
        }
        await hold.kill();
        await a.kill();
        await b.kill();
      },
    );
  });

  describe(`sockets and FIFOs in a shared host directory [${backend}]`, () => {
    it.skipIf(!canRun)(
      'are not reachable from a ro or cow workspace, even when owned by the dir owner',
      async () => {
        const dir = mkdtempSync(join(tmpdir(), 'airlock-sock-'));
        chmodSync(dir, 0o755);
        const sockPath = join(dir, 'agent.sock');
        let connections = 0;
        const server = createServer((c) => {
          connections++;
          c.end('hello from a root host service\n');
        });
        await new Promise<void>((r) => server.listen(sockPath, r));
        chmodSync(sockPath, 0o600);
        try {
          for (const mode of ['ro', 'cow'] as const) {
            const sbx = await airlock.create({ backend, workspace: { hostDir: dir, mode } });
            const r = await sbx.exec(
              [
                'perl',
                '-MIO::Socket::UNIX',
                '-e',
                'my $s = IO::Socket::UNIX->new(Peer => "/workspace/agent.sock") or die "refused: $!\\n"; print <$s>',
              ],
              { timeoutMs: 5000 },
            );
            expect(r.exitCode, mode).not.toBe(0);
            expect(r.stdout, mode).not.toContain('hello');
            await sbx.kill();
          }
          expect(connections).toBe(0);
          // Positive control: the same socket answers on the host.
          const hello = await new Promise<string>((resolve, reject) => {
            let got = '';
            const c = connect(sockPath);
            c.on('data', (d) => (got += d.toString()));
            c.on('end', () => resolve(got));
            c.on('error', reject);
          });
          expect(hello).toContain('hello');
        } finally {
          server.close();
          rmSync(dir, { recursive: true, force: true });
        }
      },
    );
  });

  describe(`stdio handed to another exec [${backend}]`, () => {
    it.skipIf(!canRun)(
      backend === 'gvisor'
        ? 'an exec cannot hand its stdout to another exec (each has its own sentry) and still ends'
        : 'an exec whose stdout lives on in another exec still ends, and its timeout holds',
      async () => {
        const sbx = await airlock.create({ backend });
        await sbx.files.write('/tmp/holder.py', fixture('fd-holder.py'));
        await sbx.files.write('/tmp/sender.py', fixture('fd-sender.py'));
        const holder = await sbx.exec('python3 /tmp/holder.py', { background: true });
        await new Promise((r) => setTimeout(r, 500));
        const t0 = Date.now();
        const r = await sbx.exec('python3 /tmp/sender.py', { timeoutMs: 20_000 });
        if (backend === 'gvisor') {
          // The holder's abstract socket exists only in its own exec's sentry: nothing to connect to.
          expect(r.exitCode).toBe(1);
          expect(r.stderr).toMatch(/ConnectionRefusedError/);
        } else {
          // The sender's tree exited after ~0.2 s; the result arrives after the stdio grace, far before the timeout.
          expect(r.exitCode).toBe(0);
        }
        expect(r.killedBy).toBeUndefined();
        expect(Date.now() - t0).toBeLessThan(15_000);
        await holder.kill();
        await sbx.kill();
      },
    );
  });

  describe(`limits of prepared (warm) sandboxes [${backend}]`, () => {
    it.skipIf(!canRun)('limits larger and smaller than the prepared defaults are applied', async () => {
      for (const memoryBytes of [2 * 1024 ** 3, 32 * 1024 ** 2]) {
        const sbx = await airlock.create({ backend, limits: { memoryBytes, pids: 99 } });
        const mem = sandboxCgroupDir('memory', sbx.id);
        const pids = sandboxCgroupDir('pids', sbx.id);
        // gVisor's cgroup also holds gVisor itself: one exec's allowance on top of the limits.
        const extra = backend === 'gvisor' ? GVISOR_EXEC_OVERHEAD : { memoryBytes: 0, pids: 0 };
        if (mem) expect(readNumber(join(mem, 'memory.limit_in_bytes'))).toBe(memoryBytes + extra.memoryBytes);
        if (pids) expect(readFileSync(join(pids, 'pids.max'), 'utf8').trim()).toBe(String(99 + extra.pids));
        expect((await sbx.exec('echo ok')).stdout).toBe('ok\n');
        await sbx.kill();
      }
    });
  });
}
