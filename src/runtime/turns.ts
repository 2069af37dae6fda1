/**
 * The transactions of one turn's life. Every method is one database transaction; pg-boss calls
 * run inside it through `fromDrizzle(tx, sql)`, so the job settles together with the rows.
 *
 * Invariants (see docs/failure-semantics.md):
 *  I1 one live activation per actor key: the partial unique index refuses a second one.
 *  I2 a new activation takes the durable epoch counter + 1, so replies of older attempts fail by
 *     inequality.
 *  I3 transcript rows are written only in `commit`, under a fence that held, in the transaction
 *     that completes the job with its attempt fence `{ id, retryCount }`.
 */
import { sql } from '../db/orm.ts';
import { fromDrizzle, type PgBoss } from 'pg-boss';
import { formatActorKey, type ActorKey } from '../actor-key.ts';
import type { DeadLetterMode } from '../config.ts';
import type { Db, Tx } from '../db/client.ts';
import { inTransaction } from '../db/tx.ts';
import { checkFence, checkFenceLateSteer, loadFenceRowsMany, lockFence, NO_FENCE_ROWS, type Fence, type JobTable } from '../db/fence.ts';
import * as activations from '../db/activations.ts';
import * as deliveries from '../db/deliveries.ts';
import * as transcript from '../db/transcript.ts';
import * as turnRows from '../db/turn-rows.ts';
import { makeLastAttempt } from '../db/boss-jobs.ts';
import { setBlockedBy } from '../db/actors.ts';
import { CorralError, FenceRejected, type FenceReason } from '../errors.ts';
import { unstorableReason } from '../json-safety.ts';
import { MAX_STEERING_BYTES, notifyControl } from '../db/control.ts';
import type { ConsumedJob } from '../queue/consumer.ts';
import { enqueueEffects, type EmitRequest, type TurnEffects } from '../queue/effects.ts';
import { DEFAULT_MAX_EVENT_BYTES } from '../queue/event-job.ts';
import type { ActivationRow } from '../db/activations.ts';
import type { ContextLimits } from '../db/history.ts';
import { TurnBeginner, type BeginRequest } from './turn-begin.ts';
import { ContextCache, DEFAULT_CONTEXT_CACHE_BYTES } from './context-cache.ts';
import { fenceOf } from './fence.ts';
export type { BeginRequest };
import type { Settlement } from './group-writer.ts';
import { DELIVERY_LIVE } from '../db/schema.ts';

export interface TurnsConfig {
  leaseMs: number;
  deadLetterMode: DeadLetterMode;
  /** pg-boss's schema (default `pgboss`). */
  bossSchema?: string;
  /** Largest emitted event payload (CORRAL_MAX_EVENT_BYTES). */
  maxEventBytes?: number;
  /** Conversation context in turn_start (`contextLimits`); absent or 0 messages = none. */
  context?: ContextLimits;
  /** Memory for contexts kept between turns (src/runtime/context-cache.ts); 0 = none kept. */
  contextCacheBytes?: number;
}

/** A job fetched from the actor queue. */
export type FetchedJob = ConsumedJob;

export interface StartedTurn {
  fence: Fence;
  payload: unknown;
  enqueuedAt: string;
  attempt: number;
  leaseExpiresAt: Date;
  workerId: string | null;
  /** The conversation so far as the JSON text of turn_start's `context` (src/runtime/context-cache.ts `contextJson`). */
  contextJson?: string | undefined;
}

export interface ReplyMessage {
  role: 'assistant' | 'tool';
  content: unknown;
}

export type CommitOutcome = { outcome: 'committed' } | { outcome: 'duplicate' };

/** One worker result in a group commit. */
export interface CommitRequest {
  fence: Fence;
  workerId: string;
  messages: ReplyMessage[];
  output?: unknown;
  /** Durable effects, checked already (src/queue/effects.ts): enqueued with the commit. */
  emit?: EmitRequest[];
}

/** One worker reply in a group transaction: a result, an accept or a progress report. */
export type ReplyRequest =
  | ({ kind: 'commit' } & CommitRequest)
  | { kind: 'accept'; fence: Fence; workerId: string }
  | { kind: 'progress'; fence: Fence; workerId: string };

/** What a group transaction did with one reply. */
export type ReplyOutcome =
  | CommitOutcome
  | { outcome: 'accepted' }
  | { outcome: 'extended'; leaseExpiresAt: Date | undefined }
  | { outcome: 'rejected'; reason: FenceReason };

/** What a group commit did with one result. */
export type BatchOutcome = CommitOutcome | { outcome: 'rejected'; reason: FenceReason };

/** A batch whose jobs did not all settle: rolled back, its members are committed one by one. */
export class BatchNotSettled extends Error {
  readonly unsettled: string[];
  constructor(unsettled: string[]) {
    super(`jobs did not settle: ${unsettled.join(', ')}`);
    this.name = 'BatchNotSettled';
    this.unsettled = unsettled;
  }
}

export type FailureKind = 'turn_error' | 'lease_expired' | 'worker_lost' | 'superseded' | 'recovered' | 'turn_timeout';

export interface FailOutcome {
  /** The job went to the dead-letter queue (its retries are exhausted). */
  deadLettered: boolean;
  /** The job's attempt was still current and was failed (false: it had already settled). */
  jobFailed: boolean;
}

export class TurnStore {
  private readonly db: Db;
  private readonly boss: PgBoss;
  private readonly queueName: string;
  private readonly ownerId: string;
  private readonly config: TurnsConfig;
  /** Where the fence finds the events' jobs. */
  readonly jobs: JobTable;
  /** T2, the begin of fetched jobs. */
  private readonly beginner: TurnBeginner;
  /** The contexts of the conversations this daemon ran lately (the begin checks them against the database). */
  readonly contexts: ContextCache;

  constructor(deps: { db: Db; boss: PgBoss; queueName: string; ownerId: string; config: TurnsConfig }) {
    const limits = deps.config.context;
    const context = limits !== undefined && limits.maxMessages > 0 ? limits : undefined;
    this.contexts = new ContextCache(
      context ?? { maxMessages: 0, maxBytes: 0 },
      context ? (deps.config.contextCacheBytes ?? DEFAULT_CONTEXT_CACHE_BYTES) : 0,
    );
    this.beginner = new TurnBeginner({
      db: deps.db,
      ownerId: deps.ownerId,
      leaseMs: deps.config.leaseMs,
      supersede: (tx, stale) => this.failActivationInTx(tx, stale, 'superseded', { message: 'superseded by a newer attempt' }, false),
      context,
      contexts: this.contexts,
    });
    this.db = deps.db;
    this.boss = deps.boss;
    this.queueName = deps.queueName;
    this.ownerId = deps.ownerId;
    this.config = deps.config;
    this.jobs = { schema: deps.config.bossSchema ?? 'pgboss', queue: deps.queueName };
  }

  /** T2 for one fetched job (see `TurnBeginner.beginMany`); its error, if any, is thrown. */
  async begin(job: FetchedJob, workerId: string | null): Promise<StartedTurn> {
    const [settled] = await this.beginner.beginMany([{ job, workerId }]);
    if (!settled!.ok) throw settled!.error;
    return settled!.value;
  }

  /** T2 for a batch of fetched jobs (group begin): see `TurnBeginner.beginMany`. */
  beginMany(requests: readonly BeginRequest[]): Promise<Settlement<StartedTurn>[]> {
    return this.beginner.beginMany(requests);
  }

  /** Keeps pg-boss from failing the jobs of turns this daemon is running (see jobHeartbeatSeconds). */
  async touchJobs(attempts: { id: string; retryCount: number }[]): Promise<void> {
    if (attempts.length > 0) await this.boss.touch(this.queueName, attempts);
  }

  /**
   * The delivery could not be sent (`send_failed`), or its worker was lost before running it or
   * handed it back (`superseded`): end it and write a new delivery of the same event for
   * `nextWorkerId`, same fence otherwise. Fenced: a delivery the watchdog already failed is not
   * redirected.
   */
  async redirect(
    fence: Fence,
    nextWorkerId: string,
    reason: string,
    endState: 'send_failed' | 'superseded' = 'send_failed',
  ): Promise<Fence> {
    return inTransaction(this.db, async (tx) => {
      const { activation, delivery } = await lockFence(tx, this.jobs, fence);
      await deliveries.transitionDelivery(tx, delivery.deliveryId, DELIVERY_LIVE, endState, reason);
      await transcript.finishTurn(tx, delivery.deliveryId, 'failed', { error: { code: endState, message: reason } });
      const [deliveryId] = await turnRows.insertTurnRowsMany(tx, [
        {
          activation,
          eventId: delivery.eventId,
          jobRetryCount: delivery.jobRetryCount,
          workerId: nextWorkerId,
          input: await transcript.turnInput(tx, delivery.deliveryId),
        },
      ]);
      await activations.extendLease(tx, activation.activationUid, this.config.leaseMs);
      return fenceOf({ ...activation, eventId: delivery.eventId, deliveryId: deliveryId! });
    });
  }

  /**
   * One reply in its own transaction: `replyMany` with one member. A fence rejection is thrown as
   * `FenceRejected`. When the job did not settle although the fence held (pg-boss settled it in
   * between), it runs once more: the fence then sees the job and answers `job_not_active`.
   */
  async replyOne(request: ReplyRequest): Promise<Exclude<ReplyOutcome, { outcome: 'rejected' }>> {
    for (let attempt = 1; ; attempt++) {
      try {
        const [outcome] = await this.replyMany([request]);
        if (outcome!.outcome === 'rejected') throw new FenceRejected(outcome!.reason);
        return outcome!;
      } catch (e) {
        if (!(e instanceof BatchNotSettled) || attempt >= 2) throw e;
      }
    }
  }

  /** T5 for many results at once: `replyMany` with results only. */
  async commitMany(requests: readonly CommitRequest[]): Promise<BatchOutcome[]> {
    return (await this.replyMany(requests.map((r) => ({ kind: 'commit' as const, ...r })))) as BatchOutcome[];
  }

  /**
   * Many worker replies in one transaction (group commit), in a constant number of statements:
   * locks every fence row (in delivery-id order), checks each reply with
   * `checkFence`, then applies the ones that passed, one statement per kind in causal order:
   * accepts, progress (leases extended), results (their turns' rows); the results' jobs complete
   * in one pg-boss call with the attempt fence. A reply that fails its
   * fence is left out and changes nothing; a duplicate result writes nothing. When a job of the
   * batch does not settle, the whole transaction rolls back (`BatchNotSettled`) so no turn stands
   * without its job; the caller then applies the members one by one. The worker's `output` is
   * kept on the turn (`corral.turns.output`), not on the pg-boss job.
   */
  async replyMany(requests: readonly ReplyRequest[]): Promise<ReplyOutcome[]> {
    const keepContexts = this.contexts.enabled;
    let written: Map<string, turnRows.CommittedTurn> | undefined;
    const outcomes = await inTransaction(this.db, async (tx) => {
      const rows = await loadFenceRowsMany(
        tx,
        this.jobs,
        requests.map((r) => r.fence.deliveryId),
      );
      const outcomes: ReplyOutcome[] = [];
      const completions: { id: string; retryCount: number }[] = [];
      const commits: turnRows.CommitRowsInput[] = [];
      const accepts: { deliveryId: string; activationUid: string }[] = [];
      const progress: { index: number; activationUid: string }[] = [];
      const committed = new Set<string>();
      const effects: TurnEffects[] = [];
      for (const r of requests) {
        const found = rows.get(r.fence.deliveryId) ?? NO_FENCE_ROWS;
        let reason = checkFence(r.fence, found, r.workerId);
        // effects hook: a result that missed a steer commits; the steer becomes the next event
        let lateSteer = false;
        if (reason === 'stale_revision' && r.kind === 'commit') {
          reason = checkFenceLateSteer(r.fence, found, r.workerId);
          lateSteer = reason === null;
        }
        // The rows were read before this batch's writes: a turn committed earlier in the batch is over.
        if (reason === null && committed.has(r.fence.deliveryId)) reason = 'already_committed';
        if (reason !== null) {
          outcomes.push(reason === 'already_committed' && r.kind === 'commit' ? { outcome: 'duplicate' } : { outcome: 'rejected', reason });
          continue;
        }
        const delivery = found.delivery!;
        if (r.kind === 'accept') {
          accepts.push({ deliveryId: delivery.deliveryId, activationUid: r.fence.activationUid });
          outcomes.push({ outcome: 'accepted' });
        } else if (r.kind === 'progress') {
          progress.push({ index: outcomes.length, activationUid: r.fence.activationUid });
          outcomes.push({ outcome: 'extended', leaseExpiresAt: undefined });
        } else {
          committed.add(r.fence.deliveryId);
          commits.push({
            deliveryId: delivery.deliveryId,
            activationUid: r.fence.activationUid,
            revision: r.fence.revision,
            workerId: r.workerId,
            output: r.output,
            messages: r.messages,
            leaseMs: this.config.leaseMs,
          });
          completions.push({ id: r.fence.eventId, retryCount: delivery.jobRetryCount });
          if (r.emit?.length || lateSteer) {
            effects.push({
              deliveryId: delivery.deliveryId,
              key: r.fence,
              emits: r.emit ?? [],
              ...(lateSteer ? { lateSteerAfter: r.fence.revision } : {}),
            });
          }
          outcomes.push({ outcome: 'committed' });
        }
      }
      // One statement per kind, in causal order (a turn's accept comes before its result).
      await turnRows.acceptDeliveryRowsMany(tx, accepts, this.config.leaseMs);
      const leases = await turnRows.extendLeasesMany(
        tx,
        progress.map((p) => p.activationUid),
        this.config.leaseMs,
      );
      for (const p of progress) outcomes[p.index] = { outcome: 'extended', leaseExpiresAt: leases.get(p.activationUid) };
      // Locked and checked above, so a turn that is not written here means the rows disagree:
      // roll everything back.
      written = await turnRows.commitTurnRowsMany(tx, commits, { lines: keepContexts });
      const missing = commits.filter((c) => !written!.has(c.deliveryId));
      if (missing.length > 0) throw new BatchNotSettled(missing.map((c) => c.deliveryId));
      // effects hook: emitted events enqueued in this transaction (none for most turns)
      if (effects.length > 0)
        await enqueueEffects(tx, this.boss, this.queueName, effects, this.config.maxEventBytes ?? DEFAULT_MAX_EVENT_BYTES);
      if (completions.length > 0) {
        const res = (await this.boss.complete(this.queueName, completions, null, { db: fromDrizzle(tx, sql) })) as {
          affected?: number;
          settled?: string[];
        };
        if (res.affected !== completions.length) {
          const settled = new Set(res.settled ?? []);
          throw new BatchNotSettled(completions.map((c) => c.id).filter((id) => !settled.has(id)));
        }
      }
      return outcomes;
    });
    // committed: the contexts move on (C1 of context-cache.ts: a begin still checks them)
    if (keepContexts && written) {
      requests.forEach((r, i) => {
        const turn = outcomes[i]!.outcome === 'committed' ? written!.get(r.fence.deliveryId) : undefined;
        if (turn && turn.lines !== null) this.contexts.committed(formatActorKey(r.fence), turn.conversationId, turn.firstSeq, turn.lines);
      });
    }
    return outcomes;
  }

  /**
   * T5': the worker reported turn_error. Fenced; the event is retried under a new epoch, or
   * dead-lettered: when its retries are exhausted, or at once when the error is not retryable.
   */
  async fail(fence: Fence, workerId: string, error: { code: string; message: string; retryable?: boolean }): Promise<FailOutcome> {
    return inTransaction(this.db, async (tx) => {
      const { activation, delivery } = await lockFence(tx, this.jobs, fence, workerId);
      const record = { code: error.code, message: error.message };
      await deliveries.transitionDelivery(tx, delivery.deliveryId, DELIVERY_LIVE, 'failed', error.code);
      await transcript.finishTurn(tx, delivery.deliveryId, 'failed', { error: record, workerId });
      if (error.retryable === false) {
        await makeLastAttempt(tx, this.config.bossSchema ?? 'pgboss', this.queueName, fence.eventId, delivery.jobRetryCount);
      }
      return this.failActivationInTx(tx, activation, 'turn_error', record, true, delivery.jobRetryCount);
    });
  }

  /**
   * The watchdog's transaction: fail a live activation whose lease expired while it ran an event.
   * Re-checks expiry under the row lock (a late heartbeat may have extended it meanwhile).
   */
  async expire(activationUid: string): Promise<FailOutcome | undefined> {
    return inTransaction(this.db, async (tx) => {
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
    return inTransaction(this.db, async (tx) => {
      const activation = await activations.lockActivationIf(tx, fence.activationUid, 'live');
      if (!activation || activation.currentEventId !== fence.eventId) return undefined;
      const error = { code: 'turn_timeout', message: `turn ran longer than the maximum of ${maxTurnMs} ms` };
      return this.failActivationInTx(tx, activation, 'turn_timeout', error, true);
    });
  }

  /** Recovery: fail a live activation left by a dead process (its owner is gone), whatever its lease. */
  async failOrphan(activationUid: string, reason: FailureKind): Promise<FailOutcome | undefined> {
    return inTransaction(this.db, async (tx) => {
      const activation = await activations.lockActivationIf(tx, activationUid, 'live');
      if (!activation) return undefined;
      if (activation.currentEventId === null) {
        await activations.endActivation(tx, activationUid, 'stopped', reason);
        return { deadLettered: false, jobFailed: false };
      }
      return this.failActivationInTx(tx, activation, reason, { message: `recovered: ${reason}` }, true);
    });
  }

  /**
   * Recovery: a turn left `started` whose delivery is no longer live (or is gone). The turn is
   * failed; if its job attempt is still active, the attempt is failed so the event is retried
   * under a new epoch. Returns whether the job attempt was failed.
   */
  async repairOrphanTurn(turn: transcript.TurnRow): Promise<FailOutcome | undefined> {
    return inTransaction(this.db, async (tx) => {
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
      const res = (await this.boss.fail(
        this.queueName,
        { id: turn.eventId, retryCount: turn.attempt - 1 },
        { error: { code: 'recovered', message: 'fence rows lost' } },
        { db },
      )) as { affected?: number };
      return { deadLettered: false, jobFailed: res.affected === 1 };
    });
  }

  /**
   * Steers the live turn of `key` in place: bumps the activation's revision (and the delivery's
   * and turn's copies), so only a result carrying the new revision can commit. The daemon holding
   * the worker connection is told through a control notification committed with the change.
   */
  async steer(key: ActorKey, input: unknown): Promise<Fence> {
    const unstorable = unstorableReason(input);
    if (unstorable) throw new CorralError('invalid_argument', `the steering input cannot be stored: ${unstorable}`);
    const bytes = Buffer.byteLength(JSON.stringify(input ?? null));
    if (bytes > MAX_STEERING_BYTES) {
      throw new CorralError('invalid_argument', `the steering input is ${bytes} bytes; the limit is ${MAX_STEERING_BYTES}`);
    }
    return inTransaction(this.db, async (tx) => {
      const { delivery } = await this.lockLiveTurn(tx, key);
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
   * with `cancelled`) and the event's job completes, so the actor moves on.
   */
  async cancel(key: ActorKey, reason: string): Promise<Fence> {
    return inTransaction(this.db, async (tx) => {
      const { activation, delivery } = await this.lockLiveTurn(tx, key);
      await deliveries.transitionDelivery(tx, delivery.deliveryId, DELIVERY_LIVE, 'failed', 'cancelled');
      await transcript.finishTurn(tx, delivery.deliveryId, 'cancelled', { error: { code: 'cancelled', message: reason } });
      await transcript.recordCancelledInput(tx, delivery.deliveryId);
      await activations.endActivation(tx, activation.activationUid, 'failed', 'cancelled');
      for (const id of await deliveries.supersedeDeliveriesOf(tx, activation.activationUid, 'cancelled')) {
        await transcript.finishTurn(tx, id, 'cancelled', { error: { code: 'cancelled', message: reason } });
      }
      await this.boss.complete(
        this.queueName,
        { id: delivery.eventId, retryCount: delivery.jobRetryCount },
        { cancelled: true, reason },
        { db: fromDrizzle(tx, sql) },
      );
      const fence = fenceOf(delivery);
      await notifyControl(tx, { kind: 'cancel', fence, reason });
      return fence;
    });
  }

  private async lockLiveTurn(tx: Tx, key: ActorKey) {
    const live = await activations.lockLiveActivation(tx, key);
    const delivery = live?.currentEventId ? await deliveries.liveDeliveryOfEvent(tx, live.currentEventId) : undefined;
    if (!live || !delivery) throw new CorralError('not_found', `${formatActorKey(key)} has no turn in flight`);
    return { activation: live, delivery };
  }

  /**
   * Ends `activation` as failed, supersedes its live deliveries, fails their started turns and,
   * when it was running an event and `failJob`, fails the job's attempt so pg-boss schedules the
   * retry (5–120 s backoff) or dead-letters it.
   */
  private async failActivationInTx(
    tx: Tx,
    activation: ActivationRow,
    kind: FailureKind,
    error: { code?: string; message: string },
    failJob: boolean,
    knownRetryCount?: number,
  ): Promise<FailOutcome> {
    await activations.endActivation(tx, activation.activationUid, 'failed', kind);
    const superseded = await deliveries.supersedeDeliveriesOf(tx, activation.activationUid, kind);
    const errorRecord = { code: error.code ?? kind, message: error.message };
    for (const id of superseded) await transcript.finishTurn(tx, id, 'failed', { error: errorRecord });
    const eventId = activation.currentEventId;
    if (!failJob || eventId === null) return { deadLettered: false, jobFailed: false };

    const retryCount = knownRetryCount ?? (await deliveries.latestJobRetryCount(tx, activation.activationUid, eventId));
    if (retryCount === undefined) return { deadLettered: false, jobFailed: false };
    const db = fromDrizzle(tx, sql);
    const res = (await this.boss.fail(this.queueName, { id: eventId, retryCount }, { error: errorRecord, kind }, { db })) as {
      affected?: number;
    };
    if (res.affected !== 1) return { deadLettered: false, jobFailed: false };
    const job = await this.boss.getJobById(this.queueName, eventId, { db });
    const deadLettered = job?.state === 'failed';
    if (deadLettered) {
      const key = { agentUid: activation.agentUid, sessionId: activation.sessionId };
      if (this.config.deadLetterMode === 'continue') {
        // The dead-letter copy keeps the event; the failed original would hold the actor's queue.
        await this.boss.deleteJob(this.queueName, eventId, { db });
      } else {
        await setBlockedBy(tx, key, eventId);
      }
    }
    return { deadLettered, jobFailed: true };
  }
}
