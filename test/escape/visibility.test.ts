// Escape suite: what a sandbox can see of the host (files, users, environment, processes,
// namespaces) and what the host sees of a sandboxed process (uid, capabilities, seccomp, namespaces).
import { randomBytes } from 'node:crypto';
import { existsSync, readFileSync } from 'node:fs';
import { hostname } from 'node:os';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Sandbox } from '../../src/index.js';
import { canRunNamespaces, testAirlock, TEST_UID_RANGE } from '../helpers.js';
import {
  ancestry,
  expectNoResidue,
  hostProcsOfUid,
  NAMESPACES,
  nsLinks,
  readProcFile,
  settle,
  statusField,
  type HostProc,
  SANDBOX_ROOT_ENTRIES,
} from './util.js';

// Set before any sandbox exists: nothing of the test process's environment may reach a sandbox.
const CANARY = `canary-${randomBytes(12).toString('hex')}`;
process.env.AIRLOCK_ESCAPE_CANARY = CANARY;

const airlock = testAirlock();
let sbx: Sandbox;

beforeAll(async () => {
  if (canRunNamespaces) sbx = await airlock.create();
});

afterAll(async () => {
  delete process.env.AIRLOCK_ESCAPE_CANARY;
  if (canRunNamespaces) await expectNoResidue(airlock);
});

/** Runs a shell script in the sandbox and returns its stdout; fails the test on a non-zero exit. */
async function sh(script: string, s: Sandbox = sbx): Promise<string> {
  const r = await s.exec(script);
  expect(r.stderr).toBe('');
  expect(r.exitCode).toBe(0);
  return r.stdout;
}

function passwdNames(text: string): string[] {
  return text
    .split('\n')
    .filter((l) => l && !l.startsWith('#'))
    .map((l) => l.split(':')[0]!);
}

describe('the host filesystem is not visible', () => {
  it.skipIf(!canRunNamespaces)('the root directory holds only the sandbox layout', async () => {
    const out = await sh('ls -A /');
    expect(out.trim().split('\n').sort()).toEqual([...SANDBOX_ROOT_ENTRIES]);
  });

  it.skipIf(!canRunNamespaces)('/root, /etc/shadow and the host /home are absent', async () => {
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
      '/sys',
    ];
    const out = await sh(`for p in ${paths.join(' ')}; do if test -e "$p"; then echo "present $p"; fi; done`);
    expect(out).toBe('');
    const r = await sbx.exec('cat /etc/shadow');
    expect(r.exitCode).not.toBe(0);
    expect(r.stderr).toMatch(/No such file or directory/);
    expect(await sh('ls -A /home')).toBe('user\n');
  });

  it.skipIf(!canRunNamespaces)('/etc/passwd and /etc/group are generated: no host users', async () => {
    const inside = passwdNames(await sh('cat /etc/passwd'));
    expect(inside.sort()).toEqual(['nobody', 'root', 'user']);
    const hostOnly = passwdNames(readFileSync('/etc/passwd', 'utf8')).filter(
      (n) => !['root', 'nobody', 'user'].includes(n),
    );
    expect(hostOnly.length).toBeGreaterThan(0); // the comparison means something on this host
    for (const n of hostOnly) expect(inside).not.toContain(n);
    expect(passwdNames(await sh('cat /etc/group')).sort()).toEqual(['nogroup', 'root', 'user']);
  });

  it.skipIf(!canRunNamespaces)('has its own hostname', async () => {
    const inside = (await sh('hostname')).trim();
    expect(inside).toBe('airlock');
    expect(inside).not.toBe(hostname());
  });
});

describe('the host environment does not leak', () => {
  it.skipIf(!canRunNamespaces)(
    'env, /proc/self/environ and /proc/1/environ lack the host canary',
    async () => {
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
    },
  );

  it.skipIf(!canRunNamespaces)(
    'host side: exec env stays off command lines; host env is absent from every sandbox process',
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
      } finally {
        await h.kill();
      }
    },
  );
});

describe('processes', () => {
  it.skipIf(!canRunNamespaces)('/proc/1 is bwrap, and only a handful of pids exist', async () => {
    const init = (await sh("tr '\\0' '\\n' < /proc/1/cmdline")).split('\n').filter(Boolean);
    expect(init[0]).toMatch(/(^|\/)bwrap$/);
    const hostInit = readFileSync('/proc/1/cmdline', 'utf8').split('\0').filter(Boolean);
    expect(init).not.toEqual(hostInit);
    const pids = (await sh('ls /proc'))
      .split('\n')
      .filter((n) => /^\d+$/.test(n))
      .map(Number);
    expect(pids).toContain(1);
    expect(pids.length).toBeLessThanOrEqual(8);
  });

  it.skipIf(!canRunNamespaces)('host pids (the test process, its parent) are not visible', async () => {
    const hostPids = [process.pid, process.ppid].filter((p) => p > 100);
    expect(hostPids.length).toBeGreaterThan(0);
    const out = await sh(hostPids.map((p) => `test -e /proc/${p} && echo "visible ${p}"; true`).join('\n'));
    expect(out).toBe('');
  });
});

describe('namespaces and privileges', () => {
  it.skipIf(!canRunNamespaces)('inside view: every namespace differs from the host', async () => {
    const out = await sh(`for n in ${NAMESPACES.join(' ')}; do echo "$n $(readlink /proc/self/ns/$n)"; done`);
    const inside = Object.fromEntries(
      out
        .trim()
        .split('\n')
        .map((l) => l.split(' ') as [string, string]),
    );
    const host = nsLinks();
    for (const n of NAMESPACES) {
      expect(inside[n]).toMatch(new RegExp(`^${n}:\\[\\d+\\]$`));
      expect(inside[n], n).not.toBe(host[n]);
    }
  });

  it.skipIf(!canRunNamespaces)(
    'host side: sandbox processes run as the host uid, unprivileged, seccomp-filtered, in other namespaces',
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

  it.skipIf(!canRunNamespaces)(
    'uid 1000 inside; each live sandbox has its own unprivileged host uid',
    async () => {
      const other = await airlock.create();
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
    },
  );
});
