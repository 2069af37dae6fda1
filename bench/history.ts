/**
 * A week of production: what history costs the hot path and the periodic work. One database, two
 * phases measured the same way: first empty, then after a synthetic history (bench/lib/history.ts:
 * ≥ 10M completed jobs, ≥ 5M committed turns with two messages each, deliveries and activations)
 * and a manual ANALYZE, so the planner sees what it would see after a week of traffic.
 *
 *   npm run bench:history -- [--jobs 10000000] [--turns 5000000] [--actors 500000] [--expired 1000000]
 *                            [--burst 2000] [--rounds 200] [--wakes 40] [--workers 2] [--capacity 32] [--json]
 *
 * Each phase: a burst to new actors (turns/s), a round of 10 events per actor (turns/s), idle wakes
 * one at a time (enqueue → job completed, p50/p95), the actor queue's claim on a backlog (5,000 new
 * actors; 200 actors × 10) under the daemon's generic plan, and every periodic statement with nothing
 * due (ms, median of 5). After the history phase: `--expired` completed jobs past the retention are
 * added and the retention sweep (src/queue/retention.ts, default pace) deletes them, alone (rows/s)
 * and with a round running meanwhile (its rate against the round without). See docs/benchmarks.md.
 * Embedded PostgreSQL unless DATABASE_URL is set.
 */
import { performance } from 'node:perf_hooks';
import { parseArgs } from 'node:util';
import pg from 'pg';
import { actorKey } from '../src/base/actor-key.ts';
import { DEFAULTS } from '../src/config.ts';
import { DEFAULT_WORKER_CAPACITY } from '../src/base/defaults.ts';
import { listExpiredInFlight, stopIdleActivations } from '../src/db/turns/activations.ts';
import { CLAIM_FUNCTION, claimStatement } from '../src/db/boss/fetch.ts';
import { completedJobsOlderThan } from '../src/db/boss/jobs.ts';
import { openDatabase, type Database } from '../src/db/client.ts';
import { unacceptedDeliveriesOf } from '../src/db/turns/deliveries.ts';
import { pruneIdempotencyKeys } from '../src/db/enqueue/idempotency.ts';
import { pruneActivations, pruneDeliveries } from '../src/db/operations/runtime-pruning.ts';
import { transcriptRetentionDue } from '../src/db/operations/transcript-retention.ts';
import { pruneWorkers } from '../src/db/operations/workers.ts';
import { pruneDaemons } from '../src/db/operations/daemons.ts';
import { orphanedStartedTurns } from '../src/db/turns/transcript.ts';
import { queuesOf } from '../src/queue/names.ts';
import { sweepRetention } from '../src/queue/retention.ts';
import { median, progress, round, runBench, sleep, summarise, until, type Cleanup, type Percentiles } from './lib/common.ts';
import { openBenchDatabase } from './lib/database.ts';
import {
  freshDatabase,
  openBenchClient,
  startDaemonProcess,
  waitForWorkers,
  type BenchClient,
  type DaemonProcess,
} from './lib/daemon-process.ts';
import { addExpiredJobs, growHistory, type HistoryShape } from './lib/history.ts';

interface Options {
  jobs: number;
  turns: number;
  actors: number;
  expired: number;
  burst: number;
  rounds: number;
  wakes: number;
  workers: number;
  capacity: number;
  json: boolean;
  /** pg_stat_statements on: the statements that took the most time in each phase's rounds. */
  statements: boolean;
}

const USAGE =
  'usage: npm run bench:history -- [--jobs N] [--turns N] [--actors N] [--expired N] [--burst N] [--rounds ACTORS] [--wakes N] [--workers W] [--capacity C] [--statements] [--json]\n';

function options(): Options {
  const { values } = parseArgs({
    options: {
      jobs: { type: 'string', default: '10000000' },
      turns: { type: 'string', default: '5000000' },
      actors: { type: 'string', default: '500000' },
      expired: { type: 'string', default: '1000000' },
      burst: { type: 'string', default: '3000' },
      rounds: { type: 'string', default: '300' },
      wakes: { type: 'string', default: '40' },
      workers: { type: 'string', default: '2' },
      capacity: { type: 'string', default: String(DEFAULT_WORKER_CAPACITY) },
      json: { type: 'boolean', default: false },
      statements: { type: 'boolean', default: false },
      help: { type: 'boolean', short: 'h', default: false },
    },
  });
  if (values.help) {
    process.stdout.write(USAGE);
    process.exit(0);
  }
  const o: Options = {
    jobs: Number(values.jobs),
    turns: Number(values.turns),
    actors: Number(values.actors),
    expired: Number(values.expired),
    burst: Number(values.burst),
    rounds: Number(values.rounds),
    wakes: Number(values.wakes),
    workers: Number(values.workers),
    capacity: Number(values.capacity),
    json: values.json,
    statements: values.statements,
  };
  const { json: _json, statements: _statements, expired, ...positive } = o;
  if (!Object.values(positive).every((n) => Number.isInteger(n) && n > 0) || !Number.isInteger(expired) || expired < 0) {
    process.stderr.write(`bench:history: every option takes a positive integer (--expired may be 0)\n${USAGE}`);
    process.exit(2);
  }
  return o;
}

const Q = queuesOf(DEFAULTS);
/** Bursts and rounds per phase: the median is reported. */
const REPEATS = 5;
/** The daemon leaves completed jobs alone: the bench runs the sweep itself, when it measures it. */
const DAEMON_ENV = { CORRAL_COMPLETED_RETENTION_S: '0' };

interface PhaseResult {
  burstPerSec: number;
  roundPerSec: number;
  wakeMs: Percentiles;
  /** The claim (limit = the daemon's fetch batch) on a backlog of new actors, and of 10 per actor, ms. */
  fetchNewActorsMs: { fn: number; raw: number };
  fetchTenPerActorMs: { fn: number; raw: number };
  /** Every periodic statement with nothing due, ms (median of 5). */
  periodicMs: Record<string, number>;
}

/** Waits until the jobs `ids` of the actor queue are completed (their primary key). */
async function completed(client: BenchClient, ids: string[], what: string, timeoutMs = 300_000, pollMs = 20): Promise<number> {
  await until(
    async () => {
      const { rows } = await client.db.pool.query<{ n: number }>(
        `select count(*)::int as n from pgboss.job where name = $1 and id = any($2::uuid[]) and state = 'completed'`,
        [Q.events, ids],
      );
      return rows[0]!.n >= ids.length;
    },
    performance.now() + timeoutMs,
    what,
    pollMs,
  );
  return performance.now();
}

/** Enqueues `events` and returns turns/s until all are committed. */
async function rate(client: BenchClient, events: { key: ReturnType<typeof actorKey>; event: unknown }[], what: string): Promise<number> {
  const t0 = performance.now();
  const ids = await client.enqueue(events);
  const t1 = await completed(client, ids, what);
  const perSec = events.length / ((t1 - t0) / 1000);
  progress(`${what}: ${events.length} turns, ${perSec.toFixed(0)}/s`);
  return perSec;
}

const burst = (client: BenchClient, n: number, tag: string) =>
  rate(
    client,
    Array.from({ length: n }, (_, i) => ({ key: actorKey('bench', `${tag}-burst-${i}`), event: { text: 'hi' } })),
    `${tag}: burst to ${n} new actors`,
  );

const tenPerActor = (client: BenchClient, actors: number, tag: string) =>
  rate(
    client,
    Array.from({ length: actors * 10 }, (_, i) => ({ key: actorKey('bench', `${tag}-round-${i % actors}`), event: { text: `m${i}` } })),
    `${tag}: round of 10 events to ${actors} actors`,
  );

/** One event at a time to an idle actor (a new one: no activation, no context cached), enqueue → completed. */
async function wakes(client: BenchClient, n: number, tag: string): Promise<Percentiles> {
  const ms: number[] = [];
  const ids: string[] = [];
  for (let i = 0; i < n; i++) {
    const t0 = performance.now();
    const one = await client.enqueue([{ key: actorKey('bench', `${tag}-wake-${i}`), event: { text: 'wake' } }]);
    ids.push(...one);
    ms.push((await completed(client, one, `${tag}: wake ${i}`, 30_000, 2)) - t0);
    await sleep(50);
  }
  const s = summarise(ms);
  progress(`${tag}: ${n} wakes, p50 ${s.p50.toFixed(1)} ms, p95 ${s.p95.toFixed(1)} ms`);
  // where a wake's time goes, by the database's clock (job created → fetched → turn begun → committed)
  const { rows } = await client.db.pool.query<{ queued: number; to_begin: number; to_commit: number; to_complete: number }>(
    `select percentile_cont(0.5) within group (order by extract(epoch from j.started_on - j.created_on) * 1000) as queued,
            percentile_cont(0.5) within group (order by extract(epoch from t.started_at - j.started_on) * 1000) as to_begin,
            percentile_cont(0.5) within group (order by extract(epoch from t.finished_at - t.started_at) * 1000) as to_commit,
            percentile_cont(0.5) within group (order by extract(epoch from j.completed_on - t.finished_at) * 1000) as to_complete
       from corral.turns t join pgboss.job j on j.name = $1 and j.id = t.event_id
      where t.status = 'succeeded' and t.event_id = any($2::uuid[])`,
    [Q.events, ids],
  );
  const st = rows[0];
  if (st)
    progress(
      `${tag}: wake stages p50: queued ${Number(st.queued).toFixed(1)} ms, fetched → begun ${Number(st.to_begin).toFixed(1)} ms, ` +
        `begun → committed ${Number(st.to_commit).toFixed(1)} ms, committed → job completed ${Number(st.to_complete).toFixed(1)} ms`,
    );
  return s;
}

/**
 * The claim as the daemon runs it (`corral.claim_actor_events`) and, for comparison, its statement
 * alone under the daemon's generic plan and default planner settings: ms, median of 5, each in a
 * rolled-back transaction.
 */
async function claimMs(url: string, table: string): Promise<{ fn: number; raw: number }> {
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  try {
    await c.query('set plan_cache_mode = force_generic_plan');
    await c.query(`prepare claim(text, int) as ${claimStatement(Q.schema, table)}`);
    const time = async (text: string, values: unknown[]) => {
      const times: number[] = [];
      for (let i = 0; i < 5; i++) {
        await c.query('begin');
        const t0 = performance.now();
        await c.query(text, values);
        times.push(performance.now() - t0);
        await c.query('rollback');
      }
      return median(times);
    };
    const fn = await time(`select * from ${CLAIM_FUNCTION}($1, $2)`, [Q.events, DEFAULTS.fetchBatchSize]);
    const raw = await time(`execute claim('${Q.events}', ${DEFAULTS.fetchBatchSize})`, []);
    return { fn, raw };
  } finally {
    await c.end();
  }
}

/** The claim on a backlog of `actors` × `perActor` queued events (no daemon running) that came after the last ANALYZE; the backlog is then removed. */
async function fetchOnBacklog(
  client: BenchClient,
  url: string,
  table: string,
  actors: number,
  perActor: number,
  tag: string,
): Promise<{ fn: number; raw: number }> {
  // the worst case of the statistics: analyzed while nothing was queued, then the backlog came
  await client.db.pool.query(`analyze pgboss.${table}`);
  const events = Array.from({ length: actors * perActor }, (_, i) => ({
    key: actorKey('bench', `${tag}-backlog-${perActor}-${i % actors}`),
    event: { text: 'queued' },
  }));
  const ids = await client.enqueue(events);
  const ms = await claimMs(url, table);
  await client.db.pool.query(`delete from pgboss.job where name = $1 and id = any($2::uuid[])`, [Q.events, ids]);
  progress(`${tag}: claim on ${actors} actors × ${perActor} queued: ${ms.fn.toFixed(2)} ms (its statement alone ${ms.raw.toFixed(2)} ms)`);
  return ms;
}

/** Every periodic statement of the daemon with nothing due, on a daemon-like connection (generic plans), ms. */
async function periodicStatements(db: Database): Promise<Record<string, number>> {
  const DAY = 86_400;
  const statements: Record<string, () => Promise<unknown>> = {
    'watchdog: expired leases': () => listExpiredInFlight(db.db),
    'watchdog: idle activations': () => stopIdleActivations(db.db, DEFAULTS.idleTimeoutMs, 100),
    "watchdog: a stale worker's deliveries": () => unacceptedDeliveriesOf(db.db, 'history-worker'),
    'watchdog: workers gone': () => pruneWorkers(db.db, { goneAfterSeconds: 600, deadAfterSeconds: 3600 }),
    'watchdog: daemons gone': () => pruneDaemons(db.db, { stoppedAfterSeconds: 3600, silentAfterSeconds: DAY }),
    'recovery: orphaned started turns': () => orphanedStartedTurns(db.db, 1000),
    'retention: completed jobs due': () => completedJobsOlderThan(db.db, Q.schema, Q.events, DEFAULTS.completedRetentionSeconds, 5000),
    'retention: idempotency keys due': () => pruneIdempotencyKeys(db.db, Q, DEFAULTS.completedRetentionSeconds, 5000),
    'pruning: deliveries': () => pruneDeliveries(db.db, DAY, 5000),
    'pruning: activations': () => pruneActivations(db.db, DAY, 5000),
    'retention: transcripts due': () => transcriptRetentionDue(db.db),
  };
  const out: Record<string, number> = {};
  for (const [what, run] of Object.entries(statements)) {
    const times: number[] = [];
    for (let i = 0; i < 5; i++) {
      const t0 = performance.now();
      await db.db
        .transaction(async () => {
          await run();
          throw new RollBack();
        })
        .catch((e: unknown) => {
          if (!(e instanceof RollBack)) throw e;
        });
      times.push(performance.now() - t0);
    }
    out[what] = round(median(times), 2);
  }
  return out;
}

class RollBack extends Error {}

async function withDaemon<T>(
  url: string,
  o: Options,
  cleanup: Cleanup,
  fn: (client: BenchClient, d: DaemonProcess) => Promise<T>,
): Promise<T> {
  const d = await startDaemonProcess({ url, workers: o.workers, capacity: o.capacity, env: DAEMON_ENV }, cleanup);
  const probe = openDatabase(url, { max: 1 });
  try {
    await waitForWorkers(probe, o.workers, 120_000, d.proc);
  } finally {
    await probe.close();
  }
  try {
    return await fn(await openBenchClient(url, cleanup), d);
  } finally {
    await d.stop();
  }
}

/** The statements of database `name` that took the most time since the last reset (pg_stat_statements). */
async function topStatements(serverUrl: string, name: string, reset: boolean): Promise<void> {
  const c = new pg.Client({ connectionString: serverUrl });
  await c.connect();
  try {
    if (reset) {
      await c.query('select pg_stat_statements_reset()');
      return;
    }
    const { rows } = await c.query<{ calls: string; total: number; mean: number; rows: string; query: string }>(
      `select calls, round((total_exec_time + total_plan_time)::numeric, 1)::float8 as total,
              round(((total_exec_time + total_plan_time) / calls)::numeric, 3)::float8 as mean, rows,
              left(regexp_replace(query, '\\s+', ' ', 'g'), 150) as query
         from pg_stat_statements where dbid = (select oid from pg_database where datname = $1)
        order by total_exec_time + total_plan_time desc limit 15`,
      [name],
    );
    for (const r of rows)
      progress(`  ${String(r.total).padStart(9)} ms  ${r.calls.padStart(7)} calls  ${String(r.mean).padStart(9)} ms each  ${r.query}`);
  } finally {
    await c.end();
  }
}

async function phase(url: string, o: Options, cleanup: Cleanup, tag: string, serverUrl?: string): Promise<PhaseResult> {
  const db = openDatabase(url, { max: 2, applicationName: 'corral-bench' });
  const name = new URL(url).pathname.slice(1);
  try {
    if (serverUrl) await topStatements(serverUrl, name, true);
    const measured = await withDaemon(url, o, cleanup, async (client) => {
      // warm the daemon, its workers and the caches before measuring
      await burst(client, 1_000, `${tag}-warm`);
      await tenPerActor(client, 100, `${tag}-warm`);
      const bursts: number[] = [];
      const rounds: number[] = [];
      for (let i = 0; i < REPEATS; i++) {
        bursts.push(await burst(client, o.burst, `${tag}-${i}`));
        rounds.push(await tenPerActor(client, o.rounds, `${tag}-${i}`));
      }
      return { burstPerSec: median(bursts), roundPerSec: median(rounds), wakeMs: await wakes(client, o.wakes, tag) };
    });
    if (serverUrl) {
      progress(`${tag}: the statements that took the most time (pg_stat_statements):`);
      await topStatements(serverUrl, name, false);
    }
    const client = await openBenchClient(url, cleanup);
    const table = await jobTable(db);
    const fetchNewActorsMs = await fetchOnBacklog(client, url, table, 5_000, 1, tag);
    const fetchTenPerActorMs = await fetchOnBacklog(client, url, table, 200, 10, tag);
    await db.pool.query(`analyze pgboss.${table}`);
    const periodicMs = await periodicStatements(db);
    progress(`${tag}: periodic statements ${JSON.stringify(periodicMs)}`);
    return { ...measured, fetchNewActorsMs, fetchTenPerActorMs, periodicMs };
  } finally {
    await db.close();
  }
}

async function jobTable(db: Database): Promise<string> {
  const { rows } = await db.pool.query<{ t: string }>(`select table_name as t from pgboss.queue where name = $1`, [Q.events]);
  return rows[0]?.t ?? 'job_common';
}

interface SweepResult {
  expired: number;
  deletedPerSec: number;
  /** A round while the sweep runs, and the same daemon's round just before it. */
  roundDuringPerSec: number;
  /** The same daemon's round just before the sweep. */
  roundWithoutPerSec: number;
}

/** Adds `o.expired` expired jobs, then sweeps them: alone for half of them, then with a round running. */
async function sweep(url: string, o: Options, cleanup: Cleanup, shape: HistoryShape): Promise<SweepResult | undefined> {
  if (o.expired === 0) return undefined;
  const pool = new pg.Pool({ connectionString: url, max: 2 });
  cleanup.defer('close sweep pool', () => pool.end());
  await addExpiredJobs(pool, shape, o.expired);
  const sweepDb = openDatabase(url, { max: 2, applicationName: 'corral-retention' });
  cleanup.defer('close sweep database', () => sweepDb.close());
  // one daemon, warmed, measured without and then during the sweep: the ratio compares like with like
  return withDaemon(url, o, cleanup, async (c) => {
    await burst(c, 1_000, 'sweep-warm');
    await tenPerActor(c, 100, 'sweep-warm');
    const roundWithoutPerSec = await tenPerActor(c, o.rounds, 'sweep-before');
    const t0 = performance.now();
    const running = sweepRetention({
      boss: c.boss,
      db: sweepDb.db,
      bossSchema: Q.schema,
      queueName: Q.events,
      retentionSeconds: DEFAULTS.completedRetentionSeconds,
    }).catch((e: unknown) => e as Error);
    await sleep(1_000);
    const roundDuringPerSec = await tenPerActor(c, o.rounds, 'sweep-during');
    const result = await running;
    if (result instanceof Error) throw result;
    const seconds = (performance.now() - t0) / 1000;
    const deletedPerSec = result.jobs / seconds;
    progress(`retention: ${result.jobs} expired jobs deleted in ${seconds.toFixed(1)} s: ${deletedPerSec.toFixed(0)}/s`);
    return { expired: result.jobs, deletedPerSec, roundDuringPerSec, roundWithoutPerSec };
  });
}

process.exitCode = await runBench(async (cleanup) => {
  const o = options();
  const server = await openBenchDatabase(cleanup, { statements: o.statements });
  const statementsOn = o.statements && server.source === 'embedded' ? server.url : undefined;
  const fresh = await freshDatabase(server.url, cleanup, 'corral_history');
  const empty = await phase(fresh.url, o, cleanup, 'empty', statementsOn);
  const db = openDatabase(fresh.url, { max: 2 });
  const shape: HistoryShape = {
    bossSchema: Q.schema,
    jobTable: await jobTable(db),
    queue: Q.events,
    completedJobs: o.jobs,
    retainedDays: 6.5,
    retentionSeconds: DEFAULTS.completedRetentionSeconds,
    actors: o.actors,
    turns: o.turns,
    deliveries: Math.min(o.turns, 2_000_000),
    activations: Math.min(o.actors * 2, 1_000_000),
  };
  await db.close();
  const pool = new pg.Pool({ connectionString: fresh.url, max: 2 });
  await growHistory(pool, shape);
  await pool.end();
  const history = await phase(fresh.url, o, cleanup, 'history', statementsOn);
  const swept = await sweep(fresh.url, o, cleanup, shape);
  const ratio = (a: number, b: number) => round(a / b, 2);
  const report = {
    history: { completedJobs: o.jobs, turns: o.turns, messages: 2 * o.turns, actors: o.actors },
    empty,
    history_: history,
    ratios: {
      burst: ratio(history.burstPerSec, empty.burstPerSec),
      round: ratio(history.roundPerSec, empty.roundPerSec),
      wakeP50: ratio(history.wakeMs.p50, empty.wakeMs.p50),
      wakeP95: ratio(history.wakeMs.p95, empty.wakeMs.p95),
      ...(swept ? { roundDuringSweep: ratio(swept.roundDuringPerSec, swept.roundWithoutPerSec) } : {}),
    },
    retention: swept
      ? { ...swept, deletedPerSec: round(swept.deletedPerSec, 0), perBurstRate: ratio(swept.deletedPerSec, history.burstPerSec) }
      : undefined,
  };
  if (o.json) {
    process.stdout.write(`${JSON.stringify(report, null, 2)}\n`);
    return 0;
  }
  const row = (what: string, a: number | string, b: number | string, r?: number) =>
    `${what.padEnd(44)} ${String(a).padStart(10)} ${String(b).padStart(10)}${r === undefined ? '' : String(r).padStart(8)}\n`;
  let out = `history: ${o.jobs} completed jobs, ${o.turns} turns (${2 * o.turns} messages), ${o.actors} actors; right after ANALYZE\n`;
  out += row('', 'empty', 'history', undefined).trimEnd() + '   ratio\n';
  out += row('burst to new actors, turns/s', round(empty.burstPerSec, 0), round(history.burstPerSec, 0), report.ratios.burst);
  out += row('10 events per actor, turns/s', round(empty.roundPerSec, 0), round(history.roundPerSec, 0), report.ratios.round);
  out += row('idle wake p50, ms', round(empty.wakeMs.p50), round(history.wakeMs.p50), report.ratios.wakeP50);
  out += row('idle wake p95, ms', round(empty.wakeMs.p95), round(history.wakeMs.p95), report.ratios.wakeP95);
  out += row('claim, 5,000 new actors queued, ms', round(empty.fetchNewActorsMs.fn, 2), round(history.fetchNewActorsMs.fn, 2));
  out += row('  its statement alone, default planner, ms', round(empty.fetchNewActorsMs.raw, 2), round(history.fetchNewActorsMs.raw, 2));
  out += row('claim, 200 actors × 10 queued, ms', round(empty.fetchTenPerActorMs.fn, 2), round(history.fetchTenPerActorMs.fn, 2));
  out += row(
    '  its statement alone, default planner, ms',
    round(empty.fetchTenPerActorMs.raw, 2),
    round(history.fetchTenPerActorMs.raw, 2),
  );
  for (const k of Object.keys(history.periodicMs)) out += row(`${k}, ms`, empty.periodicMs[k]!, history.periodicMs[k]!);
  if (swept) {
    out += `retention: ${swept.expired} expired jobs deleted at ${round(swept.deletedPerSec, 0)}/s (${report.retention!.perBurstRate}× the history burst rate); `;
    out += `a round during the sweep ${round(swept.roundDuringPerSec, 0)} turns/s, ${report.ratios.roundDuringSweep}× the same daemon's round just before (${round(swept.roundWithoutPerSec, 0)})\n`;
  }
  process.stdout.write(out);
  return 0;
});
