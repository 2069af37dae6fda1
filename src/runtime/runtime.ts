/**
 * The Runtime: the event path's parts, wired together, and the router from the broker to them.
 *
 *   broker event ─┬─ worker_ready / heartbeat / worker_gone → WorkerRegistry (+ Dispatcher)
 *                 └─ turn_accepted / progress / result / error → ReplyPipeline (group commit)
 *   fetched jobs ─── Dispatcher (slots, group begin, turn_start, parking, redirects)
 *   control NOTIFY ─ Dispatcher (steer / cancel of a turn it dispatched)
 *
 * Invariants:
 *  1. (I5) The runtime never touches the socket: it sends through `Transport`, the broker's
 *     serial send queue. The broker never touches the database.
 *  2. `handleBrokerEvent` only schedules work (it is called from the broker's receive loop).
 *  3. Per actor, operations run one at a time through the actor's SessionController, which owns
 *     the actor's in-flight turn in this process.
 */
import type { Clock } from '../clock.ts';
import type { Db } from '../db/client.ts';
import type { ControlMessage } from '../db/control.ts';
import type { BrokerEvent } from '../fabric/broker.ts';
import type { Logger } from '../logger.ts';
import { BackgroundWork } from './background.ts';
import { databaseRetry } from './db-retry.ts';
import { ActorDirectory } from './directory.ts';
import { Dispatcher } from './dispatcher.ts';
import { noopMetrics, type RuntimeMetrics } from './metrics.ts';
import { ReplyPipeline } from './reply-pipeline.ts';
import type { Transport } from './transport.ts';
import type { FetchedJob, TurnStore } from './turns.ts';
import { WorkerRegistry } from './worker-registry.ts';

export type { Transport };

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
  /** Largest emitted event payload (CORRAL_MAX_EVENT_BYTES). */
  maxEventBytes?: number;
}

export class Runtime {
  readonly directory: ActorDirectory;
  readonly workers: WorkerRegistry;
  readonly dispatcher: Dispatcher;
  readonly replies: ReplyPipeline;
  private readonly background: BackgroundWork;
  private readonly log: Logger;
  private readonly metrics: RuntimeMetrics;
  private stopping = false;

  constructor(opts: RuntimeOptions) {
    this.log = opts.logger.child({ component: 'runtime' });
    this.metrics = opts.metrics ?? noopMetrics;
    this.background = new BackgroundWork(this.log);
    const retry = databaseRetry({ clock: opts.clock, log: this.log, stopping: () => this.stopping });
    this.directory = new ActorDirectory({ clock: opts.clock, onError: (e) => this.log.error({ err: e }, 'directory') });
    this.workers = new WorkerRegistry({
      db: opts.db,
      ownerId: opts.ownerId,
      clock: opts.clock,
      logger: opts.logger,
      background: this.background,
      staleMs: opts.workerStaleMs,
      ...(opts.transport.forget ? { forgetSession: (id: string) => opts.transport.forget?.(id) } : {}),
    });
    const parts = {
      store: opts.store,
      transport: opts.transport,
      workers: this.workers,
      directory: this.directory,
      background: this.background,
      retry,
      clock: opts.clock,
      logger: opts.logger,
      metrics: this.metrics,
    };
    this.dispatcher = new Dispatcher({
      ...parts,
      ...(opts.onCapacity ? { onCapacity: opts.onCapacity } : {}),
    });
    this.replies = new ReplyPipeline({
      ...parts,
      dispatcher: this.dispatcher,
      ...(opts.maxEventBytes === undefined ? {} : { maxEventBytes: opts.maxEventBytes }),
    });
  }

  /** Called synchronously from the broker's receive loop: schedules, never awaits. */
  handleBrokerEvent(e: BrokerEvent): void {
    switch (e.kind) {
      case 'worker_ready':
        this.background.track(this.onWorkerReady(e.workerId, e.capacity, e.instance), { workerId: e.workerId });
        return;
      case 'worker_heartbeat':
        this.workers.heartbeat(e.workerId, e.inFlight);
        return;
      case 'turn_accepted':
        this.replies.accepted(e.workerId, e.turnRef);
        return;
      case 'turn_progress':
        this.replies.progress(e.workerId, e.turnRef);
        return;
      case 'turn_result':
        this.replies.result(e);
        return;
      case 'turn_error':
        this.replies.error(e);
        return;
      case 'invalid':
        this.metrics.invalidMessage();
        return;
      case 'worker_gone':
        this.onWorkerGone(e.workerId, e.reason);
        return;
    }
  }

  /** A committed steer or cancel (control NOTIFY). */
  handleControl(msg: ControlMessage): void {
    this.dispatcher.applyControl(msg);
  }

  /** Fetched jobs from the queue consumer. */
  dispatchJobs(jobs: FetchedJob[]): void {
    this.dispatcher.dispatchJobs(jobs);
  }

  fetchCapacity(): number {
    return this.dispatcher.fetchCapacity();
  }

  inFlightCount(): number {
    return this.dispatcher.inFlightCount();
  }

  private async onWorkerReady(workerId: string, capacity: number, instance?: string): Promise<void> {
    const { restarted, lostEvents } = await this.workers.register(workerId, capacity, instance);
    this.log.info({ workerId, capacity, restarted }, 'worker ready');
    // A worker process that restarted lost what it was running: those turns go elsewhere now
    // instead of waiting for their leases to run out. (A reconnect of the same run keeps them.)
    this.dispatcher.workerReady(lostEvents);
  }

  /** The broker dropped the worker (revoked): nothing more goes to it; its turns go elsewhere now. */
  private onWorkerGone(workerId: string, reason: string): void {
    const events = this.workers.forget(workerId);
    this.log.warn({ workerId, reason, inFlight: events.length }, 'worker gone');
    for (const eventId of events) this.dispatcher.reassign(eventId, `worker ${workerId} gone: ${reason}`);
  }

  /** Waits for scheduled background work (tests, shutdown). */
  async drain(): Promise<void> {
    await this.background.drain();
  }

  /** Stops retrying database work and parked turns (shutdown). */
  stop(): void {
    this.stopping = true;
    this.dispatcher.stop();
    this.directory.stop();
  }
}
