/**
 * Chaos harness: real OS processes (`corral daemon`, `corral worker`), real PostgreSQL, real
 * ZeroMQ. It spawns and kills processes, enqueues a planned set of events, waits for quiescence
 * and then checks the runtime's invariants FROM THE DATABASE ONLY:
 *
 *  I1 every event is committed exactly once (one succeeded turn, its two messages written once,
 *     its job completed with that attempt) or is in the dead-letter queue, never both, never lost;
 *  I2 per actor, committed events appear in the transcript in enqueue order (UUIDv7 order),
 *     skipping only dead-lettered ones; message seqs are gapless;
 *  I3 no transcript row was written under a stale fence: each succeeded turn equals the delivery
 *     and activation it committed under, no later attempt / newer epoch exists for its event, and
 *     no message belongs to a turn that did not succeed;
 *  I4 never two live activations for one actor: the partial unique index exists, epochs are unique
 *     per actor and strictly increase with creation time, and never exceed the durable counter.
 *
 * Used by `scripts/chaos.ts` (full runs) and `test/chaos/chaos.test.ts` (reduced CI runs).
 * Nothing here edits the runtime; it only imports its public helpers to create the schema and
 * to enqueue events the same way producers do.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { closeSync, existsSync, mkdirSync, openSync, readFileSync } from 'node:fs';
import { mkdtemp } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { isDeepStrictEqual } from 'node:util';
import type pg from 'pg';
import type { PgBoss } from 'pg-boss';
import { DEFAULTS, loadConfig, type Config } from '../../src/config.ts';
import { openDatabase, type Database } from '../../src/db/client.ts';
import { migrateDatabase } from '../../src/db/migrate.ts';
import { createBoss, ensureQueues, queuesOf } from '../../src/queue/boss.ts';
import { createEventQueue, type EventQueue } from '../../src/queue/events.ts';
import { waitFor } from '../helpers/wait.ts';
import { freePort } from '../helpers/processes.ts';
import { createDatabaseOn } from '../helpers/databases.ts';

export { freePort };

export { CORRAL_BIN } from '../helpers/processes.ts';
import { CORRAL_BIN } from '../helpers/processes.ts';
/** Preload that makes a child kill itself when the harness process disappears. */
const PARENT_WATCH = new URL('./parent-watch.mjs', import.meta.url).href;

// ---------------------------------------------------------------------------------------------
// timings and environment

/** Short timings so faults resolve in seconds (each maps to a CORRAL_* variable). */
export interface ChaosTimings {
  leaseMs: number;
  progressIntervalMs: number;
  workerHeartbeatMs: number;
  workerStaleMs: number;
  watchdogIntervalMs: number;
  recoveryIntervalMs: number;
  retryLimit: number;
  retryDelayS: number;
  retryDelayMaxS: number;
  pollIntervalMs: number;
  /** pg-boss expiry backstop for an active job nobody settles (CORRAL_JOB_EXPIRE_S, min 5). */
  jobExpireS?: number;
  /** pg-boss fails an active job its daemon stopped touching (CORRAL_JOB_HEARTBEAT_S, min 10). */
  jobHeartbeatS?: number;
}

export const CHAOS_TIMINGS: ChaosTimings = {
  leaseMs: 2000,
  progressIntervalMs: 400,
  workerHeartbeatMs: 200,
  workerStaleMs: 1000,
  watchdogIntervalMs: 200,
  recoveryIntervalMs: 1000,
  retryLimit: 5,
  retryDelayS: 1,
  retryDelayMaxS: 2,
  pollIntervalMs: 200,
  jobHeartbeatS: 10,
};

export const QUEUE = queuesOf(DEFAULTS);

/** The full configuration the harness's own pg-boss uses to create the queues (same policy as the daemons). */
function queueConfig(t: ChaosTimings): Config {
  return loadConfig(
    {
      retryLimit: t.retryLimit,
      retryDelaySeconds: t.retryDelayS,
      retryDelayMaxSeconds: t.retryDelayMaxS,
      ...(t.jobExpireS ? { jobExpireSeconds: t.jobExpireS } : {}),
      ...(t.jobHeartbeatS ? { jobHeartbeatSeconds: t.jobHeartbeatS } : {}),
    },
    {},
  );
}

export function childEnv(databaseUrl: string, t: ChaosTimings, homeDir: string, logLevel = 'info'): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  // Inherit the basics (PATH, HOME, …) but none of the caller's corral settings.
  for (const [k, v] of Object.entries(process.env)) {
    if (k.startsWith('CORRAL_') || k === 'DATABASE_URL' || k.startsWith('VITEST') || k === 'NODE_OPTIONS') continue;
    env[k] = v;
  }
  Object.assign(env, {
    DATABASE_URL: databaseUrl,
    CORRAL_HOME: homeDir,
    CORRAL_LOG_LEVEL: logLevel,
    CORRAL_LEASE_MS: String(t.leaseMs),
    CORRAL_PROGRESS_INTERVAL_MS: String(t.progressIntervalMs),
    CORRAL_WORKER_HEARTBEAT_MS: String(t.workerHeartbeatMs),
    CORRAL_WORKER_STALE_MS: String(t.workerStaleMs),
    CORRAL_WATCHDOG_INTERVAL_MS: String(t.watchdogIntervalMs),
    CORRAL_RECOVERY_INTERVAL_MS: String(t.recoveryIntervalMs),
    CORRAL_RETRY_LIMIT: String(t.retryLimit),
    CORRAL_RETRY_DELAY_S: String(t.retryDelayS),
    CORRAL_RETRY_DELAY_MAX_S: String(t.retryDelayMaxS),
    CORRAL_POLL_INTERVAL_MS: String(t.pollIntervalMs),
    CORRAL_DEAD_LETTER_MODE: 'continue',
    ...(t.jobExpireS ? { CORRAL_JOB_EXPIRE_S: String(t.jobExpireS) } : {}),
    ...(t.jobHeartbeatS ? { CORRAL_JOB_HEARTBEAT_S: String(t.jobHeartbeatS) } : {}),
  });
  return env;
}

// ---------------------------------------------------------------------------------------------
// small utilities

export const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/** Polls `check` until truthy or the deadline passes (errors count as "not yet"). */
export function waitUntil<T>(
  what: string,
  check: () => Promise<T | undefined | null | false> | T | undefined | null | false,
  timeoutMs: number,
  intervalMs = 100,
): Promise<T> {
  return waitFor(check, { what: `chaos: ${what}`, timeoutMs, intervalMs });
}

/** Deterministic PRNG (mulberry32) so a run can be reproduced from its seed. */
export function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** JSON lines of a pino log file (non-JSON lines, e.g. Node warnings, are returned as `raw`). */
export function readLogLines(path: string): Record<string, unknown>[] {
  if (!existsSync(path)) return [];
  const out: Record<string, unknown>[] = [];
  for (const line of readFileSync(path, 'utf8').split('\n')) {
    if (!line.trim()) continue;
    if (line.startsWith('{')) {
      try {
        out.push(JSON.parse(line) as Record<string, unknown>);
        continue;
      } catch {
        // fall through
      }
    }
    out.push({ raw: line });
  }
  return out;
}

export function tailFile(path: string, lines = 20): string {
  if (!existsSync(path)) return '(no log)';
  return readFileSync(path, 'utf8').split('\n').slice(-lines - 1).join('\n');
}

// ---------------------------------------------------------------------------------------------
// process management

/** Every child this process started, so they can be killed whatever happens. */
const allChildren = new Set<ChildProcess>();
let exitHookInstalled = false;

function installExitHook(): void {
  if (exitHookInstalled) return;
  exitHookInstalled = true;
  process.on('exit', () => {
    for (const p of allChildren) {
      try {
        if (p.pid && p.exitCode === null && p.signalCode === null) process.kill(p.pid, 'SIGKILL');
      } catch {
        // already gone
      }
    }
  });
}

/** SIGKILLs every child the harness started that is still alive (test teardown, interrupts). */
export function killAllChildren(): number {
  let n = 0;
  for (const p of allChildren) {
    try {
      if (p.pid && p.exitCode === null && p.signalCode === null) {
        process.kill(p.pid, 'SIGKILL');
        n++;
      }
    } catch {
      // already gone
    }
  }
  return n;
}

export type ChildKind = 'daemon' | 'worker';

export interface ChildHandle {
  name: string;
  kind: ChildKind;
  proc: ChildProcess;
  pid: number;
  logPath: string;
  endpoint: string;
  args: string[];
  startedAt: number;
  /** Set when the harness killed / stopped it on purpose (its exit is then expected). */
  expectedExit: boolean;
  stopped: boolean;
  exit: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  exited: boolean;
}

export interface UnexpectedExit {
  name: string;
  code: number | null;
  signal: NodeJS.Signals | null;
  logPath: string;
}

export interface WorkerSpec {
  id: string;
  capacity?: number;
  duplicateResults?: boolean;
}

/**
 * One scenario's processes. Tracks every pid it starts; `cleanup()` kills whatever is left
 * (also on failure). Child stdout/stderr go to `<logDir>/<name>.log`.
 */
export class Cluster {
  readonly logDir: string;
  readonly databaseUrl: string;
  readonly timings: ChaosTimings;
  readonly children: ChildHandle[] = [];
  readonly unexpectedExits: UnexpectedExit[] = [];
  readonly notes: string[] = [];
  readonly faults: { at: number; what: string }[] = [];
  private readonly incarnations = new Map<string, number>();

  constructor(opts: { logDir: string; databaseUrl: string; timings: ChaosTimings }) {
    this.logDir = opts.logDir;
    this.databaseUrl = opts.databaseUrl;
    this.timings = opts.timings;
    mkdirSync(this.logDir, { recursive: true });
    installExitHook();
  }

  private spawnChild(name: string, kind: ChildKind, endpoint: string, args: string[]): ChildHandle {
    const n = (this.incarnations.get(name) ?? 0) + 1;
    this.incarnations.set(name, n);
    const logPath = join(this.logDir, `${name}${n > 1 ? `.${n}` : ''}.log`);
    const fd = openSync(logPath, 'a');
    let proc: ChildProcess;
    try {
      // CORRAL_CHAOS_NODE_ARGS: extra node flags for every child (e.g. `--import ./trace.mjs`).
      const nodeArgs = (process.env.CORRAL_CHAOS_NODE_ARGS ?? '').split(/\s+/).filter(Boolean);
      proc = spawn(process.execPath, ['--import', PARENT_WATCH, ...nodeArgs, CORRAL_BIN, ...args], {
        env: childEnv(this.databaseUrl, this.timings, this.logDir),
        stdio: ['ignore', fd, fd],
        cwd: this.logDir,
      });
    } finally {
      closeSync(fd);
    }
    if (!proc.pid) throw new Error(`chaos: could not spawn ${name}`);
    allChildren.add(proc);
    const handle: ChildHandle = {
      name: n > 1 ? `${name}#${n}` : name,
      kind,
      proc,
      pid: proc.pid,
      logPath,
      endpoint,
      args,
      startedAt: Date.now(),
      expectedExit: false,
      stopped: false,
      exited: false,
      exit: new Promise((resolve) => {
        proc.once('exit', (code, signal) => {
          handle.exited = true;
          allChildren.delete(proc);
          if (!handle.expectedExit) {
            this.unexpectedExits.push({ name: handle.name, code, signal, logPath });
            this.markFault(`${handle.name} exited on its own`);
          }
          resolve({ code, signal });
        });
      }),
    };
    this.children.push(handle);
    return handle;
  }

  /** Starts `corral daemon` on `endpoint` (a fresh free port if omitted) and waits until it runs. */
  async startDaemon(name = 'daemon', endpoint?: string, opts: { wait?: boolean } = {}): Promise<ChildHandle> {
    const ep = endpoint ?? `tcp://127.0.0.1:${await freePort()}`;
    const h = this.spawnChild(name, 'daemon', ep, ['daemon', '--endpoint', ep]);
    if (opts.wait ?? true) await this.waitDaemonRunning(h);
    return h;
  }

  async waitDaemonRunning(h: ChildHandle, timeoutMs = 60_000): Promise<void> {
    await this.waitForLog(h, (l) => l.msg === 'corral daemon running', timeoutMs, `${h.name} running`);
  }

  /** Starts `corral worker`; with `daemon`, waits until that daemon logged its registration. */
  async startWorker(spec: WorkerSpec, endpoint: string, daemon?: ChildHandle): Promise<ChildHandle> {
    const args = ['worker', '--id', spec.id, '--endpoint', endpoint, '--capacity', String(spec.capacity ?? 4)];
    if (spec.duplicateResults) args.push('--duplicate-results');
    const h = this.spawnChild(spec.id, 'worker', endpoint, args);
    if (daemon) await this.waitWorkerReady(daemon, spec.id, h.startedAt);
    return h;
  }

  /** Waits for `daemon` to log `worker ready` for `workerId` (after `sinceMs`, epoch ms). */
  async waitWorkerReady(daemon: ChildHandle, workerId: string, sinceMs = 0, timeoutMs = 60_000): Promise<void> {
    await this.waitForLog(
      daemon,
      (l) => l.msg === 'worker ready' && l.workerId === workerId && Number(l.time ?? 0) >= sinceMs - 50,
      timeoutMs,
      `${workerId} registered with ${daemon.name}`,
    );
  }

  async waitForLog(
    h: ChildHandle,
    pred: (line: Record<string, unknown>) => boolean,
    timeoutMs: number,
    what: string,
  ): Promise<Record<string, unknown>> {
    try {
      return await waitUntil(
        what,
        () => {
          if (h.exited) throw new Error(`${h.name} exited`);
          return readLogLines(h.logPath).find(pred);
        },
        timeoutMs,
        100,
      );
    } catch (e) {
      throw new Error(`${(e as Error).message}\n--- ${h.logPath} (tail) ---\n${tailFile(h.logPath)}`);
    }
  }

  kill9(h: ChildHandle): void {
    h.expectedExit = true;
    this.markFault(`kill -9 ${h.name}`);
    if (!h.exited) process.kill(h.pid, 'SIGKILL');
  }

  /** Records when a fault was injected (recovery latencies are measured from the latest one). */
  markFault(what: string): void {
    this.faults.push({ at: Date.now(), what });
  }

  /** SIGSTOP: the process freezes (its sockets stay open, its timers do not fire). */
  pause(h: ChildHandle): void {
    h.stopped = true;
    this.markFault(`SIGSTOP ${h.name}`);
    process.kill(h.pid, 'SIGSTOP');
  }

  resume(h: ChildHandle): void {
    h.stopped = false;
    process.kill(h.pid, 'SIGCONT');
  }

  async kill9AndWait(h: ChildHandle): Promise<void> {
    this.kill9(h);
    await h.exit;
  }

  /** SIGTERM, then SIGKILL after `graceMs`. Notes a process that had to be killed. */
  async terminate(h: ChildHandle, graceMs = 8_000): Promise<void> {
    if (h.exited) return;
    h.expectedExit = true;
    if (h.stopped) this.resume(h);
    try {
      process.kill(h.pid, 'SIGTERM');
    } catch {
      return;
    }
    const timer = sleep(graceMs).then(() => 'timeout' as const);
    const res = await Promise.race([h.exit.then(() => 'exited' as const), timer]);
    if (res === 'timeout' && !h.exited) {
      this.notes.push(`${h.name} did not exit within ${graceMs} ms of SIGTERM: killed`);
      process.kill(h.pid, 'SIGKILL');
      await h.exit;
    }
  }

  /** Graceful stop of everything still running (workers first), then SIGKILL of stragglers. */
  async stopAll(): Promise<void> {
    const alive = this.children.filter((c) => !c.exited);
    await Promise.all(alive.filter((c) => c.kind === 'worker').map((c) => this.terminate(c, 5_000)));
    await Promise.all(alive.filter((c) => c.kind === 'daemon').map((c) => this.terminate(c, 12_000)));
  }

  /** Kills every child still alive, no questions asked (test teardown, failures). */
  async cleanup(): Promise<void> {
    for (const c of this.children) {
      if (c.exited) continue;
      c.expectedExit = true;
      try {
        process.kill(c.pid, 'SIGKILL');
      } catch {
        // gone
      }
    }
    await Promise.all(this.children.map((c) => c.exit));
  }

  daemons(): ChildHandle[] {
    return this.children.filter((c) => c.kind === 'daemon');
  }
}

// ---------------------------------------------------------------------------------------------
// databases

export interface ChaosDatabase {
  url: string;
  name: string;
  /** The schema (corral migrations and pg-boss) is already there, e.g. a test template clone. */
  migrated?: boolean;
  drop(): Promise<void>;
}

/** Where scenarios get their databases (and, if possible, how to restart the server). */
export interface ChaosEnvironment {
  createDatabase(tag: string): Promise<ChaosDatabase>;
  /** Restarts the PostgreSQL server (only for a server this process controls). */
  restartServer?: (downMs: number) => Promise<void>;
  describe: string;
}


/** Databases created on `serverUrl` (an admin connection, e.g. the `postgres` database). */
export function serverEnvironment(serverUrl: string, restartServer?: (downMs: number) => Promise<void>, describe = 'server'): ChaosEnvironment {
  return {
    describe,
    ...(restartServer ? { restartServer } : {}),
    async createDatabase(tag) {
      const name = `corral_chaos_${tag.replace(/[^a-z0-9]/gi, '_').toLowerCase().slice(0, 20)}_${Math.random().toString(16).slice(2, 8)}`;
      return createDatabaseOn(serverUrl, name);
    },
  };
}

// ---------------------------------------------------------------------------------------------
// the event plan

export interface ActorRef {
  agentUid: string;
  sessionId: string;
}

export interface PlannedEvent {
  /** Set when enqueued (UUIDv7 from the event queue). */
  id?: string;
  actor: ActorRef;
  /** Position within its actor (0-based, enqueue order). */
  ordinal: number;
  payload: { text: string; delayMs?: number; fail?: true };
}

export interface PlanOptions {
  events: number;
  actors: number;
  /** How many `{"fail": true}` events (they exhaust their retries and dead-letter). */
  failures: number;
  seed: number;
  /** Range of `delayMs` for slow events. */
  delayMs?: [number, number];
  /** Fraction of events that carry a delay. */
  slowFraction?: number;
}

export function planEvents(o: PlanOptions): PlannedEvent[] {
  const rand = rng(o.seed);
  const [dmin, dmax] = o.delayMs ?? [50, 400];
  const actors: ActorRef[] = Array.from({ length: o.actors }, (_, i) => ({
    agentUid: `chaos-agent-${i % 7}`,
    sessionId: `s${String(i).padStart(3, '0')}`,
  }));
  const failAt = new Set<number>();
  while (failAt.size < Math.min(o.failures, o.events)) failAt.add(Math.floor(rand() * o.events));
  const ordinals = new Map<ActorRef, number>();
  const plan: PlannedEvent[] = [];
  for (let i = 0; i < o.events; i++) {
    // Every actor gets its share; the order across actors is shuffled.
    const actor = i < o.actors ? actors[i]! : actors[Math.floor(rand() * o.actors)]!;
    const ordinal = ordinals.get(actor) ?? 0;
    ordinals.set(actor, ordinal + 1);
    const payload: PlannedEvent['payload'] = { text: `${actor.agentUid}/${actor.sessionId}#${ordinal}` };
    if (rand() < (o.slowFraction ?? 0.45)) payload.delayMs = Math.round(dmin + rand() * (dmax - dmin));
    if (failAt.has(i)) payload.fail = true;
    plan.push({ actor, ordinal, payload });
  }
  return plan;
}

// ---------------------------------------------------------------------------------------------
// the scenario database handle: enqueue, progress, invariants

export interface Progress {
  committed: number;
  deadLettered: number;
  settled: number;
  /** Jobs of the actor queue still created / retry / active. */
  pending: number;
  enqueued: number;
}

export type InvariantId = 'I1' | 'I2' | 'I3' | 'I4' | 'quiescence' | 'process' | 'expectation' | 'harness';

export interface Violation {
  invariant: InvariantId;
  code: string;
  message: string;
  details?: unknown;
  /** The bug this check caught before (see test/chaos/README.md): a regression if it fires again. */
  knownIssue?: string;
}

export interface CheckSummary {
  events: number;
  committed: number;
  deadLettered: number;
  expectedDeadLetters: number;
  turns: number;
  activations: number;
  maxEpoch: number;
  /** Leftovers that are not violations by themselves (reported for inspection). */
  residue: { startedTurns: number; liveDeliveries: number; busyActivations: number; liveActivations: number };
}

export interface CheckResult {
  ok: boolean;
  violations: Violation[];
  summary: CheckSummary;
}

export class ScenarioDb {
  readonly url: string;
  readonly database: Database;
  readonly pool: pg.Pool;
  private boss: PgBoss | undefined;
  private events: EventQueue | undefined;
  readonly plan: PlannedEvent[] = [];

  private constructor(url: string) {
    this.url = url;
    this.database = openDatabase(url, { max: 4, applicationName: 'corral-chaos', onError: () => undefined });
    this.pool = this.database.pool;
  }

  /** Migrates (unless done), creates the queues with the chaos retry policy, opens the producer. */
  static async open(db: ChaosDatabase, timings: ChaosTimings): Promise<ScenarioDb> {
    if (!db.migrated) await migrateDatabase(db.url);
    const s = new ScenarioDb(db.url);
    s.boss = createBoss(db.url, queueConfig(timings), { max: 4, onError: () => undefined });
    await s.boss.start();
    // Jobs copy the retry policy at insert time: the queue must carry the short delays before
    // the first event is enqueued (the daemon would only update it when it starts).
    await ensureQueues(s.boss, queueConfig(timings));
    s.events = createEventQueue(s.boss, QUEUE.events);
    return s;
  }

  async close(): Promise<void> {
    await this.boss?.stop({ graceful: false, close: true }).catch(() => undefined);
    await this.database.close().catch(() => undefined);
  }

  /** Enqueues `events` in one batch (one statement, array order), recording their ids. */
  async enqueue(events: PlannedEvent[]): Promise<void> {
    if (events.length === 0) return;
    const res = await this.events!.enqueueActorEvents(
      this.database.db,
      events.map((e) => ({ key: e.actor, event: e.payload })),
    );
    res.forEach((r, i) => {
      events[i]!.id = r.eventId;
    });
    this.plan.push(...events);
  }

  /** Enqueues `events` in chunks, pausing between them (a producer that keeps running). */
  async produce(events: PlannedEvent[], chunk = 20, pauseMs = 100): Promise<void> {
    for (let i = 0; i < events.length; i += chunk) {
      await this.enqueue(events.slice(i, i + chunk));
      if (i + chunk < events.length) await sleep(pauseMs);
    }
  }

  private ids(): string[] {
    return this.plan.map((e) => e.id!).filter(Boolean);
  }

  async progress(): Promise<Progress> {
    const ids = this.ids();
    const { rows } = await this.pool.query<{ committed: number; dead_lettered: number; settled: number; pending: number }>(
      `with ev as (select unnest($1::uuid[]) as id),
            c as (select distinct event_id as id from corral.turns where status = 'succeeded' and event_id = any($1::uuid[])),
            d as (select distinct source_id as id from pgboss.job where name = $2 and source_id = any($1::uuid[]))
       select (select count(*) from c)::int as committed,
              (select count(*) from d)::int as dead_lettered,
              (select count(*) from ev where id in (select id from c union select id from d))::int as settled,
              (select count(*) from pgboss.job where name = $3 and state in ('created', 'retry', 'active'))::int as pending`,
      [ids, QUEUE.deadLetter, QUEUE.events],
    );
    const r = rows[0]!;
    return { committed: r.committed, deadLettered: r.dead_lettered, settled: r.settled, pending: r.pending, enqueued: ids.length };
  }

  /** Deliveries currently accepted by `workerId` (a worker that is mid-turn). */
  async acceptedBy(workerId: string): Promise<{ deliveryId: string; eventId: string; actorEpoch: number }[]> {
    const { rows } = await this.pool.query<{ delivery_id: string; event_id: string; actor_epoch: string }>(
      `select delivery_id, event_id, actor_epoch from corral.deliveries where worker_id = $1 and state = 'accepted'`,
      [workerId],
    );
    return rows.map((r) => ({ deliveryId: r.delivery_id, eventId: r.event_id, actorEpoch: Number(r.actor_epoch) }));
  }

  /**
   * Deliveries `workerId` accepted whose handler still has at least `minRemainingMs` of its
   * `delayMs` to go (judged from the accept time): the worker is certainly mid-turn on them.
   */
  async busyOn(workerId: string, minRemainingMs: number): Promise<{ deliveryId: string; eventId: string; remainingMs: number }[]> {
    const { rows } = await this.pool.query<{ delivery_id: string; event_id: string; remaining: number }>(
      `select d.delivery_id, d.event_id,
              (coalesce((t.input->>'delayMs')::int, 0) - extract(epoch from (now() - d.updated_at)) * 1000)::int as remaining
         from corral.deliveries d join corral.turns t on t.delivery_id = d.delivery_id
        where d.worker_id = $1 and d.state = 'accepted'`,
      [workerId],
    );
    return rows
      .filter((r) => r.remaining >= minRemainingMs)
      .map((r) => ({ deliveryId: r.delivery_id, eventId: r.event_id, remainingMs: r.remaining }));
  }

  async acceptedCount(): Promise<number> {
    const { rows } = await this.pool.query<{ n: number }>(`select count(*)::int as n from corral.deliveries where state = 'accepted'`);
    return rows[0]!.n;
  }

  async waitProgress(fraction: number, timeoutMs: number, total = this.plan.length): Promise<Progress> {
    return waitUntil(
      `${Math.round(fraction * 100)}% of events settled`,
      async () => {
        const p = await this.progress();
        return p.settled >= Math.ceil(total * fraction) ? p : undefined;
      },
      timeoutMs,
      150,
    );
  }

  /**
   * Waits until every planned event is committed or dead-lettered and the actor queue holds no
   * created/retry/active job. Returns the last progress and whether it got there.
   */
  async waitQuiescent(total: number, timeoutMs: number): Promise<{ ok: boolean; progress: Progress | undefined; waitedMs: number }> {
    const start = Date.now();
    let last: Progress | undefined;
    while (Date.now() - start < timeoutMs) {
      try {
        last = await this.progress();
        if (last.enqueued >= total && last.settled >= total && last.pending === 0) {
          return { ok: true, progress: last, waitedMs: Date.now() - start };
        }
      } catch {
        // the database may be restarting
      }
      await sleep(250);
    }
    return { ok: false, progress: last, waitedMs: Date.now() - start };
  }

  /** Why events are not settled: their jobs, deliveries, activations (for a stuck run). */
  async diagnoseUnsettled(limit = 10): Promise<unknown[]> {
    const ids = this.ids();
    const { rows } = await this.pool.query<{ id: string }>(
      `select ev.id from unnest($1::uuid[]) as ev(id)
        where not exists (select 1 from corral.turns t where t.event_id = ev.id and t.status = 'succeeded')
          and not exists (select 1 from pgboss.job j where j.name = $2 and j.source_id = ev.id)`,
      [ids, QUEUE.deadLetter],
    );
    const out: unknown[] = [];
    for (const { id } of rows.slice(0, limit)) {
      const job = await this.pool.query(
        `select id, state, retry_count, singleton_key, start_after, started_on, created_on from pgboss.job where name = $1 and id = $2`,
        [QUEUE.events, id],
      );
      const dels = await this.pool.query(
        `select delivery_id, activation_uid, actor_epoch, worker_id, state, state_reason, job_retry_count, created_at, updated_at
           from corral.deliveries where event_id = $1 order by created_at`,
        [id],
      );
      const turns = await this.pool.query(
        `select id, status, attempt, actor_epoch, worker_id, error, started_at, finished_at from corral.turns where event_id = $1 order by started_at`,
        [id],
      );
      const acts = await this.pool.query(
        `select a.activation_uid, a.actor_epoch, a.status, a.end_reason, a.current_event_id, a.owner_id, a.lease_expires_at, a.created_at
           from corral.activations a join pgboss.job j on j.singleton_key = a.agent_uid || '/' || a.session_id
          where j.name = $1 and j.id = $2 order by a.actor_epoch desc limit 3`,
        [QUEUE.events, id],
      );
      const blockers = await this.pool.query(
        `select j2.id, j2.state, j2.retry_count, j2.start_after from pgboss.job j
           join pgboss.job j2 on j2.name = j.name and j2.singleton_key = j.singleton_key and j2.state in ('retry','active','failed')
          where j.name = $1 and j.id = $2`,
        [QUEUE.events, id],
      );
      out.push({ eventId: id, job: job.rows[0] ?? null, blockers: blockers.rows, deliveries: dels.rows, turns: turns.rows, activations: acts.rows });
    }
    return out;
  }

  /** The invariant checks, from the database only (plus the list of enqueued ids/payloads). */
  async checkInvariants(opts: { allowUnexpectedDeadLetters?: boolean } = {}): Promise<CheckResult> {
    return checkInvariants(this.pool, this.plan, opts);
  }
}

// ---------------------------------------------------------------------------------------------
// invariant checks

interface TurnRow {
  id: string;
  event_id: string;
  delivery_id: string;
  conversation_id: string;
  status: string;
  activation_uid: string;
  actor_epoch: string;
  revision: number;
  attempt: number;
  worker_id: string | null;
  started_at: Date;
  finished_at: Date | null;
}
interface MessageRow {
  id: string;
  conversation_id: string;
  turn_id: string;
  seq: number;
  role: string;
  content: unknown;
}
interface DeliveryRow {
  delivery_id: string;
  activation_uid: string;
  agent_uid: string;
  session_id: string;
  actor_epoch: string;
  event_id: string;
  revision: number;
  job_retry_count: number;
  worker_id: string | null;
  state: string;
}
interface ActivationRow {
  activation_uid: string;
  agent_uid: string;
  session_id: string;
  actor_epoch: string;
  status: string;
  current_event_id: string | null;
  created_at: Date;
  ended_at: Date | null;
  end_reason: string | null;
  owner_id: string;
}

const keyOf = (a: { agentUid?: string; sessionId?: string; agent_uid?: string; session_id?: string }) =>
  `${a.agentUid ?? a.agent_uid}/${a.sessionId ?? a.session_id}`;

function groupBy<T, K>(xs: T[], key: (x: T) => K): Map<K, T[]> {
  const m = new Map<K, T[]>();
  for (const x of xs) {
    const k = key(x);
    const list = m.get(k);
    if (list) list.push(x);
    else m.set(k, [x]);
  }
  return m;
}

export async function checkInvariants(
  pool: pg.Pool,
  plan: PlannedEvent[],
  opts: { allowUnexpectedDeadLetters?: boolean } = {},
): Promise<CheckResult> {
  const v: Violation[] = [];
  const add = (invariant: InvariantId, code: string, message: string, details?: unknown) =>
    v.push({ invariant, code, message, ...(details !== undefined ? { details } : {}) });

  const q = async <T extends pg.QueryResultRow>(text: string, params: unknown[] = []) => (await pool.query<T>(text, params)).rows;
  const turns = await q<TurnRow>(
    `select id, event_id, delivery_id, conversation_id, status, activation_uid, actor_epoch, revision, attempt, worker_id, started_at, finished_at from corral.turns`,
  );
  const messages = await q<MessageRow>(`select id, conversation_id, turn_id, seq, role, content from corral.messages`);
  const deliveries = await q<DeliveryRow>(
    `select delivery_id, activation_uid, agent_uid, session_id, actor_epoch, event_id, revision, job_retry_count, worker_id, state from corral.deliveries`,
  );
  const activations = await q<ActivationRow>(
    `select activation_uid, agent_uid, session_id, actor_epoch, status, current_event_id, created_at, ended_at, end_reason, owner_id from corral.activations`,
  );
  const conversations = await q<{ id: string; agent_uid: string; session_id: string; next_seq: number }>(
    `select id, agent_uid, session_id, next_seq from corral.conversations`,
  );
  const actorsRows = await q<{ agent_uid: string; session_id: string; epoch_counter: string }>(
    `select agent_uid, session_id, epoch_counter from corral.actors`,
  );
  const jobs = await q<{ id: string; state: string; retry_count: number; singleton_key: string | null }>(
    `select id, state, retry_count, singleton_key from pgboss.job where name = $1`,
    [QUEUE.events],
  );
  const dlq = await q<{ id: string; source_id: string | null; data: { payload?: unknown; agentUid?: string; sessionId?: string } | null; singleton_key: string | null }>(
    `select id, source_id, data, singleton_key from pgboss.job where name = $1`,
    [QUEUE.deadLetter],
  );
  const indexes = await q<{ indexname: string; indexdef: string }>(
    `select indexname, indexdef from pg_indexes where schemaname = 'corral' and indexname in ('activations_one_live', 'turns_one_success_per_event', 'deliveries_one_live_per_event')`,
  );

  const planned = plan.filter((e) => e.id);
  if (planned.length !== plan.length) add('harness', 'unenqueued', `${plan.length - planned.length} planned events have no id`);
  const plannedById = new Map(planned.map((e) => [e.id!, e]));
  const turnsByEvent = groupBy(turns, (t) => t.event_id);
  const messagesByTurn = groupBy(messages, (m) => m.turn_id);
  const deliveryById = new Map(deliveries.map((d) => [d.delivery_id, d]));
  const activationById = new Map(activations.map((a) => [a.activation_uid, a]));
  const conversationById = new Map(conversations.map((c) => [c.id, c]));
  const jobById = new Map(jobs.map((j) => [j.id, j]));
  const dlqBySource = groupBy(dlq.filter((d) => d.source_id), (d) => d.source_id!);
  const succeededByEvent = new Map<string, TurnRow>();

  // ---- I1: exactly once, or dead-lettered ---------------------------------------------------
  let committed = 0;
  let deadLettered = 0;
  const expectedDeadLetters = planned.filter((e) => e.payload.fail).length;
  for (const e of planned) {
    const id = e.id!;
    const ts = turnsByEvent.get(id) ?? [];
    const ok = ts.filter((t) => t.status === 'succeeded');
    const dl = dlqBySource.get(id) ?? [];
    const where = `event ${id} (${keyOf(e.actor)}#${e.ordinal}${e.payload.fail ? ', fail' : ''})`;
    if (ok.length === 0 && dl.length === 0) {
      add('I1', 'lost', `${where} is neither committed nor dead-lettered`, { job: jobById.get(id) ?? null });
      continue;
    }
    if (ok.length > 1) add('I1', 'duplicate_commit', `${where} has ${ok.length} succeeded turns`, ok.map((t) => t.id));
    if (dl.length > 1) add('I1', 'duplicate_dead_letter', `${where} was dead-lettered ${dl.length} times`);
    if (ok.length > 0 && dl.length > 0) add('I1', 'committed_and_dead_lettered', `${where} is both committed and dead-lettered`);
    if (ok.length > 0) {
      committed++;
      const t = ok[0]!;
      succeededByEvent.set(id, t);
      if (e.payload.fail) add('I1', 'fail_event_committed', `${where} committed although its worker always fails it`);
      const msgs = (messagesByTurn.get(t.id) ?? []).sort((a, b) => a.seq - b.seq);
      const wantReply = `echo: ${e.payload.text}`;
      const good =
        msgs.length === 2 &&
        msgs[0]!.role === 'user' &&
        isDeepStrictEqual(msgs[0]!.content, e.payload) &&
        msgs[1]!.role === 'assistant' &&
        (msgs[1]!.content as { text?: unknown } | null)?.text === wantReply &&
        msgs[1]!.seq === msgs[0]!.seq + 1;
      if (!good) {
        add('I1', 'bad_messages', `${where}: its succeeded turn ${t.id} does not carry exactly [user payload, assistant echo]`, {
          messages: msgs.map((m) => ({ seq: m.seq, role: m.role, content: m.content })),
        });
      }
      const job = jobById.get(id);
      const d = deliveryById.get(t.delivery_id);
      if (!job) add('I1', 'job_missing', `${where} committed but its job is gone from ${QUEUE.events}`);
      else if (job.state !== 'completed') add('I1', 'job_not_completed', `${where} committed but its job is ${job.state}`, job);
      else if (d && job.retry_count !== d.job_retry_count) {
        add('I1', 'job_attempt_mismatch', `${where} committed under job attempt ${d.job_retry_count} but the job completed at retry_count ${job.retry_count}`);
      }
    }
    if (dl.length > 0) {
      deadLettered++;
      const copy = dl[0]!;
      if (!isDeepStrictEqual(copy.data?.payload, e.payload)) add('I1', 'dead_letter_payload', `${where}: its dead letter carries another payload`, copy.data);
      if (!e.payload.fail && !opts.allowUnexpectedDeadLetters) {
        const attempts = ts.map((t) => ({ attempt: t.attempt, status: t.status, epoch: Number(t.actor_epoch), worker: t.worker_id }));
        add('I1', 'unexpected_dead_letter', `${where} exhausted its retries although its worker never fails it`, { attempts });
      }
      const original = jobById.get(id);
      if (original && ['created', 'retry', 'active'].includes(original.state)) {
        add('I1', 'dead_letter_original_live', `${where} is dead-lettered but its original job is still ${original.state}`);
      }
    }
  }
  for (const j of jobs) {
    if (!plannedById.has(j.id)) add('I1', 'unknown_event', `job ${j.id} in ${QUEUE.events} was never enqueued by the harness`, j);
  }
  for (const d of dlq) {
    if (!d.source_id || !plannedById.has(d.source_id)) add('I1', 'unknown_dead_letter', `dead letter ${d.id} names no planned event`, d);
  }

  // ---- I2: per-actor enqueue order ----------------------------------------------------------
  const convByActor = new Map(conversations.map((c) => [keyOf(c), c]));
  const plannedByActor = groupBy(planned, (e) => keyOf(e.actor));
  const messagesByConv = groupBy(messages, (m) => m.conversation_id);
  for (const [actor, events] of plannedByActor) {
    const inPlanOrder = [...events].sort((a, b) => a.ordinal - b.ordinal);
    const byId = [...events].sort((a, b) => (a.id! < b.id! ? -1 : a.id! > b.id! ? 1 : 0));
    if (inPlanOrder.some((e, i) => e !== byId[i])) add('harness', 'ids_not_monotonic', `${actor}: UUIDv7 ids do not follow enqueue order`);
    const expected = byId.filter((e) => succeededByEvent.has(e.id!)).map((e) => e.id!);
    const conv = convByActor.get(actor);
    const convMsgs = conv ? (messagesByConv.get(conv.id) ?? []).sort((a, b) => a.seq - b.seq) : [];
    const actual: string[] = [];
    const turnById = new Map(turns.map((t) => [t.id, t]));
    for (const m of convMsgs) {
      const t = turnById.get(m.turn_id);
      const ev = t?.event_id ?? `?turn:${m.turn_id}`;
      if (actual.at(-1) !== ev) actual.push(ev);
    }
    if (!isDeepStrictEqual(actual, expected)) {
      const i = actual.findIndex((id, k) => id !== expected[k]);
      const at = i < 0 ? Math.min(actual.length, expected.length) : i;
      const label = (id: string | undefined) => {
        if (id === undefined) return '(end)';
        const p = plannedById.get(id);
        return p ? `#${p.ordinal}` : id;
      };
      add('I2', 'order', `${actor}: transcript order differs from enqueue order at position ${at}: got ${label(actual[at])}, expected ${label(expected[at])}`, {
        actual: actual.map(label),
        expected: expected.map(label),
      });
    }
    if (convMsgs.some((m, i) => m.seq !== i + 1)) {
      add('I2', 'seq_gap', `${actor}: message seqs are not 1..${convMsgs.length}`, convMsgs.map((m) => m.seq));
    }
    if (conv && conv.next_seq !== convMsgs.length + 1) {
      add('I2', 'next_seq', `${actor}: conversation next_seq ${conv.next_seq} but ${convMsgs.length} messages`);
    }
  }

  // ---- I3: no write under a stale fence -----------------------------------------------------
  for (const t of turns) {
    const msgs = messagesByTurn.get(t.id) ?? [];
    if (t.status !== 'succeeded') {
      if (msgs.length > 0) add('I3', 'messages_on_unsucceeded_turn', `turn ${t.id} (${t.status}) of event ${t.event_id} has ${msgs.length} messages`);
      continue;
    }
    const d = deliveryById.get(t.delivery_id);
    const a = activationById.get(t.activation_uid);
    const conv = conversationById.get(t.conversation_id);
    const where = `succeeded turn ${t.id} of event ${t.event_id}`;
    if (!d) {
      add('I3', 'no_delivery', `${where} has no delivery row ${t.delivery_id}`);
      continue;
    }
    const mism: string[] = [];
    if (d.state !== 'completed') mism.push(`delivery state ${d.state}`);
    if (d.event_id !== t.event_id) mism.push('event');
    if (d.activation_uid !== t.activation_uid) mism.push('activation');
    if (Number(d.actor_epoch) !== Number(t.actor_epoch)) mism.push(`epoch ${t.actor_epoch} vs delivery ${d.actor_epoch}`);
    if (d.revision !== t.revision) mism.push(`revision ${t.revision} vs delivery ${d.revision}`);
    if (d.job_retry_count + 1 !== t.attempt) mism.push(`attempt ${t.attempt} vs delivery job_retry_count ${d.job_retry_count}`);
    if (!a) mism.push('activation row missing');
    else {
      if (Number(a.actor_epoch) !== Number(t.actor_epoch)) mism.push(`epoch ${t.actor_epoch} vs activation ${a.actor_epoch}`);
      if (conv && keyOf(a) !== keyOf(conv)) mism.push('activation of another actor');
    }
    if (conv && keyOf(d) !== keyOf(conv)) mism.push('delivery of another actor');
    if (mism.length > 0) add('I3', 'fence_mismatch', `${where} does not match its fence: ${mism.join(', ')}`);
    const others = (turnsByEvent.get(t.event_id) ?? []).filter((o) => o.id !== t.id);
    const later = others.filter((o) => o.attempt > t.attempt);
    if (later.length > 0) {
      add('I3', 'attempt_after_commit', `${where} committed at attempt ${t.attempt} but attempt(s) ${later.map((o) => o.attempt).join(', ')} exist`);
    }
    const newer = others.filter((o) => Number(o.actor_epoch) > Number(t.actor_epoch));
    if (newer.length > 0) {
      add('I3', 'commit_under_older_epoch', `${where} committed under epoch ${t.actor_epoch} but the event also ran under epoch(s) ${newer.map((o) => o.actor_epoch).join(', ')}`, {
        committed: { attempt: t.attempt, epoch: t.actor_epoch, worker: t.worker_id, finishedAt: t.finished_at },
        others: newer.map((o) => ({ attempt: o.attempt, epoch: o.actor_epoch, status: o.status, worker: o.worker_id, startedAt: o.started_at })),
      });
    }
  }
  for (const d of deliveries) {
    if (d.state !== 'completed') continue;
    const t = turns.find((x) => x.delivery_id === d.delivery_id);
    if (!t || t.status !== 'succeeded') add('I3', 'completed_delivery_without_commit', `delivery ${d.delivery_id} is completed but its turn is ${t?.status ?? 'missing'}`);
  }

  // ---- I4: one live activation per actor; epochs unique and increasing ---------------------
  const idx = new Map(indexes.map((i) => [i.indexname, i.indexdef]));
  for (const name of ['activations_one_live', 'turns_one_success_per_event', 'deliveries_one_live_per_event']) {
    if (!idx.has(name)) add('I4', 'missing_index', `unique index corral.${name} is missing`);
  }
  const counters = new Map(actorsRows.map((r) => [keyOf(r), Number(r.epoch_counter)]));
  let maxEpoch = 0;
  for (const [actor, acts] of groupBy(activations, (a) => keyOf(a))) {
    const epochs = acts.map((a) => Number(a.actor_epoch));
    maxEpoch = Math.max(maxEpoch, ...epochs);
    const dup = epochs.filter((e, i) => epochs.indexOf(e) !== i);
    if (dup.length > 0) add('I4', 'duplicate_epoch', `${actor}: epoch(s) ${[...new Set(dup)].join(', ')} used by more than one activation`);
    const byTime = [...acts].sort((a, b) => a.created_at.getTime() - b.created_at.getTime() || Number(a.actor_epoch) - Number(b.actor_epoch));
    for (let i = 1; i < byTime.length; i++) {
      const prev = byTime[i - 1]!;
      const cur = byTime[i]!;
      if (prev.created_at.getTime() === cur.created_at.getTime()) {
        add('I4', 'activations_same_instant', `${actor}: activations of epochs ${prev.actor_epoch} and ${cur.actor_epoch} were created at the same instant`);
      } else if (Number(cur.actor_epoch) <= Number(prev.actor_epoch)) {
        add('I4', 'epoch_not_increasing', `${actor}: activation created at ${cur.created_at.toISOString()} has epoch ${cur.actor_epoch} <= ${prev.actor_epoch} of an earlier one`);
      }
    }
    const live = acts.filter((a) => ['starting', 'active', 'draining'].includes(a.status));
    if (live.length > 1) add('I4', 'two_live', `${actor}: ${live.length} live activations`, live.map((a) => a.activation_uid));
    const counter = counters.get(actor);
    if (counter === undefined || counter < Math.max(...epochs)) add('I4', 'epoch_counter_behind', `${actor}: durable epoch counter ${counter} < max epoch ${Math.max(...epochs)}`);
  }
  for (const [eventId, dels] of groupBy(deliveries, (d) => d.event_id)) {
    const live = dels.filter((d) => ['created', 'sent', 'accepted'].includes(d.state));
    if (live.length > 1) add('I4', 'two_live_deliveries', `event ${eventId}: ${live.length} live deliveries`);
  }

  const residue = {
    startedTurns: turns.filter((t) => t.status === 'started').length,
    liveDeliveries: deliveries.filter((d) => ['created', 'sent', 'accepted'].includes(d.state)).length,
    busyActivations: activations.filter((a) => ['starting', 'active', 'draining'].includes(a.status) && a.current_event_id !== null).length,
    liveActivations: activations.filter((a) => ['starting', 'active', 'draining'].includes(a.status)).length,
  };
  return {
    ok: v.length === 0,
    violations: v,
    summary: {
      events: planned.length,
      committed,
      deadLettered,
      expectedDeadLetters,
      turns: turns.length,
      activations: activations.length,
      maxEpoch,
      residue,
    },
  };
}

/**
 * Recovery latency of orphaned job attempts: an attempt pg-boss handed out (the job was fetched)
 * that never got a delivery row, because its daemon died (or its begin transaction failed)
 * before T2 committed. Nothing else fails such an attempt but pg-boss's job heartbeat, so its
 * actor is held until then. The next attempt of the event should start within
 * CORRAL_JOB_HEARTBEAT_S + the retry delay (+ a margin for a loaded machine) of the fault.
 * Caught B2: pg-boss checked heartbeats only in its supervise pass (every 60 s by default), so
 * the actor stalled for up to heartbeat + 60 s (fixed in f0e170d: supervise every third of it).
 */
export async function checkOrphanRecovery(
  pool: pg.Pool,
  faults: { at: number; what: string }[],
  t: ChaosTimings,
  marginMs = 15_000,
): Promise<Violation[]> {
  const { rows } = await pool.query<{ event_id: string; rc: number; first_at: Date }>(
    `with d as (select event_id, job_retry_count as rc, min(created_at) as first_at from corral.deliveries group by 1, 2)
     select d2.event_id, d2.rc, d2.first_at from d d2
      where d2.rc > 0 and not exists (select 1 from d d1 where d1.event_id = d2.event_id and d1.rc = d2.rc - 1)
      order by d2.first_at`,
  );
  const boundMs = (t.jobHeartbeatS ?? 30) * 1000 + t.retryDelayMaxS * 1000 + marginMs;
  const slow: { eventId: string; orphanedAttempt: number; fault: string; recoveredAfterMs: number }[] = [];
  for (const r of rows) {
    const at = r.first_at.getTime();
    const fault = [...faults].reverse().find((f) => f.at <= at);
    if (!fault) continue;
    const latency = at - fault.at;
    if (latency > boundMs) slow.push({ eventId: r.event_id, orphanedAttempt: r.rc, fault: fault.what, recoveredAfterMs: latency });
  }
  if (slow.length === 0) return [];
  const worst = Math.max(...slow.map((x) => x.recoveredAfterMs));
  return [
    {
      invariant: 'expectation',
      code: 'slow_orphan_recovery',
      knownIssue: 'B2',
      message:
        `${slow.length} job attempt(s) fetched but never begun (no delivery row) held their actor for up to ${(worst / 1000).toFixed(1)} s ` +
        `after the fault; expected <= ${(boundMs / 1000).toFixed(0)} s (CORRAL_JOB_HEARTBEAT_S ${t.jobHeartbeatS ?? 30} + retry delay + margin)`,
      details: slow.slice(0, 10),
    },
  ];
}

// ---------------------------------------------------------------------------------------------
// log statistics

export interface LogStats {
  committed: number;
  duplicates: number;
  rejected: Record<string, number>;
  rejectedTotal: number;
  deadLettered: number;
  errors: number;
  /** Error lines whose error is a lost database connection (known issue B3 when not retried). */
  connectionErrors: number;
  errorSamples: string[];
}

const CONNECTION_TEXT = /terminating connection|Connection terminated|connection error|ECONNREFUSED|ECONNRESET|database system is (starting up|shutting down)/i;

/** What the daemons said: commits, duplicate results, fence rejections, error lines. */
export function daemonLogStats(paths: string[]): LogStats {
  const s: LogStats = { committed: 0, duplicates: 0, rejected: {}, rejectedTotal: 0, deadLettered: 0, errors: 0, connectionErrors: 0, errorSamples: [] };
  for (const p of paths) {
    for (const l of readLogLines(p)) {
      const msg = String(l.msg ?? '');
      if (msg === 'turn committed') s.committed++;
      else if (msg.startsWith('duplicate result')) s.duplicates++;
      else if (msg === 'fence rejected') {
        const r = String(l.reason);
        s.rejected[r] = (s.rejected[r] ?? 0) + 1;
        s.rejectedTotal++;
      } else if (msg.startsWith('event dead-lettered')) s.deadLettered++;
      if (typeof l.level === 'number' && l.level >= 50) {
        s.errors++;
        const err = l.err as { message?: string } | string | undefined;
        const text = `${msg}${err ? `: ${typeof err === 'string' ? err : err.message}` : ''}`;
        if (CONNECTION_TEXT.test(text)) s.connectionErrors++;
        if (s.errorSamples.length < 5) s.errorSamples.push(`${p.split('/').pop()}: ${text.replace(/\s+/g, ' ')}`);
      }
    }
  }
  return s;
}

/** Fence rejections answered to `workerId` (from the daemon logs). */
export function rejectionsFor(paths: string[], workerId: string): { op: string; reason: string; eventId: string }[] {
  const out: { op: string; reason: string; eventId: string }[] = [];
  for (const p of paths) {
    for (const l of readLogLines(p)) {
      if (l.msg === 'fence rejected' && l.workerId === workerId) out.push({ op: String(l.op), reason: String(l.reason), eventId: String(l.eventId) });
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// running a scenario

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
  plan?: Pick<Partial<PlanOptions>, 'delayMs' | 'slowFraction'>;
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
  /** Wait after quiescence before stopping (late results, stale writes). */
  settleMs?: number;
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
  const cluster = new Cluster({ logDir, databaseUrl: database.url, timings });
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
      result.violations.push({ invariant: 'harness', code: 'producer_error', message: `enqueueing failed: ${(producerError as Error).stack ?? String(producerError)}` });
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
      await sleep(o.settleMs ?? 1_500);
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
    result.violations.push(...(await checkOrphanRecovery(db.pool, cluster.faults, timings)));
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
        ...(/Unhandled 'error' event/.test(tail) && /57P0|terminating connection|Connection terminated/.test(tail) ? { knownIssue: 'B1' } : {}),
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
  const lines = [`scenario ${r.scenario} (${r.title}): ${r.violations.length} violation(s); seed ${r.seed}; logs in ${r.logDir}; database ${r.database ?? '-'}`];
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
