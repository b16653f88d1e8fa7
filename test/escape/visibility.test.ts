// Escape suite: what a sandbox can see of the host (files, users, environment, processes,
// namespaces) and what the host sees of a sandboxed process (uid, capabilities, seccomp, namespaces).
// Every test runs on each tier; where the host-side view differs (on gVisor the sandboxed process is
// no host process: the host sees runsc, its gofer and the sentry), the gVisor test checks those.
import { randomBytes } from 'node:crypto';
import { existsSync, readFileSync } from 'node:fs';
import { hostname } from 'node:os';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ExecHandle, Sandbox } from '../../src/index.js';
import { canRunNamespaces, testAirlock, TEST_UID_RANGE } from '../helpers.js';
import {
  ancestry,
  canRunTier,
  cgroupProcs,
  expectNoResidue,
  hostProcsOfUid,
  NAMESPACES,
  nsLinks,
  readProcFile,
  sandboxHostProcs,
  sandboxRootEntries,
  sentryProcs,
  settle,
  statusField,
  TIERS,
  type HostProc,
} from './util.js';

// Set before any sandbox exists: nothing of the test process's environment may reach a sandbox.
const CANARY = `canary-${randomBytes(12).toString('hex')}`;
process.env.AIRLOCK_ESCAPE_CANARY = CANARY;

const airlock = testAirlock();
/** gVisor's sentry and gofer run as the host's nobody (sandbox root maps there too). */
const HOST_NOBODY = '65534';

afterAll(async () => {
  delete process.env.AIRLOCK_ESCAPE_CANARY;
  if (canRunNamespaces) await expectNoResidue(airlock);
});

/** Runs a shell script in the sandbox and returns its stdout; fails the test on a non-zero exit. */
async function shIn(s: Sandbox, script: string): Promise<string> {
  const r = await s.exec(script);
  expect(r.stderr).toBe('');
  expect(r.exitCode).toBe(0);
  return r.stdout;
}

/** A background `sleep 30`, returned once it runs (so gVisor's gofer and sentry are fully set up). */
async function startedSleep(s: Sandbox, env: Record<string, string> = {}): Promise<ExecHandle> {
  let started!: () => void;
  const running = new Promise<void>((r) => (started = r));
  const h = await s.exec('echo started; exec sleep 30', {
    background: true,
    env,
    onStdout: (t) => t.includes('started') && started(),
  });
  await running;
  return h;
}

function passwdNames(text: string): string[] {
  return text
    .split('\n')
    .filter((l) => l && !l.startsWith('#'))
    .map((l) => l.split(':')[0]!);
}

for (const backend of TIERS) {
  const canRun = canRunTier(backend);
  let sbx: Sandbox;
  const sh = (script: string, s: Sandbox = sbx): Promise<string> => shIn(s, script);

  beforeAll(async () => {
    if (canRun) sbx = await airlock.create({ backend });
  });

  describe(`the host filesystem is not visible [${backend}]`, () => {
    it.skipIf(!canRun)('the root directory holds only the sandbox layout', async () => {
      const out = await sh('ls -A /');
      expect(out.trim().split('\n').sort()).toEqual(sandboxRootEntries(backend));
    });

    it.skipIf(!canRun)('/root, /etc/shadow and the host /home are absent', async () => {
      // Positive control: these are real on the host.
      expect(existsSync('/root')).toBe(true);
      expect(existsSync('/etc/shadow')).toBe(true);
      const paths = [
        '/root',
        '/etc/shadow',
        '/etc/gshadow',
        '/etc/sudoers',
        '/etc/ssh',
        '/var',
        '/run',
        // gVisor mounts its own synthetic sysfs (checked below); the namespaces tier has no /sys.
        ...(backend === 'gvisor' ? [] : ['/sys']),
      ];
      const out = await sh(
        `for p in ${paths.join(' ')}; do if test -e "$p"; then echo "present $p"; fi; done`,
      );
      expect(out).toBe('');
      if (backend === 'gvisor') {
        // /sys is the sentry's sysfs: no host devices, network interfaces or cgroups behind it.
        expect(existsSync('/sys/class/net/lo')).toBe(true); // positive control: the host's has them
        const sys = await sh(
          [
            "grep ' /sys ' /proc/self/mountinfo | sed 's/.* - //'",
            'ls -A /sys/fs/cgroup',
            'test -e /sys/class/net; echo "class-net=$?"',
            'test -e /sys/kernel/security; echo "security=$?"',
          ].join('\n'),
        );
        expect(sys.trim().split('\n')).toEqual([
          expect.stringMatching(/^sysfs none /),
          'class-net=1',
          'security=1',
        ]);
      }
      const r = await sbx.exec('cat /etc/shadow');
      expect(r.exitCode).not.toBe(0);
      expect(r.stderr).toMatch(/No such file or directory/);
      expect(await sh('ls -A /home')).toBe('user\n');
    });

    it.skipIf(!canRun)('/etc/passwd and /etc/group are generated: no host users', async () => {
      const inside = passwdNames(await sh('cat /etc/passwd'));
      expect(inside.sort()).toEqual(['nobody', 'root', 'user']);
      const hostOnly = passwdNames(readFileSync('/etc/passwd', 'utf8')).filter(
        (n) => !['root', 'nobody', 'user'].includes(n),
      );
      expect(hostOnly.length).toBeGreaterThan(0); // the comparison means something on this host
      for (const n of hostOnly) expect(inside).not.toContain(n);
      expect(passwdNames(await sh('cat /etc/group')).sort()).toEqual(['nogroup', 'root', 'user']);
    });

    it.skipIf(!canRun)('has its own hostname', async () => {
      const inside = (await sh('hostname')).trim();
      expect(inside).toBe('airlock');
      expect(inside).not.toBe(hostname());
    });
  });

  describe(`the host environment does not leak [${backend}]`, () => {
    it.skipIf(!canRun)('env, /proc/self/environ and /proc/1/environ lack the host canary', async () => {
      expect(process.env.AIRLOCK_ESCAPE_CANARY).toBe(CANARY);
      const env = await sh('env');
      expect(env).toMatch(/^HOME=\/home\/user$/m); // positive control: this is the sandbox's env
      const self = await sh("tr '\\0' '\\n' < /proc/self/environ");
      expect(self).toMatch(/^PATH=/m);
      const init = await sbx.exec("tr '\\0' '\\n' < /proc/1/environ");
      for (const text of [env, self, init.stdout, init.stderr]) {
        expect(text).not.toContain(CANARY);
        expect(text).not.toContain('AIRLOCK_ESCAPE_CANARY');
      }
      // bwrap's own malloc setting is not the command's (pid 1 is bwrap itself, whose environ shows it).
      for (const text of [env, self]) expect(text).not.toContain('GLIBC_TUNABLES');
    });

    (backend === 'namespaces' ? it.skipIf(!canRun) : it.skip)(
      'host side: exec env stays off command lines; host env is absent from every sandbox process' +
        (backend === 'namespaces' ? '' : ' [skipped: bwrap-specific; gVisor: see the next test]'),
      async () => {
        const secret = `secret-${randomBytes(12).toString('hex')}`;
        const h = await sbx.exec(['sleep', '30'], { background: true, env: { AIRLOCK_EXEC_SECRET: secret } });
        try {
          const procs = await settle(
            () => hostProcsOfUid(sbx.info.hostUid),
            (ps) => ps.some((p) => p.argv[0] === 'sleep'),
          );
          const sleeper = procs.find((p) => p.argv[0] === 'sleep');
          expect(sleeper).toBeDefined();
          // Positive control: the command itself got the exec env.
          expect(readProcFile(sleeper!.pid, 'environ')).toContain(secret);
          const chain = ancestry(procs, sleeper!.pid);
          expect(chain.map((p) => p.argv[0]!.replace(/^.*\//, ''))).toEqual(['sleep', 'bwrap', 'bwrap']);
          for (const p of procs) {
            expect(p.argv.join(' ')).not.toContain(secret);
            expect(readProcFile(p.pid, 'environ') ?? '').not.toContain(CANARY);
          }
          // bwrap itself gets one fixed variable and nothing else of Airlock's environment (glibc
          // splits the tunables string in place, so it reads as several NUL-separated pieces).
          for (const p of chain.slice(1)) {
            const pieces = (readProcFile(p.pid, 'environ') ?? '').split('\0').filter(Boolean);
            expect(pieces[0]).toMatch(/^GLIBC_TUNABLES=glibc\.malloc\./);
            for (const piece of pieces)
              expect(piece).toMatch(/^(GLIBC_TUNABLES=)?glibc\.malloc\.[a-z_]+=\d+$/);
          }
        } finally {
          await h.kill();
        }
      },
    );

    (backend === 'gvisor' ? it.skipIf(!canRun) : it.skip)(
      'host side (gVisor): the exec env lives only in the sentry; no host process of the sandbox has it' +
        (backend === 'gvisor' ? '' : ' [skipped: gVisor only; see the previous test]'),
      async () => {
        const secret = `secret-${randomBytes(12).toString('hex')}`;
        // Positive control: the command itself gets the exec env.
        expect(await sh('env', sbx)).not.toContain(secret);
        const env = await sbx.exec('env', { env: { AIRLOCK_EXEC_SECRET: secret } });
        expect(env.stdout).toContain(`AIRLOCK_EXEC_SECRET=${secret}`);
        const h = await startedSleep(sbx, { AIRLOCK_EXEC_SECRET: secret });
        try {
          const procs = cgroupProcs(sbx.id);
          expect(procs.map((p) => p.argv[0])).toContain('runsc-sandbox');
          // The sandboxed `sleep` is not a host process at all.
          expect(hostProcsOfUid(sbx.info.hostUid)).toEqual([]);
          for (const p of [...procs, ...sandboxHostProcs(sbx.id, sbx.info.hostUid)]) {
            expect(p.argv.join(' ')).not.toContain(secret);
            const environ = readProcFile(p.pid, 'environ') ?? '';
            expect(environ).not.toContain(secret);
            expect(environ).not.toContain(CANARY);
          }
        } finally {
          await h.kill();
        }
      },
    );
  });

  describe(`processes [${backend}]`, () => {
    it.skipIf(!canRun)(
      `/proc/1 is ${backend === 'gvisor' ? "the exec's own command" : 'bwrap'}, and only a handful of pids exist`,
      async () => {
        const script = "tr '\\0' '\\n' < /proc/1/cmdline";
        const init = (await sh(script)).split('\n').filter(Boolean);
        if (backend === 'gvisor') expect(init).toEqual(['/bin/sh', '-c', script]);
        else expect(init[0]).toMatch(/(^|\/)bwrap$/);
        const hostInit = readFileSync('/proc/1/cmdline', 'utf8').split('\0').filter(Boolean);
        expect(init).not.toEqual(hostInit);
        const pids = (await sh('ls /proc'))
          .split('\n')
          .filter((n) => /^\d+$/.test(n))
          .map(Number);
        expect(pids).toContain(1);
        expect(pids.length).toBeLessThanOrEqual(8);
      },
    );

    it.skipIf(!canRun)('host pids (the test process, its parent) are not visible', async () => {
      const hostPids = [process.pid, process.ppid].filter((p) => p > 100);
      expect(hostPids.length).toBeGreaterThan(0);
      const out = await sh(hostPids.map((p) => `test -e /proc/${p} && echo "visible ${p}"; true`).join('\n'));
      expect(out).toBe('');
    });
  });

  describe(`namespaces and privileges [${backend}]`, () => {
    it.skipIf(!canRun)('inside view: every namespace differs from the host', async () => {
      const out = await sh(
        `for n in ${NAMESPACES.join(' ')}; do echo "$n $(readlink /proc/self/ns/$n)"; done`,
      );
      const inside = Object.fromEntries(
        out
          .trim()
          .split('\n')
          .map((l) => l.split(' ') as [string, string]),
      );
      const host = nsLinks();
      for (const n of NAMESPACES) {
        // gVisor implements no cgroup namespace (and mounts no cgroupfs): the link does not exist.
        if (backend === 'gvisor' && n === 'cgroup') {
          expect(inside[n] ?? '', n).toBe('');
          continue;
        }
        expect(inside[n]).toMatch(new RegExp(`^${n}:\\[\\d+\\]$`));
        expect(inside[n], n).not.toBe(host[n]);
      }
    });

    (backend === 'namespaces' ? it.skipIf(!canRun) : it.skip)(
      'host side: sandbox processes run as the host uid, unprivileged, seccomp-filtered, in other namespaces' +
        (backend === 'namespaces' ? '' : ' [skipped: bwrap-specific; gVisor: see the next test]'),
      async () => {
        const uid = sbx.info.hostUid;
        const h = await sbx.exec(['sleep', '30'], { background: true });
        try {
          const procs = await settle(
            () => hostProcsOfUid(uid),
            (ps) => ps.some((p) => p.argv[0] === 'sleep'),
          );
          const host = nsLinks();
          const sleeper = procs.find((p) => p.argv[0] === 'sleep');
          expect(sleeper).toBeDefined();
          for (const p of procs) {
            const ids = String(uid);
            expect(statusField(p.status, 'Uid').split(/\s+/)).toEqual([ids, ids, ids, ids]);
            expect(statusField(p.status, 'Gid').split(/\s+/)).toEqual([ids, ids, ids, ids]);
            expect(statusField(p.status, 'Groups')).toBe('');
            for (const c of ['CapInh', 'CapPrm', 'CapEff', 'CapAmb'])
              expect(statusField(p.status, c), c).toMatch(/^0+$/);
            expect(statusField(p.status, 'NoNewPrivs')).toBe('1');
          }
          // bwrap's monitor process stays in the host pid namespace (it only waits for its child);
          // everything else of the sandbox is inside.
          const inHostPidNs = (p: HostProc): boolean =>
            statusField(p.status, 'NSpid').split(/\s+/).length === 1;
          const chain = ancestry(procs, sleeper!.pid); // sleep ← bwrap (pid 1 inside) ← bwrap monitor
          expect(chain.map((p) => p.argv[0]!.replace(/^.*\//, ''))).toEqual(['sleep', 'bwrap', 'bwrap']);
          expect(chain.map(inHostPidNs)).toEqual([false, false, true]);
          const confined = chain.slice(0, -1);
          for (const p of confined) {
            expect(statusField(p.status, 'Seccomp')).toBe('2');
            expect(statusField(p.status, 'CapBnd')).toMatch(/^0+$/);
            const ns = nsLinks(p.pid);
            for (const n of NAMESPACES) expect(ns[n], `${p.argv[0]} ${n}`).not.toBe(host[n]);
          }
        } finally {
          await h.kill();
        }
        const left = await settle(
          () => hostProcsOfUid(uid),
          (ps) => ps.length === 0,
        );
        expect(left).toEqual([]);
      },
    );

    (backend === 'gvisor' ? it.skipIf(!canRun) : it.skip)(
      'host side (gVisor): only runsc runs as root, in the cgroup; gofer and sentry are unprivileged nobody, seccomp-filtered, in other namespaces' +
        (backend === 'gvisor' ? '' : ' [skipped: gVisor only; see the previous test]'),
      async () => {
        const uid = sbx.info.hostUid;
        const h = await startedSleep(sbx);
        try {
          const procs = cgroupProcs(sbx.id);
          expect(procs.map((p) => p.argv[0])).toEqual(
            expect.arrayContaining(['runsc-gofer', 'runsc-sandbox']),
          );
          const host = nsLinks();
          // The sandboxed process is no host process: nothing runs as the sandbox's host uid. Only its
          // sentry knows it (as uid 1000 of the sandbox), and reports it to the host through runsc.
          expect(hostProcsOfUid(uid)).toEqual([]);
          expect((await sentryProcs(sbx.id)).map((p) => [p.uid, p.cmd])).toEqual([[1000, 'sleep']]);
          // Every host process of the sandbox (found by its dir on the command line) is in its cgroup.
          const inCgroup = new Set(procs.map((p) => p.pid));
          for (const p of sandboxHostProcs(sbx.id, sbx.info.hostUid))
            expect(inCgroup.has(p.pid), p.argv.join(' ')).toBe(true);

          // runsc itself is root (it builds the sentry's namespaces and chroot), one per running exec,
          // and runs in the sandbox's routeless netns, not the host's.
          const roots = procs.filter((p) => statusField(p.status, 'Uid').split(/\s+/)[0] === '0');
          expect(roots.map((p) => p.argv[0])).toEqual(['/usr/bin/runsc']);
          const runsc = roots[0]!;
          expect(nsLinks(runsc.pid).net).not.toBe(host.net);

          const others = procs.filter((p) => p !== runsc);
          expect(others.length).toBeGreaterThanOrEqual(2); // gofer, sentry (and the sentry's stubs)
          for (const p of others) {
            const what = p.argv[0] ?? `stub ${p.pid}`;
            const ids = HOST_NOBODY;
            expect(statusField(p.status, 'Uid').split(/\s+/), what).toEqual([ids, ids, ids, ids]);
            expect(statusField(p.status, 'Gid').split(/\s+/), what).toEqual([ids, ids, ids, ids]);
            expect(statusField(p.status, 'Groups'), what).toBe('');
            expect(statusField(p.status, 'NoNewPrivs'), what).toBe('1');
            expect(statusField(p.status, 'Seccomp'), what).toBe('2');
            // Whatever capabilities they hold are in their own user namespace, not the host's.
            const ns = nsLinks(p.pid);
            for (const n of ['user', 'mnt', 'net', 'ipc', 'uts'] as const)
              expect(ns[n], `${what} ${n}`).not.toBe(host[n]);
            // Each descends from this exec's runsc: nothing of gVisor was started by anyone else.
            expect(ancestry(procs, p.pid).at(-1)?.pid, what).toBe(runsc.pid);
          }
        } finally {
          await h.kill();
        }
        const left = await settle(
          () => [...sandboxHostProcs(sbx.id, sbx.info.hostUid), ...cgroupProcs(sbx.id)],
          (ps) => ps.length === 0,
        );
        expect(left).toEqual([]);
      },
    );

    it.skipIf(!canRun)('uid 1000 inside; each live sandbox has its own unprivileged host uid', async () => {
      const other = await airlock.create({ backend });
      try {
        for (const s of [sbx, other]) {
          expect(await sh('id -u; id -g', s)).toBe('1000\n1000\n');
          expect(s.info.hostUid).toBeGreaterThan(0);
          expect(s.info.hostUid).toBeGreaterThanOrEqual(TEST_UID_RANGE.first);
          expect(s.info.hostUid).toBeLessThan(TEST_UID_RANGE.first + TEST_UID_RANGE.count);
        }
        expect(other.info.hostUid).not.toBe(sbx.info.hostUid);
      } finally {
        await other.kill();
      }
    });
  });
}
