/**
 * A synthetic history for the history benchmark (bench/history.ts): completed jobs of the actor
 * queue and committed turns, shaped like the rows a daemon writes (the same columns, data and
 * states, spread over the days a deployment retains), made with `INSERT … SELECT generate_series`.
 *
 * Loading tens of millions of rows through the indexes is slow, so the secondary indexes of the
 * tables it fills are dropped first and rebuilt from their own definitions after the load, and
 * foreign-key triggers are off for the session (the rows it writes are consistent by
 * construction). The database must not be in use meanwhile (no daemon running).
 */
import type pg from 'pg';
import { progress } from './common.ts';

export interface HistoryShape {
  /** pg-boss's schema and the actor queue's job table in it (`job_common` unless partitioned). */
  bossSchema: string;
  jobTable: string;
  queue: string;
  /** Completed jobs, spread over `retainedDays` (all younger than the retention). */
  completedJobs: number;
  retainedDays: number;
  /** Retention of completed jobs, in seconds: the expired jobs finished before it. */
  retentionSeconds: number;
  /** Actors of the history; each gets `turns / actors` committed turns with two messages each. */
  actors: number;
  turns: number;
  /** Finished deliveries and stopped activations, younger than the runtime window (a day). */
  deliveries: number;
  activations: number;
  /** Rows per insert statement. */
  chunk?: number;
}

/** The tables the history fills. */
function tablesOf(h: HistoryShape): string[] {
  return [
    `${h.bossSchema}.${h.jobTable}`,
    'corral.conversations',
    'corral.turns',
    'corral.messages',
    'corral.activations',
    'corral.deliveries',
  ];
}

interface DroppedIndex {
  name: string;
  def: string;
}

/** Drops the secondary indexes (no primary key, no constraint's index) of `tables`; returns how to rebuild them. */
async function dropSecondaryIndexes(c: pg.ClientBase, tables: string[]): Promise<DroppedIndex[]> {
  const { rows } = await c.query<DroppedIndex>(
    `select i.indexrelid::regclass::text as name, pg_get_indexdef(i.indexrelid) as def
       from pg_index i
      where i.indrelid = any($1::regclass[]) and not i.indisprimary
        and not exists (select 1 from pg_constraint k where k.conindid = i.indexrelid)`,
    [tables],
  );
  for (const r of rows) await c.query(`drop index ${r.name}`);
  return rows;
}

async function timed(what: string, fn: () => Promise<unknown>): Promise<void> {
  const t0 = performance.now();
  await fn();
  progress(`history: ${what} (${((performance.now() - t0) / 1000).toFixed(1)} s)`);
}

/**
 * A UUIDv7 for the moment `ts` (an SQL timestamptz), as the daemon makes its keys (time-ordered,
 * so new rows land at the end of each key's index); `slot` (0–4) picks its random bits from
 * `rnd`, 96 random hex digits of the row (`RANDOM_HEX`).
 */
const uuid7 = (ts: string, slot: number) =>
  `(lpad(to_hex((extract(epoch from ${ts}) * 1000)::bigint), 12, '0') || '7' || substr(ts.rnd, ${1 + slot * 18}, 3) || '8' || substr(ts.rnd, ${4 + slot * 18}, 15))::uuid`;
const RANDOM_HEX = 'md5(random()::text) || md5(random()::text) || md5(random()::text)';

/**
 * Completed jobs `from`..`to` of `total`, the last finished at `ageFrom` and the first `retainedDays`
 * before it (oldest first); each ran a second after it was created.
 */
function completedJobsInsert(h: HistoryShape, from: number, to: number, total: number, ageFrom: string): string {
  const job = `${h.bossSchema}.${h.jobTable}`;
  const span = h.retainedDays * 86_400;
  return `
      insert into ${job} (id, name, data, state, policy, singleton_key, retry_limit, retry_delay, retry_backoff,
                          start_after, created_on, started_on, completed_on, heartbeat_seconds, expire_seconds)
      select ${uuid7('ts.t', 0)}, '${h.queue}',
             jsonb_build_object('agentUid', 'history', 'sessionId', 's' || (g % ${h.actors}),
                                'payload', jsonb_build_object('text', 'message ' || g), 'enqueuedAt', now()::text),
             'completed', 'key_strict_fifo', 'history/s' || (g % ${h.actors}), 3, 5, true,
             t, t, t + interval '1 second', t + interval '2 seconds', 30, 900
        from generate_series(${from}, ${to}) g,
             lateral (select ${ageFrom} - (${total} - g) * (${span}::float8 / ${Math.max(1, total)}) * interval '1 second' as t,
                             ${RANDOM_HEX} as rnd) ts`;
}

/** Adds `n` completed jobs past the retention (what a sweep must delete), through the indexes, and analyzes the table. */
export async function addExpiredJobs(pool: pg.Pool, h: HistoryShape, n: number): Promise<void> {
  const chunk = h.chunk ?? 1_000_000;
  const edge = `now() - interval '${h.retentionSeconds + 3600} seconds'`;
  for (let from = 1; from <= n; from += chunk) {
    const to = Math.min(n, from + chunk - 1);
    await timed(`expired jobs ${from}–${to}`, () => pool.query(completedJobsInsert({ ...h, retainedDays: 1 }, from, to, n, edge)));
  }
  await pool.query(`analyze ${h.bossSchema}.${h.jobTable}`);
}

/** Fills the tables with the history `h` describes, rebuilds their indexes and analyzes them. */
export async function growHistory(pool: pg.Pool, h: HistoryShape): Promise<void> {
  const c = await pool.connect();
  const chunk = h.chunk ?? 1_000_000;
  const turnsPerActor = Math.max(1, Math.floor(h.turns / h.actors));
  try {
    await c.query(`set synchronous_commit = off`);
    await c.query(`set maintenance_work_mem = '256MB'`);
    await c.query(`set session_replication_role = replica`);
    const dropped = await dropSecondaryIndexes(c, tablesOf(h));
    progress(`history: dropped ${dropped.length} secondary indexes for the load`);
    const span = h.retainedDays * 86_400;
    const jobsInsert = (from: number, to: number, total: number, ageFrom: string) => completedJobsInsert(h, from, to, total, ageFrom);

    for (let from = 1; from <= h.completedJobs; from += chunk) {
      const to = Math.min(h.completedJobs, from + chunk - 1);
      await timed(`completed jobs ${from}–${to}`, () => c.query(jobsInsert(from, to, h.completedJobs, "now() - interval '1 minute'")));
    }
    await timed(`${h.actors} conversations`, () =>
      c.query(`
        insert into corral.conversations (id, agent_uid, session_id, next_seq)
        select ${uuid7('ts.t', 0)}, 'history', 's' || g, ${2 * turnsPerActor + 1}
          from generate_series(0, ${h.actors - 1}) g, lateral (select now() - interval '${span} seconds' as t, g as n, ${RANDOM_HEX} as rnd) ts`),
    );
    // turns: `turnsPerActor` per conversation, spread over the retained days
    const turnsSpan = span / turnsPerActor;
    for (let k = 0; k < turnsPerActor; k++) {
      await timed(`turn ${k + 1} of ${turnsPerActor} of every actor`, async () => {
        await c.query(`
          with t as (
            insert into corral.turns (id, conversation_id, event_id, delivery_id, status, activation_uid, actor_epoch, revision, attempt,
                                      worker_id, input, output, started_at, finished_at)
            select ${uuid7('ts.t', 0)}, v.id, ${uuid7('ts.t', 1)}, ${uuid7('ts.t', 2)}, 'succeeded', ${uuid7('ts.t', 3)}, ${k + 1}, 1, 1,
                   'history-worker', jsonb_build_object('text', 'message ' || ${k}), jsonb_build_object('text', 'reply ' || ${k}),
                   ts.t, ts.t + interval '1 second'
              from corral.conversations v,
                   lateral (select now() - ${span - k * turnsSpan} * interval '1 second' + (hashtext(v.session_id) & 1023) * interval '1 second' as t,
                                   ${RANDOM_HEX} as rnd) ts
             where v.agent_uid = 'history'
            returning id, conversation_id, input, output, finished_at)
          insert into corral.messages (conversation_id, turn_id, seq, role, content, created_at)
          select t.conversation_id, t.id, ${2 * k + 1} + r.n, case r.n when 0 then 'user' else 'assistant' end,
                 case r.n when 0 then t.input else t.output end, t.finished_at
            from t, (values (0), (1)) r(n)`);
      });
    }
    await timed(`${h.activations} stopped activations`, () =>
      c.query(`
        insert into corral.activations (activation_uid, agent_uid, session_id, actor_epoch, lease_id, lease_expires_at, owner_id,
                                        revision, status, end_reason, created_at, updated_at, ended_at)
        select ${uuid7('ts.t', 0)}, 'history', 's' || (g % ${h.actors}), 1000 + g / ${h.actors}, gen_random_uuid(),
               now() - interval '1 hour', 'history-daemon', 1, 'stopped', 'idle', t, t, t
          from generate_series(0, ${h.activations - 1}) g,
               lateral (select now() - interval '20 hours' + g * (72000.0 / ${h.activations}) * interval '1 second' as t,
                               ${RANDOM_HEX} as rnd) ts`),
    );
    await timed(`${h.deliveries} finished deliveries`, () =>
      c.query(`
        insert into corral.deliveries (delivery_id, activation_uid, agent_uid, session_id, actor_epoch, event_id, revision,
                                       job_retry_count, worker_id, state, created_at, updated_at)
        select ${uuid7('ts.t', 0)}, a.activation_uid, a.agent_uid, a.session_id, a.actor_epoch, ${uuid7('ts.t', 1)}, 1, 0,
               'history-worker', 'completed', a.ended_at, a.ended_at
          from corral.activations a, generate_series(1, ${Math.max(1, Math.ceil(h.deliveries / h.activations))}) r,
               lateral (select a.ended_at as t, r.r as copy, ${RANDOM_HEX} as rnd) ts
         where a.owner_id = 'history-daemon'
         limit ${h.deliveries}`),
    );
    for (const d of dropped) await timed(`index ${d.name}`, () => c.query(d.def));
    await c.query(`set session_replication_role = origin`);
    for (const t of tablesOf(h)) await timed(`vacuum analyze ${t}`, () => c.query(`vacuum (analyze) ${t}`));
  } finally {
    c.release();
  }
}
