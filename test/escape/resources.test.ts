// Escape suite: host resources a sandbox could reach or exhaust beyond its cgroup: inherited file
// descriptors, pseudo-terminals, sockets and FIFOs in a shared workspace, stdio handed to another
// exec, and limits applied to prepared (warm) sandboxes.
import { spawn } from 'node:child_process';
import { chmodSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { connect, createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { canRunNamespaces, TEST_STATE_DIR, TEST_UID_RANGE, testAirlock } from '../helpers.js';
import { expectNoResidue, fixture, readNumber, sandboxCgroupDir } from './util.js';

const airlock = testAirlock();
afterAll(async () => {
  if (canRunNamespaces) await expectNoResidue(airlock);
});

describe('inherited file descriptors', () => {
  it.skipIf(!canRunNamespaces)(
    'a sandboxed process sees only its stdio, never fds Airlock inherited',
    async () => {
      const secretFile = join(mkdtempSync(join(tmpdir(), 'airlock-fd-')), 'host-secret');
      writeFileSync(secretFile, 'host secret', { mode: 0o600 });
      // A parent shell opens the file on fd 250 without close-on-exec, as a service manager or a
      // careless parent might; Airlock (the fixture) inherits it and must not pass it on.
      const child = spawn(
        '/bin/bash',
        [
          '-c',
          'exec 250<"$1"; exec "$0" --import tsx test/fixtures/list-fds.ts',
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
        rmSync(secretFile, { force: true });
      }
    },
  );
});

describe('pseudo-terminals', () => {
  it.skipIf(!canRunNamespaces)(
    'a sandbox gets at most 64 ptys, and another sandbox still gets its own',
    async () => {
      const grab = [
        'python3',
        '-c',
        'import os\nn=0\nl=[]\ntry:\n  while True: l.append(os.openpty()); n+=1\nexcept OSError as e: print(n, e.errno)',
      ];
      const a = await airlock.create();
      const b = await airlock.create();
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
});

describe('sockets and FIFOs in a shared host directory', () => {
  it.skipIf(!canRunNamespaces)(
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
          const sbx = await airlock.create({ workspace: { hostDir: dir, mode } });
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

describe('stdio handed to another exec', () => {
  it.skipIf(!canRunNamespaces)(
    'an exec whose stdout lives on in another exec still ends, and its timeout holds',
    async () => {
      const sbx = await airlock.create();
      await sbx.files.write('/tmp/holder.py', fixture('fd-holder.py'));
      await sbx.files.write('/tmp/sender.py', fixture('fd-sender.py'));
      const holder = await sbx.exec('python3 /tmp/holder.py', { background: true });
      await new Promise((r) => setTimeout(r, 500));
      const t0 = Date.now();
      const r = await sbx.exec('python3 /tmp/sender.py', { timeoutMs: 20_000 });
      // The sender's tree exited after ~0.2 s; the result arrives after the stdio grace, far before the timeout.
      expect(r.exitCode).toBe(0);
      expect(r.killedBy).toBeUndefined();
      expect(Date.now() - t0).toBeLessThan(15_000);
      await holder.kill();
      await sbx.kill();
    },
  );
});

describe('limits of prepared (warm) sandboxes', () => {
  it.skipIf(!canRunNamespaces)(
    'limits larger and smaller than the prepared defaults are applied',
    async () => {
      for (const memoryBytes of [2 * 1024 ** 3, 32 * 1024 ** 2]) {
        const sbx = await airlock.create({ limits: { memoryBytes, pids: 99 } });
        const mem = sandboxCgroupDir('memory', sbx.id);
        const pids = sandboxCgroupDir('pids', sbx.id);
        if (mem) expect(readNumber(join(mem, 'memory.limit_in_bytes'))).toBe(memoryBytes);
        if (pids) expect(readFileSync(join(pids, 'pids.max'), 'utf8').trim()).toBe('99');
        expect((await sbx.exec('echo ok')).stdout).toBe('ok\n');
        await sbx.kill();
      }
    },
  );
});
