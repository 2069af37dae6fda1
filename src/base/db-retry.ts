/**
 * Turn operations ride out a database that is away for a while (a restart, a network blip): a
 * worker's result must not be dropped because PostgreSQL was unreachable. The fence decides
 * afterwards whether the result still counts.
 */
import { backoffDelayMs } from './backoff.ts';
import type { Clock } from './clock.ts';
import { errorMessage, isConnectionError } from './errors.ts';
import type { Logger } from './logger.ts';

/** How long a turn operation keeps retrying while the database is unreachable. */
export const DATABASE_RETRY_MS = 120_000;

export type DatabaseRetry = <T>(fn: () => Promise<T>, fields: Record<string, unknown>) => Promise<T>;

/**
 * A retry bound to `clock` and `log`: runs `fn`, retrying with jittered backoff on connection
 * errors for up to DATABASE_RETRY_MS, unless `stopping()` says the process is shutting down.
 */
export function databaseRetry(opts: { clock: Clock; log: Logger; stopping: () => boolean }): DatabaseRetry {
  return async <T>(fn: () => Promise<T>, fields: Record<string, unknown>): Promise<T> => {
    const deadline = opts.clock.nowMs() + DATABASE_RETRY_MS;
    for (let attempt = 1; ; attempt++) {
      try {
        return await fn();
      } catch (e) {
        if (!isConnectionError(e) || opts.clock.nowMs() > deadline || opts.stopping()) throw e;
        const delay = backoffDelayMs(attempt, { baseMs: 100, maxMs: 5_000 });
        opts.log.warn({ ...fields, err: errorMessage(e), retryInMs: delay }, 'database unavailable; retrying');
        await opts.clock.sleep(delay);
      }
    }
  };
}
