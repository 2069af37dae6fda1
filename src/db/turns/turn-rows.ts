/**
 * The hot path of a turn, written as few statements as possible. Each function here spans the
 * turn's tables (activation, delivery, conversation, turn, messages) in ONE statement, so a turn
 * costs a handful of round trips instead of one per row: on a busy daemon the statement count,
 * not the work per statement, bounds throughput (see docs/benchmarks.md).
 *
 * They run inside the caller's transaction, after the fence check (`lockFence`) where one applies.
 */
import { sql } from '../orm.ts';
import { randomUUID } from 'node:crypto';
import { v7 as uuidv7 } from 'uuid';
import type { ActorKey } from '../../base/actor-key.ts';
import type { DbOrTx } from '../client.ts';
import type { ActivationRow } from './activations.ts';
import { executeNamed } from '../prepared.ts';
import { fromRawRow, prefixedColumns, toDate } from '../rows.ts';
import { contextLinesOf, type ContextLimits } from './history.ts';
import { activations, ACTIVATION_LIVE, DELIVERY_LIVE, DELIVERY_UNACCEPTED, onKeyedRow, sqlList } from '../schema.ts';
import { notifyTurnsCte, turnsNotified } from './turn-events.ts';
import type { BatchMember } from './batches.ts';

const LIVE = sqlList(ACTIVATION_LIVE);
const DELIVERY_LIVE_LIST = sqlList(DELIVERY_LIVE);
const UNACCEPTED = sqlList(DELIVERY_UNACCEPTED);

/**
 * The rows every begun turn gets, as CTEs over `w` (one row per turn: agent_uid, session_id,
 * conv_id, delivery_id, turn_id, activation_uid, actor_epoch, event_id, revision,
 * job_retry_count, worker_id, input, coalesced: its batch's other events, src/db/turns/batches.ts): `conv` its conversation (created on first use), `d` the
 * delivery carrying the fence (`sent` when it has a worker: its turn_start goes out right after
 * the statement; `created` while it waits for one), `t` the `started` turn.
 */
const TURN_ROWS = sql.raw(`conv_new as (
      insert into corral.conversations (id, agent_uid, session_id)
      select conv_id, agent_uid, session_id from w
      on conflict (agent_uid, session_id) do nothing
      returning id, agent_uid, session_id, next_seq, pruned_through
    ), conv as (
      select id, agent_uid, session_id, next_seq, pruned_through from conv_new
      union all
      select c.id, c.agent_uid, c.session_id, c.next_seq, c.pruned_through from corral.conversations c join w using (agent_uid, session_id)
    ), d as (
      insert into corral.deliveries
        (delivery_id, activation_uid, agent_uid, session_id, actor_epoch, event_id, revision, job_retry_count, worker_id, state,
         coalesced)
      select delivery_id, activation_uid, agent_uid, session_id, actor_epoch, event_id, revision, job_retry_count, worker_id,
             case when worker_id is null then 'created' else 'sent' end,
             case when coalesced is not null
                  then array(select (m->>'event_id')::uuid from jsonb_array_elements(coalesced) with ordinality as x(m, n) order by n) end
        from w
      returning delivery_id
    ), t as (
      insert into corral.turns
        (id, conversation_id, event_id, delivery_id, status, activation_uid, actor_epoch, revision, attempt, worker_id, input,
         coalesced, traceparent)
      select w.turn_id, conv.id, w.event_id, d.delivery_id, 'started', w.activation_uid, w.actor_epoch, w.revision,
             w.job_retry_count + 1, w.worker_id, w.input->'v', w.coalesced, w.traceparent
        from w join conv using (agent_uid, session_id) join d using (delivery_id)
      returning delivery_id
    )`);

/** Watchers hear of each begun turn (src/db/turns/turn-events.ts), with the statement's commit. */
const STARTED_NOTIFY = notifyTurnsCte(
  'started',
  '(select w.agent_uid, w.session_id, w.event_id, w.actor_epoch as epoch, w.job_retry_count + 1 as attempt from w join t using (delivery_id))',
);

/** And of each committed one: of each event it took. */
const COMMITTED_NOTIFY = notifyTurnsCte(
  'committed',
  `(select c.agent_uid, c.session_id, t.event_id, t.actor_epoch as epoch, t.attempt from t join c on c.id = t.conversation_id
    union all
    select c.agent_uid, c.session_id, (b->>'event_id')::uuid, t.actor_epoch, t.attempt
      from t join c on c.id = t.conversation_id, jsonb_array_elements(t.coalesced) as b)`,
);

/** One fetched job to begin (at most one per actor in a batch). */
export interface BeginInput {
  key: ActorKey;
  eventId: string;
  jobRetryCount: number;
  workerId: string | null;
  input: unknown;
  /** The events after this one the turn takes, in order (src/db/turns/batches.ts); absent for one event. */
  coalesced?: BatchMember[] | undefined;
  /**
   * What the daemon already knows of the actor's conversation, whose messages it holds from
   * `firstSeq` (`nextSeq` when none) to `nextSeq - 1`: its context is read only when the
   * conversation is not at this id and `next_seq` any more, or when transcript retention deleted
   * one of those messages (`pruned_through` at or above `firstSeq`, R4 of
   * src/db/operations/transcript-retention.ts) (src/runtime/context-cache.ts, C1).
   */
  known?: { conversationId: string; nextSeq: number; firstSeq: number } | undefined;
  /** The attempt's W3C traceparent (docs/observability.md), stored on its turn row; absent: none. */
  traceparent?: string | undefined;
}

/** A turn begun by `beginTurnsMany`. */
export interface Begun {
  activation: ActivationRow;
  deliveryId: string;
  /** The conversation as the turn begins (when a context was asked for). */
  conversation: BegunConversation | undefined;
}

export interface BegunConversation {
  id: string;
  nextSeq: number;
  /**
   * The context's messages (`contextLinesOf`) when they were read ('' when there are none); null
   * when they were not read: the conversation was still where the input's `known` said.
   */
  lines: string | null;
}

/**
 * The common cases of T2 for a batch of jobs, in ONE statement and so one transaction of its own.
 * `warm`: each actor with a warm activation (live, no current event) has it pointed at its event
 * and its lease renewed. `new`: each actor with no live activation at all gets a new one under
 * the next epoch (the durable counter + 1, I2). Either way it gets its conversation (created on
 * first use), its delivery (`insertTurnRowsMany`'s rows) and `started` turn, and, when `context`
 * is given, its conversation's place and context messages (unless it is where `known` says). The other actors are left untouched and absent from the
 * result (keyed `agent/session`). In `new`, a concurrent activation of one of the actors breaks
 * the one-live index (I1) and fails the whole statement, which then changed nothing.
 */
export async function beginTurnsMany(
  db: DbOrTx,
  jobs: readonly BeginInput[],
  opts: { kind: 'warm' | 'new'; leaseMs: number; ownerId: string; context: ContextLimits | undefined },
): Promise<Map<string, Begun>> {
  if (jobs.length === 0) return new Map();
  const input = jobs
    .map((j) => ({
      agent_uid: j.key.agentUid,
      session_id: j.key.sessionId,
      event_id: j.eventId,
      // time-ordered keys: a new row lands at the end of each key's index, not on a random page of
      // a large one; the lease id stays random (it is a fence value, never a key)
      activation_uid: uuidv7(),
      lease_id: randomUUID(),
      delivery_id: uuidv7(),
      turn_id: uuidv7(),
      conv_id: uuidv7(),
      job_retry_count: j.jobRetryCount,
      worker_id: j.workerId,
      // wrapped, so that a JSON null stays a JSON null (a recordset turns it into SQL NULL)
      input: { v: j.input ?? null },
      coalesced: j.coalesced ?? null,
      known_conv: j.known?.conversationId ?? null,
      known_seq: j.known?.nextSeq ?? null,
      known_first: j.known?.firstSeq ?? null,
      // absent rather than null: an untraced turn adds nothing to the statement's JSON
      ...(j.traceparent === undefined ? {} : { traceparent: j.traceparent }),
    }))
    // actor rows are locked in key order, as everywhere else (two daemons cannot deadlock)
    .sort((x, y) => cmp(x.agent_uid, y.agent_uid) || cmp(x.session_id, y.session_id));
  const limits = opts.context !== undefined && opts.context.maxMessages > 0 ? opts.context : undefined;
  const context = limits
    ? sql`conv.id as conv_id, conv.next_seq,
          case when conv.id = w.known_conv and conv.next_seq = w.known_seq and conv.pruned_through < w.known_first
               then null else coalesce(${contextLinesOf('conv', limits)}, '') end as lines`
    : sql`null::uuid as conv_id, null::int as next_seq, null::text as lines`;
  const lease = sql`now() + ${opts.leaseMs} * interval '1 millisecond'`;
  const activationsOf =
    opts.kind === 'warm'
      ? sql`a as (
      update corral.activations a
         set current_event_id = i.event_id, revision = 0, owner_id = ${opts.ownerId}, status = 'active',
             lease_expires_at = ${lease}, updated_at = now()
        from i
       where a.agent_uid = i.agent_uid and a.session_id = i.session_id
         and ${onKeyedRow(sql`a.status in ${LIVE} and a.current_event_id is null`)}
      returning a.*`
      : sql`cold as (
      select i.* from i
       where not exists (select 1 from corral.activations l
                          where l.agent_uid = i.agent_uid and l.session_id = i.session_id and ${onKeyedRow(sql`l.status in ${LIVE}`)})
    ), epochs as (
      -- the durable counter (I2): created on first use, never decreasing, so an epoch is never
      -- reused even if every activation row is lost; its row lock serialises concurrent activations
      insert into corral.actors as ac (agent_uid, session_id, epoch_counter)
      select agent_uid, session_id, 1 from cold order by agent_uid, session_id
      on conflict (agent_uid, session_id) do update set epoch_counter = ac.epoch_counter + 1, updated_at = now()
      returning ac.agent_uid, ac.session_id, ac.epoch_counter
    ), a as (
      insert into corral.activations
        (activation_uid, agent_uid, session_id, actor_epoch, lease_id, lease_expires_at, owner_id, current_event_id, revision, status)
      select cold.activation_uid, cold.agent_uid, cold.session_id, epochs.epoch_counter, cold.lease_id, ${lease}, ${opts.ownerId},
             cold.event_id, 0, 'active'
        from cold join epochs using (agent_uid, session_id)
      returning *`;
  const rows = await executeNamed<
    Record<string, unknown> & { delivery_id: string; conv_id: string | null; next_seq: number | null; lines: string | null }
  >(
    db,
    // the name carries all that varies in the text
    `corral_begin_${opts.kind}_turns_many${limits ? '_ctx' : ''}`,
    sql`
    with i as (
      select * from jsonb_to_recordset(${JSON.stringify(input)}::jsonb) as x(
        agent_uid text, session_id text, event_id uuid, activation_uid uuid, lease_id uuid, delivery_id uuid,
        turn_id uuid, conv_id uuid, job_retry_count int, worker_id text, input jsonb, coalesced jsonb, known_conv uuid,
        known_seq int, known_first int, traceparent text)
    ), ${activationsOf}
    ), w as (
      select i.agent_uid, i.session_id, i.event_id, i.delivery_id, i.turn_id, i.conv_id, i.job_retry_count, i.worker_id, i.input,
             i.coalesced, i.known_conv, i.known_seq, i.known_first, i.traceparent, a.activation_uid, a.actor_epoch, a.revision
        from i join a using (agent_uid, session_id)
    ), ${TURN_ROWS}, n as (
      ${STARTED_NOTIFY}
    )
    select ${prefixedColumns(activations, 'a', '')}, t.delivery_id, ${context}
      from a
      join w on w.activation_uid = a.activation_uid
      join t on t.delivery_id = w.delivery_id
      join conv on conv.agent_uid = a.agent_uid and conv.session_id = a.session_id
     where ${turnsNotified('n')}`,
  );
  if (rows.length !== new Set(rows.map((r) => r.delivery_id)).size) throw new Error('a begin returned one turn twice');
  return new Map(
    rows.map((r) => {
      const activation = fromRawRow(activations, r);
      return [
        `${activation.agentUid}/${activation.sessionId}`,
        {
          activation,
          deliveryId: r.delivery_id,
          conversation: r.conv_id === null ? undefined : { id: r.conv_id, nextSeq: Number(r.next_seq), lines: r.lines },
        },
      ];
    }),
  );
}

const cmp = (a: string, b: string) => (a < b ? -1 : a > b ? 1 : 0);

export interface TurnRowsInput {
  activation: ActivationRow;
  eventId: string;
  jobRetryCount: number;
  workerId: string | null;
  input: unknown;
  coalesced?: BatchMember[] | undefined;
  traceparent?: string | undefined;
}

/**
 * T2's writes after the activations, for a batch of turns, in ONE statement: each conversation
 * (created on first use), the delivery carrying the fence copied from its activation (`sent` when
 * it has a worker: its turn_start goes out right after this transaction; `created` while it
 * waits for one), and the `started` turn. Returns the delivery ids, in order.
 */
export async function insertTurnRowsMany(tx: DbOrTx, rows: readonly TurnRowsInput[]): Promise<string[]> {
  if (rows.length === 0) return [];
  const input = rows.map((r) => ({
    delivery_id: uuidv7(),
    turn_id: uuidv7(),
    conv_id: uuidv7(),
    activation_uid: r.activation.activationUid,
    agent_uid: r.activation.agentUid,
    session_id: r.activation.sessionId,
    actor_epoch: r.activation.actorEpoch,
    event_id: r.eventId,
    revision: r.activation.revision,
    job_retry_count: r.jobRetryCount,
    worker_id: r.workerId,
    // wrapped, so that a JSON null stays a JSON null (a recordset turns it into SQL NULL)
    input: { v: r.input ?? null },
    coalesced: r.coalesced ?? null,
    ...(r.traceparent === undefined ? {} : { traceparent: r.traceparent }),
  }));
  const written = await executeNamed<{ delivery_id: string }>(
    tx,
    'corral_insert_turn_rows_many',
    sql`
    with w as (
      select * from jsonb_to_recordset(${JSON.stringify(input)}::jsonb) as x(
        delivery_id uuid, turn_id uuid, conv_id uuid, activation_uid uuid, agent_uid text, session_id text,
        actor_epoch bigint, event_id uuid, revision int, job_retry_count int, worker_id text, input jsonb, coalesced jsonb,
        traceparent text)
    ), ${TURN_ROWS}
    select delivery_id from t`,
  );
  if (written.length !== rows.length)
    throw new Error(`turn rows for ${rows.length - written.length} of ${rows.length} events were not written`);
  return input.map((r) => r.delivery_id);
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
 * T5's writes for a batch of turns whose fences held, in ONE statement: the turns `succeeded`, the
 * user message (the turn's recorded input) and the worker's messages numbered at the end of each
 * conversation, deliveries `completed`, activations warm (no current event, lease renewed). A batch holds at most one turn per conversation (one live turn
 * per actor). Returns the turns written, by delivery id (a turn no longer `started` is left out,
 * and so is everything of it), each with its conversation, the seq of its first message and, with
 * `lines`, its messages as `contextLinesOf` prints them (so the daemon can keep contexts, see
 * src/runtime/context-cache.ts).
 */
export async function commitTurnRowsMany(
  tx: DbOrTx,
  rows: readonly CommitRowsInput[],
  opts: { lines: boolean } = { lines: false },
): Promise<Map<string, CommittedTurn>> {
  if (rows.length === 0) return new Map();
  const leaseMs = rows[0]!.leaseMs;
  const input = rows.map((r) => ({
    delivery_id: r.deliveryId,
    activation_uid: r.activationUid,
    revision: r.revision,
    worker_id: r.workerId,
    // wrapped, so that an output of JSON null stays JSON null (a recordset turns it into SQL NULL)
    output: r.output === undefined ? null : { v: r.output },
    messages: r.messages,
  }));
  const written = await executeNamed<{
    delivery_id: string;
    messages: number;
    expected: number;
    conversation_id: string;
    first_seq: number;
    lines: string | null;
  }>(
    tx,
    // the name carries all that varies in the text
    `corral_commit_turn_rows_many${opts.lines ? '_lines' : ''}`,
    sql`
    with i as (
      select * from jsonb_to_recordset(${JSON.stringify(input)}::jsonb)
        as x(delivery_id uuid, activation_uid uuid, revision int, worker_id text, output jsonb, messages jsonb)
    ), t as (
      update corral.turns tu
         set status = 'succeeded', finished_at = now(), revision = i.revision, worker_id = i.worker_id,
             output = i.output->'v'
        from i
       where tu.delivery_id = i.delivery_id and ${onKeyedRow(sql`tu.status = 'started'`)}
      returning tu.id, tu.conversation_id, tu.input, tu.coalesced, tu.delivery_id, tu.event_id, tu.actor_epoch, tu.attempt,
                i.activation_uid, i.messages, coalesce(jsonb_array_length(tu.coalesced), 0) as batched,
                1 + coalesce(jsonb_array_length(tu.coalesced), 0) + jsonb_array_length(i.messages) as count
    ), c as (
      update corral.conversations cv
         set next_seq = cv.next_seq + t.count, updated_at = now()
        from t
       where cv.id = t.conversation_id
      returning cv.id, cv.agent_uid, cv.session_id, cv.next_seq - t.count as first
    ), items as (
      select t.delivery_id, t.id as turn_id, t.conversation_id, t.count, 1::bigint as ord, 'user'::text as role,
             coalesce(t.input, 'null'::jsonb) as content from t
      union all
      -- a batch's other events, each a user message of its own, in order (src/db/turns/batches.ts)
      select t.delivery_id, t.id, t.conversation_id, t.count, b.ord + 1, 'user', coalesce(b.elem->'data', 'null'::jsonb)
        from t, jsonb_array_elements(t.coalesced) with ordinality as b(elem, ord)
      union all
      select t.delivery_id, t.id, t.conversation_id, t.count, t.batched + x.ord + 1, x.elem->>'role', x.elem->'content'
        from t, jsonb_array_elements(t.messages) with ordinality as x(elem, ord)
    ), mi as (
      -- each turn's messages, numbered at the end of its conversation: what m inserts, and what the
      -- result reports per turn (grouped here, so no join back to the turns is needed)
      select items.delivery_id, items.turn_id, items.conversation_id, items.count, c.first + items.ord - 1 as seq,
             items.role, items.content
        from items join c on c.id = items.conversation_id
    ), m as (
      insert into corral.messages (conversation_id, turn_id, seq, role, content)
      select conversation_id, turn_id, seq, role, content from mi
    ), d as (
      update corral.deliveries dl set state = 'completed', updated_at = now()
        from t
       where dl.delivery_id = t.delivery_id and ${onKeyedRow(sql`dl.state in ${DELIVERY_LIVE_LIST}`)}
      returning 1
    ), a as (
      update corral.activations av
         set current_event_id = null, lease_expires_at = now() + ${leaseMs} * interval '1 millisecond', updated_at = now()
        from t
       where av.activation_uid = t.activation_uid and ${onKeyedRow(sql`av.status in ${LIVE}`)}
      returning 1
    ), n as (
      ${COMMITTED_NOTIFY}
    )
    select delivery_id, count(*)::int as messages, min(count)::int as expected, conversation_id, min(seq) as first_seq,
           ${opts.lines ? sql.raw(`string_agg(role || ' ' || content::text, E'\\n' order by seq)`) : sql.raw('null::text')} as lines
      from mi where ${turnsNotified('n')} group by delivery_id, conversation_id`,
  );
  return new Map(
    written
      .filter((w) => w.messages === w.expected)
      .map((w) => [w.delivery_id, { conversationId: w.conversation_id, firstSeq: Number(w.first_seq), lines: w.lines }]),
  );
}

/** A turn written by `commitTurnRowsMany`. */
export interface CommittedTurn {
  conversationId: string;
  /** The seq of its first message (the user message: the turn's input). */
  firstSeq: number;
  /** Its messages, one line each (`contextLinesOf`'s format), when asked for. */
  lines: string | null;
}

/**
 * turn_accepted's writes for a batch, in ONE statement, after the fences held: deliveries
 * `accepted`, their activations' leases extended.
 */
export async function acceptDeliveryRowsMany(
  tx: DbOrTx,
  rows: readonly { deliveryId: string; activationUid: string }[],
  leaseMs: number,
): Promise<void> {
  if (rows.length === 0) return;
  await executeNamed(
    tx,
    'corral_accept_delivery_many',
    sql`
    with i as (
      select * from jsonb_to_recordset(${JSON.stringify(rows.map((r) => ({ delivery_id: r.deliveryId, activation_uid: r.activationUid })))}::jsonb)
        as x(delivery_id uuid, activation_uid uuid)
    ), d as (
      update corral.deliveries dl set state = 'accepted', updated_at = now()
        from i
       where dl.delivery_id = i.delivery_id and ${onKeyedRow(sql`dl.state in ${UNACCEPTED}`)}
      returning 1
    )
    update corral.activations av
       set lease_expires_at = greatest(av.lease_expires_at, now() + ${leaseMs} * interval '1 millisecond'), updated_at = now()
      from (select distinct activation_uid from i) ia
     where av.activation_uid = ia.activation_uid and ${onKeyedRow(sql`av.status in ${LIVE}`)}`,
  );
}

/** turn_progress's write for a batch, in ONE statement: the leases extended. Returns them by activation. */
export async function extendLeasesMany(tx: DbOrTx, activationUids: readonly string[], leaseMs: number): Promise<Map<string, Date>> {
  if (activationUids.length === 0) return new Map();
  const rows = await executeNamed<{ activation_uid: string; lease_expires_at: Date | string }>(
    tx,
    'corral_extend_leases_many',
    sql`
    update corral.activations
       set lease_expires_at = greatest(lease_expires_at, now() + ${leaseMs} * interval '1 millisecond'), updated_at = now()
     where activation_uid in (select jsonb_array_elements_text(${JSON.stringify([...new Set(activationUids)])}::jsonb)::uuid)
       and ${onKeyedRow(sql`status in ${LIVE}`)}
    returning activation_uid, lease_expires_at`,
  );
  return new Map(rows.map((r) => [r.activation_uid, toDate(r.lease_expires_at)!]));
}
