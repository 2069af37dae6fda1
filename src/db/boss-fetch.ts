/**
 * The actor queue's fetch: pg-boss's `key_strict_fifo` claim, written so its cost follows the
 * batch, not the backlog. Its statement is `claimStatement` in src/db/boss-internals.ts (S5 of
 * pg-boss's internals corral relies on); this module runs it.
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
import type { Queues } from './boss-jobs.ts';
import { claimStatement, queueTable } from './boss-internals.ts';
import { sqlState } from '../errors.ts';
import type { Queryable } from './prepared.ts';

export { claimStatement, queueTable };

export interface ClaimedJob<T = unknown> {
  id: string;
  retryCount: number;
  data: T;
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
