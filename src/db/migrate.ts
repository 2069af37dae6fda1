/**
 * Applies corral's Drizzle migrations (the committed `drizzle/` folder). Safe when several daemons
 * start at once: the set-up runs under a session advisory lock on one dedicated connection
 * (U1 of src/db/postgres/setup-lock.ts), which is also how a command sees that a set-up is under way.
 */
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { drizzle, migrate } from './orm.ts';
import { SETUP_LOCK_KEY } from './postgres/setup-lock.ts';

export const MIGRATIONS_FOLDER = fileURLToPath(new URL('../../drizzle', import.meta.url));

/** Runs `fn` holding the set-up lock of the database at `url` (waiting for it while another set-up holds it). */
export async function withSetupLock<T>(url: string, fn: (client: pg.Client) => Promise<T>): Promise<T> {
  const client = new pg.Client({ connectionString: url, application_name: 'corral-migrate' });
  await client.connect();
  try {
    await client.query('select pg_advisory_lock($1)', [SETUP_LOCK_KEY]);
    try {
      return await fn(client);
    } finally {
      await client.query('select pg_advisory_unlock($1)', [SETUP_LOCK_KEY]);
    }
  } finally {
    await client.end();
  }
}

/** Where Drizzle records the migrations applied to a shard's schema (shard 0: as before shards). */
export function migrationsTableOf(shard: number): string {
  return shard === 0 ? 'corral_migrations' : `corral_migrations_s${shard}`;
}

/**
 * Applies corral's migrations on `client` (which should hold the set-up lock). For a shard k > 0,
 * `client` rewrites schema names (src/db/shards/shard-sql.ts) and `shard` names its own record.
 */
export async function applyMigrations(client: pg.Client, shard = 0): Promise<void> {
  await migrate(drizzle(client), {
    migrationsFolder: MIGRATIONS_FOLDER,
    migrationsSchema: 'drizzle',
    migrationsTable: migrationsTableOf(shard),
  });
}

/** Applies corral's migrations to the database at `url`, under the set-up lock. */
export async function migrateDatabase(url: string): Promise<void> {
  await withSetupLock(url, applyMigrations);
}
