/**
 * Cross-shard emits (docs/scaling.md, "Emits to another shard"): a turn's emit to an actor of
 * another shard is a row of the source shard's `corral.shard_emits`, written in the turn's commit;
 * the relay (src/runtime/shard-relay.ts) moves the rows to their target shards.
 *
 *  X1 A row is written in the commit of the turn that emitted it, with the event id and job data
 *     the emit would have had as a local event: it exists exactly when the turn committed.
 *  X2 The target takes a set of rows in one transaction: `corral.shard_inbox` keeps each event id
 *     it took, and only rows it had not taken are enqueued (pg-boss's insert, S11 of
 *     src/db/boss/internals.ts, the event's own id). A row delivered twice is enqueued once.
 *  X3 The source deletes a row only after the target's transaction committed; the target keeps
 *     the inbox entry (pruned after `runtimeRetentionSeconds`, far beyond the moment between the
 *     target's commit and the source's delete).
 *  X4 Order: rows are read in `id` order (the source's commit order) and a target transaction
 *     takes at most one row per actor, so two emits to one actor are enqueued by two transactions,
 *     in order (pg-boss orders a key's jobs by `created_on`, the transaction's time).
 */
import type pg from 'pg';
import { formatActorKey } from '../../base/actor-key.ts';
import { sql } from '../orm.ts';
import type { DbOrTx } from '../client.ts';
import { shardEmits } from '../schema-shards.ts';
import { EVENT_JOBS_INSERT_FUNCTION, sendPayload } from '../boss/internals.ts';

/** One emit to an actor of another shard (X1). */
export interface ShardEmit {
  targetShard: number;
  eventId: string;
  agentUid: string;
  sessionId: string;
  /** The job's data (src/queue/event-job.ts). */
  data: object;
  delayMs?: number;
}

/** A row of the outbox, in `id` order. */
export interface PendingShardEmit extends ShardEmit {
  id: number;
  attempts: number;
}

/** Longest error text kept on a row. */
const MAX_ERROR_CHARS = 500;

/** X1: inside the commit's transaction. */
export async function recordShardEmits(tx: DbOrTx, rows: readonly ShardEmit[]): Promise<void> {
  if (rows.length === 0) return;
  await tx.insert(shardEmits).values(
    rows.map((r) => ({
      targetShard: r.targetShard,
      eventId: r.eventId,
      agentUid: r.agentUid,
      sessionId: r.sessionId,
      data: r.data,
      delayMs: r.delayMs ?? null,
    })),
  );
}

/** X4: the oldest rows, in commit order. */
export async function pendingShardEmits(db: DbOrTx, limit: number): Promise<PendingShardEmit[]> {
  const rows = await db.execute<{
    id: string;
    target_shard: number;
    event_id: string;
    agent_uid: string;
    session_id: string;
    data: object;
    delay_ms: number | null;
    attempts: number;
  }>(sql`select id, target_shard, event_id, agent_uid, session_id, data, delay_ms, attempts
           from corral.shard_emits order by id limit ${limit}`);
  return rows.rows.map((r) => ({
    id: Number(r.id),
    targetShard: r.target_shard,
    eventId: r.event_id,
    agentUid: r.agent_uid,
    sessionId: r.session_id,
    data: r.data,
    attempts: r.attempts,
    ...(r.delay_ms === null ? {} : { delayMs: r.delay_ms }),
  }));
}

/** X3: after the target committed them. */
export async function deleteShardEmits(db: DbOrTx, ids: readonly number[]): Promise<void> {
  if (ids.length === 0) return;
  await db.execute(sql`delete from corral.shard_emits where id = any(${sql.param(ids.map(String))}::bigint[])`);
}

/** A delivery that failed: counted and explained on its rows (`corral shards list` shows them). */
export async function noteShardEmitFailure(db: DbOrTx, ids: readonly number[], error: string): Promise<void> {
  if (ids.length === 0) return;
  await db.execute(
    sql`update corral.shard_emits set attempts = attempts + 1, last_error = ${error.slice(0, MAX_ERROR_CHARS)}
         where id = any(${sql.param(ids.map(String))}::bigint[])`,
  );
}

/**
 * X2, on the target shard's connection `client` (its statements name the target's schemas): one
 * transaction that records the event ids and enqueues the rows not taken before. Returns how many
 * were enqueued.
 */
export async function acceptShardEmits(
  client: pg.ClientBase,
  queue: string,
  sourceShard: number,
  rows: readonly ShardEmit[],
): Promise<number> {
  if (rows.length === 0) return 0;
  await client.query('begin');
  try {
    const fresh = await client.query<{ event_id: string }>(
      `insert into corral.shard_inbox (event_id, source_shard)
         select unnest($1::uuid[]), $2 on conflict (event_id) do nothing returning event_id`,
      [rows.map((r) => r.eventId), sourceShard],
    );
    const taken = new Set(fresh.rows.map((r) => r.event_id));
    const jobs = rows
      .filter((r) => taken.has(r.eventId))
      .map((r) => ({
        ...sendPayload(queue, { id: r.eventId, data: r.data, singletonKey: formatActorKey(r) }),
        ...(r.delayMs ? { startAfter: `${r.delayMs} milliseconds` } : {}),
      }));
    if (jobs.length > 0) {
      const inserted = await client.query(`select ${EVENT_JOBS_INSERT_FUNCTION}($1) as id`, [JSON.stringify(jobs)]);
      if (inserted.rows.length !== jobs.length)
        throw new Error(`the target shard enqueued ${inserted.rows.length} of ${jobs.length} events`);
    }
    await client.query('commit');
    return jobs.length;
  } catch (e) {
    await client.query('rollback').catch(() => undefined);
    throw e;
  }
}

/** X3: inbox entries older than `seconds`. */
export async function pruneShardInbox(db: DbOrTx, seconds: number): Promise<number> {
  const r = await db.execute(sql`delete from corral.shard_inbox where received_at < now() - make_interval(secs => ${seconds})`);
  return r.rowCount ?? 0;
}
