/** SQL for `corral.deliveries`: one worker execution of one actor event, carrying the fence. */
import { and, eq, inArray, sql } from '../orm.ts';
import type { DbOrTx } from '../client.ts';
import { DELIVERY_LIVE, DELIVERY_UNACCEPTED, deliveries, onKeyedRow, sqlList, type DeliveryState } from '../schema.ts';

export type DeliveryRow = typeof deliveries.$inferSelect;

/** Literal state lists, so generic plans can use the partial indexes on live rows (see activations.ts). */
const liveState = sql`${deliveries.state} in ${sqlList(DELIVERY_LIVE)}`;

/** Moves a live delivery to `to` if it is currently in one of `from`. Returns whether it moved. */
export async function transitionDelivery(
  tx: DbOrTx,
  deliveryId: string,
  from: readonly DeliveryState[],
  to: DeliveryState,
  reason?: string,
): Promise<boolean> {
  const rows = await tx
    .update(deliveries)
    .set({ state: to, stateReason: reason ?? null, updatedAt: sql`now()` })
    .where(and(eq(deliveries.deliveryId, deliveryId), inArray(deliveries.state, [...from])))
    .returning({ id: deliveries.deliveryId });
  return rows.length > 0;
}

export async function setDeliveryRevision(tx: DbOrTx, deliveryId: string, revision: number): Promise<void> {
  await tx
    .update(deliveries)
    .set({ revision, updatedAt: sql`now()` })
    .where(and(eq(deliveries.deliveryId, deliveryId), onKeyedRow(liveState)));
}

/** Supersedes every live delivery of an activation (it failed or was stopped). */
export async function supersedeDeliveriesOf(tx: DbOrTx, activationUid: string, reason: string): Promise<string[]> {
  const rows = await tx
    .update(deliveries)
    .set({ state: 'superseded', stateReason: reason, updatedAt: sql`now()` })
    .where(and(eq(deliveries.activationUid, activationUid), onKeyedRow(liveState)))
    .returning({ id: deliveries.deliveryId });
  return rows.map((r) => r.id);
}

/** Live deliveries sent to `workerId` that it never accepted (re-dispatch candidates). */
export async function unacceptedDeliveriesOf(db: DbOrTx, workerId: string): Promise<DeliveryRow[]> {
  return db
    .select()
    .from(deliveries)
    .where(and(eq(deliveries.workerId, workerId), sql`${deliveries.state} in ${sqlList(DELIVERY_UNACCEPTED)}`));
}

export async function liveDeliveryOfEvent(db: DbOrTx, eventId: string): Promise<DeliveryRow | undefined> {
  const rows = await db
    .select()
    .from(deliveries)
    .where(and(eq(deliveries.eventId, eventId), liveState));
  return rows[0];
}

/** The live delivery of `eventId`, row-locked. */
export async function lockLiveDeliveryOfEvent(tx: DbOrTx, eventId: string): Promise<DeliveryRow | undefined> {
  const rows = await tx
    .select()
    .from(deliveries)
    .where(and(eq(deliveries.eventId, eventId), liveState))
    .for('update');
  return rows[0];
}

export async function getDelivery(db: DbOrTx, deliveryId: string): Promise<DeliveryRow | undefined> {
  const rows = await db.select().from(deliveries).where(eq(deliveries.deliveryId, deliveryId));
  return rows[0];
}

/**
 * The latest delivery of `eventId` under `activationUid`: its pg-boss attempt and the other
 * events of its batch, in order ([] for one event); undefined when there is none.
 */
export async function latestDeliveryOf(
  db: DbOrTx,
  activationUid: string,
  eventId: string,
): Promise<{ jobRetryCount: number; coalesced: string[] } | undefined> {
  const rows = await db
    .select({ n: deliveries.jobRetryCount, ids: deliveries.coalesced })
    .from(deliveries)
    .where(and(eq(deliveries.activationUid, activationUid), eq(deliveries.eventId, eventId)))
    .orderBy(sql`${deliveries.createdAt} desc`)
    .limit(1);
  return rows[0] && { jobRetryCount: rows[0].n, coalesced: rows[0].ids ?? [] };
}

/** The pg-boss attempt (retryCount) the latest delivery of `eventId` under `activationUid` carries. */
export async function latestJobRetryCount(db: DbOrTx, activationUid: string, eventId: string): Promise<number | undefined> {
  return (await latestDeliveryOf(db, activationUid, eventId))?.jobRetryCount;
}
