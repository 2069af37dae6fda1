/**
 * Per-turn profile: what one committed turn costs PostgreSQL, Node and the fabric, side by side for
 * raw pg-boss (bench/lib/raw.ts), the hand-written pg-boss handler (bench/handwritten.ts) and
 * corral (bench/lib/corral-session.ts: a started Daemon with `corral worker` processes, as
 * `npm run bench` runs them), at `npm run bench`'s default parameters (see docs/benchmarks.md,
 * "Per-turn profile").
 *
 *   npm run bench:profile -- [--events N] [--actors A] [--workers W] [--capacity C] [--rounds R]
 *                            [--raw-reps K] [--history T] [--curve on|off|both] [--no-statements]
 *                            [--settle S] [--idle S] [--quick] [--json] [--json-file PATH]
 *
 * Each system runs alone in a window of its own (raw first, then the hand-written handler, then
 * each corral daemon, which is stopped before the next starts), after a warm-up:
 *  - raw: K repetitions of N jobs over A singleton keys, fetched 50 at a time and completed;
 *  - hand-written: R rounds of N/R jobs, each job one transaction writing the transcript rows;
 *  - corral: R rounds of N/R events over A actors with T turns of history each, enqueue → every
 *    turn committed; with CURVE and/or without (`--insecure`), each daemon on a database of its own.
 * ANALYZE of the job table runs before each repetition or round (as in bench/e2e.ts), left out of
 * the counts. Counters (bench/lib/profile-probe.ts): pg_stat_statements, client queries of this
 * process by application_name, pg_stat_database/pg_stat_user_tables after a settle wait, the WAL
 * insert position, /proc CPU, and the daemon's ZeroMQ frames by type.
 *
 * Uses DATABASE_URL when set, else an embedded PostgreSQL (restarted with pg_stat_statements) in a
 * temporary folder that is removed at the end, also on errors and SIGINT/SIGTERM. The table (or
 * JSON with --json) goes to stdout, progress to stderr.
 */
import { randomBytes } from 'node:crypto';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { cpus, loadavg, tmpdir, totalmem } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import pg from 'pg';
import { DEFAULTS, loadConfig } from '../src/config.ts';
import { migrateDatabase } from '../src/db/migrate.ts';
import { createBoss } from '../src/queue/boss.ts';
import { createDatabaseOn } from '../test/helpers/databases.ts';
import { HAND_CONCURRENCY, handwrittenSlice, setupHandwritten } from './handwritten.ts';
import { Cleanup, progress, round, roundDeep, sleep, split } from './lib/common.ts';
import { CorralSession } from './lib/corral-session.ts';
import { openBenchDatabase } from './lib/database.ts';
import { parseProfileOptions, PROFILE_USAGE, sessionOptions, UsageError, type ProfileOptions } from './lib/profile-options.ts';
import { backgroundOf, measureWindow, QueryCounter, ServerProbe, ZmqCounter, type Meter } from './lib/profile-probe.ts';
import { printProfile, profileOf, type ProfileReport, type SystemRun } from './lib/profile-report.ts';
import { RAW_BATCH, rawBaseline } from './lib/raw.ts';

/** Runs `fn` once, however often it is called (cleanup steps that may also run early). */
function once(fn: () => Promise<unknown>): () => Promise<unknown> {
  let p: Promise<unknown> | undefined;
  return () => (p ??= fn());
}

async function main(): Promise<number> {
  let opts: ProfileOptions;
  try {
    const parsed = parseProfileOptions(process.argv.slice(2));
    if (parsed === 'help') {
      process.stdout.write(`${PROFILE_USAGE}\n`);
      return 0;
    }
    opts = parsed;
  } catch (e) {
    if (!(e instanceof UsageError)) throw e;
    process.stderr.write(`${e.message}\n${PROFILE_USAGE}\n`);
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

  // Installed before any connection or socket exists: every query and frame of this process counts.
  const meter: Meter = { queries: new QueryCounter().install(), zmq: new ZmqCounter().install(), serverCpu: undefined };
  const notes: string[] = [];
  try {
    const external = Boolean(process.env.DATABASE_URL);
    const db = await openBenchDatabase(cleanup, { statements: opts.statements && !external });
    meter.serverCpu = db.serverCpuMs;
    const home = await mkdtemp(join(tmpdir(), 'corral-profile-home-'));
    cleanup.defer('remove daemon home', () => rm(home, { recursive: true, force: true }));
    progress('migrating');
    await migrateDatabase(db.url);
    const probe = await ServerProbe.open(db.url, cleanup, opts.statements);
    if (opts.statements && !probe.statementsAvailable) {
      progress('pg_stat_statements is not loaded on this server: no per-statement figures');
      notes.push('pg_stat_statements unavailable on this server: statements per turn not measured');
    }
    const version = (await probe.query("select current_setting('server_version') as v")) as pg.QueryResult<{ v: string }>;
    const config = loadConfig({ homeDir: home }, {});
    const analyze = () => probe.query(`analyze ${config.bossSchema}.job`);
    const sizes = split(opts.events, opts.rounds);
    const deadline = () => performance.now() + opts.phaseTimeoutMs;
    const runs: SystemRun[] = [];

    // ---- the baselines, before any daemon runs (nothing in the background) --------------------
    const boss = createBoss(db.url, config, { supervise: false, max: 4 });
    await boss.start();
    const stopBoss = once(() => boss.stop({ graceful: false, close: true, timeout: 5_000 }));
    cleanup.defer('stop raw pg-boss', stopBoss);
    const rawQueue = `bench-raw-${randomBytes(4).toString('hex')}`;
    await boss.createQueue(rawQueue, { policy: 'key_strict_fifo', retryLimit: 0 });
    const handPool = new pg.Pool({ connectionString: db.url, max: HAND_CONCURRENCY + 2, application_name: 'corral-bench-hand' });
    const endHandPool = once(() => handPool.end());
    cleanup.defer('close the hand-written pool', endHandPool);
    await setupHandwritten(handPool);
    const handQueue = `bench-hand-${randomBytes(4).toString('hex')}`;
    await boss.createQueue(handQueue, { policy: 'key_strict_fifo', retryLimit: 0 });
    progress('warm-up: raw pg-boss and the hand-written handler, 200 jobs each');
    await rawBaseline(boss, rawQueue, Math.min(200, opts.events), Math.min(opts.actors, 50), deadline());
    await handwrittenSlice(handPool, boss, handQueue, Math.min(200, opts.events), Math.min(opts.actors, 50), deadline());
    await analyze();
    const settle = async (why: string) => {
      if (opts.settleMs === 0) return;
      progress(`${why}: waiting ${opts.settleMs / 1000} s for the statistics to settle`);
      await sleep(opts.settleMs);
    };
    await settle('before raw pg-boss');
    // The server's own background (autovacuum visits each database every 10 s here), subtracted
    // from the baselines' settle waits as the idle daemon's is from corral's.
    let serverIdle;
    if (opts.idleMs > 0) {
      progress(`the server without load for ${opts.idleMs / 1000} s`);
      serverIdle = await measureWindow(
        meter,
        probe,
        async () => {
          await sleep(opts.idleMs);
          return 0;
        },
        { settleMs: 0 },
      );
    }
    const baselineBackground = serverIdle ? { background: backgroundOf(serverIdle) } : {};

    progress(`raw pg-boss: ${opts.rawReps} × ${opts.events} jobs over ${opts.actors} keys`);
    const raw = await measureWindow(
      meter,
      probe,
      async (w) => {
        let jobs = 0;
        for (let k = 0; k < opts.rawReps; k++) {
          await w.exclude(analyze);
          const r = await rawBaseline(boss, rawQueue, opts.events, opts.actors, deadline());
          jobs += r.jobs;
          progress(`raw ${k + 1}/${opts.rawReps}: ${r.jobs} jobs at ${r.jobsPerSec.toFixed(0)} jobs/s (${r.fetches} fetches)`);
        }
        progress('raw pg-boss done; settling');
        return jobs;
      },
      { settleMs: opts.settleMs, ...baselineBackground },
    );
    runs.push({ name: 'raw pg-boss', window: raw, ...(serverIdle ? { idle: serverIdle } : {}) });

    progress(`hand-written: ${opts.rounds} rounds of ${sizes[0]} jobs`);
    const hand = await measureWindow(
      meter,
      probe,
      async (w) => {
        let jobs = 0;
        for (let i = 0; i < opts.rounds; i++) {
          await w.exclude(analyze);
          const h = await handwrittenSlice(handPool, boss, handQueue, sizes[i]!, opts.actors, deadline());
          jobs += h.jobs;
          progress(`hand-written ${i + 1}/${opts.rounds}: ${h.jobs} jobs at ${h.jobsPerSec.toFixed(0)} jobs/s`);
        }
        progress('hand-written done; settling');
        return jobs;
      },
      { settleMs: opts.settleMs, ...baselineBackground },
    );
    runs.push({ name: 'hand-written', window: hand, ...(serverIdle ? { idle: serverIdle } : {}) });
    await endHandPool();
    await stopBoss();

    // ---- corral: one daemon at a time, each stopped before the next ---------------------------
    const curves = opts.curve === 'both' ? [true, false] : [opts.curve === 'on'];
    for (const curve of curves) {
      const name = curve ? 'corral (CURVE)' : 'corral (no CURVE)';
      let url = db.url;
      let target = probe;
      if (!curve && opts.curve === 'both') {
        // A database of its own, as in bench/e2e.ts: a database's SQL enqueue is for its one queue.
        try {
          const plainDb = await createDatabaseOn(db.url, `corral_profile_plain_${randomBytes(4).toString('hex')}`);
          cleanup.defer('drop the database without CURVE', () => plainDb.drop());
          await migrateDatabase(plainDb.url);
          url = plainDb.url;
          target = await ServerProbe.open(url, cleanup, opts.statements);
        } catch (e) {
          progress(`cannot create a second database (${(e as Error).message}): skipping corral without CURVE`);
          notes.push('corral without CURVE skipped: no second database');
          continue;
        }
      }
      const session = new CorralSession(url, home, sessionOptions(opts), db.serverCpuMs, curve);
      const stopSession = once(() => session.stop());
      cleanup.defer(`stop ${name}`, stopSession);
      await session.start();
      await target.query(`analyze ${config.bossSchema}.job`);
      await settle(`${name}: before its idle window`);
      let idle;
      if (opts.idleMs > 0) {
        progress(`${name}: the idle daemon for ${opts.idleMs / 1000} s`);
        idle = await measureWindow(
          meter,
          target,
          async () => {
            await sleep(opts.idleMs);
            return 0;
          },
          { settleMs: 0 },
        );
      }
      progress(`${name}: ${opts.rounds} rounds of ${sizes[0]} events over ${opts.actors} actors`);
      const window = await measureWindow(
        meter,
        target,
        async (w) => {
          let turns = 0;
          for (let i = 0; i < opts.rounds; i++) {
            await w.exclude(() => target.query(`analyze ${config.bossSchema}.job`));
            const r = await session.round(sizes[i]!, `${name} ${i + 1}/${opts.rounds}`);
            turns += r.events;
          }
          progress(`${name} done; settling`);
          return turns;
        },
        { settleMs: opts.settleMs, ...(idle ? { background: backgroundOf(idle) } : {}) },
      );
      const result = await session.result();
      progress(`stopping ${name}`);
      await stopSession();
      runs.push({
        name,
        window,
        workerCpuMs: result.workerCpuMsPerTurn * result.events,
        ...(idle ? { idle } : {}),
        contexts: result.contexts,
      });
    }

    for (const r of runs) {
      if (r.contexts && r.contexts.read > 0) {
        notes.push(
          `${r.name}: ${r.contexts.read} turn_start contexts read by the database: the daemon idled over 10 s before its rounds ` +
            '(settle and idle windows; its idle heap trim drops the context cache), so the first turn of each actor read its context',
        );
      }
    }
    if (opts.settleMs < 10_000) notes.push(`settle wait ${opts.settleMs / 1000} s < 10 s: transactions and rows may be undercounted`);
    if (!opts.processWorkers) notes.push('workers in the bench process: their CPU is in "this process"');
    const report: ProfileReport = {
      systems: runs.map(profileOf),
      params: {
        events: opts.events,
        actors: opts.actors,
        workers: opts.workers,
        capacity: opts.capacity,
        rounds: opts.rounds,
        rawReps: opts.rawReps,
        history: opts.history,
        contextMessages: opts.contextMessages ?? DEFAULTS.contextMessages,
        fetchBatch: config.fetchBatchSize,
        rawBatch: RAW_BATCH,
        handConcurrency: HAND_CONCURRENCY,
        workersAs: opts.processWorkers ? 'processes' : 'in-process',
        settleS: opts.settleMs / 1000,
      },
      env: {
        node: process.version,
        postgres: version.rows[0]!.v,
        database: db.source,
        fsync: db.ephemeral ? 'off' : 'server setting',
        pgStatStatements: probe.statementsAvailable,
        cpus: cpus().length,
        cpuModel: cpus()[0]?.model.trim() ?? 'unknown',
        memGiB: round(totalmem() / 2 ** 30, 1),
        loadAvg1m: round(load, 1),
      },
      notes,
      durationMs: 0,
    };
    await cleanup.run();
    report.durationMs = performance.now() - started;
    const json = `${JSON.stringify(roundDeep(report), null, 2)}\n`;
    if (opts.jsonFile) await writeFile(opts.jsonFile, json);
    if (opts.json) process.stdout.write(json);
    else printProfile(report);
    return 0;
  } catch (e) {
    if (interrupted) return 130;
    progress(`failed: ${e instanceof Error ? (e.stack ?? e.message) : String(e)}`);
    await cleanup.run();
    return 1;
  }
}

process.exitCode = await main();
