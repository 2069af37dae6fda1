/**
 * Recovery: rebuilds the runtime projections from the durable layer. At daemon start and then
 * periodically it
 *  - fails in-flight activations whose lease expired (their owner died; the watchdog's rule),
 *  - repairs turns left `started` whose delivery is no longer live or is gone: the turn is failed
 *    and, if its job attempt is still active, the attempt is failed so the event is retried
 *    under a new epoch,
 *  - settles the dead letters pg-boss made by itself (a job whose holder went silent, failed by
 *    its own supervision with no retry left), as corral settles its own: the actor moves on (or
 *    is blocked, in dead-letter mode `block`) and watchers hear `dead_lettered`.
 * Stale workers are the watchdog's (src/runtime/watchdog.ts), not recovery's.
 */
import type { Clock } from '../base/clock.ts';
import type { Logger } from '../base/logger.ts';
import type { Db } from '../db/client.ts';
import * as transcript from '../db/turns/transcript.ts';
import * as activations from '../db/turns/activations.ts';
import { unsettledFailedJobs } from '../db/boss/jobs.ts';
import type { JobTable } from '../db/turns/fence.ts';
import type { AttemptFailures } from './attempt-failure.ts';
import { Periodic } from './periodic.ts';

export interface RecoveryOptions {
  db: Db;
  failures: Pick<AttemptFailures, 'expire' | 'repairOrphanTurn' | 'adoptDeadLetter'>;
  /** Where the events' jobs are. */
  jobs: JobTable;
  clock: Clock;
  logger: Logger;
  intervalMs: number;
}

export interface RecoveryReport {
  expiredActivations: number;
  repairedTurns: number;
  retriedEvents: number;
  /** Dead letters pg-boss made by itself, settled here. */
  adoptedDeadLetters: number;
}

export class Recovery {
  private readonly opts: RecoveryOptions;
  private readonly log: Logger;
  private readonly periodic: Periodic<RecoveryReport>;

  constructor(opts: RecoveryOptions) {
    this.opts = opts;
    this.log = opts.logger.child({ component: 'recovery' });
    this.periodic = new Periodic(() => this.pass(), {
      clock: opts.clock,
      log: this.log,
      intervalMs: opts.intervalMs,
      what: 'recovery',
      firstPass: 'after-interval',
    });
  }

  /** One pass (the daemon runs one at start). Concurrent calls share the pass in progress. */
  tick(): Promise<RecoveryReport> {
    return this.periodic.tick();
  }

  run(signal: AbortSignal): Promise<void> {
    return this.periodic.run(signal);
  }

  private async pass(): Promise<RecoveryReport> {
    const report: RecoveryReport = { expiredActivations: 0, repairedTurns: 0, retriedEvents: 0, adoptedDeadLetters: 0 };
    for (const a of await activations.listExpiredInFlight(this.opts.db, 1000)) {
      if (await this.opts.failures.expire(a.activationUid)) report.expiredActivations++;
    }
    for (const turn of await transcript.orphanedStartedTurns(this.opts.db, 1000)) {
      const outcome = await this.opts.failures.repairOrphanTurn(turn);
      if (!outcome) continue;
      report.repairedTurns++;
      if (outcome.jobFailed) report.retriedEvents++;
    }
    const { jobs } = this.opts;
    for (const failed of await unsettledFailedJobs(this.opts.db, jobs.schema, jobs.queue, 1000)) {
      if (!(await this.opts.failures.adoptDeadLetter(failed))) continue;
      report.adoptedDeadLetters++;
      this.log.warn(
        { actor: `${failed.actor.agentUid}/${failed.actor.sessionId}`, eventId: failed.id, attempt: failed.retryCount + 1 },
        'the queue dead-lettered an event by itself; settled it as a dead letter',
      );
    }
    if (report.expiredActivations + report.repairedTurns + report.adoptedDeadLetters > 0)
      this.log.info(report, 'recovery repaired runtime state');
    return report;
  }
}
