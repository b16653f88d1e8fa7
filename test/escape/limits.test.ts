// Escape suite: resource exhaustion — fork bombs, memory bombs, disk fill, output floods — and the
// lifetime limits (exec timeout, sandbox TTL). Each attack must be contained by its limit, observed
// from inside and from the host (cgroup counters, host processes, the disk mount), and leave the
// sandbox (where it still lives) usable.
import { existsSync, readFileSync, rmSync, statfsSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { AirlockError } from '../../src/index.js';
import { canRunNamespaces, testAirlock, TEST_STATE_DIR } from '../helpers.js';
import {
  expectNoResidue,
  fixture,
  hostProcsOfUid,
  MiB,
  readNumber,
  sandboxCgroupDir,
  settle,
} from './util.js';

const GiB = 1024 * MiB;

const airlock = testAirlock();

afterAll(async () => {
  if (canRunNamespaces) await expectNoResidue(airlock);
});

/** Sample `read` every `everyMs` until stopped; returns the maximum seen. */
function sampler(read: () => number, everyMs: number): { stop: () => number } {
  let max = read();
  const t = setInterval(() => {
    try {
      max = Math.max(max, read());
    } catch {
      /* the cgroup went away */
    }
  }, everyMs);
  return {
    stop: () => {
      clearInterval(t);
      return max;
    },
  };
}

describe('fork bombs', () => {
  it.skipIf(!canRunNamespaces)('a fork loop is stopped at limits.pids', async () => {
    const sbx = await airlock.create({ limits: { pids: 32 } });
    const pidsDir = sandboxCgroupDir('pids', sbx.id);
    expect(pidsDir).toBeDefined();
    const current = join(pidsDir!, 'pids.current');
    const host = sampler(() => readNumber(current), 2);
    const r = await sbx.exec("sh -c 'for i in $(seq 200); do sleep 5 & done; wait'", { timeoutMs: 10_000 });
    const hostPeak = host.stop();
    expect(r.killedBy).toBe('pids');
    expect(r.exitCode).not.toBe(0);
    expect(r.stderr).toMatch(/Cannot fork|Resource temporarily unavailable/);
    expect(r.durationMs).toBeLessThan(10_000);
    expect(hostPeak).toBeLessThanOrEqual(32);
    expect(hostPeak).toBeGreaterThan(8); // the loop did get going
    expect(
      await settle(
        () => readNumber(current),
        (n) => n === 0,
      ),
    ).toBe(0);
    expect(
      await settle(
        () => hostProcsOfUid(sbx.info.hostUid),
        (ps) => ps.length === 0,
      ),
    ).toEqual([]);
    expect((await sbx.exec('echo alive')).stdout).toBe('alive\n');
    await sbx.kill();
  });

  it.skipIf(!canRunNamespaces)(
    'a real fork bomb is held at limits.pids until the timeout, then the sandbox is usable',
    async () => {
      const sbx = await airlock.create({ limits: { pids: 32 } });
      await sbx.files.write('/tmp/proc-count.pl', fixture('proc-count.pl'));
      const pidsDir = sandboxCgroupDir('pids', sbx.id)!;
      const current = join(pidsDir, 'pids.current');
      const host = sampler(() => readNumber(current), 2);
      const timeoutMs = 3_000;
      // A sampler (no forks) counts this exec's pids from inside while the bomb runs.
      const r = await sbx.exec("perl /tmp/proc-count.pl /tmp/counts & sleep 0.3; perl -e 'fork while 1'", {
        timeoutMs,
      });
      const hostPeak = host.stop();
      expect(['pids', 'timeout']).toContain(r.killedBy);
      expect(r.durationMs).toBeGreaterThanOrEqual(timeoutMs);
      expect(r.durationMs).toBeLessThan(timeoutMs + 10_000); // ended by the timeout, not hung

      const counts = (await sbx.files.read('/tmp/counts')).trim().split('\n').map(Number);
      expect(counts.length).toBeGreaterThan(10);
      const insidePeak = counts.reduce((a, b) => Math.max(a, b), 0);
      expect(insidePeak).toBeLessThanOrEqual(32);
      expect(insidePeak).toBeGreaterThanOrEqual(16); // the bomb did run
      expect(hostPeak).toBeLessThanOrEqual(32);
      if (existsSync(join(pidsDir, 'pids.peak')))
        expect(readNumber(join(pidsDir, 'pids.peak'))).toBeLessThanOrEqual(32);
      expect(
        Number(/^max (\d+)$/m.exec(readFileSync(join(pidsDir, 'pids.events'), 'utf8'))?.[1]),
      ).toBeGreaterThan(0);

      // Afterwards: the host cgroup is empty again, no sandbox process is left, and the sandbox works.
      expect(
        await settle(
          () => readNumber(current),
          (n) => n === 0,
        ),
      ).toBe(0);
      expect(
        await settle(
          () => hostProcsOfUid(sbx.info.hostUid),
          (ps) => ps.length === 0,
        ),
      ).toEqual([]);
      expect((await sbx.exec('echo alive')).stdout).toBe('alive\n');
      await sbx.kill();
    },
  );
});

describe('memory bomb', () => {
  it.skipIf(!canRunNamespaces)(
    'a 256 MiB allocation under a 64 MiB limit is OOM-killed, only in the sandbox',
    async () => {
      const sbx = await airlock.create({ limits: { memoryBytes: 64 * MiB } });
      const memDir = sandboxCgroupDir('memory', sbx.id);
      expect(memDir).toBeDefined();
      const r = await sbx.exec(`perl -e '$x = "a" x (256*1024*1024); print length $x'`);
      expect(r.killedBy).toBe('oom');
      expect(r.exitCode).toBe(137);
      expect(r.stdout).toBe('');

      // Host side: the kill happened in the sandbox's cgroup, whose usage never passed the limit.
      const v1 = existsSync(join(memDir!, 'memory.oom_control'));
      const events = readFileSync(join(memDir!, v1 ? 'memory.oom_control' : 'memory.events'), 'utf8');
      expect(Number(/^oom_kill (\d+)$/m.exec(events)?.[1])).toBeGreaterThanOrEqual(1);
      const peakFile = join(memDir!, v1 ? 'memory.max_usage_in_bytes' : 'memory.peak');
      if (existsSync(peakFile)) expect(readNumber(peakFile)).toBeLessThanOrEqual(64 * MiB);
      // The host process is unaffected and the sandbox still works.
      expect(process.memoryUsage().rss).toBeLessThan(1 * GiB);
      const after = await sbx.exec(`perl -e '$x = "a" x (8*1024*1024); print length $x'`);
      expect(after.stdout).toBe(String(8 * MiB));
      await sbx.kill();
    },
  );
});

describe('disk fill', () => {
  it.skipIf(!canRunNamespaces)(
    'writes stop at limits.diskBytes in /workspace, /tmp and /home/user',
    async () => {
      const sbx = await airlock.create({ limits: { diskBytes: 16 * MiB } });
      // Host side: the sandbox's disk is its own 16 MiB tmpfs, not the host filesystem.
      const disk = join(TEST_STATE_DIR, 'sandboxes', sbx.id, 'disk');
      const mount = readFileSync('/proc/self/mountinfo', 'utf8')
        .split('\n')
        .find((l) => l.split(' ')[4] === disk);
      expect(mount).toMatch(/ - tmpfs /);
      const fs = statfsSync(disk);
      expect(fs.blocks * fs.bsize).toBe(16 * MiB);

      for (const dir of ['/workspace', '/tmp', '/home/user']) {
        const r = await sbx.exec(`head -c 64M /dev/zero > ${dir}/fill; echo "rc=$?"; stat -c %s ${dir}/fill`);
        expect(r.stderr, dir).toMatch(/No space left on device/);
        const [rc, size] = r.stdout.trim().split('\n');
        expect(rc, dir).not.toBe('rc=0');
        expect(Number(size), dir).toBeLessThanOrEqual(16 * MiB);
        expect(Number(size), dir).toBeGreaterThan(8 * MiB);
        const free = await sbx.exec(`rm ${dir}/fill && echo ok > ${dir}/after && cat ${dir}/after`);
        expect(free.stdout, dir).toBe('ok\n');
      }
      await sbx.kill();
    },
  );

  it.skipIf(!canRunNamespaces)(
    'no other writable place (/, /dev, /dev/shm) escapes limits.diskBytes',
    async () => {
      const sbx = await airlock.create({ limits: { diskBytes: 16 * MiB } });
      for (const dir of ['/', '/dev', '/dev/shm']) {
        const f = `${dir.replace(/\/$/, '')}/fill`;
        const r = await sbx.exec(
          `head -c 32M /dev/zero > ${f}; echo "rc=$?"; stat -c %s ${f} 2>/dev/null || echo 0`,
        );
        const [rc, size] = r.stdout.trim().split('\n');
        expect(rc, dir).not.toBe('rc=0');
        expect(Number(size), dir).toBeLessThanOrEqual(16 * MiB);
      }
      await sbx.kill();
    },
  );
});

describe('output flood', () => {
  it.skipIf(!canRunNamespaces)(
    '1 GiB of stdout: a small result, the whole stream in the spill file, bounded host memory',
    async () => {
      const sbx = await airlock.create();
      const rssBefore = process.memoryUsage().rss;
      const rss = sampler(() => process.memoryUsage().rss, 10);
      const r = await sbx.exec('head -c 1G /dev/zero', { maxOutputBytes: 4096, timeoutMs: 110_000 });
      const rssPeak = rss.stop();
      try {
        expect(r.exitCode).toBe(0);
        expect(r.truncated).toEqual({ stdout: true, stderr: false });
        const marker = /\n…\[airlock: \d+ bytes of stdout omitted \(1073741824 total\); [^\]]*\]…\n/;
        expect(r.stdout).toMatch(marker);
        expect(Buffer.byteLength(r.stdout.replace(marker, ''))).toBeLessThanOrEqual(4096);
        expect(r.spillPath).toBeDefined();
        expect(statSync(r.spillPath!).size).toBe(GiB);
        expect(rssPeak - rssBefore).toBeLessThan(256 * MiB);
      } finally {
        if (r.spillPath) rmSync(r.spillPath, { force: true });
        await sbx.kill();
      }
    },
    120_000,
  );
});

describe('lifetime limits', () => {
  it.skipIf(!canRunNamespaces)('a timeout kills the whole process tree', async () => {
    const sbx = await airlock.create();
    const uid = sbx.info.hostUid;
    const sleepers = sampler(() => hostProcsOfUid(uid).filter((p) => p.argv[0] === 'sleep').length, 50);
    const r = await sbx.exec("sh -c 'sleep 100 & sleep 100 & sleep 100'", { timeoutMs: 500 });
    expect(sleepers.stop()).toBe(3); // the tree really existed on the host
    expect(r.killedBy).toBe('timeout');
    expect(r.signal).toBe('SIGKILL');
    expect(
      await settle(
        () => hostProcsOfUid(uid),
        (ps) => ps.length === 0,
      ),
    ).toEqual([]);
    expect(readNumber(join(sandboxCgroupDir('pids', sbx.id)!, 'pids.current'))).toBe(0);
    await sbx.kill();
  });

  it.skipIf(!canRunNamespaces)('a sandbox past its TTL is killed on its own', async () => {
    const sbx = await airlock.create({ ttlMs: 1500 });
    const uid = sbx.info.hostUid;
    const r = await sbx.exec('sleep 30', { timeoutMs: 30_000 });
    expect(r.killedBy).toBe('ttl');
    expect(r.durationMs).toBeLessThan(30_000);
    expect(sbx.alive).toBe(false);
    for (const attempt of [() => sbx.exec('true'), () => sbx.files.read('/tmp/x')]) {
      const err = await attempt().then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(AirlockError.is(err, 'SANDBOX_GONE'), String(err)).toBe(true);
    }
    // Host side: its processes, directory and cgroup are gone.
    expect(
      await settle(
        () => hostProcsOfUid(uid),
        (ps) => ps.length === 0,
      ),
    ).toEqual([]);
    expect(
      await settle(
        () => existsSync(join(TEST_STATE_DIR, 'sandboxes', sbx.id)),
        (e) => !e,
      ),
    ).toBe(false);
    expect(
      await settle(
        () => sandboxCgroupDir('pids', sbx.id),
        (d) => d === undefined,
      ),
    ).toBeUndefined();
  });

  it.skipIf(!canRunNamespaces)('an idle sandbox past its TTL is reaped too', async () => {
    const sbx = await airlock.create({ ttlMs: 1000 });
    expect((await sbx.exec('echo hi')).stdout).toBe('hi\n');
    expect(
      await settle(
        () => sbx.alive,
        (a) => !a,
        5_000,
      ),
    ).toBe(false);
    expect(
      await settle(
        () => existsSync(join(TEST_STATE_DIR, 'sandboxes', sbx.id)),
        (e) => !e,
      ),
    ).toBe(false);
    const err = await sbx.exec('true').then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(AirlockError.is(err, 'SANDBOX_GONE')).toBe(true);
  });
});
