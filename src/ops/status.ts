/**
 * The operator's view of a corral installation (`corral status`, `corral actor`, the metrics
 * gauges): read-only, from the database alone, so it works from any host and whether or not a
 * daemon runs.
 */
import { formatActorKey, type ActorKey } from '../actor-key.ts';
import type { DbOrTx } from '../db/client.ts';
import type { WorkerStatus } from '../db/schema.ts';
import { listWorkers } from '../db/workers.ts';
import { toDate } from '../db/rows.ts';
import {
  findDeadLetters,
  pendingJobsOf,
  queueDepth,
  type DeadLetter,
  type PendingJob,
  type QueueDepth,
  type Queues,
} from '../db/boss-jobs.ts';
import { actorRow, latestActivation, recentTurnsOf, type ActivationView, type TurnView } from '../db/actor-views.ts';
import { blockedActorCount, liveActivationCount, serverTime } from '../db/status-counts.ts';

export interface WorkerView {
  workerId: string;
  status: WorkerStatus;
  capacity: number;
  inFlight: number;
  ownerId: string;
  lastHeartbeatAt: Date;
  /** Seconds since the last heartbeat, by PostgreSQL's clock. */
  heartbeatAgeSeconds: number;
}

export interface SystemStatus {
  queue: QueueDepth & { name: string; deadLetterQueue: string };
  liveActivations: number;
  blockedActors: number;
  workers: WorkerView[];
  /** Seconds the oldest waiting event has waited (null: none waiting). */
  oldestWaitingSeconds: number | null;
  at: Date;
}

export async function systemStatus(db: DbOrTx, q: Queues): Promise<SystemStatus> {
  const [depth, live, blocked, rows, now] = await Promise.all([
    queueDepth(db, q),
    liveActivationCount(db),
    blockedActorCount(db),
    listWorkers(db),
    serverTime(db),
  ]);
  const serverNow = toDate(now) ?? new Date();
  return {
    queue: { ...depth, name: q.events, deadLetterQueue: q.deadLetter },
    liveActivations: live,
    blockedActors: blocked,
    workers: rows.map((w) => ({
      workerId: w.workerId,
      status: w.status,
      capacity: w.capacity,
      inFlight: w.inFlight,
      ownerId: w.ownerId,
      lastHeartbeatAt: w.lastHeartbeatAt,
      heartbeatAgeSeconds: Math.max(0, (serverNow.getTime() - w.lastHeartbeatAt.getTime()) / 1000),
    })),
    oldestWaitingSeconds: depth.oldestWaitingSeconds,
    at: serverNow,
  };
}

export interface ActorStatus {
  actor: string;
  known: boolean;
  epochCounter: number;
  blockedByEventId: string | null;
  activation: ActivationView | null;
  pendingEvents: PendingJob[];
  recentTurns: TurnView[];
  deadLetters: DeadLetter[];
}

/** Everything an operator asks about one actor. */
export async function actorStatus(
  db: DbOrTx,
  q: Queues,
  key: ActorKey,
  opts: { turns?: number; pending?: number; deadLetters?: number } = {},
): Promise<ActorStatus> {
  const [row, activation, pending, recent, dead] = await Promise.all([
    actorRow(db, key),
    latestActivation(db, key),
    pendingJobsOf(db, q.schema, q.events, key, opts.pending ?? 100),
    recentTurnsOf(db, key, opts.turns ?? 10),
    findDeadLetters(db, q, { actor: key }, { limit: opts.deadLetters ?? 100 }),
  ]);
  return {
    actor: formatActorKey(key),
    known: row !== undefined || pending.length > 0 || dead.length > 0,
    epochCounter: row?.epochCounter ?? 0,
    blockedByEventId: row?.blockedByEventId ?? null,
    activation: activation ?? null,
    pendingEvents: pending,
    recentTurns: recent,
    deadLetters: dead,
  };
}
