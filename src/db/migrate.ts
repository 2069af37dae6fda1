/**
 * Applies corral's Drizzle migrations (the committed `drizzle/` folder). Safe when several daemons
 * start at once: the migration runs under a session advisory lock on one dedicated connection.
 */
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { drizzle, migrate } from './orm.ts';

export const MIGRATIONS_FOLDER = fileURLToPath(new URL('../../drizzle', import.meta.url));
/** Arbitrary, stable: "corral" in ASCII. */
const MIGRATION_LOCK_KEY = 0x636f7272616c;

export async function migrateDatabase(url: string): Promise<void> {
  const client = new pg.Client({ connectionString: url, application_name: 'corral-migrate' });
  await client.connect();
  try {
    await client.query('select pg_advisory_lock($1)', [MIGRATION_LOCK_KEY]);
    try {
      await migrate(drizzle(client), {
        migrationsFolder: MIGRATIONS_FOLDER,
        migrationsSchema: 'drizzle',
        migrationsTable: 'corral_migrations',
      });
    } finally {
      await client.query('select pg_advisory_unlock($1)', [MIGRATION_LOCK_KEY]);
    }
  } finally {
    await client.end();
  }
}
