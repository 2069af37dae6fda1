/**
 * The dispatcher: takes fetched jobs to workers. It reserves a worker slot per job, begins the
 * jobs' turns in groups (one transaction for the turns begun meanwhile), hands each turn to its
 * actor's SessionController (which owns it until the attempt settles), sends `turn_start`,
 * parks turns while no worker is free, and redirects a turn whose worker cannot be reached or
 * handed it back.
 *
 * Invariants:
 *  1. A turn holds at most one worker slot, from dispatch until the attempt settles here, or until
 *     its worker's result has passed every check that needs no database (`workerFinished`: the
 *     worker runs it no longer), whichever comes first. A turn released that way is *finishing*:
 *     the reply pipeline settles it without the worker (committed, or its attempt failed) and
 *     answers the result. At most `capacity` turns of a worker are finishing at once; a further
 *     result keeps its slot until its turn settles. So a worker never has more than `capacity`
 *     turns running and `capacity` finishing: its live deliveries never exceed twice its
 *     capacity, and no result frees a slot for a turn that then stays live.
 *  2. Per actor, its operations run one at a time on its SessionController.
 *  3. A redirect is fenced: a delivery the watchdog already failed is not redirected.
 *  4. It never touches the socket: it sends through `Transport`, the broker's send queue.
 */
import { formatActorKey, type ActorKey } from '../base/actor-key.ts';
import type { TimerHandle } from '../base/clock.ts';
import type { ControlMessage } from '../db/turns/control.ts';
import { FenceRejected, toError } from '../base/errors.ts';
import { storedTraceCarrier, traceLogFields } from '../base/trace-context.ts';
import type { AttemptEnd, AttemptTrace } from '../base/turn-tracer.ts';
import { withRawField, type DaemonMessage } from '../fabric/protocol.ts';
import type { Logger } from '../base/logger.ts';
import type { RuntimeParts } from './transport.ts';
import { dispatchTo, firstDispatch, workerOf, type InFlightTurn, type SessionController } from './directory.ts';
import { attemptFields, fenceFields, toWire, type AttemptRef, type Fence } from './fence.ts';
import { GroupWriter } from './group-writer.ts';
import type { FailOutcome } from './attempt-failure.ts';
import type { BeginRequest, FetchedJob, StartedTurn } from './turn-begin.ts';

/** A turn is never offered to more than this many routes that turn out dead in one dispatch. */
const MAX_DEAD_ROUTES_PER_DISPATCH = 3;
/** After a dispatch gave up on dead routes, the parked turn is tried again this soon. */
const PARKED_RETRY_MS = 100;

export interface DispatcherOptions extends RuntimeParts {
  /** Called whenever capacity may have freed up (the consumer fetches again). */
  onCapacity?: () => void;
  /**
   * A busy actor's next turn begins in its current turn's commit (N1 of src/runtime/turn-commit.ts):
   * the finishing turn's slot is kept for it. Default true; never while the daemon traces (the
   * attempt's span starts before its begin) or stops.
   */
  continueTurns?: boolean;
  /** Other actors' events may be waiting for a slot: a freed slot goes to the queue (N4 of turn-commit.ts). */
  queueBacklogged?: () => boolean;
}

/** The slot kept for the next turn of the actor whose turn `eventId` finishes. */
const nextSlotOf = (eventId: string) => `next:${eventId}`;

export class Dispatcher {
  private readonly opts: DispatcherOptions;
  private readonly log: Logger;
  /** The controllers holding a turn in flight here, by event id. */
  private readonly holders = new Map<string, SessionController>();
  /** Turns begun while no worker was free; dispatched when one frees up or registers. */
  private readonly parked: string[] = [];
  /**
   * Turns whose worker sent a final message (invariant 1), by event id: the delivery it named and,
   * for a finishing turn, the worker whose result freed the slot (null: the slot was kept).
   */
  private readonly finals = new Map<string, { deliveryId: string; freedBy: string | null }>();
  /** How many finishing turns each worker has. */
  private readonly finishingPerWorker = new Map<string, number>();
  private parkedRetry: TimerHandle | null = null;
  private stopping = false;
  /** Fetched jobs begin in groups: one transaction for the turns begun meanwhile. */
  private readonly begins: GroupWriter<BeginRequest, StartedTurn>;

  constructor(opts: DispatcherOptions) {
    this.opts = opts;
    this.log = opts.logger.child({ component: 'dispatcher' });
    this.begins = new GroupWriter({
      many: (requests) => opts.begin.beginMany(requests),
      one: (r) => opts.begin.begin(r),
      onBatch: (size, fellBack) => this.log.debug({ size, fellBack }, fellBack ? 'begin batch failed; begun one by one' : 'begin batch'),
    });
  }

  /** Free worker slots minus turns waiting for a worker (`parkedElsewhere`: of runtimes sharing the workers): how many jobs the consumer may fetch. */
  fetchCapacity(parkedElsewhere = 0): number {
    return Math.max(0, this.opts.workers.freeSlots() - this.parked.length - parkedElsewhere);
  }
  parkedCount = (): number => this.parked.length;
  inFlightCount = (): number => this.holders.size;

  /** The turn in flight here for `eventId`, if any. */
  turnOf(eventId: string): InFlightTurn | undefined {
    const turn = this.holders.get(eventId)?.turn;
    return turn?.fence.eventId === eventId ? turn : undefined;
  }

  /** The pg-boss attempts of the turns this process is running (the job keeper touches them). */
  inFlightAttempts(): { id: string; retryCount: number }[] {
    const out: { id: string; retryCount: number }[] = [];
    for (const [eventId, c] of this.holders) if (c.turn) out.push({ id: eventId, retryCount: c.turn.started.attempt - 1 });
    return out;
  }

  /** Dispatches fetched jobs; each begins on its actor's controller. Never throws. */
  dispatchJobs(jobs: FetchedJob[]): void {
    for (const job of jobs) {
      const key: ActorKey = { agentUid: job.data.agentUid, sessionId: job.data.sessionId };
      const controller = this.opts.directory.wake(key);
      // Reserve the slot now, not when the controller gets to it, so the next fetch sees it taken.
      const workerId = this.opts.workers.acquire(job.id, key.agentUid) ?? null;
      this.opts.background.track(
        controller.run(() => this.startTurn(controller, job, workerId)),
        {
          actor: controller.name,
          eventId: job.id,
        },
      );
    }
  }

  /**
   * The commit of the actor's turn `previousEventId` ran with the slot `workerFinished` kept for
   * its next turn: that turn, begun in the commit, takes the slot and goes out now; with none
   * begun (nothing was due, or the commit did not happen) the slot is freed. Call on the actor's
   * controller, after the previous turn settled.
   */
  async continued(controller: SessionController, previousEventId: string, next: StartedTurn | undefined): Promise<void> {
    if (!next) {
      this.opts.workers.release(nextSlotOf(previousEventId));
      this.dispatchParked();
      this.opts.onCapacity?.();
      return;
    }
    this.opts.metrics.continued?.();
    // the worker the delivery names; undefined if it went away meanwhile (the turn waits for another)
    const workerId = this.opts.workers.rekey(nextSlotOf(previousEventId), next.fence.eventId);
    await this.held(controller, next, workerId ?? null);
    if (workerId === undefined) this.dispatchParked();
  }

  private async startTurn(controller: SessionController, job: FetchedJob, workerId: string | null): Promise<void> {
    const trace = this.opts.tracer ? this.attemptTrace(job) : undefined;
    let started: StartedTurn;
    try {
      const request = { job, workerId, ...(trace ? { trace: trace.carrier } : {}) };
      started = await this.opts.retry(() => this.begins.submit(request), { actor: controller.name, eventId: job.id });
    } catch (e) {
      if (workerId) this.opts.workers.release(job.id);
      trace?.end({ outcome: 'not_begun', why: toError(e).message });
      throw e;
    }
    trace?.begun(started.fence, workerId);
    await this.held(controller, started, workerId, trace);
  }

  /** A begun turn is the controller's, and goes to its worker (or waits for one). */
  private async held(controller: SessionController, started: StartedTurn, workerId: string | null, trace?: AttemptTrace): Promise<void> {
    const eventId = started.fence.eventId;
    controller.hold({
      fence: started.fence,
      dispatch: firstDispatch(workerId),
      started,
      startedAtMs: this.opts.clock.nowMs(),
      ...(trace ? { trace } : {}),
    });
    this.holders.set(eventId, controller);
    this.log.info({ ...fenceFields(started.fence), workerId, attempt: started.attempt, ...traceLogFields(started.trace) }, 'turn started');
    if (workerId === null) {
      this.parked.push(eventId);
      return;
    }
    await this.send(eventId);
  }

  /** The attempt's span, started before its begin: the begin stores its context with the turn. */
  private attemptTrace(job: FetchedJob): AttemptTrace | undefined {
    const enqueuedAtMs = Date.parse(job.data.enqueuedAt);
    return this.opts.tracer?.attempt({
      key: { agentUid: job.data.agentUid, sessionId: job.data.sessionId },
      eventId: job.id,
      attempt: job.retryCount + 1,
      parent: job.data.trace && storedTraceCarrier(job.data.trace),
      enqueuedAtMs: Number.isFinite(enqueuedAtMs) ? enqueuedAtMs : undefined,
      batchSize: 1 + (job.batch?.length ?? 0),
    });
  }

  /** Sends the turn of `eventId` to its worker, redirecting to another worker if the send fails. */
  private async send(eventId: string): Promise<void> {
    const tried = new Set<string>();
    for (;;) {
      const f = this.turnOf(eventId);
      const workerId = f && workerOf(f);
      if (!f || !workerId) return;
      const registration = this.opts.workers.registrationOf(workerId);
      const res = await this.opts.transport.send(workerId, turnStart(f));
      if (res.ok) {
        this.opts.metrics.dispatched();
        f.trace?.sent(workerId);
        const first = f.firstSentAtMs === undefined;
        // an accept that came back before this await ended has moved it past `sent` already
        if (workerOf(f) === workerId) dispatchTo(f, { to: 'sent' }, this.opts.clock.nowMs());
        const enqueuedMs = Date.parse(f.started.enqueuedAt);
        if (first && f.firstSentAtMs !== undefined && f.started.attempt === 1 && Number.isFinite(enqueuedMs)) {
          this.opts.metrics.dispatchLatency?.((f.firstSentAtMs - enqueuedMs) / 1000);
        }
        return;
      }
      this.log.warn({ ...fenceFields(f.fence), workerId, reason: res.reason }, 'turn_start send failed');
      // Its route is gone: out of dispatch until it registers again. Its other turns keep their
      // deliveries; a reconnect of the same run can still finish them. A worker that registered
      // again while the send was under way has a new route: it stays, and may be offered the turn
      // again (forgetting it left it idle, and the turn parked, until its next registration).
      const registeredAgain = this.opts.workers.registrationOf(workerId) !== registration;
      if (!registeredAgain) tried.add(workerId);
      if (!registeredAgain && (res.reason === 'unknown_route' || res.reason === 'closed')) this.opts.workers.forget(workerId, registration);
      const capped = tried.size >= MAX_DEAD_ROUTES_PER_DISPATCH;
      const next = capped ? undefined : this.opts.workers.acquire(eventId, f.fence.agentUid, tried);
      if (next === undefined) {
        this.park(eventId, f);
        // The dead routes tried are forgotten; try again shortly rather than wait for the next
        // worker event, so a turn gets past many dead routes a few at a time.
        if (capped) this.retryParkedSoon();
        return;
      }
      await this.redirect(eventId, next, `send failed: ${res.reason}`);
    }
  }

  private park(eventId: string, f: InFlightTurn): void {
    this.opts.workers.release(eventId);
    dispatchTo(f, { to: 'parked' }, this.opts.clock.nowMs());
    if (!this.parked.includes(eventId)) this.parked.push(eventId);
  }

  private async redirect(
    eventId: string,
    workerId: string | null,
    reason: string,
    endState: 'send_failed' | 'superseded' = 'send_failed',
  ): Promise<void> {
    const f = this.turnOf(eventId);
    if (!f) return;
    try {
      f.fence = await this.opts.begin.redirect(f.fence, workerId, reason, endState);
      f.trace?.redirected(f.fence.deliveryId, workerId, reason);
      dispatchTo(f, workerId === null ? { to: 'parked' } : { to: 'assigned', workerId }, this.opts.clock.nowMs());
    } catch (e) {
      if (e instanceof FenceRejected) {
        // The attempt is over (the watchdog failed it); its retry comes back through the queue.
        this.settle(f.fence);
        return;
      }
      throw e;
    }
  }

  private retryParkedSoon(): void {
    if (this.parkedRetry || this.stopping) return;
    this.parkedRetry = this.opts.clock.setTimeout(() => {
      this.parkedRetry = null;
      try {
        this.dispatchParked();
      } catch (e) {
        this.log.error({ err: toError(e) }, 'dispatching parked turns failed');
      }
    }, PARKED_RETRY_MS);
  }

  /**
   * Gives free slots to parked turns, oldest first. A turn no worker may take now (none free in
   * its agent's scope) stays parked and does not hold back the turns behind it.
   */
  dispatchParked(): void {
    for (let i = 0; i < this.parked.length && this.opts.workers.freeSlots() > 0;) {
      const eventId = this.parked[i]!;
      const f = this.turnOf(eventId);
      if (!f) {
        this.parked.splice(i, 1);
        continue;
      }
      const workerId = this.opts.workers.acquire(eventId, f.fence.agentUid);
      if (workerId === undefined) {
        i++;
        continue;
      }
      this.parked.splice(i, 1);
      this.opts.background.track(
        this.opts.directory.wake(f.fence).run(async () => {
          await this.redirect(eventId, workerId, 'dispatched after waiting for a worker');
          await this.send(eventId);
        }),
        fenceFields(f.fence),
      );
    }
  }

  /**
   * Sends the turn of `eventId` to another worker (its worker was lost before running it, or
   * handed it back). `fromWorker`, when given, must be the worker currently holding the turn.
   */
  reassign(eventId: string, reason: string, fromWorker?: string, mayReturn = false): void {
    const f = this.turnOf(eventId);
    if (!f || (fromWorker !== undefined && workerOf(f) !== fromWorker)) return;
    this.opts.background.track(
      this.opts.directory.wake(f.fence).run(async () => {
        const current = this.turnOf(eventId);
        if (!current) return;
        const holding = workerOf(current);
        const next = this.opts.workers.acquire(eventId, current.fence.agentUid, new Set(holding && !mayReturn ? [holding] : []));
        if (next === undefined) {
          // the worker it was on gave it back or is gone: that delivery ends now, so the worker
          // holds no live delivery without a slot while the turn waits for another one
          if (holding !== null) await this.redirect(eventId, null, reason, 'superseded');
          const waiting = this.turnOf(eventId);
          if (waiting) this.park(eventId, waiting);
          // a worker may have registered while the redirect was written: it found nothing parked
          this.dispatchParked();
          return;
        }
        await this.redirect(eventId, next, reason, 'superseded');
        await this.send(eventId);
      }),
      fenceFields(f.fence),
    );
  }

  /** The worker of the delivery in flight here for `eventId` has it (it said `turn_accepted`). */
  markAccepted(workerId: string, eventId: string, deliveryId: string): void {
    const f = this.turnOf(eventId);
    if (!f || f.fence.deliveryId !== deliveryId || !dispatchTo(f, { to: 'accepted', workerId }, this.opts.clock.nowMs())) return;
    this.opts.workers.accepted(workerId);
    f.trace?.accepted(workerId);
    // its window grew: a parked turn, or the queue, may have a slot now
    this.dispatchParked();
    this.opts.onCapacity?.();
  }

  /**
   * A worker registered: the turns its previous run lost go elsewhere; parked turns get slots.
   * A reconnect of the same run keeps its turns, but a `turn_start` sent before the move may
   * have gone to the connection it left: every turn it has not accepted is sent again now (a
   * worker answers a repeated `turn_start` of a delivery it runs with `turn_accepted`, §7), so
   * no turn caught in a move waits for its lease.
   */
  workerReady(workerId: string, lostEvents: readonly string[]): void {
    // The restarted worker itself may take them again (it may be the only worker).
    for (const eventId of lostEvents) this.reassign(eventId, 'worker restarted', undefined, true);
    for (const [eventId, c] of this.holders) {
      const f = c.turn;
      if (!f || f.dispatch.kind !== 'sent' || f.dispatch.workerId !== workerId) continue;
      this.opts.background.track(
        c.run(() => this.send(eventId)),
        fenceFields(f.fence),
      );
    }
    this.dispatchParked();
    this.opts.onCapacity?.();
  }

  /**
   * Turns running longer than `maxTurnMs` (since this process began them) are failed and their
   * workers told to cancel. Called by the watchdog. Returns how many were failed.
   */
  async failOverdueTurns(maxTurnMs: number): Promise<number> {
    const now = this.opts.clock.nowMs();
    let failed = 0;
    for (const c of [...this.holders.values()]) {
      const f = c.turn;
      if (!f || now - f.startedAtMs < maxTurnMs) continue;
      const fence = f.fence;
      const workerId = workerOf(f);
      const outcome = await c.run(() => this.opts.failures.failOverdue(fence, maxTurnMs));
      if (!outcome) continue;
      failed++;
      if (workerId) await this.tell(workerId, { v: 1, type: 'turn_cancel', turn_ref: toWire(fence), reason: 'turn_timeout' });
      this.attemptFailed(fence, outcome, `turn ran longer than ${maxTurnMs} ms`, true);
    }
    return failed;
  }

  /**
   * An attempt failed (a worker error, its lease, the maximum duration): settles it here.
   * `fencedOut`: the daemon took the fence from it (its lease, the maximum duration), so whatever
   * its worker still sends for it is refused.
   */
  attemptFailed(attempt: AttemptRef, outcome: FailOutcome, why: string, fencedOut = false): void {
    this.opts.metrics.failed(outcome.deadLettered);
    const held = this.heldAttempt(attempt);
    const fields = { ...attemptFields(attempt), deadLettered: outcome.deadLettered, ...traceLogFields(held?.started.trace) };
    if (outcome.deadLettered) this.log.warn(fields, `event dead-lettered after ${why}`);
    else this.log.warn(fields, `attempt failed (${why}); the event will be retried`);
    this.settle(attempt, { outcome: outcome.deadLettered ? 'dead_letter' : 'retry', why, fencedOut });
  }

  /** The turn in flight here for exactly this attempt (not an older or newer one of its event). */
  private heldAttempt(attempt: Pick<AttemptRef, 'eventId' | 'activationUid'>): InFlightTurn | undefined {
    const turn = this.holders.get(attempt.eventId)?.turn;
    return turn?.fence.eventId === attempt.eventId && turn.fence.activationUid === attempt.activationUid ? turn : undefined;
  }

  /**
   * The worker holding the turn sent its final message. With `free` (a result that passed the
   * checks that need no database) the worker runs the turn no longer, so its slot goes to the
   * next turn now, while the reply is still being written (the worker already counts the slot
   * free); the caller then settles the turn and answers the message (invariant 1). Only the
   * worker the turn was dispatched to, naming the delivery in flight here, frees it; only its
   * first final message counts (a refused result or an error followed by a good result frees
   * nothing); and only while it has fewer than `capacity` turns finishing. The turn stays in
   * flight until the attempt settles.
   *
   * When the actor had another event queued behind this one (`StartedTurn.more`), the slot is kept
   * for its next turn instead (N1 of src/runtime/turn-commit.ts): the worker returned gets it once
   * the commit ran (`continued`). Otherwise undefined.
   */
  workerFinished(workerId: string, ref: Fence, free: boolean): string | undefined {
    const f = this.turnOf(ref.eventId);
    if (!f || workerOf(f) !== workerId) return undefined;
    if (f.fence.deliveryId !== ref.deliveryId || f.fence.activationUid !== ref.activationUid || f.fence.actorEpoch !== ref.actorEpoch)
      return undefined;
    if (this.opts.workers.workerOf(ref.eventId) !== workerId) return undefined;
    if (this.finals.get(ref.eventId)?.deliveryId === ref.deliveryId) return undefined;
    const finishing = this.finishingOf(workerId);
    if (!free || finishing >= this.opts.workers.capacityOf(workerId)) {
      this.finals.set(ref.eventId, { deliveryId: ref.deliveryId, freedBy: null });
      return undefined;
    }
    this.finals.set(ref.eventId, { deliveryId: ref.deliveryId, freedBy: workerId });
    this.finishingPerWorker.set(workerId, finishing + 1);
    if (f.started.more && this.continuing()) {
      this.opts.workers.rekey(ref.eventId, nextSlotOf(ref.eventId));
      return workerId;
    }
    this.opts.workers.release(ref.eventId);
    this.dispatchParked();
    this.opts.onCapacity?.();
    return undefined;
  }

  /** Whether a finishing turn's slot may be kept for its actor's next turn (`DispatcherOptions.continueTurns`). */
  private continuing(): boolean {
    const off = this.stopping || this.draining || this.opts.continueTurns === false || this.opts.tracer !== undefined;
    return !off && this.opts.queueBacklogged?.() !== true;
  }

  private draining = false;

  /** The daemon drains: no next turn begins in a commit any more (the queue's fetch has stopped too). */
  stopContinuing(): void {
    this.draining = true;
  }

  /** Turns of `workerId` whose result freed their slot and that have not settled yet. */
  finishingOf(workerId: string): number {
    return this.finishingPerWorker.get(workerId) ?? 0;
  }

  private finished(eventId: string): void {
    const workerId = this.finals.get(eventId)?.freedBy;
    this.finals.delete(eventId);
    if (workerId === undefined || workerId === null) return;
    const left = this.finishingOf(workerId) - 1;
    if (left > 0) this.finishingPerWorker.set(workerId, left);
    else this.finishingPerWorker.delete(workerId);
  }

  /**
   * The attempt is over in this process, whatever happened to it: its controller lets go of it
   * and its slot goes to a parked turn first, then to the queue. An older attempt of the same
   * event (another activation) changes nothing. `end` is how its span ends (the first end of a
   * span counts: the commit and a failure end it before they settle).
   */
  settle(attempt: Pick<AttemptRef, 'eventId' | 'activationUid'>, end?: AttemptEnd, kept = false): void {
    const holder = this.holders.get(attempt.eventId);
    if (holder?.turn && holder.turn.fence.activationUid === attempt.activationUid) {
      holder.turn.trace?.end(end ?? { outcome: 'cancelled', why: 'the attempt ended in this daemon' });
      this.holders.delete(attempt.eventId);
      holder.letGo(attempt.eventId);
      this.finished(attempt.eventId);
      this.opts.workers.release(attempt.eventId);
      const i = this.parked.indexOf(attempt.eventId);
      if (i >= 0) this.parked.splice(i, 1);
    }
    // `kept`: its slot waits for the actor's next turn (`continued` frees it, or gives it on)
    if (kept) return;
    this.dispatchParked();
    this.opts.onCapacity?.();
  }

  /**
   * A committed control change (steer or cancel) for a turn. Only the daemon that dispatched the
   * turn holds its worker connection; the others ignore it.
   */
  applyControl(msg: ControlMessage): void {
    if (msg.kind === 'interrupt') {
      this.interrupt(msg);
      return;
    }
    const f = this.turnOf(msg.fence.eventId);
    if (!f || f.fence.deliveryId !== msg.fence.deliveryId) return;
    this.opts.background.track(
      this.opts.directory.wake(msg.fence).run(async () => {
        const current = this.turnOf(msg.fence.eventId);
        if (!current || current.fence.deliveryId !== msg.fence.deliveryId) return;
        const workerId = workerOf(current);
        if (msg.kind === 'steer') {
          if (msg.fence.revision > current.fence.revision) current.fence = msg.fence;
          if (workerId) await this.tell(workerId, { v: 1, type: 'turn_steer', turn_ref: toWire(current.fence), input: msg.input as never });
          this.log.info({ ...fenceFields(current.fence), workerId }, 'turn steered');
        } else {
          if (workerId) await this.tell(workerId, { v: 1, type: 'turn_cancel', turn_ref: toWire(current.fence), reason: msg.reason });
          this.log.info({ ...fenceFields(current.fence), workerId }, 'turn cancelled');
          this.settle(current.fence, { outcome: 'cancelled', why: msg.reason });
        }
      }),
      fenceFields(msg.fence),
    );
  }

  /** Stops retrying parked turns (shutdown). */
  stop(): void {
    this.stopping = true;
    this.parkedRetry?.cancel();
    this.parkedRetry = null;
  }

  /**
   * Input policy `interrupt`: event `msg.eventId` came for an actor whose turn runs here. Unless
   * the turn takes that event already, it is interrupted in the database (AttemptFailures
   * `interrupt`), its worker told (`turn_cancel`), and its slot freed: the consumer then fetches
   * the actor's next turn, which takes the interrupted events with the new one.
   */
  private interrupt(msg: Extract<ControlMessage, { kind: 'interrupt' }>, lookups = 1): void {
    const key = { agentUid: msg.agentUid, sessionId: msg.sessionId };
    const controller = this.opts.directory.get(key);
    if (!controller) {
      // a turn claimed an instant before may not have reached its controller yet: look once more
      if (lookups < INTERRUPT_LOOKUPS) this.opts.clock.setTimeout(() => this.interrupt(msg, lookups + 1), INTERRUPT_RELOOK_MS);
      return;
    }
    // queued behind the actor's operations, so a turn being begun is held by the time this runs
    this.opts.background.track(
      controller.run(async () => {
        const current = controller.turn;
        if (!current || takesEvent(current, msg.eventId)) return;
        if (!(await this.opts.retry(() => this.opts.failures.interrupt(current.fence), { actor: controller.name }))) return;
        const workerId = workerOf(current);
        if (workerId) {
          await this.tell(workerId, { v: 1, type: 'turn_cancel', turn_ref: toWire(current.fence), reason: 'interrupted' });
        }
        this.log.info({ ...fenceFields(current.fence), workerId, by: msg.eventId }, 'turn interrupted');
        this.opts.metrics.interrupted?.();
        this.settle(current.fence, { outcome: 'interrupted', why: `interrupted by event ${msg.eventId}` });
      }),
      { actor: formatActorKey(key), eventId: msg.eventId },
    );
  }

  private async tell(workerId: string, msg: DaemonMessage): Promise<void> {
    const res = await this.opts.transport.send(workerId, msg);
    if (!res.ok) this.log.debug({ workerId, type: msg.type, reason: res.reason }, 'message not delivered');
  }
}

/** How often, and how far apart, an interrupt looks for the actor's controller. */
const INTERRUPT_LOOKUPS = 3;
const INTERRUPT_RELOOK_MS = 50;

/** Whether the turn takes event `eventId` (its own, or one of its batch). */
function takesEvent(f: InFlightTurn, eventId: string): boolean {
  return f.fence.eventId === eventId || (f.started.batch?.some((m) => m.event_id === eventId) ?? false);
}

function turnStart(f: InFlightTurn): DaemonMessage {
  const msg: DaemonMessage = {
    v: 1,
    type: 'turn_start',
    turn_ref: toWire(f.fence),
    event: { id: f.fence.eventId, data: (f.started.payload ?? null) as never, enqueued_at: f.started.enqueuedAt },
    attempt: f.started.attempt,
    lease_expires_at: f.started.leaseExpiresAt.toISOString(),
  };
  if (f.started.trace) msg.trace = f.started.trace;
  // a batch: every event of the turn, in order, its own first (docs/protocol.md §5.3)
  if (f.started.batch) {
    msg.events = [
      msg.event,
      ...f.started.batch.map((m) => ({ id: m.event_id, data: (m.data ?? null) as never, enqueued_at: m.enqueued_at })),
    ];
  }
  // the context goes into the frame as JSON text built once at the begin (src/runtime/context-cache.ts)
  return f.started.contextJson === undefined ? msg : withRawField(msg, 'context', f.started.contextJson);
}
