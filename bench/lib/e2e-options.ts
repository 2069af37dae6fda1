/** Command-line options of the end-to-end bench (bench/e2e.ts). */
import { parseArgs } from 'node:util';
import { DEFAULT_WORKER_CAPACITY } from '../../src/base/defaults.ts';

export interface Options {
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
  /** Workers as OS processes (`corral worker`), as deployed (default), or in this process. */
  processWorkers: boolean;
  /** `turn_start` context size (messages); corral's default when absent. */
  contextMessages: number | undefined;
  /** Turns each actor commits before the measured rounds (its conversation's history). */
  history: number;
  /** The daemon's context cache (bytes); corral's default when absent. */
  contextCacheBytes: number | undefined;
  /** Write a CPU profile of this process per CURVE round to `<prefix>-round<i>.cpuprofile`. */
  cpuProfile: string | undefined;
  /** Busy actors' next turns begin in their commits (corral's default); false: every turn through the queue's fetch. */
  continueTurns: boolean;
}

export const USAGE = `usage: npm run bench -- [options]
  --events N          events (and raw jobs per slice)                   (default 1500, quick 400)
  --actors A          distinct actor keys the events are spread over   (default 150, quick 40)
  --workers W         example workers                                  (default 2)
  --in-process-workers  run the workers in the bench's process instead of as OS processes
                      (\`corral worker\`, as deployed: the default; their CPU is counted with the daemon's)
  --context-messages N  turn_start context, latest messages (default: corral's, 50; 0 = none)
  --history T         turns each actor commits before the measured rounds, so that every
                      measured turn continues a conversation (default 25: 50 messages, a full
                      context at the default; 0 = the rounds start on new actors)
  --context-cache-bytes B  the daemon's context cache (default: corral's; 0 = every context is
                      read by the database)
  --capacity C        concurrent turns per worker             (default: corral's, 32)
  --samples S         single events in the wake-latency phase          (default 50, quick 15)
  --rounds R          corral rounds of N/R events, each between two raw slices of N jobs
                      (default 3, quick 2)
  --raw-reps K        repetitions per raw slice; the slice counts its median  (default 3)
  --phase-timeout S   deadline per phase, seconds                      (default 90)
  --sample-activity   sample pg_stat_activity and the daemon's pool during the corral rounds
  --statements        embedded database only: load pg_stat_statements and report the statements
                      of the corral rounds by server time (calls per turn, mean time)
  --cpu-profile PREFIX  write a V8 CPU profile of the bench process (daemon, and the workers when
                      in-process) for each CURVE round: PREFIX-round<i>.cpuprofile
  --no-continue       every turn through the queue's fetch and a begin transaction (a busy actor's
                      next turn otherwise begins in its current turn's commit: corral's default)
  --quick             a smaller run (a smoke test of the benchmark itself)
  --json              print the result as JSON on stdout instead of a table
  -h, --help`;

export function parseOptions(argv: string[]): Options {
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
      'in-process-workers': { type: 'boolean', default: false },
      'context-messages': { type: 'string' },
      history: { type: 'string' },
      'context-cache-bytes': { type: 'string' },
      'cpu-profile': { type: 'string' },
      'no-continue': { type: 'boolean', default: false },
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
    capacity: int('capacity', values.capacity, DEFAULT_WORKER_CAPACITY, 1, 1024),
    samples: int('samples', values.samples, quick ? 15 : 50, 0, 10_000),
    rounds: int('rounds', values.rounds, quick ? 2 : 3, 1, 100),
    rawReps: int('raw-reps', values['raw-reps'], 3, 1, 100),
    phaseTimeoutMs: int('phase-timeout', values['phase-timeout'], 90, 1, 3600) * 1000,
    json: values.json,
    quick,
    sampleActivity: values['sample-activity'],
    statements: values.statements,
    processWorkers: !values['in-process-workers'],
    cpuProfile: values['cpu-profile'],
    continueTurns: !values['no-continue'],
    contextMessages: values['context-messages'] === undefined ? undefined : int('context-messages', values['context-messages'], 0, 0, 1000),
    history: int('history', values.history, quick ? 5 : 25, 0, 10_000),
    contextCacheBytes:
      values['context-cache-bytes'] === undefined
        ? undefined
        : int('context-cache-bytes', values['context-cache-bytes'], 0, 0, Number.MAX_SAFE_INTEGER),
  };
  if (opts.rounds > opts.events) throw new UsageError('--rounds must not exceed --events');
  return opts;
}

export class UsageError extends Error {}
