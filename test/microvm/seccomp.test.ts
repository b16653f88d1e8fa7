// Airlock's own seccomp filter on QEMU (src/backends/microvm/seccomp.ts, installed by the jail
// helper guest/vmm-jail.c right before QEMU's exec). QEMU itself cannot be made to call what the
// filter denies, so small programs run under the same filter instead, as root (which would be allowed
// every one of these calls), so a refusal is the filter's doing, not a missing privilege. The jail
// helper installs it only after dropping root, so here a python3 installer (prctl PR_SET_SECCOMP,
// allowed to root without no_new_privs) puts the same program on the kernel. test/microvm/jail.test.ts
// checks that the helper refuses a bad filter before any exec; test/microvm/vm.test.ts that a live
// QEMU carries it (two filters: this and -sandbox).
import { spawnSync } from 'node:child_process';
import { closeSync, mkdtempSync, openSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { vmmSeccompFilter } from '../../src/backends/microvm/seccomp.js';
import { canRunNamespaces } from '../helpers.js';

/** Installs the filter on fd 6 (whole sock_filter instructions) as root, then execs argv[1..]. */
const INSTALL = `import ctypes, os, sys
b = b''
while True:
    c = os.read(6, 65536)
    if not c: break
    b += c
os.close(6)
if not b or len(b) % 8: sys.exit(126)
buf = ctypes.create_string_buffer(b, len(b))
class Prog(ctypes.Structure): _fields_ = [('len', ctypes.c_ushort), ('filter', ctypes.c_void_p)]
prog = Prog(len(b) // 8, ctypes.cast(buf, ctypes.c_void_p))
if ctypes.CDLL(None, use_errno=True).prctl(22, 2, ctypes.byref(prog), 0, 0) != 0: sys.exit(126)
os.execv(sys.argv[1], sys.argv[1:])`;

/** A python3 check that `call` (with `l` the C library) fails with EPERM: exit 0, else 3. */
const py = (call: string): string[] => [
  '/usr/bin/python3',
  '-c',
  `import ctypes, os, sys; l = ctypes.CDLL(None, use_errno=True); sys.exit(0 if ${call} != 0 and ctypes.get_errno() == 1 else 3)`,
];

const canBuild = canRunNamespaces;

describe.skipIf(!canBuild)('the VMM seccomp filter (needs root and bubblewrap: run scripts/setup.sh)', () => {
  let dir: string;
  beforeAll(() => {
    dir = mkdtempSync('/var/tmp/airlock-vmm-seccomp-');
  });
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  /** Run argv under the installer with `filter` on fd 6; exit status and stderr. */
  const under = (filter: Buffer, argv: string[]): { status: number | null; stderr: string } => {
    const f = join(dir, 'filter');
    writeFileSync(f, filter);
    const fd = openSync(f, 'r');
    try {
      const r = spawnSync('/usr/bin/python3', ['-c', INSTALL, ...argv], {
        stdio: ['ignore', 'pipe', 'pipe', 'ignore', 'ignore', 'ignore', fd],
        encoding: 'utf8',
        timeout: 30_000,
      });
      return { status: r.status, stderr: r.stderr };
    } finally {
      closeSync(fd);
    }
  };

  it('allows an ordinary program', () => {
    expect(under(vmmSeccompFilter(), ['/usr/bin/true'])).toEqual({ status: 0, stderr: '' });
  });

  it.each([
    ['unshare (any namespace)', ['/usr/bin/unshare', '--uts', '/usr/bin/true']],
    ['unshare of a user namespace', ['/usr/bin/unshare', '--user', '/usr/bin/true']],
    ['mount', py('l.syscall(165, b"x", b"/mnt", b"tmpfs", 0, 0)')],
    ['pivot_root', ['/usr/bin/busybox', 'pivot_root', '/', '/']],
    ['setns', py('l.syscall(308, os.open("/proc/self/ns/net", os.O_RDONLY), 0)')],
    [
      'ptrace',
      [
        '/usr/bin/python3',
        '-c',
        'import ctypes,sys; sys.exit(0 if ctypes.CDLL(None, use_errno=True).ptrace(16, 1, 0, 0) != 0 and ctypes.get_errno() == 1 else 3)',
      ],
    ],
    [
      'process_vm_readv',
      [
        '/usr/bin/python3',
        '-c',
        'import ctypes,sys; l=ctypes.CDLL(None, use_errno=True); sys.exit(0 if l.syscall(310, 1, 0, 0, 0, 0, 0) != 0 and ctypes.get_errno() == 1 else 3)',
      ],
    ],
    [
      'keyctl',
      [
        '/usr/bin/python3',
        '-c',
        'import ctypes,sys; l=ctypes.CDLL(None, use_errno=True); sys.exit(0 if l.syscall(250, 0, 0, 0, 0, 0) != 0 and ctypes.get_errno() == 1 else 3)',
      ],
    ],
    [
      'perf_event_open',
      [
        '/usr/bin/python3',
        '-c',
        'import ctypes,sys; l=ctypes.CDLL(None, use_errno=True); sys.exit(0 if l.syscall(298, 0, 0, -1, -1, 0) != 0 and ctypes.get_errno() == 1 else 3)',
      ],
    ],
  ])('denies %s, even to root', (_name, argv) => {
    const r = under(vmmSeccompFilter(), argv);
    if (argv[0] === '/usr/bin/python3') expect(r).toEqual({ status: 0, stderr: '' });
    else {
      expect(r.status).not.toBe(0);
      expect(r.stderr).toMatch(/Operation not permitted/);
    }
  });
});
