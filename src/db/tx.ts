/** Transactions with a bounded retry on serialization failures and deadlocks (SQLSTATE 40001, 40P01). */
import type { Db, Tx } from './client.ts';

const RETRYABLE = new Set(['40001', '40P01']);

function sqlState(e: unknown): string | undefined {
  const err = e as { code?: unknown; cause?: unknown } | null;
  if (!err) return undefined;
  if (typeof err.code === 'string' && /^[0-9A-Z]{5}$/.test(err.code)) return err.code;
  return err.cause && err.cause !== err ? sqlState(err.cause) : undefined;
}

export async function inTransaction<T>(db: Db, fn: (tx: Tx) => Promise<T>, attempts = 5): Promise<T> {
  for (let i = 1; ; i++) {
    try {
      return await db.transaction(fn);
    } catch (e) {
      const state = sqlState(e);
      if (i >= attempts || !state || !RETRYABLE.has(state)) throw e;
    }
  }
}
