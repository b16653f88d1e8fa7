// The sandbox contract against the namespaces tier (bubblewrap + cgroups + overlayfs + seccomp).
import { describe, it } from 'vitest';
import { canRunNamespaces, SKIP_REASON } from '../helpers.js';
import { sandboxContract } from './sandbox.contract.js';

if (canRunNamespaces) {
  sandboxContract('namespaces', { skip: {} });
} else {
  describe('sandbox contract: namespaces', () => {
    it.skip(`the whole suite [skipped: ${SKIP_REASON}]`, () => {});
  });
}
