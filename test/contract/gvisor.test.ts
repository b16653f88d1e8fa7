// The sandbox contract against the gVisor tier (runsc over the namespaces tier's host state).
import { describe, it } from 'vitest';
import { canRunGvisor, GVISOR_SKIP_REASON } from '../helpers.js';
import { sandboxContract } from './sandbox.contract.js';

if (canRunGvisor) {
  sandboxContract('gvisor', {
    skip: {
      'oomKills: a child killed by the OOM killer is reported while its parent lives on':
        "the host's OOM killer kills gVisor's kernel (the sentry), so the whole exec dies with the child: " +
        'covered by "oomKills: an exec the OOM killer ends reports it with killedBy oom"',
    },
  });
} else {
  describe('sandbox contract: gvisor', () => {
    it.skip(`the whole suite [skipped: ${GVISOR_SKIP_REASON}]`, () => {});
  });
}
