/** SQL for `corral.workers`: the durable view of connected workers (for operators and recovery). */
import { and, eq, lt, ne, or, sql } from '../orm.ts';
import type { DbOrTx } from '../client.ts';
import { workers, type WorkerStatus } from '../schema.ts';

export type WorkerRow = typeof workers.$inferSelect;

export async function upsertWorker(db: DbOrTx, w: { workerId: string; ownerId: string; capacity: number }): Promise<void> {
  await db
    .insert(workers)
    .values({ ...w, status: 'ready', inFlight: 0 })
    .onConflictDoUpdate({
      target: workers.workerId,
      set: {
        ownerId: w.ownerId,
        capacity: w.capacity,
        status: 'ready',
        registeredAt: sql`now()`,
        lastHeartbeatAt: sql`now()`,
      },
    });
}

export async function recordHeartbeat(db: DbOrTx, workerId: string, inFlight: number): Promise<void> {
  await db
    .update(workers)
    .set({ inFlight, lastHeartbeatAt: sql`now()`, status: 'ready' })
    .where(eq(workers.workerId, workerId));
}

export async function setWorkerStatus(db: DbOrTx, workerId: string, status: WorkerStatus): Promise<void> {
  await db.update(workers).set({ status }).where(eq(workers.workerId, workerId));
}

export async function listWorkers(db: DbOrTx): Promise<WorkerRow[]> {
  return db.select().from(workers).orderBy(workers.workerId);
}

export async function markOwnerWorkersGone(db: DbOrTx, ownerId: string): Promise<void> {
  await db.update(workers).set({ status: 'gone' }).where(eq(workers.ownerId, ownerId));
}

/**
 * Deletes worker rows nobody will read again: not ready and silent for `goneAfterSeconds`, or
 * "ready" but silent for `deadAfterSeconds` (their daemon died without marking them). Keeps the
 * table bounded however many ids have registered over time. Returns how many were deleted.
 */
export async function pruneWorkers(db: DbOrTx, opts: { goneAfterSeconds: number; deadAfterSeconds: number }): Promise<number> {
  const rows = await db
    .delete(workers)
    .where(
      or(
        and(ne(workers.status, 'ready'), lt(workers.lastHeartbeatAt, sql`now() - make_interval(secs => ${opts.goneAfterSeconds})`)),
        lt(workers.lastHeartbeatAt, sql`now() - make_interval(secs => ${opts.deadAfterSeconds})`),
      ),
    )
    .returning({ workerId: workers.workerId });
  return rows.length;
}
