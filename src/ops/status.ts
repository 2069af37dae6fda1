/**
 * The operator's view of a corral installation (`corral status`, `corral actor`, the metrics
 * gauges): read-only, from the database alone, so it works from any host and whether or not a
 * daemon runs.
 */
import { CorralError } from '../base/errors.ts';
import { outboxBacklog, type OutboxBacklog } from '../db/outbox/messages.ts';
import { formatActorKey, type ActorKey } from '../base/actor-key.ts';
import type { DbOrTx } from '../db/client.ts';
import type { WorkerStatus } from '../db/schema.ts';
import { listWorkers } from '../db/operations/workers.ts';
import { listDaemons, type DaemonRow } from '../db/operations/daemons.ts';
import { toDate } from '../db/rows.ts';
import { findDeadLetters, pendingJobsOf, queueDepth, type QueueDepth, type Queues } from '../db/boss/jobs.ts';
import { actorRow, latestActivation, recentTurnsOf } from '../db/operations/actor-views.ts';
import { effectiveInputPolicy } from '../db/enqueue/input-policies.ts';
import { blockedActorCount, liveActivationCount, serverTime } from '../db/operations/status-counts.ts';
import type { ActorStatus } from '../db/views.ts';
import { deliveriesOfTurns } from '../outbox/operations.ts';

export type { ActorStatus } from '../db/views.ts';

/** `running`: heard from within its stale timeout; `stopped`: stopped cleanly; `dead`: silent longer (killed, frozen, cut off). */
export type DaemonState = 'running' | 'stopped' | 'dead';

export interface DaemonView {
  daemonId: string;
  host: string;
  pid: number;
  endpoint: string;
  state: DaemonState;
  alive: boolean;
  startedAt: Date;
  lastSeenAt: Date;
  stoppedAt: Date | null;
  /** Seconds since its last heartbeat, by PostgreSQL's clock. */
  lastSeenAgeSeconds: number;
  staleMs: number;
}

export interface WorkerView {
  workerId: string;
  /**
   * As recorded, except that a `ready` worker silent for longer than the stale timeout is
   * `stale`: the row of a daemon killed with -9 still says `ready`, and nothing else would
   * correct it.
   */
  status: WorkerStatus;
  /** The status its daemon last recorded. */
  recordedStatus: WorkerStatus;
  capacity: number;
  inFlight: number;
  ownerId: string;
  lastHeartbeatAt: Date;
  /** Seconds since the last heartbeat, by PostgreSQL's clock. */
  heartbeatAgeSeconds: number;
}

export interface SystemStatus {
  daemons: DaemonView[];
  queue: QueueDepth & { name: string; deadLetterQueue: string };
  liveActivations: number;
  blockedActors: number;
  workers: WorkerView[];
  /** Seconds the oldest waiting event has waited (null: none waiting). */
  oldestWaitingSeconds: number | null;
  /** Outbox messages waiting and dead. */
  outbox: OutboxBacklog;
  at: Date;
}

/** A daemon's state from its row, at `nowMs` (PostgreSQL's clock). */
export function daemonState(row: Pick<DaemonRow, 'stoppedAt' | 'lastSeenAt' | 'staleMs'>, nowMs: number): DaemonState {
  if (row.stoppedAt) return 'stopped';
  return nowMs - row.lastSeenAt.getTime() > row.staleMs ? 'dead' : 'running';
}

/** A worker's status as `status` shows it: a `ready` one silent for longer than `staleMs` is `stale`. */
export function effectiveWorkerStatus(recorded: WorkerStatus, lastHeartbeatAt: Date, nowMs: number, staleMs: number): WorkerStatus {
  return recorded === 'ready' && nowMs - lastHeartbeatAt.getTime() > staleMs ? 'stale' : recorded;
}

const ageSeconds = (nowMs: number, at: Date) => Math.max(0, (nowMs - at.getTime()) / 1000);

/**
 * Everything `corral status` shows. `defaultStaleMs` judges workers whose daemon left no row
 * (each daemon records its own stale timeout, which judges its workers).
 */
export async function systemStatus(db: DbOrTx, q: Queues, opts: { defaultStaleMs: number }): Promise<SystemStatus> {
  const [depth, live, blocked, rows, daemonRows, now, outbox] = await Promise.all([
    queueDepth(db, q),
    liveActivationCount(db),
    blockedActorCount(db),
    listWorkers(db),
    listDaemons(db),
    serverTime(db),
    outboxBacklog(db),
  ]);
  const nowMs = (toDate(now) ?? new Date()).getTime();
  const staleMsOf = new Map(daemonRows.map((d) => [d.daemonId, d.staleMs]));
  return {
    daemons: daemonRows.map((d) => {
      const state = daemonState(d, nowMs);
      return {
        daemonId: d.daemonId,
        host: d.host,
        pid: d.pid,
        endpoint: d.endpoint,
        state,
        alive: state === 'running',
        startedAt: d.startedAt,
        lastSeenAt: d.lastSeenAt,
        stoppedAt: d.stoppedAt,
        lastSeenAgeSeconds: ageSeconds(nowMs, d.lastSeenAt),
        staleMs: d.staleMs,
      };
    }),
    queue: { ...depth, name: q.events, deadLetterQueue: q.deadLetter },
    liveActivations: live,
    blockedActors: blocked,
    workers: rows.map((w) => ({
      workerId: w.workerId,
      status: effectiveWorkerStatus(w.status, w.lastHeartbeatAt, nowMs, staleMsOf.get(w.ownerId) ?? opts.defaultStaleMs),
      recordedStatus: w.status,
      capacity: w.capacity,
      inFlight: w.inFlight,
      ownerId: w.ownerId,
      lastHeartbeatAt: w.lastHeartbeatAt,
      heartbeatAgeSeconds: ageSeconds(nowMs, w.lastHeartbeatAt),
    })),
    oldestWaitingSeconds: depth.oldestWaitingSeconds,
    outbox,
    at: new Date(nowMs),
  };
}

/** Everything an operator asks about one actor. */
export async function actorStatus(
  db: DbOrTx,
  q: Queues,
  key: ActorKey,
  opts: { turns?: number; pending?: number; deadLetters?: number } = {},
): Promise<ActorStatus> {
  const [row, activation, pending, recent, dead, inputPolicy] = await Promise.all([
    actorRow(db, key),
    latestActivation(db, key),
    pendingJobsOf(db, q.schema, q.events, key, opts.pending ?? 100),
    recentTurnsOf(db, key, opts.turns ?? 10),
    findDeadLetters(db, q, { actor: key }, { limit: opts.deadLetters ?? 100 }),
    effectiveInputPolicy(db, key.agentUid, key.sessionId),
  ]);
  const delivered = await deliveriesOfTurns(
    db,
    recent.map((t) => t.turnId),
  );
  return {
    actor: formatActorKey(key),
    known: row !== undefined || pending.length > 0 || dead.length > 0,
    epochCounter: row?.epochCounter ?? 0,
    blockedByEventId: row?.blockedByEventId ?? null,
    inputPolicy,
    activation: activation ?? null,
    pendingEvents: pending,
    recentTurns: recent.map((t) => ({ ...t, delivered: delivered.get(t.turnId) ?? [] })),
    deadLetters: dead,
  };
}

/** One shard's part of a deployment's status (`corral status` on several shards). */
export interface ShardStatusView {
  shard: number;
  queue: QueueDepth;
  liveActivations: number;
  blockedActors: number;
  outbox: OutboxBacklog;
}

const laterOf = (a: number | null, b: number | null) => (a === null ? b : b === null ? a : Math.max(a, b));

/**
 * A deployment's status from each shard's (`shards[0]` the catalog's, whose daemons and workers
 * are the deployment's): counts summed, the oldest waits the longest of them, and each shard's own.
 */
export function mergeShardStatus(shards: readonly SystemStatus[]): SystemStatus & { shards: ShardStatusView[] } {
  const [catalog] = shards;
  if (!catalog) throw new CorralError('internal', 'a status of no shard');
  const sum = (f: (s: SystemStatus) => number) => shards.reduce((n, s) => n + f(s), 0);
  const oldest = shards.reduce<SystemStatus | undefined>(
    (o, s) => ((s.queue.oldestWaitingSeconds ?? -1) > (o?.queue.oldestWaitingSeconds ?? -1) ? s : o),
    undefined,
  );
  return {
    ...catalog,
    queue: {
      ...catalog.queue,
      ready: sum((s) => s.queue.ready),
      deferred: sum((s) => s.queue.deferred),
      retrying: sum((s) => s.queue.retrying),
      active: sum((s) => s.queue.active),
      failedHeld: sum((s) => s.queue.failedHeld),
      deadLettered: sum((s) => s.queue.deadLettered),
      oldestWaitingAt: oldest?.queue.oldestWaitingAt ?? null,
      oldestWaitingEventId: oldest?.queue.oldestWaitingEventId ?? null,
      oldestWaitingSeconds: oldest?.queue.oldestWaitingSeconds ?? null,
    },
    liveActivations: sum((s) => s.liveActivations),
    blockedActors: sum((s) => s.blockedActors),
    oldestWaitingSeconds: oldest?.oldestWaitingSeconds ?? null,
    outbox: {
      pending: sum((s) => s.outbox.pending),
      dead: sum((s) => s.outbox.dead),
      oldestPendingSeconds: shards.reduce<number | null>((o, s) => laterOf(o, s.outbox.oldestPendingSeconds), null),
    },
    shards: shards.map((s, shard) => ({
      shard,
      queue: s.queue,
      liveActivations: s.liveActivations,
      blockedActors: s.blockedActors,
      outbox: s.outbox,
    })),
  };
}
