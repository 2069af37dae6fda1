/**
 * The actor queue's fetch: pg-boss's `key_strict_fifo` claim, written so its cost follows the
 * batch, not the backlog.
 *
 * pg-boss's own fetch first takes the head of *every* key with queued jobs (a materialized
 * `DISTINCT ON (singleton_key)` over the whole backlog), then the oldest of them: ~5–10 µs per
 * queued job, so ~1 s per fetch at 100k queued events (docs/benchmarks.md, "Backlog and burst").
 * This statement walks queued jobs in pg-boss's fetch order (`priority desc, created_on`, its
 * index `job_i11`) and keeps a job only if it is its key's head — the first queued job of the
 * key in pg-boss's head order (`state desc, created_on, id`: one entry of index `job_i10`) —
 * and its key has no job active, waiting to retry or failed (one probe of `job_i8`; `offset 0`
 * keeps it a per-row probe rather than a join against every active job); it stops at the
 * limit. Its cost is the jobs it walks past: about the limit times the queue depth per actor,
 * never more than the backlog.
 *
 * It is a named statement (planned once per connection). Its generic plan does not know the
 * limit, so the claimed ids reach the update as an array (an InitPlan), never as a join the
 * planner could turn into a scan of the job table.
 *
 * The claim is pg-boss's: the same conditions, `FOR UPDATE SKIP LOCKED`, and the same update
 * (state `active`, `started_on`, `heartbeat_on`, `retry_count` + 1 on a re-claim), so pg-boss's
 * attempt fence, heartbeats, retries and dead letters work on these jobs unchanged. A unique
 * violation (a concurrent fetch won a key: pg-boss's `job_i8`) is an empty fetch, as in pg-boss.
 */
import pg from 'pg';
import type { Queues } from './boss-jobs.ts';
import { sqlState } from '../errors.ts';
import type { Queryable } from './prepared.ts';

export interface ClaimedJob<T = unknown> {
  id: string;
  retryCount: number;
  data: T;
}

/** The table pg-boss keeps the queue's jobs in (`job_common` unless the queue is partitioned). */
export async function queueTable(db: pg.Pool | pg.Client, q: Pick<Queues, 'schema' | 'events'>): Promise<string> {
  const res = await db.query<{ table_name: string }>(`select table_name from ${pg.escapeIdentifier(q.schema)}.queue where name = $1`, [
    q.events,
  ]);
  const table = res.rows[0]?.table_name;
  if (!table) throw new Error(`pg-boss queue ${q.events} does not exist`);
  return table;
}

/** The claim's text: `$1` the queue's name, `$2` the limit. */
export function claimStatement(schema: string, table: string): string {
  const s = pg.escapeIdentifier(schema);
  const t = `${s}.${pg.escapeIdentifier(table)}`;
  return `
    with next as (
      select j.id
        from ${t} j
       where j.name = $1 and j.state < 'active' and not j.blocked and j.policy = 'key_strict_fifo'
         and j.start_after <= ${s}.job_now()
         and j.id = (
           select h.id from ${t} h
            where h.name = $1 and h.singleton_key = j.singleton_key
              and h.state < 'active' and not h.blocked and h.policy = 'key_strict_fifo'
              and h.start_after <= ${s}.job_now()
            order by h.state desc, h.created_on, h.id
            limit 1)
         and not exists (
           select 1 from ${t} b
            where b.name = $1 and b.singleton_key = j.singleton_key
              and b.state in ('active', 'retry', 'failed') and b.policy = 'key_strict_fifo' and b.id <> j.id
            offset 0)
       order by j.priority desc, j.created_on
       limit $2
       for update of j skip locked
    )
    update ${t} j
       set state = 'active', started_on = ${s}.job_now(), heartbeat_on = ${s}.job_now(),
           retry_count = case when started_on is not null then retry_count + 1 else retry_count end
     where j.name = $1 and j.id = any(array(select id from next))
    returning j.id, j.retry_count, j.data`;
}

/** A fetch of up to `limit` key heads of the actor queue, claimed for this caller. */
export type KeyHeadFetch = <T>(limit: number) => Promise<ClaimedJob<T>[]>;

/** Binds the claim to a connection pool and the queue's table (see `queueTable`). */
export function keyHeadFetch(db: Queryable, q: Pick<Queues, 'schema' | 'events'>, table: string): KeyHeadFetch {
  const text = claimStatement(q.schema, table);
  const name = `corral_fetch:${q.schema}.${table}`;
  return async <T>(limit: number): Promise<ClaimedJob<T>[]> => {
    if (limit <= 0) return [];
    try {
      const res = await db.query<{ id: string; retry_count: number; data: T }>({ name, text, values: [q.events, limit] });
      return res.rows.map((r) => ({ id: r.id, retryCount: r.retry_count, data: r.data }));
    } catch (e) {
      if (sqlState(e) === '23505') return [];
      throw e;
    }
  };
}
