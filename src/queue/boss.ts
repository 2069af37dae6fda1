/**
 * pg-boss setup for actor events.
 *
 * One queue (`actor-events` by default) with policy `key_strict_fifo` and `singletonKey` = the
 * actor key: at most one event in flight per actor, FIFO within an actor, other actors never held
 * back (I4). Its dead-letter queue is a `standard` queue (pg-boss does not copy the policy).
 *
 * Retention: a failed head must never vanish silently, and an event may wait for days, so
 * pg-boss never deletes the actor queue's finished jobs (`deleteAfterSeconds: 0`; completed ones
 * are swept by src/queue/retention.ts) and keeps queued jobs for ten years; dead letters likewise
 * stay until an operator replays or discards them.
 */
import { PgBoss, type Db as BossDb, type Queue } from 'pg-boss';
import type pg from 'pg';
import { CorralError } from '../base/errors.ts';
import type { Config } from '../config.ts';
import type { Queues } from '../db/boss/jobs.ts';
import { tuneBossJobTables } from '../db/boss/tuning.ts';
import { installSendEvent } from '../db/enqueue/send-event.ts';
import { installClaimFunction } from '../db/boss/fetch.ts';
import { applyMigrations, withSetupLock } from '../db/migrate.ts';
import { queuesOf } from './names.ts';

export const TEN_YEARS_S = 10 * 365 * 24 * 3600;

export type { Queues };
export { queuesOf };

export type QueueConfig = Pick<
  Config,
  | 'queueName'
  | 'bossSchema'
  | 'retryLimit'
  | 'retryDelaySeconds'
  | 'retryDelayMaxSeconds'
  | 'jobExpireSeconds'
  | 'jobHeartbeatSeconds'
  | 'maxEventBytes'
  | 'inputPolicy'
>;

export interface BossOptions {
  /** Maintenance and LISTEN/NOTIFY: true for the daemon, false for short-lived commands. */
  supervise?: boolean;
  max?: number;
  onError?: (err: Error) => void;
  /** Run every statement on this connection instead of a pool of pg-boss's own (short commands). */
  db?: BossDb;
  /** The pool's client class (a shard's: src/db/shards/shard-sql.ts); pg-boss hands its options to its pool. */
  Client?: typeof pg.Client;
}

/** The supervise/monitor cadence for a job heartbeat period: a third of it, between 1 and 60 s. */
export function superviseSeconds(config: Pick<Config, 'jobHeartbeatSeconds'>): number {
  return Math.max(1, Math.min(60, Math.floor(config.jobHeartbeatSeconds / 3)));
}

export function createBoss(url: string, config: QueueConfig, opts: BossOptions = {}): PgBoss {
  const supervise = opts.supervise ?? false;
  const boss = new PgBoss({
    ...(opts.db ? { db: opts.db } : { connectionString: url, ...(opts.Client ? { Client: opts.Client } : {}) }),
    schema: config.bossSchema,
    max: opts.max ?? 10,
    application_name: 'corral-boss',
    supervise,
    // pg-boss fails jobs whose heartbeat lapsed only in its supervise pass: run it often enough
    // that a job orphaned by a dead daemon is retried about one heartbeat period after it lapsed.
    ...(supervise ? { superviseIntervalSeconds: superviseSeconds(config), monitorIntervalSeconds: superviseSeconds(config) } : {}),
    schedule: false,
    migrate: true,
    useListenNotify: supervise,
    registerInstance: false,
    persistWarnings: false,
  });
  // pg-boss emits 'error' for background failures (e.g. the database restarting); an EventEmitter
  // without an 'error' listener would crash the process.
  boss.on('error', (err: Error) => opts.onError?.(err));
  return boss;
}

/**
 * Creates (or updates) the actor queue and its dead-letter queue. Idempotent. Short commands pass
 * `updateExisting: false` so they never overwrite the settings a daemon configured. With
 * `installFunctions` (default: `updateExisting`), the SQL enqueue `corral.send_event` is
 * (re)made for the queue (src/db/enqueue/send-event.ts): it embeds pg-boss's insert for the queue's table.
 */
export async function ensureQueues(
  boss: PgBoss,
  config: QueueConfig,
  opts: { updateExisting?: boolean; installFunctions?: boolean } = {},
): Promise<Queues> {
  const update = opts.updateExisting ?? true;
  const names = queuesOf(config);
  const dlq = {
    policy: 'standard' as const,
    retentionSeconds: TEN_YEARS_S,
    deleteAfterSeconds: 0,
    retryLimit: 0,
  };
  const events = {
    policy: 'key_strict_fifo' as const,
    deadLetter: names.deadLetter,
    retryLimit: config.retryLimit,
    retryDelay: config.retryDelaySeconds,
    retryBackoff: true,
    retryDelayMax: config.retryDelayMaxSeconds,
    expireInSeconds: config.jobExpireSeconds,
    heartbeatSeconds: config.jobHeartbeatSeconds,
    retentionSeconds: TEN_YEARS_S,
    deleteAfterSeconds: 0,
    notify: true,
  };
  await upsertQueue(boss, names.deadLetter, dlq, update);
  await upsertQueue(boss, names.events, events, update);
  // Fresh planner statistics for the actor queue's job table (drizzle/0002_boss_job_autovacuum.sql):
  // pg-boss creates its tables after corral's migrations ran, so the settings are applied here.
  if (update) await tuneBossJobTables(boss.getDb(), config.bossSchema);
  if (opts.installFunctions ?? update) {
    await installSendEvent(boss.getDb(), config);
    await installClaimFunction(boss.getDb(), names);
  }
  return names;
}

/**
 * The whole set-up of a database, under its set-up lock (U1 of src/db/postgres/setup-lock.ts): corral's
 * migrations (unless `migrations` is false), pg-boss's (it migrates on start), the queues and the
 * SQL functions. `boss` is started here and left running. So a command that finds corral's schema
 * missing, or `corral.send_events` not made yet, sees from the lock that a set-up is under way.
 */
export async function setUpDatabase(
  url: string,
  boss: PgBoss,
  config: QueueConfig,
  opts: { migrations?: boolean; updateExisting?: boolean; installFunctions?: boolean } = {},
): Promise<Queues> {
  const { migrations = true, ...queueOpts } = opts;
  return withSetupLock(url, async (client) => {
    if (migrations) await applyMigrations(client);
    await boss.start();
    return ensureQueues(boss, config, queueOpts);
  });
}

/** Creates the queue, or updates its options (a policy cannot change after creation). */
async function upsertQueue(boss: PgBoss, name: string, options: Omit<Queue, 'name'>, update: boolean): Promise<void> {
  const existing = await boss.getQueue(name);
  if (!existing) {
    try {
      await boss.createQueue(name, options);
      return;
    } catch (e) {
      // another daemon created it at the same moment: fall through to the update
      if (!(await boss.getQueue(name))) throw e;
    }
  }
  if (!update) return;
  const current = await boss.getQueue(name);
  if (current && options.policy && current.policy !== options.policy) {
    throw new CorralError(
      'invalid_config',
      `queue ${name} has policy ${current.policy}, expected ${options.policy}; it cannot be changed in place`,
    );
  }
  const { policy: _policy, ...mutable } = options;
  await boss.updateQueue(name, mutable);
}
