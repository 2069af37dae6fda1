/**
 * Retention: what the daemon deletes so its tables hold what is live and retained, not all of
 * history. One pass, in order:
 *  1. the runtime rows (finished deliveries, ended activations) older than
 *     `CORRAL_RUNTIME_RETENTION_S` (src/db/operations/runtime-pruning.ts);
 *  2. the turns and messages past an agent's transcript retention, for the agents that have one
 *     (`corral retention set`, src/db/operations/transcript-retention.ts); transcripts stay by default;
 *  3. the actor queue's `completed` jobs older than `CORRAL_COMPLETED_RETENTION_S`: the queue is
 *     created with `deleteAfterSeconds: 0` because pg-boss's own sweep would also delete *failed*
 *     jobs, and in dead-letter mode `block` a failed head must never vanish. Candidates come from
 *     src/db/boss/jobs.ts (pg-boss's index on `completed_on`), deletes go through pg-boss's API;
 *  4. the idempotency keys older than the retention whose event's job is gone
 *     (src/db/enqueue/idempotency.ts), so a key lives at least as long as its event's job;
 *  5. the outbox messages delivered or discarded longer ago than `CORRAL_COMPLETED_RETENTION_S`
 *     (src/db/outbox/messages.ts): kept as long as a completed event, never while pending or dead.
 *
 * Each step drains what is due, a batch per statement, until a batch comes back short (`drain`):
 * deletes keep up with any commit rate instead of a fixed number per pass. Between batches it
 * pauses in proportion to the batch (`SweepPace.duty`), so a backlog of expired rows takes at most
 * that share of one connection and the turn path keeps the rest. A pass with nothing due is one
 * index probe per step.
 *
 * pg-boss's own maintenance of these queues (a walk of every job, once a day) is held off by each
 * pass (`holdBossMaintenance`), since on them it has nothing to delete.
 */
import type { PgBoss } from 'pg-boss';
import { systemClock, type Clock } from '../base/clock.ts';
import { completedJobsOlderThan, holdBossMaintenance } from '../db/boss/jobs.ts';
import type { DbOrTx } from '../db/client.ts';
import { pruneIdempotencyKeys } from '../db/enqueue/idempotency.ts';
import { pruneStreamChunks } from '../db/live/chunks.ts';
import { pruneOutbox } from '../db/outbox/messages.ts';
import { pruneExpiredApiTokens } from '../db/operations/api-tokens.ts';
import { pruneActivations, pruneDeliveries } from '../db/operations/runtime-pruning.ts';
import { markTranscriptChecked, pruneAgentTranscripts, transcriptRetentionDue } from '../db/operations/transcript-retention.ts';
import { queuesOf } from './names.ts';

/** How fast a pass deletes. */
export interface SweepPace {
  /** Rows per statement. */
  batchSize?: number;
  /**
   * The share of a pass's time spent in its statements, in (0, 1]: after a batch that took d ms
   * the pass waits d × (1 − duty) / duty before the next. 1 deletes without pausing.
   */
  duty?: number;
  clock?: Clock;
  /** Ends the pass between batches (the daemon stopping). */
  signal?: AbortSignal;
}

export const DEFAULT_SWEEP_BATCH = 5_000;
export const DEFAULT_SWEEP_DUTY = 0.2;

export interface RetentionOptions extends SweepPace {
  boss: PgBoss;
  db: DbOrTx;
  bossSchema: string;
  queueName: string;
  /** Completed jobs older than this are deleted; 0 keeps them forever. */
  retentionSeconds: number;
  /** Finished deliveries and ended activations older than this are deleted (src/db/operations/runtime-pruning.ts); 0 or unset keeps them. */
  runtimeRetentionSeconds?: number;
}

/** What one pass deleted. */
export interface SweepResult {
  runtimeRows: number;
  /** Turns and messages deleted by the agents' transcript retention. */
  transcriptRows: number;
  jobs: number;
  idempotencyKeys: number;
  /** Outbox messages delivered or discarded longer ago than the retention. */
  outboxMessages: number;
  /** API tokens expired longer ago than the retention. */
  expiredTokens: number;
  /** Live turns' chunks whose delivery ended (S3 of src/db/live/chunks.ts): the daemon that ran it was gone before it deleted them. */
  streamChunks: number;
}

/**
 * Runs `step` (deletes up to `limit` rows, returns how many) until it deletes fewer than a batch,
 * pausing between batches as `pace` says. Returns the rows deleted.
 */
export async function drain(step: (limit: number) => Promise<number>, pace: SweepPace = {}): Promise<number> {
  const batch = pace.batchSize ?? DEFAULT_SWEEP_BATCH;
  const duty = Math.min(1, Math.max(0.01, pace.duty ?? DEFAULT_SWEEP_DUTY));
  const clock = pace.clock ?? systemClock;
  let deleted = 0;
  while (!pace.signal?.aborted) {
    const t0 = clock.nowMs();
    const n = await step(batch);
    deleted += n;
    if (n < batch) break;
    const pause = ((clock.nowMs() - t0) * (1 - duty)) / duty;
    if (pause > 0) await clock.sleep(pause, pace.signal).catch(() => undefined);
  }
  return deleted;
}

/**
 * One retention pass: runtime rows, then completed jobs, then idempotency keys. It first stamps
 * pg-boss's maintenance claim on the queues (src/db/boss/internals.ts S12): this pass is their
 * maintenance, and pg-boss's daily walk of every job would find nothing to delete on them.
 */
export async function sweepRetention(opts: RetentionOptions): Promise<SweepResult> {
  const q = queuesOf({ queueName: opts.queueName, bossSchema: opts.bossSchema });
  const failures: unknown[] = [];
  // each step on its own: one that fails (a lock timeout, a bug) leaves the others their pass
  const step = async (run: () => Promise<number>): Promise<number> => {
    try {
      return await run();
    } catch (e) {
      failures.push(e);
      return 0;
    }
  };
  await step(async () => (await holdBossMaintenance(opts.db, q.schema, [q.events, q.deadLetter]), 0));
  const result: SweepResult = {
    runtimeRows: await step(() => pruneRuntimeRows(opts)),
    transcriptRows: await step(() => pruneTranscriptRows(opts)),
    jobs: await step(() => sweepCompletedJobs(opts)),
    idempotencyKeys: await step(() => sweepIdempotencyKeys(opts)),
    outboxMessages: await step(() => sweepOutbox(opts)),
    expiredTokens: await step(() => sweepExpiredTokens(opts)),
    streamChunks: await step(() => pruneStreamChunks(opts.db)),
  };
  if (failures.length === 1) throw failures[0];
  if (failures.length > 1) throw new AggregateError(failures, `${failures.length} retention steps failed`);
  return result;
}

/** Deletes the completed jobs of the actor queue older than the retention. Returns how many. */
export async function sweepCompletedJobs(opts: RetentionOptions): Promise<number> {
  if (opts.retentionSeconds <= 0) return 0;
  return drain(async (limit) => {
    const ids = await completedJobsOlderThan(opts.db, opts.bossSchema, opts.queueName, opts.retentionSeconds, limit);
    if (ids.length > 0) await opts.boss.deleteJob(opts.queueName, ids);
    return ids.length;
  }, opts);
}

/** Deletes the outbox messages delivered or discarded longer ago than the retention. Returns how many. */
export async function sweepOutbox(opts: Pick<RetentionOptions, 'db' | 'retentionSeconds'> & SweepPace): Promise<number> {
  if (opts.retentionSeconds <= 0) return 0;
  return drain((limit) => pruneOutbox(opts.db, opts.retentionSeconds, limit), opts);
}

/** A3 of src/db/operations/api-tokens.ts: deletes the API tokens expired longer ago than the retention. Returns how many. */
export async function sweepExpiredTokens(opts: Pick<RetentionOptions, 'db' | 'retentionSeconds'> & SweepPace): Promise<number> {
  if (opts.retentionSeconds <= 0) return 0;
  return drain((limit) => pruneExpiredApiTokens(opts.db, opts.retentionSeconds, limit), opts);
}

/** Deletes idempotency keys older than the retention whose event's job is gone. Returns how many. */
export async function sweepIdempotencyKeys(opts: Omit<RetentionOptions, 'boss'>): Promise<number> {
  if (opts.retentionSeconds <= 0) return 0;
  const q = queuesOf({ queueName: opts.queueName, bossSchema: opts.bossSchema });
  return drain((limit) => pruneIdempotencyKeys(opts.db, q, opts.retentionSeconds, limit), opts);
}

/** Deletes the finished deliveries, then the ended activations, older than the runtime retention. Returns how many rows. */
export async function pruneRuntimeRows(opts: Pick<RetentionOptions, 'db' | 'runtimeRetentionSeconds'> & SweepPace): Promise<number> {
  const seconds = opts.runtimeRetentionSeconds ?? 0;
  if (seconds <= 0) return 0;
  let deleted = 0;
  for (const prune of [pruneDeliveries, pruneActivations]) deleted += await drain((limit) => prune(opts.db, seconds, limit), opts);
  return deleted;
}

/**
 * Deletes the turns (with their messages) past each agent's transcript retention, for the agents
 * something may be due of (R7 of src/db/operations/transcript-retention.ts). Returns how many rows.
 */
export async function pruneTranscriptRows(opts: Pick<RetentionOptions, 'db'> & SweepPace): Promise<number> {
  let rows = 0;
  for (const policy of await transcriptRetentionDue(opts.db)) {
    await drain(async (limit) => {
      const n = await pruneAgentTranscripts(opts.db, policy.agentUid, policy.keepSeconds, limit);
      rows += n.turns + n.messages;
      return n.turns;
    }, opts);
    // an aborted drain leaves due_at as it was: the next pass starts over
    if (!opts.signal?.aborted) await markTranscriptChecked(opts.db, policy.agentUid, policy.keepSeconds);
  }
  return rows;
}
