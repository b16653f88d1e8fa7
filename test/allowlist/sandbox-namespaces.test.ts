// The executables suite against the namespaces tier.
import { describe, it } from 'vitest';
import { canRunNamespaces, SKIP_REASON } from '../helpers.js';
import { allowlistSandboxContract } from './sandbox.contract.js';

if (canRunNamespaces) allowlistSandboxContract('namespaces');
else describe('executables: namespaces', () => it.skip(`[skipped: ${SKIP_REASON}]`, () => {}));
