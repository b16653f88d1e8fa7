import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    // Egress tests run only inside their own network namespace: scripts/egress-test.sh.
    exclude: ['test/egress/**', 'node_modules/**'],
    // Sandboxes are real processes; keep files in one fork so the leak checks see the whole run.
    pool: 'forks',
    fileParallelism: false,
    testTimeout: 60_000,
    hookTimeout: 60_000,
  },
});
