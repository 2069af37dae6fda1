/**
 * `corral/testing`: helpers for an application's own tests: `createTestEnvironment` (PostgreSQL,
 * a daemon, workers running the test's handler and a connected client, torn down by one call) and
 * a manual clock. Everything it does not export is internal. docs/embedding.md documents each export.
 */
export { createTestEnvironment, type TestEnvironment, type TestEnvironmentOptions, type TestWorkerOptions } from './host/testing.ts';
export { ManualClock, type Clock, type TimerHandle } from './base/clock.ts';
