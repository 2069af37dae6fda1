/**
 * The worker registry: the workers connected to this daemon's broker, their free slots, their
 * heartbeats and staleness, and their durable rows in `corral.workers` (for operators: the
 * dispatch decisions use the in-memory pool, a projection rebuilt from `worker_ready`).
 */
import type { AgentScope } from '../base/agent-scope.ts';
import { TokenBuckets } from '../base/rate-limits.ts';
import type { Clock } from '../base/clock.ts';
import type { Db } from '../db/client.ts';
import * as workersDb from '../db/operations/workers.ts';
import type { Logger } from '../base/logger.ts';
import type { BackgroundWork } from './background.ts';
import { WorkerPool } from './worker-pool.ts';

/**
 * Replies about deliveries this process did not dispatch (or no longer holds) cost a database
 * transaction to judge. They are legitimate after a daemon restart (a worker re-sends its
 * unanswered results), so they are not refused outright: each worker gets this budget, and
 * beyond it they are rejected at once, before any transaction.
 */
const UNKNOWN_REPLY_BURST = 20;
const UNKNOWN_REPLY_PER_SECOND = 10;
/** The durable heartbeat is for operators: at most one write per worker per this many ms. */
const HEARTBEAT_WRITE_MS = 1_000;

export interface WorkerRegistryOptions {
  db: Db;
  ownerId: string;
  clock: Clock;
  logger: Logger;
  background: BackgroundWork;
  /** A worker not heard from for this long is stale: out of dispatch until it registers again. */
  staleMs: number;
  /** The turns a worker may hold before it accepted or committed any (WorkerPool P3). */
  initialTurns: number;
  /** Drops a worker's broker session, so it must register again (a stale or removed worker). */
  forgetSession?: (workerId: string) => void;
}

export class WorkerRegistry {
  private readonly pool: WorkerPool;
  private readonly opts: WorkerRegistryOptions;
  private readonly lastHeartbeatWrite = new Map<string, number>();
  private readonly unknownReplyBudget: TokenBuckets;

  constructor(opts: WorkerRegistryOptions) {
    this.opts = opts;
    this.pool = new WorkerPool({ initialWindow: opts.initialTurns });
    this.unknownReplyBudget = new TokenBuckets(opts.clock, UNKNOWN_REPLY_PER_SECOND, UNKNOWN_REPLY_BURST);
  }

  /**
   * A worker said `worker_ready`. Returns the events a previous run of it held (a new process
   * run lost them; a reconnect of the same run keeps them).
   */
  async register(
    workerId: string,
    capacity: number,
    instance?: string,
    agents?: AgentScope,
  ): Promise<{ restarted: boolean; lostEvents: string[] }> {
    const registered = this.pool.register(workerId, capacity, this.opts.clock.nowMs(), instance, agents);
    await workersDb.upsertWorker(this.opts.db, { workerId, ownerId: this.opts.ownerId, capacity });
    return registered;
  }

  /** Any message from a registered worker counts as a sign of life. False: not registered. */
  seen(workerId: string): boolean {
    return this.pool.seen(workerId, this.opts.clock.nowMs());
  }

  heartbeat(workerId: string, inFlight: number): void {
    const now = this.opts.clock.nowMs();
    if (!this.pool.seen(workerId, now)) return;
    if (now - (this.lastHeartbeatWrite.get(workerId) ?? 0) < HEARTBEAT_WRITE_MS) return;
    this.lastHeartbeatWrite.set(workerId, now);
    this.opts.background.track(workersDb.recordHeartbeat(this.opts.db, workerId, inFlight), { workerId });
  }

  /** Takes one token from `workerId`'s unknown-reply budget; false when it is spent. */
  takeUnknownReplyToken(workerId: string): boolean {
    return this.unknownReplyBudget.take(workerId);
  }

  /** Reserves a slot for `eventId`, a turn of `agentUid` (see WorkerPool.acquire), avoiding `exclude`. */
  acquire(eventId: string, agentUid: string, exclude?: ReadonlySet<string>): string | undefined {
    return this.pool.acquire(eventId, agentUid, this.opts.clock.nowMs(), exclude);
  }

  /** The agents `workerId`'s key may serve and emit to (undefined: all). */
  scopeOf(workerId: string): AgentScope {
    return this.pool.scopeOf(workerId);
  }

  /** `workerId` handed a turn back: its peers get first offer for a while (WorkerPool P2). */
  handedBack(workerId: string): void {
    this.pool.handedBack(workerId, this.opts.clock.nowMs());
  }

  /** `workerId` accepted a turn: it may hold one more (WorkerPool P3). */
  accepted(workerId: string): void {
    this.pool.accepted(workerId);
  }

  /** `workerId` committed a turn: any hand-back back-off is over, and it may hold one more. */
  committed(workerId: string): void {
    this.pool.committed(workerId);
  }

  /** Moves the slot held for `from` to `to` on the same worker (WorkerPool.rekey). */
  rekey(from: string, to: string): string | undefined {
    return this.pool.rekey(from, to);
  }

  release(eventId: string): void {
    this.pool.release(eventId);
  }

  freeSlots(): number {
    return this.pool.freeSlots(this.opts.clock.nowMs());
  }

  workerOf(eventId: string): string | undefined {
    return this.pool.workerOf(eventId);
  }

  capacityOf(workerId: string): number {
    return this.pool.capacityOf(workerId);
  }

  /** Registered and not stale. */
  isReady(workerId: string): boolean {
    return this.pool.isReady(workerId);
  }

  get size(): number {
    return this.pool.size;
  }

  /** The registration `workerId` is in now (WorkerPool), for `forget`; undefined: not registered. */
  registrationOf(workerId: string): number | undefined {
    return this.pool.registrationOf(workerId);
  }

  /**
   * Out of dispatch for good (gone, send failed, restarted elsewhere). Returns the events it held.
   * Given `registration`, only if the worker has not registered again since (false: nothing done).
   */
  forget(workerId: string, registration?: number): string[] {
    if (registration !== undefined && this.pool.registrationOf(workerId) !== registration) return [];
    const events = this.pool.remove(workerId);
    this.lastHeartbeatWrite.delete(workerId);
    this.unknownReplyBudget.delete(workerId);
    this.opts.background.track(workersDb.setWorkerStatus(this.opts.db, workerId, 'gone'), { workerId });
    return events;
  }

  /**
   * Workers not heard from for `staleMs`: taken out of dispatch and their broker sessions
   * dropped (a frozen process that wakes up finds itself unknown and registers again), marked
   * `stale` in the database. Long-stale workers are forgotten, so memory stays bounded.
   */
  async takeStale(): Promise<{ id: string; events: string[] }[]> {
    const now = this.opts.clock.nowMs();
    const stale = this.pool.takeStale(now, this.opts.staleMs);
    for (const id of this.pool.pruneStale(now, Math.max(60_000, this.opts.staleMs * 6))) {
      this.lastHeartbeatWrite.delete(id);
      this.unknownReplyBudget.delete(id);
    }
    for (const w of stale) {
      this.opts.forgetSession?.(w.id);
      await workersDb.setWorkerStatus(this.opts.db, w.id, 'stale');
    }
    return stale;
  }
}
