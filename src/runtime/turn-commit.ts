/**
 * The commit step (T5, T5'): worker replies settle their turns. Results, accepts and progress go
 * through group transactions (`replyMany`: many replies in a constant number of statements); a
 * `turn_error` fails its attempt (`fail`). Every reply passes the fence (src/db/turns/fence.ts) in the
 * transaction that then writes, and pg-boss settles the job in that same transaction with its
 * attempt fence `{ id, retryCount }`.
 *
 * Invariants (see docs/failure-semantics.md):
 *  I3 transcript rows are written only here, under a fence that held, in the transaction that
 *     completes the job (and by a cancel, src/ops/turn-control.ts, which completes it too).
 *  C1 the contexts kept between turns move on only after the commit (a begin still checks them
 *     against the database: src/runtime/context-cache.ts).
 */
import type { TraceCarrier } from '../base/trace-context.ts';
import { fromDrizzle, type PgBoss } from 'pg-boss';
import { formatActorKey } from '../base/actor-key.ts';
import type { Db } from '../db/client.ts';
import { inTransaction } from '../db/tx.ts';
import {
  checkFence,
  checkFenceLateSteer,
  loadFenceRowsMany,
  lockFence,
  NO_FENCE_ROWS,
  type Fence,
  type JobTable,
} from '../db/turns/fence.ts';
import * as deliveries from '../db/turns/deliveries.ts';
import * as transcript from '../db/turns/transcript.ts';
import * as turnRows from '../db/turns/turn-rows.ts';
import { makeLastAttempt } from '../db/boss/jobs.ts';
import { sql } from '../db/orm.ts';
import { DELIVERY_LIVE } from '../db/schema.ts';
import { FenceRejected, type FenceReason } from '../base/errors.ts';
import { enqueueEffects, type EmitRequest, type ShardPlace, type TurnEffects } from '../effects/emit.ts';
import { insertOutboxMany, type NewOutboxMessage } from '../db/outbox/messages.ts';
import { outboxRowsOf, type DeliverRequest } from '../effects/deliver.ts';
import type { AttemptFailures, FailOutcome } from './attempt-failure.ts';
import type { CachedContext, ContextCache } from './context-cache.ts';
import type { BeginRequest, StartedTurn, TurnBeginner } from './turn-begin.ts';
import type { ActorEventJobData } from '../queue/event-job.ts';
import { claimKeyHeads } from '../db/boss/fetch.ts';
import { crashPoint } from '../base/crash-points.ts';

export interface ReplyMessage {
  role: 'assistant' | 'tool';
  content: unknown;
}

/** `next`: the actor's next turn, claimed and begun in the same transaction (its continuation). */
export type CommitOutcome = { outcome: 'committed'; next?: StartedTurn } | { outcome: 'duplicate' };

/** One worker result in a group commit. */
export interface CommitRequest {
  fence: Fence;
  workerId: string;
  messages: ReplyMessage[];
  output?: unknown;
  /** Durable effects, checked already (src/effects/emit.ts): enqueued with the commit. */
  emit?: EmitRequest[];
  /** Outbound messages, checked already (src/effects/deliver.ts): written with the commit (O1). */
  deliver?: DeliverRequest[];
  /** The trace context the turn continues: its emits and outbound messages carry it on. */
  trace?: TraceCarrier;
  /**
   * The worker whose slot is kept for the actor's next turn: the commit claims the actor's next
   * event and begins its turn for that worker in the same transaction (N1, `beginNextTurns`).
   */
  continuation?: { workerId: string };
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

export interface TurnCommitDeps {
  db: Db;
  boss: PgBoss;
  /** Where the events' jobs are. */
  jobs: JobTable;
  leaseMs: number;
  /** Largest emitted event payload (CORRAL_MAX_EVENT_BYTES). */
  maxEventBytes: number;
  /** The contexts this daemon keeps between turns: a commit appends to them. */
  contexts: ContextCache;
  /** A `turn_error` fails its attempt through the attempt-failure step. */
  failures: AttemptFailures;
  /** Begins the next turns of busy actors in their commits (`CommitRequest.continuation`); absent: never. */
  continuations?: { begin: Pick<TurnBeginner, 'beginInCommit'>; batchBytes: number };
  /** The shard this runtime serves, of how many: emits to other shards' actors go to its outbox (E4 of src/effects/emit.ts). */
  place?: ShardPlace;
  /** Called after a commit that emitted to another shard (the relay delivers it). */
  emittedElsewhere?: () => void;
}

/** A commit's next turns could not all be begun: it runs again without them (N3). */
class NextTurnsNotBegun extends Error {
  constructor(keys: string[]) {
    super(`next turns claimed but not begun: ${keys.join(', ')}`);
    this.name = 'NextTurnsNotBegun';
  }
}

export class TurnCommits {
  private readonly deps: TurnCommitDeps;

  constructor(deps: TurnCommitDeps) {
    this.deps = deps;
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
    if (!requests.some((r) => r.kind === 'commit' && r.continuation)) return this.replyGroup(requests, false);
    try {
      return await this.replyGroup(requests, true);
    } catch (e) {
      // N3: rolled back; the replies are written without the next turns (the queue brings them)
      if (!(e instanceof NextTurnsNotBegun)) throw e;
      return this.replyGroup(requests, false);
    }
  }

  private async replyGroup(requests: readonly ReplyRequest[], continuing: boolean): Promise<ReplyOutcome[]> {
    const keepContexts = this.deps.contexts.enabled;
    let written: Map<string, turnRows.CommittedTurn> | undefined;
    let emitted = false;
    const outcomes = await inTransaction(this.deps.db, async (tx) => {
      const rows = await loadFenceRowsMany(
        tx,
        this.deps.jobs,
        requests.map((r) => r.fence.deliveryId),
      );
      const outcomes: ReplyOutcome[] = [];
      const completions: { id: string; retryCount: number }[] = [];
      // the other events of batches (B2 of src/db/turns/batches.ts): queued, completed with their head
      const members: string[] = [];
      const commits: turnRows.CommitRowsInput[] = [];
      const accepts: { deliveryId: string; activationUid: string }[] = [];
      const progress: { index: number; activationUid: string }[] = [];
      const committed = new Set<string>();
      const effects: TurnEffects[] = [];
      const outbound: NewOutboxMessage[] = [];
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
            leaseMs: this.deps.leaseMs,
          });
          completions.push({ id: r.fence.eventId, retryCount: delivery.jobRetryCount });
          if (delivery.coalesced) members.push(...delivery.coalesced);
          if (r.emit?.length || lateSteer) {
            effects.push({
              deliveryId: delivery.deliveryId,
              key: r.fence,
              emits: r.emit ?? [],
              ...(lateSteer ? { lateSteerAfter: r.fence.revision } : {}),
              ...(r.trace ? { trace: r.trace } : {}),
            });
          }
          if (r.deliver?.length) outbound.push(...outboxRowsOf(r.fence, r.deliver, r.trace));
          outcomes.push({ outcome: 'committed' });
        }
      }
      // One statement per kind, in causal order (a turn's accept comes before its result).
      await turnRows.acceptDeliveryRowsMany(tx, accepts, this.deps.leaseMs);
      const leases = await turnRows.extendLeasesMany(
        tx,
        progress.map((p) => p.activationUid),
        this.deps.leaseMs,
      );
      for (const p of progress) outcomes[p.index] = { outcome: 'extended', leaseExpiresAt: leases.get(p.activationUid) };
      // Locked and checked above, so a turn that is not written here means the rows disagree:
      // roll everything back.
      written = await turnRows.commitTurnRowsMany(tx, commits, { lines: keepContexts });
      const missing = commits.filter((c) => !written!.has(c.deliveryId));
      if (missing.length > 0) throw new BatchNotSettled(missing.map((c) => c.deliveryId));
      // effects hook: emitted events enqueued in this transaction (none for most turns)
      if (effects.length > 0) {
        await enqueueEffects(tx, this.deps.boss, this.deps.jobs.queue, effects, this.deps.maxEventBytes, this.deps.place);
        emitted = (this.deps.place?.shardCount ?? 1) > 1;
      }
      // outbox hook: the messages of the turns committed here, fenced with them (none for most turns)
      if (outbound.length > 0) await insertOutboxMany(tx, outbound);
      if (completions.length > 0) {
        const res = (await this.deps.boss.complete(this.deps.jobs.queue, completions, null, { db: fromDrizzle(tx, sql) })) as {
          affected?: number;
          settled?: string[];
        };
        if (res.affected !== completions.length) {
          const settled = new Set(res.settled ?? []);
          throw new BatchNotSettled(completions.map((c) => c.id).filter((id) => !settled.has(id)));
        }
      }
      if (members.length > 0) {
        // a member an operator settled meanwhile (a cancel) stays as it is; the others complete here
        await this.deps.boss.complete(this.deps.jobs.queue, members, null, { db: fromDrizzle(tx, sql), includeQueued: true });
      }
      // continuation hook: the next turns of busy actors, once their current jobs are complete
      if (continuing) {
        const wanted = requests.flatMap((r, i) =>
          r.kind === 'commit' && r.continuation && outcomes[i]!.outcome === 'committed'
            ? [{ i, request: r, workerId: r.continuation.workerId }]
            : [],
        );
        const next = await this.beginNextTurns(tx, wanted, written!);
        for (const [i, started] of next) outcomes[i] = { outcome: 'committed', next: started };
      }
      return outcomes;
    });
    if (emitted) this.deps.emittedElsewhere?.();
    if (continuing && outcomes.some((o) => o.outcome === 'committed' && o.next)) crashPoint('continued-commit');
    // committed: the contexts move on (C1 of context-cache.ts: a begin still checks them)
    if (keepContexts && written) {
      requests.forEach((r, i) => {
        const turn = outcomes[i]!.outcome === 'committed' ? written!.get(r.fence.deliveryId) : undefined;
        if (turn && turn.lines !== null)
          this.deps.contexts.committed(formatActorKey(r.fence), turn.conversationId, turn.firstSeq, turn.lines);
      });
    }
    return outcomes;
  }

  /**
   * The continuation of busy actors (N1–N3, docs/failure-semantics.md), in the commit's transaction
   * after their jobs completed:
   *  N1 each actor whose commit keeps a worker's slot gets its next event claimed (pg-boss's
   *     key_strict_fifo claim of that key's head, `claimKeyHeads`) and its turn begun on its
   *     activation, now warm, for that worker: the queue's fetch and the begin's transaction are
   *     saved, and the turn goes out as soon as the commit is durable. An actor with nothing due is
   *     left out, its slot freed.
   *  N2 its context is checked against what the cache holds once this commit is done (C1 of
   *     context-cache.ts): a conversation that moved on is read by the database, as at any begin.
   *  N3 a claimed event whose turn could not be begun rolls the whole transaction back
   *     (`NextTurnsNotBegun`), which then runs again without next turns: a claim never stands
   *     without its turn, and a next turn never costs the commit.
   *  N4 only while the queue has no backlog of other actors (the consumer's last fetch took less
   *     than it asked for, src/runtime/dispatcher.ts `continuing`): a slot freed while other actors
   *     wait goes to the queue, so a busy actor does not keep a slot from them, and the begins of
   *     a loaded daemon stay in their own transactions beside the commits.
   * Keyed by the request's index.
   */
  private async beginNextTurns(
    tx: Parameters<Parameters<typeof inTransaction>[1]>[0],
    wanted: readonly { i: number; request: CommitRequest; workerId: string }[],
    written: ReadonlyMap<string, turnRows.CommittedTurn>,
  ): Promise<Map<number, StartedTurn>> {
    const out = new Map<number, StartedTurn>();
    const continuations = this.deps.continuations;
    if (!continuations || wanted.length === 0) return out;
    const byKey = new Map(wanted.map((w) => [formatActorKey(w.request.fence), w]));
    const claimed = await claimKeyHeads<ActorEventJobData>(tx, this.deps.jobs.queue, [...byKey.keys()], continuations.batchBytes);
    if (claimed.length === 0) return out;
    const begins: { i: number; request: BeginRequest; known: CachedContext | undefined }[] = [];
    for (const job of claimed) {
      const key = formatActorKey(job.data);
      const w = byKey.get(key);
      if (!w) throw new NextTurnsNotBegun([key]);
      begins.push({ i: w.i, request: { job, workerId: w.workerId }, known: this.knownAfter(key, written.get(w.request.fence.deliveryId)) });
    }
    const started = await continuations.begin.beginInCommit(
      tx,
      begins.map((b) => b.request),
      begins.map((b) => b.known),
    );
    const missing = begins.filter((_, k) => started[k] === undefined);
    if (missing.length > 0) throw new NextTurnsNotBegun(missing.map((b) => formatActorKey(b.request.job.data)));
    begins.forEach((b, k) => out.set(b.i, started[k]!));
    return out;
  }

  /** N2: the context of `key` as the cache holds it once `turn` is committed. */
  private knownAfter(key: string, turn: turnRows.CommittedTurn | undefined): CachedContext | undefined {
    const contexts = this.deps.contexts;
    if (!turn || turn.lines === null) return undefined;
    const after = contexts.afterCommit(key, turn.conversationId, turn.firstSeq, turn.lines);
    return after === 'unchanged' ? contexts.known(key) : after;
  }

  /**
   * T5': the worker reported turn_error, or its result was refused or could not be committed.
   * Fenced (with `lateSteer`, a result's fence that only missed later steers holds, as for a
   * commit); the event is retried under a new epoch, or dead-lettered: when its retries are
   * exhausted, or at once when the error is not retryable.
   */
  async fail(
    fence: Fence,
    workerId: string,
    error: { code: string; message: string; retryable?: boolean },
    opts: { lateSteer?: boolean } = {},
  ): Promise<FailOutcome> {
    return inTransaction(this.deps.db, async (tx) => {
      const { activation, delivery } = await lockFence(tx, this.deps.jobs, fence, workerId, opts);
      const record = { code: error.code, message: error.message };
      await deliveries.transitionDelivery(tx, delivery.deliveryId, DELIVERY_LIVE, 'failed', error.code);
      await transcript.finishTurn(tx, delivery.deliveryId, 'failed', { error: record, workerId });
      if (error.retryable === false) {
        await makeLastAttempt(tx, this.deps.jobs.schema, this.deps.jobs.queue, fence.eventId, delivery.jobRetryCount);
      }
      return this.deps.failures.failActivationInTx(tx, activation, 'turn_error', record, true, delivery.jobRetryCount);
    });
  }
}
