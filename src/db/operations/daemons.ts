/**
 * SQL for `corral.daemons`: each daemon's own heartbeat. The daemon writes it; `corral status`
 * reads it to say which daemons are alive. Judged by PostgreSQL's clock, like every lease.
 */
import { and, eq, isNotNull, isNull, lt, or, sql } from '../orm.ts';
import type { DbOrTx } from '../client.ts';
import { daemons } from '../schema.ts';

export type DaemonRow = typeof daemons.$inferSelect;

/**
 * How often a daemon writes its heartbeat: four times per stale timeout, so one late write (a
 * busy database, a GC pause) never makes a live daemon look dead; at most every 5 s.
 */
export function daemonHeartbeatMs(staleMs: number): number {
  return Math.max(50, Math.min(5_000, Math.floor(staleMs / 4)));
}

export interface DaemonIdentity {
  daemonId: string;
  host: string;
  pid: number;
  endpoint: string;
  staleMs: number;
}

/**
 * The daemon is alive now. An upsert, so a heartbeat also brings back a row that was pruned while
 * the daemon could not reach the database (a row pruned for silence means a long outage).
 */
export async function recordDaemonHeartbeat(db: DbOrTx, d: DaemonIdentity): Promise<void> {
  await db
    .insert(daemons)
    .values(d)
    .onConflictDoUpdate({
      target: daemons.daemonId,
      set: { lastSeenAt: sql`now()`, endpoint: d.endpoint, staleMs: d.staleMs, stoppedAt: null },
    });
}

/** A clean stop: the row says so, and stays for a while for operators to see. */
export async function markDaemonStopped(db: DbOrTx, daemonId: string): Promise<void> {
  await db
    .update(daemons)
    .set({ stoppedAt: sql`now()`, lastSeenAt: sql`now()` })
    .where(eq(daemons.daemonId, daemonId));
}

export async function listDaemons(db: DbOrTx): Promise<DaemonRow[]> {
  return db.select().from(daemons).orderBy(daemons.startedAt, daemons.daemonId);
}

/**
 * Deletes the rows nobody needs to see again: stopped for `stoppedAfterSeconds`, or silent (a
 * killed daemon's) for `silentAfterSeconds`. Returns how many.
 */
export async function pruneDaemons(db: DbOrTx, opts: { stoppedAfterSeconds: number; silentAfterSeconds: number }): Promise<number> {
  const rows = await db
    .delete(daemons)
    .where(
      or(
        and(isNotNull(daemons.stoppedAt), lt(daemons.stoppedAt, sql`now() - make_interval(secs => ${opts.stoppedAfterSeconds})`)),
        and(isNull(daemons.stoppedAt), lt(daemons.lastSeenAt, sql`now() - make_interval(secs => ${opts.silentAfterSeconds})`)),
      ),
    )
    .returning({ daemonId: daemons.daemonId });
  return rows.length;
}
