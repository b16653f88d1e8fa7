// The sandbox contract against the microVM tier (QEMU -M microvm; TCG on this host, so slow: one VM
// at a time, longer timeouts). Host dirs are not shared into the guest: those tests are declared skips,
// each with its reason. Egress runs in test/egress/microvm.test.ts (only via scripts/egress-test.sh).
import { afterAll, describe, expect, it, vi } from 'vitest';
import { sandboxContract } from './sandbox.contract.js';
import { MICROVM_SKIP_REASON, canRunMicrovm, myQemus } from '../microvm/qemus.js';

const NO_HOST_DIRS =
  'host dirs are not shared into the guest yet (virtio-fs/9p is a later milestone): the spec is refused';

const qemus = (): string[] => myQemus().map(([pid, args]) => `${pid} ${args}`);

if (canRunMicrovm) {
  // TCG boots take seconds to tens of seconds on a loaded host.
  vi.setConfig({ testTimeout: 600_000, hookTimeout: 600_000 });
  sandboxContract('microvm', {
    skip: {
      "workspace 'cow' sees the host files and keeps its writes": NO_HOST_DIRS,
      "workspace 'cow' lets the sandbox edit and delete the host files": NO_HOST_DIRS,
      "workspace 'ro' is readable and not writable": NO_HOST_DIRS,
      'a host dir and a host file are mounted read-only at their paths': NO_HOST_DIRS,
      'a mount defaults to the same path inside the sandbox': NO_HOST_DIRS,
      'timeout kills the whole process tree':
        "a guest's /proc lists the whole VM (its kernel threads too), not one exec's pid namespace, so the " +
        "suite's process count does not apply: test/microvm/vm.test.ts checks that the tree's processes are gone",
      '8 sandboxes created in parallel are independent':
        'eight TCG-emulated VMs at once would starve the two shared cores of this host for minutes; ' +
        'the tier keeps 1-2 VMs per test (test/microvm/vm.test.ts runs two side by side)',
    },
  });
  describe('microvm: no VM outlives the suite', () => {
    afterAll(() => {
      expect(qemus()).toEqual([]);
    });
    it('leaves no qemu process', () => {
      expect(qemus()).toEqual([]);
    });
  });
} else {
  describe('sandbox contract: microvm', () => {
    it.skip(`the whole suite [skipped: ${MICROVM_SKIP_REASON}]`, () => {});
  });
}
