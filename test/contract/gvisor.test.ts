// The sandbox contract against the gVisor tier (runsc over the namespaces tier's host state).
import { describe, it } from 'vitest';
import { canRunGvisor, GVISOR_SKIP_REASON } from '../helpers.js';
import { sandboxContract } from './sandbox.contract.js';

if (canRunGvisor) {
  sandboxContract('gvisor', { skip: {} });
} else {
  describe('sandbox contract: gvisor', () => {
    it.skip(`the whole suite [skipped: ${GVISOR_SKIP_REASON}]`, () => {});
  });
}
