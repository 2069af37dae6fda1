/**
 * The operator console's list queries at scale: a database seeded with N actors (default
 * 100,000: one conversation and one committed turn each, 1% of them running, 1% blocked by a
 * dead letter, 500 dead letters, 5,000 queued events, 200 workers), then every list the console
 * pages through, each timed `--runs` times (after one warm-up) through the console's own query
 * functions: the first page of actors and a page deep in the key order, each state filter, an
 * agent prefix and a session prefix, the dead letters (page and count), the workers, an actor's
 * transcript and the overview's hour. The budget is 50 ms a query (docs/console.md); a row over
 * it is marked. A benchmark, not a test: it reports, it does not fail.
 *
 *   npm run bench:console -- [--actors 100000] [--runs 20]
 *
 * Embedded PostgreSQL unless DATABASE_URL (then a scratch database on its server).
 */
import { performance } from 'node:perf_hooks';
import { parseArgs } from 'node:util';
import pg from 'pg';
import { actorKey } from '../src/base/actor-key.ts';
import { DEFAULTS } from '../src/config.ts';
import { countDeadLetters, findDeadLetters } from '../src/db/boss/jobs.ts';
import { openDatabase } from '../src/db/client.ts';
import { sendEventsInBatches } from '../src/db/enqueue/send.ts';
import { migrateDatabase } from '../src/db/migrate.ts';
import { listConsoleActors, type ConsoleActorFilter } from '../src/db/operations/console-actors.ts';
import { overviewMinutes } from '../src/db/operations/console-overview.ts';
import { transcriptPage, workersPage } from '../src/db/operations/console-pages.ts';
import { createBoss, ensureQueues } from '../src/queue/boss.ts';
import { queuesOf } from '../src/queue/names.ts';
import { progress, runBench, summarise, type Cleanup } from './lib/common.ts';
import { openBenchDatabase } from './lib/database.ts';
import { freshDatabase } from './lib/daemon-process.ts';

const BUDGET_MS = 50;
const PAGE = 50;

function options() {
  const { values } = parseArgs({
    options: {
      actors: { type: 'string', default: '100000' },
      runs: { type: 'string', default: '20' },
      explain: { type: 'string' },
      help: { type: 'boolean', short: 'h', default: false },
    },
  });
  if (values.help) {
    process.stdout.write('usage: npm run bench:console -- [--actors N] [--runs R]\n');
    process.exit(0);
  }
  const o = { actors: Number(values.actors), runs: Number(values.runs), explain: values.explain };
  if (!Number.isInteger(o.actors) || o.actors < 1000 || !Number.isInteger(o.runs) || o.runs < 1) {
    process.stderr.write('bench:console: --actors is at least 1000, --runs at least 1\n');
    process.exit(2);
  }
  return o;
}

/** 100 agents, N/100 sessions each: `agent-007/s-000042`. */
const agentOf = (i: number) => `agent-${String(i % 100).padStart(3, '0')}`;
const sessionOf = (i: number) => `s-${String(Math.floor(i / 100)).padStart(6, '0')}`;

/** A UUIDv7 of the time `at` (an SQL timestamptz expression), random in the rest. */
const V7 = (at: string) => {
  const h = `lpad(to_hex((extract(epoch from ${at}) * 1000)::bigint), 12, '0')`;
  const r = `replace(gen_random_uuid()::text, '-', '')`;
  return `(substr(${h}, 1, 8) || '-' || substr(${h}, 9, 4) || '-7' || substr(${r}, 1, 3) || '-8' || substr(${r}, 4, 3) || '-' || substr(${r}, 7, 12))::uuid`;
};

async function seed(pool: pg.Pool, n: number): Promise<void> {
  const chunk = 20_000;
  for (let from = 0; from < n; from += chunk) {
    const to = Math.min(n, from + chunk) - 1;
    const keys = `select i, 'agent-' || lpad((i % 100)::text, 3, '0') as a, 's-' || lpad((i / 100)::text, 6, '0') as s from generate_series(${from}, ${to}) i`;
    await pool.query(`insert into corral.actors (agent_uid, session_id, epoch_counter) select a, s, 1 from (${keys}) k`);
    // turn ids are UUIDv7, as the daemon makes them (the overview reads the last hour by id): one
    // turn two hours ago per actor, and one within the last hour for every 50th
    await pool.query(`
      with k as (${keys}),
      c as (insert into corral.conversations (id, agent_uid, session_id, next_seq) select gen_random_uuid(), a, s, 3 from k returning id, agent_uid, session_id),
      w as (select c.id, at from c join k on k.a = c.agent_uid and k.s = c.session_id,
              lateral (select now() - interval '2 hours' as at union all
                       select now() - make_interval(mins => k.i % 60) where k.i % 50 = 0) times)
      insert into corral.turns (id, conversation_id, event_id, delivery_id, status, activation_uid, actor_epoch, revision, attempt, started_at, finished_at)
      select ${V7('w.at')}, w.id, ${V7('w.at')}, gen_random_uuid(), 'succeeded', gen_random_uuid(), 1, 0, 1, w.at, w.at from w`);
    progress(`seeded ${to + 1} actors`);
  }
  // 1% running (a live activation with an event in flight), 1% blocked by a dead letter
  await pool.query(`
    insert into corral.activations (activation_uid, agent_uid, session_id, actor_epoch, lease_id, lease_expires_at, owner_id, current_event_id, status)
    select gen_random_uuid(), agent_uid, session_id, 1, gen_random_uuid(), now() + interval '1 hour', 'bench-daemon', gen_random_uuid(), 'active'
      from corral.actors where hashtext(session_id || agent_uid) % 100 = 1`);
  await pool.query(`update corral.actors set blocked_by_event_id = gen_random_uuid() where hashtext(session_id || agent_uid) % 100 = 2`);
  await pool.query(`
    insert into corral.workers (worker_id, owner_id, capacity, in_flight, status)
    select 'worker-' || lpad(i::text, 4, '0'), 'bench-daemon', 32, 3, 'ready' from generate_series(1, 200) i`);
}

/** `--explain TEXT`: the plans (EXPLAIN ANALYZE) of the statements the queries whose name has TEXT run. */
async function explain(watched: pg.Pool, pool: pg.Pool, run: () => Promise<unknown>): Promise<void> {
  const seen: { text: string; values: unknown[] }[] = [];
  const original = watched.query.bind(watched) as (...args: unknown[]) => Promise<unknown>;
  (watched as unknown as { query: (...args: unknown[]) => Promise<unknown> }).query = (...args: unknown[]) => {
    const a = args[0] as string | { text: string; values?: unknown[] };
    seen.push(
      typeof a === 'string'
        ? { text: a, values: (args[1] as unknown[]) ?? [] }
        : { text: a.text, values: a.values ?? (args[1] as unknown[]) ?? [] },
    );
    return original(...args);
  };
  try {
    await run();
  } finally {
    (watched as unknown as { query: unknown }).query = original;
  }
  const indexes = await pool.query<{ indexdef: string }>(`select indexdef from pg_indexes where schemaname = 'pgboss' order by 1`);
  process.stdout.write(`${indexes.rows.map((r) => r.indexdef).join('\n')}\n\n`);
  for (const s of seen) {
    const plan = await pool.query<{ 'QUERY PLAN': string }>(`explain (analyze, buffers) ${s.text}`, s.values);
    process.stdout.write(`${s.text}\n${plan.rows.map((r) => r['QUERY PLAN']).join('\n')}\n\n`);
  }
}

async function main(cleanup: Cleanup): Promise<number> {
  const o = options();
  {
    const server = await openBenchDatabase(cleanup);
    const db = await freshDatabase(server.url, cleanup, 'corral_console');
    await migrateDatabase(db.url);
    const boss = createBoss(db.url, DEFAULTS, { max: 2 });
    await boss.start();
    cleanup.defer('stop pg-boss', () => boss.stop({ graceful: false, close: true }));
    const q = await ensureQueues(boss, DEFAULTS);
    const pool = new pg.Pool({ connectionString: db.url, max: 2 });
    cleanup.defer('close pool', () => pool.end());
    const client = openDatabase(db.url, { max: 2, applicationName: 'corral-bench' });
    cleanup.defer('close client', () => client.close());

    await seed(pool, o.actors);
    // 5,000 queued events to actors spread over the key space, and 500 dead letters
    const spread = (count: number, offset: number) =>
      Array.from({ length: count }, (_, j) => {
        const i = Math.floor(((j + offset) * o.actors) / (count + offset)) % o.actors;
        return { agentUid: agentOf(i), sessionId: sessionOf(i), data: { text: `queued ${j}` } };
      });
    await sendEventsInBatches(client.db, spread(5_000, 0));
    const dead = spread(500, 7);
    await boss.insert(
      q.deadLetter,
      dead.map((e) => ({
        data: { ...e, payload: e.data, enqueuedAt: new Date().toISOString() },
        singletonKey: `${e.agentUid}/${e.sessionId}`,
      })),
    );
    // one actor with a long transcript, for its page
    await pool.query(
      `insert into corral.messages (conversation_id, turn_id, seq, role, content)
       select cv.id, (select t.id from corral.turns t where t.conversation_id = cv.id limit 1), g,
              case when g % 2 = 1 then 'user' else 'assistant' end, jsonb_build_object('text', 'message ' || g)
         from corral.conversations cv, generate_series(1, 500) g where cv.agent_uid = $1 and cv.session_id = $2`,
      [agentOf(4242), sessionOf(4242)],
    );
    progress('analyze');
    await pool.query('analyze');

    const queues = queuesOf(DEFAULTS);
    const last = o.actors - 1 - PAGE;
    const deep = { agentUid: agentOf(last), sessionId: sessionOf(last) };
    const actors = (filter: ConsoleActorFilter, after?: { agentUid: string; sessionId: string }) => () =>
      listConsoleActors(client.db, queues, filter, { after, limit: PAGE + 1 });
    const one = actorKey(agentOf(4242), sessionOf(4242));
    const cases: [string, () => Promise<unknown>][] = [
      ['actors: first page', actors({})],
      ['actors: a page deep in the key order', actors({}, deep)],
      ['actors: agent prefix agent-04', actors({ agentPrefix: 'agent-04' })],
      ['actors: agent-042, session prefix s-0009', actors({ agentPrefix: 'agent-042', sessionPrefix: 's-0009' })],
      ['actors: state running', actors({ state: 'running' })],
      ['actors: state running, deep', actors({ state: 'running' }, deep)],
      ['actors: state blocked', actors({ state: 'blocked' })],
      ['actors: state dead-lettered', actors({ state: 'dead_lettered' })],
      ['actors: state idle', actors({ state: 'idle' })],
      ['actors: state idle, agent prefix agent-099', actors({ state: 'idle', agentPrefix: 'agent-099' })],
      ['dead letters: first page', () => findDeadLetters(client.db, queues, {}, { limit: PAGE + 1 })],
      ['dead letters: count', () => countDeadLetters(client.db, queues, {})],
      ['workers: first page', () => workersPage(client.db, { limit: PAGE + 1 })],
      ['an actor: transcript, newest page', () => transcriptPage(client.db, one, { limit: PAGE + 1 })],
      ['an actor: transcript, an older page', () => transcriptPage(client.db, one, { beforeSeq: 120, limit: PAGE + 1 })],
      ['overview: the last hour', () => overviewMinutes(client.db, queues, 60)],
    ];
    process.stdout.write(`\nconsole list queries, ${o.actors} actors, ${o.runs} runs each (after a warm-up), budget ${BUDGET_MS} ms\n`);
    process.stdout.write(
      `${'query'.padEnd(48)} ${'rows'.padStart(5)} ${'p50 ms'.padStart(8)} ${'p95 ms'.padStart(8)} ${'max ms'.padStart(8)}\n`,
    );
    let over = 0;
    for (const [name, run] of cases) {
      if (o.explain !== undefined && name.includes(o.explain)) await explain(client.db.$client, pool, run);
      const got = await run();
      const rows = Array.isArray(got) ? got.length : 1;
      const times: number[] = [];
      for (let r = 0; r < o.runs; r++) {
        const t0 = performance.now();
        await run();
        times.push(performance.now() - t0);
      }
      const s = summarise(times);
      const mark = s.p95 > BUDGET_MS ? '  OVER BUDGET' : '';
      if (mark) over++;
      process.stdout.write(
        `${name.padEnd(48)} ${String(rows).padStart(5)} ${s.p50.toFixed(1).padStart(8)} ${s.p95.toFixed(1).padStart(8)} ${s.max.toFixed(1).padStart(8)}${mark}\n`,
      );
    }
    process.stdout.write(
      over === 0 ? `every query within ${BUDGET_MS} ms at p95\n` : `${over} quer${over === 1 ? 'y' : 'ies'} over ${BUDGET_MS} ms at p95\n`,
    );
  }
  return 0;
}

process.exitCode = await runBench(main);
