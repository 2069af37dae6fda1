/** Transactions with a bounded retry on serialization failures and deadlocks (SQLSTATE 40001, 40P01). */
import { isRetryableTransactionError } from '../base/errors.ts';
import type { Db, Tx } from './client.ts';

export async function inTransaction<T>(db: Db, fn: (tx: Tx) => Promise<T>, attempts = 5): Promise<T> {
  for (let i = 1; ; i++) {
    try {
      return await db.transaction(fn);
    } catch (e) {
      if (i >= attempts || !isRetryableTransactionError(e)) throw e;
    }
  }
}
