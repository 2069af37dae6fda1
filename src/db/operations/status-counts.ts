/** Counts for `corral status` and the metrics gauges, and the server's clock. */
import { count, inArray, isNotNull, sql } from '../orm.ts';
import type { DbOrTx } from '../client.ts';
import { ACTIVATION_LIVE, activations, actors, workers, type WorkerStatus } from '../schema.ts';

export async function liveActivationCount(db: DbOrTx): Promise<number> {
  const rows = await db
    .select({ n: count() })
    .from(activations)
    .where(inArray(activations.status, [...ACTIVATION_LIVE]));
  return rows[0]?.n ?? 0;
}

export async function blockedActorCount(db: DbOrTx): Promise<number> {
  const rows = await db.select({ n: count() }).from(actors).where(isNotNull(actors.blockedByEventId));
  return rows[0]?.n ?? 0;
}

/** Workers by status (for the metrics gauge). */
export async function workerCounts(db: DbOrTx): Promise<Record<WorkerStatus, number>> {
  const rows = await db.select({ status: workers.status, n: count() }).from(workers).groupBy(workers.status);
  const out: Record<WorkerStatus, number> = { ready: 0, stale: 0, gone: 0 };
  for (const r of rows) out[r.status] = r.n;
  return out;
}

/** PostgreSQL's `now()`: the clock leases and heartbeats are judged by. */
export async function serverTime(db: DbOrTx): Promise<unknown> {
  const res = await db.execute<{ now: unknown }>(sql`select now() as now`);
  return res.rows[0]?.now;
}
