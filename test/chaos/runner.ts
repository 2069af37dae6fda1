/**
 * Running one chaos scenario end to end: a fresh database, the scenario's processes and faults,
 * quiescence, then the invariant checks (invariants.ts) and the daemons' log statistics.
 * Used by `scripts/chaos.ts` (full runs) and `test/chaos/chaos.test.ts` (reduced CI runs).
 * Nothing here edits the runtime; it only imports its public helpers to create the schema and
 * to enqueue events the same way producers do.
 */
import { mkdtemp } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { waitFor } from '../helpers/wait.ts';
import { Cluster } from './cluster.ts';
import { CHAOS_TIMINGS, type ChaosEnvironment, type ChaosTimings } from './environment.ts';
import { checkOrphanRecovery, type CheckSummary, type Violation } from './invariants.ts';
import { daemonLogStats, tailFile, type LogStats } from './logs.ts';
import { planEvents, type PlannedEvent, type PlanOptions } from './plan.ts';
import { ScenarioDb, type Progress } from './scenario-db.ts';

export interface ScenarioContext {
  cluster: Cluster;
  db: ScenarioDb;
  env: ChaosEnvironment;
  timings: ChaosTimings;
  /** The full plan; the scenario decides how to enqueue it (usually `startProducer()`). */
  events: PlannedEvent[];
  /** Starts enqueueing the plan in the background (chunks of 20 every 100 ms). */
  startProducer(chunk?: number, pauseMs?: number): Promise<void>;
  /** Waits until `fraction` of the whole plan is committed or dead-lettered. */
  waitSettled(fraction: number, timeoutMs?: number): Promise<Progress>;
  /** Scenario state shared between `run` and `verify`. */
  state: Record<string, unknown>;
  /** The run's seed (for scenario-level random choices). */
  seed: number;
  /** A scenario-specific expectation that failed (reported as a violation). */
  expect(cond: boolean, code: string, message: string, details?: unknown): void;
  note(msg: string): void;
  log(msg: string): void;
}

export interface Scenario {
  id: string;
  title: string;
  /** Needs `env.restartServer` (skipped otherwise). */
  needsServerControl?: boolean;
  /** Overrides of the event plan (e.g. longer turns, so a fault surely lands mid-turn). */
  plan?: Pick<Partial<PlanOptions>, 'delayMs' | 'slowFraction' | 'burst'>;
  /** Extra environment of the scenario's daemons (e.g. `CORRAL_INPUT_POLICY: 'coalesce'`). */
  daemonEnv?: Record<string, string>;
  /** Some non-failing events may legitimately exhaust their retries under this fault. */
  allowUnexpectedDeadLetters?: boolean;
  run(ctx: ScenarioContext): Promise<void>;
  /** Extra checks after quiescence (e.g. late results were rejected). */
  verify?(ctx: ScenarioContext, result: ScenarioResult): Promise<void> | void;
}

export interface RunOptions {
  events: number;
  actors: number;
  failures: number;
  seed: number;
  timings?: ChaosTimings;
  quiescenceTimeoutMs?: number;
  /**
   * After quiescence, how long to wait for every delivery to end (no created / sent / accepted
   * left: late results answered, fenced turns closed) before stopping the processes. Not reaching
   * it is noted, not a violation (the residue is in the summary).
   */
  settleTimeoutMs?: number;
  logRoot?: string;
  keepDatabase?: boolean;
  log?: (msg: string) => void;
}

export interface ScenarioResult {
  scenario: string;
  title: string;
  ok: boolean;
  skipped?: string;
  events: number;
  committed: number;
  deadLettered: number;
  expectedDeadLetters: number;
  violations: Violation[];
  notes: string[];
  stats?: LogStats;
  summary?: CheckSummary;
  durationMs: number;
  quiescenceMs?: number;
  logDir: string;
  database?: string;
  seed: number;
}

export async function makeLogRoot(prefix = 'corral-chaos-'): Promise<string> {
  return mkdtemp(join(tmpdir(), prefix));
}

/** Runs one scenario end to end. Never throws for a scenario failure: it is in the result. */
export async function runScenario(scenario: Scenario, env: ChaosEnvironment, o: RunOptions): Promise<ScenarioResult> {
  const started = Date.now();
  const timings = o.timings ?? CHAOS_TIMINGS;
  const logRoot = o.logRoot ?? (await makeLogRoot());
  const logDir = join(logRoot, scenario.id);
  const log = (m: string) => o.log?.(`[${scenario.id} +${((Date.now() - started) / 1000).toFixed(1)}s] ${m}`);
  const result: ScenarioResult = {
    scenario: scenario.id,
    title: scenario.title,
    ok: false,
    events: o.events,
    committed: 0,
    deadLettered: 0,
    expectedDeadLetters: 0,
    violations: [],
    notes: [],
    durationMs: 0,
    logDir,
    seed: o.seed,
  };
  if (scenario.needsServerControl && !env.restartServer) {
    result.ok = true;
    result.skipped = `needs a PostgreSQL server this process controls (${env.describe})`;
    result.durationMs = Date.now() - started;
    return result;
  }
  const database = await env.createDatabase(scenario.id);
  result.database = database.name;
  let db: ScenarioDb | undefined;
  const cluster = new Cluster({
    logDir,
    databaseUrl: database.url,
    timings,
    ...(scenario.daemonEnv ? { daemonEnv: scenario.daemonEnv } : {}),
  });
  let producer: Promise<void> | undefined;
  let producerError: unknown;
  try {
    db = await ScenarioDb.open(database, timings);
    const events = planEvents({ events: o.events, actors: o.actors, failures: o.failures, seed: o.seed, ...scenario.plan });
    const dbRef = db;
    const ctx: ScenarioContext = {
      cluster,
      db,
      env: env.restartServer
        ? {
            ...env,
            restartServer: async (downMs: number) => {
              cluster.markFault('PostgreSQL restart');
              await env.restartServer!(downMs);
            },
          }
        : env,
      timings,
      events,
      startProducer(chunk = 20, pauseMs = 100) {
        producer ??= dbRef.produce(events, chunk, pauseMs).catch((e: unknown) => {
          producerError = e;
        });
        return producer;
      },
      waitSettled: (fraction, timeoutMs = 60_000) => dbRef.waitProgress(fraction, timeoutMs, events.length),
      state: {},
      seed: o.seed,
      expect(cond, code, message, details) {
        if (!cond) result.violations.push({ invariant: 'expectation', code, message, ...(details !== undefined ? { details } : {}) });
      },
      note: (m) => result.notes.push(m),
      log,
    };
    log(`database ${database.name}, logs ${logDir}`);
    let runFailed = false;
    try {
      await scenario.run(ctx);
    } catch (e) {
      // The fault injection itself failed (a process died, a wait timed out): record it, then
      // still check what the database says.
      runFailed = true;
      result.violations.push({ invariant: 'harness', code: 'scenario_error', message: (e as Error).stack ?? String(e) });
      log(`scenario step failed: ${(e as Error).message.split('\n')[0]}`);
    }
    await ctx.startProducer();
    await producer;
    if (producerError) {
      runFailed = true;
      result.violations.push({
        invariant: 'harness',
        code: 'producer_error',
        message: `enqueueing failed: ${(producerError as Error).stack ?? String(producerError)}`,
      });
    }
    let quiescent = false;
    if (!runFailed) {
      log('faults injected; waiting for quiescence');
      const q = await db.waitQuiescent(events.length, o.quiescenceTimeoutMs ?? 120_000);
      result.quiescenceMs = q.waitedMs;
      quiescent = q.ok;
      if (!q.ok) {
        result.violations.push({
          invariant: 'quiescence',
          code: 'not_quiescent',
          message: `not quiescent after ${o.quiescenceTimeoutMs ?? 120_000} ms: ${JSON.stringify(q.progress)}`,
          details: await db.diagnoseUnsettled().catch((e: unknown) => String(e)),
        });
      } else {
        log(`quiescent after ${(q.waitedMs / 1000).toFixed(1)} s: ${JSON.stringify(q.progress)}`);
      }
      const settleTimeoutMs = o.settleTimeoutMs ?? 10_000;
      const settled = await waitFor(async () => (await dbRef.liveDeliveries()) === 0, {
        what: 'deliveries settled',
        timeoutMs: settleTimeoutMs,
        intervalMs: 100,
      }).then(
        () => true,
        () => false,
      );
      if (!settled) result.notes.push(`deliveries still live ${settleTimeoutMs} ms after quiescence`);
    }
    await cluster.stopAll();
    const check = await db.checkInvariants({ allowUnexpectedDeadLetters: scenario.allowUnexpectedDeadLetters ?? false });
    // Unsettled events of a run that never got quiet are reported once, by `not_quiescent`.
    const lost = check.violations.filter((x) => x.code === 'lost');
    result.violations.push(...(quiescent ? check.violations : check.violations.filter((x) => x.code !== 'lost')));
    if (!quiescent && lost.length > 0) result.notes.push(`${lost.length} event(s) unsettled when the run ended`);
    result.summary = check.summary;
    result.committed = check.summary.committed;
    result.deadLettered = check.summary.deadLettered;
    result.expectedDeadLetters = check.summary.expectedDeadLetters;
    result.events = check.summary.events;
    result.stats = daemonLogStats(cluster.daemons().map((d) => d.logPath));
    result.violations.push(...(await checkOrphanRecovery(db.database.db, cluster.faults, timings)));
    if (result.stats.errors > 0) {
      // The daemons log an error for a turn operation that failed outright. B3: a lost database
      // connection wrapped by Drizzle (DrizzleQueryError) is not recognised as one, so the
      // operation is not retried and a worker's result (or a begin) is dropped.
      const allConnection = result.stats.connectionErrors === result.stats.errors;
      result.violations.push({
        invariant: 'process',
        code: 'daemon_error_log',
        message: `daemons logged ${result.stats.errors} error line(s)${result.stats.connectionErrors > 0 ? `, ${result.stats.connectionErrors} of them a lost database connection that was not retried` : ''}`,
        details: result.stats.errorSamples,
        ...(allConnection ? { knownIssue: 'B3' } : {}),
      });
    }
    await scenario.verify?.(ctx, result);
  } catch (e) {
    result.violations.push({ invariant: 'harness', code: 'scenario_error', message: (e as Error).stack ?? String(e) });
  } finally {
    await cluster.cleanup();
    for (const u of cluster.unexpectedExits) {
      const tail = tailFile(u.logPath, 40);
      result.violations.push({
        invariant: 'process',
        code: 'unexpected_exit',
        message: `${u.name} exited on its own (code ${u.code}, signal ${u.signal}); log ${u.logPath}`,
        details: tail,
        // B1: an unheard 'error' on a checked-out pg client (PostgreSQL went away mid-transaction).
        ...(/Unhandled 'error' event/.test(tail) && /57P0|terminating connection|Connection terminated/.test(tail)
          ? { knownIssue: 'B1' }
          : {}),
      });
    }
    result.notes.push(...cluster.notes);
    await db?.close();
    result.ok = result.violations.length === 0;
    if (result.ok && !o.keepDatabase) await database.drop().catch(() => undefined);
    result.durationMs = Date.now() - started;
  }
  return result;
}

/** A one-paragraph account of a failed scenario, for test output and the script. */
export function describeFailure(r: ScenarioResult, maxViolations = 12): string {
  const lines = [
    `scenario ${r.scenario} (${r.title}): ${r.violations.length} violation(s); seed ${r.seed}; logs in ${r.logDir}; database ${r.database ?? '-'}`,
  ];
  for (const x of r.violations.slice(0, maxViolations)) {
    lines.push(`  [${x.invariant}] ${x.code}${x.knownIssue ? ` (like bug ${x.knownIssue}, see test/chaos/README.md)` : ''}: ${x.message}`);
    if (x.details !== undefined) {
      const d = typeof x.details === 'string' ? x.details : JSON.stringify(x.details);
      lines.push(`      ${d.length > 1500 ? `${d.slice(0, 1500)}…` : d}`);
    }
  }
  if (r.violations.length > maxViolations) lines.push(`  … and ${r.violations.length - maxViolations} more`);
  for (const n of r.notes) lines.push(`  note: ${n}`);
  return lines.join('\n');
}
