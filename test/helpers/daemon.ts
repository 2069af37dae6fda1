/** An in-process daemon on a fresh test database (or on one its caller gives), with real ZeroMQ and real pg-boss. */
import type { RuntimeMetrics } from '../../src/runtime/metrics.ts';
import { loadConfig, type Config } from '../../src/config.ts';
import { Daemon } from '../../src/daemon/daemon.ts';
import type { TurnTracer } from '../../src/base/turn-tracer.ts';
import { silentLogger, createLogger } from '../../src/base/logger.ts';
import { createTestDatabase, type TestDatabase } from './db.ts';

export const testLogger = process.env.CORRAL_TEST_LOG ? createLogger({ level: 'debug' }) : silentLogger;

/** A database the caller made and drops: a file's `useTestDatabase()`, or one of `useTestDatabases()`. */
export type GivenDatabase = Pick<TestDatabase, 'url' | 'name'>;

export interface TestDaemon<D extends GivenDatabase = TestDatabase> {
  daemon: Daemon;
  db: D;
  config: Config;
  stop(): Promise<void>;
}

/** A daemon on `opts.db` (left to its caller to drop), or on a fresh test database that `stop()` drops. */
export async function startTestDaemon<D extends GivenDatabase = TestDatabase>(
  overrides: Partial<Config> = {},
  opts: { start?: boolean; db?: D; tracer?: TurnTracer; continueTurns?: boolean; metrics?: RuntimeMetrics } = {},
): Promise<TestDaemon<D>> {
  const made = opts.db ? undefined : await createTestDatabase();
  // without opts.db, D is its default: TestDatabase
  const db = (opts.db ?? made) as D;
  const config = loadConfig({
    endpoint: 'tcp://127.0.0.1:0',
    pollIntervalMs: 200,
    watchdogIntervalMs: 100_000,
    recoveryIntervalMs: 100_000,
    // Most tests drive the fabric with raw, keyless peers; the security suite turns CURVE on.
    insecure: true,
    ...overrides,
  });
  const daemon = new Daemon({
    config,
    databaseUrl: db.url,
    logger: testLogger,
    skipMigrations: true,
    ...(opts.tracer ? { tracer: opts.tracer } : {}),
    ...(opts.continueTurns === false ? { continueTurns: false } : {}),
    ...(opts.metrics ? { metrics: opts.metrics } : {}),
  });
  if (opts.start ?? true) await daemon.start();
  return {
    daemon,
    db,
    config,
    async stop() {
      await daemon.stop();
      await made?.drop();
    },
  };
}
