/**
 * Retention of finished actor events. The actor queue is created with `deleteAfterSeconds: 0`
 * because pg-boss's own sweep would also delete *failed* jobs, and in dead-letter mode `block` a
 * failed head must never vanish (it holds its actor until an operator acts). This sweep removes
 * only `completed` jobs older than the retention, so the job table does not grow without bound.
 * It reads candidates (src/db/boss-jobs.ts) and deletes them through pg-boss's API. Then it
 * deletes the idempotency keys (src/db/idempotency.ts) older than the retention whose event's job
 * is gone, so a key lives at least as long as its event's job. Before either, it prunes the
 * runtime rows (finished deliveries, ended activations) older than `CORRAL_RUNTIME_RETENTION_S`
 * (src/db/runtime-pruning.ts).
 */
import type { PgBoss } from 'pg-boss';
import { completedJobsOlderThan } from '../db/boss-jobs.ts';
import type { DbOrTx } from '../db/client.ts';
import { pruneIdempotencyKeys } from '../db/idempotency.ts';
import { pruneActivations, pruneDeliveries } from '../db/runtime-pruning.ts';
import { queuesOf } from './names.ts';

export interface RetentionOptions {
  boss: PgBoss;
  db: DbOrTx;
  bossSchema: string;
  queueName: string;
  /** Completed jobs older than this are deleted; 0 keeps them forever. */
  retentionSeconds: number;
  batchSize?: number;
  /** At most this many batches per sweep, so one sweep stays short. */
  maxBatches?: number;
  /** Finished deliveries and ended activations older than this are deleted (src/db/runtime-pruning.ts); 0 or unset keeps them. */
  runtimeRetentionSeconds?: number;
}

/** Deletes completed jobs of the actor queue older than the retention, then their idempotency keys. Returns how many jobs. */
export async function sweepCompletedJobs(opts: RetentionOptions): Promise<number> {
  await pruneRuntimeRows(opts);
  if (opts.retentionSeconds <= 0) return 0;
  const batch = opts.batchSize ?? 1_000;
  let deleted = 0;
  for (let i = 0; i < (opts.maxBatches ?? 20); i++) {
    const ids = await completedJobsOlderThan(opts.db, opts.bossSchema, opts.queueName, opts.retentionSeconds, batch);
    if (ids.length === 0) break;
    await opts.boss.deleteJob(opts.queueName, ids);
    deleted += ids.length;
    if (ids.length < batch) break;
  }
  await sweepIdempotencyKeys(opts);
  return deleted;
}

/** Deletes idempotency keys older than the retention whose event's job is gone. Returns how many. */
export async function sweepIdempotencyKeys(opts: Omit<RetentionOptions, 'boss'>): Promise<number> {
  if (opts.retentionSeconds <= 0) return 0;
  const batch = opts.batchSize ?? 1_000;
  const q = queuesOf({ queueName: opts.queueName, bossSchema: opts.bossSchema });
  let deleted = 0;
  for (let i = 0; i < (opts.maxBatches ?? 20); i++) {
    const n = await pruneIdempotencyKeys(opts.db, q, opts.retentionSeconds, batch);
    deleted += n;
    if (n < batch) break;
  }
  return deleted;
}

/** Deletes the finished deliveries, then the ended activations, older than the runtime retention. Returns how many rows. */
export async function pruneRuntimeRows(
  opts: Pick<RetentionOptions, 'db' | 'runtimeRetentionSeconds' | 'batchSize' | 'maxBatches'>,
): Promise<number> {
  const seconds = opts.runtimeRetentionSeconds ?? 0;
  if (seconds <= 0) return 0;
  const batch = opts.batchSize ?? 1_000;
  let deleted = 0;
  for (const prune of [pruneDeliveries, pruneActivations]) {
    for (let i = 0; i < (opts.maxBatches ?? 20); i++) {
      const n = await prune(opts.db, seconds, batch);
      deleted += n;
      if (n < batch) break;
    }
  }
  return deleted;
}
