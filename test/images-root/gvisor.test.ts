// The image-root suite against the gVisor tier.
import { describe, it } from 'vitest';
import { canRunGvisor, GVISOR_SKIP_REASON } from '../helpers.js';
import { imageRootContract } from './image-root.contract.js';

if (canRunGvisor) imageRootContract('gvisor');
else describe('image root: gvisor', () => it.skip(`[skipped: ${GVISOR_SKIP_REASON}]`, () => {}));
