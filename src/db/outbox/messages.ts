/**
 * SQL of the outbox (`corral.outbox`): the messages committed turns deliver to sinks.
 *
 *  O1 Written only by the commit transaction of the turn (`insertOutboxMany`), so a message exists
 *     exactly when its turn committed: a result that fails the fence writes none. A webhook-id a
 *     sink already has (`(sink, webhook_id)` is unique) is the same message: it is not written
 *     twice. The id starts with the message's actor (src/effects/deliver.ts, X2), so this holds
 *     per actor: another actor's message with the same key is another message.
 *  O2 A claim (`claimOutbox`) takes due, pending messages of enabled sinks, sink by sink (a
 *     disabled sink's backlog is never read), at most one per actor and sink and only when no
 *     message before it (lower `id`) for that actor and sink is pending: per actor and sink,
 *     messages go out in commit order, one at a time. It locks with SKIP LOCKED and stamps
 *     `claimed_until`, so no two senders hold a message at once.
 *  O3 A claim counts in `attempts`; a sender's answer (`settleOutbox`) applies only while the
 *     message is pending with that count, so a sender whose claim lapsed changes nothing.
 *  O4 A receiver's 410 dead-letters the message and disables the sink in one transaction: the
 *     sink's other messages wait, pending, until it is enabled again.
 *  O5 A claim reads the sink's secrets as they are then: a rotation (src/db/outbox/sinks.ts)
 *     changes no message, and every attempt after it is signed with the new secret, and with the
 *     previous one too until its overlap ends by PostgreSQL's clock.
 */
import type { TraceCarrier } from '../../base/trace-context.ts';
import type { DbOrTx } from '../client.ts';
import { sql } from '../orm.ts';
import { ageCutoff, type OutboxState } from '../schema.ts';

/** Notified (with no payload) by a commit that wrote messages: the senders claim at once. */
export const OUTBOX_CHANNEL = 'corral_outbox';

/** One message of a committing turn. */
export interface NewOutboxMessage {
  deliveryId: string;
  eventId: string;
  agentUid: string;
  sessionId: string;
  sink: string;
  webhookId: string;
  /** The result's `key`, when it gave one. */
  key: string | null;
  position: number;
  body: string;
  /** The turn's trace context, carried to the sink as `traceparent`/`tracestate` (absent: none). */
  trace?: TraceCarrier | undefined;
}

/** O1: writes the messages of a commit batch, in order, and wakes the senders: two statements. */
export async function insertOutboxMany(tx: DbOrTx, rows: readonly NewOutboxMessage[]): Promise<void> {
  if (rows.length === 0) return;
  const input = JSON.stringify(
    rows.map((r, ord) => ({
      ord,
      delivery_id: r.deliveryId,
      event_id: r.eventId,
      agent_uid: r.agentUid,
      session_id: r.sessionId,
      sink: r.sink,
      webhook_id: r.webhookId,
      key: r.key,
      position: r.position,
      body: r.body,
      traceparent: r.trace?.traceparent ?? null,
      tracestate: r.trace?.tracestate ?? null,
    })),
  );
  await tx.execute(sql`
    insert into corral.outbox (sink, webhook_id, key, agent_uid, session_id, turn_id, event_id, position, body, traceparent, tracestate)
    select i.sink, i.webhook_id, i.key, i.agent_uid, i.session_id, t.id, i.event_id, i.position, i.body, i.traceparent, i.tracestate
      from jsonb_to_recordset(${input}::jsonb)
             as i(ord int, delivery_id uuid, event_id uuid, agent_uid text, session_id text, sink text, webhook_id text, key text,
                  position int, body text, traceparent text, tracestate text)
      join corral.turns t on t.delivery_id = i.delivery_id
     order by i.ord
    on conflict (sink, webhook_id) do nothing`);
  await tx.execute(sql`select pg_notify(${OUTBOX_CHANNEL}, '')`);
}

/** A message a sender holds: what it needs to send it. */
export interface ClaimedMessage {
  id: number;
  sink: string;
  webhookId: string;
  /** The result's `key` (null without one, or on a row written before keys were stored). */
  key: string | null;
  agentUid: string;
  sessionId: string;
  eventId: string;
  body: string;
  /** The turn's trace context (null: none). */
  traceparent: string | null;
  tracestate: string | null;
  /** This claim's number (O3): the fence of the sender's answer. */
  attempts: number;
  /** This attempt's number since the message was written or last replayed (the retry limit's count). */
  attempt: number;
  url: string;
  secret: string;
  /** The secret a rotation replaced, while its overlap lasts by PostgreSQL's clock (O5); else null. */
  previousSecret: string | null;
  /** The sink's `allow_private`: whether its URL may reach inside (src/outbox/address-guard.ts). */
  allowPrivate: boolean;
  timeoutMs: number;
  concurrency: number;
}

/**
 * O2: claims up to `limit` messages for `owner`, leaving out sinks whose `free` slots (in this
 * sender) are 0 and taking at most `free[sink]` (or the sink's concurrency) of each. A claim lasts
 * the sink's timeout and `graceMs` more, so it outlives the request it covers.
 */
export async function claimOutbox(
  db: DbOrTx,
  opts: { owner: string; limit: number; free: Readonly<Record<string, number>>; graceMs: number },
): Promise<ClaimedMessage[]> {
  const rows = await db.execute<{
    id: string;
    sink: string;
    webhook_id: string;
    key: string | null;
    agent_uid: string;
    session_id: string;
    event_id: string;
    body: string;
    traceparent: string | null;
    tracestate: string | null;
    attempts: number;
    attempts_before_replay: number;
    url: string;
    secret: string;
    previous_secret: string | null;
    allow_private: boolean;
    timeout_ms: number;
    concurrency: number;
  }>(sql`
    with picked as (
      select c.id
        from corral.sinks s
        cross join lateral (
          select o.id from corral.outbox o
           where o.sink = s.name and o.state = 'pending' and o.next_attempt_at <= now()
             and (o.claimed_until is null or o.claimed_until < now())
             and not exists (
               select 1 from corral.outbox p
                where p.agent_uid = o.agent_uid and p.session_id = o.session_id and p.sink = o.sink
                  and p.state = 'pending' and p.id < o.id)
           order by o.next_attempt_at, o.id
           limit greatest(0, coalesce((${JSON.stringify(opts.free)}::jsonb ->> s.name)::int, s.concurrency))
             for update of o skip locked
        ) c
       where s.disabled_at is null
       limit ${opts.limit}
    )
    update corral.outbox o
       set attempts = o.attempts + 1, claimed_by = ${opts.owner},
           claimed_until = now() + make_interval(secs => (s.timeout_ms + ${opts.graceMs}) / 1000.0), updated_at = now()
      from picked, corral.sinks s
     where o.id = picked.id and s.name = o.sink
    returning o.id, o.sink, o.webhook_id, o.key, o.agent_uid, o.session_id, o.event_id, o.body, o.traceparent, o.tracestate,
              o.attempts, o.attempts_before_replay,
              s.url, s.secret, case when s.previous_secret_until > now() then s.previous_secret end as previous_secret,
              s.allow_private, s.timeout_ms, s.concurrency`);
  return rows.rows
    .map((r) => ({
      id: Number(r.id),
      sink: r.sink,
      webhookId: r.webhook_id,
      key: r.key,
      agentUid: r.agent_uid,
      sessionId: r.session_id,
      eventId: r.event_id,
      body: r.body,
      traceparent: r.traceparent ?? null,
      tracestate: r.tracestate ?? null,
      attempts: r.attempts,
      attempt: r.attempts - r.attempts_before_replay,
      url: r.url,
      secret: r.secret,
      previousSecret: r.previous_secret,
      allowPrivate: r.allow_private,
      timeoutMs: r.timeout_ms,
      concurrency: r.concurrency,
    }))
    .sort((a, b) => a.id - b.id);
}

/** What a sender learned of one attempt. */
export type OutboxSettlement =
  | { kind: 'delivered'; status: number }
  | { kind: 'retry'; status: number | null; error: string; delayMs: number }
  | { kind: 'dead'; status: number | null; error: string; disableSink?: string };

/**
 * O3, O4: records one attempt's outcome, if the claim still holds. Returns whether it did and,
 * for a delivery, the seconds from its commit to now.
 */
export async function settleOutbox(
  db: DbOrTx,
  claim: { id: number; attempts: number },
  outcome: OutboxSettlement,
): Promise<{ applied: boolean; sinceCommitS?: number }> {
  const error = outcome.kind === 'delivered' ? null : outcome.error.slice(0, 1000);
  const rows = await db.execute<{ since: number }>(sql`
    with settled as (
      update corral.outbox o
         set state = ${outcome.kind === 'retry' ? 'pending' : outcome.kind},
             next_attempt_at = case when ${outcome.kind === 'retry'} then now() + make_interval(secs => ${outcome.kind === 'retry' ? outcome.delayMs : 0} / 1000.0) else o.next_attempt_at end,
             delivered_at = case when ${outcome.kind === 'delivered'} then now() end,
             claimed_by = null, claimed_until = null,
             last_status = ${outcome.status}, last_error = ${error}, updated_at = now()
       where o.id = ${claim.id} and o.attempts = ${claim.attempts} and o.state = 'pending'
      returning extract(epoch from now() - o.created_at)::float8 as since
    ), disabled as (
      update corral.sinks s set disabled_at = now(), disabled_reason = ${error}, updated_at = now()
       where ${outcome.kind === 'dead' && outcome.disableSink !== undefined} and s.name = ${outcome.kind === 'dead' ? (outcome.disableSink ?? '') : ''}
         and s.disabled_at is null and exists (select 1 from settled)
    )
    select since from settled`);
  const row = rows.rows[0];
  // handed back to be sent at once (its sender stops): the other senders take it now
  if (row && outcome.kind === 'retry' && outcome.delayMs === 0) await db.execute(sql`select pg_notify(${OUTBOX_CHANNEL}, '')`);
  return row ? { applied: true, sinceCommitS: row.since } : { applied: false };
}

/**
 * Milliseconds until something may become claimable without a wake-up: the next retry that is
 * due (of an enabled sink) or the next claim that lapses; null when there is neither. (A message
 * waiting behind one being sent becomes claimable when that send ends, and its sender claims it.)
 */
export async function nextOutboxDueMs(db: DbOrTx): Promise<number | null> {
  const rows = await db.execute<{ ms: number | null }>(sql`
    select ceil(extract(epoch from least(
             (select min(n.at) from corral.sinks s cross join lateral (
                select o.next_attempt_at as at from corral.outbox o
                 where o.sink = s.name and o.state = 'pending' and o.next_attempt_at > now()
                 order by o.next_attempt_at limit 1) n
               where s.disabled_at is null),
             (select min(o.claimed_until) from corral.outbox o where o.claimed_until is not null and o.state = 'pending')
           ) - now()) * 1000)::float8 as ms`);
  // least() and greatest() skip a NULL: with neither, the answer is null ("nothing due"), never 0
  const ms = rows.rows[0]?.ms;
  return ms === null || ms === undefined ? null : Math.max(0, ms);
}

/** An outbox row as operators see it. */
export interface OutboxRow {
  id: number;
  sink: string;
  webhookId: string;
  agentUid: string;
  sessionId: string;
  turnId: string;
  eventId: string;
  position: number;
  body: string;
  state: OutboxState;
  attempts: number;
  /** `attempts` at the last replay (0 if never replayed). */
  attemptsBeforeReplay: number;
  nextAttemptAt: Date;
  claimedBy: string | null;
  claimedUntil: Date | null;
  lastStatus: number | null;
  lastError: string | null;
  createdAt: Date;
  deliveredAt: Date | null;
}

type RawOutboxRow = {
  id: string;
  sink: string;
  webhook_id: string;
  agent_uid: string;
  session_id: string;
  turn_id: string;
  event_id: string;
  position: number;
  body: string;
  state: OutboxState;
  attempts: number;
  attempts_before_replay: number;
  next_attempt_at: Date | string;
  claimed_by: string | null;
  claimed_until: Date | string | null;
  last_status: number | null;
  last_error: string | null;
  created_at: Date | string;
  delivered_at: Date | string | null;
};

const date = (v: Date | string): Date => (v instanceof Date ? v : new Date(v));
const fromRaw = (r: RawOutboxRow): OutboxRow => ({
  id: Number(r.id),
  sink: r.sink,
  webhookId: r.webhook_id,
  agentUid: r.agent_uid,
  sessionId: r.session_id,
  turnId: r.turn_id,
  eventId: r.event_id,
  position: r.position,
  body: r.body,
  state: r.state,
  attempts: r.attempts,
  attemptsBeforeReplay: r.attempts_before_replay,
  nextAttemptAt: date(r.next_attempt_at),
  claimedBy: r.claimed_by,
  claimedUntil: r.claimed_until === null ? null : date(r.claimed_until),
  lastStatus: r.last_status,
  lastError: r.last_error,
  createdAt: date(r.created_at),
  deliveredAt: r.delivered_at === null ? null : date(r.delivered_at),
});

/** Which messages an operator means: all filters hold. */
export interface OutboxFilter {
  states?: readonly OutboxState[];
  sink?: string;
  agentUid?: string;
  sessionId?: string;
  /** Only messages with a lower id (the next page of a list). */
  beforeId?: number;
  ids?: readonly number[];
}

function whereOf(f: OutboxFilter) {
  const parts = [sql`true`];
  if (f.states?.length) parts.push(sql`o.state = any(${sql.param([...f.states])}::text[])`);
  if (f.sink !== undefined) parts.push(sql`o.sink = ${f.sink}`);
  if (f.agentUid !== undefined) parts.push(sql`o.agent_uid = ${f.agentUid}`);
  if (f.sessionId !== undefined) parts.push(sql`o.session_id = ${f.sessionId}`);
  if (f.beforeId !== undefined) parts.push(sql`o.id < ${f.beforeId}`);
  if (f.ids !== undefined) parts.push(sql`o.id = any(${sql.param(f.ids.map(String))}::bigint[])`);
  return sql.join(parts, sql` and `);
}

/** Messages matching `filter`, newest first. */
export async function listOutbox(db: DbOrTx, filter: OutboxFilter, limit: number): Promise<OutboxRow[]> {
  const rows = await db.execute<RawOutboxRow>(sql`
    select o.* from corral.outbox o where ${whereOf(filter)} order by o.id desc limit ${limit}`);
  return rows.rows.map(fromRaw);
}

/** The messages of some turns, in order (a transcript shows what each turn delivered). */
export async function outboxOfTurns(db: DbOrTx, turnIds: readonly string[]): Promise<OutboxRow[]> {
  if (turnIds.length === 0) return [];
  const rows = await db.execute<RawOutboxRow>(sql`
    select o.* from corral.outbox o where o.turn_id = any(${sql.param([...turnIds])}::uuid[]) order by o.id`);
  return rows.rows.map(fromRaw);
}

/** How many messages are in each state. */
export async function outboxCounts(db: DbOrTx, sink?: string): Promise<Record<OutboxState, number>> {
  const rows = await db.execute<{ state: OutboxState; n: string }>(sql`
    select o.state, count(*) as n from corral.outbox o where ${sink === undefined ? sql`true` : sql`o.sink = ${sink}`} group by o.state`);
  const counts: Record<OutboxState, number> = { pending: 0, delivered: 0, dead: 0, discarded: 0 };
  for (const r of rows.rows) counts[r.state] = Number(r.n);
  return counts;
}

/** How many messages of each sink wait and how many are dead (sinks with neither are absent): one scan of the state index. */
export async function outboxCountsBySink(db: DbOrTx): Promise<Map<string, { pending: number; dead: number }>> {
  const rows = await db.execute<{ sink: string; pending: string; dead: string }>(sql`
    select o.sink, count(*) filter (where o.state = 'pending') as pending, count(*) filter (where o.state = 'dead') as dead
      from corral.outbox o where o.state in ('pending', 'dead') group by o.sink`);
  return new Map(rows.rows.map((r) => [r.sink, { pending: Number(r.pending), dead: Number(r.dead) }]));
}

/**
 * Sends again the dead or discarded messages matching `filter` (at most `limit`; of its states,
 * only those two count): pending, due now, with a new set of retries (their attempts keep counting, see O3) and
 * their `webhook-id` kept.
 * Returns them (id and sink).
 */
export async function replayOutbox(db: DbOrTx, filter: OutboxFilter, limit: number): Promise<{ id: number; sink: string }[]> {
  const states = (filter.states ?? ['dead', 'discarded']).filter((s) => s === 'dead' || s === 'discarded');
  if (states.length === 0) return [];
  const rows = await db.execute<{ id: string; sink: string }>(sql`
    update corral.outbox o set state = 'pending', attempts_before_replay = o.attempts, next_attempt_at = now(), claimed_by = null, claimed_until = null,
           updated_at = now()
     where o.id in (select o.id from corral.outbox o where ${whereOf({ ...filter, states })}
                     order by o.id limit ${limit} for update)
    returning o.id, o.sink`);
  if (rows.rows.length > 0) await db.execute(sql`select pg_notify(${OUTBOX_CHANNEL}, '')`);
  return rows.rows.map((r) => ({ id: Number(r.id), sink: r.sink })).sort((a, b) => a.id - b.id);
}

/**
 * Gives up on the pending or dead messages matching `filter` (at most `limit`): discarded, never
 * sent (again). A message being sent now may still arrive. Returns them (id and sink).
 */
export async function discardOutbox(db: DbOrTx, filter: OutboxFilter, limit: number): Promise<{ id: number; sink: string }[]> {
  const rows = await db.execute<{ id: string; sink: string }>(sql`
    update corral.outbox o set state = 'discarded', claimed_by = null, claimed_until = null, updated_at = now()
     where o.id in (select o.id from corral.outbox o where ${whereOf({ ...filter, states: filter.states ?? ['pending', 'dead'] })}
                     and o.state in ('pending', 'dead')
                     order by o.id limit ${limit} for update)
    returning o.id, o.sink`);
  return rows.rows.map((r) => ({ id: Number(r.id), sink: r.sink })).sort((a, b) => a.id - b.id);
}

/**
 * Deletes up to `limit` delivered or discarded messages done with more than `olderThanS` seconds
 * ago (through `outbox_finished`); how many. A key a sink had is then free again.
 */
export async function pruneOutbox(db: DbOrTx, olderThanS: number, limit: number): Promise<number> {
  const res = await db.execute(sql`
    with gone as (
      select o.id from corral.outbox o
       where o.state in ('delivered', 'discarded') and o.updated_at < ${ageCutoff(olderThanS)}
       order by o.updated_at
       limit ${limit}
         for update of o skip locked
    )
    delete from corral.outbox o using gone where o.id = gone.id`);
  return res.rowCount ?? 0;
}

/** What `corral status` and the metrics show of the outbox: messages waiting, dead, and the oldest waiting one's age. */
export interface OutboxBacklog {
  pending: number;
  dead: number;
  oldestPendingSeconds: number | null;
}

/** OutboxBacklog, through the pending and state indexes (delivered history is not read). */
export async function outboxBacklog(db: DbOrTx): Promise<OutboxBacklog> {
  const rows = await db.execute<{ pending: string; dead: string; oldest: number | null }>(sql`
    select (select count(*) from corral.outbox where state = 'pending') as pending,
           (select count(*) from corral.outbox where state = 'dead') as dead,
           (select extract(epoch from now() - min(created_at))::float8 from corral.outbox where state = 'pending') as oldest`);
  const r = rows.rows[0]!;
  return { pending: Number(r.pending), dead: Number(r.dead), oldestPendingSeconds: r.oldest };
}
