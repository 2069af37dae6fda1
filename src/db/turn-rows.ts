/**
 * The hot path of a turn, written as few statements as possible. Each function here spans the
 * turn's tables (activation, delivery, conversation, turn, messages) in ONE statement, so a turn
 * costs a handful of round trips instead of one per row: on a busy daemon the statement count,
 * not the work per statement, bounds throughput (see docs/benchmarks.md).
 *
 * They run inside the caller's transaction, after the fence check (`lockFence`) where one applies.
 */
import { sql } from 'drizzle-orm';
import { randomUUID } from 'node:crypto';
import type { ActorKey } from '../actor-key.ts';
import type { DbOrTx } from './client.ts';
import type { ActivationRow } from './activations.ts';
import { executeNamed } from './prepared.ts';

const LIVE = sql.raw(`('starting', 'active', 'draining')`);

type RawActivation = {
  activation_uid: string;
  agent_uid: string;
  session_id: string;
  actor_epoch: string | number;
  lease_id: string;
  lease_expires_at: Date | string;
  owner_id: string;
  current_event_id: string | null;
  revision: number;
  status: ActivationRow['status'];
  end_reason: string | null;
  created_at: Date | string;
  updated_at: Date | string;
  ended_at: Date | string | null;
};

const toDate = (v: Date | string) => (v instanceof Date ? v : new Date(v));

function toActivation(r: RawActivation): ActivationRow {
  return {
    activationUid: r.activation_uid,
    agentUid: r.agent_uid,
    sessionId: r.session_id,
    actorEpoch: Number(r.actor_epoch),
    leaseId: r.lease_id,
    leaseExpiresAt: toDate(r.lease_expires_at),
    ownerId: r.owner_id,
    currentEventId: r.current_event_id,
    revision: r.revision,
    status: r.status,
    endReason: r.end_reason,
    createdAt: toDate(r.created_at),
    updatedAt: toDate(r.updated_at),
    endedAt: r.ended_at === null ? null : toDate(r.ended_at),
  };
}

/**
 * The common case of T2: the actor has a warm activation (live, no current event). Points it at
 * `eventId` and renews its lease in one statement. Undefined when there is none (slow path).
 */
export async function assignWarmActivation(
  tx: DbOrTx,
  key: ActorKey,
  eventId: string,
  leaseMs: number,
  ownerId: string,
): Promise<ActivationRow | undefined> {
  const rows = await executeNamed<RawActivation>(tx, 'corral_assign_warm_activation', sql`
    update corral.activations
       set current_event_id = ${eventId}, revision = 0, owner_id = ${ownerId}, status = 'active',
           lease_expires_at = now() + ${leaseMs} * interval '1 millisecond', updated_at = now()
     where agent_uid = ${key.agentUid} and session_id = ${key.sessionId}
       and status in ${LIVE} and current_event_id is null
    returning *`);
  const row = rows[0];
  return row ? toActivation(row) : undefined;
}

export interface TurnRowsInput {
  activation: ActivationRow;
  eventId: string;
  jobRetryCount: number;
  workerId: string | null;
  input: unknown;
}

/**
 * T2's writes after the activation: the conversation (created on first use), the `created`
 * delivery carrying the fence copied from the activation, and the `started` turn.
 */
export async function insertTurnRows(tx: DbOrTx, r: TurnRowsInput): Promise<{ deliveryId: string; turnId: string }> {
  const a = r.activation;
  const deliveryId = randomUUID();
  const turnId = randomUUID();
  const rows = await executeNamed<{ id: string }>(tx, 'corral_insert_turn_rows', sql`
    with conv_new as (
      insert into corral.conversations (id, agent_uid, session_id)
      values (${randomUUID()}, ${a.agentUid}, ${a.sessionId})
      on conflict (agent_uid, session_id) do nothing
      returning id
    ), conv as (
      select id from conv_new
      union all
      select id from corral.conversations where agent_uid = ${a.agentUid} and session_id = ${a.sessionId}
      limit 1
    ), d as (
      insert into corral.deliveries
        (delivery_id, activation_uid, agent_uid, session_id, actor_epoch, event_id, revision, job_retry_count, worker_id, state)
      values (${deliveryId}, ${a.activationUid}, ${a.agentUid}, ${a.sessionId}, ${a.actorEpoch}, ${r.eventId}, ${a.revision},
              ${r.jobRetryCount}, ${r.workerId}, 'created')
      returning delivery_id
    )
    insert into corral.turns
      (id, conversation_id, event_id, delivery_id, status, activation_uid, actor_epoch, revision, attempt, worker_id, input)
    select ${turnId}, conv.id, ${r.eventId}, d.delivery_id, 'started', ${a.activationUid}, ${a.actorEpoch}, ${a.revision},
           ${r.jobRetryCount + 1}, ${r.workerId}, ${JSON.stringify(r.input ?? null)}::jsonb
      from conv, d
    returning id`);
  if (rows.length !== 1) throw new Error(`turn rows for event ${r.eventId} were not written`);
  return { deliveryId, turnId };
}

export interface CommitRowsInput {
  deliveryId: string;
  activationUid: string;
  revision: number;
  workerId: string;
  output: unknown;
  /** The worker's messages; the turn's `user` message (its recorded input) goes first. */
  messages: { role: string; content: unknown }[];
  leaseMs: number;
}

/**
 * T5's writes, after the fence held: the turn `succeeded`, its messages numbered at the end of the
 * conversation, the delivery `completed`, the activation warm again (no current event, lease
 * renewed). Returns false, writing nothing, when the turn was not `started` (already committed).
 */
export async function commitTurnRows(tx: DbOrTx, r: CommitRowsInput): Promise<boolean> {
  const count = r.messages.length + 1;
  const rows = await executeNamed<{ turns: number; messages: number }>(tx, 'corral_commit_turn_rows', sql`
    with t as (
      update corral.turns
         set status = 'succeeded', finished_at = now(), revision = ${r.revision}, worker_id = ${r.workerId},
             output = ${r.output === undefined ? null : JSON.stringify(r.output)}::jsonb
       where delivery_id = ${r.deliveryId} and status = 'started'
      returning id, conversation_id, input
    ), c as (
      update corral.conversations cv
         set next_seq = cv.next_seq + ${count}, updated_at = now()
        from t
       where cv.id = t.conversation_id
      returning cv.next_seq - ${count} as first
    ), items as (
      select 1::bigint as ord, 'user'::text as role, coalesce(t.input, 'null'::jsonb) as content from t
      union all
      select x.ord + 1, x.elem->>'role', x.elem->'content'
        from jsonb_array_elements(${JSON.stringify(r.messages)}::jsonb) with ordinality as x(elem, ord)
    ), m as (
      insert into corral.messages (conversation_id, turn_id, seq, role, content)
      select t.conversation_id, t.id, c.first + items.ord - 1, items.role, items.content
        from t, c, items
      returning 1
    ), d as (
      update corral.deliveries set state = 'completed', updated_at = now()
       where delivery_id = ${r.deliveryId} and state in ('created', 'sent', 'accepted') and exists (select 1 from t)
      returning 1
    ), a as (
      update corral.activations
         set current_event_id = null, lease_expires_at = now() + ${r.leaseMs} * interval '1 millisecond', updated_at = now()
       where activation_uid = ${r.activationUid} and status in ${LIVE} and exists (select 1 from t)
      returning 1
    )
    select (select count(*) from t)::int as turns, (select count(*) from m)::int as messages`);
  const row = rows[0]!;
  return row.turns === 1 && row.messages === count;
}

/** turn_accepted's writes, after the fence held: delivery `accepted`, lease extended. */
export async function acceptDeliveryRows(
  tx: DbOrTx,
  deliveryId: string,
  activationUid: string,
  leaseMs: number,
): Promise<void> {
  await executeNamed(tx, 'corral_accept_delivery', sql`
    with d as (
      update corral.deliveries set state = 'accepted', updated_at = now()
       where delivery_id = ${deliveryId} and state in ('created', 'sent')
      returning 1
    )
    update corral.activations
       set lease_expires_at = greatest(lease_expires_at, now() + ${leaseMs} * interval '1 millisecond'), updated_at = now()
     where activation_uid = ${activationUid} and status in ${LIVE}`);
}
