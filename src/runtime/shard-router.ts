/**
 * The broker's events for a daemon that serves several shards: one runtime per shard, sharing
 * the broker's connection, the workers and their slots.
 *
 *  D1 Workers are the daemon's, not a shard's: registrations, heartbeats and departures go to the
 *     one registry the runtimes share (its slots are counted across shards), and every runtime
 *     hears of them (a restarted worker's lost turns, a gone worker's turns: each runtime moves
 *     those it holds).
 *  D2 A message about a turn (accepted, progress, chunk, result, error, an RPC) goes to the
 *     runtime of the shard of its `turn_ref`'s actor (src/base/shard-map.ts): that runtime checks
 *     the fence against its shard's rows, as a one-shard daemon does. A reply for a shard this
 *     daemon does not serve is dropped and counted as invalid (no runtime here sent that turn).
 *  D3 With one shard the daemon hands the broker's events to its runtime directly: this router
 *     is not on a one-shard daemon's turn path at all.
 *  D4 The shards' consumers share the free slots: a fetch reserves what it may take until its jobs
 *     are dispatched (`fetchCapacity`, `fetched`).
 */
import { shardOf } from '../base/shard-map.ts';
import type { Logger } from '../base/logger.ts';
import type { BrokerEvent } from '../fabric/broker.ts';
import { BackgroundWork } from './background.ts';
import type { RuntimeMetrics } from './metrics.ts';
import type { Runtime } from './runtime.ts';
import type { WorkerRegistry } from './worker-registry.ts';

export interface ShardRouterOptions {
  shardCount: number;
  /** The runtimes of the shards served, by shard number. */
  runtimes: ReadonlyMap<number, Runtime>;
  workers: WorkerRegistry;
  metrics: RuntimeMetrics;
  logger: Logger;
}

export class ShardRouter {
  private readonly opts: ShardRouterOptions;
  private readonly log: Logger;
  private readonly background: BackgroundWork;

  constructor(opts: ShardRouterOptions) {
    this.opts = opts;
    this.log = opts.logger.child({ component: 'shard-router' });
    this.background = new BackgroundWork(this.log);
  }

  /** Called from the broker's receive loop: schedules, never awaits. */
  handleBrokerEvent(e: BrokerEvent): void {
    switch (e.kind) {
      case 'worker_ready':
        this.background.track(this.workerReady(e.workerId, e.capacity, e.instance, e.agents), { workerId: e.workerId });
        return;
      case 'worker_heartbeat':
        this.opts.workers.heartbeat(e.workerId, e.inFlight);
        return;
      case 'worker_gone': {
        const events = this.opts.workers.forget(e.workerId);
        this.log.warn({ workerId: e.workerId, reason: e.reason, inFlight: events.length }, 'worker gone');
        for (const r of this.opts.runtimes.values()) r.workerLost(e.workerId, e.reason, events);
        return;
      }
      case 'invalid':
        this.opts.metrics.invalidMessage();
        return;
      default: {
        // D2
        const runtime = this.opts.runtimes.get(
          shardOf({ agentUid: e.turnRef.agent_uid, sessionId: e.turnRef.session_id }, this.opts.shardCount),
        );
        if (runtime) runtime.handleBrokerEvent(e);
        else this.opts.metrics.invalidMessage();
      }
    }
  }

  /** D1 */
  private async workerReady(workerId: string, capacity: number, instance?: string, agents?: readonly string[]): Promise<void> {
    const { restarted, lostEvents } = await this.opts.workers.register(workerId, capacity, instance, agents);
    this.log.info({ workerId, capacity, restarted }, 'worker ready');
    for (const r of this.opts.runtimes.values()) r.workerRegistered(workerId, lostEvents);
  }

  /** D4: the slots other shards' fetches under way may take, by runtime. */
  private readonly reserved = new Map<Runtime, number>();

  /**
   * D4: free slots for one shard's fetch. The turns parked by every runtime wait for the same
   * slots, and so do the jobs of another shard's fetch under way (its slots are taken only when
   * its jobs are dispatched): this fetch reserves what it is given until `fetched`. Without it, N
   * consumers woken together would each fetch every free slot and park the rest, and a parked
   * turn costs a second delivery when a slot frees.
   */
  fetchCapacity(runtime: Runtime): number {
    let reservedElsewhere = 0;
    let parkedElsewhere = 0;
    for (const r of this.opts.runtimes.values()) {
      if (r === runtime) continue;
      parkedElsewhere += r.dispatcher.parkedCount();
      reservedElsewhere += this.reserved.get(r) ?? 0;
    }
    const capacity = runtime.dispatcher.fetchCapacity(parkedElsewhere + reservedElsewhere);
    if (capacity > 0) this.reserved.set(runtime, capacity);
    else {
      this.reserved.delete(runtime);
      // refused for another shard's fetch: it is woken when that fetch is done
      if (reservedElsewhere > 0) this.refused.add(runtime);
    }
    return capacity;
  }

  /** D4: the runtimes whose fetch was refused for slots another fetch held. */
  private readonly refused = new Set<Runtime>();

  /**
   * D4: the fetch of `runtime` is dispatched (its jobs hold their slots now), came back empty or
   * failed. Returns the runtimes refused a fetch meanwhile: their consumers should look again.
   */
  fetched(runtime: Runtime): Runtime[] {
    if (!this.reserved.delete(runtime) || this.refused.size === 0) return [];
    const refused = [...this.refused];
    this.refused.clear();
    return refused;
  }

  /** A slot freed on one shard: the turns parked on the others may take it. */
  capacityFreed(): void {
    for (const r of this.opts.runtimes.values()) r.dispatcher.dispatchParked();
  }

  drain(): Promise<void> {
    return this.background.drain();
  }
}
