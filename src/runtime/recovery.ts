/**
 * Recovery: rebuilds the runtime projections from the durable layer. At daemon start and then
 * periodically it
 *  - fails in-flight activations whose lease expired (their owner died; the watchdog's rule),
 *  - repairs turns left `started` whose delivery is no longer live or is gone: the turn is failed
 *    and, if its job attempt is still active, the attempt is failed so the event is retried
 *    under a new epoch,
 *  - marks worker rows whose heartbeats stopped as stale.
 */
import type { Clock } from '../clock.ts';
import { toError } from '../errors.ts';
import type { Logger } from '../logger.ts';
import type { Db } from '../db/client.ts';
import * as transcript from '../db/transcript.ts';
import * as activations from '../db/activations.ts';
import type { TurnStore } from './turns.ts';

export interface RecoveryOptions {
  db: Db;
  store: TurnStore;
  clock: Clock;
  logger: Logger;
  intervalMs: number;
}

export interface RecoveryReport {
  expiredActivations: number;
  repairedTurns: number;
  retriedEvents: number;
}

export class Recovery {
  private readonly opts: RecoveryOptions;
  private readonly log: Logger;
  private running: Promise<RecoveryReport> | undefined;

  constructor(opts: RecoveryOptions) {
    this.opts = opts;
    this.log = opts.logger.child({ component: 'recovery' });
  }

  tick(): Promise<RecoveryReport> {
    this.running ??= this.pass().finally(() => {
      this.running = undefined;
    });
    return this.running;
  }

  async run(signal: AbortSignal): Promise<void> {
    while (!signal.aborted) {
      await this.opts.clock.sleep(this.opts.intervalMs, signal).catch(() => undefined);
      if (signal.aborted) break;
      try {
        await this.tick();
      } catch (e) {
        this.log.warn({ err: toError(e).message }, 'recovery pass failed');
      }
    }
  }

  private async pass(): Promise<RecoveryReport> {
    const report: RecoveryReport = { expiredActivations: 0, repairedTurns: 0, retriedEvents: 0 };
    for (const a of await activations.listExpiredInFlight(this.opts.db, 1000)) {
      if (await this.opts.store.expire(a.activationUid)) report.expiredActivations++;
    }
    for (const turn of await transcript.orphanedStartedTurns(this.opts.db, 1000)) {
      const outcome = await this.opts.store.repairOrphanTurn(turn);
      if (!outcome) continue;
      report.repairedTurns++;
      if (outcome.jobFailed) report.retriedEvents++;
    }
    if (report.expiredActivations + report.repairedTurns > 0) this.log.info(report, 'recovery repaired runtime state');
    return report;
  }
}
