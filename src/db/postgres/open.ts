/**
 * Opening the database a process uses, ready for corral's statements: resolved as every command
 * resolves it (src/db/postgres/resolve.ts: DATABASE_URL, else the embedded server under CORRAL_HOME),
 * proved reachable by one round trip, and checked for corral's schema. Shared by the CLI's
 * commands and the client's `connect()`.
 */
import type { Logger } from '../../base/logger.ts';
import { openDatabase, type Database, type OpenOptions } from '../client.ts';
import { ping, requireCorralSchema } from './health.ts';
import { connectDatabase, type DatabaseConfig } from './resolve.ts';
import { waitForSetup } from './setup-lock.ts';

export interface UsableDatabaseOptions extends OpenOptions {
  /** Refuse a database without corral's schema (`database_unavailable`). Default true. */
  needsSchema?: boolean;
  /**
   * Said once when the database is still being set up (a daemon of this home migrating it) and
   * this waits for that, up to a minute (src/db/postgres/setup-lock.ts). Default: a warning in `logger`.
   */
  onSetupWait?: (message: string) => void;
}

/** The database of `config`, reachable and (unless `needsSchema` is false) migrated; closed again when it is not. */
export async function openUsableDatabase(config: DatabaseConfig, logger: Logger, opts: UsableDatabaseOptions = {}): Promise<Database> {
  const { needsSchema = true, onSetupWait = (message: string) => logger.warn(message), ...open } = opts;
  const database = await connectDatabase(config, logger, async (url) => {
    const d = openDatabase(url, open);
    try {
      await ping(d.pool);
      return d;
    } catch (e) {
      await d.close();
      throw e;
    }
  });
  if (!needsSchema) return database;
  try {
    await waitForSetup(database.pool, {
      homeDir: config.homeDir,
      onWait: onSetupWait,
      ...(config.setupWaitMs === undefined ? {} : { timeoutMs: config.setupWaitMs }),
    });
    await requireCorralSchema(database.pool);
    return database;
  } catch (e) {
    await database.close();
    throw e;
  }
}
