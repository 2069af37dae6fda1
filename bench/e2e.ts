/**
 * End-to-end benchmark: corral's turn throughput as a ratio of raw pg-boss throughput measured
 * in the same run, on the same database (see docs/benchmarks.md).
 *
 *   npm run bench -- [--events N] [--actors A] [--workers W] [--capacity C] [--rounds R]
 *                    [--raw-reps K] [--samples S] [--quick] [--json] [--phase-timeout S]
 *                    [--sample-activity] [--statements]
 *
 * Interleaved (raw 0, corral 1, raw 1, …, corral R, raw R) so that every corral round sits
 * between two raw slices measured minutes apart at most: a noisy machine slows both alike.
 *  - raw slice: N jobs over A singleton keys on a `key_strict_fifo` queue; one loop fetches
 *    (batchSize 50) and completes each batch (fenced by attempt), from insert until drained;
 *    repeated K times (--raw-reps), the slice counts its median repetition.
 *  - corral round: N/R events over the same A actors through a started Daemon (real pg-boss,
 *    real ZeroMQ on tcp://127.0.0.1:0) and W in-process example echo workers, from enqueue until
 *    every event's turn is committed (`corral.turns.status = 'succeeded'`, checked in the database).
 *  - wake latency: S single events, one at a time, each on an idle (warm) actor: from the enqueue
 *    call until the commit transaction returned (the LISTEN/NOTIFY path; the consumer's fallback
 *    poll is 1 s).
 *  - the corral rounds run twice, interleaved: with CURVE (the default deployment; the headline)
 *    and without (`--insecure`), each between two raw slices; the report gives both ratios and
 *    what CURVE costs.
 * Each phase has its own deadline (--phase-timeout). The headline ratio is the median of the
 * per-round ratios (corral turns/s ÷ the mean of its two bracketing raw slices).
 *
 * Uses DATABASE_URL when set (in a scratch database created on that server when permitted),
 * else an embedded PostgreSQL in a temporary folder that is stopped and deleted at the end, also
 * on errors and SIGINT/SIGTERM. The table (or JSON with --json) goes to stdout, progress to stderr.
 */
import { randomBytes } from 'node:crypto';
import { chmod, mkdtemp, readdir, readFile, rm } from 'node:fs/promises';
import { cpus, loadavg, tmpdir, totalmem } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { parseArgs } from 'node:util';
import pg from 'pg';
import type { PgBoss } from 'pg-boss';
import { v7 as uuidv7 } from 'uuid';
import { actorKey, type ActorKey } from '../src/actor-key.ts';
import { loadConfig } from '../src/config.ts';
import { Daemon } from '../src/daemon.ts';
import { openDatabase, type Database } from '../src/db/client.ts';
import { ensureEmbeddedPostgres, stopEmbeddedPostgres } from '../src/db/embedded.ts';
import { migrateDatabase } from '../src/db/migrate.ts';
import { silentLogger } from '../src/logger.ts';
import { createBoss } from '../src/queue/boss.ts';
import { noopMetrics, type RuntimeMetrics } from '../src/runtime/metrics.ts';
import { runExampleWorker } from '../src/worker/example.ts';
import { HAND_CONCURRENCY, handwrittenSlice, setupHandwritten } from './handwritten.ts';
import { addWorkerKey, workerCredentials } from '../src/fabric/keys.ts';
import type { Worker } from '../src/worker/sdk.ts';

// ---- options ---------------------------------------------------------------------------

interface Options {
  events: number;
  actors: number;
  workers: number;
  capacity: number;
  samples: number;
  rounds: number;
  rawReps: number;
  json: boolean;
  quick: boolean;
  phaseTimeoutMs: number;
  sampleActivity: boolean;
  statements: boolean;
}

const USAGE = `usage: npm run bench -- [options]
  --events N          events (and raw jobs per slice)                   (default 1500, quick 400)
  --actors A          distinct actor keys the events are spread over   (default 150, quick 40)
  --workers W         in-process example workers                       (default 2)
  --capacity C        concurrent turns per worker                      (default 25)
  --samples S         single events in the wake-latency phase          (default 50, quick 15)
  --rounds R          corral rounds of N/R events, each between two raw slices of N jobs
                      (default 3, quick 2)
  --raw-reps K        repetitions per raw slice; the slice counts its median  (default 3)
  --phase-timeout S   deadline per phase, seconds                      (default 90)
  --sample-activity   sample pg_stat_activity and the daemon's pool during the corral rounds
  --statements        embedded database only: load pg_stat_statements and report the statements
                      of the corral rounds by server time (calls per turn, mean time)
  --quick             a smaller run (a smoke test of the benchmark itself)
  --json              print the result as JSON on stdout instead of a table
  -h, --help`;

function parseOptions(argv: string[]): Options {
  const { values } = parseArgs({
    args: argv,
    options: {
      events: { type: 'string' },
      actors: { type: 'string' },
      workers: { type: 'string' },
      capacity: { type: 'string' },
      samples: { type: 'string' },
      rounds: { type: 'string' },
      'raw-reps': { type: 'string' },
      'phase-timeout': { type: 'string' },
      quick: { type: 'boolean', default: false },
      'sample-activity': { type: 'boolean', default: false },
      statements: { type: 'boolean', default: false },
      json: { type: 'boolean', default: false },
      help: { type: 'boolean', short: 'h', default: false },
    },
    strict: true,
    allowPositionals: false,
  });
  if (values.help) {
    process.stdout.write(`${USAGE}\n`);
    process.exit(0);
  }
  const quick = values.quick;
  const int = (name: string, raw: string | undefined, dflt: number, min: number, max: number): number => {
    if (raw === undefined) return dflt;
    const n = Number(raw);
    if (!Number.isInteger(n) || n < min || n > max) throw new UsageError(`--${name} must be an integer in ${min}..${max}`);
    return n;
  };
  const opts: Options = {
    events: int('events', values.events, quick ? 400 : 1500, 1, 1_000_000),
    actors: int('actors', values.actors, quick ? 40 : 150, 1, 100_000),
    workers: int('workers', values.workers, 2, 1, 64),
    capacity: int('capacity', values.capacity, 25, 1, 1024),
    samples: int('samples', values.samples, quick ? 15 : 50, 0, 10_000),
    rounds: int('rounds', values.rounds, quick ? 2 : 3, 1, 100),
    rawReps: int('raw-reps', values['raw-reps'], 3, 1, 100),
    phaseTimeoutMs: int('phase-timeout', values['phase-timeout'], 90, 1, 3600) * 1000,
    json: values.json,
    quick,
    sampleActivity: values['sample-activity'],
    statements: values.statements,
  };
  if (opts.rounds > opts.events) throw new UsageError('--rounds must not exceed --events');
  return opts;
}

class UsageError extends Error {}

// ---- small helpers ---------------------------------------------------------------------

const progress = (msg: string): void => {
  process.stderr.write(`[bench ${new Date().toISOString().slice(11, 23)}] ${msg}\n`);
};

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

class PhaseTimeout extends Error {}

/** Polls `check` until truthy; throws PhaseTimeout after `deadline` (performance.now() ms). */
async function until<T>(
  check: () => Promise<T | undefined | false> | T | undefined | false,
  deadline: number,
  what: string,
  intervalMs = 50,
): Promise<T> {
  for (;;) {
    const v = await check();
    if (v) return v;
    if (performance.now() > deadline) throw new PhaseTimeout(`timed out waiting for ${what}`);
    await sleep(intervalMs);
  }
}

function percentile(sorted: number[], p: number): number {
  if (sorted.length === 0) return Number.NaN;
  const rank = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
  return sorted[rank]!;
}

interface Percentiles {
  n: number;
  p50: number;
  p95: number;
  p99: number;
  max: number;
  mean: number;
}

function summarise(values: number[]): Percentiles {
  const s = [...values].sort((a, b) => a - b);
  const mean = s.length ? s.reduce((a, b) => a + b, 0) / s.length : Number.NaN;
  return { n: s.length, p50: percentile(s, 50), p95: percentile(s, 95), p99: percentile(s, 99), max: s.at(-1) ?? Number.NaN, mean };
}

const round = (n: number, digits = 1): number => (Number.isFinite(n) ? Number(n.toFixed(digits)) : n);

/** Cleanup steps, run once in reverse order, each bounded so a hang cannot keep the process. */
class Cleanup {
  private readonly steps: { name: string; fn: () => Promise<unknown> }[] = [];
  private running: Promise<void> | undefined;

  defer(name: string, fn: () => Promise<unknown>): void {
    this.steps.push({ name, fn });
  }

  run(): Promise<void> {
    this.running ??= (async () => {
      while (this.steps.length > 0) {
        const step = this.steps.pop()!;
        let timer: NodeJS.Timeout | undefined;
        const t0 = performance.now();
        try {
          await Promise.race([
            step.fn(),
            new Promise((_, reject) => {
              timer = setTimeout(() => reject(new Error('timed out after 30 s')), 30_000);
            }),
          ]);
        } catch (e) {
          progress(`cleanup: ${step.name} failed: ${(e as Error).message}`);
        } finally {
          clearTimeout(timer);
          const ms = performance.now() - t0;
          if (ms > 1_000) progress(`cleanup: ${step.name} took ${(ms / 1000).toFixed(1)} s`);
        }
      }
    })();
    return this.running;
  }
}

// ---- the database ----------------------------------------------------------------------

interface BenchDatabase {
  url: string;
  /** How the database was obtained, for the report. */
  source: 'embedded' | 'DATABASE_URL (scratch database)' | 'DATABASE_URL';
  ephemeral: boolean;
  /** CPU time used so far by the embedded server's processes (Linux only), in ms. */
  serverCpuMs?: () => Promise<number | undefined>;
}

/**
 * CPU time of a local PostgreSQL: the postmaster and its live children (utime + stime), plus
 * what the postmaster has reaped from exited children (cutime + cstime). Linux /proc only.
 */
async function postgresCpuMs(dataDir: string): Promise<number | undefined> {
  if (process.platform !== 'linux') return undefined;
  try {
    const postmaster = Number((await readFile(join(dataDir, 'postmaster.pid'), 'utf8')).split('\n')[0]);
    if (!Number.isInteger(postmaster) || postmaster <= 0) return undefined;
    let ticks = 0;
    for (const entry of await readdir('/proc')) {
      if (!/^\d+$/.test(entry)) continue;
      let stat: string;
      try {
        stat = await readFile(`/proc/${entry}/stat`, 'utf8');
      } catch {
        continue; // exited meanwhile
      }
      // fields after "(comm)": state ppid … utime(14) stime(15) cutime(16) cstime(17), 1-based overall
      const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      const pid = Number(entry);
      const ppid = Number(f[1]);
      if (pid !== postmaster && ppid !== postmaster) continue;
      ticks += Number(f[11]) + Number(f[12]);
      if (pid === postmaster) ticks += Number(f[13]) + Number(f[14]);
    }
    return ticks * 10; // USER_HZ is 100 on Linux
  } catch {
    return undefined;
  }
}

function withDatabase(url: string, database: string): string {
  const u = new URL(url);
  u.pathname = `/${database}`;
  return u.toString();
}

async function openBenchDatabase(cleanup: Cleanup, opts: Options): Promise<BenchDatabase> {
  const external = process.env.DATABASE_URL;
  if (!external) {
    const home = await mkdtemp(join(tmpdir(), 'corral-bench-'));
    await chmod(home, 0o755);
    cleanup.defer('remove temporary folder', () => rm(home, { recursive: true, force: true }));
    progress(`starting an embedded PostgreSQL in ${home}`);
    // Deferred before starting: an interrupted start still gets stopped (a no-op if not running).
    cleanup.defer('stop embedded PostgreSQL', () => stopEmbeddedPostgres(home));
    const database = 'corral_bench';
    let server = await ensureEmbeddedPostgres({ homeDir: home, ephemeral: true, database });
    if (opts.statements) {
      const c = new pg.Client({ connectionString: server.url });
      await c.connect();
      await c.query(`alter system set shared_preload_libraries = 'pg_stat_statements'`);
      await c.query(`alter system set pg_stat_statements.track_planning = on`);
      await c.end();
      progress('restarting the embedded PostgreSQL with pg_stat_statements');
      await server.stop();
      server = await ensureEmbeddedPostgres({ homeDir: home, ephemeral: true, database });
      const d = new pg.Client({ connectionString: server.url });
      await d.connect();
      await d.query('create extension if not exists pg_stat_statements');
      await d.end();
    }
    const dataDir = server.dataDir;
    return { url: server.url, source: 'embedded', ephemeral: true, serverCpuMs: () => postgresCpuMs(dataDir) };
  }
  // A scratch database on the given server keeps the bench away from real data.
  const name = `corral_bench_${randomBytes(5).toString('hex')}`;
  const admin = new pg.Client({ connectionString: external });
  await admin.connect();
  try {
    await admin.query(`create database ${name}`);
  } catch (e) {
    progress(`cannot create a scratch database (${(e as Error).message}); using DATABASE_URL's database as is`);
    return { url: external, source: 'DATABASE_URL', ephemeral: false };
  } finally {
    await admin.end();
  }
  cleanup.defer(`drop database ${name}`, async () => {
    const c = new pg.Client({ connectionString: external });
    await c.connect();
    try {
      await c.query(`drop database if exists ${name} with (force)`);
    } finally {
      await c.end();
    }
  });
  return { url: withDatabase(external, name), source: 'DATABASE_URL (scratch database)', ephemeral: false };
}

// ---- CPU accounting ----------------------------------------------------------------------

type ServerCpu = (() => Promise<number | undefined>) | undefined;

/** Runs `fn` and returns the CPU this process and (when measurable) the local server used. */
async function withCpu<T>(serverCpu: ServerCpu, fn: () => Promise<T>): Promise<{ value: T; processMs: number; serverMs: number | undefined }> {
  const s0 = await serverCpu?.();
  const c0 = process.cpuUsage();
  const value = await fn();
  const c = process.cpuUsage(c0);
  const s1 = await serverCpu?.();
  return { value, processMs: (c.user + c.system) / 1000, serverMs: s0 !== undefined && s1 !== undefined ? s1 - s0 : undefined };
}

// ---- raw pg-boss ------------------------------------------------------------------------

interface RawResult {
  jobs: number;
  insertMs: number;
  drainMs: number;
  totalMs: number;
  /** jobs / (insert + drain): the same window as corral's turns/s. */
  jobsPerSec: number;
  /** jobs / drain only: fetch+complete. */
  drainJobsPerSec: number;
  fetches: number;
  /** Every repetition's rate when this is a slice's median repetition. */
  repsJobsPerSec?: number[];
  /** CPU of this process per job (the pg-boss client; the idle daemon lives here too). */
  processCpuMsPerJob?: number;
  /** CPU of the (embedded) PostgreSQL per job, when measurable. */
  serverCpuMsPerJob?: number;
}

const RAW_BATCH = 50;

/** Inserts `n` jobs over `actors` singleton keys, then fetches (batch 50) and completes until drained. */
async function rawBaseline(boss: PgBoss, queue: string, n: number, actors: number, deadline: number): Promise<RawResult> {
  const jobs = Array.from({ length: n }, (_, i) => {
    const s = `s${i % actors}`;
    return {
      id: uuidv7(),
      singletonKey: `bench/${s}`,
      data: { agentUid: 'bench', sessionId: s, payload: { text: `e${i}` }, enqueuedAt: new Date().toISOString() },
    };
  });
  const t0 = performance.now();
  await boss.insert(queue, jobs);
  const t1 = performance.now();
  let done = 0;
  let fetches = 0;
  let emptyStreak = 0;
  while (done < n) {
    if (performance.now() > deadline) throw new PhaseTimeout(`raw baseline: ${done}/${n} jobs done at the deadline`);
    const batch = await boss.fetch<object>(queue, { batchSize: RAW_BATCH });
    fetches++;
    if (batch.length === 0) {
      // key_strict_fifo with nothing active should never come back empty while jobs remain
      if (++emptyStreak > 100) throw new Error(`raw baseline: queue ${queue} returned nothing with ${n - done} jobs left`);
      await sleep(5);
      continue;
    }
    emptyStreak = 0;
    // Fenced by attempt, like corral's commit.
    const res = (await boss.complete(
      queue,
      batch.map((j) => ({ id: j.id, retryCount: j.retryCount })),
    )) as { affected?: number };
    if (res.affected !== batch.length) throw new Error(`raw baseline: completed ${res.affected}/${batch.length}`);
    done += batch.length;
  }
  const t2 = performance.now();
  return {
    jobs: n,
    insertMs: t1 - t0,
    drainMs: t2 - t1,
    totalMs: t2 - t0,
    jobsPerSec: (n * 1000) / (t2 - t0),
    drainJobsPerSec: (n * 1000) / (t2 - t1),
    fetches,
  };
}

// ---- corral ------------------------------------------------------------------------------

interface RoundResult {
  events: number;
  enqueueMs: number;
  totalMs: number;
  turnsPerSec: number;
}

interface CorralResult {
  events: number;
  /** Sum of the rounds' times (enqueue → last commit). */
  totalMs: number;
  /** Pooled over the rounds: events / totalMs. */
  turnsPerSec: number;
  rounds: RoundResult[];
  /**
   * Event-loop utilisation of this process (daemon + workers + bench) during the rounds: near 1
   * means the single Node thread was the limit, not PostgreSQL.
   */
  eventLoopUtilization: number;
  /** CPU time of this process (user + system) per committed turn. */
  processCpuMsPerTurn: number;
  /** CPU time of the (embedded) PostgreSQL per committed turn, when measurable. */
  serverCpuMsPerTurn?: number;
  /** enqueue (job created_on) → commit (turn finished_at), database clock, every event. */
  enqueueToCommitMs: Percentiles;
  /** Where the time goes, per event (database clock): see `corralLatencies`. */
  stagesMs: {
    /** job created_on → started_on: waiting in the queue until pg-boss's fetch took it. */
    queued: Percentiles;
    /** job started_on → turn started_at: fetch → the begin transaction (dispatch, pool, actor queue). */
    fetchToBegin: Percentiles;
    /** turn started_at → finished_at: begin tx → commit tx (send, accept, echo, reply). */
    beginToCommit: Percentiles;
  };
  /** Optional pg_stat_activity samples during the rounds (--sample-activity). */
  activity?: ActivitySummary;
}

interface WakeResult {
  /** enqueue call → commit transaction returned, client clock, one event at a time. */
  latencyMs: Percentiles;
  /** The same events by stage, database clock (see CorralResult.stagesMs). */
  stagesMs: CorralResult['stagesMs'];
}

/** Counts commits through the runtime's metric hook and wakes waiters. */
class CommitCounter {
  count = 0;
  lastAt = 0;
  private waiters: { target: number; resolve: () => void }[] = [];
  /** The daemon's metric hooks: every hook a no-op except `committed`. */
  readonly metrics: RuntimeMetrics = { ...noopMetrics, committed: () => this.committed() };
  committed(): void {
    this.count++;
    this.lastAt = performance.now();
    this.waiters = this.waiters.filter((w) => {
      if (this.count < w.target) return true;
      w.resolve();
      return false;
    });
  }
  reached(target: number): Promise<void> {
    if (this.count >= target) return Promise.resolve();
    return new Promise((resolve) => this.waiters.push({ target, resolve }));
  }
}

async function succeededCount(db: Database, ids: string[]): Promise<number> {
  const res = await db.pool.query<{ n: number }>(
    `select count(*)::int as n from corral.turns where status = 'succeeded' and event_id = any($1::uuid[])`,
    [ids],
  );
  return res.rows[0]!.n;
}

/** Enqueues `events` and waits (commit hook, with the database as the authority) until all committed. */
async function pushAndWait(
  client: Database,
  daemon: Daemon,
  counter: CommitCounter,
  events: { key: ActorKey; event: unknown }[],
  deadline: number,
  what: string,
): Promise<{ ids: string[]; t0: number; tEnq: number; tDone: number }> {
  const before = counter.count;
  const t0 = performance.now();
  const enq = await daemon.events.enqueueActorEvents(client.db, events);
  const tEnq = performance.now();
  const ids = enq.map((e) => e.eventId);
  let lastLog = performance.now();
  // Primary clock: the runtime's commit hook (no polling granularity). Authority: the database.
  const hooked = counter.reached(before + events.length).then(() => counter.lastAt);
  let hookedAt: number | undefined;
  void hooked.then((t) => (hookedAt = t));
  let polledAt: number | undefined;
  await until(
    async () => {
      const n = await succeededCount(client, ids);
      if (n >= ids.length) {
        polledAt = performance.now();
        return true;
      }
      if (performance.now() - lastLog > 2_000) {
        lastLog = performance.now();
        progress(`${what}: ${n}/${ids.length} committed`);
      }
      return false;
    },
    deadline,
    `${what}: all ${ids.length} turns committed`,
    100,
  );
  await Promise.race([hooked, sleep(1_000)]);
  const tDone = hookedAt !== undefined ? Math.min(hookedAt, polledAt!) : polledAt!;
  return { ids, t0, tEnq, tDone };
}

/**
 * Per-event timings from database timestamps (one server clock): job created_on (insert),
 * job started_on (fetched), turn started_at (begin tx's now()), turn finished_at (commit tx's now()).
 */
async function corralLatencies(
  client: Database,
  ids: string[],
  queue: string,
): Promise<{ e2e: number[]; queued: number[]; fetchToBegin: number[]; beginToCommit: number[] }> {
  const res = await client.pool.query<{ e2e: number; queued: number; fetch_to_begin: number; begin_to_commit: number }>(
    `select extract(epoch from (t.finished_at - j.created_on)) * 1000 as e2e,
            extract(epoch from (j.started_on - j.created_on)) * 1000 as queued,
            extract(epoch from (t.started_at - j.started_on)) * 1000 as fetch_to_begin,
            extract(epoch from (t.finished_at - t.started_at)) * 1000 as begin_to_commit
       from corral.turns t
       join pgboss.job j on j.id = t.event_id and j.name = $2
      where t.status = 'succeeded' and t.event_id = any($1::uuid[])`,
    [ids, queue],
  );
  const col = (k: keyof (typeof res.rows)[number]) => res.rows.map((r) => Number(r[k]));
  return { e2e: col('e2e'), queued: col('queued'), fetchToBegin: col('fetch_to_begin'), beginToCommit: col('begin_to_commit') };
}

interface ActivitySummary {
  samples: number;
  /** The daemon's connection pool: mean clients checked out and callers waiting for one. */
  daemonPool: { max: number; meanInUse: number; meanWaiting: number; maxWaiting: number };
  /** Mean number of corral/pg-boss backends per state/wait, e.g. "active: Lock/transactionid". */
  meanBackends: Record<string, number>;
  /** The most frequent running or waiting statements (first 120 characters). */
  topQueries: { query: string; share: number }[];
}

/**
 * Samples pg_stat_activity every `everyMs` while `on` (the corral rounds only; the raw slices'
 * pg-boss shares the application name) until stopped: where the database's time goes.
 */
function sampleActivity(url: string, pool: pg.Pool, everyMs = 25): { on: boolean; stop(): Promise<ActivitySummary> } {
  const client = new pg.Client({ connectionString: url, application_name: 'corral-bench-sampler' });
  const states = new Map<string, number>();
  const queries = new Map<string, number>();
  let samples = 0;
  let busy = 0;
  let inUse = 0;
  let waiting = 0;
  let maxWaiting = 0;
  let stopped = false;
  const handle = {
    on: false,
    async stop(): Promise<ActivitySummary> {
      stopped = true;
      await loop;
      const meanBackends = Object.fromEntries(
        [...states.entries()].sort((a, b) => b[1] - a[1]).map(([k, n]) => [k, round(n / Math.max(1, samples), 2)]),
      );
      const topQueries = [...queries.entries()]
        .sort((a, b) => b[1] - a[1])
        .slice(0, 8)
        .map(([query, n]) => ({ query, share: round(n / Math.max(1, busy), 3) }));
      const n = Math.max(1, samples);
      const daemonPool = { max: pool.options.max ?? 10, meanInUse: round(inUse / n, 2), meanWaiting: round(waiting / n, 2), maxWaiting };
      return { samples, daemonPool, meanBackends, topQueries };
    },
  };
  const loop = (async () => {
    await client.connect();
    try {
      await sampleLoop();
    } finally {
      await client.end().catch(() => undefined);
    }
  })().catch((e: Error) => progress(`activity sampler stopped: ${e.message}`));
  async function sampleLoop(): Promise<void> {
    while (!stopped) {
      if (!handle.on) {
        await sleep(everyMs);
        continue;
      }
      const res = await client.query<{ state: string; wait: string | null; query: string }>(
        `select state, wait_event_type || '/' || wait_event as wait, query
           from pg_stat_activity
          where datname = current_database() and pid <> pg_backend_pid()
            and application_name in ('corral', 'corral-boss')`,
      );
      samples++;
      inUse += pool.totalCount - pool.idleCount;
      waiting += pool.waitingCount;
      maxWaiting = Math.max(maxWaiting, pool.waitingCount);
      for (const r of res.rows) {
        const k = `${r.state}${r.wait ? `: ${r.wait}` : ''}`;
        states.set(k, (states.get(k) ?? 0) + 1);
        if (r.state === 'active' || r.state === 'idle in transaction') {
          busy++;
          const q = r.query.replace(/\s+/g, ' ').slice(0, 120);
          queries.set(q, (queries.get(q) ?? 0) + 1);
        }
      }
      await sleep(everyMs);
    }
  }
  return handle;
}

/** A started daemon with W in-process example workers, driven by the rounds. */
class CorralSession {
  readonly counter = new CommitCounter();
  readonly keys: ActorKey[];
  private readonly cleanup = new Cleanup();
  private daemon!: Daemon;
  private client!: Database;
  private queueName = '';
  private next = 0;
  private readonly ids: string[] = [];
  private readonly rounds: RoundResult[] = [];
  private busyMs = 0;
  private elu: ReturnType<typeof performance.eventLoopUtilization> | undefined;
  private cpuMs = 0;
  private serverMs: number | undefined = 0;
  private sampler: { on: boolean; stop(): Promise<ActivitySummary> } | undefined;

  private readonly dbUrl: string;
  private readonly home: string;
  private readonly opts: Options;
  private readonly serverCpu: ServerCpu;

  /** CURVE on the fabric (the default deployment) or off (`--insecure`), to measure its cost. */
  private readonly curve: boolean;

  constructor(dbUrl: string, home: string, opts: Options, serverCpu: ServerCpu, curve = true) {
    this.curve = curve;
    this.serverCpu = serverCpu;
    this.dbUrl = dbUrl;
    this.home = home;
    this.opts = opts;
    this.keys = Array.from({ length: opts.actors }, (_, i) => actorKey('bench', `s${i}`));
  }

  /** Stops workers, daemon and connections (idempotent). */
  stop(): Promise<void> {
    return this.cleanup.run();
  }

  async start(): Promise<void> {
    const config = loadConfig(
      {
        homeDir: this.home,
        endpoint: 'tcp://127.0.0.1:0',
        queueName: `bench-events-${randomBytes(4).toString('hex')}`,
        logLevel: 'silent',
        insecure: !this.curve,
      },
      {},
    );
    this.queueName = config.queueName;
    const daemon = (this.daemon = new Daemon({
      config,
      databaseUrl: this.dbUrl,
      logger: silentLogger,
      skipMigrations: true,
      metrics: this.counter.metrics,
    }));
    const workers: Worker[] = [];
    const client = (this.client = openDatabase(this.dbUrl, { max: 4, applicationName: 'corral-bench' }));
    this.cleanup.defer('close bench connections', () => client.close());
    this.cleanup.defer('stop daemon', async () => {
      // Nothing to drain: the bench waits for its turns itself, and on an interrupt it doesn't care.
      const res = await daemon.stop({ deadlineMs: 5_000, drainMs: 0 });
      if (res && res.kind !== 'clean') progress(`daemon stop: ${JSON.stringify(res)}`);
    });
    this.cleanup.defer('stop workers', () => Promise.all(workers.map((w) => w.stop({ abortWaitMs: 1_000, lingerMs: 100 }))));

    progress(`starting the daemon (queue ${config.queueName})`);
    await daemon.start();
    const { workers: w, capacity } = this.opts;
    for (let i = 0; i < w; i++) {
      const workerId = `bench-w${i}`;
      const security = daemon.security;
      const credentials = security ? workerCredentials(addWorkerKey(security.paths, security.keys.publicKey, workerId)) : undefined;
      workers.push(
        await runExampleWorker({
          endpoint: daemon.broker.endpoint,
          workerId,
          capacity,
          logger: silentLogger,
          ...(credentials ? { credentials } : {}),
        }),
      );
    }
    await until(() => daemon.runtime.workers.freeSlots() === w * capacity, performance.now() + 15_000, `${w} workers registered`);
    progress(`${w} workers × ${capacity} slots registered at ${daemon.broker.endpoint} (CURVE ${this.curve ? 'on' : 'off'})`);

    // Warm-up on other actors: JIT, connection pools, socket paths. Not measured.
    const warm = Array.from({ length: Math.min(60, this.opts.events) }, (_, i) => ({
      key: actorKey('warmup', `s${i % 20}`),
      event: { text: `warm ${i}` },
    }));
    await pushAndWait(client, daemon, this.counter, warm, performance.now() + this.opts.phaseTimeoutMs, 'warm-up');
    progress(`warm-up: ${warm.length} turns committed`);
    if (this.opts.sampleActivity) {
      const sampler = (this.sampler = sampleActivity(this.dbUrl, daemon.database.pool));
      this.cleanup.defer('stop activity sampler', () => sampler.stop());
    }
  }

  /** One measured round: `n` events continuing the round-robin over the actors. */
  async round(n: number, label: string): Promise<RoundResult> {
    const events = Array.from({ length: n }, () => {
      const i = this.next++;
      return { key: this.keys[i % this.keys.length]!, event: { text: `e${i}` } };
    });
    const elu0 = performance.eventLoopUtilization();
    if (this.sampler) this.sampler.on = true;
    const measured = await withCpu(this.serverCpu, () =>
      pushAndWait(this.client, this.daemon, this.counter, events, performance.now() + this.opts.phaseTimeoutMs, label),
    ).finally(() => {
      if (this.sampler) this.sampler.on = false;
    });
    const run = measured.value;
    const elu = performance.eventLoopUtilization(elu0);
    this.elu = this.elu ? { idle: this.elu.idle + elu.idle, active: this.elu.active + elu.active, utilization: 0 } : elu;
    this.cpuMs += measured.processMs;
    this.serverMs = this.serverMs !== undefined && measured.serverMs !== undefined ? this.serverMs + measured.serverMs : undefined;
    const check = await this.client.pool.query<{ n: number; distinct: number }>(
      `select count(*)::int as n, count(distinct event_id)::int as distinct
         from corral.turns where status = 'succeeded' and event_id = any($1::uuid[])`,
      [run.ids],
    );
    if (check.rows[0]!.n !== n || check.rows[0]!.distinct !== n) {
      throw new Error(`${label}: expected ${n} succeeded turns, found ${JSON.stringify(check.rows[0])}`);
    }
    this.ids.push(...run.ids);
    const totalMs = run.tDone - run.t0;
    this.busyMs += totalMs;
    const r: RoundResult = { events: n, enqueueMs: run.tEnq - run.t0, totalMs, turnsPerSec: (n * 1000) / totalMs };
    this.rounds.push(r);
    progress(`${label}: ${n} turns in ${totalMs.toFixed(0)} ms → ${r.turnsPerSec.toFixed(0)} turns/s`);
    return r;
  }

  /** Totals over the rounds, with per-event latencies from the database. */
  async result(): Promise<CorralResult> {
    const activity = await this.sampler?.stop();
    this.sampler = undefined;
    const lat = await corralLatencies(this.client, this.ids, this.queueName);
    const events = this.ids.length;
    const elu = this.elu ? this.elu.active / (this.elu.active + this.elu.idle) : Number.NaN;
    return {
      events,
      totalMs: this.busyMs,
      turnsPerSec: (events * 1000) / this.busyMs,
      rounds: this.rounds,
      eventLoopUtilization: elu,
      processCpuMsPerTurn: this.cpuMs / events,
      ...(this.serverMs !== undefined ? { serverCpuMsPerTurn: this.serverMs / events } : {}),
      enqueueToCommitMs: summarise(lat.e2e),
      stagesMs: { queued: summarise(lat.queued), fetchToBegin: summarise(lat.fetchToBegin), beginToCommit: summarise(lat.beginToCommit) },
      ...(activity ? { activity } : {}),
    };
  }

  /**
   * Wake latency: one event at a time on an idle, warm actor. Between events the consumer sleeps
   * on its poll interval (1 s), so only LISTEN/NOTIFY wakes it.
   */
  async wake(samples: number): Promise<WakeResult> {
    await until(() => this.daemon.runtime.inFlightCount() === 0, performance.now() + 10_000, 'the runtime to be idle');
    const latencies: number[] = [];
    const ids: string[] = [];
    const deadline = performance.now() + this.opts.phaseTimeoutMs;
    for (let i = 0; i < samples; i++) {
      await sleep(20);
      const key = this.keys[i % this.keys.length]!;
      const target = this.counter.count + 1;
      const t0 = performance.now();
      const ev = await this.daemon.events.enqueueActorEvent(this.client.db, key, { text: `wake ${i}` });
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([
        this.counter.reached(target),
        new Promise((_, reject) => {
          timer = setTimeout(
            () => reject(new PhaseTimeout(`wake latency: event ${ev.eventId} not committed in time`)),
            Math.max(0, deadline - performance.now()),
          );
        }),
      ]).finally(() => clearTimeout(timer));
      latencies.push(performance.now() - t0);
      ids.push(ev.eventId);
    }
    const lat = await corralLatencies(this.client, ids, this.queueName);
    const wake: WakeResult = {
      latencyMs: summarise(latencies),
      stagesMs: { queued: summarise(lat.queued), fetchToBegin: summarise(lat.fetchToBegin), beginToCommit: summarise(lat.beginToCommit) },
    };
    progress(`wake latency: p50 ${wake.latencyMs.p50.toFixed(1)} ms, p95 ${wake.latencyMs.p95.toFixed(1)} ms over ${latencies.length} events`);
    return wake;
  }
}

// ---- pg_stat_statements (--statements) ----------------------------------------------------

interface StatementRow {
  query: string;
  callsPerTurn: number;
  meanMs: number;
  /** Server execution time per committed turn. */
  msPerTurn: number;
  /** Server planning time per committed turn (unprepared statements are planned on every call). */
  planMsPerTurn: number;
  /** Share of all statement time in the corral rounds. */
  share: number;
}

/** The bench's own statements (progress polls, samplers), left out of the statement report. */
const isBenchQuery = (q: string): boolean =>
  q.includes('pg_stat_statements') || q.includes('pg_stat_activity') || q.includes('event_id = any(');

/** Sums pg_stat_statements deltas over the measured corral rounds only (raw slices excluded). */
class StatementTracker {
  private readonly client: pg.Client;
  private before = new Map<string, { calls: number; ms: number; planMs: number }>();
  private readonly totals = new Map<string, { query: string; calls: number; ms: number; planMs: number }>();

  constructor(client: pg.Client) {
    this.client = client;
  }

  private async snapshot(): Promise<Map<string, { query: string; calls: number; ms: number; planMs: number }>> {
    const res = await this.client.query<{ id: string; query: string; calls: string; ms: number; plan_ms: number }>(
      `select queryid::text as id, query, calls, total_exec_time as ms, total_plan_time as plan_ms
         from pg_stat_statements where dbid = (select oid from pg_database where datname = current_database())`,
    );
    return new Map(
      res.rows.map((r) => [r.id, { query: r.query, calls: Number(r.calls), ms: Number(r.ms), planMs: Number(r.plan_ms) }]),
    );
  }

  async begin(): Promise<void> {
    this.before = await this.snapshot();
  }

  async end(): Promise<void> {
    for (const [id, now] of await this.snapshot()) {
      const was = this.before.get(id) ?? { calls: 0, ms: 0, planMs: 0 };
      const calls = now.calls - was.calls;
      if (calls <= 0) continue;
      const t = this.totals.get(id) ?? { query: now.query, calls: 0, ms: 0, planMs: 0 };
      t.calls += calls;
      t.ms += now.ms - was.ms;
      t.planMs += now.planMs - was.planMs;
      this.totals.set(id, t);
    }
  }

  /** Totals per turn over every statement of the rounds. */
  totalsPerTurn(turns: number): { statements: number; execMs: number; planMs: number } {
    const rows = [...this.totals.values()].filter((t) => !isBenchQuery(t.query));
    return {
      statements: rows.reduce((a, t) => a + t.calls, 0) / turns,
      execMs: rows.reduce((a, t) => a + t.ms, 0) / turns,
      planMs: rows.reduce((a, t) => a + t.planMs, 0) / turns,
    };
  }

  summary(turns: number, top = 15): StatementRow[] {
    const rows = [...this.totals.values()].filter((t) => !isBenchQuery(t.query));
    const all = rows.reduce((a, t) => a + t.ms, 0);
    return rows
      .sort((a, b) => b.ms - a.ms)
      .slice(0, top)
      .map((t) => ({
        query: t.query.replace(/\s+/g, ' ').trim().slice(0, 110),
        callsPerTurn: t.calls / turns,
        meanMs: t.ms / t.calls,
        msPerTurn: t.ms / turns,
        planMsPerTurn: t.planMs / turns,
        share: t.ms / all,
      }));
  }
}

// ---- report ------------------------------------------------------------------------------

interface Report {
  /** Headline: the median of the per-round ratios (each round against its bracketing raw slices). */
  ratio: number;
  /** corral turns/s ÷ the hand-written baseline's jobs/s measured right after each round (median). */
  ratioHandwritten: number;
  roundRatiosHandwritten: number[];
  handwrittenJobsPerSec: number;
  /** The same ratio with CURVE off (`--insecure`), from rounds interleaved with the CURVE ones. */
  ratioWithoutCurve: number;
  roundRatiosWithoutCurve: number[];
  turnsPerSecWithoutCurve: number;
  /** Pooled: corral turns/s over all rounds ÷ raw jobs/s over all slices. */
  pooledRatio: number;
  /**
   * CPU per raw job ÷ CPU per corral turn (this process + the local server): the same question
   * asked of CPU time instead of wall time. Less sensitive to other load; embedded database only.
   */
  cpuRatio?: number;
  roundRatios: number[];
  corral: CorralResult;
  raw: { slices: RawResult[]; jobsPerSec: number; spreadPct: number };
  wake: WakeResult | undefined;
  /** --statements: the corral rounds' statements by server time. */
  statements?: StatementRow[];
  statementTotals?: { statements: number; execMs: number; planMs: number };
  params: {
    events: number;
    actors: number;
    workers: number;
    capacity: number;
    slots: number;
    rounds: number;
    rawReps: number;
    fetchBatch: number;
    rawBatch: number;
    samples: number;
  };
  env: {
    node: string;
    postgres: string;
    database: string;
    ephemeralDatabase: boolean;
    cpus: number;
    cpuModel: string;
    memGiB: number;
    platform: string;
    loadAvg1m: number;
  };
  durationMs: number;
}

function printTable(r: Report): void {
  const f0 = (n: number) => n.toFixed(0);
  const f1 = (n: number) => n.toFixed(1);
  const f2 = (n: number) => n.toFixed(2);
  const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;
  const pct = (p: Percentiles) => `p50 ${f1(p.p50)} ms  p95 ${f1(p.p95)} ms  max ${f1(p.max)} ms`;
  const c = r.corral;
  const rows: [string, string][] = [
    ['ratio corral / raw', `${r.ratio.toFixed(4)}  (median of ${r.roundRatios.length} rounds: ${r.roundRatios.map((x) => x.toFixed(4)).join(', ')}; pooled ${r.pooledRatio.toFixed(4)})`],
    [
      'ratio corral / hand-written',
      `${r.ratioHandwritten.toFixed(3)}  (median of ${r.roundRatiosHandwritten.map((x) => x.toFixed(3)).join(', ')}; hand-written ${f0(r.handwrittenJobsPerSec)} jobs/s: one transaction per job, ${HAND_CONCURRENCY} at a time)`,
    ],
    [
      'ratio without CURVE',
      `${r.ratioWithoutCurve.toFixed(4)}  (median of ${r.roundRatiosWithoutCurve.map((x) => x.toFixed(4)).join(', ')}; ${f0(r.turnsPerSecWithoutCurve)} turns/s; CURVE costs ${f1((1 - r.ratio / r.ratioWithoutCurve) * 100)} %)`,
    ],
    ['corral end to end', `${f0(c.turnsPerSec)} turns/s  (${c.events} turns in ${f0(c.totalMs)} ms; rounds ${c.rounds.map((x) => f0(x.turnsPerSec)).join(' / ')})`],
    [
      'raw pg-boss fetch+complete',
      `${f0(r.raw.jobsPerSec)} jobs/s  (slices ${r.raw.slices.map((x) => f0(x.jobsPerSec)).join(' / ')}; spread ${f0(r.raw.spreadPct)} %)`,
    ],
    ['  without the insert', `${r.raw.slices.map((x) => f0(x.drainJobsPerSec)).join(' / ')} jobs/s`],
    ['corral process', `event loop ${f0(c.eventLoopUtilization * 100)} % busy during the rounds`],
    [
      'CPU per turn / per raw job',
      `corral ${f2(c.processCpuMsPerTurn)} ms node + ${c.serverCpuMsPerTurn !== undefined ? `${f2(c.serverCpuMsPerTurn)} ms` : '?'} postgres; ` +
        `raw ${f2(mean(r.raw.slices.map((x) => x.processCpuMsPerJob ?? Number.NaN)))} ms node + ${
          r.cpuRatio !== undefined ? `${f2(mean(r.raw.slices.map((x) => x.serverCpuMsPerJob!)))} ms` : '?'
        } postgres`,
    ],
    ...(r.cpuRatio !== undefined ? [['CPU cost ratio raw / corral', `${r.cpuRatio.toFixed(4)}  (CPU time instead of wall time)`] as [string, string]] : []),
    ['enqueue→commit, burst', `${pct(c.enqueueToCommitMs)}  (queueing included)`],
    ['  queued (insert→fetch)', pct(c.stagesMs.queued)],
    ['  fetch→begin tx', pct(c.stagesMs.fetchToBegin)],
    ['  begin tx→commit tx', pct(c.stagesMs.beginToCommit)],
    ['wake latency, idle actor', r.wake ? `${pct(r.wake.latencyMs)}  (${r.wake.latencyMs.n} single events)` : 'skipped (--samples 0)'],
    ...(r.wake
      ? ([
          ['  queued (insert→fetch)', pct(r.wake.stagesMs.queued)],
          ['  fetch→begin tx', pct(r.wake.stagesMs.fetchToBegin)],
          ['  begin tx→commit tx', pct(r.wake.stagesMs.beginToCommit)],
        ] as [string, string][])
      : []),
    ['N events / A actors', `${r.params.events} / ${r.params.actors} in ${r.params.rounds} rounds`],
    ['W workers × capacity', `${r.params.workers} × ${r.params.capacity} = ${r.params.slots} slots (fetch batch ${r.params.fetchBatch})`],
    ['Node', r.env.node],
    ['PostgreSQL', `${r.env.postgres} (${r.env.database}${r.env.ephemeralDatabase ? ', fsync off' : ''})`],
    ['machine', `${r.env.cpus} CPUs (${r.env.cpuModel}), ${r.env.memGiB} GiB, ${r.env.platform}, load ${r.env.loadAvg1m.toFixed(1)} at start`],
    ['bench duration', `${(r.durationMs / 1000).toFixed(1)} s`],
  ];
  const w = Math.max(...rows.map(([k]) => k.length));
  const line = '-'.repeat(Math.min(120, w + 2 + Math.max(...rows.map(([, v]) => v.length))));
  process.stdout.write(`\ncorral end-to-end benchmark\n${line}\n`);
  for (const [k, v] of rows) process.stdout.write(`${k.padEnd(w)}  ${v}\n`);
  process.stdout.write(`${line}\n`);
  if (r.statements) {
    const t = r.statementTotals!;
    process.stdout.write(
      `\nstatements of the corral rounds (pg_stat_statements): per turn ${t.statements.toFixed(1)} statements, ` +
        `${t.execMs.toFixed(2)} ms executing, ${t.planMs.toFixed(2)} ms planning\n`,
    );
    process.stdout.write('   share  exec ms/turn  plan ms/turn  calls/turn   mean ms  statement\n');
    for (const x of r.statements) {
      process.stdout.write(
        `  ${(x.share * 100).toFixed(1).padStart(5)} %  ${x.msPerTurn.toFixed(3).padStart(12)}  ${x.planMsPerTurn.toFixed(3).padStart(12)}  ${x.callsPerTurn.toFixed(2).padStart(10)}  ${x.meanMs.toFixed(3).padStart(8)}  ${x.query}\n`,
      );
    }
  }
  const a = c.activity;
  if (a) {
    const p = a.daemonPool;
    process.stdout.write(`\ndaemon pool (max ${p.max}): mean ${p.meanInUse} checked out, mean ${p.meanWaiting} callers waiting (max ${p.maxWaiting})\n`);
    process.stdout.write(`pg_stat_activity during the rounds (${a.samples} samples; mean backends per state/wait):\n`);
    for (const [k, n] of Object.entries(a.meanBackends)) process.stdout.write(`  ${n.toFixed(2).padStart(6)}  ${k}\n`);
    process.stdout.write('busy backends by statement (share of busy samples):\n');
    for (const q of a.topQueries) process.stdout.write(`  ${(q.share * 100).toFixed(1).padStart(5)} %  ${q.query}\n`);
  }
}

const median = (xs: number[]): number => {
  const s = [...xs].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
};

/** Splits n into k near-equal positive parts. */
const split = (n: number, k: number): number[] => Array.from({ length: k }, (_, i) => Math.floor((n * (i + 1)) / k) - Math.floor((n * i) / k));

// ---- main --------------------------------------------------------------------------------

async function main(): Promise<number> {
  let opts: Options;
  try {
    opts = parseOptions(process.argv.slice(2));
  } catch (e) {
    process.stderr.write(`${(e as Error).message}\n${USAGE}\n`);
    return 2;
  }
  const started = performance.now();
  const load = loadavg()[0] ?? 0;
  const cleanup = new Cleanup();
  let interrupted = false;
  const onSignal = (sig: NodeJS.Signals) => {
    if (interrupted) return;
    interrupted = true;
    progress(`${sig}: cleaning up`);
    void cleanup.run().finally(() => process.exit(sig === 'SIGINT' ? 130 : 143));
  };
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);

  try {
    const db = await openBenchDatabase(cleanup, opts);
    const home = await mkdtemp(join(tmpdir(), 'corral-bench-home-'));
    cleanup.defer('remove daemon home', () => rm(home, { recursive: true, force: true }));
    progress('migrating');
    await migrateDatabase(db.url);
    const admin = new pg.Client({ connectionString: db.url, application_name: 'corral-bench-admin' });
    await admin.connect();
    cleanup.defer('close admin connection', () => admin.end());
    const postgres = (await admin.query<{ v: string }>("select current_setting('server_version') as v")).rows[0]!.v;

    const config = loadConfig({ homeDir: home }, {});
    const boss = createBoss(db.url, config, { supervise: false, max: 4 });
    await boss.start();
    cleanup.defer('stop raw pg-boss', () => boss.stop({ graceful: false, close: true, timeout: 5_000 }));
    const rawQueue = `bench-raw-${randomBytes(4).toString('hex')}`;
    await boss.createQueue(rawQueue, { policy: 'key_strict_fifo', retryLimit: 0 });
    cleanup.defer('delete raw queue', () => boss.deleteQueue(rawQueue).catch(() => undefined)); // best effort

    // Fresh planner statistics before every raw slice and corral round. Without this the
    // key_strict_fifo fetch flips to a plan ~8x slower for a while as the job table grows past a
    // few thousand rows (until autoanalyze runs), which made raw slices of one run differ 4-6x.
    const analyze = () => admin.query(`analyze ${config.bossSchema}.job`);
    const sizes = split(opts.events, opts.rounds);
    /** One raw slice: `rawReps` repetitions of N jobs; the slice is the median repetition. */
    const raw = async (i: number): Promise<RawResult> => {
      const reps: RawResult[] = [];
      for (let k = 0; k < opts.rawReps; k++) {
        await analyze();
        const m = await withCpu(db.serverCpuMs, () =>
          rawBaseline(boss, rawQueue, opts.events, opts.actors, performance.now() + opts.phaseTimeoutMs),
        );
        reps.push({
          ...m.value,
          processCpuMsPerJob: m.processMs / m.value.jobs,
          ...(m.serverMs !== undefined ? { serverCpuMsPerJob: m.serverMs / m.value.jobs } : {}),
        });
      }
      const sorted = [...reps].sort((a, b) => a.jobsPerSec - b.jobsPerSec);
      const r: RawResult = { ...sorted[Math.floor((sorted.length - 1) / 2)]!, repsJobsPerSec: reps.map((x) => x.jobsPerSec) };
      progress(
        `raw ${i}: ${r.jobs} jobs × ${reps.length}: ${reps.map((x) => x.jobsPerSec.toFixed(0)).join(' / ')} jobs/s → median ${r.jobsPerSec.toFixed(0)} ` +
          `(insert ${r.insertMs.toFixed(0)} ms, drain ${r.drainMs.toFixed(0)} ms)`,
      );
      return r;
    };

    // The hand-written baseline: what a user would write instead of corral (bench/handwritten.ts).
    const handPool = new pg.Pool({ connectionString: db.url, max: HAND_CONCURRENCY + 2, application_name: 'corral-bench-hand' });
    cleanup.defer('close the hand-written pool', () => handPool.end());
    await setupHandwritten(handPool);
    const handQueue = `bench-hand-${randomBytes(4).toString('hex')}`;
    await boss.createQueue(handQueue, { policy: 'key_strict_fifo', retryLimit: 0 });
    cleanup.defer('delete hand-written queue', () => boss.deleteQueue(handQueue).catch(() => undefined));
    const handRates: number[] = [];
    const handRatios: number[] = [];

    const session = new CorralSession(db.url, home, opts, db.serverCpuMs);
    // The same rounds without CURVE, interleaved with the CURVE rounds: the cost of encryption
    // and admission, measured in the same run under the same conditions.
    const plain = new CorralSession(db.url, home, opts, db.serverCpuMs, false);
    const statements = opts.statements && db.source === 'embedded' ? new StatementTracker(admin) : undefined;
    if (opts.statements && !statements) progress('--statements needs the embedded database; ignored');
    cleanup.defer('stop corral', () => session.stop());
    cleanup.defer('stop corral without CURVE', () => plain.stop());
    progress(`raw warm-up: ${Math.min(200, opts.events)} jobs`);
    await rawBaseline(boss, rawQueue, Math.min(200, opts.events), Math.min(opts.actors, 50), performance.now() + opts.phaseTimeoutMs);
    await session.start();
    await plain.start();

    // raw 0, corral 1, raw 1, plain 1, raw 2, plain 2, raw 3, corral 2, …: every corral round
    // (CURVE on, and off) sits between two raw slices.
    const slices: RawResult[] = [await raw(0)];
    const roundRatios: number[] = [];
    const plainRatios: number[] = [];
    const curveRound = async (i: number) => {
      await analyze();
      await statements?.begin();
      const round = await session.round(sizes[i]!, `corral ${i + 1}/${opts.rounds}`);
      await statements?.end();
      slices.push(await raw(slices.length));
      roundRatios.push(round.turnsPerSec / ((slices.at(-2)!.jobsPerSec + slices.at(-1)!.jobsPerSec) / 2));
      await analyze();
      const hand = await handwrittenSlice(handPool, boss, handQueue, sizes[i]!, opts.actors, performance.now() + opts.phaseTimeoutMs);
      handRates.push(hand.jobsPerSec);
      handRatios.push(round.turnsPerSec / hand.jobsPerSec);
      progress(`hand-written ${i + 1}: ${hand.jobs} jobs at ${hand.jobsPerSec.toFixed(0)} jobs/s`);
    };
    const plainRound = async (i: number) => {
      await analyze();
      const round = await plain.round(sizes[i]!, `corral without CURVE ${i + 1}/${opts.rounds}`);
      slices.push(await raw(slices.length));
      plainRatios.push(round.turnsPerSec / ((slices.at(-2)!.jobsPerSec + slices.at(-1)!.jobsPerSec) / 2));
    };
    // The order alternates (CURVE first in even rounds, last in odd ones): the process warms up
    // over the run, and a fixed order would credit the warm-up to whichever goes second.
    for (let i = 0; i < opts.rounds; i++) {
      if (i % 2 === 0) {
        await curveRound(i);
        await plainRound(i);
      } else {
        await plainRound(i);
        await curveRound(i);
      }
    }
    const corral = await session.result();
    const corralPlain = await plain.result();
    await plain.stop();
    const wake = opts.samples > 0 ? await session.wake(opts.samples) : undefined;
    progress('stopping workers and daemon');
    await session.stop();

    const rawJobs = slices.reduce((a, x) => a + x.jobs, 0);
    const rawMs = slices.reduce((a, x) => a + x.totalMs, 0);
    const rawRate = (rawJobs * 1000) / rawMs;
    const rates = slices.map((x) => x.jobsPerSec);
    const rawCpu = slices.every((x) => x.serverCpuMsPerJob !== undefined)
      ? slices.reduce((a, x) => a + x.processCpuMsPerJob! + x.serverCpuMsPerJob!, 0) / slices.length
      : undefined;
    const corralCpu = corral.serverCpuMsPerTurn !== undefined ? corral.processCpuMsPerTurn + corral.serverCpuMsPerTurn : undefined;
    const report: Report = {
      ratio: median(roundRatios),
      ratioHandwritten: median(handRatios),
      roundRatiosHandwritten: handRatios,
      handwrittenJobsPerSec: median(handRates),
      ratioWithoutCurve: median(plainRatios),
      roundRatiosWithoutCurve: plainRatios,
      turnsPerSecWithoutCurve: corralPlain.turnsPerSec,
      pooledRatio: corral.turnsPerSec / rawRate,
      ...(rawCpu !== undefined && corralCpu !== undefined ? { cpuRatio: rawCpu / corralCpu } : {}),
      roundRatios,
      corral,
      raw: { slices, jobsPerSec: rawRate, spreadPct: ((Math.max(...rates) - Math.min(...rates)) / rawRate) * 100 },
      wake,
      ...(statements
        ? { statements: statements.summary(corral.events), statementTotals: statements.totalsPerTurn(corral.events) }
        : {}),
      params: {
        events: opts.events,
        actors: opts.actors,
        workers: opts.workers,
        capacity: opts.capacity,
        slots: opts.workers * opts.capacity,
        rounds: opts.rounds,
        rawReps: opts.rawReps,
        fetchBatch: config.fetchBatchSize,
        rawBatch: RAW_BATCH,
        samples: opts.samples,
      },
      env: {
        node: process.version,
        postgres,
        database: db.source,
        ephemeralDatabase: db.ephemeral,
        cpus: cpus().length,
        cpuModel: cpus()[0]?.model.trim() ?? 'unknown',
        memGiB: round(totalmem() / 2 ** 30, 1),
        platform: `${process.platform}-${process.arch}`,
        loadAvg1m: load,
      },
      durationMs: 0,
    };
    await cleanup.run();
    report.durationMs = performance.now() - started;
    if (opts.json) process.stdout.write(`${JSON.stringify(roundDeep(report), null, 2)}\n`);
    else printTable(report);
    return 0;
  } catch (e) {
    if (interrupted) return 130;
    progress(`failed: ${e instanceof Error ? (e.stack ?? e.message) : String(e)}`);
    await cleanup.run();
    return 1;
  }
}

/** Rounds every number in `v` for the JSON output: 2 decimals, or 4 significant digits below 1. */
function roundDeep(v: unknown): unknown {
  if (typeof v === 'number') return Number.isFinite(v) && Math.abs(v) < 1 ? Number(v.toPrecision(4)) : round(v, 2);
  if (Array.isArray(v)) return v.map(roundDeep);
  if (v && typeof v === 'object') return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, roundDeep(x)]));
  return v;
}

process.exitCode = await main();
