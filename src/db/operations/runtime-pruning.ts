/**
 * Pruning of the runtime projections (docs/data-model.md): deliveries and activations are the
 * fences of turns that ran, and once a turn is settled nothing live needs them. After
 * `CORRAL_RUNTIME_RETENTION_S` they are deleted in bounded batches, so the tables hold what is
 * live and recent, not all of history; the transcript (turns, messages) is untouched.
 *
 *  P1 A delivery goes once it is finished (completed, failed, send_failed, superseded), untouched
 *     for the window, and its turn is not `started` (recovery repairs a started turn through its
 *     delivery). A late result naming it is then refused `unknown_delivery`, as any stale reply.
 *  P2 An activation goes once it ended (stopped, failed) the window ago, has no delivery left, and
 *     is not its actor's latest (`corral actor` shows that one; epochs come from `corral.actors`,
 *     so deleting old activations never lets an epoch repeat).
 *  P3 Each batch is one statement (`skip locked`: rows a live transaction holds are left for the
 *     next pass), so a crash at any point leaves either the batch deleted or nothing.
 *  P4 A pass with nothing due reads index ranges (`deliveries_finished`, `activations_ended`), not
 *     the tables; the cutoff is a literal so the planner sees how little is past it.
 */
import type { DbOrTx } from '../client.ts';
import { sql } from '../orm.ts';
import { ACTIVATION_ENDED, ageCutoff, DELIVERY_FINISHED, onKeyedRow, sqlList } from '../schema.ts';

/** P1: deletes up to `limit` finished deliveries older than `olderThanSeconds`. Returns how many. */
export async function pruneDeliveries(db: DbOrTx, olderThanSeconds: number, limit: number): Promise<number> {
  const res = await db.execute(sql`
    with gone as (
      select d.delivery_id
        from corral.deliveries d
       where d.state in ${sqlList(DELIVERY_FINISHED)} and d.updated_at < ${ageCutoff(olderThanSeconds)}
         and not exists (select 1 from corral.turns t where t.delivery_id = d.delivery_id and ${onKeyedRow(sql`t.status = 'started'`)})
       order by d.updated_at
       limit ${limit}
         for update of d skip locked
    )
    delete from corral.deliveries d using gone where d.delivery_id = gone.delivery_id`);
  return res.rowCount ?? 0;
}

/** P2: deletes up to `limit` ended activations older than `olderThanSeconds`. Returns how many. */
export async function pruneActivations(db: DbOrTx, olderThanSeconds: number, limit: number): Promise<number> {
  const res = await db.execute(sql`
    with gone as (
      select a.activation_uid
        from corral.activations a
       where a.status in ${sqlList(ACTIVATION_ENDED)} and a.ended_at < ${ageCutoff(olderThanSeconds)}
         and not exists (select 1 from corral.deliveries d where d.activation_uid = a.activation_uid)
         and exists (
           select 1 from corral.activations n
            where n.agent_uid = a.agent_uid and n.session_id = a.session_id and n.actor_epoch > a.actor_epoch)
       order by a.ended_at
       limit ${limit}
         for update of a skip locked
    )
    delete from corral.activations a using gone where a.activation_uid = gone.activation_uid`);
  return res.rowCount ?? 0;
}
