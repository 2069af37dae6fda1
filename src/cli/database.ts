/**
 * The logger of a command, and the database it uses (src/db/postgres/resolve.ts: the embedded server
 * under `CORRAL_HOME` when DATABASE_URL is unset, started on demand). Free of Drizzle and
 * pg-boss, so that light commands (`corral send`) load little.
 */
import type { Config } from '../config.ts';
import { createLogger, type Logger } from '../base/logger.ts';

export { connectDatabase, resolveDatabase, unreachable, type ResolvedDatabase } from '../db/postgres/resolve.ts';

export function commandLogger(config: Config, opts: { daemon?: boolean } = {}): Logger {
  // Short commands keep stdout for their output: their logs go to stderr, warnings only.
  if (!opts.daemon) return createLogger({ level: config.logLevel === 'info' ? 'warn' : config.logLevel, destination: 2 });
  return createLogger({ level: config.logLevel, pretty: config.logPretty });
}
