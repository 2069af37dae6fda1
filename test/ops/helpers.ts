/** Dead letters made by the real runtime (a test daemon with retryLimit 0 and the example worker); outbox messages written by SQL. */
import { randomUUID } from 'node:crypto';
import type pg from 'pg';
import { sql } from '../../src/db/orm.ts';
import type { ActorKey } from '../../src/base/actor-key.ts';
import type { Config } from '../../src/config.ts';
import type { DbOrTx } from '../../src/db/client.ts';
import { runExampleWorker } from '../../src/worker/example.ts';
import type { Worker } from '../../src/worker/sdk.ts';
import { startTestDaemon, testLogger, type GivenDatabase, type TestDaemon } from '../helpers/daemon.ts';
import { waitFor } from '../helpers/wait.ts';
import { sendEvent } from '../helpers/send.ts';

export interface Running {
  t: TestDaemon<GivenDatabase>;
  worker: Worker;
  stop(): Promise<void>;
}

/** A daemon (first failure dead-letters) and one example worker on `db`. */
export async function startFailingRuntime(db: GivenDatabase, overrides: Partial<Config> = {}, workerId = 'ops-w1'): Promise<Running> {
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
    for (const e of events) ids.push((await sendEvent(tx, e.key, e.payload)).eventId);
  });
  await waitFor(async () => (await deadLetterCount(db, ids)) >= expectDead, { what: 'dead letters', timeoutMs: 30_000 });
  return ids;
}

/** Runs a failing runtime just long enough to dead-letter `events`; returns their event ids. */
export async function makeDeadLetters(db: GivenDatabase, events: { key: ActorKey; payload: unknown }[]): Promise<string[]> {
  const r = await startFailingRuntime(db);
  try {
    return await enqueueAndWait(r, events);
  } finally {
    await r.stop();
  }
}

/** An outbox message as a commit would have written it, in any state (for operators' views). */
export interface OutboxRowInput {
  sink: string;
  actor?: string;
  state: 'pending' | 'delivered' | 'dead' | 'discarded';
  attempts?: number;
  lastStatus?: number | null;
  lastError?: string | null;
  key?: string;
  body?: string;
  claimedBy?: string;
}

/** Writes one message by SQL, due in an hour (no sender takes it meanwhile); its id. */
export async function insertOutboxMessage(raw: pg.Client, r: OutboxRowInput): Promise<number> {
  const [agent, session] = (r.actor ?? 'ops-a/s1').split('/');
  const res = await raw.query<{ id: string }>(
    `insert into corral.outbox (sink, webhook_id, agent_uid, session_id, turn_id, event_id, position, body, state, attempts,
                                last_status, last_error, claimed_by, claimed_until, delivered_at, next_attempt_at)
     values ($1, $2, $3, $4, $5, $6, 0, $7, $8, $9, $10, $11, $12, case when $12::text is null then null else now() + interval '30 seconds' end,
             case when $8 = 'delivered' then now() end, now() + interval '1 hour')
     returning id`,
    [
      r.sink,
      r.key ?? `msg_${randomUUID()}`,
      agent,
      session,
      randomUUID(),
      randomUUID(),
      r.body ?? JSON.stringify({ hello: r.sink }),
      r.state,
      r.attempts ?? (r.state === 'pending' ? 0 : 1),
      r.lastStatus ?? null,
      r.lastError ?? null,
      r.claimedBy ?? null,
    ],
  );
  return Number(res.rows[0]!.id);
}
