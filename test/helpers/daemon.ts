/** An in-process daemon on a fresh test database, with real ZeroMQ and real pg-boss. */
import { loadConfig, type Config } from '../../src/config.ts';
import { Daemon } from '../../src/daemon/daemon.ts';
import { silentLogger, createLogger } from '../../src/base/logger.ts';
import { createTestDatabase, type TestDatabase } from './db.ts';

export const testLogger = process.env.CORRAL_TEST_LOG ? createLogger({ level: 'debug' }) : silentLogger;

export interface TestDaemon {
  daemon: Daemon;
  db: TestDatabase;
  config: Config;
  stop(): Promise<void>;
}

export async function startTestDaemon(
  overrides: Partial<Config> = {},
  opts: { start?: boolean; db?: TestDatabase } = {},
): Promise<TestDaemon> {
  const db = opts.db ?? (await createTestDatabase());
  const config = loadConfig({
    endpoint: 'tcp://127.0.0.1:0',
    pollIntervalMs: 200,
    watchdogIntervalMs: 100_000,
    recoveryIntervalMs: 100_000,
    // Most tests drive the fabric with raw, keyless peers; the security suite turns CURVE on.
    insecure: true,
    ...overrides,
  });
  const daemon = new Daemon({ config, databaseUrl: db.url, logger: testLogger, skipMigrations: true });
  if (opts.start ?? true) await daemon.start();
  return {
    daemon,
    db,
    config,
    async stop() {
      await daemon.stop();
      if (!opts.db) await db.drop();
    },
  };
}
