// Escape suite: the newer kernel surface the seccomp review closed (mount API and its introspection,
// LSM attributes, secret memory, sealing, cross-process memory calls, NUMA placement, and every
// syscall number newer than the review), attacked from inside a real namespaces-tier sandbox with
// raw syscall numbers (perl's syscall(), so no libc wrapper decides anything). The gVisor tier does
// not run these on the host kernel at all; there the sentry answers, and the test checks that none
// of them succeeds.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Sandbox } from '../../src/index.js';
import { canRunNamespaces, testAirlock } from '../helpers.js';
import { canRunTier, expectNoResidue, TIERS } from './util.js';

const EPERM = 1;
const ENOSYS = 38;

/** name, x86_64 number (syscall_64.tbl), what the namespaces tier's filter answers. */
const ATTACKS: ReadonlyArray<[string, number, number]> = [
  ['open_tree', 428, EPERM],
  ['move_mount', 429, EPERM],
  ['fsopen', 430, EPERM],
  ['fsconfig', 431, EPERM],
  ['fsmount', 432, EPERM],
  ['fspick', 433, EPERM],
  ['mount_setattr', 442, EPERM],
  ['open_tree_attr', 467, EPERM],
  ['statmount', 457, ENOSYS],
  ['listmount', 458, ENOSYS],
  ['lsm_get_self_attr', 459, ENOSYS],
  ['lsm_set_self_attr', 460, ENOSYS],
  ['lsm_list_modules', 461, ENOSYS],
  ['mseal', 462, ENOSYS],
  ['memfd_secret', 447, ENOSYS],
  ['cachestat', 451, ENOSYS],
  ['pidfd_getfd', 438, EPERM],
  ['process_madvise', 440, EPERM],
  ['process_mrelease', 448, EPERM],
  ['quotactl_fd', 443, EPERM],
  ['set_mempolicy_home_node', 450, EPERM],
  ['mbind', 237, EPERM],
  ['migrate_pages', 256, EPERM],
  ['move_pages', 279, EPERM],
  ['modify_ldt', 154, EPERM],
  ['future_470', 470, ENOSYS],
  ['future_600', 600, ENOSYS],
  ['future_max', 0x3fffffff, ENOSYS],
];

/**
 * For each "name,nr" argument: the syscall with arguments that would succeed or fail harmlessly if it
 * reached the kernel (zeros; memfd_secret(0) and mseal(0, 0, 0) would succeed), then "name ret errno".
 */
const PERL = `
for my $spec (@ARGV) {
  my ($name, $nr) = split /,/, $spec;
  $! = 0;
  my $r = syscall($nr + 0, 0, 0, 0, 0, 0, 0);
  print "$name $r ", ($r == -1 ? $! + 0 : 0), "\\n";
}
`;

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

  describe(`newer kernel surface is closed [${backend}]`, () => {
    const run = async (cmd: string[]): Promise<Map<string, { ret: number; errno: number }>> => {
      const r = await sbx.exec(cmd);
      expect({ exitCode: r.exitCode, stderr: r.stderr }).toEqual({ exitCode: 0, stderr: '' });
      const out = new Map<string, { ret: number; errno: number }>();
      for (const line of r.stdout.trim().split('\n')) {
        const [name, ret, errno] = line.split(' ');
        out.set(name!, { ret: Number(ret), errno: Number(errno) });
      }
      return out;
    };
    const specs = ATTACKS.map(([name, nr]) => `${name},${nr}`);

    it.skipIf(!canRun)('each attack fails, with the errno the policy gives it', async () => {
      const got = await run(['perl', '-e', PERL, ...specs]);
      for (const [name, , errno] of ATTACKS) {
        // gVisor: the sentry's answer (its deny list, or no such syscall); never anything that ran.
        const want = backend === 'namespaces' ? [errno] : [EPERM, ENOSYS];
        expect(got.get(name)?.ret, name).toBe(-1);
        expect(want, name).toContain(got.get(name)?.errno);
      }
    });

    it.skipIf(!canRun)('also from a grandchild after two execs, while probing tools still work', async () => {
      // The filter is inherited: a grandchild started through sh and env is held the same way.
      const got = await run(['sh', '-c', 'exec env perl -e "$0" "$@"', PERL, ...specs]);
      for (const [name, , errno] of ATTACKS) {
        // gVisor: the sentry's answer (its deny list, or no such syscall); never anything that ran.
        const want = backend === 'namespaces' ? [errno] : [EPERM, ENOSYS];
        expect(got.get(name)?.ret, name).toBe(-1);
        expect(want, name).toContain(got.get(name)?.errno);
      }
      // Tools that probe for the newer calls still work by falling back.
      const r = await sbx.exec('findmnt -n -o TARGET /workspace');
      expect([r.exitCode, r.stdout.split('\n')[0]]).toEqual([0, '/workspace']);
    });
  });
}
