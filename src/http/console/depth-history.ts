/**
 * The queue's depth over the last hour, for the overview's chart: the database keeps no history
 * of it, so the console samples it, once a minute while the server runs (the queue's depth is one
 * statement on pg-boss's index of live jobs). A daemon that started less than an hour ago shows
 * what it has seen. `tick()` takes one sample (concurrent calls share it); a failed sample is
 * logged and skipped, never thrown from the timer.
 */
import { systemClock, type Clock, type TimerHandle } from '../../base/clock.ts';
import { toError } from '../../base/errors.ts';
import type { Logger } from '../../base/logger.ts';
import type { Db } from '../../db/client.ts';
import { queueDepth, type Queues } from '../../db/boss/jobs.ts';

export interface DepthSample {
  at: Date;
  /** Ready, deferred, retrying and active events. */
  depth: number;
}

export const SAMPLE_EVERY_MS = 60_000;
/** An hour of samples. */
const KEPT = 60;

export class DepthHistory {
  private readonly samples: DepthSample[] = [];
  private sampling: Promise<void> | undefined;
  private timer: TimerHandle | undefined;
  private readonly deps: { db: Db; queues: Queues; log: Logger; clock: Clock };

  constructor(deps: { db: Db; queues: Queues; log: Logger; clock?: Clock }) {
    this.deps = { ...deps, clock: deps.clock ?? systemClock };
  }

  /** Samples now, then every minute; idempotent. */
  start(): void {
    if (this.timer) return;
    void this.tick();
    this.timer = this.deps.clock.setInterval(() => void this.tick(), SAMPLE_EVERY_MS);
  }

  stop(): void {
    this.timer?.cancel();
    this.timer = undefined;
  }

  tick(): Promise<void> {
    this.sampling ??= (async () => {
      try {
        const d = await queueDepth(this.deps.db, this.deps.queues);
        this.samples.push({ at: new Date(this.deps.clock.nowMs()), depth: d.ready + d.deferred + d.retrying + d.active });
        if (this.samples.length > KEPT) this.samples.shift();
      } catch (e) {
        this.deps.log.warn({ err: toError(e) }, 'could not sample the queue depth (console overview)');
      } finally {
        this.sampling = undefined;
      }
    })();
    return this.sampling;
  }

  /** The samples, oldest first. */
  values(): readonly DepthSample[] {
    return this.samples;
  }
}
