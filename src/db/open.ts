/**
 * Opening the database a process uses, ready for corral's statements: resolved as every command
 * resolves it (src/db/resolve.ts: DATABASE_URL, else the embedded server under CORRAL_HOME),
 * proved reachable by one round trip, and checked for corral's schema. Shared by the CLI's
 * commands and the client's `connect()`.
 */
import type { Logger } from '../logger.ts';
import { openDatabase, type Database, type OpenOptions } from './client.ts';
import { ping, requireCorralSchema } from './health.ts';
import { connectDatabase, type DatabaseConfig } from './resolve.ts';

export interface UsableDatabaseOptions extends OpenOptions {
  /** Refuse a database without corral's schema (`database_unavailable`). Default true. */
  needsSchema?: boolean;
}

/** The database of `config`, reachable and (unless `needsSchema` is false) migrated; closed again when it is not. */
export async function openUsableDatabase(config: DatabaseConfig, logger: Logger, opts: UsableDatabaseOptions = {}): Promise<Database> {
  const { needsSchema = true, ...open } = opts;
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
    await requireCorralSchema(database.pool);
    return database;
  } catch (e) {
    await database.close();
    throw e;
  }
}
