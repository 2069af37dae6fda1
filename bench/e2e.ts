/**
 * End-to-end benchmark: corral's turn throughput as a ratio of raw pg-boss throughput measured
 * in the same run, on the same database (see docs/benchmarks.md).
 *
 *   npm run bench -- [--events N] [--actors A] [--workers W] [--capacity C] [--rounds R]
 *                    [--raw-reps K] [--samples S] [--quick] [--json] [--phase-timeout S]
 *                    [--sample-activity] [--statements] [--in-process-workers] [--context-messages N]
 *                    [--history T] [--context-cache-bytes B]
 *
 * Interleaved (raw 0, corral 1, raw 1, …, corral R, raw R) so that every corral round sits
 * between two raw slices measured minutes apart at most: a noisy machine slows both alike.
 *  - raw slice: N jobs over A singleton keys on a `key_strict_fifo` queue; one loop fetches
 *    (batchSize 50) and completes each batch (fenced by attempt), from insert until drained;
 *    repeated K times (--raw-reps), the slice counts its median repetition.
 *  - corral round: N/R events over the same A actors (each with T turns of history first, so
 *    every measured turn continues a conversation) through a started Daemon (real pg-boss,
 *    real ZeroMQ on tcp://127.0.0.1:0) and W example echo workers (`corral worker` processes, as
 *    deployed; in the bench's process with --in-process-workers), from enqueue until
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
 *
 * Modules: bench/lib/ (common helpers, database, raw pg-boss, corral session, activity, report)
 * and bench/handwritten.ts (the hand-written baseline).
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { cpus, loadavg, tmpdir, totalmem } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import pg from 'pg';
import { randomBytes } from 'node:crypto';
import { DEFAULTS, loadConfig } from '../src/config.ts';
import { migrateDatabase } from '../src/db/migrate.ts';
import { createBoss } from '../src/queue/boss.ts';
import { HAND_CONCURRENCY, handwrittenSlice, setupHandwritten } from './handwritten.ts';
import { StatementTracker } from './lib/activity.ts';
import { Cleanup, median, progress, round, roundDeep, split, startCpuProfile } from './lib/common.ts';
import { CorralSession } from './lib/corral-session.ts';
import { openBenchDatabase, withCpu } from './lib/database.ts';
import { parseOptions, USAGE, type Options } from './lib/e2e-options.ts';
import { RAW_BATCH, rawBaseline, type RawResult } from './lib/raw.ts';
import { printTable, type Report } from './lib/report.ts';
import { createDatabaseOn } from '../test/helpers/databases.ts';

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
    // and admission, measured in the same run under the same conditions. In a database of its
    // own on the same server: a database's SQL enqueue (corral.send_events) is for its one queue.
    const plainDb = await createDatabaseOn(db.url, `corral_bench_plain_${randomBytes(4).toString('hex')}`);
    cleanup.defer('drop the database without CURVE', () => plainDb.drop());
    await migrateDatabase(plainDb.url);
    const plain = new CorralSession(plainDb.url, home, opts, db.serverCpuMs, false);
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
      const profile = opts.cpuProfile ? await startCpuProfile() : undefined;
      const round = await session.round(sizes[i]!, `corral ${i + 1}/${opts.rounds}`);
      await profile?.stopInto(`${opts.cpuProfile}-round${i + 1}.cpuprofile`);
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
      // its own database's job table: analyzing only the other one left these rounds to autoanalyze,
      // and one in three ran 2-3x slower while the statistics lagged
      await plain.analyzeQueue();
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
      ...(statements ? { statements: statements.summary(corral.events), statementTotals: statements.totalsPerTurn(corral.events) } : {}),
      params: {
        events: opts.events,
        actors: opts.actors,
        workers: opts.workers,
        capacity: opts.capacity,
        processWorkers: opts.processWorkers,
        contextMessages: opts.contextMessages ?? DEFAULTS.contextMessages,
        history: opts.history,
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

process.exitCode = await main();
