/**
 * The watchdog: fails in-flight activations whose lease expired (their event is retried under a
 * higher epoch) and turns past the maximum turn duration, stops warm activations idle past the idle timeout, and takes stale workers out
 * of dispatch, re-dispatching the turns they never accepted.
 *
 * `tick()` does one pass and is what tests call; `run()` repeats it on the injected clock.
 * Leases are judged by PostgreSQL's clock, in SQL, never by this process's clock.
 */
import type { Clock } from '../base/clock.ts';
import type { Logger } from '../base/logger.ts';
import type { Db } from '../db/client.ts';
import * as activations from '../db/turns/activations.ts';
import * as deliveries from '../db/turns/deliveries.ts';
import * as workersDb from '../db/operations/workers.ts';
import { pruneDaemons } from '../db/operations/daemons.ts';
import type { Dispatcher } from './dispatcher.ts';
import type { AttemptFailures } from './attempt-failure.ts';
import type { WorkerRegistry } from './worker-registry.ts';
import { Periodic } from './periodic.ts';

/** Idle activations stopped per statement, and statements per watchdog pass. */
const IDLE_STOP_BATCH = 2_000;
const IDLE_STOP_ROUNDS = 10;
/** How often old rows are deleted from `corral.workers`. */
const WORKER_PRUNE_INTERVAL_MS = 60_000;

export interface WatchdogOptions {
  db: Db;
  failures: Pick<AttemptFailures, 'expire'>;
  dispatcher: Dispatcher;
  /** Absent: another runtime's watchdog takes stale workers out (runtimes sharing workers: src/runtime/shard-router.ts). */
  workers?: WorkerRegistry;
  /** The turns a stale worker never accepted, sent elsewhere; default: this runtime's. Returns how many. */
  redispatchStale?: (workerId: string) => Promise<number>;
  clock: Clock;
  logger: Logger;
  intervalMs: number;
  idleTimeoutMs: number;
  /** Turns running longer than this are failed even while their lease is renewed. Default: off. */
  maxTurnMs?: number;
}

export interface WatchdogReport {
  expired: number;
  deadLettered: number;
  stoppedIdle: number;
  staleWorkers: string[];
  redispatched: number;
  /** Turns failed for running longer than `maxTurnMs`. */
  overdue: number;
}

export class Watchdog {
  private readonly opts: WatchdogOptions;
  private readonly log: Logger;
  private readonly periodic: Periodic<WatchdogReport>;
  private lastPruneMs = 0;

  constructor(opts: WatchdogOptions) {
    this.opts = opts;
    this.log = opts.logger.child({ component: 'watchdog' });
    this.periodic = new Periodic(() => this.pass(), {
      clock: opts.clock,
      log: this.log,
      intervalMs: opts.intervalMs,
      what: 'watchdog',
      firstPass: 'now',
    });
  }

  /** This watchdog takes stale workers out of `workers` too (the one watchdog of runtimes sharing them). */
  takeWorkers(workers: WorkerRegistry, redispatch: (workerId: string) => Promise<number>): void {
    this.opts.workers = workers;
    this.opts.redispatchStale = redispatch;
  }

  /** One pass. Concurrent calls share the pass in progress (no re-entry). */
  tick(): Promise<WatchdogReport> {
    return this.periodic.tick();
  }

  run(signal: AbortSignal): Promise<void> {
    return this.periodic.run(signal);
  }

  private async pass(): Promise<WatchdogReport> {
    const report: WatchdogReport = { expired: 0, deadLettered: 0, stoppedIdle: 0, staleWorkers: [], redispatched: 0, overdue: 0 };
    const { db, failures, dispatcher, workers } = this.opts;

    for (const a of await activations.listExpiredInFlight(db)) {
      const outcome = await failures.expire(a.activationUid);
      if (!outcome || a.currentEventId === null) continue;
      report.expired++;
      if (outcome.deadLettered) report.deadLettered++;
      dispatcher.attemptFailed({ ...a, eventId: a.currentEventId }, outcome, 'lease expired', true);
    }

    if (this.opts.maxTurnMs !== undefined) report.overdue = await dispatcher.failOverdueTurns(this.opts.maxTurnMs);

    for (const stale of (await workers?.takeStale()) ?? []) {
      report.staleWorkers.push(stale.id);
      this.log.warn({ workerId: stale.id, inFlight: stale.events.length }, 'worker stale: no heartbeat');
      report.redispatched += await (this.opts.redispatchStale ?? ((id) => redispatchUnaccepted(db, dispatcher, id)))(stale.id);
    }

    const now = this.opts.clock.nowMs();
    if (now - this.lastPruneMs >= WORKER_PRUNE_INTERVAL_MS) {
      this.lastPruneMs = now;
      const pruned = await workersDb.pruneWorkers(db, { goneAfterSeconds: 600, deadAfterSeconds: 3600 });
      if (pruned > 0) this.log.info({ pruned }, 'pruned old worker rows');
      const prunedDaemons = await pruneDaemons(db, { stoppedAfterSeconds: 3600, silentAfterSeconds: 86_400 });
      if (prunedDaemons > 0) this.log.info({ pruned: prunedDaemons }, 'pruned old daemon rows');
    }

    // Set-based: an idle timeout reached by many actors at once is a few statements, not one
    // transaction per actor; bounded per pass so a pass stays short.
    for (let i = 0; i < IDLE_STOP_ROUNDS; i++) {
      const stopped = await activations.stopIdleActivations(db, this.opts.idleTimeoutMs, IDLE_STOP_BATCH);
      report.stoppedIdle += stopped;
      if (stopped < IDLE_STOP_BATCH) break;
    }
    return report;
  }
}

/** A stale worker's turns it never accepted, in `db`, sent to other workers by `dispatcher`. */
export async function redispatchUnaccepted(db: Db, dispatcher: Dispatcher, workerId: string): Promise<number> {
  const unaccepted = await deliveries.unacceptedDeliveriesOf(db, workerId);
  for (const d of unaccepted) dispatcher.reassign(d.eventId, `worker ${workerId} stale`);
  return unaccepted.length;
}
