/**
 * The queue consumer: one loop that fetches actor events in batches and hands them to the runtime,
 * which routes each to its actor's controller. No polling loop per actor.
 *
 * It fetches only as many jobs as there are free worker slots (backpressure stays in the queue),
 * with corral's claim of key heads (src/db/boss/fetch.ts: pg-boss's key_strict_fifo claim at a
 * cost that follows the batch, not the backlog),
 * wakes on LISTEN/NOTIFY when an event is enqueued (pg-boss notifies for queues created with
 * `notify: true`; its channel is S9 of src/db/boss/internals.ts), when capacity frees up, and
 * otherwise polls slowly for delayed retries.
 */
import type { PgBoss } from 'pg-boss';
import { backoffDelayMs } from '../base/backoff.ts';
import { bossNotifyChannel, notifiesQueue } from '../db/boss/internals.ts';
import type { Clock } from '../base/clock.ts';
import { errorMessage, toError } from '../base/errors.ts';
import type { Logger } from '../base/logger.ts';
import type { ActorEventJobData } from './event-job.ts';
import { DUE_CHANNEL, type BatchMember } from '../db/turns/batches.ts';

/**
 * How long capacity wake-ups gather before one fetch (see `wakeForCapacity`). Slots now free one
 * by one as results arrive, so a short wait refills them sooner: 1 ms beat 5 ms in three paired
 * runs of `npm run bench` (corral / raw +4 % on average, CPU per turn unchanged).
 */
const CAPACITY_COALESCE_MS = 1;

/** Due wake-ups: their granularity, a little slack past the due time, and how many may wait at once. */
const DUE_WAKE_SLOT_MS = 10;
const DUE_WAKE_SLACK_MS = 5;
const MAX_DUE_TIMERS = 10_000;
/** Farther than an hour (the longest debounce): the poll finds it. */
const MAX_DUE_WAKE_MS = 3_600_000;

export interface ConsumedJob {
  id: string;
  retryCount: number;
  data: ActorEventJobData;
  /** The events after this one its turn takes, in order (src/db/turns/batches.ts); absent for one event. */
  batch?: BatchMember[];
  /** Its actor had another event queued behind it (src/db/boss/fetch.ts): its next turn may be claimed in this one's commit. */
  more?: boolean;
}

export interface ConsumerOptions {
  /** For LISTEN on pg-boss's channel. */
  boss: PgBoss;
  /** Claims up to `limit` key heads of the actor queue (src/db/boss/fetch.ts). */
  fetch: (limit: number) => Promise<ConsumedJob[]>;
  queueName: string;
  bossSchema: string;
  clock: Clock;
  logger: Logger;
  pollIntervalMs: number;
  batchSize: number;
  /** How many jobs may be taken now. */
  capacity: () => number;
  /** Receives fetched jobs; must not throw or block. */
  onJobs: (jobs: ConsumedJob[]) => void;
}

export class QueueConsumer {
  private readonly opts: ConsumerOptions;
  private readonly log: Logger;
  private wakeUp: (() => void) | undefined;
  private woken = false;
  private failures = 0;
  fetched = 0;
  /**
   * The last fetch took as many jobs as it asked for: other actors' events may be waiting for a
   * slot. (A busy actor's next turn then goes through the queue, not its commit: N4 of
   * src/runtime/turn-commit.ts.)
   */
  backlogged = false;

  constructor(opts: ConsumerOptions) {
    this.opts = opts;
    this.log = opts.logger.child({ component: 'consumer', queue: opts.queueName });
  }

  /** Asks the loop to fetch now (a new event was enqueued). */
  wake(): void {
    this.woken = true;
    this.wakeUp?.();
  }

  private capacityTimer: { cancel(): void } | undefined;

  /**
   * Capacity freed up (a turn settled). Under load turns settle one after another; waking for
   * each would fetch one or two jobs at a time, so wake-ups within a few milliseconds coalesce
   * into one batch fetch.
   */
  wakeForCapacity(): void {
    if (this.capacityTimer) return;
    this.capacityTimer = this.opts.clock.setTimeout(() => {
      this.capacityTimer = undefined;
      this.wake();
    }, CAPACITY_COALESCE_MS);
  }

  /** One fetch round. Returns how many jobs were taken. */
  async tick(): Promise<number> {
    const capacity = Math.min(this.opts.capacity(), this.opts.batchSize);
    if (capacity <= 0) return 0;
    const jobs = await this.opts.fetch(capacity);
    if (jobs.length > 0) {
      this.fetched += jobs.length;
      this.opts.onJobs(jobs);
    }
    return jobs.length;
  }

  /** Runs until `signal` aborts. Database errors are logged and retried with backoff. */
  async run(signal: AbortSignal): Promise<void> {
    const listener = await this.listen();
    try {
      while (!signal.aborted) {
        this.woken = false;
        let taken = 0;
        let asked = 0;
        try {
          asked = Math.min(this.opts.capacity(), this.opts.batchSize);
          taken = await this.tick();
          if (asked > 0) this.backlogged = taken >= asked;
          if (this.failures > 0) this.log.info({ after: this.failures }, 'queue reachable again');
          this.failures = 0;
        } catch (e) {
          this.failures++;
          const delay = backoffDelayMs(this.failures, { baseMs: 200, maxMs: 10_000 });
          this.log.warn({ err: errorMessage(e), retryInMs: delay }, 'fetch failed');
          await this.pause(delay, signal);
          continue;
        }
        if (taken > 0 && taken >= asked) continue; // a full batch: more may be waiting
        if (!this.woken) await this.pause(this.opts.pollIntervalMs, signal);
      }
    } finally {
      this.capacityTimer?.cancel();
      this.capacityTimer = undefined;
      await listener?.close().catch(() => undefined);
    }
  }

  private async listen(): Promise<{ close(): Promise<void> } | undefined> {
    const db = this.opts.boss.getDb();
    if (typeof db.listen !== 'function') return undefined;
    try {
      const jobs = await db.listen(
        bossNotifyChannel(this.opts.bossSchema),
        (payload) => {
          if (notifiesQueue(payload, this.opts.queueName)) this.wake();
        },
        () => this.wake(),
      );
      // a debounced send says when its batch is due (B5 of src/db/turns/batches.ts)
      const due = await db
        .listen(
          DUE_CHANNEL,
          (payload) => this.wakeIn(Number(payload)),
          () => this.wake(),
        )
        .catch(() => undefined);
      return {
        close: async () => {
          for (const t of this.dueTimers.values()) t.cancel();
          this.dueTimers.clear();
          await Promise.all([jobs.close(), due?.close()]);
        },
      };
    } catch (e) {
      this.log.warn({ err: toError(e).message }, 'LISTEN unavailable; polling only');
      return undefined;
    }
  }

  /** Wake-ups asked for by debounced sends, by the 10 ms slot they fall in (so many sends share one). */
  private readonly dueTimers = new Map<number, { cancel(): void }>();

  /** Wakes the loop `ms` from now (a debounced batch falls due); a wait beyond the longest debounce is left to the poll. */
  private wakeIn(ms: number): void {
    if (!Number.isFinite(ms) || ms < 0 || ms > MAX_DUE_WAKE_MS) return;
    const at = this.opts.clock.nowMs() + ms + DUE_WAKE_SLACK_MS;
    const slot = Math.ceil(at / DUE_WAKE_SLOT_MS);
    if (this.dueTimers.has(slot) || this.dueTimers.size >= MAX_DUE_TIMERS) return;
    const timer = this.opts.clock.setTimeout(
      () => {
        this.dueTimers.delete(slot);
        this.wake();
      },
      slot * DUE_WAKE_SLOT_MS - this.opts.clock.nowMs(),
    );
    this.dueTimers.set(slot, timer);
  }

  private async pause(ms: number, signal: AbortSignal): Promise<void> {
    if (this.woken || signal.aborted) return;
    const ctl = new AbortController();
    const onAbort = () => ctl.abort();
    signal.addEventListener('abort', onAbort, { once: true });
    this.wakeUp = () => ctl.abort();
    try {
      await this.opts.clock.sleep(ms, ctl.signal);
    } catch {
      // woken or aborted
    } finally {
      this.wakeUp = undefined;
      signal.removeEventListener('abort', onAbort);
    }
  }
}
