// The VMM jail's bind mounts are one `mount --all` of an fstab (src/backends/microvm/qemu.privileged.ts
// jailFstab): every path is escaped so a blank or a newline in it cannot split or add an entry, and
// util-linux applies each entry's flags (read-only binds stay read-only). Real mounts, in a mount
// namespace of the test's own (needs root).
import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { jailFstab, jailSkeleton } from '../../src/backends/microvm/qemu.privileged.js';
import { canRunNamespaces, SKIP_REASON } from '../helpers.js';

const base = mkdtempSync(join(tmpdir(), 'airlock-jail fstab\n-'));
afterAll(() => rmSync(base, { recursive: true, force: true }));

describe('microVM jail fstab', () => {
  const file = (name: string): string => {
    const p = join(base, name);
    writeFileSync(p, name);
    return p;
  };
  const jail = {
    dir: join(base, 'jail root'),
    kernel: file('vm linuz'),
    initramfs: file('init\tramfs'),
    rootfs: file('root\\fs #x'),
    vmDir: join(base, 'vm dir'),
    spillDir: join(base, 'spill\ndir'),
    kvm: false,
  };
  const helper = file('seccomp helper');

  it('has one six-field line per mount, whatever the paths hold', () => {
    const lines = jailFstab(jail, helper).trimEnd().split('\n');
    expect(lines).toHaveLength(10);
    for (const l of lines) expect(l.split(' ')).toHaveLength(6);
    // First the skeleton onto itself, read-only: the jail's root, a mount point for pivot_root.
    const root = `${base.replaceAll('\n', '\\012').replaceAll(' ', '\\040')}/jail\\040root`;
    expect(lines[0]).toBe(`${root} ${root} none bind,ro,nosuid,nodev 0 0`);
    expect(lines[4]).toBe(
      `${base.replaceAll('\n', '\\012').replaceAll(' ', '\\040')}/root\\134fs\\040\\043x ${base.replaceAll('\n', '\\012').replaceAll(' ', '\\040')}/jail\\040root/boot/rootfs none bind,ro,nosuid,nodev 0 0`,
    );
    expect(jailFstab({ ...jail, kvm: true }, helper)).toContain(' none bind,nosuid,noexec 0 0\n');
  });

  it.skipIf(!canRunNamespaces)(`mounts every entry at its path with its flags (${SKIP_REASON})`, () => {
    mkdirSync(jail.vmDir);
    mkdirSync(jail.spillDir);
    mkdirSync(jail.dir);
    jailSkeleton(jail.dir, false);
    jailSkeleton(jail.dir, false); // again: a second start of the sandbox
    const fstab = join(base, 'fstab');
    writeFileSync(fstab, jailFstab(jail, helper));
    // The jail's steps up to its mounts, then what each mount point shows and its flags.
    const out = execFileSync(
      'unshare',
      [
        '--mount',
        '--propagation',
        'private',
        '/bin/sh',
        '-c',
        `set -e; J=$1
/usr/bin/mount --all --fstab "$2"
cd "$J"
cat boot/rootfs boot/vmlinuz; echo
if (: >new) 2>/dev/null; then echo root writable; exit 1; fi
readlink lib lib64 | tr '\\n' ' '; echo
cat /proc/self/mountinfo`,
        'jail',
        jail.dir,
        fstab,
      ],
      { encoding: 'utf8' },
    );
    const [content, links, ...mountinfo] = out.trim().split('\n');
    expect(content).toBe('root\\fs #xvm linuz');
    expect(links).toBe('usr/lib usr/lib64 ');
    // mountinfo escapes blanks and newlines as octal, as fstab does.
    const root = jail.dir.replaceAll(' ', '\\040').replaceAll('\n', '\\012');
    const flags = new Map(
      mountinfo
        .map((l) => l.split(' '))
        .filter((f) => f[4] === root || f[4]!.startsWith(`${root}/`))
        .map((f) => [f[4]!.slice(root.length) || '/', f[5]!]),
    );
    expect(flags.size).toBe(10);
    expect(flags.get('/')).toMatch(/^ro,nosuid,nodev\b/);
    for (const at of ['/usr', '/boot/vmlinuz', '/boot/initramfs', '/boot/rootfs', '/boot/vmm-seccomp'])
      expect([at, flags.get(at)]).toEqual([at, expect.stringMatching(/^ro,nosuid,nodev\b/)]);
    for (const at of ['/vm', '/spill'])
      expect([at, flags.get(at)]).toEqual([at, expect.stringMatching(/^rw,nosuid,nodev,noexec\b/)]);
    for (const at of ['/dev/null', '/dev/urandom'])
      expect([at, flags.get(at)]).toEqual([at, expect.stringMatching(/^ro,nosuid,noexec\b/)]);
  });
});
