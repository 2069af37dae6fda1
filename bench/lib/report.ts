/** The end-to-end bench's report: its shape (also the --json output) and the table. */
import type { StatementRow } from './activity.ts';
import type { Percentiles } from './common.ts';
import type { CorralResult, WakeResult } from './corral-session.ts';
import type { RawResult } from './raw.ts';
import { HAND_CONCURRENCY } from '../handwritten.ts';

export interface Report {
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
    /** Workers as OS processes (the default) or in the bench's process (--in-process-workers). */
    processWorkers: boolean;
    /** turn_start context, latest messages. */
    contextMessages: number;
    /** Turns each actor committed before the measured rounds. */
    history: number;
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

export function printTable(r: Report): void {
  const f0 = (n: number) => n.toFixed(0);
  const f1 = (n: number) => n.toFixed(1);
  const f2 = (n: number) => n.toFixed(2);
  const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;
  const pct = (p: Percentiles) => `p50 ${f1(p.p50)} ms  p95 ${f1(p.p95)} ms  max ${f1(p.max)} ms`;
  const c = r.corral;
  const rows: [string, string][] = [
    [
      'ratio corral / raw',
      `${r.ratio.toFixed(4)}  (median of ${r.roundRatios.length} rounds: ${r.roundRatios.map((x) => x.toFixed(4)).join(', ')}; pooled ${r.pooledRatio.toFixed(4)})`,
    ],
    [
      'ratio corral / hand-written',
      `${r.ratioHandwritten.toFixed(3)}  (median of ${r.roundRatiosHandwritten.map((x) => x.toFixed(3)).join(', ')}; hand-written ${f0(r.handwrittenJobsPerSec)} jobs/s: one transaction per job, ${HAND_CONCURRENCY} at a time)`,
    ],
    [
      'ratio without CURVE',
      `${r.ratioWithoutCurve.toFixed(4)}  (median of ${r.roundRatiosWithoutCurve.map((x) => x.toFixed(4)).join(', ')}; ${f0(r.turnsPerSecWithoutCurve)} turns/s; CURVE costs ${f1((1 - r.ratio / r.ratioWithoutCurve) * 100)} %)`,
    ],
    [
      'corral end to end',
      `${f0(c.turnsPerSec)} turns/s  (${c.events} turns in ${f0(c.totalMs)} ms; rounds ${c.rounds.map((x) => f0(x.turnsPerSec)).join(' / ')})`,
    ],
    [
      'raw pg-boss fetch+complete',
      `${f0(r.raw.jobsPerSec)} jobs/s  (slices ${r.raw.slices.map((x) => f0(x.jobsPerSec)).join(' / ')}; spread ${f0(r.raw.spreadPct)} %)`,
    ],
    ['  without the insert', `${r.raw.slices.map((x) => f0(x.drainJobsPerSec)).join(' / ')} jobs/s`],
    [
      'corral process',
      `event loop ${f0(c.eventLoopUtilization * 100)} % busy during the rounds (daemon${r.params.processWorkers ? '' : ' + workers'} + bench); ` +
        `${f1(c.meanInFlight)} of ${r.params.slots} slots in use on average`,
    ],
    [
      'CPU per turn / per raw job',
      `corral ${f2(c.processCpuMsPerTurn)} ms node${
        r.params.processWorkers ? ` (daemon ${f2(c.processCpuMsPerTurn - c.workerCpuMsPerTurn)} + workers ${f2(c.workerCpuMsPerTurn)})` : ''
      } + ${c.serverCpuMsPerTurn !== undefined ? `${f2(c.serverCpuMsPerTurn)} ms` : '?'} postgres; ` +
        `raw ${f2(mean(r.raw.slices.map((x) => x.processCpuMsPerJob ?? Number.NaN)))} ms node + ${
          r.cpuRatio !== undefined ? `${f2(mean(r.raw.slices.map((x) => x.serverCpuMsPerJob!)))} ms` : '?'
        } postgres`,
    ],
    ...(r.cpuRatio !== undefined
      ? [['CPU cost ratio raw / corral', `${r.cpuRatio.toFixed(4)}  (CPU time instead of wall time)`] as [string, string]]
      : []),
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
    [
      'N events / A actors',
      `${r.params.events} / ${r.params.actors} in ${r.params.rounds} rounds` +
        (r.params.history > 0 ? `, after ${r.params.history} turns per actor` : ', on new actors'),
    ],
    ['turns begun in a commit', `${c.continued} of ${c.events} (the actor's previous turn's commit claimed and began them)`],
    ...(c.contexts.cached + c.contexts.read > 0
      ? ([['turn_start contexts', `${c.contexts.cached} from the daemon's cache, ${c.contexts.read} read by the database`]] as [
          string,
          string,
        ][])
      : []),
    [
      'W workers × capacity',
      `${r.params.workers} × ${r.params.capacity} = ${r.params.slots} slots (fetch batch ${r.params.fetchBatch}); workers ${r.params.processWorkers ? 'as OS processes' : 'in the bench process'}; context ${r.params.contextMessages} messages`,
    ],
    ['Node', r.env.node],
    ['PostgreSQL', `${r.env.postgres} (${r.env.database}${r.env.ephemeralDatabase ? ', fsync off' : ''})`],
    [
      'machine',
      `${r.env.cpus} CPUs (${r.env.cpuModel}), ${r.env.memGiB} GiB, ${r.env.platform}, load ${r.env.loadAvg1m.toFixed(1)} at start`,
    ],
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
    process.stdout.write(
      `\ndaemon pool (max ${p.max}): mean ${p.meanInUse} checked out, mean ${p.meanWaiting} callers waiting (max ${p.maxWaiting})\n`,
    );
    process.stdout.write(`pg_stat_activity during the rounds (${a.samples} samples; mean backends per state/wait):\n`);
    for (const [k, n] of Object.entries(a.meanBackends)) process.stdout.write(`  ${n.toFixed(2).padStart(6)}  ${k}\n`);
    process.stdout.write('busy backends by statement (share of busy samples):\n');
    for (const q of a.topQueries) process.stdout.write(`  ${(q.share * 100).toFixed(1).padStart(5)} %  ${q.query}\n`);
  }
}
