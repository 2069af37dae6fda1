/**
 * SQL for `corral.activations`. PostgreSQL's `now()` is the lease clock: leases are computed and
 * compared in SQL only.
 */
import { and, eq, inArray, isNull, isNotNull, lte, sql } from '../orm.ts';
import type { ActorKey } from '../../base/actor-key.ts';
import type { DbOrTx } from '../client.ts';
import { ACTIVATION_LIVE, activations, onKeyedRow, sqlList, type ActivationStatus } from '../schema.ts';

export type ActivationRow = typeof activations.$inferSelect;

/**
 * The live statuses as literals, not parameters: daemon connections plan every statement
 * generically (src/db/client.ts), and only a literal list lets such a plan prove the partial
 * indexes on live rows (`activations_one_live`, `activations_live_lease`), so the periodic
 * statements read live rows only, however many finished ones history holds.
 */
const live = sql`${activations.status} in ${sqlList(ACTIVATION_LIVE)}`;
/** `live` on an activation reached by its uid or actor key: never a reason to walk a partial index (`onKeyedRow`). */
const liveByKey = onKeyedRow(live);
const leaseFrom = (leaseMs: number) => sql`now() + ${leaseMs} * interval '1 millisecond'`;

/** The live activations of any of `keys`, row-locked (one statement). */
export async function lockLiveActivationsMany(tx: DbOrTx, keys: readonly ActorKey[]): Promise<ActivationRow[]> {
  if (keys.length === 0) return [];
  const pairs = sql.join(
    keys.map((k) => sql`(${k.agentUid}, ${k.sessionId})`),
    sql`, `,
  );
  return tx
    .select()
    .from(activations)
    .where(and(sql`(${activations.agentUid}, ${activations.sessionId}) in (${pairs})`, liveByKey))
    .orderBy(activations.agentUid, activations.sessionId)
    .for('update');
}

/** The live activation of `key`, row-locked, with whether its lease is still alive. */
export async function lockLiveActivation(tx: DbOrTx, key: ActorKey): Promise<(ActivationRow & { leaseAlive: boolean }) | undefined> {
  const rows = await tx
    .select({ a: activations, leaseAlive: sql<boolean>`${activations.leaseExpiresAt} > now()` })
    .from(activations)
    .where(and(eq(activations.agentUid, key.agentUid), eq(activations.sessionId, key.sessionId), liveByKey))
    .for('update');
  const row = rows[0];
  return row ? { ...row.a, leaseAlive: row.leaseAlive } : undefined;
}

/** The live activation of `key`, not locked (the caller locks what it found in its own order). */
export async function liveActivationOf(db: DbOrTx, key: ActorKey): Promise<ActivationRow | undefined> {
  const rows = await db
    .select()
    .from(activations)
    .where(and(eq(activations.agentUid, key.agentUid), eq(activations.sessionId, key.sessionId), liveByKey));
  return rows[0];
}

/** Extends the lease of a live activation that is still running `eventId` at `revision`. */
export async function extendLease(tx: DbOrTx, activationUid: string, leaseMs: number): Promise<Date | undefined> {
  const rows = await tx
    .update(activations)
    .set({ leaseExpiresAt: sql`greatest(${activations.leaseExpiresAt}, ${leaseFrom(leaseMs)})`, updatedAt: sql`now()` })
    .where(and(eq(activations.activationUid, activationUid), liveByKey))
    .returning({ leaseExpiresAt: activations.leaseExpiresAt });
  return rows[0]?.leaseExpiresAt;
}

export async function bumpRevision(tx: DbOrTx, activationUid: string): Promise<number> {
  const rows = await tx
    .update(activations)
    .set({ revision: sql`${activations.revision} + 1`, updatedAt: sql`now()` })
    .where(and(eq(activations.activationUid, activationUid), liveByKey))
    .returning({ revision: activations.revision });
  return rows[0]!.revision;
}

/** Ends a live activation (terminal `failed` or `stopped`). Returns whether it was live. */
export async function endActivation(
  tx: DbOrTx,
  activationUid: string,
  status: Extract<ActivationStatus, 'failed' | 'stopped'>,
  reason: string,
): Promise<boolean> {
  const rows = await tx
    .update(activations)
    .set({ status, endReason: reason, endedAt: sql`now()`, updatedAt: sql`now()` })
    .where(and(eq(activations.activationUid, activationUid), liveByKey))
    .returning({ uid: activations.activationUid });
  return rows.length > 0;
}

/** Live activations running an event whose lease has expired (the watchdog's work list). */
export async function listExpiredInFlight(db: DbOrTx, limit = 100): Promise<ActivationRow[]> {
  return db
    .select()
    .from(activations)
    .where(and(live, isNotNull(activations.currentEventId), lte(activations.leaseExpiresAt, sql`now()`)))
    .limit(limit);
}

/**
 * Stops up to `limit` warm activations (no current event) idle for at least `idleMs`, in one
 * statement. Rows another transaction holds are skipped (a begin may be reusing one right now);
 * the next pass gets them. Returns how many were stopped.
 */
export async function stopIdleActivations(db: DbOrTx, idleMs: number, limit: number): Promise<number> {
  const idle = and(live, isNull(activations.currentEventId), lte(activations.updatedAt, sql`now() - ${idleMs} * interval '1 millisecond'`));
  const candidates = db
    .select({ uid: activations.activationUid })
    .from(activations)
    .where(idle)
    .limit(limit)
    .for('update', { skipLocked: true });
  const rows = await db
    .update(activations)
    .set({ status: 'stopped', endReason: 'idle', endedAt: sql`now()`, updatedAt: sql`now()` })
    .where(and(inArray(activations.activationUid, candidates), idle))
    .returning({ uid: activations.activationUid });
  return rows.length;
}

/**
 * A daemon's clean stop: its warm activations (no event in flight) end as an idle timeout would
 * end them, so no lease outlives the daemon that holds it. Returns how many.
 */
export async function stopIdleActivationsOf(db: DbOrTx, ownerId: string): Promise<number> {
  const rows = await db
    .update(activations)
    .set({ status: 'stopped', endReason: 'daemon_stopped', endedAt: sql`now()`, updatedAt: sql`now()` })
    .where(and(live, isNull(activations.currentEventId), eq(activations.ownerId, ownerId)))
    .returning({ uid: activations.activationUid });
  return rows.length;
}

export type LockCondition = 'expired_in_flight' | 'live' | 'idle';

/**
 * Row-locks a live activation if it is (still) in the given condition: the watchdog and recovery
 * re-check under the lock, because a heartbeat or a new event may have changed it since listing.
 */
export async function lockActivationIf(tx: DbOrTx, activationUid: string, condition: LockCondition): Promise<ActivationRow | undefined> {
  const extra =
    condition === 'expired_in_flight'
      ? and(isNotNull(activations.currentEventId), lte(activations.leaseExpiresAt, sql`now()`))
      : condition === 'idle'
        ? isNull(activations.currentEventId)
        : undefined;
  const rows = await tx
    .select()
    .from(activations)
    .where(and(eq(activations.activationUid, activationUid), liveByKey, extra))
    .for('update');
  return rows[0];
}
