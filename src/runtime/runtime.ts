/**
 * The Runtime: routes broker events and fetched jobs to session controllers and runs the turn
 * transactions (TurnStore) for them.
 *
 * Invariants:
 *  1. (I5) The runtime never touches the socket: it sends through `Transport`, the broker's
 *     serial send queue. The broker never touches the database.
 *  2. `handleBrokerEvent` only schedules work (it is called from the broker's receive loop).
 *  3. Per actor, operations run one at a time through the actor's SessionController.
 *  4. A reply that fails the fence changes nothing and is answered `turn_rejected{reason}`.
 */
import { formatActorKey, type ActorKey } from '../actor-key.ts';
import type { Clock, TimerHandle } from '../clock.ts';
import { FenceRejected, errorMessage, isConnectionError, toError } from '../errors.ts';
import type { BrokerEvent, SendResult } from '../fabric/broker.ts';
import type { DaemonMessage } from '../fabric/protocol.ts';
import type { Logger } from '../logger.ts';
import { storableText, unstorableReason } from '../json-safety.ts';
import type { Db } from '../db/client.ts';
import type { ControlMessage } from '../db/control.ts';
import * as workersDb from '../db/workers.ts';
import { ActorDirectory } from './directory.ts';
import { fenceFields, fromWire, toWire, type Fence, type WireTurnRef } from './fence.ts';
import { WorkerPool } from './worker-pool.ts';
import { GroupWriter } from './group-writer.ts';
import { backoffDelayMs } from '../backoff.ts';

/** How long a turn operation keeps retrying while the database is unreachable. */
const DATABASE_RETRY_MS = 120_000;
import type { FailOutcome, FetchedJob, ReplyOutcome, ReplyRequest, StartedTurn, TurnStore } from './turns.ts';
import { noopMetrics, type RuntimeMetrics } from './metrics.ts';

export interface Transport {
  send(workerId: string, msg: DaemonMessage): Promise<SendResult>;
  /** Drops a worker's session: it must register again before it is used. */
  forget?(workerId: string): void;
}

/** A turn is never offered to more than this many routes that turn out dead in one dispatch. */
const MAX_DEAD_ROUTES_PER_DISPATCH = 3;
/**
 * Replies about deliveries this process did not dispatch (or no longer holds) cost a database
 * transaction to judge. They are legitimate after a daemon restart (a worker re-sends its
 * unanswered results), so they are not refused outright: each worker gets this budget, and
 * beyond it they are rejected at once, before any transaction.
 */
const UNKNOWN_REPLY_BURST = 20;
/** After a dispatch gave up on dead routes, the parked turn is tried again this soon. */
const PARKED_RETRY_MS = 100;
const UNKNOWN_REPLY_PER_SECOND = 10;

/** turn_error codes meaning "the worker did not run this turn": it goes elsewhere, no retry is spent. */
const HANDED_BACK = new Set(['over_capacity', 'worker_stopping']);

export interface RuntimeOptions {
  db: Db;
  store: TurnStore;
  transport: Transport;
  clock: Clock;
  logger: Logger;
  ownerId: string;
  workerStaleMs: number;
  /** Called whenever capacity may have freed up (the consumer fetches again). */
  onCapacity?: () => void;
  metrics?: RuntimeMetrics;
}

interface InFlight {
  fence: Fence;
  workerId: string | null;
  turn: StartedTurn;
  /** When its turn_start was first sent (clock ms), for the commit-latency histogram. */
  sentAtMs?: number;
  /** When this process began the attempt (clock ms), for the maximum turn duration. */
  startedAtMs: number;
}

export class Runtime {
  readonly pool = new WorkerPool();
  readonly directory: ActorDirectory;
  private readonly opts: RuntimeOptions;
  private readonly log: Logger;
  private readonly metrics: RuntimeMetrics;
  /** Turns this process dispatched and has not seen settle, by event id. */
  private readonly inFlight = new Map<string, InFlight>();
  /** Turns begun while no worker was free; dispatched when one registers. */
  private readonly parked: string[] = [];
  private readonly background = new Set<Promise<unknown>>();
  private lastHeartbeatWrite = new Map<string, number>();
  /** Per-worker token buckets for replies about unknown deliveries. */
  private readonly unknownReplyBudget = new Map<string, { tokens: number; atMs: number }>();
  private parkedRetry: TimerHandle | null = null;
  /** turn_accepted messages not yet handed to the reply writer (see acceptLater). */
  private readonly pendingAccepts = new Map<string, { workerId: string; ref: WireTurnRef }>();
  private acceptsScheduled = false;
  private stopping = false;
  /** Worker replies (results, accepts, progress, sent marks) are written in groups (group-writer.ts). */
  private readonly replies: GroupWriter<ReplyRequest, ReplyOutcome>;
  /** Fetched jobs begin in groups too: one transaction for the turns begun meanwhile. */
  private readonly begins: GroupWriter<{ job: FetchedJob; workerId: string | null }, StartedTurn>;

  constructor(opts: RuntimeOptions) {
    this.opts = opts;
    this.log = opts.logger.child({ component: 'runtime' });
    this.metrics = opts.metrics ?? noopMetrics;
    this.begins = new GroupWriter({
      many: async (requests) => (await opts.store.beginMany(requests)).map((value) => ({ ok: true as const, value })),
      one: (r) => opts.store.begin(r.job, r.workerId),
      onBatch: (size, fellBack) => this.log.debug({ size, fellBack }, fellBack ? 'begin batch failed; begun one by one' : 'begin batch'),
    });
    this.replies = new GroupWriter<ReplyRequest, ReplyOutcome>({
      many: async (requests) =>
        (await opts.store.replyMany(requests)).map((o) =>
          o.outcome === 'rejected' ? { ok: false as const, error: new FenceRejected(o.reason) } : { ok: true as const, value: o },
        ),
      one: (r) => this.replyOne(r),
      onBatch: (size, fellBack) =>
        this.log.debug({ size, fellBack }, fellBack ? 'reply batch failed; applied one by one' : 'reply batch'),
    });
    this.directory = new ActorDirectory({ clock: opts.clock, onError: (e) => this.log.error({ err: e }, 'directory') });
  }

  /** Free worker slots minus turns waiting for a worker: how many jobs the consumer may fetch. */
  fetchCapacity(): number {
    return Math.max(0, this.pool.freeSlots() - this.parked.length);
  }

  inFlightCount(): number {
    return this.inFlight.size;
  }

  /** The pg-boss attempts of the turns this process is running. */
  inFlightAttempts(): { id: string; retryCount: number }[] {
    return [...this.inFlight.values()].map((f) => ({ id: f.fence.eventId, retryCount: f.turn.attempt - 1 }));
  }

  /** Waits for scheduled background work (tests, shutdown). */
  async drain(): Promise<void> {
    while (this.background.size > 0) await Promise.allSettled([...this.background]);
  }

  // ---- jobs from the consumer ----------------------------------------------------------

  /** Dispatches fetched jobs; each runs on its actor's controller. Never throws. */
  dispatchJobs(jobs: FetchedJob[]): void {
    for (const job of jobs) {
      const key: ActorKey = { agentUid: job.data.agentUid, sessionId: job.data.sessionId };
      const controller = this.directory.wake(key);
      controller.current = { eventId: job.id };
      // Reserve the slot now, not when the controller gets to it, so the next fetch sees it taken.
      const workerId = this.pool.acquire(job.id) ?? null;
      this.track(controller.run(() => this.startTurn(job, workerId)), { actor: formatActorKey(key), eventId: job.id });
    }
  }

  private async startTurn(job: FetchedJob, workerId: string | null): Promise<void> {
    let turn: StartedTurn;
    try {
      turn = await this.withDatabaseRetry(() => this.begins.submit({ job, workerId }), { eventId: job.id });
    } catch (e) {
      if (workerId) this.pool.release(job.id);
      this.clearCurrent({ agentUid: job.data.agentUid, sessionId: job.data.sessionId }, job.id);
      throw e;
    }
    this.inFlight.set(job.id, { fence: turn.fence, workerId, turn, startedAtMs: this.opts.clock.nowMs() });
    this.log.info({ ...fenceFields(turn.fence), workerId, attempt: turn.attempt }, 'turn started');
    if (workerId === null) {
      this.parked.push(job.id);
      return;
    }
    await this.send(job.id);
  }

  /** Sends the turn of `eventId` to its worker, redirecting to another worker if the send fails. */
  private async send(eventId: string): Promise<void> {
    const tried = new Set<string>();
    for (;;) {
      const f = this.inFlight.get(eventId);
      if (!f || f.workerId === null) return;
      const res = await this.opts.transport.send(f.workerId, this.turnStart(f));
      if (res.ok) {
        this.metrics.dispatched();
        if (f.sentAtMs === undefined) {
          f.sentAtMs = this.opts.clock.nowMs();
          const enqueuedMs = Date.parse(f.turn.enqueuedAt);
          if (f.turn.attempt === 1 && Number.isFinite(enqueuedMs)) {
            this.metrics.dispatchLatency?.((f.sentAtMs - enqueuedMs) / 1000);
          }
        }
        return;
      }
      this.log.warn({ ...fenceFields(f.fence), workerId: f.workerId, reason: res.reason }, 'turn_start send failed');
      tried.add(f.workerId);
      if (res.reason === 'unknown_route' || res.reason === 'closed') this.forgetWorker(f.workerId);
      const capped = tried.size >= MAX_DEAD_ROUTES_PER_DISPATCH;
      const next = capped ? undefined : this.pool.acquire(eventId, tried);
      if (next === undefined) {
        this.pool.release(eventId);
        f.workerId = null;
        this.parked.push(eventId);
        // The dead routes tried are forgotten; try again shortly rather than wait for the next
        // worker event, so a turn gets past many dead routes a few at a time.
        if (capped) this.retryParkedSoon();
        return;
      }
      await this.redirect(eventId, next, `send failed: ${res.reason}`);
    }
  }

  private async redirect(
    eventId: string,
    workerId: string,
    reason: string,
    endState: 'send_failed' | 'superseded' = 'send_failed',
  ): Promise<void> {
    const f = this.inFlight.get(eventId);
    if (!f) return;
    try {
      f.fence = await this.opts.store.redirect(f.fence, workerId, reason, endState);
      f.workerId = workerId;
    } catch (e) {
      if (e instanceof FenceRejected) {
        // The attempt is over (the watchdog failed it); its retry comes back through the queue.
        this.settle(f.fence, `redirect refused: ${e.reason}`);
        return;
      }
      throw e;
    }
  }

  private turnStart(f: InFlight): DaemonMessage {
    return {
      v: 1,
      type: 'turn_start',
      turn_ref: toWire(f.fence),
      event: { id: f.fence.eventId, data: (f.turn.payload ?? null) as never, enqueued_at: f.turn.enqueuedAt },
      attempt: f.turn.attempt,
      lease_expires_at: f.turn.leaseExpiresAt.toISOString(),
    };
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

  private dispatchParked(): void {
    while (this.parked.length > 0) {
      const eventId = this.parked[0]!;
      const f = this.inFlight.get(eventId);
      if (!f) {
        this.parked.shift();
        continue;
      }
      const workerId = this.pool.acquire(eventId);
      if (workerId === undefined) return;
      this.parked.shift();
      const controller = this.directory.wake(f.fence);
      this.track(
        controller.run(async () => {
          await this.redirect(eventId, workerId, 'dispatched after waiting for a worker');
          await this.send(eventId);
        }),
        fenceFields(f.fence),
      );
    }
  }

  /** One reply in its own transaction (the group writer's single path). */
  private async replyOne(r: ReplyRequest): Promise<ReplyOutcome> {
    switch (r.kind) {
      case 'accept':
        await this.opts.store.accept(r.fence, r.workerId);
        return { outcome: 'accepted' };
      case 'progress':
        return { outcome: 'extended', leaseExpiresAt: await this.opts.store.progress(r.fence, r.workerId) };
      case 'commit':
        return this.opts.store.commit(r.fence, r.workerId, r.messages, r.output);
    }
  }

  // ---- broker events -----------------------------------------------------------------

  /** Called synchronously from the broker's receive loop: schedules, never awaits. */
  handleBrokerEvent(e: BrokerEvent): void {
    switch (e.kind) {
      case 'worker_ready':
        this.track(this.onWorkerReady(e.workerId, e.capacity, e.instance), { workerId: e.workerId });
        return;
      case 'worker_heartbeat':
        this.onHeartbeat(e.workerId, e.inFlight);
        return;
      case 'turn_accepted':
        this.acceptLater(e.workerId, e.turnRef);
        return;
      case 'turn_progress':
        this.pool.seen(e.workerId, this.opts.clock.nowMs());
        this.fenced(e.workerId, e.turnRef, 'progress', (f) => this.replies.submit({ kind: 'progress', fence: f, workerId: e.workerId }));
        return;
      case 'turn_result': {
        const unstorable = unstorableReason({ messages: e.messages, output: e.output ?? null });
        if (unstorable) {
          this.refuseUnstorable(e.workerId, e.turnRef, unstorable);
          return;
        }
        this.dropAccept(e.turnRef.delivery_id);
        this.fenced(e.workerId, e.turnRef, 'commit', async (f) => {
          const outcome = await this.replies.submit({
            kind: 'commit',
            fence: f,
            workerId: e.workerId,
            messages: e.messages,
            ...(e.output === undefined ? {} : { output: e.output }),
          });
          if (outcome.outcome === 'committed') {
            this.metrics.committed();
            const sentAtMs = this.inFlight.get(f.eventId)?.sentAtMs;
            if (sentAtMs !== undefined) this.metrics.commitLatency?.((this.opts.clock.nowMs() - sentAtMs) / 1000);
            this.log.info({ ...fenceFields(f), workerId: e.workerId }, 'turn committed');
          } else {
            this.metrics.duplicate();
            this.log.info({ ...fenceFields(f), workerId: e.workerId }, 'duplicate result: already committed');
          }
          this.settle(f, 'committed');
          await this.reply(e.workerId, { v: 1, type: 'turn_committed', turn_ref: e.turnRef });
        });
        return;
      }
      case 'turn_error':
        if (HANDED_BACK.has(e.error.code)) {
          this.log.info({ ...fenceFields(fromWire(e.turnRef)), workerId: e.workerId, code: e.error.code }, 'turn handed back');
          this.reassign(e.turnRef.event_id, `handed back by ${e.workerId}: ${e.error.code}`, e.workerId);
          return;
        }
        this.dropAccept(e.turnRef.delivery_id);
        this.fenced(e.workerId, e.turnRef, 'fail', async (f) => {
          // an error text is diagnostic: make it storable rather than lose the failure
          const outcome = await this.opts.store.fail(f, e.workerId, {
            ...e.error,
            code: storableText(e.error.code),
            message: storableText(e.error.message),
          });
          this.onAttemptFailed(f, outcome, `turn_error: ${e.error.code}: ${e.error.message}`);
        });
        return;
      case 'invalid':
        this.metrics.invalidMessage();
        return;
      case 'worker_gone':
        this.onWorkerGone(e.workerId, e.reason);
        return;
    }
  }

  private async onWorkerReady(workerId: string, capacity: number, instance?: string): Promise<void> {
    const { restarted, lostEvents } = this.pool.register(workerId, capacity, this.opts.clock.nowMs(), instance);
    await workersDb.upsertWorker(this.opts.db, { workerId, ownerId: this.opts.ownerId, capacity });
    this.log.info({ workerId, capacity, restarted }, 'worker ready');
    // A worker process that restarted lost what it was running: those turns go elsewhere now
    // instead of waiting for their leases to run out. (A reconnect of the same run keeps them.)
    for (const eventId of lostEvents) this.reassign(eventId, 'worker restarted');
    this.dispatchParked();
    this.opts.onCapacity?.();
  }

  /**
   * A result PostgreSQL cannot store: answered `turn_rejected{unstorable}` at once, and the
   * attempt is failed (retried per the retry policy) instead of waiting for its lease.
   */
  private refuseUnstorable(workerId: string, ref: WireTurnRef, why: string): void {
    this.metrics.rejected('unstorable');
    this.log.warn({ ...fenceFields(fromWire(ref)), workerId, why: why.slice(0, 200) }, 'result cannot be stored');
    this.track(this.reply(workerId, { v: 1, type: 'turn_rejected', turn_ref: ref, reason: 'unstorable', detail: why.slice(0, 500) }), { workerId });
    this.fenced(workerId, ref, 'fail', async (f) => {
      const outcome = await this.opts.store.fail(f, workerId, { code: 'unstorable_result', message: why.slice(0, 1000) });
      this.onAttemptFailed(f, outcome, `unstorable result: ${why.slice(0, 200)}`);
    });
  }

  /** Takes one token from `workerId`'s unknown-reply budget; false when it is spent. */
  private takeUnknownReplyToken(workerId: string): boolean {
    const now = this.opts.clock.nowMs();
    const b = this.unknownReplyBudget.get(workerId) ?? { tokens: UNKNOWN_REPLY_BURST, atMs: now };
    b.tokens = Math.min(UNKNOWN_REPLY_BURST, b.tokens + ((now - b.atMs) / 1000) * UNKNOWN_REPLY_PER_SECOND);
    b.atMs = now;
    this.unknownReplyBudget.set(workerId, b);
    if (b.tokens < 1) return false;
    b.tokens -= 1;
    return true;
  }

  /**
   * Turns running longer than `maxTurnMs` (since this process began them) are failed and their
   * workers told to cancel. Called by the watchdog. Returns how many were failed.
   */
  async failOverdueTurns(maxTurnMs: number): Promise<number> {
    const now = this.opts.clock.nowMs();
    let failed = 0;
    for (const f of [...this.inFlight.values()]) {
      if (now - f.startedAtMs < maxTurnMs) continue;
      const fence = f.fence;
      const workerId = f.workerId;
      const outcome = await this.directory.wake(fence).run(() => this.opts.store.failOverdue(fence, maxTurnMs));
      if (!outcome) continue;
      failed++;
      if (workerId) await this.reply(workerId, { v: 1, type: 'turn_cancel', turn_ref: toWire(fence), reason: 'turn_timeout' });
      this.onAttemptFailed(fence, outcome, `turn ran longer than ${maxTurnMs} ms`);
    }
    return failed;
  }

  /** The broker dropped the worker (revoked): nothing more goes to it; its turns go elsewhere now. */
  private onWorkerGone(workerId: string, reason: string): void {
    const events = [...(this.pool.get(workerId)?.inFlight ?? [])];
    this.forgetWorker(workerId);
    this.unknownReplyBudget.delete(workerId);
    this.log.warn({ workerId, reason, inFlight: events.length }, 'worker gone');
    for (const eventId of events) this.reassign(eventId, `worker ${workerId} gone: ${reason}`);
  }

  private onHeartbeat(workerId: string, inFlight: number): void {
    const now = this.opts.clock.nowMs();
    if (!this.pool.seen(workerId, now)) return;
    // The durable heartbeat is for operators; writing it at most once a second per worker is enough.
    if (now - (this.lastHeartbeatWrite.get(workerId) ?? 0) < 1_000) return;
    this.lastHeartbeatWrite.set(workerId, now);
    this.track(workersDb.recordHeartbeat(this.opts.db, workerId, inFlight), { workerId });
  }

  /**
   * Sends the turn of `eventId` to another worker (its worker was lost before running it, or
   * handed it back). `fromWorker`, when given, must be the worker currently holding the turn.
   */
  reassign(eventId: string, reason: string, fromWorker?: string): void {
    const f = this.inFlight.get(eventId);
    if (!f || (fromWorker !== undefined && f.workerId !== fromWorker)) return;
    const controller = this.directory.wake(f.fence);
    this.track(
      controller.run(async () => {
        const current = this.inFlight.get(eventId);
        if (!current) return;
        const next = this.pool.acquire(eventId, new Set(current.workerId ? [current.workerId] : []));
        if (next === undefined) {
          this.pool.release(eventId);
          current.workerId = null;
          if (!this.parked.includes(eventId)) this.parked.push(eventId);
          return;
        }
        await this.redirect(eventId, next, reason, 'superseded');
        await this.send(eventId);
      }),
      fenceFields(f.fence),
    );
  }

  /** Stale workers: removes them from dispatch; returns their in-flight event ids. */
  takeStaleWorkers(): { id: string; events: string[] }[] {
    const now = this.opts.clock.nowMs();
    const stale = this.pool.takeStale(now, this.opts.workerStaleMs);
    for (const id of this.pool.pruneStale(now, Math.max(60_000, this.opts.workerStaleMs * 6))) {
      this.lastHeartbeatWrite.delete(id);
      this.unknownReplyBudget.delete(id);
    }
    // A stale worker must register again before it gets work: a frozen process that wakes up
    // finds itself unknown (`not_registered`) and re-registers.
    for (const w of stale) this.opts.transport.forget?.(w.id);
    return stale;
  }

  private forgetWorker(workerId: string): void {
    this.pool.remove(workerId);
    this.lastHeartbeatWrite.delete(workerId);
    this.track(workersDb.setWorkerStatus(this.opts.db, workerId, 'gone'), { workerId });
  }

  /** The watchdog (or recovery) failed an attempt of `eventId`. */
  onAttemptFailed(fence: Fence, outcome: FailOutcome, why: string): void {
    this.metrics.failed(outcome.deadLettered);
    const fields = { ...fenceFields(fence), deadLettered: outcome.deadLettered };
    if (outcome.deadLettered) this.log.warn(fields, `event dead-lettered after ${why}`);
    else this.log.warn(fields, `attempt failed (${why}); the event will be retried`);
    this.settle(fence, why);
  }

  /** The attempt for `eventId` is over in this process, whatever happened to it. */
  settleEvent(eventId: string, why: string): void {
    const f = this.inFlight.get(eventId);
    if (f) this.settle(f.fence, why);
  }

  private settle(fence: Fence, _why: string): void {
    const f = this.inFlight.get(fence.eventId);
    if (f && f.fence.activationUid === fence.activationUid) {
      this.inFlight.delete(fence.eventId);
      this.pool.release(fence.eventId);
      const i = this.parked.indexOf(fence.eventId);
      if (i >= 0) this.parked.splice(i, 1);
    }
    this.clearCurrent(fence, fence.eventId);
    // a freed slot goes to a turn waiting for a worker first, then to the queue
    this.dispatchParked();
    this.opts.onCapacity?.();
  }

  private clearCurrent(key: ActorKey, eventId: string): void {
    const c = this.directory.get(key);
    if (c?.current?.eventId === eventId) c.current = undefined;
  }

  /**
   * A reply about a delivery this process is not running costs a transaction to judge: within the
   * worker's budget it is judged, beyond it refused at once (`unknown_delivery`). False: refused.
   */
  private admitReply(workerId: string, ref: WireTurnRef): boolean {
    const known = this.inFlight.get(ref.event_id);
    if ((known && known.fence.deliveryId === ref.delivery_id) || this.takeUnknownReplyToken(workerId)) return true;
    this.metrics.rejected('unknown_delivery');
    this.track(
      this.reply(workerId, { v: 1, type: 'turn_rejected', turn_ref: ref, reason: 'unknown_delivery', detail: 'not dispatched by this daemon' }),
      { workerId },
    );
    return false;
  }

  /** Runs a fenced operation on the actor's controller; a fence rejection is answered to the worker. */
  private fenced(workerId: string, ref: WireTurnRef, op: string, fn: (f: Fence) => Promise<unknown>): void {
    if (!this.admitReply(workerId, ref)) return;
    const fence = fromWire(ref);
    this.track(
      this.directory.wake(fence).run(() => this.judged(workerId, ref, op, () => fn(fence))),
      { ...fenceFields(fence), workerId, op },
    );
  }

  /** Runs `fn` with the database retry; a fence rejection is answered to the worker. */
  private async judged(workerId: string, ref: WireTurnRef, op: string, fn: () => Promise<unknown>): Promise<void> {
    const fence = fromWire(ref);
    try {
      await this.withDatabaseRetry(fn, { ...fenceFields(fence), workerId, op });
    } catch (e) {
      if (!(e instanceof FenceRejected)) throw e;
      this.metrics.rejected(e.reason);
      this.log.warn({ ...fenceFields(fence), workerId, op, reason: e.reason }, 'fence rejected');
      await this.reply(workerId, { v: 1, type: 'turn_rejected', turn_ref: ref, reason: e.reason });
    }
  }

  /**
   * turn_accepted is written lazily: it waits until the end of this round of socket reads, and
   * is dropped when its turn's result (or error) arrives first, since the delivery then goes
   * straight to its end state. An accept changes no decision (every check treats the live
   * delivery states alike), so it does not queue on the actor's controller ahead of the result.
   */
  private acceptLater(workerId: string, ref: WireTurnRef): void {
    if (!this.admitReply(workerId, ref)) return;
    this.pendingAccepts.set(ref.delivery_id, { workerId, ref });
    if (this.acceptsScheduled) return;
    this.acceptsScheduled = true;
    setImmediate(() => {
      this.acceptsScheduled = false;
      const accepts = [...this.pendingAccepts.values()];
      this.pendingAccepts.clear();
      for (const { workerId: w, ref: r } of accepts) {
        const fence = fromWire(r);
        this.track(
          this.judged(w, r, 'accept', () => this.replies.submit({ kind: 'accept', fence, workerId: w })),
          { ...fenceFields(fence), workerId: w, op: 'accept' },
        );
      }
    });
  }

  /** The turn's result or error arrived: its accept, if not yet written, need not be. */
  private dropAccept(deliveryId: string): void {
    this.pendingAccepts.delete(deliveryId);
    this.replies.withdraw((r) => r.kind === 'accept' && r.fence.deliveryId === deliveryId, { outcome: 'accepted' });
  }

  /**
   * Runs `fn`, retrying with jittered backoff while the database is unreachable (a restart, a
   * network blip): a worker's result must not be dropped because PostgreSQL was away for a while.
   * The fence decides afterwards whether the result still counts.
   */
  private async withDatabaseRetry<T>(fn: () => Promise<T>, fields: Record<string, unknown>): Promise<T> {
    const deadline = this.opts.clock.nowMs() + DATABASE_RETRY_MS;
    for (let attempt = 1; ; attempt++) {
      try {
        return await fn();
      } catch (e) {
        if (!isConnectionError(e) || this.opts.clock.nowMs() > deadline || this.stopping) throw e;
        const delay = backoffDelayMs(attempt, { baseMs: 100, maxMs: 5_000 });
        this.log.warn({ ...fields, err: errorMessage(e), retryInMs: delay }, 'database unavailable; retrying');
        await this.opts.clock.sleep(delay);
      }
    }
  }

  /** Stops retrying database work (shutdown). */
  stop(): void {
    this.stopping = true;
    this.parkedRetry?.cancel();
    this.parkedRetry = null;
  }

  private async reply(workerId: string, msg: DaemonMessage): Promise<void> {
    const res = await this.opts.transport.send(workerId, msg);
    if (!res.ok) this.log.debug({ workerId, type: msg.type, reason: res.reason }, 'reply not delivered');
  }

  /**
   * A committed control change (steer or cancel) for a turn. Only the daemon that dispatched the
   * turn holds its worker connection; the others ignore it.
   */
  handleControl(msg: ControlMessage): void {
    const f = this.inFlight.get(msg.fence.eventId);
    if (!f || f.fence.deliveryId !== msg.fence.deliveryId) return;
    const controller = this.directory.wake(msg.fence);
    this.track(
      controller.run(async () => {
        const current = this.inFlight.get(msg.fence.eventId);
        if (!current || current.fence.deliveryId !== msg.fence.deliveryId) return;
        const workerId = current.workerId;
        if (msg.kind === 'steer') {
          if (msg.fence.revision > current.fence.revision) current.fence = msg.fence;
          if (workerId) await this.reply(workerId, { v: 1, type: 'turn_steer', turn_ref: toWire(current.fence), input: msg.input as never });
          this.log.info({ ...fenceFields(current.fence), workerId }, 'turn steered');
        } else {
          if (workerId) await this.reply(workerId, { v: 1, type: 'turn_cancel', turn_ref: toWire(current.fence), reason: msg.reason });
          this.log.info({ ...fenceFields(current.fence), workerId }, 'turn cancelled');
          this.settle(current.fence, 'cancelled');
        }
      }),
      fenceFields(msg.fence),
    );
  }

  private track(p: Promise<unknown>, fields: Record<string, unknown>): void {
    const tracked = p.catch((e: unknown) => {
      const err = toError(e);
      if (isConnectionError(err)) this.log.warn({ ...fields, err: errorMessage(err) }, 'database unavailable; will recover');
      else this.log.error({ ...fields, err }, 'runtime operation failed');
    });
    this.background.add(tracked);
    void tracked.finally(() => this.background.delete(tracked));
  }
}
