/**
 * Steering and cancelling an actor's live turn: operator use-cases (`corral steer`, `corral
 * cancel`, `Daemon.steer` / `Daemon.cancel`), from any process that reaches the database.
 *
 * They act on the actor's live turn, not on a worker's reply: each locks the live activation,
 * changes the rows in one transaction, and commits a control notification with the change
 * (src/db/turns/control.ts), so the daemon holding the worker's connection tells the worker
 * (`turn_steer`, `turn_cancel`). No daemon has to run for the change to hold: a steered turn's
 * old revision and a cancelled turn's result are refused by the fence either way.
 */
import { fromDrizzle, type PgBoss } from 'pg-boss';
import { formatActorKey, type ActorKey } from '../base/actor-key.ts';
import type { Db, Tx } from '../db/client.ts';
import { inTransaction } from '../db/tx.ts';
import * as activations from '../db/turns/activations.ts';
import * as deliveries from '../db/turns/deliveries.ts';
import * as transcript from '../db/turns/transcript.ts';
import { MAX_STEERING_BYTES, notifyControl } from '../db/turns/control.ts';
import { fenceOf, type Fence } from '../db/turns/fence.ts';
import { sql } from '../db/orm.ts';
import { DELIVERY_LIVE } from '../db/schema.ts';
import { notifyTurnEvents } from '../db/turns/turn-events.ts';
import { CorralError } from '../base/errors.ts';
import { unstorableReason } from '../base/json-safety.ts';

export interface TurnControlDeps {
  db: Db;
  boss: PgBoss;
  /** The actor queue: a cancel completes the event's job there. */
  queueName: string;
}

/**
 * Steers the live turn of `key` in place: bumps the activation's revision (and the delivery's
 * and turn's copies), so only a result carrying the new revision can commit. The daemon holding
 * the worker connection is told through a control notification committed with the change.
 */
export async function steerTurn(deps: Pick<TurnControlDeps, 'db'>, key: ActorKey, input: unknown): Promise<Fence> {
  const unstorable = unstorableReason(input);
  if (unstorable) throw new CorralError('invalid_argument', `the steering input cannot be stored: ${unstorable}`);
  const bytes = Buffer.byteLength(JSON.stringify(input ?? null));
  if (bytes > MAX_STEERING_BYTES) {
    throw new CorralError('invalid_argument', `the steering input is ${bytes} bytes; the limit is ${MAX_STEERING_BYTES}`);
  }
  return inTransaction(deps.db, async (tx) => {
    const { delivery } = await lockLiveTurn(tx, key);
    const revision = await activations.bumpRevision(tx, delivery.activationUid);
    await deliveries.setDeliveryRevision(tx, delivery.deliveryId, revision);
    await transcript.setTurnRevision(tx, delivery.deliveryId, revision, input ?? null);
    const fence = { ...fenceOf(delivery), revision };
    await notifyControl(tx, { kind: 'steer', fence, input: input ?? null });
    return fence;
  });
}

/**
 * Cancels the live turn of `key`: the turn is recorded as cancelled with the event's `user`
 * message (so the person sees what they sent), the activation ends (a late result is rejected
 * with `cancelled`) and the event's job completes, so the actor moves on; so do the jobs of the
 * other events of its batch, if it took one.
 */
export async function cancelTurn(deps: TurnControlDeps, key: ActorKey, reason: string): Promise<Fence> {
  return inTransaction(deps.db, async (tx) => {
    const { activation, delivery } = await lockLiveTurn(tx, key);
    const error = { code: 'cancelled', message: reason };
    await deliveries.transitionDelivery(tx, delivery.deliveryId, DELIVERY_LIVE, 'failed', 'cancelled');
    await transcript.finishTurn(tx, delivery.deliveryId, 'cancelled', { error });
    await transcript.recordCancelledInput(tx, delivery.deliveryId);
    await activations.endActivation(tx, activation.activationUid, 'failed', 'cancelled');
    for (const id of await deliveries.supersedeDeliveriesOf(tx, activation.activationUid, 'cancelled')) {
      await transcript.finishTurn(tx, id, 'cancelled', { error });
    }
    await deps.boss.complete(
      deps.queueName,
      { id: delivery.eventId, retryCount: delivery.jobRetryCount },
      { cancelled: true, reason },
      { db: fromDrizzle(tx, sql) },
    );
    // a batch's other events are the turn's too (src/db/turns/batches.ts): they are cancelled with it
    const members = delivery.coalesced ?? [];
    if (members.length > 0) {
      await deps.boss.complete(deps.queueName, members, { cancelled: true, reason }, { db: fromDrizzle(tx, sql), includeQueued: true });
    }
    const fence = fenceOf(delivery);
    await notifyControl(tx, { kind: 'cancel', fence, reason });
    await notifyTurnEvents(
      tx,
      [delivery.eventId, ...members].map((eventId) => ({
        kind: 'cancelled' as const,
        ...key,
        eventId,
        epoch: delivery.actorEpoch,
        attempt: delivery.jobRetryCount + 1,
      })),
    );
    return fence;
  });
}

/**
 * The actor's live turn, its delivery's row locked before its activation's: the order every
 * reply locks them in (src/db/turns/fence.ts), so a steer or cancel meeting a reply of the same turn
 * waits for it instead of deadlocking with it.
 */
async function lockLiveTurn(tx: Tx, key: ActorKey) {
  const seen = await activations.liveActivationOf(tx, key);
  const delivery = seen?.currentEventId ? await deliveries.lockLiveDeliveryOfEvent(tx, seen.currentEventId) : undefined;
  const live = delivery ? await activations.lockActivationIf(tx, delivery.activationUid, 'live') : undefined;
  if (!live || !delivery || live.currentEventId !== delivery.eventId) {
    throw new CorralError('not_found', `${formatActorKey(key)} has no turn in flight`);
  }
  return { activation: live, delivery };
}
