/**
 * Runs the supervisor tests alone, without the repository-wide globalSetup (which starts
 * PostgreSQL): `npx vitest run test/supervisor --config test/supervisor/vitest.config.ts`.
 */
import { fileURLToPath } from 'node:url';
import { defineConfig } from 'vitest/config';

export default defineConfig({
  root: fileURLToPath(new URL('../..', import.meta.url)),
  test: {
    include: ['test/supervisor/**/*.test.ts'],
    testTimeout: 30_000,
    pool: 'forks',
  },
});
