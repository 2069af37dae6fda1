/**
 * The composition root: builds the database handle, pg-boss, the broker, the runtime, the queue
 * consumer, the watchdog and recovery, and owns their lifecycle. Start order: migrations →
 * pg-boss → broker → recovery pass → consumer / watchdog / recovery loops. Stop order is the
 * reverse. `createDaemon` (src/host/daemon.ts) runs it with its database, metrics server and local
 * worker processes; `corral daemon` wraps that.
 */
import { randomUUID } from 'node:crypto';
import { hostname } from 'node:os';
import type { PgBoss } from 'pg-boss';
import { settlesWithin, systemClock, type Clock } from '../base/clock.ts';
import type { Config } from '../config.ts';
import { openDatabase, type Database } from '../db/client.ts';
import { markOwnerWorkersGone } from '../db/operations/workers.ts';
import { stopIdleActivationsOf } from '../db/turns/activations.ts';
import { daemonHeartbeatMs, markDaemonStopped, recordDaemonHeartbeat } from '../db/operations/daemons.ts';
import { CONTROL_CHANNEL, parseControl } from '../db/turns/control.ts';
import type { Fence } from '../db/turns/fence.ts';
import type { ActorKey } from '../base/actor-key.ts';
import { CorralError, errorMessage, toError } from '../base/errors.ts';
import { Broker } from '../fabric/broker.ts';
import { FabricSecurity } from '../fabric/security.ts';
import type { TimerHandle } from '../base/clock.ts';
import type { Logger } from '../base/logger.ts';
import { createBoss, queuesOf, setUpDatabase, type Queues } from '../queue/boss.ts';
import { QueueConsumer } from '../queue/consumer.ts';
import type { ActorEventJobData } from '../queue/event-job.ts';
import { keyHeadFetch, queueTable, type KeyHeadFetch } from '../db/boss/fetch.ts';
import { refuseManyShards } from '../db/shards/catalog.ts';
import { Recovery } from '../runtime/recovery.ts';
import { Runtime } from '../runtime/runtime.ts';
import type { SessionController } from '../runtime/directory.ts';
import { cancelTurn, steerTurn } from '../ops/turn-control.ts';
import { Watchdog } from '../runtime/watchdog.ts';
import { JobKeeper } from '../runtime/job-keeper.ts';
import { Periodic } from '../runtime/periodic.ts';
import { OutboxSender } from '../outbox/sender.ts';
import type { TurnTracer } from '../base/turn-tracer.ts';
import { HeapTrim, memoryReducingGc } from '../runtime/heap-trim.ts';
import { sweepRetention, type SweepResult } from '../queue/retention.ts';
import type { RuntimeMetrics } from '../runtime/metrics.ts';
import { Supervisor, type ChildSpec, type ShutdownResult, type SupervisorHandle } from '../supervisor/index.ts';
import type { DaemonState } from './state.ts';

/** How often retention runs: a pass with nothing due is a few index probes, one with work drains it (src/queue/retention.ts). */
const RETENTION_INTERVAL_MS = 60_000;
/** How often the daemon checks whether it is idle enough to trim its heap (see src/runtime/heap-trim.ts). */
const HEAP_TRIM_CHECK_MS = 2_000;
const INSECURE_WARNING_INTERVAL_MS = 3_600_000;
/** The most each step of a stop after the drain may take (the supervisor's deadline comes on top of its own). */
const STOP_STEP_MS = 3_000;

export interface DaemonDeps {
  config: Config;
  /** The resolved database URL (embedded or DATABASE_URL). */
  databaseUrl: string;
  logger: Logger;
  clock?: Clock;
  metrics?: RuntimeMetrics;
  /** Skip applying migrations (they were applied already, e.g. a test template). */
  skipMigrations?: boolean;
  /** Extra supervised children, e.g. local worker processes (`corral daemon --workers N`). */
  extraChildren?: (endpoint: string) => ChildSpec<Daemon>[];
  /** Spans of turns and outbox requests (docs/observability.md); its owner shuts it down. */
  tracer?: TurnTracer;
  /** A busy actor's next turn begins in its current turn's commit (default true; false: through the queue's fetch, to compare). */
  continueTurns?: boolean;
}

export type { DaemonState };

/** The daemon's parts, built and wired but not started. */
export class Daemon {
  private stopping: Promise<ShutdownResult | undefined> | undefined;
  readonly ownerId = `daemon-${randomUUID()}`;
  readonly config: Config;
  readonly database: Database;
  readonly boss: PgBoss;
  readonly broker: Broker;
  /** CURVE keys and the worker allow-list; undefined with `insecure`. */
  readonly security: FabricSecurity | undefined;
  readonly runtime: Runtime;
  readonly consumer: QueueConsumer;
  /** The actor queue's fetch, once pg-boss's queue exists (prepare). */
  private fetchHeads: KeyHeadFetch | undefined;
  readonly watchdog: Watchdog;
  readonly recovery: Recovery;
  readonly jobKeeper: JobKeeper;
  /** Deletes completed actor events past `completedRetentionSeconds` (every minute). */
  readonly retention: Periodic<SweepResult>;
  /** Sends what committed turns deliver to their sinks (the outbox). */
  readonly outbox: OutboxSender;
  readonly heapTrim: HeapTrim;
  private readonly heapTrimLoop: Periodic<boolean>;
  /** The daemon's own row in `corral.daemons`, touched every quarter of the stale timeout. */
  readonly heartbeat: Periodic<void>;
  readonly queues: Queues;
  private readonly deps: DaemonDeps;
  private readonly log: Logger;
  private readonly abort = new AbortController();
  private handle: SupervisorHandle<Daemon> | undefined;
  private readonly clock: Clock;
  private _state: DaemonState = 'idle';
  private insecureWarning: TimerHandle | undefined;

  constructor(deps: DaemonDeps) {
    const { config, logger } = deps;
    const clock = deps.clock ?? systemClock;
    this.deps = deps;
    this.clock = clock;
    this.config = config;
    this.log = logger.child({ component: 'daemon', ownerId: this.ownerId });
    this.database = openDatabase(deps.databaseUrl, {
      max: 20,
      onError: (e) => this.log.warn({ err: e.message }, 'database connection lost'),
    });
    this.boss = createBoss(deps.databaseUrl, config, {
      supervise: true,
      max: 10,
      onError: (e) => this.log.warn({ err: e.message }, 'pg-boss background error'),
    });
    this.queues = queuesOf(config);
    let consumer: QueueConsumer | undefined;
    this.runtime = new Runtime({
      db: this.database.db,
      boss: this.boss,
      queues: this.queues,
      config,
      // the broker is built below: it hands its events to the runtime
      transport: { send: (id, msg) => this.broker.send(id, msg), forget: (id) => void this.broker.forget(id) },
      clock,
      logger,
      ownerId: this.ownerId,
      onCapacity: () => consumer?.wakeForCapacity(),
      queueBacklogged: () => consumer?.backlogged ?? false,
      ...(deps.metrics ? { metrics: deps.metrics } : {}),
      ...(deps.tracer ? { tracer: deps.tracer } : {}),
      ...(deps.continueTurns === false ? { continueTurns: false } : {}),
    });
    const security = (this.security = config.insecure
      ? undefined
      : new FabricSecurity({
          homeDir: config.homeDir,
          ...(config.daemonKeyFile ? { daemonKeyFile: config.daemonKeyFile } : {}),
          ...(config.allowlistFile ? { allowlistFile: config.allowlistFile } : {}),
          pollMs: config.keyPollMs,
          clock,
          logger,
        }));
    this.broker = new Broker({
      endpoint: config.endpoint,
      logger,
      clock,
      heartbeatIntervalMs: config.workerHeartbeatMs,
      progressIntervalMs: config.progressIntervalMs,
      maxMessageBytes: config.maxMessageBytes,
      receiveHighWaterMark: config.receiveHighWaterMark,
      maxWorkers: config.maxWorkers,
      maxConnections: config.maxConnections,
      maxConnectionsPerKey: config.maxConnectionsPerKey,
      registrationsPerKeyPerS: config.maxRegistrationRate,
      welcome: {
        leaseMs: config.leaseMs,
        staleMs: config.workerStaleMs,
        retry: { limit: config.retryLimit, delay_s: config.retryDelaySeconds, delay_max_s: config.retryDelayMaxSeconds, backoff: true },
        streamChunkBytes: config.streamChunkBytes,
        streamTurnBytes: config.streamTurnBytes,
      },
      ...(security ? security.brokerOptions() : {}),
      onEvent: (e) => this.runtime.handleBrokerEvent(e),
    });
    consumer = this.consumer = new QueueConsumer({
      boss: this.boss,
      fetch: (limit) => {
        if (!this.fetchHeads) throw new CorralError('internal', 'the daemon is not prepared');
        return this.fetchHeads<ActorEventJobData>(limit);
      },
      queueName: this.queues.events,
      bossSchema: config.bossSchema,
      clock,
      logger,
      pollIntervalMs: config.pollIntervalMs,
      batchSize: config.fetchBatchSize,
      capacity: () => this.runtime.fetchCapacity(),
      onJobs: (jobs) => {
        this.heapTrim.noteActivity();
        this.runtime.dispatchJobs(jobs);
      },
    });
    this.watchdog = new Watchdog({
      db: this.database.db,
      failures: this.runtime.failures,
      dispatcher: this.runtime.dispatcher,
      workers: this.runtime.workers,
      clock,
      logger,
      intervalMs: config.watchdogIntervalMs,
      idleTimeoutMs: config.idleTimeoutMs,
      maxTurnMs: config.maxTurnMs,
    });
    this.retention = new Periodic(
      () =>
        sweepRetention({
          boss: this.boss,
          db: this.database.db,
          bossSchema: config.bossSchema,
          queueName: this.queues.events,
          retentionSeconds: config.completedRetentionSeconds,
          runtimeRetentionSeconds: config.runtimeRetentionSeconds,
          clock,
          signal: this.abort.signal,
        }),
      { clock, log: this.log, intervalMs: RETENTION_INTERVAL_MS, what: 'retention sweep', firstPass: 'now' },
    );
    this.outbox = new OutboxSender({
      db: this.database.db,
      listen: (channel, onPayload, onReconnect) => {
        const db = this.boss.getDb();
        if (typeof db.listen !== 'function') return Promise.reject(new Error('pg-boss offers no LISTEN'));
        return db.listen(channel, onPayload, onReconnect);
      },
      clock,
      logger,
      ownerId: this.ownerId,
      retry: { limit: config.outboxRetryLimit, delayS: config.retryDelaySeconds, maxS: config.retryDelayMaxSeconds },
      ...(deps.metrics ? { metrics: deps.metrics } : {}),
      ...(deps.tracer ? { tracer: deps.tracer } : {}),
    });
    this.heapTrim = new HeapTrim({
      clock,
      logger,
      idleMs: config.heapTrimIdleMs,
      inFlight: () => this.runtime.inFlightCount(),
      // an idle daemon keeps no contexts: the next turns read theirs from the database
      trim: () => {
        this.runtime.contexts.clear();
        memoryReducingGc();
      },
    });
    this.heapTrimLoop = new Periodic(async () => this.heapTrim.pass(), {
      clock,
      log: this.log,
      intervalMs: HEAP_TRIM_CHECK_MS,
      what: 'heap trim',
      firstPass: 'after-interval',
    });
    this.heartbeat = new Periodic(() => this.recordHeartbeat(), {
      clock,
      log: this.log,
      intervalMs: daemonHeartbeatMs(config.workerStaleMs),
      what: 'daemon heartbeat',
      firstPass: 'after-interval',
    });
    this.jobKeeper = new JobKeeper({
      boss: this.boss,
      queueName: this.queues.events,
      dispatcher: this.runtime.dispatcher,
      clock,
      logger,
      jobHeartbeatSeconds: config.jobHeartbeatSeconds,
    });
    this.recovery = new Recovery({
      db: this.database.db,
      failures: this.runtime.failures,
      jobs: { schema: this.queues.schema, queue: this.queues.events },
      clock,
      logger,
      intervalMs: config.recoveryIntervalMs,
    });
  }

  private recordHeartbeat(): Promise<void> {
    return recordDaemonHeartbeat(this.database.db, {
      daemonId: this.ownerId,
      host: hostname(),
      pid: process.pid,
      endpoint: this.broker.endpoint,
      staleMs: this.config.workerStaleMs,
    });
  }

  get state(): DaemonState {
    return this._state;
  }

  get signal(): AbortSignal {
    return this.abort.signal;
  }

  /** Migrations, pg-boss, queues, broker and a first recovery pass. Loops are started by `startLoops`. */
  async prepare(): Promise<void> {
    if (this._state !== 'idle') throw new CorralError('internal', `prepare() called on a daemon that is ${this._state}`);
    this._state = 'starting';
    await setUpDatabase(this.deps.databaseUrl, this.boss, this.config, { migrations: !this.deps.skipMigrations });
    await refuseManyShards(this.database.pool);
    // a batch's events share a turn_start's room for one event (B1 of src/db/turns/batches.ts)
    const batchBytes = Math.floor(this.config.maxMessageBytes / 2);
    this.fetchHeads = keyHeadFetch(this.database.pool, this.queues, await queueTable(this.database.pool, this.queues), batchBytes);
    await this.broker.start();
    await this.recordHeartbeat();
    if (this.security) {
      this.security.start((workerId, reason) => void this.broker.revoke(workerId, reason));
    } else {
      const warn = () =>
        this.log.warn(
          { endpoint: this.broker.endpoint },
          'INSECURE: CURVE is off; any process that can reach the endpoint can register as a worker and read events',
        );
      warn();
      this.insecureWarning = this.clock.setInterval(warn, INSECURE_WARNING_INTERVAL_MS);
    }
    await this.listenForControl();
    const report = await this.recovery.tick();
    this.log.info({ endpoint: this.broker.endpoint, recovered: report }, 'daemon prepared');
  }

  private controlListener: { close(): Promise<void> } | undefined;

  private async listenForControl(): Promise<void> {
    const db = this.boss.getDb();
    if (typeof db.listen !== 'function') return;
    this.controlListener = await db.listen(
      CONTROL_CHANNEL,
      (payload) => {
        const msg = parseControl(payload);
        if (msg) this.runtime.handleControl(msg);
        else this.log.warn({ payload: payload.slice(0, 200) }, 'ignored a malformed control notification');
      },
      () => this.log.info('control channel reconnected'),
    );
  }

  /** Steers the live turn of `key` (library API; `corral steer` does the same). */
  steer(key: ActorKey, input: unknown): Promise<Fence> {
    return steerTurn({ db: this.database.db }, key, input);
  }

  /** Cancels the live turn of `key` (library API; `corral cancel` does the same). */
  cancel(key: ActorKey, reason = 'cancelled by operator'): Promise<Fence> {
    return cancelTurn({ db: this.database.db, boss: this.boss, queueName: this.queues.events }, key, reason);
  }

  /**
   * Runs the subsystems under a one-for-one supervisor (see docs/supervision.md): the consumer,
   * watchdog and recovery loops (permanent) and any extra children such as local workers.
   */
  startSupervisor(): SupervisorHandle<Daemon> {
    const sup = new Supervisor<Daemon>(this, { name: 'corral-daemon', clock: this.clock, signal: this.abort.signal });
    const loop = (name: string, run: (s: AbortSignal) => Promise<void>): ChildSpec<Daemon> => ({
      name,
      policy: 'permanent',
      restartDelayMs: 1_000,
      factory: async (_d, signal) => {
        await run(signal);
      },
    });
    sup.register({
      name: 'session-controllers',
      policy: 'permanent',
      factory: (_d, signal) => this.runControllerSupervisor(signal),
    });
    sup.register(loop('queue-consumer', (s) => this.consumer.run(s)));
    sup.register(loop('watchdog', (s) => this.watchdog.run(s)));
    sup.register(loop('recovery', (s) => this.recovery.run(s)));
    sup.register(loop('job-keeper', (s) => this.jobKeeper.run(s)));
    sup.register(loop('retention', (s) => this.retention.run(s)));
    sup.register(loop('outbox', (s) => this.outbox.run(s)));
    sup.register(loop('heap-trim', (s) => this.heapTrimLoop.run(s)));
    sup.register(loop('daemon-heartbeat', (s) => this.heartbeat.run(s)));
    for (const child of this.deps.extraChildren?.(this.broker.endpoint) ?? []) sup.register(child);
    this.handle = sup.start();
    this.handle.done.catch((e: unknown) => this.log.error({ err: toError(e) }, 'supervisor gave up'));
    this._state = 'running';
    return this.handle;
  }

  /**
   * The session controllers' supervisor: each controller is a dynamic, transient child that
   * lives from its actor's first wake until the directory releases it.
   */
  private async runControllerSupervisor(signal: AbortSignal): Promise<void> {
    const inner = new Supervisor<Daemon>(this, { name: 'session-controllers', keepAlive: true, clock: this.clock, signal });
    const handle = inner.start();
    const childName = (c: SessionController) => `actor:${c.name}`;
    this.runtime.directory.setHost({
      adopt: (c) => {
        try {
          handle.addChild({
            name: childName(c),
            policy: 'transient',
            factory: (_d, s) => new Promise<void>((resolve) => s.addEventListener('abort', () => resolve(), { once: true })),
          });
        } catch (e) {
          this.log.debug({ actor: c.name, err: toError(e).message }, 'controller not supervised');
        }
      },
      release: (c) => void handle.removeChild(childName(c)).catch(() => undefined),
    });
    try {
      await handle.done;
    } finally {
      this.runtime.directory.setHost(undefined);
    }
  }

  private async drain(drainMs: number): Promise<void> {
    if (!this.handle || drainMs <= 0) return;
    await this.handle.removeChild('queue-consumer').catch(() => false);
    this.runtime.stopContinuing();
    const until = this.clock.nowMs() + drainMs;
    if (this.runtime.inFlightCount() > 0) {
      this.log.info({ inFlight: this.runtime.inFlightCount(), drainMs }, 'draining in-flight turns');
    }
    while (this.runtime.inFlightCount() > 0 && this.clock.nowMs() < until) await this.clock.sleep(50);
    if (this.runtime.inFlightCount() > 0) {
      this.log.warn({ inFlight: this.runtime.inFlightCount() }, 'stopping with turns in flight: they will be retried after their leases');
    }
  }

  get supervisor(): SupervisorHandle<Daemon> | undefined {
    return this.handle;
  }

  async start(): Promise<void> {
    await this.prepare();
    this.startSupervisor();
  }

  /**
   * Graceful stop: fetch nothing new, let in-flight turns finish for up to `drainMs`, then stop
   * every subsystem. Turns still running after the drain are left to their leases: another (or
   * the restarted) daemon retries them, so nothing is lost.
   */
  async stop(opts: { deadlineMs?: number; drainMs?: number } = {}): Promise<ShutdownResult | undefined> {
    // A second call (a second signal, a test's cleanup) waits for the stop already under way.
    this.stopping ??= this.stopOnce(opts);
    return this.stopping;
  }

  /**
   * Every step after the drain is bounded (STOP_STEP_MS, the supervisor by its deadline): a stop
   * ends whatever the database, a peer or a child does, and says which step it gave up on. What
   * a step left undone is what a crash leaves: the leases and the next daemon's recovery see to it.
   */
  private async stopOnce(opts: { deadlineMs?: number; drainMs?: number }): Promise<ShutdownResult | undefined> {
    if (this._state === 'stopped') return undefined;
    this._state = 'stopping';
    await this.drain(opts.drainMs ?? this.config.drainMs);
    this.runtime.stop();
    const deadlineMs = opts.deadlineMs ?? 10_000;
    let result: ShutdownResult | undefined;
    await this.stopStep('the supervisor', deadlineMs + STOP_STEP_MS, async () => {
      result = await this.handle?.shutdown({ deadlineMs });
    });
    this.abort.abort();
    await this.stopStep('the runtime’s last operations', STOP_STEP_MS, () => this.runtime.drain());
    await this.stopStep('the control listener', STOP_STEP_MS, async () => this.controlListener?.close());
    this.security?.stop();
    this.insecureWarning?.cancel();
    await this.stopStep('the broker', STOP_STEP_MS, () => this.broker.stop());
    await this.stopStep('marking its workers gone', STOP_STEP_MS, () => markOwnerWorkersGone(this.database.db, this.ownerId));
    await this.stopStep('stopping its idle activations', STOP_STEP_MS, () => stopIdleActivationsOf(this.database.db, this.ownerId));
    await this.stopStep('marking the daemon stopped', STOP_STEP_MS, () => markDaemonStopped(this.database.db, this.ownerId));
    await this.stopStep('pg-boss', STOP_STEP_MS, () => this.boss.stop({ graceful: false, close: true, timeout: STOP_STEP_MS / 2 }));
    await this.stopStep('the database pool', STOP_STEP_MS, () => this.database.close());
    this._state = 'stopped';
    return result;
  }

  /** One step of the stop: its failure is logged, and it is given up on (logged) after `ms`. */
  private async stopStep(what: string, ms: number, step: () => Promise<unknown>): Promise<void> {
    const work = step().catch((e: unknown) => this.log.debug({ step: what, err: errorMessage(e).slice(0, 300) }, 'a stop step failed'));
    if (!(await settlesWithin(this.clock, ms, work))) {
      this.log.warn({ step: what, waitedMs: ms }, 'a stop step did not end in time; going on without it');
    }
  }
}
