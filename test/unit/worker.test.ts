import { once } from 'node:events';
import { describe, expect, test } from 'vitest';
import { moduleWorker } from '../../src/core/worker.js';

describe('moduleWorker', () => {
  test('runs a TypeScript module file (with its imports) as a worker from source', async () => {
    const w = moduleWorker(new URL('../fixtures/x.ts', import.meta.url).href, './echo-worker', {
      workerData: { n: 41 },
    });
    try {
      const [msg] = await once(w, 'message');
      expect(msg).toBe(`42 2.0 KiB`);
    } finally {
      await w.terminate();
    }
  });
});
