/**
 * SQL for the durable transcript: conversations, turns, messages. A transcript message is written
 * only in a transaction that settles its event's job (I3): by `commitTurnRowsMany`
 * (src/db/turns/turn-rows.ts) in the fenced commit, or by `recordCancelledInput` in a cancel, which
 * holds the live activation's lock and completes the job.
 */
import type { BatchMember } from './batches.ts';
import { and, asc, eq, sql } from '../orm.ts';
import type { ActorKey } from '../../base/actor-key.ts';
import type { DbOrTx } from '../client.ts';
import { conversations, DELIVERY_LIVE, messages, sqlList, turns, type TurnStatus } from '../schema.ts';
import type { TranscriptEntry, EmittedEntry } from '../views.ts';

export type { TranscriptEntry, EmittedEntry } from '../views.ts';

export type TurnRow = typeof turns.$inferSelect;
export type MessageRow = typeof messages.$inferSelect;

/** Moves a `started` turn to a terminal status. Returns the turn id, or undefined if it was not started. */
export async function finishTurn(
  tx: DbOrTx,
  deliveryId: string,
  status: Exclude<TurnStatus, 'started'>,
  extra: { revision?: number; error?: unknown; output?: unknown; workerId?: string } = {},
): Promise<{ id: string; conversationId: string } | undefined> {
  const rows = await tx
    .update(turns)
    .set({
      status,
      finishedAt: sql`now()`,
      ...(extra.revision !== undefined ? { revision: extra.revision } : {}),
      ...(extra.error !== undefined ? { error: extra.error } : {}),
      ...(extra.output !== undefined ? { output: extra.output } : {}),
      ...(extra.workerId !== undefined ? { workerId: extra.workerId } : {}),
    })
    .where(and(eq(turns.deliveryId, deliveryId), eq(turns.status, 'started')))
    .returning({ id: turns.id, conversationId: turns.conversationId });
  return rows[0];
}

/**
 * A cancelled turn keeps what the person sent: the turn's input becomes its `user` message, at
 * the end of the conversation, as a commit would have written it (no assistant message follows).
 * The turn's status (`cancelled`) marks it in the transcript; later turns see the message in
 * their context like any earlier one. Call after `finishTurn(…, 'cancelled')`, in its transaction.
 */
export async function recordCancelledInput(tx: DbOrTx, deliveryId: string): Promise<void> {
  // a batch's other events too, each a user message after the turn's own (src/db/turns/batches.ts)
  await tx.execute(sql`
    with t as (
      select id, conversation_id, input, coalesced, 1 + coalesce(jsonb_array_length(coalesced), 0) as count
        from corral.turns where delivery_id = ${deliveryId} and status = 'cancelled'
    ), c as (
      update corral.conversations cv set next_seq = cv.next_seq + t.count, updated_at = now()
        from t where cv.id = t.conversation_id
      returning cv.id, cv.next_seq - t.count as first
    ), items as (
      select t.conversation_id, t.id, 1::bigint as ord, coalesce(t.input, 'null'::jsonb) as content from t
      union all
      select t.conversation_id, t.id, b.ord + 1, coalesce(b.elem->'data', 'null'::jsonb)
        from t, jsonb_array_elements(t.coalesced) with ordinality as b(elem, ord)
    )
    insert into corral.messages (conversation_id, turn_id, seq, role, content)
    select items.conversation_id, items.id, c.first + items.ord - 1, 'user', items.content
      from items join c on c.id = items.conversation_id`);
}

/** A steer: the turn's new revision, and its input appended to `steers` (a result that misses it makes it the next event). */
export async function setTurnRevision(tx: DbOrTx, deliveryId: string, revision: number, input: unknown = null): Promise<void> {
  await tx
    .update(turns)
    .set({
      revision,
      steers: sql`coalesce(${turns.steers}, '[]'::jsonb) || jsonb_build_array(jsonb_build_object('revision', ${revision}::int, 'input', ${JSON.stringify(input)}::jsonb))`,
    })
    .where(and(eq(turns.deliveryId, deliveryId), eq(turns.status, 'started')));
}

/**
 * The transcript of `key`, in order: committed turns with their messages, and cancelled turns
 * with the event's `user` message (`status: 'cancelled'`).
 */
export async function readTranscript(db: DbOrTx, key: ActorKey): Promise<TranscriptEntry[]> {
  const rows = await db
    .select({ turn: turns, msg: messages })
    .from(messages)
    .innerJoin(turns, eq(turns.id, messages.turnId))
    .innerJoin(conversations, eq(conversations.id, messages.conversationId))
    .where(and(eq(conversations.agentUid, key.agentUid), eq(conversations.sessionId, key.sessionId)))
    .orderBy(asc(messages.seq));
  const out: TranscriptEntry[] = [];
  for (const { turn, msg } of rows) {
    let entry = out.at(-1);
    if (!entry || entry.turnId !== turn.id) {
      entry = entryOf(turn);
      out.push(entry);
    }
    entry.messages.push({ seq: msg.seq, role: msg.role, content: msg.content, createdAt: msg.createdAt });
  }
  return withInterrupted(db, key, out);
}

/**
 * `entries` with the actor's interrupted turns (input policy `interrupt`) in their place by start:
 * they wrote no message (their events are the next turn's), so only their status shows.
 */
async function withInterrupted(db: DbOrTx, key: ActorKey, entries: TranscriptEntry[]): Promise<TranscriptEntry[]> {
  const rows = await db
    .select({ turn: turns })
    .from(turns)
    .innerJoin(conversations, eq(conversations.id, turns.conversationId))
    .where(and(eq(conversations.agentUid, key.agentUid), eq(conversations.sessionId, key.sessionId), eq(turns.status, 'interrupted')))
    .orderBy(asc(turns.startedAt));
  if (rows.length === 0) return entries;
  const interrupted = rows.map(({ turn }) => entryOf(turn));
  // stable: an interrupted turn goes before the turn that began after it
  return [...entries, ...interrupted].sort((a, b) => a.startedAt.getTime() - b.startedAt.getTime());
}

/** A turn's transcript entry, its messages still to add. */
function entryOf(turn: TurnRow): TranscriptEntry {
  return {
    turnId: turn.id,
    eventId: turn.eventId,
    status: turn.status,
    actorEpoch: turn.actorEpoch,
    revision: turn.revision,
    startedAt: turn.startedAt,
    finishedAt: turn.finishedAt,
    messages: [],
    emitted: Array.isArray(turn.emitted) ? (turn.emitted as EmittedEntry[]) : [],
    ...(turn.status === 'cancelled' ? { cancelReason: cancelReasonOf(turn.error) } : {}),
  };
}

function cancelReasonOf(error: unknown): string {
  const message = (error as { message?: unknown } | null)?.message;
  return typeof message === 'string' ? message : 'cancelled';
}

/** Turns still `started` whose delivery is no longer live (their process died): recovery repairs them. */
export async function orphanedStartedTurns(db: DbOrTx, limit = 100): Promise<TurnRow[]> {
  const rows = await db.execute<{ id: string }>(sql`
    select t.id from corral.turns t
    left join corral.deliveries d on d.delivery_id = t.delivery_id
    where t.status = 'started' and (d.delivery_id is null or d.state not in ${sqlList(DELIVERY_LIVE)})
    limit ${limit}`);
  if (rows.rows.length === 0) return [];
  const ids = rows.rows.map((r) => r.id);
  return db
    .select()
    .from(turns)
    .where(sql`${turns.id} = any(${sql.param(ids)}::uuid[])`);
}

/** The event payload recorded on the turn of `deliveryId`. */
export async function turnInput(
  db: DbOrTx,
  deliveryId: string,
): Promise<{ input: unknown; coalesced: BatchMember[] | undefined; traceparent: string | undefined }> {
  const rows = await db
    .select({ input: turns.input, coalesced: turns.coalesced, traceparent: turns.traceparent })
    .from(turns)
    .where(eq(turns.deliveryId, deliveryId));
  const coalesced = rows[0]?.coalesced;
  return {
    input: rows[0]?.input,
    coalesced: Array.isArray(coalesced) ? (coalesced as BatchMember[]) : undefined,
    traceparent: rows[0]?.traceparent ?? undefined,
  };
}

export async function actorOfConversation(db: DbOrTx, conversationId: string): Promise<ActorKey | undefined> {
  const rows = await db
    .select({ agentUid: conversations.agentUid, sessionId: conversations.sessionId })
    .from(conversations)
    .where(eq(conversations.id, conversationId));
  return rows[0];
}
