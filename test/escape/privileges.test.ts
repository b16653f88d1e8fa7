// Escape suite: privileged operations from inside — mounting, ptrace, new user namespaces,
// capabilities, kernel tunables.
import { spawn, spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Sandbox } from '../../src/index.js';
import { canRunNamespaces, testAirlock } from '../helpers.js';
import { expectNoResidue, fixture } from './util.js';

const EPERM = 1;

const airlock = testAirlock();
let sbx: Sandbox;

beforeAll(async () => {
  if (canRunNamespaces) sbx = await airlock.create();
});

afterAll(async () => {
  if (canRunNamespaces) await expectNoResidue(airlock);
});

describe('privileged operations fail', () => {
  it.skipIf(!canRunNamespaces)('mount and umount fail and change nothing', async () => {
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

  it.skipIf(!canRunNamespaces)('ptrace(PTRACE_ATTACH) fails with EPERM', async () => {
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
    // Targets of the same uid (DAC alone would allow it): pid 1 (bwrap) and a sibling process.
    for (const target of ['1', '"$!"']) {
      const r = await sbx.exec(`sleep 10 & perl - ${target}; rc=$?; kill $!; exit $rc`, {
        stdin: fixture('ptrace-attach.pl'),
      });
      expect(r.stderr, target).toBe('');
      expect(r.stdout.trim(), target).toMatch(new RegExp(`^errno=${EPERM} `));
      expect(r.exitCode).toBe(1);
    }
  });

  it.skipIf(!canRunNamespaces)('cannot create user (or any other) namespaces', async () => {
    for (const args of ['-U', '-Ur', '-m', '-n', '-p -f', '-C']) {
      const r = await sbx.exec(`unshare ${args} true`);
      expect(r.exitCode, `unshare ${args}`).not.toBe(0);
      expect(r.stderr, `unshare ${args}`).toMatch(/Operation not permitted|Permission denied/);
    }
  });

  it.skipIf(!canRunNamespaces)('has no capabilities, no_new_privs and a seccomp filter', async () => {
    const r = await sbx.exec("grep -E '^(Cap[A-Za-z]+|NoNewPrivs|Seccomp):' /proc/self/status");
    const f = Object.fromEntries(
      r.stdout
        .trim()
        .split('\n')
        .map((l) => l.split(/:\s*/) as [string, string]),
    );
    expect(Object.keys(f).sort()).toEqual(
      ['CapAmb', 'CapBnd', 'CapEff', 'CapInh', 'CapPrm', 'NoNewPrivs', 'Seccomp'].sort(),
    );
    for (const c of ['CapAmb', 'CapBnd', 'CapEff', 'CapInh', 'CapPrm']) expect(f[c], c).toMatch(/^0+$/);
    expect(f.NoNewPrivs).toBe('1');
    expect(f.Seccomp).toBe('2');
  });

  it.skipIf(!canRunNamespaces)('kernel tunables and raw memory are out of reach', async () => {
    const r = await sbx.exec(
      [
        'echo 1 > /proc/sys/kernel/core_pattern 2>/dev/null; echo "core_pattern=$?"',
        'echo 1 > /proc/sys/vm/drop_caches 2>/dev/null; echo "drop_caches=$?"',
        'echo h > /proc/sysrq-trigger 2>/dev/null; echo "sysrq=$?"',
        'head -c 1 /proc/kcore >/dev/null 2>&1; echo "kcore=$?"',
        'head -c 1 /dev/mem >/dev/null 2>&1; echo "mem=$?"',
        'test -e /sys/fs/cgroup; echo "cgroupfs=$?"',
      ].join('\n'),
    );
    for (const l of r.stdout.trim().split('\n')) expect(l).toMatch(/=(?!0$)\d+$/);
    expect(r.stdout.trim().split('\n')).toHaveLength(6);
  });
});
