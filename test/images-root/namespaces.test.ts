// The image-root suite against the namespaces tier.
import { describe, it } from 'vitest';
import { canRunNamespaces, SKIP_REASON } from '../helpers.js';
import { imageRootContract } from './image-root.contract.js';

if (canRunNamespaces) imageRootContract('namespaces');
else describe('image root: namespaces', () => it.skip(`[skipped: ${SKIP_REASON}]`, () => {}));
