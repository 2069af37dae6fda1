/**
 * The relay of cross-shard emits: moves the rows of a shard's outbox of emits
 * (src/db/shards/shard-emits.ts) to the shards of their actors, exactly once and in order.
 *
 *  R1 A pass reads the oldest rows (commit order) and, per target shard, takes at most one row
 *     per actor (X4): the rest wait for the next pass, so two emits to one actor are enqueued by
 *     two transactions of the target, in order. A row of an actor whose earlier row is not
 *     delivered yet is never taken before it.
 *  R2 Per target, one transaction on the target shard enqueues the rows (X2: an event id taken
 *     before is not enqueued again); then the rows are deleted at the source (X3). A relay killed in
 *     between delivers them again, and the target's inbox makes that a no-op.
 *  R3 A target that fails (down, moved, not migrated) is noted on its rows and backed off
 *     (`backoffDelayMs`, 1 s to 60 s); the other targets go on. The catalog's map is read again
 *     after a failure, so a shard moved meanwhile is reached at its new URL.
 *  R4 Woken by the commits that wrote rows (`wake`), and every `pollMs` otherwise (rows a crashed
 *     daemon's commits left, rows written by another daemon of the shard).
 */
import type { Clock, TimerHandle } from '../base/clock.ts';
import { errorMessage } from '../base/errors.ts';
import type { Logger } from '../base/logger.ts';
import { formatActorKey } from '../base/actor-key.ts';
import { crashPoint } from '../base/crash-points.ts';
import type { Db } from '../db/client.ts';
import type { ShardPools } from '../db/shards/shard-pools.ts';
import {
  acceptShardEmits,
  deleteShardEmits,
  noteShardEmitFailure,
  pendingShardEmits,
  type PendingShardEmit,
} from '../db/shards/shard-emits.ts';

/** Rows read per pass. */
const PASS_ROWS = 500;
const MIN_BACKOFF_MS = 1_000;
const MAX_BACKOFF_MS = 60_000;

/** R3: the wait after `failures` failures of one target in a row. */
export function backoffDelayMs(failures: number): number {
  return Math.min(MAX_BACKOFF_MS, MIN_BACKOFF_MS * 2 ** Math.max(0, failures - 1));
}

/** R1: the rows a pass delivers, by target shard: per target, each actor's first row only. */
export function rowsToDeliver(rows: readonly PendingShardEmit[], skip: ReadonlySet<number>): Map<number, PendingShardEmit[]> {
  const out = new Map<number, PendingShardEmit[]>();
  const seen = new Set<string>();
  for (const r of rows) {
    const key = formatActorKey(r);
    if (seen.has(key)) continue;
    seen.add(key);
    if (skip.has(r.targetShard)) continue;
    const list = out.get(r.targetShard) ?? [];
    list.push(r);
    out.set(r.targetShard, list);
  }
  return out;
}

export interface ShardRelayOptions {
  /** The source shard's database and number. */
  db: Db;
  shard: number;
  pools: ShardPools;
  queue: string;
  clock: Clock;
  logger: Logger;
  pollMs: number;
  /** Counts delivered events (metrics). */
  delivered?: (n: number) => void;
}

export interface RelayPass {
  delivered: number;
  failedTargets: number[];
  /** Rows left for the next pass (R1) or a later one (R3). */
  more: boolean;
}

export class ShardRelay {
  private readonly opts: ShardRelayOptions;
  private readonly log: Logger;
  private readonly failures = new Map<number, { count: number; untilMs: number }>();
  private wakeUp: (() => void) | undefined;
  private woken = false;
  private running: Promise<RelayPass> | undefined;

  constructor(opts: ShardRelayOptions) {
    this.opts = opts;
    this.log = opts.logger.child({ component: 'shard-relay', shard: opts.shard });
  }

  /** R4: a commit wrote rows. */
  wake(): void {
    this.woken = true;
    this.wakeUp?.();
  }

  /** One pass; concurrent calls share it. */
  tick(): Promise<RelayPass> {
    this.running ??= this.pass().finally(() => {
      this.running = undefined;
    });
    return this.running;
  }

  async run(signal: AbortSignal): Promise<void> {
    while (!signal.aborted) {
      this.woken = false;
      let more = false;
      try {
        more = (await this.tick()).more;
      } catch (e) {
        this.log.warn({ err: errorMessage(e) }, 'shard relay pass failed');
      }
      if (signal.aborted) break;
      if (more || this.woken) continue;
      await this.pause(this.opts.pollMs, signal);
    }
  }

  private async pass(): Promise<RelayPass> {
    const rows = await pendingShardEmits(this.opts.db, PASS_ROWS);
    const now = this.opts.clock.nowMs();
    const backedOff = new Set([...this.failures].filter(([, f]) => f.untilMs > now).map(([shard]) => shard));
    const byTarget = rowsToDeliver(rows, backedOff);
    const failedTargets: number[] = [];
    let delivered = 0;
    let settled = 0;
    await Promise.all(
      [...byTarget].map(async ([target, list]) => {
        try {
          const n = await this.deliver(target, list);
          delivered += n;
          settled += list.length;
          this.failures.delete(target);
        } catch (e) {
          failedTargets.push(target);
          await this.failed(target, list, e);
        }
      }),
    );
    if (delivered > 0) this.opts.delivered?.(delivered);
    // rows left behind a delivered one (R1), or a full read: another pass at once
    const more = settled > 0 && rows.length > settled;
    return { delivered, failedTargets, more };
  }

  /** R2 */
  private async deliver(target: number, rows: PendingShardEmit[]): Promise<number> {
    const client = await this.opts.pools.poolOf(target).connect();
    let broken = false;
    try {
      const n = await acceptShardEmits(client, this.opts.queue, this.opts.shard, rows);
      // R2's window: the target committed, the source still holds the rows
      crashPoint('shard-relay-delivered');
      await deleteShardEmits(
        this.opts.db,
        rows.map((r) => r.id),
      );
      return n;
    } catch (e) {
      broken = true;
      throw e;
    } finally {
      client.release(broken);
    }
  }

  /** R3 */
  private async failed(target: number, rows: PendingShardEmit[], e: unknown): Promise<void> {
    const count = (this.failures.get(target)?.count ?? 0) + 1;
    const waitMs = backoffDelayMs(count);
    this.failures.set(target, { count, untilMs: this.opts.clock.nowMs() + waitMs });
    const why = errorMessage(e);
    this.log.warn(
      { targetShard: target, rows: rows.length, failures: count, retryInMs: waitMs, err: why },
      'cross-shard emits not delivered',
    );
    await noteShardEmitFailure(
      this.opts.db,
      rows.map((r) => r.id),
      why,
    ).catch(() => undefined);
    await this.opts.pools.reload().catch((err: unknown) => this.log.debug({ err: errorMessage(err) }, 'shard map not read'));
  }

  private pause(ms: number, signal: AbortSignal): Promise<void> {
    return new Promise((resolve) => {
      let timer: TimerHandle | undefined;
      const done = () => {
        timer?.cancel();
        signal.removeEventListener('abort', done);
        this.wakeUp = undefined;
        resolve();
      };
      if (this.woken) return resolve();
      this.wakeUp = done;
      timer = this.opts.clock.setTimeout(done, ms);
      signal.addEventListener('abort', done, { once: true });
    });
  }
}
