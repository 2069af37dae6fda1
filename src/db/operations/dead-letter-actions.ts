/**
 * SQL for `corral.dead_letter_actions`: the record of every replay and discard an operator made,
 * written in the transaction that moved the jobs, so the record and the queue never disagree.
 * It is also what makes a second replay of the same dead letter answer "already replayed".
 */
import { and, desc, eq, inArray, sql } from '../orm.ts';
import type { DbOrTx } from '../client.ts';
import { actors, deadLetterActions } from '../schema.ts';

export type DeadLetterActionRow = typeof deadLetterActions.$inferSelect;
export type DeadLetterActionKind = DeadLetterActionRow['action'];

export async function recordDeadLetterAction(
  tx: DbOrTx,
  row: Omit<typeof deadLetterActions.$inferInsert, 'id' | 'actedAt'>,
): Promise<void> {
  await tx.insert(deadLetterActions).values({ ...row, payload: (row.payload ?? null) as object | null });
}

/** The latest recorded action on each of `deadLetterIds`. */
export async function lastActionsOn(db: DbOrTx, deadLetterIds: readonly string[]): Promise<Map<string, DeadLetterActionRow>> {
  const out = new Map<string, DeadLetterActionRow>();
  if (deadLetterIds.length === 0) return out;
  const rows = await db
    .select()
    .from(deadLetterActions)
    .where(inArray(deadLetterActions.deadLetterId, [...deadLetterIds]))
    .orderBy(desc(deadLetterActions.id));
  for (const r of rows) if (!out.has(r.deadLetterId)) out.set(r.deadLetterId, r);
  return out;
}

/** Recorded actions on the dead letters of one event, newest first. */
export async function actionsOnEvent(db: DbOrTx, eventId: string): Promise<DeadLetterActionRow[]> {
  return db.select().from(deadLetterActions).where(eq(deadLetterActions.eventId, eventId)).orderBy(desc(deadLetterActions.id));
}

/**
 * Lifts the dead-letter block of an actor, but only if `eventId` is what blocks it (a newer
 * block by another event stays). Returns whether it was lifted.
 */
export async function clearBlockIf(tx: DbOrTx, key: { agentUid: string; sessionId: string }, eventId: string): Promise<boolean> {
  const rows = await tx
    .update(actors)
    .set({ blockedByEventId: null, updatedAt: sql`now()` })
    .where(and(eq(actors.agentUid, key.agentUid), eq(actors.sessionId, key.sessionId), eq(actors.blockedByEventId, eventId)))
    .returning({ agentUid: actors.agentUid });
  return rows.length > 0;
}
