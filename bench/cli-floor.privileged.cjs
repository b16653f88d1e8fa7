// The floor of `airlock run -- true` in a fresh Node process (issue 31): a plain CommonJS script,
// no Airlock code, that makes the same one-shot with the same host work the CLI's one-shot makes,
// hard-coded: sandbox dir + owner record, a tmpfs disk with tmp/home/shm/ws, a fresh netns (unshare
// on this thread, held by an fd), a devpts instance, four v1 cgroups with the same limits, bwrap
// started as the sandbox uid with Airlock's exact options (`--args` gate, seccomp, status and block
// fds), enrolled in the cgroups before the gate opens, waited for, then everything torn down.
// What it leaves out is what Airlock's JS adds: its bundle, validation, state scans, leases.
//   node bench/cli-floor.privileged.cjs STATE_DIR ETC_DIR DEV_DIR UID SECCOMP_FILE CMD...
// STATE_DIR/sandboxes must exist; ETC_DIR and DEV_DIR are trees Airlock made (its generated /etc and
// shared /dev); SECCOMP_FILE holds Airlock's seccomp program; CMD... is the sandbox's argv as Airlock's
// exec makes it (its /bin/sh check wrapper: src/sandbox/exec-check.ts). bench/lifecycle.ts passes them all.
// koffi (mount, unshare, setns) is loaded as a plain dependency.
'use strict';
// AIRLOCK_CLI_PHASES=1: phase marks on stderr at exit, in the CLI's format (src/cli/phases.ts), so
// the two runs compare phase by phase.
const marks = process.env.AIRLOCK_CLI_PHASES === '1' ? [['node', process.uptime() * 1000]] : undefined;
const phase = (name) => marks?.push([name, process.uptime() * 1000]);
const { spawn } = require('node:child_process');
const fs = require('node:fs');
const { join } = require('node:path');
const { setTimeout: sleep } = require('node:timers/promises');

const [stateDir, etc, devDir, uidArg, seccompFile, ...command] = process.argv.slice(2);
const uid = Number(uidArg);
const koffi = require('koffi');
const lib = koffi.load('libc.so.6');
const mount = lib.func(
  'int mount(const char *s, const char *t, const char *f, unsigned long fl, const char *d)',
);
const umount2 = lib.func('int umount2(const char *t, int flags)');
const unshare = lib.func('int unshare(int flags)');
const setns = lib.func('int setns(int fd, int nstype)');
const CLONE_NEWNET = 0x40000000;
const MNT_DETACH = 2;
const must = (r, what) => {
  if (r !== 0) throw new Error(`${what}: errno ${koffi.errno()}`);
};

// What is made so far, undone in reverse if the run fails half-way (best effort, at exit): a failed
// floor leaves no mount, cgroup or sandbox dir behind. The normal teardown empties it.
const undo = [];
process.on('exit', () => {
  for (const f of undo.reverse()) {
    try {
      f();
    } catch {
      // best effort: the next step may still succeed
    }
  }
});

function main() {
  phase('koffi');
  const id = `sbx-floor-${process.pid}`;
  const dir = join(stateDir, 'sandboxes', id);
  fs.mkdirSync(dir, { mode: 0o711 });
  undo.push(() => fs.rmSync(dir, { recursive: true }));
  fs.writeFileSync(join(dir, 'owner.json'), JSON.stringify({ pid: process.pid, id }), { flag: 'wx' });
  const disk = join(dir, 'disk');
  fs.mkdirSync(disk, { mode: 0o700 });
  must(
    mount(
      'airlock-disk',
      disk,
      'tmpfs',
      2 | 4,
      `size=536870912,nr_inodes=131072,mode=700,uid=${uid},gid=${uid}`,
    ),
    'mount disk',
  );
  undo.push(() => umount2(disk, MNT_DETACH));
  for (const d of ['tmp', 'home', 'shm', 'ws']) {
    fs.mkdirSync(join(disk, d), { mode: 0o777 });
    fs.chownSync(join(disk, d), uid, uid);
  }
  // A netns of its own, held by an fd; this thread goes back to the host's.
  const hostNs = fs.openSync('/proc/thread-self/ns/net', 'r');
  must(unshare(CLONE_NEWNET), 'unshare');
  const ns = fs.openSync('/proc/thread-self/ns/net', 'r');
  must(setns(hostNs, CLONE_NEWNET), 'setns host');
  undo.push(() => fs.closeSync(ns));
  const pts = join(dir, 'pts');
  fs.mkdirSync(pts, { mode: 0o755 });
  must(mount('devpts', pts, 'devpts', 2 | 8, 'newinstance,ptmxmode=0666,mode=0620,max=64'), 'devpts');
  undo.push(() => umount2(pts, MNT_DETACH));
  const cgroups = ['memory', 'pids', 'cpu', 'freezer'].map((c) => `/sys/fs/cgroup/${c}/airlock/${id}`);
  for (const c of cgroups) {
    fs.mkdirSync(c);
    undo.push(() => {
      for (const pid of fs.readFileSync(join(c, 'cgroup.procs'), 'utf8').split('\n').filter(Boolean)) {
        process.kill(Number(pid), 'SIGKILL');
      }
      fs.rmdirSync(c);
    });
  }
  const [mem, pids, cpu] = cgroups;
  fs.readFileSync(join(mem, 'memory.memsw.limit_in_bytes')); // lowering: limit first, then memsw
  fs.writeFileSync(join(mem, 'memory.limit_in_bytes'), '536870912');
  fs.writeFileSync(join(mem, 'memory.memsw.limit_in_bytes'), '536870912');
  fs.writeFileSync(join(pids, 'pids.max'), '256');
  fs.readFileSync(join(cpu, 'cpu.cfs_period_us'));
  fs.writeFileSync(join(cpu, 'cpu.cfs_quota_us'), '100000');
  const b = (s) => join(dir, s);
  const options = [
    ...['--unshare-user', '--unshare-ipc', '--unshare-pid', '--unshare-uts', '--unshare-cgroup'],
    ...['--disable-userns', '--die-with-parent', '--new-session', '--uid', '1000', '--gid', '1000'],
    ...['--hostname', 'airlock', '--cap-drop', 'ALL', '--ro-bind', '/usr', '/usr'],
    ...['--symlink', 'usr/bin', '/bin', '--symlink', 'usr/sbin', '/sbin', '--symlink', 'usr/lib', '/lib'],
    ...['--symlink', 'usr/lib64', '/lib64', '--ro-bind', etc, '/etc', '--proc', '/proc'],
    ...['--dev-bind', devDir, '/dev', '--bind', b('disk/shm'), '/dev/shm'],
    ...['--dev-bind', pts, '/dev/pts', '--bind', b('disk/tmp'), '/tmp', '--dir', '/home'],
    ...['--bind', b('disk/home'), '/home/user', '--bind', b('disk/ws'), '/workspace'],
    ...['--remount-ro', '/', '--chdir', '/workspace', '--clearenv'],
    ...['--setenv', 'PATH', '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'],
    ...['--setenv', 'HOME', '/home/user', '--setenv', 'USER', 'user', '--setenv', 'LANG', 'C.UTF-8'],
    ...['--seccomp', '4', '--json-status-fd', '5', '--block-fd', '6'],
  ];
  const argv = ['/usr/bin/bwrap', '--args', '3', '--', ...command];
  // The child starts in the sandbox's netns: this thread enters it for the spawn only.
  phase('host state');
  must(setns(ns, CLONE_NEWNET), 'setns sandbox');
  const child = spawn(argv[0], argv.slice(1), {
    env: {
      GLIBC_TUNABLES:
        'glibc.malloc.mmap_threshold=16384:glibc.malloc.trim_threshold=0:glibc.malloc.top_pad=0',
    },
    stdio: ['ignore', 'pipe', 'pipe', 'pipe', 'pipe', 'pipe', 'pipe'],
    uid,
    gid: uid,
    cwd: '/',
  });
  must(setns(hostNs, CLONE_NEWNET), 'setns back');
  for (const c of cgroups) fs.writeFileSync(join(c, 'cgroup.procs'), String(child.pid));
  child.stdio[4].end(fs.readFileSync(seccompFile));
  child.stdio[3].end(Buffer.from(options.map((s) => `${s}\0`).join('')));
  let info = '';
  child.stdio[5].on('data', (d) => {
    info += d;
    if (/"child-pid"/.test(info) && child.stdio[6].writable) child.stdio[6].end('1');
  });
  phase('spawn');
  child.stdio[1].resume();
  child.stdio[2].resume();
  child.on('close', async (code) => {
    phase('exec');
    // As Airlock's teardown: a cgroup stays busy a moment after its last process exits.
    for (const c of cgroups) {
      for (let i = 0; ; i++) {
        try {
          fs.rmdirSync(c);
          break;
        } catch (e) {
          if (e.code !== 'EBUSY' || i >= 100) throw e;
          await sleep(5);
        }
      }
    }
    must(umount2(pts, MNT_DETACH), 'umount pts');
    must(umount2(disk, MNT_DETACH), 'umount disk');
    fs.rmSync(dir, { recursive: true });
    fs.closeSync(ns);
    undo.length = 0;
    phase('teardown');
    if (marks) {
      const parts = marks.map(
        ([n, at], i) => `${n} ${at.toFixed(1)} (+${(at - (marks[i - 1]?.[1] ?? 0)).toFixed(1)})`,
      );
      process.stderr.write(`floor phases (ms since the process started): ${parts.join(', ')}\n`);
    }
    process.exitCode = code === 0 ? 0 : 1;
  });
}

main();
