/**
 * Read-only SQL for one actor, for operators (`corral actor`, `corral dlq show`): its durable
 * row (epoch counter, dead-letter block), its live activation with the lease judged by PostgreSQL's
 * clock, its recent turns and the attempts of one event.
 */
import { and, asc, desc, eq, inArray, sql } from '../orm.ts';
import type { ActorKey } from '../../base/actor-key.ts';
import type { DbOrTx } from '../client.ts';
import { ACTIVATION_LIVE, activations, actors, conversations, turns } from '../schema.ts';
import type { ActivationView, TurnView } from '../views.ts';

export type { ActivationView, TurnView } from '../views.ts';

export interface ActorRow {
  epochCounter: number;
  blockedByEventId: string | null;
  updatedAt: Date;
}

export async function actorRow(db: DbOrTx, key: ActorKey): Promise<ActorRow | undefined> {
  const rows = await db
    .select({ epochCounter: actors.epochCounter, blockedByEventId: actors.blockedByEventId, updatedAt: actors.updatedAt })
    .from(actors)
    .where(and(eq(actors.agentUid, key.agentUid), eq(actors.sessionId, key.sessionId)));
  return rows[0];
}

/** The live activation of `key`, or else its most recent one (undefined: never activated). */
export async function latestActivation(db: DbOrTx, key: ActorKey): Promise<ActivationView | undefined> {
  const rows = await db
    .select({ a: activations, leaseAlive: sql<boolean>`${activations.leaseExpiresAt} > now()` })
    .from(activations)
    .where(and(eq(activations.agentUid, key.agentUid), eq(activations.sessionId, key.sessionId)))
    .orderBy(desc(sql`${inArray(activations.status, [...ACTIVATION_LIVE])}`), desc(activations.actorEpoch), desc(activations.createdAt))
    .limit(1);
  const r = rows[0];
  if (!r) return undefined;
  return {
    activationUid: r.a.activationUid,
    epoch: r.a.actorEpoch,
    status: r.a.status,
    revision: r.a.revision,
    leaseExpiresAt: r.a.leaseExpiresAt,
    leaseAlive: r.leaseAlive,
    ownerId: r.a.ownerId,
    currentEventId: r.a.currentEventId,
    endReason: r.a.endReason,
    createdAt: r.a.createdAt,
  };
}

const turnColumns = {
  turnId: turns.id,
  eventId: turns.eventId,
  attempt: turns.attempt,
  status: turns.status,
  epoch: turns.actorEpoch,
  revision: turns.revision,
  workerId: turns.workerId,
  error: turns.error,
  emitted: turns.emitted,
  startedAt: turns.startedAt,
  finishedAt: turns.finishedAt,
  traceparent: turns.traceparent,
};

/**
 * Every attempt (turn) recorded for one event of `actor`, in order, with its error. Read through
 * the actor's conversation (`turns_conversation`): turns have no index on the event alone but the
 * unique one of its success, and a table of every turn ever is not read for one event.
 */
export async function attemptsOfEvent(db: DbOrTx, actor: ActorKey, eventId: string): Promise<TurnView[]> {
  return db
    .select(turnColumns)
    .from(turns)
    .innerJoin(conversations, eq(conversations.id, turns.conversationId))
    .where(and(eq(conversations.agentUid, actor.agentUid), eq(conversations.sessionId, actor.sessionId), eq(turns.eventId, eventId)))
    .orderBy(asc(turns.startedAt), asc(turns.attempt));
}

/** The most recent turns of an actor, newest first. */
export async function recentTurnsOf(db: DbOrTx, key: ActorKey, limit = 10): Promise<TurnView[]> {
  return db
    .select(turnColumns)
    .from(turns)
    .innerJoin(conversations, eq(conversations.id, turns.conversationId))
    .where(and(eq(conversations.agentUid, key.agentUid), eq(conversations.sessionId, key.sessionId)))
    .orderBy(desc(turns.startedAt))
    .limit(limit);
}
