/** Command-line options of the per-turn profile (bench/profile.ts). */
import { parseArgs } from 'node:util';
import { DEFAULT_WORKER_CAPACITY } from '../../src/base/defaults.ts';
import type { Options as E2eOptions } from './e2e-options.ts';

export interface ProfileOptions {
  events: number;
  actors: number;
  workers: number;
  capacity: number;
  rounds: number;
  rawReps: number;
  history: number;
  /** Which corral daemons to profile: with CURVE (the default deployment), without, or both. */
  curve: 'on' | 'off' | 'both';
  /** Load pg_stat_statements (embedded server: restarted with it). */
  statements: boolean;
  /** Wait after each window until every backend has flushed its statistics (ms). */
  settleMs: number;
  /** The idle daemon's background, measured before its rounds (ms; 0 = not measured). */
  idleMs: number;
  phaseTimeoutMs: number;
  processWorkers: boolean;
  contextMessages: number | undefined;
  contextCacheBytes: number | undefined;
  json: boolean;
  /** Also write the JSON report to this file (with the table on stdout). */
  jsonFile: string | undefined;
  quick: boolean;
}

export const PROFILE_USAGE = `usage: npm run bench:profile -- [options]
  Per committed turn, side by side: raw pg-boss (fetch+complete), the hand-written pg-boss handler,
  and corral (daemon + example worker processes, as \`npm run bench\` runs them): statements, round
  trips, transactions, rows written, WAL, PostgreSQL and Node CPU, ZeroMQ messages.

  --events N          events per system (raw: jobs per repetition)       (default 1500, quick 400)
  --actors A          distinct actor keys the events are spread over     (default 150, quick 40)
  --workers W         example workers                                    (default 2)
  --capacity C        concurrent turns per worker                        (default: corral's, ${DEFAULT_WORKER_CAPACITY})
  --rounds R          corral and hand-written rounds of N/R events       (default 3, quick 2)
  --raw-reps K        raw pg-boss repetitions of N jobs                  (default 3, quick 1)
  --history T         turns each corral actor commits before the rounds  (default 25, quick 5)
  --curve on|off|both corral daemons profiled: with CURVE, without (--insecure), or both
                      (default both, quick on)
  --no-statements     do not load pg_stat_statements (no per-statement figures; an embedded
                      server is otherwise restarted with it)
  --settle S          seconds to wait after each window for PostgreSQL's statistics (pg_stat_database,
                      pg_stat_user_tables) to be flushed by every backend: at least 10 for exact
                      transaction and row counts (default 11)
  --idle S            seconds of the idle daemon measured before its rounds (its background, per
                      second; subtracted from the settle wait)           (default 12, quick 6; 0 = skip)
  --context-messages N   turn_start context size (default: corral's)
  --context-cache-bytes B  the daemon's context cache (default: corral's)
  --in-process-workers   run the workers in the bench's process instead of as OS processes
  --phase-timeout S   deadline per phase, seconds                        (default 90)
  --quick             a smaller run (~1 minute)
  --json              print the result as JSON on stdout instead of the table
  --json-file PATH    also write the JSON to PATH
  -h, --help

Uses DATABASE_URL when set (a scratch database on that server; pg_stat_statements only if the server
has it loaded; no server CPU), else an embedded PostgreSQL in a temporary folder, removed at the end.`;

export class UsageError extends Error {}

export function parseProfileOptions(argv: string[]): ProfileOptions | 'help' {
  let values;
  try {
    ({ values } = parseArgs({
      args: argv,
      options: {
        events: { type: 'string' },
        actors: { type: 'string' },
        workers: { type: 'string' },
        capacity: { type: 'string' },
        rounds: { type: 'string' },
        'raw-reps': { type: 'string' },
        history: { type: 'string' },
        curve: { type: 'string' },
        'no-statements': { type: 'boolean', default: false },
        settle: { type: 'string' },
        idle: { type: 'string' },
        'context-messages': { type: 'string' },
        'context-cache-bytes': { type: 'string' },
        'in-process-workers': { type: 'boolean', default: false },
        'phase-timeout': { type: 'string' },
        quick: { type: 'boolean', default: false },
        json: { type: 'boolean', default: false },
        'json-file': { type: 'string' },
        help: { type: 'boolean', short: 'h', default: false },
      },
      strict: true,
      allowPositionals: false,
    }));
  } catch (e) {
    throw new UsageError((e as Error).message);
  }
  if (values.help) return 'help';
  const quick = values.quick;
  const int = (name: string, raw: string | undefined, dflt: number, min: number, max: number): number => {
    if (raw === undefined) return dflt;
    const n = Number(raw);
    if (!Number.isInteger(n) || n < min || n > max) throw new UsageError(`--${name} must be an integer in ${min}..${max}`);
    return n;
  };
  const curve = values.curve ?? (quick ? 'on' : 'both');
  if (curve !== 'on' && curve !== 'off' && curve !== 'both') throw new UsageError('--curve must be on, off or both');
  const opts: ProfileOptions = {
    events: int('events', values.events, quick ? 400 : 1500, 1, 1_000_000),
    actors: int('actors', values.actors, quick ? 40 : 150, 1, 100_000),
    workers: int('workers', values.workers, 2, 1, 64),
    capacity: int('capacity', values.capacity, DEFAULT_WORKER_CAPACITY, 1, 1024),
    rounds: int('rounds', values.rounds, quick ? 2 : 3, 1, 100),
    rawReps: int('raw-reps', values['raw-reps'], quick ? 1 : 3, 1, 100),
    history: int('history', values.history, quick ? 5 : 25, 0, 10_000),
    curve,
    statements: !values['no-statements'],
    settleMs: int('settle', values.settle, 11, 0, 600) * 1000,
    idleMs: int('idle', values.idle, quick ? 6 : 12, 0, 600) * 1000,
    phaseTimeoutMs: int('phase-timeout', values['phase-timeout'], 90, 1, 3600) * 1000,
    processWorkers: !values['in-process-workers'],
    contextMessages: values['context-messages'] === undefined ? undefined : int('context-messages', values['context-messages'], 0, 0, 1000),
    contextCacheBytes:
      values['context-cache-bytes'] === undefined
        ? undefined
        : int('context-cache-bytes', values['context-cache-bytes'], 0, 0, Number.MAX_SAFE_INTEGER),
    json: values.json,
    jsonFile: values['json-file'],
    quick,
  };
  if (opts.rounds > opts.events) throw new UsageError('--rounds must not exceed --events');
  return opts;
}

/** The end-to-end bench's options for its corral session (bench/lib/corral-session.ts). */
export function sessionOptions(o: ProfileOptions): E2eOptions {
  return {
    events: o.events,
    actors: o.actors,
    workers: o.workers,
    capacity: o.capacity,
    samples: 0,
    rounds: o.rounds,
    rawReps: o.rawReps,
    json: o.json,
    quick: o.quick,
    phaseTimeoutMs: o.phaseTimeoutMs,
    sampleActivity: false,
    statements: false,
    processWorkers: o.processWorkers,
    contextMessages: o.contextMessages,
    history: o.history,
    contextCacheBytes: o.contextCacheBytes,
    cpuProfile: undefined,
    continueTurns: true,
  };
}
