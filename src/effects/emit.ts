/**
 * Durable effects of a turn: the events a `turn_result` emits (`emit: [{ actor, data, delay_ms? }]`)
 * and the steering inputs that arrived after the worker's handler had finished. They are enqueued
 * through pg-boss INSIDE the transaction that commits the turn, so they exist exactly when the
 * turn committed: a rolled-back or rejected commit leaves no event behind, and a retried attempt
 * cannot add a second copy (only one attempt of an event ever commits, I3').
 *
 * Invariants:
 *  E1 the jobs are the same as `corral send` writes (`actorEventJob`: UUIDv7 id, actor key as
 *     singletonKey, the same payload limit), so an emitted event is an ordinary actor event.
 *  E2 one pg-boss `insert` call for all effects of a commit batch, in batch order; a delay is a
 *     PostgreSQL interval (`start_after = now() + delay`), never Node's clock.
 *  E3 a result whose `emit` breaks the limits (count, size, actor key, delay) is rejected before
 *     any transaction (`turn_rejected{emit_limit}`): nothing of it is written.
 *  E4 on a shard of a deployment of several (src/base/shard-map.ts), an emit to an actor of another
 *     shard is the same job written to the shard's outbox of emits instead of its queue (X1 of
 *     src/db/shards/shard-emits.ts): the relay enqueues it at its shard, with the same id.
 */
import type { TraceCarrier } from '../base/trace-context.ts';
import { sql } from '../db/orm.ts';
import { fromDrizzle, type PgBoss } from 'pg-boss';
import { formatActorKey, parseActorKey, type ActorKey } from '../base/actor-key.ts';
import { CorralError } from '../base/errors.ts';
import type { DbOrTx } from '../db/client.ts';
import { recordEmittedMany, steersOfMany, type EmittedRecord } from '../db/turns/effects.ts';
import { MAX_EMITS, emitSchema } from '../fabric/protocol.ts';
import { actorEventJob } from '../queue/event-job.ts';
import { shardOf } from '../base/shard-map.ts';
import { recordShardEmits, type ShardEmit } from '../db/shards/shard-emits.ts';

/** The shard a runtime serves, of how many (E4); absent: one shard. */
export interface ShardPlace {
  shard: number;
  shardCount: number;
}

/** One checked effect. */
export interface EmitRequest {
  key: ActorKey;
  data: unknown;
  delayMs?: number;
}

/**
 * Checks a result's `emit` (E3). Returns the effects, or why the result must be rejected
 * (`emit_limit`). `maxEventBytes` is the enqueue limit of every event.
 */
export function checkEmits(
  raw: unknown[] | undefined,
  maxEventBytes: number,
): { ok: true; emits: EmitRequest[] } | { ok: false; detail: string } {
  if (raw === undefined) return { ok: true, emits: [] };
  if (raw.length > MAX_EMITS) return { ok: false, detail: `${raw.length} emits; at most ${MAX_EMITS}` };
  const emits: EmitRequest[] = [];
  for (const [i, e] of raw.entries()) {
    const parsed = emitSchema.safeParse(e);
    if (!parsed.success)
      return {
        ok: false,
        detail: `emit[${i}]: ${parsed.error.issues[0]?.path.join('.') ?? ''} ${parsed.error.issues[0]?.message ?? 'invalid'}`,
      };
    let key: ActorKey;
    try {
      key = parseActorKey(parsed.data.actor);
    } catch (err) {
      return { ok: false, detail: `emit[${i}].actor: ${(err as Error).message}` };
    }
    try {
      // the same checks `corral send` makes (size, storable); the job itself is built at commit
      actorEventJob(key, parsed.data.data, maxEventBytes);
    } catch (err) {
      if (err instanceof CorralError) return { ok: false, detail: `emit[${i}].data: ${err.message}` };
      throw err;
    }
    emits.push({ key, data: parsed.data.data, ...(parsed.data.delay_ms ? { delayMs: parsed.data.delay_ms } : {}) });
  }
  return { ok: true, emits };
}

/** The effects of one committing turn. */
export interface TurnEffects {
  deliveryId: string;
  /** The turn's own actor (a late steer becomes its next event). */
  key: ActorKey;
  emits: readonly EmitRequest[];
  /** Set when the result carried this older revision: steers after it become events (docs §9). */
  lateSteerAfter?: number;
  /** The trace context the turn continued: the events it emits continue it too. */
  trace?: TraceCarrier;
}

/**
 * Enqueues the effects of a commit batch inside its transaction `tx` (E1, E2) and records on each
 * turn what it emitted. Three statements at most (steers, insert, record), whatever the batch size.
 */
export async function enqueueEffects(
  tx: DbOrTx,
  boss: PgBoss,
  queueName: string,
  turns: readonly TurnEffects[],
  maxEventBytes: number,
  place?: ShardPlace,
): Promise<void> {
  if (turns.length === 0) return;
  const late = turns.filter((t) => t.lateSteerAfter !== undefined);
  const steers = await steersOfMany(
    tx,
    late.map((t) => t.deliveryId),
  );
  const jobs: { id: string; data: object; singletonKey: string; startAfter?: string }[] = [];
  const records: { deliveryId: string; emitted: EmittedRecord[] }[] = [];
  const elsewhere: ShardEmit[] = [];
  for (const t of turns) {
    const emitted: EmittedRecord[] = [];
    const add = (key: ActorKey, data: unknown, delayMs: number | undefined, steerRevision?: number) => {
      // a steer input was checked when it was accepted; the limit is the wire's here
      const job = actorEventJob(key, data, steerRevision === undefined ? maxEventBytes : Number.MAX_SAFE_INTEGER, t.trace);
      const target = place && place.shardCount > 1 ? shardOf(key, place.shardCount) : undefined;
      if (target !== undefined && target !== place!.shard) {
        elsewhere.push({
          targetShard: target,
          eventId: job.id,
          agentUid: key.agentUid,
          sessionId: key.sessionId,
          data: job.data as unknown as object,
          ...(delayMs ? { delayMs } : {}),
        });
      } else
        jobs.push({
          id: job.id,
          data: job.data as unknown as object,
          singletonKey: job.singletonKey,
          ...(delayMs ? { startAfter: `${delayMs} milliseconds` } : {}),
        });
      emitted.push({
        event_id: job.id,
        actor: formatActorKey(key),
        data: job.data.payload,
        ...(delayMs ? { delay_ms: delayMs } : {}),
        ...(steerRevision === undefined ? {} : { steer_revision: steerRevision }),
      });
    };
    for (const e of t.emits) add(e.key, e.data, e.delayMs);
    if (t.lateSteerAfter !== undefined) {
      for (const s of steers.get(t.deliveryId) ?? []) if (s.revision > t.lateSteerAfter) add(t.key, s.input, undefined, s.revision);
    }
    if (emitted.length > 0) records.push({ deliveryId: t.deliveryId, emitted });
  }
  if (jobs.length === 0 && elsewhere.length === 0) return;
  if (jobs.length > 0) {
    const ids = await boss.insert(queueName, jobs, { db: fromDrizzle(tx, sql) });
    if (ids !== null && ids.length !== jobs.length)
      throw new CorralError('internal', `pg-boss inserted ${ids.length} of ${jobs.length} emitted events`);
  }
  await recordShardEmits(tx, elsewhere);
  await recordEmittedMany(tx, records);
}
