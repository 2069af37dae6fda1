/**
 * The begin step, T2 (docs/failure-semantics.md): each fetched job's actor gets an activation
 * (its warm one, else a new one under a higher epoch), and the job a delivery carrying the fence
 * and a `started` turn. Batched: the actors of a batch with a warm activation in one statement,
 * those with none live in another, the rest (a stale live activation to supersede) in one
 * transaction. A turn whose delivery could not be sent, or whose worker was lost before it ran,
 * is dispatched again under the same fence with a new delivery (`redirect`).
 */
import { formatActorKey, type ActorKey } from '../base/actor-key.ts';
import type { Db, DbOrTx } from '../db/client.ts';
import { inTransaction } from '../db/tx.ts';
import * as activations from '../db/turns/activations.ts';
import type { ActivationRow } from '../db/turns/activations.ts';
import type { ContextLimits } from '../db/turns/history.ts';
import * as turnRows from '../db/turns/turn-rows.ts';
import * as deliveries from '../db/turns/deliveries.ts';
import * as transcript from '../db/turns/transcript.ts';
import { fenceOf, lockFence, type Fence, type JobTable } from '../db/turns/fence.ts';
import { DELIVERY_LIVE } from '../db/schema.ts';
import { CorralError, isConnectionError } from '../base/errors.ts';
import { storedTraceCarrier, type TraceCarrier } from '../base/trace-context.ts';
import type { ConsumedJob } from '../queue/consumer.ts';
import type { BatchMember } from '../db/turns/batches.ts';
import type { AttemptFailures } from './attempt-failure.ts';
import { contextJson, knownOf, type CachedContext, type ContextCache } from './context-cache.ts';
import type { Settlement } from './group-writer.ts';

/** A job fetched from the actor queue. */
export type FetchedJob = ConsumedJob;

/** A turn begun: its fence, and what its turn_start carries. */
export interface StartedTurn {
  fence: Fence;
  payload: unknown;
  enqueuedAt: string;
  /**
   * The context turn_start's `trace` carries: the attempt's `invoke_agent` span when the daemon
   * traces, else the sender's (E9 of src/db/enqueue/send-event.ts).
   */
  trace?: TraceCarrier | undefined;
  attempt: number;
  leaseExpiresAt: Date;
  workerId: string | null;
  /** The conversation so far as the JSON text of turn_start's `context` (src/runtime/context-cache.ts `contextJson`). */
  contextJson?: string | undefined;
  /** The events after this one the turn takes, in order (src/db/turns/batches.ts); absent for one event. */
  batch?: BatchMember[] | undefined;
  /** Its actor had another event queued behind it when its job was claimed (its next turn may begin in this one's commit). */
  more?: boolean | undefined;
}

/** A fetched job to begin, and the worker whose slot it holds (null: it waits for one). */
export interface BeginRequest {
  job: FetchedJob;
  workerId: string | null;
  /** The attempt's trace context (its span, when the daemon traces); default: the event's own. */
  trace?: TraceCarrier | undefined;
}

/** The context the attempt continues: its own span's, else the event's. */
const traceOf = (r: BeginRequest): TraceCarrier | undefined => r.trace ?? (r.job.data.trace && storedTraceCarrier(r.job.data.trace));

const keyOf = (job: FetchedJob): ActorKey => ({ agentUid: job.data.agentUid, sessionId: job.data.sessionId });

export interface TurnBeginnerDeps {
  db: Db;
  ownerId: string;
  leaseMs: number;
  /** Where the events' jobs are (a redirect checks the fence, the job's attempt included). */
  jobs: JobTable;
  /** Fails a live activation still holding an older attempt of an actor being begun (rare). */
  failures: Pick<AttemptFailures, 'supersede'>;
  /** turn_start's context limits; undefined: turns get no context. */
  context: ContextLimits | undefined;
  /** The contexts this daemon knows (the database checks them, and reads only the others). */
  contexts: ContextCache;
}

export class TurnBeginner {
  private readonly deps: TurnBeginnerDeps;

  constructor(deps: TurnBeginnerDeps) {
    this.deps = deps;
  }

  /** T2 for one fetched job; its error, if any, is thrown. */
  async begin(request: BeginRequest): Promise<StartedTurn> {
    const [settled] = await this.beginMany([request]);
    if (!settled!.ok) throw settled!.error;
    return settled!.value;
  }

  /**
   * The delivery could not be sent (`send_failed`), or its worker was lost before running it or
   * handed it back (`superseded`): end it and write a new delivery of the same event for
   * `nextWorkerId` (null: none yet, the turn waits for one), same fence otherwise. Fenced: a
   * delivery the watchdog already failed is not redirected.
   */
  async redirect(
    fence: Fence,
    nextWorkerId: string | null,
    reason: string,
    endState: 'send_failed' | 'superseded' = 'send_failed',
  ): Promise<Fence> {
    return inTransaction(this.deps.db, async (tx) => {
      const { activation, delivery } = await lockFence(tx, this.deps.jobs, fence);
      await deliveries.transitionDelivery(tx, delivery.deliveryId, DELIVERY_LIVE, endState, reason);
      await transcript.finishTurn(tx, delivery.deliveryId, 'failed', { error: { code: endState, message: reason } });
      const { input, coalesced, traceparent } = await transcript.turnInput(tx, delivery.deliveryId);
      const [deliveryId] = await turnRows.insertTurnRowsMany(tx, [
        {
          activation,
          eventId: delivery.eventId,
          jobRetryCount: delivery.jobRetryCount,
          workerId: nextWorkerId,
          input,
          coalesced,
          traceparent,
        },
      ]);
      await activations.extendLease(tx, activation.activationUid, this.deps.leaseMs);
      return fenceOf({ ...activation, eventId: delivery.eventId, deliveryId: deliveryId! });
    });
  }

  /**
   * T2 for a batch of fetched jobs (group begin), at most one per actor (pg-boss's key_strict_fifo
   * fetch gives no actor two jobs at once, and an actor's controller begins one at a time). Takes
   * each actor's activation (a warm one, else a new one under a higher epoch) and writes the
   * delivery and the `started` turn carrying the fence; with context limits, each turn also gets
   * its conversation's context for turn_start.
   *
   * The common cases take ONE statement each, its own transaction (`beginTurnsMany`): first the
   * actors with a warm activation, then those with none live (new actors, or ones whose
   * activation was stopped). The rest (an actor whose live activation still holds an older
   * attempt: rare; or all of them, when the second statement failed) go through one transaction:
   * their live activations locked and superseded (per actor), then the same statement for actors
   * with none live. Once a statement committed, a failure of the rest settles only the members it
   * concerns (one by one, unless the connection was lost).
   */
  async beginMany(requests: readonly BeginRequest[]): Promise<Settlement<StartedTurn>[]> {
    if (new Set(requests.map((r) => formatActorKey(keyOf(r.job)))).size !== requests.length) {
      throw new CorralError('internal', 'a begin batch holds two jobs of one actor');
    }
    const out: (Settlement<StartedTurn> | undefined)[] = requests.map(() => undefined);
    const pending = () => requests.flatMap((r, i) => (out[i] ? [] : [{ r, i }]));
    const beginBy = async (kind: 'warm' | 'new', members: { r: BeginRequest; i: number }[]): Promise<void> => {
      const started = await this.beginStatement(
        this.deps.db,
        kind,
        members.map((m) => m.r),
      );
      members.forEach((m, k) => {
        const value = started[k];
        if (value) out[m.i] = { ok: true, value };
      });
    };
    await beginBy('warm', pending());
    if (pending().length > 0) {
      try {
        await beginBy('new', pending());
      } catch (e) {
        if (isConnectionError(e)) {
          for (const m of pending()) out[m.i] = { ok: false, error: e };
          return out as Settlement<StartedTurn>[];
        }
        // nothing was written: the transaction below sorts out what broke the statement
      }
    }
    const rest = pending();
    if (rest.length === 0) return out as Settlement<StartedTurn>[];
    const settleRest = async (members: typeof rest): Promise<void> => {
      const started = await this.beginSupersedingMany(members.map((m) => m.r));
      members.forEach((m, k) => (out[m.i] = { ok: true, value: started[k]! }));
    };
    try {
      await settleRest(rest);
    } catch (e) {
      if (isConnectionError(e) || rest.length === 1) {
        for (const m of rest) out[m.i] = { ok: false, error: e };
      } else {
        // one poison job must not hold the others back
        for (const m of rest) {
          try {
            await settleRest([m]);
          } catch (err) {
            out[m.i] = { ok: false, error: err };
          }
        }
      }
    }
    return out as Settlement<StartedTurn>[];
  }

  /**
   * One begin statement (`beginTurnsMany`) for `requests`: the turn begun for each, in order, or
   * undefined for an actor the statement left alone.
   */
  private async beginStatement(
    db: DbOrTx,
    kind: 'warm' | 'new',
    requests: readonly BeginRequest[],
    knownNow?: readonly (CachedContext | undefined)[],
  ): Promise<(StartedTurn | undefined)[]> {
    const { context, contexts } = this.deps;
    // what the cache holds now: the entries are immutable, so these are what the database checks
    const known = requests.map((r, i) => (context ? (knownNow ? knownNow[i] : contexts.known(formatActorKey(keyOf(r.job)))) : undefined));
    const traces = requests.map(traceOf);
    const begun = await turnRows.beginTurnsMany(
      db,
      requests.map((r, i) => ({
        key: keyOf(r.job),
        eventId: r.job.id,
        jobRetryCount: r.job.retryCount,
        workerId: r.workerId,
        input: r.job.data.payload,
        coalesced: r.job.batch,
        known: knownOf(known[i]),
        traceparent: traces[i]?.traceparent,
      })),
      { kind, leaseMs: this.deps.leaseMs, ownerId: this.deps.ownerId, context },
    );
    return requests.map((r, i) => {
      const key = formatActorKey(keyOf(r.job));
      const b = begun.get(key);
      if (!b) return undefined;
      const conv = b.conversation;
      const json =
        conv && contextJson(contexts.resolve(key, known[i], { conversationId: conv.id, nextSeq: conv.nextSeq, lines: conv.lines }));
      return this.startedTurn(r, traces[i], b.activation, b.deliveryId, json);
    });
  }

  /**
   * T2 in the transaction of a commit (src/runtime/turn-commit.ts): the next turns of actors whose
   * current turns it commits, on their activations made warm by that commit, each checked against
   * the context the cache holds once the commit is done (`known`, C1 of context-cache.ts). The
   * turn begun for each, in order; undefined for an actor the statement left alone.
   */
  async beginInCommit(
    tx: DbOrTx,
    requests: readonly BeginRequest[],
    known: readonly (CachedContext | undefined)[],
  ): Promise<(StartedTurn | undefined)[]> {
    if (requests.length === 0) return [];
    return this.beginStatement(tx, 'warm', requests, known);
  }

  /**
   * The rest of `beginMany`, in one transaction: any live activation of the actors is superseded
   * (it still holds an older attempt), then they are begun as actors with none live.
   */
  private async beginSupersedingMany(requests: readonly BeginRequest[]): Promise<StartedTurn[]> {
    return inTransaction(this.deps.db, async (tx) => {
      for (const stale of await activations.lockLiveActivationsMany(
        tx,
        requests.map((r) => keyOf(r.job)),
      )) {
        await this.deps.failures.supersede(tx, stale);
      }
      const started = await this.beginStatement(tx, 'new', requests);
      const missing = requests.filter((_, i) => started[i] === undefined);
      if (missing.length > 0) {
        throw new CorralError(
          'internal',
          `no activation could be taken for ${missing.map((r) => formatActorKey(keyOf(r.job))).join(', ')}`,
        );
      }
      return started as StartedTurn[];
    });
  }

  private startedTurn(
    request: BeginRequest,
    trace: TraceCarrier | undefined,
    activation: ActivationRow,
    deliveryId: string,
    contextJson: string | undefined,
  ): StartedTurn {
    const { job, workerId } = request;
    return {
      fence: fenceOf({ ...activation, eventId: job.id, deliveryId }),
      payload: job.data.payload,
      enqueuedAt: job.data.enqueuedAt,
      ...(trace ? { trace } : {}),
      attempt: job.retryCount + 1,
      leaseExpiresAt: activation.leaseExpiresAt,
      workerId,
      ...(contextJson === undefined ? {} : { contextJson }),
      ...(job.batch ? { batch: job.batch } : {}),
      ...(job.more ? { more: true } : {}),
    };
  }
}
