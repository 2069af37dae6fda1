/**
 * One run, three projects: the tests on PostgreSQL (the global setup starts it and builds the
 * template database), and the fabric / worker and supervisor tests, which need no database and
 * skip that setup. `npm test` runs every file once; `npx vitest run --project supervisor` one
 * project. Every file runs test/setup.ts (leak check, databases of failed tests kept).
 */
import { defineConfig } from 'vitest/config';

const NO_DATABASE = ['test/fabric/**/*.test.ts', 'test/worker/**/*.test.ts', 'test/supervisor/**/*.test.ts'];

export default defineConfig({
  test: {
    testTimeout: 60_000,
    hookTimeout: 120_000,
    pool: 'forks',
    fileParallelism: true,
    maxWorkers: 2,
    setupFiles: ['test/setup.ts'],
    projects: [
      {
        extends: true,
        test: {
          name: 'postgres',
          include: ['test/**/*.test.ts'],
          exclude: NO_DATABASE,
          globalSetup: ['test/global-setup.ts'],
        },
      },
      {
        extends: true,
        test: {
          name: 'fabric',
          include: ['test/fabric/**/*.test.ts', 'test/worker/**/*.test.ts'],
          testTimeout: 30_000,
          hookTimeout: 30_000,
        },
      },
      {
        extends: true,
        test: { name: 'supervisor', include: ['test/supervisor/**/*.test.ts'], testTimeout: 30_000 },
      },
    ],
  },
});
