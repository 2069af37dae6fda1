/** Whether a database can be used: reachable, and carrying corral's schema. */
import type pg from 'pg';
import { CorralError } from '../../base/errors.ts';

/** A pool or one connection: both run a query. */
type Queryable = pg.Pool | pg.ClientBase;

/** One round trip; throws what the driver throws when the database cannot be used. */
export async function ping(pool: pg.Pool): Promise<void> {
  await pool.query('select 1');
}

/** Whether corral's migrations have run on this database. */
export async function hasCorralSchema(db: Queryable): Promise<boolean> {
  const { rows } = await db.query<{ t: string | null }>("select to_regclass('corral.turns')::text as t");
  return Boolean(rows[0]?.t);
}

/**
 * Refuses a database without corral's schema, for every command that reads or writes corral's
 * tables or queue: one message, whichever command met it. Such a command must not set anything
 * up itself (pg-boss's schema, say) in a database that may not even be corral's.
 */
export async function requireCorralSchema(db: Queryable): Promise<void> {
  if (await hasCorralSchema(db)) return;
  throw new CorralError(
    'database_unavailable',
    'the database has no corral schema yet: run `corral db migrate` (or start `corral daemon`, which migrates)',
  );
}
