/** Whether a database can be used: reachable, and carrying corral's schema. */
import type pg from 'pg';

/** One round trip; throws what the driver throws when the database cannot be used. */
export async function ping(pool: pg.Pool): Promise<void> {
  await pool.query('select 1');
}

/** Whether corral's migrations have run on this database. */
export async function hasCorralSchema(pool: pg.Pool): Promise<boolean> {
  const { rows } = await pool.query<{ t: string | null }>("select to_regclass('corral.turns')::text as t");
  return Boolean(rows[0]?.t);
}
