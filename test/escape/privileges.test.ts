// Escape suite: privileged operations from inside — mounting, ptrace, new user namespaces,
// capabilities, kernel tunables. Every test runs on each tier.
import { spawn, spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Sandbox } from '../../src/index.js';
import { canRunNamespaces, testAirlock } from '../helpers.js';
import { canRunTier, expectNoResidue, fixture, TIERS } from './util.js';

const EPERM = 1;

const airlock = testAirlock();

afterAll(async () => {
  if (canRunNamespaces) await expectNoResidue(airlock);
});

for (const backend of TIERS) {
  const canRun = canRunTier(backend);
  let sbx: Sandbox;

  beforeAll(async () => {
    if (canRun) sbx = await airlock.create({ backend });
  });

  describe(`privileged operations fail [${backend}]`, () => {
    it.skipIf(!canRun)('mount and umount fail and change nothing', async () => {
      expect(readFileSync('/proc/self/mountinfo', 'utf8')).not.toContain('escape-tmpfs');
      const r = await sbx.exec(
        [
          'echo keep > /tmp/marker',
          'mount -t tmpfs escape-tmpfs /tmp 2>/dev/null; echo "mount-tmpfs=$?"',
          'mount --bind /usr /workspace 2>/dev/null; echo "mount-bind=$?"',
          'umount /workspace 2>/dev/null; echo "umount=$?"',
          'umount -l /etc 2>/dev/null; echo "umount-lazy=$?"',
          'cat /tmp/marker',
          'grep -c escape-tmpfs /proc/self/mountinfo',
        ].join('\n'),
      );
      const lines = r.stdout.trim().split('\n');
      for (const l of lines.slice(0, 4)) expect(l).toMatch(/=(?!0$)\d+$/);
      expect(lines[4]).toBe('keep'); // /tmp is still the sandbox disk
      expect(lines[5]).toBe('0');
      expect(readFileSync('/proc/self/mountinfo', 'utf8')).not.toContain('escape-tmpfs');
    });

    it.skipIf(!canRun)('ptrace(PTRACE_ATTACH) fails with EPERM', async () => {
      // Positive control: the fixture does attach on the host (root, to its own child).
      const victim = spawn('sleep', ['30'], { stdio: 'ignore' });
      try {
        const host = spawnSync('perl', ['-', String(victim.pid)], {
          input: fixture('ptrace-attach.pl'),
          encoding: 'utf8',
        });
        expect(host.stdout.trim()).toBe('attached');
      } finally {
        victim.kill('SIGKILL');
      }
      // Targets of the same uid (DAC alone would allow it): pid 1 (bwrap; on gVisor the exec's own
      // shell) and a sibling process.
      for (const target of ['1', '"$!"']) {
        const r = await sbx.exec(`sleep 10 & perl - ${target}; rc=$?; kill $!; exit $rc`, {
          stdin: fixture('ptrace-attach.pl'),
        });
        expect(r.stderr, target).toBe('');
        expect(r.stdout.trim(), target).toMatch(new RegExp(`^errno=${EPERM} `));
        expect(r.exitCode).toBe(1);
      }
    });

    it.skipIf(!canRun)('cannot create user (or any other) namespaces', async () => {
      for (const args of ['-U', '-Ur', '-m', '-n', '-p -f', '-C']) {
        const r = await sbx.exec(`unshare ${args} true`);
        expect(r.exitCode, `unshare ${args}`).not.toBe(0);
        expect(r.stderr, `unshare ${args}`).toMatch(/Operation not permitted|Permission denied/);
      }
    });

    it.skipIf(!canRun)('has no capabilities, no_new_privs and a seccomp filter', async () => {
      const r = await sbx.exec("grep -E '^(Cap[A-Za-z]+|NoNewPrivs|Seccomp):' /proc/self/status");
      const f = Object.fromEntries(
        r.stdout
          .trim()
          .split('\n')
          .map((l) => l.split(/:\s*/) as [string, string]),
      );
      if (backend === 'gvisor') {
        // The sentry's /proc/<pid>/status has no CapAmb or NoNewPrivs line: prctl(2) answers instead.
        expect(Object.keys(f).sort()).toEqual(['CapBnd', 'CapEff', 'CapInh', 'CapPrm', 'Seccomp'].sort());
        for (const c of ['CapBnd', 'CapEff', 'CapInh', 'CapPrm']) expect(f[c], c).toMatch(/^0+$/);
        expect(f.Seccomp).toBe('2');
        // prctl(PR_GET_NO_NEW_PRIVS); prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_IS_SET, cap) for caps 0..40;
        // prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, CAP_SYS_ADMIN).
        const p = await sbx.exec([
          'perl',
          '-e',
          'print syscall(157, 39, 0, 0, 0, 0), "\n"; ' +
            'print scalar(grep { syscall(157, 47, 1, $_, 0, 0) == 1 } 0 .. 40), "\n"; ' +
            'print syscall(157, 47, 2, 21, 0, 0), "\n"',
        ]);
        expect(p.stderr).toBe('');
        expect(p.stdout.trim().split('\n')).toEqual(['1', '0', '-1']);
        return;
      }
      expect(Object.keys(f).sort()).toEqual(
        ['CapAmb', 'CapBnd', 'CapEff', 'CapInh', 'CapPrm', 'NoNewPrivs', 'Seccomp'].sort(),
      );
      for (const c of ['CapAmb', 'CapBnd', 'CapEff', 'CapInh', 'CapPrm']) expect(f[c], c).toMatch(/^0+$/);
      expect(f.NoNewPrivs).toBe('1');
      expect(f.Seccomp).toBe('2');
    });

    it.skipIf(!canRun)('kernel tunables and raw memory are out of reach', async () => {
      const r = await sbx.exec(
        [
          'echo 1 > /proc/sys/kernel/core_pattern 2>/dev/null; echo "core_pattern=$?"',
          'echo 1 > /proc/sys/vm/drop_caches 2>/dev/null; echo "drop_caches=$?"',
          'echo h > /proc/sysrq-trigger 2>/dev/null; echo "sysrq=$?"',
          'head -c 1 /proc/kcore >/dev/null 2>&1; echo "kcore=$?"',
          'head -c 1 /dev/mem >/dev/null 2>&1; echo "mem=$?"',
          ...(backend === 'gvisor'
            ? [
                // gVisor's own sysfs has an empty /sys/fs/cgroup directory; no cgroupfs is mounted.
                'ls -A /sys/fs/cgroup | grep -q .; echo "cgroupfs=$?"',
                'grep -q cgroup /proc/self/mountinfo; echo "cgroup-mount=$?"',
              ]
            : ['test -e /sys/fs/cgroup; echo "cgroupfs=$?"']),
        ].join('\n'),
      );
      for (const l of r.stdout.trim().split('\n')) expect(l).toMatch(/=(?!0$)\d+$/);
      expect(r.stdout.trim().split('\n')).toHaveLength(backend === 'gvisor' ? 7 : 6);
    });
  });
}
