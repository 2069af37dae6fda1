// Runs the fabric and worker tests alone, without the PostgreSQL global setup:
//   npx vitest run test/fabric test/worker --config test/fabric/vitest.config.ts
import { fileURLToPath } from 'node:url';
import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    root: fileURLToPath(new URL('../..', import.meta.url)),
    include: ['test/fabric/**/*.test.ts', 'test/worker/**/*.test.ts'],
    testTimeout: 30_000,
    hookTimeout: 30_000,
    pool: 'forks',
  },
});
