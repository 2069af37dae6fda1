/**
 * Keeps the pg-boss jobs of this daemon's in-flight turns alive: pg-boss fails an active job
 * that nobody touched for `jobHeartbeatSeconds` (that is how a job whose daemon died before
 * writing an activation gets retried). Touching three times per period leaves room for a slow
 * database; a stalled daemon stops touching and its jobs are retried elsewhere.
 */
import type { PgBoss } from 'pg-boss';
import type { Clock } from '../base/clock.ts';
import type { Logger } from '../base/logger.ts';
import type { Dispatcher } from './dispatcher.ts';
import { Periodic } from './periodic.ts';

export interface JobKeeperOptions {
  boss: PgBoss;
  /** The actor queue. */
  queueName: string;
  dispatcher: Pick<Dispatcher, 'inFlightAttempts'>;
  clock: Clock;
  logger: Logger;
  jobHeartbeatSeconds: number;
}

export class JobKeeper {
  private readonly log: Logger;
  private readonly opts: JobKeeperOptions;

  constructor(opts: JobKeeperOptions) {
    this.opts = opts;
    this.log = opts.logger.child({ component: 'job-keeper' });
  }

  get intervalMs(): number {
    return Math.floor((this.opts.jobHeartbeatSeconds * 1000) / 3);
  }

  /** Touches every in-flight job once. Returns how many. */
  async tick(): Promise<number> {
    const attempts = this.opts.dispatcher.inFlightAttempts();
    if (attempts.length > 0) await this.opts.boss.touch(this.opts.queueName, attempts);
    return attempts.length;
  }

  run(signal: AbortSignal): Promise<void> {
    return new Periodic(() => this.tick(), {
      clock: this.opts.clock,
      log: this.log,
      intervalMs: this.intervalMs,
      what: 'job heartbeat',
      firstPass: 'after-interval',
    }).run(signal);
  }
}
