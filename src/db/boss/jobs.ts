/**
 * Read-only SQL on pg-boss's job table for operator tooling: dead letters, the jobs of one actor,
 * queue depths. pg-boss has no query for "dead letters of actor X whose error mentions Y"; these
 * statements read `<bossSchema>.job` directly (partitioned by queue name, so every statement names
 * the queue first). Every write to a job goes through the pg-boss API (see ops/dead-letters.ts),
 * but one: `makeLastAttempt`, since pg-boss has no public "fail without retry" for a fetched job
 * and makes its dead-letter copy only when a failure exhausts the job's retries.
 *
 * pg-boss's tables, columns and states come from src/db/boss/internals.ts (S7, S8 there), as
 * Drizzle fragments (`bossSql`), so every name of pg-boss's a statement here uses is one that
 * module lists and test/queue/boss-internals.test.ts checks.
 *
 * Counting touches only live states (created, retry, active, failed): pg-boss's partial index
 * `job_i14` covers them, while completed jobs (kept forever on the actor queue) are never scanned.
 */
import { sql, type SQL } from '../orm.ts';
import { formatActorKey, type ActorKey } from '../../base/actor-key.ts';
import { toDate } from '../rows.ts';
import { ageCutoff, sqlList } from '../schema.ts';
import type { DbOrTx } from '../client.ts';
import {
  BOSS_FAILURE_MESSAGE,
  BOSS_NOW,
  BOSS_TABLE,
  QUEUE,
  HOLDING_STATES,
  JOB,
  JOB_STATE,
  LIVE_STATES,
  QUEUED_STATES,
  jobColumns,
  stateList,
  stateLiteral,
  type JobColumn,
  type JobState,
} from './internals.ts';
import type { DeadLetter, PendingJob } from '../views.ts';

export type { DeadLetter, PendingJob } from '../views.ts';

export type { JobState };

/** pg-boss's names as Drizzle fragments: its job table in a schema, its columns, its states. */
export const bossSql = {
  job: (schema: string): SQL => sql`${sql.identifier(schema)}.${sql.raw(BOSS_TABLE.job)}`,
  col: Object.fromEntries(Object.entries(JOB).map(([k, v]) => [k, sql.raw(v)])) as Record<JobColumn, SQL>,
  state: Object.fromEntries(Object.values(JOB_STATE).map((s) => [s, sql.raw(stateLiteral(s))])) as Record<JobState, SQL>,
  states: (states: readonly JobState[]): SQL => sql.raw(stateList(states)),
  columns: (keys: readonly JobColumn[], alias?: string): SQL => sql.raw(jobColumns(keys, alias)),
};

const c = bossSql.col;
const st = bossSql.state;
const job = bossSql.job;
const LIVE = bossSql.states(LIVE_STATES);

/** Where corral's queues live: pg-boss's schema, the actor queue and its dead-letter queue. */
export interface Queues {
  schema: string;
  events: string;
  deadLetter: string;
}

export interface DeadLetterFilter {
  actor?: ActorKey;
  /** Only dead letters younger than this (by dead-letter time). */
  sinceMs?: number;
  /** Case-insensitive substring of the last error (code, message, kind). */
  error?: string;
  ids?: readonly string[];
}

export interface Page {
  limit?: number;
  /** Continue after this dead letter (keyset on dead-letter time, id); it must still exist. */
  after?: string;
}

interface DeadLetterRow {
  id: string;
  source_id: string | null;
  singleton_key: string | null;
  data: Record<string, unknown> | null;
  source_created_on: unknown;
  created_on: unknown;
  source_retry_count: number | null;
  source_output: unknown;
}

const DEAD_LETTER_COLUMNS = bossSql.columns([
  'id',
  'source_id',
  'singleton_key',
  'data',
  'source_created_on',
  'created_on',
  'source_retry_count',
  'source_output',
]);

/**
 * The text `--error` matches, lower-cased: the error's code and message (corral's
 * `{ error: { code, message }, kind }`, or pg-boss's own `{ value: { message } }` when it failed
 * the job itself, e.g. a heartbeat timeout) and the failure kind. Not the raw JSON, whose keys
 * would match everything.
 */
const [bossValue, bossMessage] = BOSS_FAILURE_MESSAGE;
const errorText = sql.raw(
  `lower(concat_ws(' ', ${JOB.source_output}->'error'->>'code', ${JOB.source_output}->'error'->>'message', ` +
    `${JOB.source_output}->'${bossValue}'->>'${bossMessage}', ${JOB.source_output}->>'message', ${JOB.source_output}->>'kind'))`,
);

function toDeadLetter(r: DeadLetterRow): DeadLetter {
  const data = r.data ?? {};
  const [keyAgent, keySession] = (r.singleton_key ?? '').split('/');
  const agentUid = typeof data.agentUid === 'string' ? data.agentUid : (keyAgent ?? '');
  const sessionId = typeof data.sessionId === 'string' ? data.sessionId : (keySession ?? '');
  const enqueued = toDate(r.source_created_on) ?? (typeof data.enqueuedAt === 'string' ? new Date(data.enqueuedAt) : null);
  return {
    id: r.id,
    eventId: r.source_id ?? r.id,
    agentUid,
    sessionId,
    actor: r.singleton_key ?? `${agentUid}/${sessionId}`,
    payload: data.payload,
    data,
    enqueuedAt: enqueued,
    failedAt: toDate(r.created_on)!,
    attempts: (r.source_retry_count ?? 0) + 1,
    lastError: r.source_output ?? null,
  };
}

function filterSql(f: DeadLetterFilter): SQL[] {
  const where: SQL[] = [];
  if (f.actor) where.push(sql`${c.singleton_key} = ${formatActorKey(f.actor)}`);
  if (f.sinceMs !== undefined) where.push(sql`${c.created_on} >= now() - ${f.sinceMs} * interval '1 millisecond'`);
  if (f.error) where.push(sql`strpos(${errorText}, ${f.error.toLowerCase()}) > 0`);
  if (f.ids) where.push(sql`${c.id} = any(${sql.param([...f.ids])}::uuid[])`);
  return where;
}

/** Dead letters matching `filter`, oldest dead-lettered first. */
export async function findDeadLetters(
  db: DbOrTx,
  q: Pick<Queues, 'schema' | 'deadLetter'>,
  filter: DeadLetterFilter,
  page: Page = {},
): Promise<DeadLetter[]> {
  const where = [sql`${c.name} = ${q.deadLetter}`, ...filterSql(filter)];
  if (page.after) {
    where.push(
      sql`(${c.created_on}, ${c.id}) > (select a.${c.created_on}, a.${c.id} from ${job(q.schema)} a where a.${c.name} = ${q.deadLetter} and a.${c.id} = ${page.after}::uuid)`,
    );
  }
  const limit = page.limit === undefined ? sql`` : sql` limit ${page.limit}`;
  const res = await db.execute<DeadLetterRow & Record<string, unknown>>(sql`
    select ${DEAD_LETTER_COLUMNS} from ${job(q.schema)}
    where ${sql.join(where, sql` and `)}
    order by ${c.created_on}, ${c.id}${limit}`);
  return res.rows.map(toDeadLetter);
}

/** Counts dead letters matching `filter` and the distinct actors they belong to. */
export async function countDeadLetters(
  db: DbOrTx,
  q: Pick<Queues, 'schema' | 'deadLetter'>,
  filter: DeadLetterFilter = {},
): Promise<{ deadLetters: number; actors: number }> {
  const where = [sql`${c.name} = ${q.deadLetter}`, ...filterSql(filter)];
  const res = await db.execute<{ n: number; actors: number }>(sql`
    select count(*)::int as n, count(distinct ${c.singleton_key})::int as actors from ${job(q.schema)}
    where ${sql.join(where, sql` and `)}`);
  return { deadLetters: res.rows[0]?.n ?? 0, actors: res.rows[0]?.actors ?? 0 };
}

/** One dead letter by its id. */
export async function getDeadLetter(db: DbOrTx, q: Pick<Queues, 'schema' | 'deadLetter'>, id: string): Promise<DeadLetter | undefined> {
  const res = await db.execute<DeadLetterRow & Record<string, unknown>>(sql`
    select ${DEAD_LETTER_COLUMNS} from ${job(q.schema)}
    where ${c.name} = ${q.deadLetter} and ${c.id} = ${id}::uuid`);
  const row = res.rows[0];
  return row ? toDeadLetter(row) : undefined;
}

/**
 * Row-locks the dead letters among `ids` that still exist (replay and discard serialise on these
 * locks), taken in id order so two bulk actions cannot deadlock each other.
 */
export async function lockDeadLetters(db: DbOrTx, q: Pick<Queues, 'schema' | 'deadLetter'>, ids: readonly string[]): Promise<DeadLetter[]> {
  if (ids.length === 0) return [];
  const res = await db.execute<DeadLetterRow & Record<string, unknown>>(sql`
    select ${DEAD_LETTER_COLUMNS} from ${job(q.schema)}
    where ${c.name} = ${q.deadLetter} and ${c.id} = any(${sql.param([...ids])}::uuid[])
    order by ${c.id} for update`);
  return res.rows.map(toDeadLetter);
}

/** The state of a job of `queue` by id, row-locked when `lock` (undefined: no such job). */
export async function jobState(
  db: DbOrTx,
  schema: string,
  queue: string,
  id: string,
  opts: { lock?: boolean } = {},
): Promise<JobState | undefined> {
  const res = await db.execute<{ state: JobState }>(sql`
    select ${c.state}::text as state from ${job(schema)}
    where ${c.name} = ${queue} and ${c.id} = ${id}::uuid${opts.lock ? sql` for update` : sql``}`);
  return res.rows[0]?.state;
}

/** The not-yet-finished jobs (created, retry, active, failed) of one actor, in queue order. */
export async function pendingJobsOf(db: DbOrTx, schema: string, queue: string, key: ActorKey, limit = 100): Promise<PendingJob[]> {
  const res = await db.execute<{
    id: string;
    state: JobState;
    retry_count: number;
    created_on: unknown;
    start_after: unknown;
    payload: unknown;
  }>(sql`
    select ${bossSql.columns(['id'])}, ${c.state}::text as state, ${bossSql.columns(['retry_count', 'created_on', 'start_after'])}, ${c.data}->'payload' as payload
    from ${job(schema)}
    where ${c.name} = ${queue} and ${c.singleton_key} = ${formatActorKey(key)}
      and ${c.state} in ${LIVE}
    order by (${c.state} in ${bossSql.states(HOLDING_STATES)}) desc, ${c.created_on}, ${c.id}
    limit ${limit}`);
  return res.rows.map((r) => ({
    id: r.id,
    state: r.state,
    retryCount: r.retry_count,
    createdOn: toDate(r.created_on)!,
    startAfter: toDate(r.start_after)!,
    payload: r.payload,
  }));
}

/** Live job counts of the actor queue, by what an operator cares about. */
export interface QueueDepth {
  /** Queued and due now (some may still wait behind their actor's current event). */
  ready: number;
  /** Queued with a start time in the future. */
  deferred: number;
  /** Failed attempts waiting for their retry delay. */
  retrying: number;
  active: number;
  /** Failed originals kept in the queue (dead-letter mode `block`): each holds its actor. */
  failedHeld: number;
  /** Copies in the dead-letter queue. */
  deadLettered: number;
  /** When the oldest queued (created or retry) event was enqueued. */
  oldestWaitingAt: Date | null;
  oldestWaitingEventId: string | null;
  /** How long the oldest queued event has waited, by PostgreSQL's clock (null: none waits). */
  oldestWaitingSeconds: number | null;
}

export async function queueDepth(db: DbOrTx, q: Queues): Promise<QueueDepth> {
  const res = await db.execute<{
    ready: number;
    deferred: number;
    retrying: number;
    active: number;
    failed: number;
    dead: number;
    oldest_at: unknown;
    oldest_id: string | null;
    oldest_age: number | null;
  }>(sql`
    with ev as (
      select ${bossSql.columns(['state', 'start_after', 'created_on', 'id'])} from ${job(q.schema)}
      where ${c.name} = ${q.events} and ${c.state} in ${LIVE}
    ), oldest as (
      select created_on, id from ev where state in ${bossSql.states(QUEUED_STATES)} order by created_on, id limit 1
    )
    select
      (select count(*) from ev where state = ${st.created} and start_after <= now())::int as ready,
      (select count(*) from ev where state = ${st.created} and start_after > now())::int as deferred,
      (select count(*) from ev where state = ${st.retry})::int as retrying,
      (select count(*) from ev where state = ${st.active})::int as active,
      (select count(*) from ev where state = ${st.failed})::int as failed,
      (select count(*) from ${job(q.schema)} where ${c.name} = ${q.deadLetter} and ${c.state} in ${LIVE})::int as dead,
      (select created_on from oldest) as oldest_at,
      (select id from oldest) as oldest_id,
      (select greatest(0, extract(epoch from now() - created_on))::float8 from oldest) as oldest_age`);
  const r = res.rows[0]!;
  return {
    ready: r.ready,
    deferred: r.deferred,
    retrying: r.retrying,
    active: r.active,
    failedHeld: r.failed,
    deadLettered: r.dead,
    oldestWaitingAt: toDate(r.oldest_at),
    oldestWaitingEventId: r.oldest_id,
    oldestWaitingSeconds: r.oldest_age,
  };
}

/** Completed jobs of `queue` finished before `olderThanSeconds` ago, at most `limit` (the retention sweep). */
export async function completedJobsOlderThan(
  db: DbOrTx,
  schema: string,
  queue: string,
  olderThanSeconds: number,
  limit: number,
): Promise<string[]> {
  const res = await db.execute<{ id: string }>(sql`
    select ${bossSql.columns(['id'])} from ${job(schema)}
     where ${c.name} = ${queue} and ${c.state} = ${st.completed}
       and ${c.completed_on} < ${ageCutoff(olderThanSeconds)}
     limit ${limit}`);
  return res.rows.map((r) => r.id);
}

/**
 * Makes the running attempt of job `id` its last (retry_limit = retry_count), fenced by the
 * attempt: a following pg-boss `fail` then dead-letters the job at once, through pg-boss's own
 * path (state, dead-letter copy, singleton key), instead of scheduling a retry. Returns whether
 * the attempt was still running.
 */
export async function makeLastAttempt(tx: DbOrTx, schema: string, queue: string, id: string, retryCount: number): Promise<boolean> {
  const res = await tx.execute(sql`
    update ${job(schema)} set ${c.retry_limit} = ${c.retry_count}
     where ${c.name} = ${queue} and ${c.id} = ${id} and ${c.retry_count} = ${retryCount} and ${c.state} = ${st.active}`);
  return (res.rowCount ?? 0) > 0;
}

/**
 * S15: an interrupted attempt (input policy `interrupt`) gives its job back to the queue without
 * spending it: state `created` again, as never started (so pg-boss's next claim does not count
 * an attempt), keeping its place at the head of its key. Only while `active` at `retryCount`.
 */
export async function requeueActiveJob(tx: DbOrTx, schema: string, queue: string, id: string, retryCount: number): Promise<boolean> {
  const res = await tx.execute(sql`
    update ${job(schema)} set ${c.state} = ${st.created}, ${c.started_on} = null, ${c.heartbeat_on} = null
     where ${c.name} = ${queue} and ${c.id} = ${id} and ${c.retry_count} = ${retryCount} and ${c.state} = ${st.active}`);
  return (res.rowCount ?? 0) > 0;
}

/**
 * S7 for a queued job (a batch member, src/db/turns/batches.ts B4): its next failure is its last, so
 * pg-boss's unfenced `fail` dead-letters it. False when it is no longer queued.
 */
export async function makeQueuedLastAttempt(tx: DbOrTx, schema: string, queue: string, id: string): Promise<boolean> {
  const res = await tx.execute(sql`
    update ${job(schema)} set ${c.retry_limit} = ${c.retry_count}
     where ${c.name} = ${queue} and ${c.id} = ${id} and ${c.state} = ${st.created}`);
  return (res.rowCount ?? 0) > 0;
}

/** Whether job `j`'s actor is blocked by it (dead-letter mode `block`): looked up by the actor's key, its primary key. */
const BLOCKED_BY_IT = sql`exists (select 1 from corral.actors a
   where a.agent_uid = split_part(j.${c.singleton_key}, '/', 1) and a.session_id = split_part(j.${c.singleton_key}, '/', 2)
     and a.blocked_by_event_id = j.${c.id})`;

/** A failed job of the actor queue that corral did not settle (see `unsettledFailedJobs`). */
export interface UnsettledFailedJob {
  id: string;
  actor: ActorKey;
  retryCount: number;
}

/**
 * Failed jobs of the actor queue that corral never settled: pg-boss failed them by itself (its
 * heartbeat or expiry supervision, after the daemon that held them died) and dead-lettered them.
 * Corral's own failures leave none (in dead-letter mode `continue` the failed original is deleted
 * with the failure; in `block` the actor is blocked by it). Reads the live states' index only.
 */
export async function unsettledFailedJobs(db: DbOrTx, schema: string, queue: string, limit: number): Promise<UnsettledFailedJob[]> {
  const res = await db.execute<{ id: string; singleton_key: string | null; retry_count: number }>(sql`
    select ${bossSql.columns(['id', 'singleton_key', 'retry_count'])} from ${job(schema)} j
     where ${c.name} = ${queue} and ${c.state} in ${LIVE} and ${c.state} = ${st.failed}
       and not ${BLOCKED_BY_IT}
     limit ${limit}`);
  return res.rows.flatMap((r) => {
    const actor = actorOfSingletonKey(r.singleton_key);
    return actor ? [{ id: r.id, actor, retryCount: Number(r.retry_count) }] : [];
  });
}

/** Locks failed job `id` of `queue` while corral has not settled it (`unsettledFailedJobs`); false when it has, or another holds it. */
export async function lockUnsettledFailedJob(tx: DbOrTx, schema: string, queue: string, id: string): Promise<boolean> {
  const res = await tx.execute(sql`
    select 1 from ${job(schema)} j
     where ${c.name} = ${queue} and ${c.id} = ${id} and ${c.state} = ${st.failed}
       and not ${BLOCKED_BY_IT}
     for update of j skip locked`);
  return (res.rowCount ?? 0) > 0;
}

/** The actor of a job's singleton key (`agent_uid/session_id`), or undefined for a key of another shape. */
function actorOfSingletonKey(key: string | null): ActorKey | undefined {
  const parts = key?.split('/') ?? [];
  if (parts.length !== 2 || !parts[0] || !parts[1]) return undefined;
  return { agentUid: parts[0], sessionId: parts[1] };
}

/**
 * S12: stamps pg-boss's maintenance claim on `queues` (now, by pg-boss's clock), so its daily walk
 * of every job does not run on them: corral's retention sweep maintains them.
 */
export async function holdBossMaintenance(db: DbOrTx, schema: string, queues: readonly string[]): Promise<void> {
  const s = sql.identifier(schema);
  await db.execute(sql`
    update ${s}.${sql.raw(BOSS_TABLE.queue)} set ${sql.raw(QUEUE.maintain_on)} = ${s}.${sql.raw(BOSS_NOW)}()
     where ${sql.raw(QUEUE.name)} in ${sqlList(queues)}`);
}
