/**
 * The attempt-failure step: an attempt of an event that will not commit is ended, and its job is
 * failed with its attempt fence `{ id, retryCount }`, so that pg-boss retries it (5–120 s backoff)
 * under a new epoch, or dead-letters it. One transaction each; pg-boss runs inside it.
 *
 * Who fails an attempt:
 * - the commit step, for a worker's `turn_error` (src/runtime/turn-commit.ts);
 * - the begin step, for a live activation still holding an older attempt (`superseded`);
 * - the watchdog: a lease that expired in flight (`expire`), a turn past the maximum turn time
 *   (`failOverdue`);
 * - recovery: expired leases of dead daemons (`expire`), a turn left `started` without a live
 *   delivery (`repairOrphanTurn`).
 *
 * Every path re-checks its condition under the activation's row lock, so a heartbeat or a
 * commit that got there first wins and the failure changes nothing.
 */
import { fromDrizzle, type PgBoss } from 'pg-boss';
import type { ActorKey } from '../base/actor-key.ts';
import type { DeadLetterMode } from '../config.ts';
import type { Db, Tx } from '../db/client.ts';
import { inTransaction } from '../db/tx.ts';
import { lockFence, type Fence, type JobTable } from '../db/turns/fence.ts';
import { FenceRejected } from '../base/errors.ts';
import * as activations from '../db/turns/activations.ts';
import type { ActivationRow } from '../db/turns/activations.ts';
import * as deliveries from '../db/turns/deliveries.ts';
import * as transcript from '../db/turns/transcript.ts';
import { lastEpochOf, setBlockedBy } from '../db/turns/actors.ts';
import { lockUnsettledFailedJob, makeQueuedLastAttempt, requeueActiveJob, type UnsettledFailedJob } from '../db/boss/jobs.ts';
import { JOB_STATE } from '../db/boss/internals.ts';
import { notifyTurnEvents } from '../db/turns/turn-events.ts';
import { sql } from '../db/orm.ts';

export type FailureKind = 'turn_error' | 'lease_expired' | 'worker_lost' | 'superseded' | 'recovered' | 'turn_timeout' | 'queue_expired';

export interface FailOutcome {
  /** The job went to the dead-letter queue (its retries are exhausted). */
  deadLettered: boolean;
  /** The job's attempt was still current and was failed (false: it had already settled). */
  jobFailed: boolean;
}

export interface AttemptFailureDeps {
  db: Db;
  boss: PgBoss;
  /** Where the events' jobs are. */
  jobs: JobTable;
  deadLetterMode: DeadLetterMode;
}

export class AttemptFailures {
  private readonly deps: AttemptFailureDeps;

  constructor(deps: AttemptFailureDeps) {
    this.deps = deps;
  }

  /**
   * The watchdog's transaction: fail a live activation whose lease expired while it ran an event.
   * Re-checks expiry under the row lock (a late heartbeat may have extended it meanwhile).
   */
  async expire(activationUid: string): Promise<FailOutcome | undefined> {
    return inTransaction(this.deps.db, async (tx) => {
      const activation = await activations.lockActivationIf(tx, activationUid, 'expired_in_flight');
      if (!activation) return undefined;
      return this.failActivationInTx(tx, activation, 'lease_expired', { message: 'lease expired' }, true);
    });
  }

  /**
   * The maximum turn duration passed: fail the attempt (it is retried under a new epoch) even
   * though its lease is alive, so a worker that keeps reporting progress cannot hold a turn
   * forever. Acts only while the activation is still live on that event.
   */
  async failOverdue(fence: Fence, maxTurnMs: number): Promise<FailOutcome | undefined> {
    return inTransaction(this.deps.db, async (tx) => {
      const activation = await activations.lockActivationIf(tx, fence.activationUid, 'live');
      if (!activation || activation.currentEventId !== fence.eventId) return undefined;
      const error = { code: 'turn_timeout', message: `turn ran longer than the maximum of ${maxTurnMs} ms` };
      return this.failActivationInTx(tx, activation, 'turn_timeout', error, true);
    });
  }

  /**
   * Recovery: a turn left `started` whose delivery is no longer live (or is gone). The turn is
   * failed; if its job attempt is still active, the attempt is failed so the event is retried
   * under a new epoch. Returns whether the job attempt was failed.
   */
  async repairOrphanTurn(turn: transcript.TurnRow): Promise<FailOutcome | undefined> {
    return inTransaction(this.deps.db, async (tx) => {
      const finished = await transcript.finishTurn(tx, turn.deliveryId, 'failed', {
        error: { code: 'recovered', message: 'turn left started without a live delivery' },
      });
      if (!finished) return undefined;
      const delivery = await deliveries.getDelivery(tx, turn.deliveryId);
      if (delivery) return { deadLettered: false, jobFailed: false };
      const key = await transcript.actorOfConversation(tx, turn.conversationId);
      const live = key ? await activations.lockLiveActivation(tx, key) : undefined;
      if (live && live.currentEventId === turn.eventId) {
        return this.failActivationInTx(tx, live, 'recovered', { message: 'fence rows lost' }, true, turn.attempt - 1);
      }
      const db = fromDrizzle(tx, sql);
      const res = (await this.deps.boss.fail(
        this.deps.jobs.queue,
        { id: turn.eventId, retryCount: turn.attempt - 1 },
        { error: { code: 'recovered', message: 'fence rows lost' } },
        { db },
      )) as { affected?: number };
      if (res.affected !== 1 || !key) return { deadLettered: false, jobFailed: res.affected === 1 };
      const members = Array.isArray(turn.coalesced) ? (turn.coalesced as { event_id: string }[]).map((m) => m.event_id) : [];
      const deadLettered = await this.settleFailedJob(
        tx,
        key,
        { eventId: turn.eventId, epoch: turn.actorEpoch, attempt: turn.attempt },
        async () => members,
        { code: 'recovered', message: 'fence rows lost' },
        'recovered',
      );
      return { deadLettered, jobFailed: true };
    });
  }

  /**
   * Recovery: a job pg-boss failed and dead-lettered by itself (its heartbeat or expiry supervision,
   * after the daemon that held it died), which corral never settled. Settled as corral settles its
   * own dead letters, in one transaction: the attempt corral may still run for it ends (so its
   * worker's result cannot commit), the failed original leaves the actor queue (or blocks the
   * actor, in dead-letter mode `block`), and watchers hear `dead_lettered`. False when it was
   * settled meanwhile (another daemon's recovery, an operator's replay).
   */
  async adoptDeadLetter(failed: UnsettledFailedJob): Promise<boolean> {
    const { jobs } = this.deps;
    return inTransaction(this.deps.db, async (tx) => {
      if (!(await lockUnsettledFailedJob(tx, jobs.schema, jobs.queue, failed.id))) return false;
      const error = { code: 'queue_expired', message: 'the queue failed the job by itself (its holder went silent) and dead-lettered it' };
      const live = await activations.lockLiveActivation(tx, failed.actor);
      const running = live?.currentEventId === failed.id ? live : undefined;
      if (running) await this.failActivationInTx(tx, running, 'queue_expired', error, false);
      const epoch = running?.actorEpoch ?? (await lastEpochOf(tx, failed.actor));
      await this.settleFailedJob(
        tx,
        failed.actor,
        { eventId: failed.id, epoch, attempt: failed.retryCount + 1 },
        async () => [],
        error,
        'queue_expired',
      );
      return true;
    });
  }

  /**
   * Input policy `interrupt`: an event came while the turn of `fence` runs. Under the fence's row
   * locks, while the fence holds (its delivery live, its job active at its attempt): the activation
   * ends, its deliveries are superseded and their turns marked `interrupted`, and the job goes back
   * to the queue unspent (S15 of src/db/boss/internals.ts), so the actor's next turn takes it with
   * the events that came (its policy batches, src/db/turns/batches.ts). False when the turn had moved on.
   */
  async interrupt(fence: Fence): Promise<boolean> {
    const { jobs } = this.deps;
    return inTransaction(this.deps.db, async (tx) => {
      // the fence rows locked as every reply locks them (delivery, then activation): no deadlock
      // with a reply of the same turn committing meanwhile
      let rows: Awaited<ReturnType<typeof lockFence>>;
      try {
        rows = await lockFence(tx, jobs, fence);
      } catch (e) {
        if (e instanceof FenceRejected) return false;
        throw e;
      }
      const { activation, delivery } = rows;
      if (!(await requeueActiveJob(tx, jobs.schema, jobs.queue, fence.eventId, delivery.jobRetryCount))) return false;
      await activations.endActivation(tx, activation.activationUid, 'failed', 'interrupted');
      const error = { code: 'interrupted', message: 'interrupted by a newer event (input policy interrupt)' };
      for (const id of await deliveries.supersedeDeliveriesOf(tx, activation.activationUid, 'interrupted')) {
        await transcript.finishTurn(tx, id, 'interrupted', { error });
      }
      return true;
    });
  }

  /** The begin step met a live activation still holding an older attempt: it ends, its job stays as it is. */
  supersede(tx: Tx, stale: ActivationRow): Promise<FailOutcome> {
    return this.failActivationInTx(tx, stale, 'superseded', { message: 'superseded by a newer attempt' }, false);
  }

  /**
   * Ends `activation` as failed, supersedes its live deliveries, fails their started turns and,
   * when it was running an event and `failJob`, fails the job's attempt so pg-boss schedules the
   * retry (5–120 s backoff) or dead-letters it. Runs in the caller's transaction, which holds the
   * activation's row lock.
   */
  async failActivationInTx(
    tx: Tx,
    activation: ActivationRow,
    kind: FailureKind,
    error: { code?: string; message: string },
    failJob: boolean,
    knownRetryCount?: number,
  ): Promise<FailOutcome> {
    const { boss, jobs } = this.deps;
    await activations.endActivation(tx, activation.activationUid, 'failed', kind);
    const superseded = await deliveries.supersedeDeliveriesOf(tx, activation.activationUid, kind);
    const errorRecord = { code: error.code ?? kind, message: error.message };
    for (const id of superseded) await transcript.finishTurn(tx, id, 'failed', { error: errorRecord });
    const eventId = activation.currentEventId;
    if (!failJob || eventId === null) return { deadLettered: false, jobFailed: false };

    const retryCount = knownRetryCount ?? (await deliveries.latestJobRetryCount(tx, activation.activationUid, eventId));
    if (retryCount === undefined) return { deadLettered: false, jobFailed: false };
    const db = fromDrizzle(tx, sql);
    const res = (await boss.fail(jobs.queue, { id: eventId, retryCount }, { error: errorRecord, kind }, { db })) as {
      affected?: number;
    };
    if (res.affected !== 1) return { deadLettered: false, jobFailed: false };
    const deadLettered = await this.settleFailedJob(
      tx,
      { agentUid: activation.agentUid, sessionId: activation.sessionId },
      { eventId, epoch: activation.actorEpoch, attempt: retryCount + 1 },
      async () => (await deliveries.latestDeliveryOf(tx, activation.activationUid, eventId))?.coalesced ?? [],
      errorRecord,
      kind,
    );
    return { deadLettered, jobFailed: true };
  }

  /**
   * After pg-boss failed the attempt of `turn.eventId`: whether that dead-lettered it, and then
   * what the dead-letter mode does (`continue`: the failed original leaves the actor queue and its
   * batch's other events, `members`, follow it; `block`: the actor is held, the others wait queued
   * behind it, and a replay forms the batch again). Watchers hear of every event it moved, with
   * the commit (src/db/turns/turn-events.ts).
   */
  private async settleFailedJob(
    tx: Tx,
    key: ActorKey,
    turn: { eventId: string; epoch: number; attempt: number },
    members: () => Promise<readonly string[]>,
    error: { code: string; message: string },
    kind: FailureKind,
  ): Promise<boolean> {
    const { boss, jobs } = this.deps;
    const db = fromDrizzle(tx, sql);
    const deadLettered = (await boss.getJobById(jobs.queue, turn.eventId, { db }))?.state === JOB_STATE.failed;
    const notices = [turn.eventId];
    if (deadLettered && this.deps.deadLetterMode === 'continue') {
      // The dead-letter copy keeps the event; the failed original would hold the actor's queue.
      await boss.deleteJob(jobs.queue, turn.eventId, { db });
      notices.push(...(await this.deadLetterMembers(tx, await members(), turn.eventId, error, kind)));
    } else if (deadLettered) {
      await setBlockedBy(tx, key, turn.eventId);
    }
    await notifyTurnEvents(
      tx,
      notices.map((eventId) => ({
        kind: deadLettered ? ('dead_lettered' as const) : ('failed' as const),
        ...key,
        eventId,
        epoch: turn.epoch,
        attempt: turn.attempt,
      })),
    );
    return deadLettered;
  }

  /**
   * B4 of src/db/turns/batches.ts: the other events of a dead-lettered head's batch follow it into the
   * dead-letter queue, one by one in order (a failed job holds its key: two at once would break
   * pg-boss's one-per-key index), each deleted from the actor queue as the head was. Returns those moved.
   */
  private async deadLetterMembers(
    tx: Tx,
    members: readonly string[],
    eventId: string,
    error: { code: string; message: string },
    kind: FailureKind,
  ): Promise<string[]> {
    const { boss, jobs } = this.deps;
    const db = fromDrizzle(tx, sql);
    const moved: string[] = [];
    for (const id of members) {
      if (!(await makeQueuedLastAttempt(tx, jobs.schema, jobs.queue, id))) continue;
      const res = (await boss.fail(jobs.queue, id, { error, kind, batch_of: eventId }, { db })) as { affected?: number };
      if (res.affected !== 1) continue;
      await boss.deleteJob(jobs.queue, id, { db });
      moved.push(id);
    }
    return moved;
  }
}
