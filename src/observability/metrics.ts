/**
 * Prometheus metrics (prom-client) for the daemon.
 *
 * Two kinds:
 *  - counters and histograms the runtime drives through its `RuntimeMetrics` hooks (what this
 *    process did: dispatches, commits, retries, dead letters, fence rejections, latencies);
 *  - gauges read from the database at scrape time (the state of the whole installation: queue
 *    depth, dead letters, live activations, workers). One snapshot query set serves every gauge of
 *    a scrape; a scrape while the database is down reports `corral_metrics_database_up 0` and
 *    leaves the database gauges out rather than failing the whole scrape.
 *
 * Names and labels are a public interface (dashboards, alerts): see docs/operations.md.
 */
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';
import type { DbOrTx } from '../db/client.ts';
import type { WorkerStatus } from '../db/schema.ts';
import { toError } from '../base/errors.ts';
import type { RuntimeMetrics } from '../runtime/metrics.ts';
import type { BrokerStats } from '../fabric/broker-types.ts';
import type { ContextCacheStats } from '../runtime/context-cache.ts';
import { queueDepth, type QueueDepth } from '../db/boss/jobs.ts';
import { blockedActorCount, liveActivationCount, workerCounts } from '../db/operations/status-counts.ts';
import type { Queues } from '../db/boss/jobs.ts';
import { outboxBacklog, type OutboxBacklog } from '../db/outbox/messages.ts';

/** The daemon's metrics: every hook of `RuntimeMetrics`, the latency histograms included. */
export type CorralRuntimeMetrics = Required<RuntimeMetrics>;

/** What the scrape-time gauges show, read from the database. */
export interface MetricsSnapshot {
  queue: QueueDepth;
  liveActivations: number;
  blockedActors: number;
  workers: Record<WorkerStatus, number>;
  oldestWaitingSeconds: number | null;
  /** The outbox's messages waiting and dead (src/db/outbox/messages.ts); absent from sources that do not read it. */
  outbox?: OutboxBacklog;
}

export type SnapshotSource = () => Promise<MetricsSnapshot>;

export interface Metrics {
  readonly registry: Registry;
  /** Pass to `new Daemon({ metrics })`. */
  readonly runtime: CorralRuntimeMetrics;
  /** Where the scrape-time gauges read from (the daemon binds its database once it runs). */
  setSource(source: SnapshotSource | undefined): void;
  /** The broker's counters (refusals, oversize frames, takeover attempts), read at scrape time. */
  setBrokerSource(source: (() => BrokerStats) | undefined): void;
  /** The context cache's counters and size (src/runtime/context-cache.ts), read at scrape time. */
  setContextSource(source: (() => ContextCacheStats) | undefined): void;
}

export const METRIC_PREFIX = 'corral_';

const LATENCY_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600];

export interface CreateMetricsOptions {
  /** Process metrics (CPU, memory, event loop lag, GC) prefixed `corral_`; default true. */
  defaultMetrics?: boolean;
  /** Longest a scrape waits for the database; default 5000 ms. */
  snapshotTimeoutMs?: number;
  onError?: (err: Error) => void;
}

export function createMetrics(opts: CreateMetricsOptions = {}): Metrics {
  const registry = new Registry();
  const registers = [registry];
  if (opts.defaultMetrics ?? true) collectDefaultMetrics({ register: registry, prefix: METRIC_PREFIX });

  const dispatched = new Counter({
    name: 'corral_events_dispatched_total',
    help: 'Turns sent to a worker (turn_start), including re-dispatches of retried events',
    registers,
  });
  const committed = new Counter({ name: 'corral_turns_committed_total', help: 'Turns committed (fenced commit succeeded)', registers });
  const duplicates = new Counter({
    name: 'corral_turn_results_duplicate_total',
    help: 'Results for turns that had already committed (answered, nothing written)',
    registers,
  });
  const retries = new Counter({
    name: 'corral_event_retries_total',
    help: 'Failed attempts whose event goes back to the queue for another attempt',
    registers,
  });
  const deadLetters = new Counter({
    name: 'corral_events_dead_lettered_total',
    help: 'Events whose last attempt failed and that moved to the dead-letter queue',
    registers,
  });
  const rejections = new Counter({
    name: 'corral_fence_rejections_total',
    help: 'Worker replies refused by the fence, by reason',
    labelNames: ['reason'] as const,
    registers,
  });
  const invalid = new Counter({
    name: 'corral_invalid_messages_total',
    help: 'Malformed or unknown messages received from workers',
    registers,
  });
  const handBacks = new Counter({
    name: 'corral_hand_backs_total',
    help: 'Turns a worker handed back (over_capacity, worker_stopping): dispatched again, the worker waits behind its peers',
    registers,
  });
  const coalesced = new Counter({
    name: 'corral_events_coalesced_total',
    help: "Events committed by another event's turn, as its batch (input policies coalesce and interrupt)",
    registers,
  });
  const interrupted = new Counter({
    name: 'corral_turns_interrupted_total',
    help: 'Running turns interrupted by a newer event (input policy interrupt); their events went to the next turn',
    registers,
  });
  const continued = new Counter({
    name: 'corral_turns_continued_total',
    help: "Turns begun in the commit of their actor's previous turn (a busy actor's next event: no fetch, no begin transaction)",
    registers,
  });
  const streamChunks = new Counter({
    name: 'corral_stream_chunks_total',
    help: 'turn_chunk messages by outcome: relayed to watchers, or dropped (stale delivery, out of order, too large, over the turn or backlog bytes, unstorable, not written)',
    labelNames: ['outcome'] as const,
    registers,
  });
  const rpcRefused = new Counter({
    name: 'corral_rpc_refused_total',
    help: "Worker RPC requests answered busy, by which of the worker's budgets they exceeded (requests at once, requests per second)",
    labelNames: ['budget'] as const,
    registers,
  });
  const outboxDelivered = new Counter({
    name: 'corral_outbox_delivered_total',
    help: 'Outbox messages their sink received (a 2xx answer), by sink',
    labelNames: ['sink'] as const,
    registers,
  });
  const outboxRetried = new Counter({
    name: 'corral_outbox_retries_total',
    help: 'Outbox attempts that failed and will be retried (429, 5xx, a timeout, a connection error), by sink',
    labelNames: ['sink'] as const,
    registers,
  });
  const outboxDead = new Counter({
    name: 'corral_outbox_dead_letters_total',
    help: 'Outbox messages dead-lettered (410, another 4xx, or out of retries), by sink',
    labelNames: ['sink'] as const,
    registers,
  });
  const outboxLatency = new Histogram({
    name: 'corral_outbox_delivery_latency_seconds',
    help: "Time from a turn's commit to its sink receiving the message, by sink",
    labelNames: ['sink'] as const,
    buckets: LATENCY_BUCKETS,
    registers,
  });
  const dispatchLatency = new Histogram({
    name: 'corral_dispatch_latency_seconds',
    help: 'Time from an event being enqueued to its turn being sent to a worker',
    buckets: LATENCY_BUCKETS,
    registers,
  });
  const commitLatency = new Histogram({
    name: 'corral_commit_latency_seconds',
    help: 'Time from a turn being sent to a worker to its fenced commit',
    buckets: LATENCY_BUCKETS,
    registers,
  });

  // ---- scrape-time gauges --------------------------------------------------------------------
  let source: SnapshotSource | undefined;
  // prom-client collects every metric of a scrape concurrently: the gauges share the one read in
  // flight, and the next scrape reads afresh.
  let inFlight: Promise<MetricsSnapshot | undefined> | undefined;
  const timeoutMs = opts.snapshotTimeoutMs ?? 5_000;
  let lastOk: boolean | undefined;

  const snapshot = (): Promise<MetricsSnapshot | undefined> => {
    if (!source) return Promise.resolve(undefined);
    inFlight ??= withTimeout(source(), timeoutMs)
      .then(
        (s) => {
          lastOk = true;
          return s;
        },
        (e: unknown) => {
          lastOk = false;
          opts.onError?.(toError(e));
          return undefined;
        },
      )
      .finally(() => {
        inFlight = undefined;
      });
    return inFlight;
  };

  const gauge = <L extends string>(
    name: string,
    help: string,
    labelNames: readonly L[],
    set: (g: Gauge<L>, s: MetricsSnapshot) => void,
  ): Gauge<L> =>
    new Gauge<L>({
      name,
      help,
      labelNames,
      registers,
      async collect() {
        const s = await snapshot();
        this.reset();
        if (s) set(this, s);
      },
    });

  // Labelled gauges without a snapshot show no samples; unlabelled ones read 0 (prom-client's reset).
  gauge('corral_queue_events', 'Events in the actor queue by state (read from the database)', ['state'] as const, (g, s) => {
    g.set({ state: 'ready' }, s.queue.ready);
    g.set({ state: 'deferred' }, s.queue.deferred);
    g.set({ state: 'retrying' }, s.queue.retrying);
    g.set({ state: 'active' }, s.queue.active);
    g.set({ state: 'failed_held' }, s.queue.failedHeld);
  });
  gauge('corral_dead_letters', 'Dead letters waiting in the dead-letter queue', [], (g, s) => g.set(s.queue.deadLettered));
  gauge('corral_live_activations', 'Live activations (actors with a lease)', [], (g, s) => g.set(s.liveActivations));
  gauge('corral_blocked_actors', 'Actors held by a dead-lettered event (dead-letter mode block)', [], (g, s) => g.set(s.blockedActors));
  gauge('corral_workers', 'Workers known to the database, by status (ready = connected)', ['status'] as const, (g, s) => {
    for (const [status, n] of Object.entries(s.workers)) g.set({ status }, n);
  });
  gauge('corral_oldest_waiting_event_age_seconds', 'Age of the oldest queued event (0 when none waits)', [], (g, s) =>
    g.set(s.oldestWaitingSeconds ?? 0),
  );
  gauge(
    'corral_outbox_messages',
    'Outbox messages waiting to be sent (pending) or given up on (dead), read from the database',
    ['state'] as const,
    (g, s) => {
      if (!s.outbox) return;
      g.set({ state: 'pending' }, s.outbox.pending);
      g.set({ state: 'dead' }, s.outbox.dead);
    },
  );
  gauge('corral_outbox_oldest_pending_age_seconds', 'Age of the oldest outbox message not yet delivered (0 when none waits)', [], (g, s) =>
    g.set(s.outbox?.oldestPendingSeconds ?? 0),
  );
  new Gauge({
    name: 'corral_metrics_database_up',
    help: '1 when this scrape read the database, 0 when it failed (or no database is bound)',
    registers,
    async collect() {
      await snapshot();
      this.set(source && lastOk !== false ? 1 : 0);
    },
  });

  /** A gauge of this process's own state, read at scrape time (0 while no source is bound). */
  const processGauge = (name: string, help: string, read: () => number | undefined) =>
    new Gauge({
      name,
      help,
      registers,
      collect() {
        this.set(read() ?? 0);
      },
    });

  let brokerSource: (() => BrokerStats) | undefined;
  const FABRIC_KINDS = {
    oversize: 'oversize',
    takeover_refused: 'takeoverRefused',
    registration_refused: 'registrationRefused',
    refusal_suppressed: 'refusalsSuppressed',
    connection_refused: 'connectionsRefused',
    key_refused: 'keysRefused',
    key_connection_refused: 'keyConnectionsRefused',
    registration_rate_limited: 'registrationsRateLimited',
    log_suppressed: 'logsSuppressed',
    invalid: 'invalid',
  } as const satisfies Record<string, keyof BrokerStats>;
  new Counter({
    name: 'corral_fabric_refused_total',
    help: 'What the broker refused, by kind: oversize frames, route takeover attempts, refused registrations, refusals not logged (rate limit), connections over the cap, keys not on the allow-list, connections over the per-key limit, registrations over the per-key rate, registration log lines left out, invalid messages',
    labelNames: ['kind'] as const,
    registers,
    collect() {
      const b = brokerSource?.();
      this.reset();
      if (!b) return;
      for (const [kind, field] of Object.entries(FABRIC_KINDS)) this.inc({ kind }, b[field] as number);
    },
  });
  processGauge('corral_fabric_connections', 'Connections to the broker (registered or not)', () => brokerSource?.().connections);

  let contextSource: (() => ContextCacheStats) | undefined;
  new Counter({
    name: 'corral_turn_contexts_total',
    help: "turn_start contexts by where they came from: the daemon's cache (the database only checked it) or the database",
    labelNames: ['source'] as const,
    registers,
    collect() {
      const c = contextSource?.();
      this.reset();
      if (!c) return;
      this.inc({ source: 'cache' }, c.hits);
      this.inc({ source: 'database' }, c.misses);
    },
  });
  processGauge(
    'corral_context_cache_entries',
    'Conversations whose context this daemon keeps between turns',
    () => contextSource?.().entries,
  );
  processGauge(
    'corral_context_cache_bytes',
    'Memory the kept contexts hold (an estimate; bounded by CORRAL_CONTEXT_CACHE_BYTES)',
    () => contextSource?.().bytes,
  );

  const runtime: CorralRuntimeMetrics = {
    dispatched: () => dispatched.inc(),
    committed: () => committed.inc(),
    duplicate: () => duplicates.inc(),
    failed: (deadLettered) => (deadLettered ? deadLetters.inc() : retries.inc()),
    rejected: (reason) => rejections.inc({ reason }),
    invalidMessage: () => invalid.inc(),
    handedBack: () => handBacks.inc(),
    coalesced: (events) => {
      if (events > 0) coalesced.inc(events);
    },
    interrupted: () => interrupted.inc(),
    continued: () => continued.inc(),
    rpcRefused: (budget) => rpcRefused.inc({ budget }),
    streamChunk: (outcome) => streamChunks.inc({ outcome }),
    outboxDelivered: (sink, seconds) => {
      outboxDelivered.inc({ sink });
      if (Number.isFinite(seconds) && seconds >= 0) outboxLatency.observe({ sink }, seconds);
    },
    outboxRetried: (sink) => outboxRetried.inc({ sink }),
    outboxDeadLettered: (sink) => outboxDead.inc({ sink }),
    dispatchLatency: (s) => {
      if (Number.isFinite(s) && s >= 0) dispatchLatency.observe(s);
    },
    commitLatency: (s) => {
      if (Number.isFinite(s) && s >= 0) commitLatency.observe(s);
    },
  };

  return {
    registry,
    runtime,
    setSource(next) {
      source = next;
    },
    setBrokerSource(next) {
      brokerSource = next;
    },
    setContextSource(next) {
      contextSource = next;
    },
  };
}

/** Scrape-time gauges from corral's database. */
export function databaseSource(db: DbOrTx, q: Queues): SnapshotSource {
  return async () => {
    const [queue, liveActivations, blockedActors, workers, outbox] = await Promise.all([
      queueDepth(db, q),
      liveActivationCount(db),
      blockedActorCount(db),
      workerCounts(db),
      outboxBacklog(db),
    ]);
    return {
      queue,
      liveActivations,
      blockedActors,
      workers,
      oldestWaitingSeconds: queue.oldestWaitingSeconds,
      outbox,
    };
  };
}

function withTimeout<T>(p: Promise<T>, ms: number): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`database snapshot timed out after ${ms} ms`)), ms);
  });
  return Promise.race([p, timeout]).finally(() => clearTimeout(timer));
}
