/**
 * The one write corral makes to pg-boss's own job table, beside pg-boss's API: pg-boss has no
 * public "fail without retry" for a fetched job, and its dead-letter copy is made only when a
 * failure exhausts the job's retries.
 */
import { sql } from 'drizzle-orm';
import type { DbOrTx } from './client.ts';

/**
 * Makes the running attempt of job `id` its last (retry_limit = retry_count), fenced by the
 * attempt: a following pg-boss `fail` then dead-letters the job at once, through pg-boss's own
 * path (state, dead-letter copy, singleton key), instead of scheduling a retry. Returns whether
 * the attempt was still running.
 */
export async function makeLastAttempt(tx: DbOrTx, schema: string, queue: string, id: string, retryCount: number): Promise<boolean> {
  const res = await tx.execute(sql`
    update ${sql.identifier(schema)}.job set retry_limit = retry_count
     where name = ${queue} and id = ${id} and retry_count = ${retryCount} and state = 'active'`);
  return (res.rowCount ?? 0) > 0;
}
