// The VMM jail helper (guest/vmm-jail.c, spawned by src/backends/microvm/qemu.privileged.ts
// startQemu with jailArgv's argv), run for real as root with a shell payload in QEMU's place. What the
// payload is, seen from the host: its mounts (only the jail's, each with its flags, the root
// read-only), its credentials (the leased uid, no groups, no capabilities at all, no_new_privs, a
// seccomp filter), PID 1 of a PID namespace of its own; killing the outer process takes it along, and
// no mount is left on the host. Each bad input (closed gate, bad filter, relative path, uid 0, missing
// source, unknown flag) fails before the exec: the payload never runs.
import { spawn, spawnSync } from 'node:child_process';
import {
  chownSync,
  closeSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  readFileSync,
  readdirSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { join } from 'node:path';
import type { Readable, Writable } from 'node:stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ensureVmmJail } from '../../src/backends/microvm/assets.js';
import { jailArgv, jailSkeleton } from '../../src/backends/microvm/qemu.privileged.js';
import { vmmSeccompFilter } from '../../src/backends/microvm/seccomp.js';
import { canRunNamespaces, TEST_STATE_DIR, TEST_UID_RANGE } from '../helpers.js';

const UID = TEST_UID_RANGE.first + 7;

/** The helper is compiled here (gcc -static, as assets.ts does) and run as root. */
const canBuild = canRunNamespaces && spawnSync('sh', ['-c', 'command -v gcc']).status === 0;

describe.skipIf(!canBuild)(
  'microVM jail helper (needs root, bubblewrap and gcc: run scripts/setup.sh)',
  () => {
    let base = '';
    let helper = '';
    let jail: Parameters<typeof jailArgv>[1];
    const filterFile = (): string => join(base, 'filter.bpf');
    beforeAll(async () => {
      mkdirSync(TEST_STATE_DIR, { recursive: true });
      base = mkdtempSync(join(TEST_STATE_DIR, 'jail test-'));
      helper = await ensureVmmJail(join(base, 'cache'));
      const file = (name: string): string => {
        writeFileSync(join(base, name), name);
        return join(base, name);
      };
      jail = {
        dir: join(base, 'jail root'),
        kernel: file('vm linuz'),
        initramfs: file('initramfs'),
        rootfs: file('root fs'),
        vmDir: join(base, 'vm'),
        spillDir: join(base, 'spill'),
        kvm: false,
      };
      for (const d of [jail.dir, jail.vmDir, jail.spillDir]) mkdirSync(d);
      chownSync(jail.vmDir, UID, UID);
      jailSkeleton(jail.dir, false);
      jailSkeleton(jail.dir, false); // again: a second start of the sandbox
      writeFileSync(filterFile(), vmmSeccompFilter());
    }, 120_000);
    afterAll(() => base && rmSync(base, { recursive: true, force: true }));

    /** Runs the helper; `gate` false closes the gate unopened. */
    function run(argv: string[], o: { gate?: boolean; filter?: string } = {}) {
      const filterFd = openSync(o.filter ?? filterFile(), 'r');
      const child = spawn(helper, argv, {
        env: {},
        cwd: '/',
        stdio: ['ignore', 'pipe', 'pipe', 'pipe', 'ignore', 'ignore', filterFd],
      });
      closeSync(filterFd);
      let out = '';
      let err = '';
      child.stdout!.on('data', (c: Buffer) => void (out += c.toString()));
      child.stderr!.on('data', (c: Buffer) => void (err += c.toString()));
      const gate = (child.stdio as unknown as Array<Readable & Writable>)[3]!;
      gate.on('error', () => {});
      gate.end(o.gate === false ? undefined : 'go\n');
      const exited = new Promise<{ code: number | null; signal: string | null }>((res) =>
        child.on('exit', (code, signal) => res({ code, signal })),
      );
      return { child, exited, out: () => out, err: () => err };
    }
    const ran = (): string => join(jail.vmDir, 'ran');
    const payload = (script: string): string[] => ['/usr/bin/sh', '-c', script];

    async function inner(outer: number): Promise<number> {
      for (;;) {
        const kids = readFileSync(`/proc/${outer}/task/${outer}/children`, 'utf8').trim();
        if (kids) {
          const pid = Number(kids.split(' ')[0]);
          if (readFileSync(`/proc/${pid}/comm`, 'utf8').trim() === 'sleep') return pid;
        }
        await new Promise((r) => setTimeout(r, 20));
      }
    }

    it('jails the payload: mounts, credentials, PID namespace; a kill of the outer takes it along', async () => {
      const r = run(jailArgv(UID, jail, payload('ls -a /; cat /boot/rootfs; echo; exec /usr/bin/sleep 600')));
      const pid = await inner(r.child.pid!);
      const status = readFileSync(`/proc/${pid}/status`, 'utf8');
      const field = (k: string): string => new RegExp(`^${k}:[\\t ]*(.*)$`, 'm').exec(status)![1]!.trim();
      expect(field('Uid').split(/\s+/)).toEqual([`${UID}`, `${UID}`, `${UID}`, `${UID}`]);
      expect(field('Gid').split(/\s+/)).toEqual([`${UID}`, `${UID}`, `${UID}`, `${UID}`]);
      expect(field('Groups')).toBe('');
      for (const c of ['CapInh', 'CapPrm', 'CapEff', 'CapBnd', 'CapAmb'])
        expect([c, field(c)]).toEqual([c, '0000000000000000']);
      expect(field('NoNewPrivs')).toBe('1');
      expect(field('Seccomp')).toBe('2');
      // PID 1 of its own namespace (NSpid: host pid, then 1).
      expect(field('NSpid').split(/\s+/)).toEqual([`${pid}`, '1']);
      // Mounts as the payload sees them: exactly the jail's, with their flags.
      const mounts = new Map(
        readFileSync(`/proc/${pid}/mountinfo`, 'utf8')
          .trim()
          .split('\n')
          .map((l) => l.split(' '))
          .map((f) => [f[4]!, f[5]!]),
      );
      expect([...mounts.keys()].sort()).toEqual(
        [
          '/',
          '/usr',
          '/boot/vmlinuz',
          '/boot/initramfs',
          '/boot/rootfs',
          '/vm',
          '/spill',
          '/dev/null',
          '/dev/urandom',
        ].sort(),
      );
      expect(mounts.get('/')).toMatch(/^ro,nosuid,nodev\b/);
      for (const at of ['/usr', '/boot/vmlinuz', '/boot/initramfs', '/boot/rootfs'])
        expect([at, mounts.get(at)]).toEqual([at, expect.stringMatching(/^ro,nosuid,nodev\b/)]);
      for (const at of ['/vm', '/spill'])
        expect([at, mounts.get(at)]).toEqual([at, expect.stringMatching(/^rw,nosuid,nodev,noexec\b/)]);
      for (const at of ['/dev/null', '/dev/urandom'])
        expect([at, mounts.get(at)]).toEqual([at, expect.stringMatching(/^ro,nosuid,noexec\b/)]);
      // Nothing open but 0-2 (fds 4 and 5 were not given here).
      expect(readdirSync(`/proc/${pid}/fd`).sort()).toEqual(['0', '1', '2']);

      // Killing the outer (what Airlock's kill() does) takes the payload along.
      r.child.kill('SIGKILL');
      await r.exited;
      while (
        existsSync(`/proc/${pid}/status`) &&
        !/^State:\s*Z/m.test(readFileSync(`/proc/${pid}/status`, 'utf8'))
      )
        await new Promise((res) => setTimeout(res, 20));
      expect(r.out()).toContain('.old');
      expect(r.out()).toContain('root fs');
      // No mount left on the host.
      expect(readFileSync('/proc/self/mountinfo', 'utf8')).not.toContain(base.replaceAll(' ', '\\040'));
    }, 60_000);

    it('relays how the payload ended: its exit status, or the signal that killed it', async () => {
      const r = run(jailArgv(UID, jail, payload(': > /vm/ran; exit 7')));
      expect((await r.exited).code).toBe(7);
      expect(existsSync(ran())).toBe(true);
      rmSync(ran());
      // Killed from outside (as the host's OOM killer would end QEMU): the outer dies of that signal.
      const k = run(jailArgv(UID, jail, payload('exec /usr/bin/sleep 600')));
      process.kill(await inner(k.child.pid!), 'SIGKILL');
      expect(await k.exited).toEqual({ code: null, signal: 'SIGKILL' });
    });

    const touch = (): string[] => jailArgv(UID, jail, payload(': > /vm/ran'));
    const failsBeforeExec = async (r: ReturnType<typeof run>, code: number, msg: RegExp) => {
      const e = await r.exited;
      expect([e.code, r.err()]).toEqual([code, expect.stringMatching(msg)]);
      expect(existsSync(ran())).toBe(false);
    };

    it('runs nothing when the gate closes unopened (Airlock died)', async () => {
      await failsBeforeExec(run(touch(), { gate: false }), 125, /gate/);
    });

    it('refuses a bad seccomp filter', async () => {
      const bad = join(base, 'bad.bpf');
      writeFileSync(bad, Buffer.alloc(5));
      await failsBeforeExec(run(touch(), { filter: bad }), 126, /filter/);
      writeFileSync(bad, '');
      await failsBeforeExec(run(touch(), { filter: bad }), 126, /filter/);
    });

    it('refuses uid 0, relative or dotted paths, unknown flags, a missing source', async () => {
      const argv = touch();
      const swap = (i: number, v: string): string[] => argv.map((a, j) => (j === i ? v : a));
      const kernelSrc = argv.indexOf(jail.kernel);
      await failsBeforeExec(run(swap(0, '0')), 126, /uid/);
      await failsBeforeExec(run(swap(0, '-5')), 126, /uid/);
      await failsBeforeExec(run(swap(1, 'jail')), 126, /ROOT/);
      await failsBeforeExec(run(swap(kernelSrc, 'vm linuz')), 126, /absolute/);
      await failsBeforeExec(run(swap(kernelSrc, `${base}/../x`)), 126, /absolute/);
      await failsBeforeExec(run(swap(kernelSrc + 1, 'boot/vmlinuz')), 126, /absolute/);
      await failsBeforeExec(run(swap(kernelSrc + 2, 'ro,suid')), 126, /unknown mount flag/);
      await failsBeforeExec(run(swap(2, '17')), 126, /count/);
      await failsBeforeExec(run(swap(argv.indexOf('--') + 1, '/bin/sh')), 126, /PROGRAM/);
      await failsBeforeExec(run(swap(kernelSrc, join(base, 'missing'))), 126, /binding/);
      expect(readFileSync('/proc/self/mountinfo', 'utf8')).not.toContain(base.replaceAll(' ', '\\040'));
    });

    it('builds no argv for uid 0 or a relative path', () => {
      expect(() => jailArgv(0, jail, ['/usr/bin/true'])).toThrow(/uid 0/);
      expect(() => jailArgv(UID, { ...jail, rootfs: 'rootfs' }, ['/usr/bin/true'])).toThrow(/absolute/);
      expect(jailArgv(UID, { ...jail, kvm: true }, ['/usr/bin/true'])).toContain('/dev/kvm');
    });
  },
);
