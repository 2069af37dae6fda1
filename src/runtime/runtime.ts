/**
 * The Runtime: the event path's parts, wired together, and the router from the broker to them.
 *
 *   broker event ─┬─ worker_ready / heartbeat / worker_gone → WorkerRegistry (+ Dispatcher)
 *                 ├─ turn_accepted / progress / result / error → ReplyPipeline (group commit)
 *                 └─ rpc_request → RpcServer (bounded, off the broker loop)
 *   fetched jobs ─── Dispatcher (slots, group begin, turn_start, parking, redirects)
 *   control NOTIFY ─ Dispatcher (steer / cancel of a turn it dispatched)
 *
 * The steps' transactions, one file each: the begin (turn-begin.ts), the commit
 * (turn-commit.ts), the attempt failure (attempt-failure.ts). The runtime builds them from the
 * resolved configuration; the daemon composes the runtime with the broker, the queue consumer
 * and the periodic components (watchdog, recovery, job keeper).
 *
 * Invariants:
 *  1. (I5) The runtime never touches the socket: it sends through `Transport`, the broker's
 *     serial send queue. The broker never touches the database.
 *  2. `handleBrokerEvent` only schedules work (it is called from the broker's receive loop).
 *  3. Per actor, operations run one at a time through the actor's SessionController, which owns
 *     the actor's in-flight turn in this process.
 */
import type { TurnTracer } from '../base/turn-tracer.ts';
import type { PgBoss } from 'pg-boss';
import type { Clock } from '../base/clock.ts';
import { contextLimits, type Config } from '../config.ts';
import type { Db } from '../db/client.ts';
import type { Queues } from '../db/boss/jobs.ts';
import type { ControlMessage } from '../db/turns/control.ts';
import type { BrokerEvent } from '../fabric/broker.ts';
import { PROTOCOL_VERSION } from '../fabric/protocol.ts';
import type { Logger } from '../base/logger.ts';
import { BackgroundWork } from './background.ts';
import { databaseRetry } from '../base/db-retry.ts';
import { fenceFields, fromWire, type WireTurnRef } from './fence.ts';
import { ActorDirectory } from './directory.ts';
import { Dispatcher } from './dispatcher.ts';
import { noopMetrics, type RuntimeMetrics } from './metrics.ts';
import { ReplyPipeline } from './reply-pipeline.ts';
import type { Transport } from './transport.ts';
import { AttemptFailures } from './attempt-failure.ts';
import { ContextCache } from './context-cache.ts';
import { RpcServer } from './rpc.ts';
import { SinkDirectory } from '../effects/deliver.ts';
import type { ShardPlace } from '../effects/emit.ts';
import { StreamRelay } from './stream-relay.ts';
import { TurnBeginner, type FetchedJob } from './turn-begin.ts';
import { TurnCommits } from './turn-commit.ts';
import { WorkerRegistry } from './worker-registry.ts';

export type { Transport };

/** The settings the runtime reads, as resolved once (src/config.ts). */
export type RuntimeConfig = Pick<
  Config,
  | 'leaseMs'
  | 'deadLetterMode'
  | 'maxEventBytes'
  | 'maxMessageBytes'
  | 'contextMessages'
  | 'contextBytes'
  | 'contextCacheBytes'
  | 'workerStaleMs'
  | 'workerInitialTurns'
  | 'rpcConcurrency'
  | 'rpcPerSecond'
  | 'rpcTimeoutMs'
  | 'progressIntervalMs'
  | 'streamChunkBytes'
  | 'streamTurnBytes'
  | 'streamBacklogBytes'
>;

export interface RuntimeOptions {
  db: Db;
  boss: PgBoss;
  /** pg-boss's schema and the actor queue (`queuesOf(config)`). */
  queues: Queues;
  config: RuntimeConfig;
  transport: Transport;
  clock: Clock;
  logger: Logger;
  ownerId: string;
  /** Called whenever capacity may have freed up (the consumer fetches again). */
  onCapacity?: () => void;
  metrics?: RuntimeMetrics;
  /** Spans of the turns (docs/observability.md); undefined: no tracing work at all. */
  tracer?: TurnTracer | undefined;
  /** Busy actors' next turns begin in their commits (N1 of turn-commit.ts); default true. */
  continueTurns?: boolean;
  /** Whether other actors' events may be waiting for a slot (the consumer's last fetch was full: N4 of turn-commit.ts). */
  queueBacklogged?: () => boolean;
  /** The workers, when several runtimes (one per shard a daemon serves) share them: src/runtime/shard-router.ts. */
  workers?: WorkerRegistry;
  /** The shard this runtime serves, of how many (absent: one shard). */
  place?: ShardPlace;
  /** A commit emitted to another shard's actor (the shard relay delivers it). */
  emittedElsewhere?: () => void;
}

export class Runtime {
  /** The contexts of the conversations this daemon ran lately (a begin checks them against the database). */
  readonly contexts: ContextCache;
  readonly failures: AttemptFailures;
  readonly begin: TurnBeginner;
  readonly commits: TurnCommits;
  /** Worker RPC (history.read, actor.status). */
  readonly rpc: RpcServer;
  readonly directory: ActorDirectory;
  readonly workers: WorkerRegistry;
  readonly dispatcher: Dispatcher;
  readonly replies: ReplyPipeline;
  /** Live turns: the chunks workers stream. */
  readonly stream: StreamRelay;
  private readonly background: BackgroundWork;
  private readonly transport: Transport;
  private readonly log: Logger;
  private readonly metrics: RuntimeMetrics;
  private stopping = false;

  constructor(opts: RuntimeOptions) {
    this.log = opts.logger.child({ component: 'runtime' });
    this.metrics = opts.metrics ?? noopMetrics;
    this.background = new BackgroundWork(this.log);
    this.transport = opts.transport;
    const retry = databaseRetry({ clock: opts.clock, log: this.log, stopping: () => this.stopping });
    const { config, db, boss } = opts;
    const jobs = { schema: opts.queues.schema, queue: opts.queues.events };
    const limits = contextLimits(config);
    const context = limits.maxMessages > 0 ? limits : undefined;
    this.contexts = new ContextCache(context ?? { maxMessages: 0, maxBytes: 0 }, context ? config.contextCacheBytes : 0);
    this.failures = new AttemptFailures({ db, boss, jobs, deadLetterMode: config.deadLetterMode });
    this.begin = new TurnBeginner({
      db,
      ownerId: opts.ownerId,
      leaseMs: config.leaseMs,
      jobs,
      failures: this.failures,
      context,
      contexts: this.contexts,
    });
    this.commits = new TurnCommits({
      db,
      boss,
      jobs,
      leaseMs: config.leaseMs,
      maxEventBytes: config.maxEventBytes,
      contexts: this.contexts,
      failures: this.failures,
      // a batch's events share a turn_start's room for one event (B1 of src/db/turns/batches.ts), as in the fetch
      continuations: { begin: this.begin, batchBytes: Math.floor(config.maxMessageBytes / 2) },
      ...(opts.place ? { place: opts.place } : {}),
      ...(opts.emittedElsewhere ? { emittedElsewhere: opts.emittedElsewhere } : {}),
    });
    this.rpc = new RpcServer({
      db,
      jobs,
      transport: opts.transport,
      clock: opts.clock,
      logger: opts.logger,
      concurrency: config.rpcConcurrency,
      ratePerSecond: config.rpcPerSecond,
      timeoutMs: config.rpcTimeoutMs,
      metrics: opts.metrics ?? noopMetrics,
      maxMessageBytes: config.maxMessageBytes,
    });
    this.directory = new ActorDirectory({ clock: opts.clock, onError: (e) => this.log.error({ err: e }, 'directory') });
    this.workers =
      opts.workers ??
      new WorkerRegistry({
        db: opts.db,
        ownerId: opts.ownerId,
        clock: opts.clock,
        logger: opts.logger,
        background: this.background,
        staleMs: config.workerStaleMs,
        initialTurns: config.workerInitialTurns,
        ...(opts.transport.forget ? { forgetSession: (id: string) => opts.transport.forget?.(id) } : {}),
      });
    const parts = {
      begin: this.begin,
      commits: this.commits,
      failures: this.failures,
      transport: opts.transport,
      workers: this.workers,
      directory: this.directory,
      background: this.background,
      retry,
      clock: opts.clock,
      logger: opts.logger,
      metrics: this.metrics,
      ...(opts.tracer ? { tracer: opts.tracer } : {}),
    };
    this.dispatcher = new Dispatcher({
      ...parts,
      ...(opts.onCapacity ? { onCapacity: opts.onCapacity } : {}),
      ...(opts.continueTurns === false ? { continueTurns: false } : {}),
      ...(opts.queueBacklogged ? { queueBacklogged: opts.queueBacklogged } : {}),
    });
    this.replies = new ReplyPipeline({
      ...parts,
      dispatcher: this.dispatcher,
      maxEventBytes: config.maxEventBytes,
      chunksWritten: (deliveryId) => this.stream.written(deliveryId),
      sinks: new SinkDirectory(opts.db, () => opts.clock.nowMs()),
    });
    this.stream = new StreamRelay({
      db: opts.db,
      turnOf: (eventId) => this.dispatcher.turnOf(eventId),
      progress: (workerId, ref) => this.replies.progress(workerId, ref),
      closed: (workerId, ref, limitBytes) => this.closeStream(workerId, ref, limitBytes),
      clock: opts.clock,
      logger: opts.logger,
      chunkBytes: config.streamChunkBytes,
      turnBytes: config.streamTurnBytes,
      backlogBytes: config.streamBacklogBytes,
      // the lease is renewed about as often as the worker's own progress would
      progressEveryMs: config.progressIntervalMs,
      counted: (outcome) => this.metrics.streamChunk?.(outcome),
    });
  }

  /** R8 of the stream relay: the worker hears once that its attempt's stream budget is spent. */
  private closeStream(workerId: string, ref: WireTurnRef, limitBytes: number): void {
    const fields = { ...fenceFields(fromWire(ref)), workerId, limitBytes };
    this.log.warn(fields, 'stream budget spent; later chunks of the attempt are dropped');
    const told = this.transport.send(workerId, {
      v: PROTOCOL_VERSION,
      type: 'turn_stream_closed',
      turn_ref: ref,
      reason: 'turn_limit',
      limit_bytes: limitBytes,
    });
    this.background.track(told, fields);
  }

  /** Called synchronously from the broker's receive loop: schedules, never awaits. */
  handleBrokerEvent(e: BrokerEvent): void {
    switch (e.kind) {
      case 'rpc_request':
        this.rpc.handle(e);
        return;
      case 'worker_ready':
        this.background.track(this.onWorkerReady(e.workerId, e.capacity, e.instance, e.agents), { workerId: e.workerId });
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
      case 'turn_chunk':
        this.workers.seen(e.workerId);
        this.stream.chunk(e);
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

  private async onWorkerReady(workerId: string, capacity: number, instance?: string, agents?: readonly string[]): Promise<void> {
    const { restarted, lostEvents } = await this.workers.register(workerId, capacity, instance, agents);
    this.log.info({ workerId, capacity, restarted }, 'worker ready');
    this.workerRegistered(workerId, lostEvents);
  }

  /**
   * A worker (re)registered. A worker process that restarted lost what it was running: those
   * turns go elsewhere now instead of waiting for their leases to run out. (A reconnect of the
   * same run keeps them.) Events this runtime does not hold are left alone.
   */
  workerRegistered(workerId: string, lostEvents: readonly string[]): void {
    this.dispatcher.workerReady(workerId, lostEvents);
  }

  /** The broker dropped the worker (revoked): nothing more goes to it; its turns go elsewhere now. */
  private onWorkerGone(workerId: string, reason: string): void {
    const events = this.workers.forget(workerId);
    this.log.warn({ workerId, reason, inFlight: events.length }, 'worker gone');
    this.workerLost(workerId, reason, events);
  }

  /** The turns of `events` this runtime holds on a worker that is gone go elsewhere. */
  workerLost(workerId: string, reason: string, events: readonly string[]): void {
    for (const eventId of events) this.dispatcher.reassign(eventId, `worker ${workerId} gone: ${reason}`);
  }

  /** Waits for scheduled background work (tests, shutdown). */
  async drain(): Promise<void> {
    await this.stream.flushed();
    await this.background.drain();
    await this.rpc.drain();
  }

  /** The daemon drains: commits begin no next turns any more. */
  stopContinuing(): void {
    this.dispatcher.stopContinuing();
  }

  /** Stops retrying database work and parked turns (shutdown). */
  stop(): void {
    this.stopping = true;
    this.stream.stop();
    this.dispatcher.stop();
    this.directory.stop();
  }
}
