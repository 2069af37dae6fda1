/**
 * One shard's parts in a daemon: its database pool and pg-boss, its runtime, and the loops that
 * work on its rows (queue consumer, watchdog, recovery, job keeper, retention, webhook outbox, and
 * the relay of its cross-shard emits). A one-shard daemon has one node, shard 0; a daemon serving
 * shards has one per shard it serves, sharing the broker, the workers and their slots
 * (src/runtime/shard-router.ts). Every transaction of a node touches its shard only.
 *
 * A node of shard k > 0 runs corral's statements with the shard's schema names (its pools' client
 * class, src/db/shards/shard-sql.ts) and pg-boss in the shard's pg-boss schema.
 */
import type { PgBoss } from 'pg-boss';
import type { Clock } from '../base/clock.ts';
import type { Config } from '../config.ts';
import { openDatabase, type Database } from '../db/client.ts';
import { CONTROL_CHANNEL, parseControl } from '../db/turns/control.ts';
import { CorralError } from '../base/errors.ts';
import type { Logger } from '../base/logger.ts';
import { shardSchemas } from '../base/shard-map.ts';
import { createBoss, queuesOf, type Queues } from '../queue/boss.ts';
import { QueueConsumer } from '../queue/consumer.ts';
import type { ActorEventJobData } from '../queue/event-job.ts';
import { keyHeadFetch, queueTable, type KeyHeadFetch } from '../db/boss/fetch.ts';
import { readShardIdentity } from '../db/shards/catalog.ts';
import { shardClientOf } from '../db/shards/shard-sql.ts';
import type { ShardPools } from '../db/shards/shard-pools.ts';
import { pruneShardInbox } from '../db/shards/shard-emits.ts';
import { Recovery } from '../runtime/recovery.ts';
import { Runtime, type Transport } from '../runtime/runtime.ts';
import { Watchdog } from '../runtime/watchdog.ts';
import { JobKeeper } from '../runtime/job-keeper.ts';
import { Periodic } from '../runtime/periodic.ts';
import { ShardRelay } from '../runtime/shard-relay.ts';
import type { WorkerRegistry } from '../runtime/worker-registry.ts';
import { OutboxSender } from '../outbox/sender.ts';
import type { TurnTracer } from '../base/turn-tracer.ts';
import { sweepRetention, type SweepResult } from '../queue/retention.ts';
import type { RuntimeMetrics } from '../runtime/metrics.ts';

/** How often retention runs: a pass with nothing due is a few index probes, one with work drains it (src/queue/retention.ts). */
const RETENTION_INTERVAL_MS = 60_000;
/** How often the relay looks for cross-shard emits no commit of this process woke it for. */
const RELAY_POLL_MS = 1_000;

export interface ShardNodeOptions {
  config: Config;
  url: string;
  /** This node's shard, of how many; `{ shard: 0, shardCount: 1 }` for a one-shard deployment. */
  shard: number;
  shardCount: number;
  logger: Logger;
  clock: Clock;
  ownerId: string;
  transport: Transport;
  metrics?: RuntimeMetrics;
  tracer?: TurnTracer;
  continueTurns?: boolean;
  /** The daemon's workers, when nodes share them (several shards). */
  workers?: WorkerRegistry;
  /** The deployment's shards, for the relay of emits to other shards (several shards). */
  pools?: ShardPools;
  /** This node's consumer may fetch this many jobs (default: its runtime's free slots). */
  capacity?: (node: ShardNode) => number;
  /** The fetch `capacity` allowed is dispatched, came back empty, or failed. */
  fetched?: (node: ShardNode) => void;
  /** A turn of this node settled: slots may have freed for every node. */
  onCapacity?: () => void;
  /** A fetch found jobs (the daemon's heap trim counts activity). */
  onActivity?: () => void;
  /** Stops the loops of this node (the daemon's abort signal). */
  signal: AbortSignal;
}

export class ShardNode {
  readonly shard: number;
  readonly shardCount: number;
  readonly database: Database;
  readonly boss: PgBoss;
  readonly queues: Queues;
  readonly runtime: Runtime;
  readonly consumer: QueueConsumer;
  readonly watchdog: Watchdog;
  readonly recovery: Recovery;
  readonly jobKeeper: JobKeeper;
  readonly retention: Periodic<SweepResult>;
  readonly outbox: OutboxSender;
  /** Cross-shard emits of this shard's turns (several shards only). */
  readonly relay: ShardRelay | undefined;
  private fetchHeads: KeyHeadFetch | undefined;
  private controlListener: { close(): Promise<void> } | undefined;
  private readonly opts: ShardNodeOptions;
  private readonly log: Logger;

  constructor(opts: ShardNodeOptions) {
    this.opts = opts;
    const { shard, shardCount, clock, config } = opts;
    this.shard = shard;
    this.shardCount = shardCount;
    const logger = shardCount > 1 ? opts.logger.child({ shard }) : opts.logger;
    this.log = logger.child({ component: 'daemon' });
    const names = shardSchemas(shard, config.bossSchema);
    const Client = shard === 0 ? undefined : shardClientOf(shard, config.bossSchema);
    const shardConfig = { ...config, bossSchema: names.boss };
    this.database = openDatabase(opts.url, {
      max: 20,
      ...(Client ? { Client } : {}),
      onError: (e) => this.log.warn({ err: e.message }, 'database connection lost'),
    });
    this.boss = createBoss(opts.url, shardConfig, {
      supervise: true,
      max: 10,
      ...(Client ? { Client } : {}),
      onError: (e) => this.log.warn({ err: e.message }, 'pg-boss background error'),
    });
    this.queues = queuesOf(shardConfig);
    const place = shardCount > 1 ? { shard, shardCount } : undefined;
    let consumer: QueueConsumer | undefined;
    let relay: ShardRelay | undefined;
    this.runtime = new Runtime({
      db: this.database.db,
      boss: this.boss,
      queues: this.queues,
      config,
      transport: opts.transport,
      clock,
      logger,
      ownerId: opts.ownerId,
      onCapacity: () => (opts.onCapacity ? opts.onCapacity() : consumer?.wakeForCapacity()),
      queueBacklogged: () => consumer?.backlogged ?? false,
      ...(opts.metrics ? { metrics: opts.metrics } : {}),
      ...(opts.tracer ? { tracer: opts.tracer } : {}),
      ...(opts.continueTurns === false ? { continueTurns: false } : {}),
      ...(opts.workers ? { workers: opts.workers } : {}),
      ...(place ? { place, emittedElsewhere: () => relay?.wake() } : {}),
    });
    consumer = this.consumer = new QueueConsumer({
      boss: this.boss,
      fetch: async (limit) => {
        if (!this.fetchHeads) throw new CorralError('internal', 'the daemon is not prepared');
        try {
          const jobs = await this.fetchHeads<ActorEventJobData>(limit);
          if (jobs.length === 0) opts.fetched?.(this);
          return jobs;
        } catch (e) {
          opts.fetched?.(this);
          throw e;
        }
      },
      queueName: this.queues.events,
      bossSchema: names.boss,
      clock,
      logger,
      pollIntervalMs: config.pollIntervalMs,
      batchSize: config.fetchBatchSize,
      capacity: () => (opts.capacity ? opts.capacity(this) : this.runtime.fetchCapacity()),
      onJobs: (jobs) => {
        opts.onActivity?.();
        this.runtime.dispatchJobs(jobs);
        opts.fetched?.(this);
      },
    });
    this.watchdog = new Watchdog({
      db: this.database.db,
      failures: this.runtime.failures,
      dispatcher: this.runtime.dispatcher,
      ...(opts.workers ? {} : { workers: this.runtime.workers }),
      clock,
      logger,
      intervalMs: config.watchdogIntervalMs,
      idleTimeoutMs: config.idleTimeoutMs,
      maxTurnMs: config.maxTurnMs,
    });
    this.retention = new Periodic(() => this.sweep(), {
      clock,
      log: this.log,
      intervalMs: RETENTION_INTERVAL_MS,
      what: 'retention sweep',
      firstPass: 'now',
    });
    this.outbox = new OutboxSender({
      db: this.database.db,
      listen: (channel, onPayload, onReconnect) => {
        const db = this.boss.getDb();
        if (typeof db.listen !== 'function') return Promise.reject(new Error('pg-boss offers no LISTEN'));
        return db.listen(channel, onPayload, onReconnect);
      },
      clock,
      logger,
      ownerId: opts.ownerId,
      retry: { limit: config.outboxRetryLimit, delayS: config.retryDelaySeconds, maxS: config.retryDelayMaxSeconds },
      ...(opts.metrics ? { metrics: opts.metrics } : {}),
      ...(opts.tracer ? { tracer: opts.tracer } : {}),
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
    relay = this.relay =
      place && opts.pools
        ? new ShardRelay({
            db: this.database.db,
            shard,
            pools: opts.pools,
            queue: this.queues.events,
            clock,
            logger,
            pollMs: RELAY_POLL_MS,
          })
        : undefined;
  }

  private async sweep(): Promise<SweepResult> {
    const { config, clock, signal } = this.opts;
    const result = await sweepRetention({
      boss: this.boss,
      db: this.database.db,
      bossSchema: this.queues.schema,
      queueName: this.queues.events,
      retentionSeconds: config.completedRetentionSeconds,
      runtimeRetentionSeconds: config.runtimeRetentionSeconds,
      clock,
      signal,
    });
    // X3 of src/db/shards/shard-emits.ts: an inbox entry outlives any redelivery of its event
    if (this.shardCount > 1) await pruneShardInbox(this.database.db, Math.max(config.runtimeRetentionSeconds, 86_400));
    return result;
  }

  /**
   * The node's part of the daemon's start, after the database is set up: pg-boss (a shard k > 0 is
   * set up by `corral db migrate --shards N` and checked here), the fetch, the control channel and
   * a first recovery pass. `started`: pg-boss runs already (shard 0, started by the set-up).
   */
  async prepare(started: boolean): Promise<void> {
    if (!started) {
      await this.boss.start();
      const id = await readShardIdentity((text) => this.database.pool.query(text));
      if (!id || id.shard !== this.shard || id.shardCount !== this.shardCount) {
        throw new CorralError(
          'invalid_config',
          `the database of shard ${this.shard} holds ${id ? `shard ${id.shard} of ${id.shardCount}` : 'no shard'}: run corral db migrate --shards ${this.shardCount}`,
        );
      }
    }
    // a batch's events share a turn_start's room for one event (B1 of src/db/turns/batches.ts)
    const batchBytes = Math.floor(this.opts.config.maxMessageBytes / 2);
    this.fetchHeads = keyHeadFetch(this.database.pool, this.queues, await queueTable(this.database.pool, this.queues), batchBytes);
    await this.listenForControl();
  }

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

  /** The node's loops, named for the supervisor (`suffix`: the shard's, with several). */
  loops(): { name: string; run: (signal: AbortSignal) => Promise<void> }[] {
    const suffix = this.shardCount > 1 ? `:s${this.shard}` : '';
    const loops = [
      { name: `queue-consumer${suffix}`, run: (s: AbortSignal) => this.consumer.run(s) },
      { name: `watchdog${suffix}`, run: (s: AbortSignal) => this.watchdog.run(s) },
      { name: `recovery${suffix}`, run: (s: AbortSignal) => this.recovery.run(s) },
      { name: `job-keeper${suffix}`, run: (s: AbortSignal) => this.jobKeeper.run(s) },
      { name: `retention${suffix}`, run: (s: AbortSignal) => this.retention.run(s) },
      { name: `outbox${suffix}`, run: (s: AbortSignal) => this.outbox.run(s) },
    ];
    const relay = this.relay;
    if (relay) loops.push({ name: `shard-relay${suffix}`, run: (s: AbortSignal) => relay.run(s) });
    return loops;
  }

  async closeControl(): Promise<void> {
    await this.controlListener?.close();
  }
}
