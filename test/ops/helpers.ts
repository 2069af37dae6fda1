/** Dead letters made by the real runtime: a test daemon with retryLimit 0 and the example worker. */
import { sql } from '../../src/db/orm.ts';
import type { ActorKey } from '../../src/actor-key.ts';
import type { Config } from '../../src/config.ts';
import type { DbOrTx } from '../../src/db/client.ts';
import { runExampleWorker } from '../../src/worker/example.ts';
import type { Worker } from '../../src/worker/sdk.ts';
import { startTestDaemon, testLogger, type TestDaemon } from '../helpers/daemon.ts';
import type { TestDatabase } from '../helpers/db.ts';
import { waitFor } from '../helpers/wait.ts';

export interface Running {
  t: TestDaemon;
  worker: Worker;
  stop(): Promise<void>;
}

/** A daemon (first failure dead-letters) and one example worker on `db`. */
export async function startFailingRuntime(db: TestDatabase, overrides: Partial<Config> = {}, workerId = 'ops-w1'): Promise<Running> {
  const t = await startTestDaemon({ retryLimit: 0, deadLetterMode: 'continue', ...overrides }, { db });
  const worker = await runExampleWorker({ endpoint: t.daemon.broker.endpoint, workerId, logger: testLogger });
  return {
    t,
    worker,
    async stop() {
      await worker.stop();
      await t.daemon.stop();
    },
  };
}

/** Dead-letter copies whose event is one of `eventIds`. */
export async function deadLetterCount(db: DbOrTx, eventIds: readonly string[]): Promise<number> {
  const r = await db.execute<{ n: number }>(
    sql`select count(*)::int as n from pgboss.job where name = 'actor-events-dlq' and source_id = any(${sql.param([...eventIds])}::uuid[])`,
  );
  return r.rows[0]!.n;
}

/** Enqueues `events` in one transaction and waits until `expectDead` of them are dead letters. */
export async function enqueueAndWait(
  r: Running,
  events: { key: ActorKey; payload: unknown }[],
  expectDead = events.length,
): Promise<string[]> {
  const db = r.t.daemon.database.db;
  const ids: string[] = [];
  await db.transaction(async (tx) => {
    for (const e of events) ids.push((await r.t.daemon.events.enqueueActorEvent(tx, e.key, e.payload)).eventId);
  });
  await waitFor(async () => (await deadLetterCount(db, ids)) >= expectDead, { what: 'dead letters', timeoutMs: 30_000 });
  return ids;
}

/** Runs a failing runtime just long enough to dead-letter `events`; returns their event ids. */
export async function makeDeadLetters(db: TestDatabase, events: { key: ActorKey; payload: unknown }[]): Promise<string[]> {
  const r = await startFailingRuntime(db);
  try {
    return await enqueueAndWait(r, events);
  } finally {
    await r.stop();
  }
}
