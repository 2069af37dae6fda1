/**
 * What tracing costs: the end-to-end rounds of `npm run bench` (bench/lib/corral-session.ts: a
 * started Daemon, `corral worker` processes, CURVE on) with tracing off and with tracing on at
 * 100 % sampling, interleaved in one run on one database server; the tracing session exports
 * every span (the daemon's and the workers') over OTLP/HTTP protobuf to a receiver in this
 * process (test/helpers/otlp-receiver.ts, which decodes them). Reported as the ratio of turns/s
 * (on ÷ off, the median of the rounds) and CPU per turn, with the spans received per turn.
 *
 *   npm run bench:tracing -- [--events N] [--actors A] [--workers W] [--capacity C] [--rounds R] [--quick] [--json]
 *
 * (the options of `npm run bench`; --samples, --raw-reps and --statements are not used here.)
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { cpus, loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { migrateDatabase } from '../src/db/migrate.ts';
import { createTurnTracer } from '../src/observability/tracing.ts';
import { tracingSettings } from '../src/observability/tracing-settings.ts';
import { createDatabaseOn } from '../test/helpers/databases.ts';
import { OtlpReceiver } from '../test/helpers/otlp-receiver.ts';
import { Cleanup, median, progress, round, split } from './lib/common.ts';
import { CorralSession } from './lib/corral-session.ts';
import { openBenchDatabase } from './lib/database.ts';
import { parseOptions, USAGE, type Options } from './lib/e2e-options.ts';

async function main(): Promise<number> {
  let opts: Options;
  try {
    opts = parseOptions(process.argv.slice(2));
  } catch (e) {
    process.stderr.write(`${(e as Error).message}\n${USAGE.replace('npm run bench', 'npm run bench:tracing')}\n`);
    return 2;
  }
  const cleanup = new Cleanup();
  const onSignal = () => void cleanup.run().finally(() => process.exit(130));
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);
  try {
    const otlp = new OtlpReceiver();
    await otlp.start();
    cleanup.defer('stop the OTLP receiver', () => otlp.stop());
    const env = { OTEL_EXPORTER_OTLP_ENDPOINT: otlp.endpoint, OTEL_TRACES_SAMPLER: 'always_on', OTEL_BSP_SCHEDULE_DELAY: '200' };
    const tracer = createTurnTracer(tracingSettings(env, 'corral-daemon')!);
    cleanup.defer('stop the tracer', () => tracer.shutdown());

    const db = await openBenchDatabase(cleanup, opts);
    const home = await mkdtemp(join(tmpdir(), 'corral-bench-home-'));
    cleanup.defer('remove daemon home', () => rm(home, { recursive: true, force: true }));
    await migrateDatabase(db.url);
    // each session in a database of its own on the same server (a database's queue is its own)
    const tracedDb = await createDatabaseOn(db.url, `corral_bench_traced_${randomBytes(4).toString('hex')}`);
    cleanup.defer('drop the traced database', () => tracedDb.drop());
    await migrateDatabase(tracedDb.url);

    const off = new CorralSession(db.url, home, opts, db.serverCpuMs);
    const on = new CorralSession(tracedDb.url, home, opts, db.serverCpuMs, true, {
      tracer,
      workerEnv: { ...env, OTEL_SERVICE_NAME: 'corral-bench-worker' },
    });
    cleanup.defer('stop corral', () => off.stop());
    cleanup.defer('stop corral traced', () => on.stop());
    await off.start();
    await on.start();
    // the warm-up's spans are not counted: they reach the receiver within the batch delay
    await new Promise((r) => setTimeout(r, 1_000));
    const spansBefore = otlp.spans.length;

    const sizes = split(opts.events, opts.rounds);
    const ratios: number[] = [];
    for (let i = 0; i < opts.rounds; i++) {
      // alternating which goes first: the process warms up over the run
      const order = i % 2 === 0 ? [off, on] : [on, off];
      const rate = new Map<CorralSession, number>();
      for (const s of order)
        rate.set(s, (await s.round(sizes[i]!, `${s === on ? 'traced' : 'untraced'} ${i + 1}/${opts.rounds}`)).turnsPerSec);
      ratios.push(rate.get(on)! / rate.get(off)!);
    }
    const offResult = await off.result();
    const onResult = await on.result();
    await on.stop();
    await off.stop();
    await tracer.shutdown();
    // the workers flush on their way out: give the receiver a moment to take the last batch
    await new Promise((r) => setTimeout(r, 500));
    const measuredTurns = opts.events;
    const spans = otlp.spans.length - spansBefore;
    const report = {
      when: new Date().toISOString(),
      machine: { cpus: cpus().length, load1: round(loadavg()[0] ?? 0, 2) },
      params: { events: opts.events, actors: opts.actors, workers: opts.workers, capacity: opts.capacity, rounds: opts.rounds },
      ratioTracedToUntraced: round(median(ratios), 3),
      roundRatios: ratios.map((r) => round(r, 3)),
      untraced: { turnsPerSec: round(offResult.turnsPerSec, 0), processCpuMsPerTurn: round(offResult.processCpuMsPerTurn, 3) },
      traced: { turnsPerSec: round(onResult.turnsPerSec, 0), processCpuMsPerTurn: round(onResult.processCpuMsPerTurn, 3) },
      spansPerTurn: round(spans / measuredTurns, 2),
      exportProblems: otlp.problems.length,
    };
    if (opts.json) process.stdout.write(`${JSON.stringify(report, null, 2)}\n`);
    else {
      process.stdout.write(
        [
          `tracing at 100 % sampling, OTLP/HTTP protobuf to a local receiver (${report.machine.cpus} CPUs, load ${report.machine.load1})`,
          `  ${opts.events} turns per session over ${opts.actors} actors, ${opts.workers} workers × ${opts.capacity}, ${opts.rounds} rounds`,
          `  untraced: ${report.untraced.turnsPerSec} turns/s, ${report.untraced.processCpuMsPerTurn} ms CPU/turn (daemon + workers)`,
          `  traced:   ${report.traced.turnsPerSec} turns/s, ${report.traced.processCpuMsPerTurn} ms CPU/turn (daemon + workers)`,
          `  ratio traced / untraced (median of rounds): ${report.ratioTracedToUntraced}  rounds: ${report.roundRatios.join(', ')}`,
          `  spans received per turn: ${report.spansPerTurn} (undecodable requests: ${report.exportProblems})`,
          '',
        ].join('\n'),
      );
    }
    return 0;
  } catch (e) {
    progress(`failed: ${(e as Error).stack ?? String(e)}`);
    return 1;
  } finally {
    await cleanup.run();
  }
}

process.exitCode = await main();
