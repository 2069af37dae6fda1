/**
 * The fence: the one check every reply from a worker must pass before it changes anything.
 *
 * A worker echoes the `turn_ref` it was given. It counts only if it equals, field by field, the
 * delivery row it names and the live activation that delivery belongs to, it comes from the
 * worker the delivery was given to, the activation's lease is still alive by PostgreSQL's clock,
 * and the event's pg-boss job is still active at the delivery's attempt. `lockFence` (one reply)
 * and `loadFenceRowsMany` (a batch) take the row locks; `checkFence` decides. Every fenced
 * operation on a turn (accept, progress, commit, fail, redirect) goes through them, inside the
 * transaction that then writes. Steer and cancel act on the actor's live turn, not on a worker's
 * reply: they lock the live activation instead (see src/ops/turn-control.ts).
 */
import { sql, type SQL } from '../orm.ts';
import { FenceRejected, type FenceReason } from '../../base/errors.ts';
import { isUuid } from '../../base/uuid.ts';
import type { ActivationRow } from './activations.ts';
import type { DbOrTx } from '../client.ts';
import type { DeliveryRow } from './deliveries.ts';
import { activations, deliveries, ACTIVATION_LIVE, onKeyedRow } from '../schema.ts';
import { executeNamed } from '../prepared.ts';
import { fromRawRow, prefixedColumns } from '../rows.ts';
import { bossSql } from '../boss/jobs.ts';

const c = bossSql.col;

/** Where the events' pg-boss jobs live: pg-boss's schema and the actor queue's name. */
export interface JobTable {
  schema: string;
  queue: string;
}

/** The fence a worker echoes (camelCase form of the wire `turn_ref`). */
export interface Fence {
  agentUid: string;
  sessionId: string;
  activationUid: string;
  actorEpoch: number;
  eventId: string;
  revision: number;
  deliveryId: string;
}

/** The fence a delivery row (or an activation with its event and delivery) carries. */
export function fenceOf(
  d: Pick<DeliveryRow, 'agentUid' | 'sessionId' | 'activationUid' | 'actorEpoch' | 'eventId' | 'revision' | 'deliveryId'>,
): Fence {
  return {
    agentUid: d.agentUid,
    sessionId: d.sessionId,
    activationUid: d.activationUid,
    actorEpoch: d.actorEpoch,
    eventId: d.eventId,
    revision: d.revision,
    deliveryId: d.deliveryId,
  };
}

export interface FenceRows {
  delivery: DeliveryRow | undefined;
  activation: ActivationRow | undefined;
  /** `now() < lease_expires_at`, evaluated by PostgreSQL. */
  leaseAlive: boolean;
  /** The actor's durable epoch counter (to tell a stale epoch from a merely ended activation). */
  actorEpochCounter: number | undefined;
  /** The event's pg-boss job is `active` at the delivery's attempt (its retry count). */
  jobActive: boolean;
}

const isLive = (status: string) => (ACTIVATION_LIVE as readonly string[]).includes(status);

/**
 * Plain equality checks of `fence` against the rows. Returns null when the fence holds, else the
 * reason. A delivery that already completed is reported as `already_committed` so the caller can
 * answer a duplicate result with the committed outcome. With `workerId`, the reply must also come
 * from the worker the delivery was given to (when it names one).
 */
export function checkFence(fence: Fence, rows: FenceRows, workerId?: string): FenceReason | null {
  const { delivery: d, activation: a } = rows;
  if (!d) return 'unknown_delivery';
  if (workerId !== undefined && d.workerId !== null && d.workerId !== workerId) return 'wrong_worker';
  if (d.agentUid !== fence.agentUid || d.sessionId !== fence.sessionId) return 'wrong_actor';
  if (d.activationUid !== fence.activationUid) return 'unknown_activation';
  if (d.eventId !== fence.eventId) return 'stale_event';
  if (d.actorEpoch !== fence.actorEpoch) return 'stale_epoch';
  if (!a) return 'unknown_activation';
  if (a.agentUid !== fence.agentUid || a.sessionId !== fence.sessionId) return 'wrong_actor';
  if (a.actorEpoch !== fence.actorEpoch) return 'stale_epoch';
  if (d.state === 'completed') return 'already_committed';
  if (d.state === 'failed') return a.endReason === 'cancelled' ? 'cancelled' : 'already_failed';
  if (!isLive(a.status)) {
    if (a.endReason === 'cancelled') return 'cancelled';
    if ((rows.actorEpochCounter ?? 0) > fence.actorEpoch) return 'stale_epoch';
    return 'activation_not_live';
  }
  if (d.state === 'superseded' || d.state === 'send_failed') return 'delivery_superseded';
  if (a.currentEventId !== fence.eventId) return 'stale_event';
  if (a.revision !== fence.revision || d.revision !== fence.revision) return 'stale_revision';
  if (!rows.leaseAlive) return 'lease_expired';
  if (!rows.jobActive) return 'job_not_active';
  return null;
}

/** The fence rows of a delivery that does not exist (or whose id is not a UUID). */
export const NO_FENCE_ROWS: FenceRows = {
  delivery: undefined,
  activation: undefined,
  leaseAlive: false,
  actorEpochCounter: undefined,
  jobActive: false,
};

/**
 * True when the pg-boss job of delivery `d` (a row in scope) is active in the attempt the delivery
 * carries: the fence's job check, for the statements that apply it in SQL (fence rows, fenced reads).
 * pg-boss's names are S6 of src/db/boss/internals.ts. The job is reached by its key, never through
 * the partial index of live jobs (`onKeyedRow`), which statistics of a long history estimate at one row.
 */
export function jobActiveOf(jobs: JobTable, d: string): SQL {
  const del = sql.raw(d);
  return sql`exists (select 1 from ${bossSql.job(jobs.schema)} j
                      where j.${c.name} = ${jobs.queue} and j.${c.id} = ${del}.event_id
                        and ${onKeyedRow(sql`j.${c.state} = ${bossSql.state.active} and j.${c.retry_count} = ${del}.job_retry_count`)})`;
}

/**
 * Loads and row-locks the fence rows of many deliveries in one statement (a batch of replies, or
 * one): both rows, the lease by PostgreSQL's clock, the epoch counter and the job's state. Rows
 * are locked in delivery-id order, so two daemons locking overlapping batches cannot deadlock.
 * The job row is read, not locked: pg-boss may still settle it (e.g. its heartbeat supervision)
 * before the commit completes it, and then the completion's own attempt fence refuses it and the
 * transaction rolls back. Deliveries that do not exist are absent from the map. A named statement
 * (prepared once per connection) whose ids arrive as one array: it runs for every reply group.
 */
export async function loadFenceRowsMany(tx: DbOrTx, jobs: JobTable, deliveryIds: readonly string[]): Promise<Map<string, FenceRows>> {
  const ids = [...new Set(deliveryIds.filter((id) => isUuid(id)))].sort();
  if (ids.length === 0) return new Map();
  const rows = await executeNamed<
    Record<string, unknown> & { lease_alive: boolean; epoch_counter: string | number | null; job_active: boolean }
  >(
    tx,
    `corral_lock_fence_many:${jobs.schema}`,
    sql`
    select ${prefixedColumns(deliveries, 'd', 'd_')}, ${prefixedColumns(activations, 'a', 'a_')},
           a.lease_expires_at > now() as lease_alive,
           (select ac.epoch_counter from corral.actors ac
             where ac.agent_uid = d.agent_uid and ac.session_id = d.session_id) as epoch_counter,
           ${jobActiveOf(jobs, 'd')} as job_active
      from corral.deliveries d
      join corral.activations a on a.activation_uid = d.activation_uid
     where d.delivery_id = any(${sql.param(ids)}::uuid[])
     order by d.delivery_id
       for update of d, a`,
  );
  return new Map(
    rows.map((r) => {
      const delivery = fromRawRow(deliveries, r, 'd_');
      const rowsOf: FenceRows = {
        delivery,
        activation: fromRawRow(activations, r, 'a_'),
        leaseAlive: r.lease_alive,
        actorEpochCounter: r.epoch_counter === null ? undefined : Number(r.epoch_counter),
        jobActive: r.job_active,
      };
      return [delivery.deliveryId, rowsOf];
    }),
  );
}

/**
 * Locks the fence rows and throws `FenceRejected` unless the fence holds (for `workerId`, if
 * given). With `lateSteer`, a fence that only missed later steers holds too (`checkFenceLateSteer`:
 * a worker's final message about the turn, which it no longer runs).
 */
export async function lockFence(
  tx: DbOrTx,
  jobs: JobTable,
  fence: Fence,
  workerId?: string,
  opts: { lateSteer?: boolean } = {},
): Promise<{ delivery: DeliveryRow; activation: ActivationRow }> {
  if (!isUuid(fence.deliveryId)) throw new FenceRejected('unknown_delivery');
  const rows = (await loadFenceRowsMany(tx, jobs, [fence.deliveryId])).get(fence.deliveryId) ?? NO_FENCE_ROWS;
  let reason = checkFence(fence, rows, workerId);
  if (reason === 'stale_revision' && opts.lateSteer) reason = checkFenceLateSteer(fence, rows, workerId);
  if (reason) throw new FenceRejected(reason);
  return { delivery: rows.delivery!, activation: rows.activation! };
}

/**
 * A result that missed a steer (docs/protocol.md §9): `checkFence` said `stale_revision`, and the
 * result carries an OLDER revision than the turn's current one. Every other field is checked as
 * usual against the current revision; null means the result may commit as is and the steering
 * inputs after its revision become the actor's next events.
 */
export function checkFenceLateSteer(fence: Fence, rows: FenceRows, workerId?: string): FenceReason | null {
  const current = rows.activation?.revision;
  if (current === undefined || fence.revision >= current) return 'stale_revision';
  return checkFence({ ...fence, revision: current }, rows, workerId);
}
