import { defineConfig } from 'vitest/config';

// Egress tests: only ever run through scripts/egress-test.sh (inside a private network namespace).
export default defineConfig({
  test: {
    include: ['test/egress/**/*.test.ts'],
    pool: 'forks',
    fileParallelism: false,
    testTimeout: 60_000,
    hookTimeout: 60_000,
  },
});
