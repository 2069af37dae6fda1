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
import type { Database } from '../db/client.ts';
import { markOwnerWorkersGone } from '../db/operations/workers.ts';
import { stopIdleActivationsOf } from '../db/turns/activations.ts';
import { daemonHeartbeatMs, markDaemonStopped, recordDaemonHeartbeat } from '../db/operations/daemons.ts';
import type { Fence } from '../db/turns/fence.ts';
import { formatActorKey, type ActorKey } from '../base/actor-key.ts';
import { CorralError, errorMessage, toError } from '../base/errors.ts';
import { servedShards, shardOf } from '../base/shard-map.ts';
import { Broker } from '../fabric/broker.ts';
import { FabricSecurity } from '../fabric/security.ts';
import type { TimerHandle } from '../base/clock.ts';
import type { Logger } from '../base/logger.ts';
import { setUpDatabase, type Queues } from '../queue/boss.ts';
import type { QueueConsumer } from '../queue/consumer.ts';
import { readShardIdentity, readShardMap } from '../db/shards/catalog.ts';
import { ShardPools } from '../db/shards/shard-pools.ts';
import type { Recovery } from '../runtime/recovery.ts';
import type { Runtime } from '../runtime/runtime.ts';
import type { SessionController } from '../runtime/directory.ts';
import { cancelTurn, steerTurn } from '../ops/turn-control.ts';
import { redispatchUnaccepted, type Watchdog } from '../runtime/watchdog.ts';
import type { JobKeeper } from '../runtime/job-keeper.ts';
import { Periodic } from '../runtime/periodic.ts';
import { ShardRouter } from '../runtime/shard-router.ts';
import type { OutboxSender } from '../outbox/sender.ts';
import type { TurnTracer } from '../base/turn-tracer.ts';
import { HeapTrim, memoryReducingGc } from '../runtime/heap-trim.ts';
import type { SweepResult } from '../queue/retention.ts';
import { noopMetrics, type RuntimeMetrics } from '../runtime/metrics.ts';
import { Supervisor, type ChildSpec, type ShutdownResult, type SupervisorHandle } from '../supervisor/index.ts';
import { ShardNode } from './shard-node.ts';
import type { DaemonState } from './state.ts';

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
  /**
   * The catalog's node: shard 0 at DATABASE_URL. It serves a one-shard deployment; with several
   * shards its registry is the workers' and its database the daemon's own rows', and the nodes
   * of the shards served (`nodes`) do the rest.
   */
  readonly home: ShardNode;
  readonly broker: Broker;
  /** CURVE keys and the worker allow-list; undefined with `insecure`. */
  readonly security: FabricSecurity | undefined;
  readonly heapTrim: HeapTrim;
  private readonly heapTrimLoop: Periodic<boolean>;
  /** The daemon's own row in `corral.daemons`, touched every quarter of the stale timeout. */
  readonly heartbeat: Periodic<void>;
  private served: ShardNode[] = [];
  private router: ShardRouter | undefined;
  private pools: ShardPools | undefined;
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
    this.home = this.node(0, 1, deps.databaseUrl);
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
      // D3 of src/runtime/shard-router.ts: one shard, no router on the turn path
      onEvent: (e) => (this.router ? this.router.handleBrokerEvent(e) : this.home.runtime.handleBrokerEvent(e)),
    });
    this.heapTrim = new HeapTrim({
      clock,
      logger,
      idleMs: config.heapTrimIdleMs,
      inFlight: () => this.inFlightCount(),
      // an idle daemon keeps no contexts: the next turns read theirs from the database
      trim: () => {
        for (const n of this.nodes) n.runtime.contexts.clear();
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
  }

  /** The node of `shard` of `shardCount` at `url`; with several shards it shares the home's workers. */
  private node(shard: number, shardCount: number, url: string): ShardNode {
    const { config, logger, metrics, tracer, continueTurns } = this.deps;
    const sharing = shardCount > 1;
    return new ShardNode({
      config,
      url,
      shard,
      shardCount,
      logger,
      clock: this.clock,
      ownerId: this.ownerId,
      // the broker is built after the home node: it hands its events to the runtimes
      transport: { send: (id, msg) => this.broker.send(id, msg), forget: (id) => void this.broker.forget(id) },
      signal: this.abort.signal,
      onActivity: () => this.heapTrim.noteActivity(),
      ...(metrics ? { metrics } : {}),
      ...(tracer ? { tracer } : {}),
      ...(continueTurns === false ? { continueTurns: false } : {}),
      ...(sharing
        ? {
            workers: this.home.runtime.workers,
            ...(this.pools ? { pools: this.pools } : {}),
            capacity: (n: ShardNode) => this.router?.fetchCapacity(n.runtime) ?? 0,
            fetched: (n: ShardNode) => {
              for (const r of this.router?.fetched(n.runtime) ?? []) this.served.find((m) => m.runtime === r)?.consumer.wakeForCapacity();
            },
            onCapacity: () => {
              this.router?.capacityFreed();
              for (const n of this.served) n.consumer.wakeForCapacity();
            },
          }
        : {}),
    });
  }

  /** The nodes whose shards this daemon serves (the home alone with one shard). */
  get nodes(): readonly ShardNode[] {
    return this.served.length > 0 ? this.served : [this.home];
  }

  /** The node of the shard `key` lives on, if this daemon serves it. */
  nodeOf(key: ActorKey): ShardNode | undefined {
    if (!this.router) return this.home;
    const shard = shardOf(key, this.served[0]!.shardCount);
    return this.served.find((n) => n.shard === shard);
  }

  private inFlightCount(): number {
    let n = 0;
    for (const node of this.nodes) n += node.runtime.inFlightCount();
    return n;
  }

  get database(): Database {
    return this.home.database;
  }
  get boss(): PgBoss {
    return this.home.boss;
  }
  get queues(): Queues {
    return this.home.queues;
  }
  get runtime(): Runtime {
    return this.home.runtime;
  }
  get consumer(): QueueConsumer {
    return this.home.consumer;
  }
  get watchdog(): Watchdog {
    return this.home.watchdog;
  }
  get recovery(): Recovery {
    return this.home.recovery;
  }
  get jobKeeper(): JobKeeper {
    return this.home.jobKeeper;
  }
  /** Deletes completed actor events past `completedRetentionSeconds` (every minute). */
  get retention(): Periodic<SweepResult> {
    return this.home.retention;
  }
  /** Sends what committed turns deliver to their sinks (the outbox). */
  get outbox(): OutboxSender {
    return this.home.outbox;
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

  /** Migrations, pg-boss, queues, the shards served, broker and a first recovery pass. Loops are started by `startSupervisor`. */
  async prepare(): Promise<void> {
    if (this._state !== 'idle') throw new CorralError('internal', `prepare() called on a daemon that is ${this._state}`);
    this._state = 'starting';
    await setUpDatabase(this.deps.databaseUrl, this.boss, this.config, { migrations: !this.deps.skipMigrations });
    const identity = await readShardIdentity((text) => this.database.pool.query(text));
    const shardCount = identity?.shardCount ?? 1;
    const shards = servedShards(this.config.shards, shardCount);
    if (shardCount === 1) await this.home.prepare(true);
    else await this.prepareShards(shardCount, shards);
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
    const recovered = await Promise.all(this.nodes.map((n) => n.recovery.tick()));
    this.log.info({ endpoint: this.broker.endpoint, shards: shardCount > 1 ? shards : undefined, recovered }, 'daemon prepared');
  }

  /** A deployment of several shards: a node per shard served, at the database the catalog's map names. */
  private async prepareShards(shardCount: number, shards: readonly number[]): Promise<void> {
    const map = await readShardMap(this.database.pool);
    this.pools = new ShardPools(
      {
        catalogUrl: this.deps.databaseUrl,
        bossSchema: this.config.bossSchema,
        onError: (e) => this.log.warn({ err: e.message }, 'shard connection lost'),
      },
      map,
    );
    this.served = shards.map((k) => this.node(k, shardCount, this.pools!.urlOf(k)));
    this.router = new ShardRouter({
      shardCount,
      runtimes: new Map(this.served.map((n) => [n.shard, n.runtime])),
      workers: this.home.runtime.workers,
      metrics: this.deps.metrics ?? noopMetrics,
      logger: this.deps.logger,
    });
    // D1: one watchdog takes stale workers out, and each shard sends their unaccepted turns elsewhere
    this.served[0]!.watchdog.takeWorkers(this.home.runtime.workers, async (workerId) => {
      let n = 0;
      for (const node of this.served) n += await redispatchUnaccepted(node.database.db, node.runtime.dispatcher, workerId);
      return n;
    });
    for (const n of this.served) await n.prepare(false);
  }

  /** Steers the live turn of `key` (library API; `corral steer` does the same). */
  steer(key: ActorKey, input: unknown): Promise<Fence> {
    return steerTurn({ db: this.nodeFor(key).database.db }, key, input);
  }

  /** Cancels the live turn of `key` (library API; `corral cancel` does the same). */
  cancel(key: ActorKey, reason = 'cancelled by operator'): Promise<Fence> {
    const n = this.nodeFor(key);
    return cancelTurn({ db: n.database.db, boss: n.boss, queueName: n.queues.events }, key, reason);
  }

  private nodeFor(key: ActorKey): ShardNode {
    const n = this.nodeOf(key);
    if (!n) throw new CorralError('wrong_shard', `${formatActorKey(key)} lives on a shard this daemon does not serve`);
    return n;
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
    for (const n of this.nodes) for (const l of n.loops()) sup.register(loop(l.name, l.run));
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
    const host = {
      adopt: (c: SessionController) => {
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
      release: (c: SessionController) => void handle.removeChild(childName(c)).catch(() => undefined),
    };
    for (const n of this.nodes) n.runtime.directory.setHost(host);
    try {
      await handle.done;
    } finally {
      for (const n of this.nodes) n.runtime.directory.setHost(undefined);
    }
  }

  private async drain(drainMs: number): Promise<void> {
    if (!this.handle || drainMs <= 0) return;
    for (const n of this.nodes) {
      await this.handle.removeChild(n.loops()[0]!.name).catch(() => false);
      n.runtime.stopContinuing();
    }
    const until = this.clock.nowMs() + drainMs;
    if (this.inFlightCount() > 0) {
      this.log.info({ inFlight: this.inFlightCount(), drainMs }, 'draining in-flight turns');
    }
    while (this.inFlightCount() > 0 && this.clock.nowMs() < until) await this.clock.sleep(50);
    if (this.inFlightCount() > 0) {
      this.log.warn({ inFlight: this.inFlightCount() }, 'stopping with turns in flight: they will be retried after their leases');
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
    const nodes = this.nodes;
    for (const n of nodes) n.runtime.stop();
    const deadlineMs = opts.deadlineMs ?? 10_000;
    let result: ShutdownResult | undefined;
    await this.stopStep('the supervisor', deadlineMs + STOP_STEP_MS, async () => {
      result = await this.handle?.shutdown({ deadlineMs });
    });
    this.abort.abort();
    await this.stopStep('the runtime’s last operations', STOP_STEP_MS, () =>
      Promise.all([...nodes.map((n) => n.runtime.drain()), this.router?.drain()]),
    );
    await this.stopStep('the control listener', STOP_STEP_MS, () => Promise.all(nodes.map((n) => n.closeControl())));
    this.security?.stop();
    this.insecureWarning?.cancel();
    await this.stopStep('the broker', STOP_STEP_MS, () => this.broker.stop());
    await this.stopStep('marking its workers gone', STOP_STEP_MS, () => markOwnerWorkersGone(this.database.db, this.ownerId));
    await this.stopStep('stopping its idle activations', STOP_STEP_MS, () =>
      Promise.all(nodes.map((n) => stopIdleActivationsOf(n.database.db, this.ownerId))),
    );
    await this.stopStep('marking the daemon stopped', STOP_STEP_MS, () => markDaemonStopped(this.database.db, this.ownerId));
    const all = this.served.includes(this.home) ? this.served : [this.home, ...this.served];
    await this.stopStep('pg-boss', STOP_STEP_MS, () =>
      Promise.all(all.map((n) => n.boss.stop({ graceful: false, close: true, timeout: STOP_STEP_MS / 2 }))),
    );
    await this.stopStep('the database pool', STOP_STEP_MS, () => Promise.all([...all.map((n) => n.database.close()), this.pools?.close()]));
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
