/**
 * The corral phase of the end-to-end bench: a started Daemon (real pg-boss, real ZeroMQ on
 * tcp://127.0.0.1:0) with W in-process example workers, driven in rounds, plus the wake-latency
 * phase. Commits are timed by the runtime's commit hook, with the database as the authority.
 */
import type { TurnTracer } from '../../src/base/turn-tracer.ts';
import { randomBytes } from 'node:crypto';
import { performance } from 'node:perf_hooks';
import { actorKey, type ActorKey } from '../../src/base/actor-key.ts';
import { loadConfig } from '../../src/config.ts';
import { Daemon } from '../../src/daemon/daemon.ts';
import { openDatabase, type Database } from '../../src/db/client.ts';
import { addWorkerKey, ensureLocalWorkerKey, workerCredentials } from '../../src/fabric/keys.ts';
import { silentLogger } from '../../src/base/logger.ts';
import { noopMetrics, type RuntimeMetrics } from '../../src/runtime/metrics.ts';
import { runExampleWorker } from '../../src/worker/example.ts';
import type { Worker } from '../../src/worker/sdk.ts';
import { sampleActivity, type ActivitySummary } from './activity.ts';
import { Cleanup, PhaseTimeout, progress, sleep, summarise, until, type Percentiles } from './common.ts';
import { withCpu, type ServerCpu } from './database.ts';
import type { Options } from './e2e-options.ts';
import { processCpuMs } from './daemon-process.ts';
import { safeKill, spawnCorral, type Proc } from '../../test/helpers/processes.ts';
import { sendEventsInBatches } from '../../src/db/enqueue/send.ts';

export interface RoundResult {
  events: number;
  enqueueMs: number;
  totalMs: number;
  turnsPerSec: number;
}

export interface CorralResult {
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
  /** CPU time of this process (user + system) and of the worker processes per committed turn. */
  processCpuMsPerTurn: number;
  /** The worker processes' share of `processCpuMsPerTurn` (0 with in-process workers). */
  workerCpuMsPerTurn: number;
  /** Worker slots taken (fetched jobs, begun or not, until they settle), averaged over the rounds. */
  meanInFlight: number;
  /** The rounds' turn_start contexts: taken from the daemon's cache, or read by the database. */
  contexts: { cached: number; read: number };
  /** The rounds' turns begun in the commit of their actor's previous turn (no fetch, no begin transaction). */
  continued: number;
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

export interface WakeResult {
  /** enqueue call → commit transaction returned, client clock, one event at a time. */
  latencyMs: Percentiles;
  /** The same events by stage, database clock (see CorralResult.stagesMs). */
  stagesMs: CorralResult['stagesMs'];
}

/** Counts commits through the runtime's metric hook and wakes waiters. */
export class CommitCounter {
  count = 0;
  lastAt = 0;
  /** Turns begun in their predecessor's commit. */
  continued = 0;
  private waiters: { target: number; resolve: () => void }[] = [];
  /** The daemon's metric hooks: every hook a no-op except `committed` and `continued`. */
  readonly metrics: RuntimeMetrics = { ...noopMetrics, committed: () => this.committed(), continued: () => void this.continued++ };
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

export async function succeededCount(db: Database, ids: string[]): Promise<number> {
  const res = await db.pool.query<{ n: number }>(
    `select count(*)::int as n from corral.turns where status = 'succeeded' and event_id = any($1::uuid[])`,
    [ids],
  );
  return res.rows[0]!.n;
}

/** Enqueues `events` and waits (commit hook, with the database as the authority) until all committed. */
export async function pushAndWait(
  client: Database,
  daemon: Daemon,
  counter: CommitCounter,
  events: { key: ActorKey; event: unknown }[],
  deadline: number,
  what: string,
): Promise<{ ids: string[]; t0: number; tEnq: number; tDone: number }> {
  const before = counter.count;
  const t0 = performance.now();
  const enq = await sendEventsInBatches(
    client.db,
    events.map((e) => ({ agentUid: e.key.agentUid, sessionId: e.key.sessionId, data: e.event })),
  );
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
export async function corralLatencies(
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

export class CorralSession {
  readonly counter = new CommitCounter();
  readonly keys: ActorKey[];
  private readonly cleanup = new Cleanup();
  private daemon!: Daemon;
  private client!: Database;
  private bossSchema = 'pgboss';
  private queueName = '';
  private next = 0;
  private readonly ids: string[] = [];
  private readonly rounds: RoundResult[] = [];
  private busyMs = 0;
  private elu: ReturnType<typeof performance.eventLoopUtilization> | undefined;
  private cpuMs = 0;
  private workerMs = 0;
  private occupied = 0;
  private occupancySamples = 0;
  private readonly contexts = { cached: 0, read: 0 };
  private continued = 0;
  private readonly workerProcs: Proc[] = [];
  private serverMs: number | undefined = 0;
  private sampler: { on: boolean; stop(): Promise<ActivitySummary> } | undefined;

  private readonly dbUrl: string;
  private readonly home: string;
  private readonly opts: Options;
  private readonly serverCpu: ServerCpu;

  /** CURVE on the fabric (the default deployment) or off (`--insecure`), to measure its cost. */
  private readonly curve: boolean;
  /** Tracing (bench/tracing.ts): the daemon's tracer, and the OTEL_* variables of the worker processes. */
  private readonly tracing: { tracer: TurnTracer; workerEnv: Record<string, string> } | undefined;

  constructor(
    dbUrl: string,
    home: string,
    opts: Options,
    serverCpu: ServerCpu,
    curve = true,
    tracing?: { tracer: TurnTracer; workerEnv: Record<string, string> },
  ) {
    this.curve = curve;
    this.tracing = tracing;
    this.serverCpu = serverCpu;
    this.dbUrl = dbUrl;
    this.home = home;
    this.opts = opts;
    // Each session has actors of its own, as a daemon running its queue alone does: a daemon keeps
    // the contexts of the conversations it ran, and an actor whose turns alternate between two
    // daemons has its context read again at each switch (see docs/benchmarks.md).
    this.keys = Array.from({ length: opts.actors }, (_, i) => actorKey(curve ? 'bench' : 'bench-plain', `s${i}`));
  }

  /** `corral worker` as an OS process (the default), stopped with the session. */
  private spawnWorker(workerId: string, endpoint: string, capacity: number, keyFile: string | undefined): Proc {
    const args = ['worker', '--id', workerId, '--endpoint', endpoint, '--capacity', String(capacity)];
    args.push(...(keyFile ? ['--key-file', keyFile] : ['--insecure']));
    const proc = spawnCorral(args, { CORRAL_HOME: this.home, CORRAL_LOG_LEVEL: 'warn', ...this.tracing?.workerEnv }, workerId);
    const pid = proc.child.pid;
    this.cleanup.defer(`stop worker ${workerId}`, async () => {
      if (pid === undefined) return;
      safeKill(pid, 'SIGTERM');
      await Promise.race([proc.exited, sleep(5_000)]);
      safeKill(pid, 'SIGKILL');
    });
    return proc;
  }

  /** CPU of the worker processes so far (when they run as processes), ms. */
  private async workerCpuMs(): Promise<number> {
    let ms = 0;
    for (const p of this.workerProcs) if (p.child.pid !== undefined) ms += await processCpuMs(p.child.pid);
    return ms;
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
        ...(this.opts.contextMessages === undefined ? {} : { contextMessages: this.opts.contextMessages }),
        ...(this.opts.contextCacheBytes === undefined ? {} : { contextCacheBytes: this.opts.contextCacheBytes }),
      },
      {},
    );
    this.queueName = config.queueName;
    this.bossSchema = config.bossSchema;
    const daemon = (this.daemon = new Daemon({
      config,
      databaseUrl: this.dbUrl,
      logger: silentLogger,
      skipMigrations: true,
      metrics: this.counter.metrics,
      ...(this.tracing ? { tracer: this.tracing.tracer } : {}),
      ...(this.opts.continueTurns ? {} : { continueTurns: false }),
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
      if (this.opts.processWorkers) {
        this.workerProcs.push(
          this.spawnWorker(
            workerId,
            daemon.broker.endpoint,
            capacity,
            security ? ensureLocalWorkerKey(security.paths, workerId) : undefined,
          ),
        );
        continue;
      }
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
    const ids = Array.from({ length: w }, (_, i) => `bench-w${i}`);
    // registered (their windows open with the warm-up below: each takes a few turns until it has taken some)
    await until(() => ids.every((id) => daemon.runtime.workers.isReady(id)), performance.now() + 15_000, `${w} workers registered`);
    progress(`${w} workers × ${capacity} slots registered at ${daemon.broker.endpoint} (CURVE ${this.curve ? 'on' : 'off'})`);

    // Warm-up on other actors: JIT, connection pools, socket paths. Not measured.
    const warm = Array.from({ length: Math.min(60, this.opts.events) }, (_, i) => ({
      key: actorKey('warmup', `s${i % 20}`),
      event: { text: `warm ${i}` },
    }));
    await pushAndWait(client, daemon, this.counter, warm, performance.now() + this.opts.phaseTimeoutMs, 'warm-up');
    progress(`warm-up: ${warm.length} turns committed`);
    // The measured actors' history: long-lived sessions, each turn continuing a conversation.
    if (this.opts.history > 0) {
      const history = Array.from({ length: this.opts.history * this.keys.length }, (_, i) => ({
        key: this.keys[i % this.keys.length]!,
        event: { text: `h${i}` },
      }));
      await pushAndWait(client, daemon, this.counter, history, performance.now() + this.opts.phaseTimeoutMs, 'history');
      progress(`history: ${this.opts.history} turns committed per actor`);
    }
    if (this.opts.sampleActivity) {
      const sampler = (this.sampler = sampleActivity(this.dbUrl, daemon.database.pool));
      this.cleanup.defer('stop activity sampler', () => sampler.stop());
    }
  }

  /** Fresh planner statistics of this session's job table (its database's own: see bench/e2e.ts). */
  async analyzeQueue(): Promise<void> {
    await this.client.pool.query(`analyze ${this.bossSchema}.job`);
  }

  /** One measured round: `n` events continuing the round-robin over the actors. */
  async round(n: number, label: string): Promise<RoundResult> {
    const events = Array.from({ length: n }, () => {
      const i = this.next++;
      return { key: this.keys[i % this.keys.length]!, event: { text: `e${i}` } };
    });
    const elu0 = performance.eventLoopUtilization();
    const contexts0 = this.daemon.runtime.contexts.stats;
    const continued0 = this.counter.continued;
    if (this.sampler) this.sampler.on = true;
    const workers0 = await this.workerCpuMs();
    // slot occupancy: worker slots taken in the daemon, sampled every 5 ms of the round
    let occupied = 0;
    let samples = 0;
    const occupancy = setInterval(() => {
      occupied += this.opts.workers * this.opts.capacity - this.daemon.runtime.fetchCapacity();
      samples++;
    }, 5);
    const measured = await withCpu(this.serverCpu, () =>
      pushAndWait(this.client, this.daemon, this.counter, events, performance.now() + this.opts.phaseTimeoutMs, label),
    ).finally(() => {
      clearInterval(occupancy);
      if (this.sampler) this.sampler.on = false;
    });
    this.occupied += occupied;
    this.occupancySamples += samples;
    const workerMs = (await this.workerCpuMs()) - workers0;
    measured.processMs += workerMs;
    this.workerMs += workerMs;
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
    const contexts = this.daemon.runtime.contexts.stats;
    const cached = contexts.hits - contexts0.hits;
    const read = contexts.misses - contexts0.misses;
    this.contexts.cached += cached;
    this.contexts.read += read;
    const continued = this.counter.continued - continued0;
    this.continued += continued;
    progress(
      `${label}: ${n} turns in ${totalMs.toFixed(0)} ms → ${r.turnsPerSec.toFixed(0)} turns/s, ${continued} begun in a commit` +
        (cached + read > 0 ? ` (contexts: ${cached} cached, ${read} read)` : ''),
    );
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
      workerCpuMsPerTurn: this.workerMs / events,
      meanInFlight: this.occupied / Math.max(1, this.occupancySamples),
      contexts: { ...this.contexts },
      continued: this.continued,
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
      const ev = (
        await sendEventsInBatches(this.client.db, [{ agentUid: key.agentUid, sessionId: key.sessionId, data: { text: `wake ${i}` } }])
      )[0]!;
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
    progress(
      `wake latency: p50 ${wake.latencyMs.p50.toFixed(1)} ms, p95 ${wake.latencyMs.p95.toFixed(1)} ms over ${latencies.length} events`,
    );
    return wake;
  }
}
