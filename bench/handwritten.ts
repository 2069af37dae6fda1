/**
 * The baseline a user would write instead of corral: a pg-boss consumer on a `key_strict_fifo`
 * queue that, per job, writes the same transcript rows as a corral turn (the turn, the user
 * message, an assistant message) and completes the job with its attempt fence, all in one
 * transaction. No fence, no activation, no worker hop. Jobs are fetched 50 at a time and run 10 at
 * a time, each in its own transaction (what `work()` with a transactional handler does).
 *
 * Its tables live in a schema of their own (`bench_hand`), shaped like corral's transcript:
 * conversations with a sequence counter, turns, messages.
 */
import type pg from 'pg';
import type { PgBoss } from 'pg-boss';
import { v7 as uuidv7 } from 'uuid';

export const HAND_CONCURRENCY = 10;
const FETCH_BATCH = 50;

export interface HandResult {
  jobs: number;
  totalMs: number;
  jobsPerSec: number;
}

/** Creates the baseline's tables (idempotent). */
export async function setupHandwritten(pool: pg.Pool): Promise<void> {
  await pool.query(`
    create schema if not exists bench_hand;
    create table if not exists bench_hand.conversations (
      id bigserial primary key, agent_uid text not null, session_id text not null, next_seq bigint not null,
      unique (agent_uid, session_id));
    create table if not exists bench_hand.turns (
      id bigserial primary key, conversation_id bigint not null references bench_hand.conversations(id),
      event_id uuid not null unique, status text not null, input jsonb, output jsonb, finished_at timestamptz not null default now());
    create table if not exists bench_hand.messages (
      conversation_id bigint not null references bench_hand.conversations(id), seq bigint not null,
      turn_id bigint not null references bench_hand.turns(id), role text not null, content jsonb not null,
      primary key (conversation_id, seq));`);
}

/** One job's transcript rows, in one statement: the conversation's counter moves by two. */
const WRITE_TURN = `
  with c as (
    insert into bench_hand.conversations (agent_uid, session_id, next_seq) values ($1, $2, 3)
    on conflict (agent_uid, session_id) do update set next_seq = bench_hand.conversations.next_seq + 2
    returning id, next_seq - 2 as first
  ), t as (
    insert into bench_hand.turns (conversation_id, event_id, status, input, output)
    select id, $3, 'succeeded', $4::jsonb, $5::jsonb from c
    returning id, conversation_id
  )
  insert into bench_hand.messages (conversation_id, seq, turn_id, role, content)
  select t.conversation_id, c.first + x.ord, t.id, x.role, x.content
    from t, c, (values (0, 'user', $4::jsonb), (1, 'assistant', $5::jsonb)) as x(ord, role, content)`;

async function runJob(
  pool: pg.Pool,
  boss: PgBoss,
  queue: string,
  job: { id: string; retryCount: number; data: { agentUid: string; sessionId: string; payload: unknown } },
): Promise<void> {
  const client = await pool.connect();
  try {
    await client.query('begin');
    const reply = { text: `echo: ${JSON.stringify(job.data.payload)}` };
    await client.query(WRITE_TURN, [
      job.data.agentUid,
      job.data.sessionId,
      job.id,
      JSON.stringify(job.data.payload),
      JSON.stringify(reply),
    ]);
    const res = (await boss.complete(queue, { id: job.id, retryCount: job.retryCount }, null, {
      db: { executeSql: (text: string, values?: unknown[]) => client.query(text, values) },
    })) as { affected?: number };
    if (res.affected !== 1) throw new Error(`hand-written baseline: job ${job.id} did not complete`);
    await client.query('commit');
  } catch (e) {
    await client.query('rollback').catch(() => undefined);
    throw e;
  } finally {
    client.release();
  }
}

/** Inserts `n` jobs over `actors` keys, then consumes them as above until drained. */
export async function handwrittenSlice(
  pool: pg.Pool,
  boss: PgBoss,
  queue: string,
  n: number,
  actors: number,
  deadline: number,
): Promise<HandResult> {
  const run = uuidv7().slice(-8);
  const jobs = Array.from({ length: n }, (_, i) => {
    const s = `s${i % actors}`;
    return { id: uuidv7(), singletonKey: `hand-${run}/${s}`, data: { agentUid: `hand-${run}`, sessionId: s, payload: { text: `e${i}` } } };
  });
  const t0 = performance.now();
  await boss.insert(queue, jobs);
  let done = 0;
  let empty = 0;
  while (done < n) {
    if (performance.now() > deadline) throw new Error(`hand-written baseline: ${done}/${n} jobs done at the deadline`);
    const batch = await boss.fetch<{ agentUid: string; sessionId: string; payload: unknown }>(queue, { batchSize: FETCH_BATCH });
    if (batch.length === 0) {
      if (++empty > 100) throw new Error(`hand-written baseline: queue ${queue} returned nothing with ${n - done} jobs left`);
      await new Promise((r) => setTimeout(r, 5));
      continue;
    }
    empty = 0;
    for (let i = 0; i < batch.length; i += HAND_CONCURRENCY) {
      await Promise.all(batch.slice(i, i + HAND_CONCURRENCY).map((job) => runJob(pool, boss, queue, job)));
    }
    done += batch.length;
  }
  const totalMs = performance.now() - t0;
  return { jobs: n, totalMs, jobsPerSec: (n * 1000) / totalMs };
}
