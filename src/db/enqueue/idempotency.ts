/**
 * Retention of idempotency keys (written by `corral.send_events`, src/db/enqueue/send-event.ts): a key is
 * kept at least as long as its event's job is, in the actor queue or as a dead letter, so a send
 * again with the key finds the event as long as the queue knows of it. pg-boss's names come from
 * src/db/boss/internals.ts through `bossSql`.
 */
import type { DbOrTx } from '../client.ts';
import { bossSql, type Queues } from '../boss/jobs.ts';
import { ageCutoff } from '../schema.ts';
import { sql } from '../orm.ts';

const c = bossSql.col;

/**
 * Deletes up to `limit` keys older than `olderThanSeconds` whose event has no job left: neither
 * in the actor queue nor a dead letter of it (found by its lineage's root, pg-boss's indexed
 * `source_root_id`: every dead letter descending from the event, however many replays ago). The
 * cutoff is a literal (`ageCutoff`), so a pass with nothing due reads an index range, not the table.
 * Returns how many.
 */
export async function pruneIdempotencyKeys(db: DbOrTx, q: Queues, olderThanSeconds: number, limit: number): Promise<number> {
  const res = await db.execute(sql`
    with gone as (
      select k.agent_uid, k.session_id, k.caller, k.key
        from corral.idempotency_keys k
       where k.created_at < ${ageCutoff(olderThanSeconds)}
         and not exists (select 1 from ${bossSql.job(q.schema)} j where j.${c.name} = ${q.events} and j.${c.id} = k.event_id)
         and not exists (select 1 from ${bossSql.job(q.schema)} d where d.${c.source_root_id} = k.event_id and d.${c.name} = ${q.deadLetter})
       order by k.created_at
       limit ${limit}
    )
    delete from corral.idempotency_keys k using gone
     where k.agent_uid = gone.agent_uid and k.session_id = gone.session_id and k.caller = gone.caller and k.key = gone.key`);
  return res.rowCount ?? 0;
}
