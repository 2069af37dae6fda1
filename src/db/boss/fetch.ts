/**
 * The actor queue's fetch: pg-boss's `key_strict_fifo` claim, written so its cost follows the
 * batch, not the backlog. Its statement is `claimStatement` in src/db/boss/internals.ts (S5 of
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
 * It runs inside `corral.claim_actor_events(queue, lim, batch_bytes)` (`claimFunctionSql`), a PL/pgSQL
 * function that also names each claimed head's batch (src/db/turns/batches.ts) and whose other purpose
 * is its planner settings (`CLAIM_PLANNER_SETTINGS`: no sorts, no
 * sequential or bitmap scans). Completed history drowns the queued rows in the statistics: after
 * an ANALYZE of a table of 10M completed jobs taken while nothing was queued, `state` reads
 * `{completed}=1` and every partial index on queued rows is estimated at one row, so the planner
 * sees an ordered index scan and "any scan, then sort" as equally cheap and sometimes picks the
 * second for the key-head lookup: 1.5 s per fetch at a backlog of 100k instead of ~1 ms
 * (docs/benchmarks.md, "A week of history"). Without sorts the only plans left that deliver the
 * fetch order and the head order are the index scans of `job_i11` and `job_i10`, which stop at
 * the limit and at the key's first job: whatever the statistics say, the cost follows the batch.
 * The function's plan is cached per connection like a named statement's, and its generic plan
 * does not know the limit, so the claimed ids reach the update as an array (an InitPlan), never
 * as a join the planner could turn into a scan of the job table.
 *
 * The claim is pg-boss's: the same conditions, `FOR UPDATE SKIP LOCKED`, and the same update
 * (state `active`, `started_on`, `heartbeat_on`, `retry_count` + 1 on a re-claim), so pg-boss's
 * attempt fence, heartbeats, retries and dead letters work on these jobs unchanged. A unique
 * violation (a concurrent fetch won a key: pg-boss's `job_i8`) is an empty fetch, as in pg-boss.
 */
import { createHash } from 'node:crypto';
import type { Queues } from './jobs.ts';
import { claimKeysStatement, claimStatement, insertTargetOf, moreQueuedExpression, queueTable, type BossSqlRunner } from './internals.ts';
import { sqlState } from '../../base/errors.ts';
import { executeNamed, type Queryable } from '../prepared.ts';
import type { DbOrTx } from '../client.ts';
import { sql } from '../orm.ts';
import { ACTOR_BATCH_FUNCTION, actorBatchFunctionSql, BATCHING_POSSIBLE, type BatchMember } from '../turns/batches.ts';
import { DEFAULT_MAX_MESSAGE_BYTES } from '../../base/defaults.ts';

export { claimKeysStatement, claimStatement, queueTable };

/** The function the claim runs in (one per database: corral's schema holds one deployment). */
export const CLAIM_FUNCTION = 'corral.claim_actor_events';
export const CLAIM_SIGNATURE = `${CLAIM_FUNCTION}(text, integer, integer)`;
/** The claim of named keys' heads (`claimKeysStatement`): the next turns of busy actors, in their commits. */
export const CLAIM_KEYS_FUNCTION = 'corral.claim_actor_events_of';
/** The byte budget of a batch when the caller names none: half of the default CORRAL_MAX_MESSAGE_BYTES. */
const DEFAULT_BATCH_BYTES = DEFAULT_MAX_MESSAGE_BYTES / 2;

/** The planner settings the claim is planned under (see above): the plans they leave are bounded by the batch. */
export const CLAIM_PLANNER_SETTINGS = { enable_sort: 'off', enable_seqscan: 'off', enable_bitmapscan: 'off' } as const;

/**
 * `CREATE OR REPLACE FUNCTION corral.claim_actor_events(queue text, lim integer, batch_bytes integer)`:
 * the claim on `schema`.`table`, each claimed job with the batch that goes with it (src/db/turns/batches.ts:
 * null for a turn of one event, and never looked for while no batching policy applies and the job
 * is a first attempt).
 */
export function claimFunctionSql(schema: string, table: string): string {
  const settings = Object.entries(CLAIM_PLANNER_SETTINGS)
    .map(([k, v]) => `SET ${k} = ${v}`)
    .join(' ');
  const quote = '$corral_claim$';
  /** One claim function; `guarded`: a unique violation is an empty claim (it runs inside a commit, which must not fail for it). */
  const claimFunction = (name: string, second: string, body: string, guarded: boolean) => {
    if (body.includes(quote)) throw new Error(`the claim holds ${quote}`);
    const [secondName, secondType] = second.split(' ') as [string, string];
    // its rows gained `more`: a function whose row type changes cannot be replaced, only dropped
    return `DROP FUNCTION IF EXISTS ${name}(text, ${secondType}, integer);

CREATE FUNCTION ${name}(queue text, ${secondName} ${secondType}, batch_bytes integer DEFAULT ${DEFAULT_BATCH_BYTES})
RETURNS TABLE (id uuid, retry_count integer, data jsonb, batch jsonb, more boolean)
LANGUAGE plpgsql VOLATILE ${settings}
AS ${quote}
#variable_conflict use_column
DECLARE
  batching boolean := ${BATCHING_POSSIBLE};
BEGIN
  RETURN QUERY WITH c AS (${body})
  SELECT c.id, c.retry_count, c.data,
         CASE WHEN batching OR c.retry_count > 0
              THEN ${ACTOR_BATCH_FUNCTION}(queue, c.id, c.retry_count, c.data, batching, batch_bytes) END,
         ${moreQueuedExpression(schema, table, 'queue', 'c')}
    FROM c;${
      guarded
        ? `
EXCEPTION WHEN unique_violation THEN
  RETURN;`
        : ''
    }
END
${quote};`;
  };
  return `${actorBatchFunctionSql(schema, table)}

DROP FUNCTION IF EXISTS ${CLAIM_FUNCTION}(text, integer);

${claimFunction(CLAIM_FUNCTION, 'lim integer', claimStatement(schema, table), false)}

${claimFunction(CLAIM_KEYS_FUNCTION, 'keys text[]', claimKeysStatement(schema, table), true)}`;
}

/** The comment that names the installed text's digest (so an unchanged function is not replaced). */
const MARK = 'corral generated ';
/** Arbitrary, stable: "clai" in ASCII. */
const CLAIM_INSTALL_LOCK_KEY = 0x636c6169;

/**
 * Installs (or replaces) the claim function for the actor queue, unless the one installed was made
 * from the same text. Returns false, installing nothing, when the queue does not exist yet.
 */
export async function installClaimFunction(db: BossSqlRunner, q: Pick<Queues, 'schema' | 'events'>): Promise<boolean> {
  const target = await insertTargetOf(db, q.schema, q.events);
  if (!target) return false;
  const text = claimFunctionSql(q.schema, target.table);
  const mark = MARK + createHash('sha256').update(text).digest('hex').slice(0, 32);
  const current = await db.executeSql(`select obj_description(to_regprocedure('${CLAIM_SIGNATURE}'), 'pg_proc') as mark`);
  if ((current.rows[0] as { mark?: string | null } | undefined)?.mark === mark) return true;
  // one simple query: one implicit transaction, serialised between daemons starting together
  await db.executeSql(
    [`select pg_advisory_xact_lock(${CLAIM_INSTALL_LOCK_KEY})`, text, `COMMENT ON FUNCTION ${CLAIM_SIGNATURE} IS '${mark}'`].join(';\n'),
  );
  return true;
}

export interface ClaimedJob<T = unknown> {
  id: string;
  retryCount: number;
  data: T;
  /** The events after this one its turn takes (src/db/turns/batches.ts), in order; absent for one event. */
  batch?: BatchMember[];
  /** Its key had another job the claim could take after it (a hint: the actor will likely have a next turn). */
  more?: boolean;
}

type ClaimRow<T> = { id: string; retry_count: number; data: T; batch: BatchMember[] | null; more: boolean | null };

const claimedOf = <T>(r: ClaimRow<T>): ClaimedJob<T> => ({
  id: r.id,
  retryCount: r.retry_count,
  data: r.data,
  ...(r.batch ? { batch: r.batch } : {}),
  ...(r.more ? { more: true } : {}),
});

/** A fetch of up to `limit` key heads of the actor queue, claimed for this caller. */
export type KeyHeadFetch = <T>(limit: number) => Promise<ClaimedJob<T>[]>;

/**
 * Binds the claim (installed by `installClaimFunction`) to a connection pool and the queue's table
 * (see `queueTable`); `batchBytes` is a batch's byte budget (B1 of src/db/turns/batches.ts).
 */
export function keyHeadFetch(
  db: Queryable,
  q: Pick<Queues, 'schema' | 'events'>,
  table: string,
  batchBytes: number = DEFAULT_BATCH_BYTES,
): KeyHeadFetch {
  // the function embeds the table; `table` names the statement so a moved queue gets a new one
  const text = `select id, retry_count, data, batch, more from ${CLAIM_FUNCTION}($1, $2, $3)`;
  const name = `corral_fetch:${q.schema}.${table}`;
  return async <T>(limit: number): Promise<ClaimedJob<T>[]> => {
    if (limit <= 0) return [];
    try {
      const res = await db.query<ClaimRow<T>>({ name, text, values: [q.events, limit, batchBytes] });
      return res.rows.map(claimedOf);
    } catch (e) {
      if (sqlState(e) === '23505') return [];
      throw e;
    }
  };
}

/**
 * The heads of the actor keys `keys` (`agent_uid/session_id`), claimed in the caller's transaction
 * (`corral.claim_actor_events_of`): the next turns of busy actors, taken in the commit of their
 * current ones. A key with nothing to claim is left out; the claim never fails the transaction.
 */
export async function claimKeyHeads<T>(
  tx: DbOrTx,
  queue: string,
  keys: readonly string[],
  batchBytes: number = DEFAULT_BATCH_BYTES,
): Promise<ClaimedJob<T>[]> {
  if (keys.length === 0) return [];
  const rows = await executeNamed<ClaimRow<T>>(
    tx,
    'corral_claim_keys',
    sql`select id, retry_count, data, batch, more from ${sql.raw(CLAIM_KEYS_FUNCTION)}(${queue}, ${sql.param([...keys])}::text[], ${batchBytes})`,
  );
  return rows.map(claimedOf);
}
