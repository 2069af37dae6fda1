/**
 * Backlog and burst, no manual ANALYZE: a burst of N events to N new actors on a fresh daemon
 * (`corral daemon --workers W`, real processes, a database it migrates itself), for several N.
 * Reports turns/s and CPU per turn (daemon, worker processes, PostgreSQL) by time bucket from the
 * first second, when autoanalyze ran on pg-boss's job table, and the ratio of each burst's first
 * minute to the steady rate at a 1k backlog measured in the same run (a fresh daemon fed so that
 * ~1,000 events stay queued). See docs/benchmarks.md.
 *
 *   npm run bench:burst -- [--sizes 1000,10000] [--large] [--workers 2] [--capacity 32]
 *                          [--steady-seconds 20] [--bucket-seconds 10] [--timeout-seconds 300]
 *
 * `--large` adds N = 100,000. A burst still running at --timeout-seconds is stopped and reported
 * as far as it ran (marked *): at 100k that is the case here, see docs/benchmarks.md. Embedded PostgreSQL unless DATABASE_URL is set.
 */
import { DEFAULTS } from '../src/config.ts';
import { performance } from 'node:perf_hooks';
import { parseArgs } from 'node:util';
import { DEFAULT_WORKER_CAPACITY } from '../src/base/defaults.ts';
import { actorKey } from '../src/base/actor-key.ts';
import { openDatabase } from '../src/db/client.ts';
import { Cleanup, progress, runBench, sleep } from './lib/common.ts';
import { openBenchDatabase, type ServerCpu } from './lib/database.ts';
import {
  daemonCpuMs,
  freshDatabase,
  openBenchClient,
  scalar,
  startDaemonProcess,
  waitForWorkers,
  type BenchClient,
  type DaemonProcess,
} from './lib/daemon-process.ts';

interface Options {
  sizes: number[];
  workers: number;
  capacity: number;
  steadySeconds: number;
  bucketSeconds: number;
  timeoutSeconds: number;
  json: boolean;
}

function options(): Options {
  const { values } = parseArgs({
    options: {
      sizes: { type: 'string', default: '1000,10000' },
      large: { type: 'boolean', default: false },
      workers: { type: 'string', default: '2' },
      capacity: { type: 'string', default: String(DEFAULT_WORKER_CAPACITY) },
      'steady-seconds': { type: 'string', default: '20' },
      'bucket-seconds': { type: 'string', default: '10' },
      'timeout-seconds': { type: 'string', default: '300' },
      json: { type: 'boolean', default: false },
      help: { type: 'boolean', short: 'h', default: false },
    },
  });
  if (values.help) {
    process.stdout.write(
      'usage: npm run bench:burst -- [--sizes 1000,10000] [--large] [--workers W] [--capacity C] [--steady-seconds S] [--bucket-seconds B] [--timeout-seconds T] [--json]\n',
    );
    process.exit(0);
  }
  const sizes = values.sizes.split(',').map(Number);
  if (values.large && !sizes.includes(100_000)) sizes.push(100_000);
  const o: Options = {
    sizes,
    workers: Number(values.workers),
    capacity: Number(values.capacity),
    steadySeconds: Number(values['steady-seconds']),
    bucketSeconds: Number(values['bucket-seconds']),
    timeoutSeconds: Number(values['timeout-seconds']),
    json: values.json,
  };
  const ints = [...o.sizes, o.workers, o.capacity, o.steadySeconds, o.bucketSeconds, o.timeoutSeconds];
  if (!ints.every((n) => Number.isInteger(n) && n > 0)) {
    process.stderr.write('bench:burst: every option takes a positive integer\n');
    process.exit(2);
  }
  return o;
}

/** One sample of the run, taken every second. */
interface Sample {
  t: number;
  committed: number;
  daemonMs: number;
  workersMs: number;
  pgMs: number;
  autoanalyzes: number;
}

interface Bucket {
  fromS: number;
  toS: number;
  /** Events enqueued but not committed at the bucket's start. */
  backlog: number;
  turns: number;
  turnsPerSec: number;
  /** CPU per turn, ms: the daemon process, its worker processes, PostgreSQL. */
  daemonMsPerTurn: number;
  workersMsPerTurn: number;
  pgMsPerTurn: number;
  /** autoanalyze runs on the actor queue's job table during the bucket. */
  autoanalyzes: number;
}

interface BurstResult {
  events: number;
  /** False when --timeout-seconds stopped the run first: the figures cover what ran. */
  drained: boolean;
  committed: number;
  seconds: number;
  turnsPerSec: number;
  firstMinuteTurnsPerSec: number;
  firstSecondTurns: number;
  /** firstMinuteTurnsPerSec / steady rate at a 1k backlog. */
  ratioToSteady?: number;
  buckets: Bucket[];
  /** Seconds after the start at which autoanalyze had run on the job table (first run). */
  firstAutoanalyzeS?: number;
  daemonMsPerTurn: number;
  workersMsPerTurn: number;
  pgMsPerTurn: number;
}

/** The actor queue's job table (job_common unless the queue has its own partition). */
async function jobTable(client: BenchClient): Promise<string> {
  const { rows } = await client.db.pool.query<{ t: string }>(`select table_name as t from pgboss.queue where name = $1`, [
    DEFAULTS.queueName,
  ]);
  return rows[0]?.t ?? 'job_common';
}

async function sample(client: BenchClient, daemon: DaemonProcess, serverCpu: ServerCpu, table: string, t0: number): Promise<Sample> {
  const [committed, cpu, pg, autoanalyzes] = await Promise.all([
    client.succeeded(),
    daemonCpuMs(daemon),
    serverCpu?.(),
    scalar(client.db.pool, `select autoanalyze_count as n from pg_stat_user_tables where schemaname = 'pgboss' and relname = $1`, [table]),
  ]);
  return { t: (performance.now() - t0) / 1000, committed, daemonMs: cpu.daemon, workersMs: cpu.workers, pgMs: pg ?? 0, autoanalyzes };
}

async function withDaemon<T>(serverUrl: string, opts: Options, fn: (client: BenchClient, daemon: DaemonProcess) => Promise<T>): Promise<T> {
  const cleanup = new Cleanup();
  try {
    const db = await freshDatabase(serverUrl, cleanup, 'corral_burst');
    const daemon = await startDaemonProcess({ url: db.url, workers: opts.workers, capacity: opts.capacity }, cleanup);
    const client = await openBenchClientWhenReady(db.url, cleanup, daemon, opts.workers);
    return await fn(client, daemon);
  } finally {
    await cleanup.run();
  }
}

async function openBenchClientWhenReady(url: string, cleanup: Cleanup, daemon: DaemonProcess, workers: number): Promise<BenchClient> {
  // The daemon creates corral's tables and pg-boss's schema; the bench connects once it has.
  const probe = openDatabase(url, { max: 1 });
  try {
    await waitForWorkers(probe, workers, 90_000, daemon.proc);
  } finally {
    await probe.close();
  }
  return openBenchClient(url, cleanup);
}

/** A fresh daemon fed so that ~`backlog` events stay queued; turns/s and CPU over the window. */
async function steady(serverUrl: string, opts: Options, serverCpu: ServerCpu, backlog = 1_000): Promise<Bucket> {
  return withDaemon(serverUrl, opts, async (client, daemon) => {
    let enqueued = 0;
    const topUp = async (committed: number) => {
      const want = committed + backlog - enqueued;
      if (want < backlog / 10) return;
      const events = Array.from({ length: want }, (_, i) => ({ key: actorKey(`steady-${enqueued + i}`, 's'), event: { text: 'x' } }));
      enqueued += want;
      await client.enqueue(events);
    };
    const table = await jobTable(client);
    await topUp(0);
    const warmS = 5;
    const t0 = performance.now();
    let start: Sample | undefined;
    for (;;) {
      await sleep(200);
      const committed = await client.succeeded();
      await topUp(committed);
      const t = (performance.now() - t0) / 1000;
      if (!start && t >= warmS) start = await sample(client, daemon, serverCpu, table, t0);
      if (start && t >= warmS + opts.steadySeconds) break;
    }
    const end = await sample(client, daemon, serverCpu, table, t0);
    const b = bucket(start!, end, backlog);
    progress(`steady at a ${backlog} backlog: ${b.turnsPerSec.toFixed(0)} turns/s over ${opts.steadySeconds} s`);
    return b;
  });
}

function bucket(a: Sample, b: Sample, backlog: number): Bucket {
  const turns = b.committed - a.committed;
  const per = (ms: number) => (turns > 0 ? ms / turns : Number.NaN);
  return {
    fromS: a.t,
    toS: b.t,
    backlog,
    turns,
    turnsPerSec: turns / (b.t - a.t),
    daemonMsPerTurn: per(b.daemonMs - a.daemonMs),
    workersMsPerTurn: per(b.workersMs - a.workersMs),
    pgMsPerTurn: per(b.pgMs - a.pgMs),
    autoanalyzes: b.autoanalyzes - a.autoanalyzes,
  };
}

async function burst(serverUrl: string, n: number, opts: Options, serverCpu: ServerCpu): Promise<BurstResult> {
  return withDaemon(serverUrl, opts, async (client, daemon) => {
    const table = await jobTable(client);
    const events = Array.from({ length: n }, (_, i) => ({ key: actorKey(`burst-${i}`, 's'), event: { text: 'x' } }));
    const t0 = performance.now();
    const samples: Sample[] = [await sample(client, daemon, serverCpu, table, t0)];
    let enqueued = 0;
    const enqueueing = (async () => {
      for (let i = 0; i < n; i += 5_000) {
        await client.enqueue(events.slice(i, i + 5_000));
        enqueued = Math.min(n, i + 5_000);
      }
    })();
    const backlogs: number[] = [0];
    const deadline = t0 + opts.timeoutSeconds * 1000;
    for (;;) {
      await sleep(Math.max(0, samples.length * 1000 - (performance.now() - t0)));
      const s = await sample(client, daemon, serverCpu, table, t0);
      samples.push(s);
      backlogs.push(enqueued - s.committed);
      if (samples.length % 10 === 0) progress(`burst ${n}: ${s.committed} committed at ${s.t.toFixed(0)} s`);
      if (s.committed >= n) break;
      if (performance.now() > deadline) {
        progress(`burst ${n}: ${s.committed}/${n} committed at the --timeout-seconds deadline; reporting what ran`);
        break;
      }
    }
    await enqueueing;
    const last = samples.at(-1)!;
    const drained = last.committed >= n;
    // Buckets: the first second, then every bucket-seconds.
    const cuts = [0, 1];
    for (let s = opts.bucketSeconds; s < samples.length - 1; s += opts.bucketSeconds) cuts.push(s);
    cuts.push(samples.length - 1);
    const buckets = cuts.slice(0, -1).map((c, i) => bucket(samples[c]!, samples[cuts[i + 1]!]!, backlogs[c]!));
    const minute = samples[Math.min(60, samples.length - 1)]!;
    const firstAnalyze = samples.find((s) => s.autoanalyzes > samples[0]!.autoanalyzes);
    const all = bucket(samples[0]!, last, 0);
    const r: BurstResult = {
      events: n,
      drained,
      committed: last.committed,
      seconds: last.t,
      turnsPerSec: last.committed / last.t,
      // A burst that finished within the minute: its whole rate.
      firstMinuteTurnsPerSec: minute.committed / minute.t,
      firstSecondTurns: samples[1]?.committed ?? 0,
      buckets,
      ...(firstAnalyze ? { firstAutoanalyzeS: firstAnalyze.t } : {}),
      daemonMsPerTurn: all.daemonMsPerTurn,
      workersMsPerTurn: all.workersMsPerTurn,
      pgMsPerTurn: all.pgMsPerTurn,
    };
    progress(
      `burst ${n}: ${r.turnsPerSec.toFixed(0)} turns/s in ${r.seconds.toFixed(1)} s, first minute ${r.firstMinuteTurnsPerSec.toFixed(0)} turns/s`,
    );
    return r;
  });
}

function print(steadyRate: Bucket, results: BurstResult[], opts: Options): void {
  const f = (x: number, d = 0) => (Number.isFinite(x) ? x.toFixed(d) : '-');
  const out = (s: string) => process.stdout.write(`${s}\n`);
  out(`\nbacklog and burst (no manual ANALYZE): ${opts.workers} worker processes × ${opts.capacity} slots, fresh daemon and database each`);
  out(
    `steady at a 1k backlog: ${f(steadyRate.turnsPerSec)} turns/s; CPU per turn ${f(steadyRate.daemonMsPerTurn, 2)} ms daemon + ` +
      `${f(steadyRate.workersMsPerTurn, 2)} ms workers + ${f(steadyRate.pgMsPerTurn, 2)} ms postgres`,
  );
  out(
    '\n      N   total s   turns/s   first minute   ratio to steady   first second   first autoanalyze   CPU/turn daemon + workers + pg (ms)',
  );
  for (const r of results) {
    out(
      `${String(r.events).padStart(7)}   ${(f(r.seconds, 1) + (r.drained ? '' : '*')).padStart(7)}   ${f(r.turnsPerSec).padStart(7)}   ${f(r.firstMinuteTurnsPerSec).padStart(12)}   ` +
        `${f(r.ratioToSteady ?? Number.NaN, 2).padStart(15)}×   ${String(r.firstSecondTurns).padStart(12)}   ${(r.firstAutoanalyzeS !== undefined ? `${f(r.firstAutoanalyzeS)} s` : 'none').padStart(17)}   ` +
        `${f(r.daemonMsPerTurn, 2)} + ${f(r.workersMsPerTurn, 2)} + ${f(r.pgMsPerTurn, 2)}`,
    );
  }
  if (results.some((r) => !r.drained)) out('* stopped at --timeout-seconds before the backlog drained: the figures cover what ran');
  for (const r of results) {
    out(`\nN = ${r.events}${r.drained ? '' : ` (${r.committed} committed when stopped)`}, by time bucket:`);
    out('   from s    to s   backlog   turns/s   daemon ms/turn   workers ms/turn   pg ms/turn   autoanalyze');
    for (const b of r.buckets) {
      out(
        `${f(b.fromS, 1).padStart(8)}  ${f(b.toS, 1).padStart(6)}  ${String(b.backlog).padStart(8)}  ${f(b.turnsPerSec).padStart(8)}  ` +
          `${f(b.daemonMsPerTurn, 2).padStart(15)}  ${f(b.workersMsPerTurn, 2).padStart(16)}  ${f(b.pgMsPerTurn, 2).padStart(11)}  ${b.autoanalyzes ? 'yes' : ''}`,
      );
    }
  }
}

async function main(): Promise<number> {
  const opts = options();
  return runBench(async (cleanup) => {
    const server = await openBenchDatabase(cleanup);
    const steadyRate = await steady(server.url, opts, server.serverCpuMs);
    const results: BurstResult[] = [];
    for (const n of opts.sizes) {
      const r = await burst(server.url, n, opts, server.serverCpuMs);
      r.ratioToSteady = r.firstMinuteTurnsPerSec / steadyRate.turnsPerSec;
      results.push(r);
    }
    if (opts.json) process.stdout.write(`${JSON.stringify({ steady: steadyRate, bursts: results }, null, 2)}\n`);
    else print(steadyRate, results, opts);
    return 0;
  });
}

process.exitCode = await main();
