// The executables suite against the gVisor tier.
import { describe, it } from 'vitest';
import { canRunGvisor, GVISOR_SKIP_REASON } from '../helpers.js';
import { allowlistSandboxContract } from './sandbox.contract.js';

if (canRunGvisor) allowlistSandboxContract('gvisor');
else describe('executables: gvisor', () => it.skip(`[skipped: ${GVISOR_SKIP_REASON}]`, () => {}));
