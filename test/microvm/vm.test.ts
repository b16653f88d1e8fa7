// What the microVM tier promises beyond the contract: each sandbox is its own guest kernel; QEMU runs
// as the sandbox's leased uid inside its cgroup, with no network device unless the spec has a network
// policy (test/egress/microvm.test.ts); pause freezes the whole VM; specs the tier cannot honour are
// refused with a typed error and leave nothing behind; kill leaves no QEMU.
import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { MICROVM_SKIP_REASON, canRunMicrovm, myQemus } from './qemus.js';
import { afterAll, afterEach, describe, expect, it, vi } from 'vitest';
import { Sandbox, type Airlock } from '../../src/index.js';
import { settledResidue, testAirlock, NO_RESIDUE } from '../helpers.js';
import { expectError } from '../contract/support.js';

const qemus = myQemus;

/** A real host dir, so the refusal is the tier's own, not the host's path checks. */
const HOST_DIR = mkdtempSync('/var/tmp/airlock-mvm-');

describe.skipIf(!canRunMicrovm)(`microvm tier (${MICROVM_SKIP_REASON})`, () => {
  vi.setConfig({ testTimeout: 600_000, hookTimeout: 600_000 });
  let airlock: Airlock;
  const owned: Sandbox[] = [];
  const create = async (): Promise<Sandbox> => {
    airlock ??= testAirlock();
    const s = await Sandbox.create({ backend: 'microvm' }, { airlock });
    owned.push(s);
    return s;
  };
  afterEach(async () => {
    await Promise.allSettled(owned.splice(0).map((s) => s.kill()));
  });
  afterAll(async () => {
    rmSync(HOST_DIR, { recursive: true, force: true });
    await airlock?.killAll();
    expect(qemus()).toEqual([]);
    expect(await settledResidue()).toEqual(NO_RESIDUE);
  });

  it('runs on a guest kernel of its own, with QEMU as the leased uid in the cgroup and no NIC', async () => {
    const sbx = await create();
    const guest = await sbx.exec('uname -r; cat /proc/1/comm; ls /sys/class/net');
    const [release, init, ...nics] = guest.stdout.trim().split('\n');
    expect(release).toMatch(/cloud-amd64$/);
    expect(release).not.toBe(execFileSync('uname', ['-r'], { encoding: 'utf8' }).trim());
    expect(init).toBe('init'); // the agent is the guest's PID 1
    expect(nics).toEqual(['lo']);
    const mine = qemus().filter(([, args]) => args.includes(`-name ${sbx.id} `));
    expect(mine).toHaveLength(1);
    const [pid] = mine[0]!;
    const status = readFileSync(`/proc/${pid}/status`, 'utf8');
    const uid = sbx.info.hostUid;
    expect(status).toMatch(new RegExp(`^Uid:\\s+${uid}\\s+${uid}\\s+${uid}\\s+${uid}$`, 'm'));
    for (const cap of ['CapInh', 'CapPrm', 'CapEff', 'CapBnd', 'CapAmb'])
      expect(status).toMatch(new RegExp(`^${cap}:\\s+0+$`, 'm'));
    expect(status).toMatch(new RegExp(`^Gid:\\s+${uid}\\s+${uid}\\s+${uid}\\s+${uid}$`, 'm'));
    expect(status).toMatch(/^Groups:[\t ]*$/m);
    expect(status).toMatch(/^NoNewPrivs:\s+1$/m);
    expect(status).toMatch(/^Seccomp:\s+2$/m);
    // Two filters: Airlock's own (the jail helper's, installed before QEMU's exec) and QEMU's -sandbox.
    expect(status).toMatch(/^Seccomp_filters:\s+2$/m);
    expect(readFileSync(`/proc/${pid}/cgroup`, 'utf8')).toContain(sbx.id);
    // The jail: QEMU is PID 1 of a PID namespace of its own, and its root holds none of the host's
    // files but /usr: no /etc, no /home, no state dir; its mount table is the jail's alone.
    expect(status).toMatch(/^NSpid:\s+\d+\s+1$/m);
    expect(existsSync('/etc/passwd')).toBe(true);
    for (const gone of ['etc/passwd', 'home', 'var', 'root', 'proc/1', 'tmp', 'sys'])
      expect(existsSync(`/proc/${pid}/root/${gone}`), gone).toBe(false);
    expect(existsSync(`/proc/${pid}/root/usr/bin`)).toBe(true);
    const info = readFileSync(`/proc/${pid}/mountinfo`, 'utf8')
      .trim()
      .split('\n')
      .map((l) => l.split(' '));
    const mounts = info.map((f) => f[4]);
    expect(new Set(mounts)).toEqual(
      new Set([
        '/',
        '/usr',
        '/boot/vmlinuz',
        '/boot/initramfs',
        '/boot/rootfs',
        '/vm',
        '/spill',
        '/dev/null',
        '/dev/urandom',
      ]),
    );
    // Each mount's own flags: all read-only but the VM's two dirs, which are noexec.
    const ro = ['ro', 'nosuid', 'nodev'];
    const want: Record<string, string[]> = {
      '/': ['ro'],
      '/usr': ro,
      '/boot/vmlinuz': ro,
      '/boot/initramfs': ro,
      '/boot/rootfs': ro,
      '/vm': ['rw', 'nosuid', 'nodev', 'noexec'],
      '/spill': ['rw', 'nosuid', 'nodev', 'noexec'],
      '/dev/null': ['ro', 'nosuid', 'noexec'],
      '/dev/urandom': ['ro', 'nosuid', 'noexec'],
    };
    for (const f of info) {
      const flags = f[5]!.split(',');
      expect({ at: f[4], flags: want[f[4]!]!.filter((x) => flags.includes(x)) }).toEqual({
        at: f[4],
        flags: want[f[4]!],
      });
    }
  });

  it('two VMs side by side keep their files and processes apart', async () => {
    const [a, b] = await Promise.all([create(), create()]);
    await a.files.write('/workspace/who', 'a');
    await b.files.write('/workspace/who', 'b');
    expect(await a.files.read('/workspace/who')).toBe('a');
    expect(await b.files.read('/workspace/who')).toBe('b');
    const bg = await a.exec('sleep 300', { background: true });
    expect((await b.exec('ps -eo comm')).stdout).not.toContain('sleep');
    await bg.kill();
    // A guest cannot write the read-only root, and the overlay is its own.
    expect((await a.exec('touch /usr/bin/x 2>&1; echo $?')).stdout.trim()).not.toBe('0');
  });

  it('a timeout kills the whole process tree, and a finished exec leaves no process behind', async () => {
    const sbx = await create();
    const r = await sbx.exec('sleep 301 & sleep 302 & echo forked; wait', { timeoutMs: 5000 });
    expect([r.killedBy, r.stdout]).toEqual(['timeout', 'forked\n']);
    const done = await sbx.exec('sleep 303 & echo left');
    expect(done.stdout).toBe('left\n');
    const ps = await sbx.exec(['ps', '-eo', 'args']);
    expect(ps.stdout).not.toMatch(/sleep 30[123]/);
  });

  it('kill ends the VM: no QEMU and no host residue left', async () => {
    const sbx = await create();
    const running = await sbx.exec('sleep 300', { background: true });
    await sbx.kill();
    expect((await running.wait()).killedBy).toBe('killed');
    expect(qemus().filter(([, args]) => args.includes(`-name ${sbx.id} `))).toEqual([]);
  });

  it('pause freezes the whole VM (its QEMU in the frozen cgroup) until resume; kill works while paused', async () => {
    const sbx = await create();
    const [pid] = qemus().find(([, args]) => args.includes(`-name ${sbx.id} `))!;
    // The freezer state of QEMU's cgroup: v1 freezer.state, or v2 cgroup.events' `frozen`.
    const lines = readFileSync(`/proc/${pid}/cgroup`, 'utf8').trim().split('\n');
    const v1 = lines.find((l) => l.split(':')[1] === 'freezer')?.split(':')[2];
    const frozen = (): string =>
      v1 !== undefined
        ? readFileSync(`/sys/fs/cgroup/freezer${v1}/freezer.state`, 'utf8').trim() === 'FROZEN'
          ? '1'
          : '0'
        : /^frozen (\d)$/m.exec(
            readFileSync(
              `/sys/fs/cgroup${lines.find((l) => l.startsWith('0::'))!.slice(3)}/cgroup.events`,
              'utf8',
            ),
          )![1]!;
    expect(frozen()).toBe('0');
    // A ticker started before the pause: while frozen, the guest runs no instruction, so no tick
    // arrives; after resume the same process ticks on.
    let ticks = 0;
    const ticker = await sbx.exec('while :; do echo t; sleep 0.2; done', {
      background: true,
      onStdout: (t) => void (ticks += t.split('\n').length - 1),
    });
    await new Promise<void>((r) => {
      const i = setInterval(() => ticks > 0 && (clearInterval(i), r()), 50);
    });
    await sbx.pause();
    await sbx.pause(); // idempotent
    expect(frozen()).toBe('1');
    const atPause = ticks;
    await new Promise((r) => setTimeout(r, 1500));
    expect(ticks).toBe(atPause);
    await sbx.resume();
    await sbx.resume();
    expect(frozen()).toBe('0');
    await new Promise<void>((r) => {
      const i = setInterval(() => ticks > atPause && (clearInterval(i), r()), 50);
    });
    expect((await sbx.exec('echo ran')).stdout).toBe('ran\n');
    await ticker.kill();
    await sbx.pause();
    await sbx.kill();
    expect(qemus().filter(([, args]) => args.includes(`-name ${sbx.id} `))).toEqual([]);
  });

  it.each([['a host workspace', { workspace: { mode: 'ro' as const, hostDir: HOST_DIR } }]])(
    'refuses %s with BACKEND_UNAVAILABLE and leaves nothing behind',
    async (_what, extra) => {
      airlock ??= testAirlock();
      // No QEMU of its own: every one alive after the refusal was there before (an earlier test's may
      // still be exiting, so the count alone could drop).
      const before = new Set(qemus().map(([pid]) => pid));
      await expectError(Sandbox.create({ backend: 'microvm', ...extra }, { airlock }), 'BACKEND_UNAVAILABLE');
      expect(qemus().filter(([pid]) => !before.has(pid))).toEqual([]);
    },
  );
});
