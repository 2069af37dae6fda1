/**
 * Enqueueing actor events. An event is a pg-boss job on the actor queue whose `singletonKey` is
 * the actor key and whose id is a client-generated UUIDv7: pg-boss breaks ties between jobs of one
 * transaction by id, so increasing ids keep events enqueued together in enqueue order (I4).
 */
import { sql } from 'drizzle-orm';
import { fromDrizzle, type PgBoss } from 'pg-boss';
import { v7 as uuidv7 } from 'uuid';
import { formatActorKey, type ActorKey } from '../actor-key.ts';
import type { DbOrTx } from '../db/client.ts';
import { CorralError } from '../errors.ts';
import { unstorableReason } from '../json-safety.ts';

/** What a job of the actor queue carries. */
export interface ActorEventJobData {
  agentUid: string;
  sessionId: string;
  payload: unknown;
  enqueuedAt: string;
}

export interface EnqueuedEvent {
  eventId: string;
  actorKey: ActorKey;
}

/** Default for `maxEventBytes` when the caller does not pass one (same as the config default). */
export const DEFAULT_MAX_EVENT_BYTES = 256 * 1024;

/**
 * The payload as it will be stored, checked before anything is written: JSON-serialisable,
 * storable by jsonb (no NUL, no lone surrogate, no number JSON cannot keep), and at most
 * `maxBytes` of JSON. An event too large for the wire would otherwise hold a worker slot until
 * its lease ran out, on every retry.
 */
function toJsonPayload(event: unknown, maxBytes: number): unknown {
  if (event === undefined) throw new CorralError('invalid_argument', 'an event payload is required');
  const unstorable = unstorableReason(event);
  if (unstorable) throw new CorralError('invalid_argument', `the event payload cannot be stored: ${unstorable}`);
  let text: string;
  try {
    text = JSON.stringify(event);
  } catch (e) {
    throw new CorralError('invalid_argument', 'the event payload must be JSON-serialisable', { cause: e });
  }
  const bytes = Buffer.byteLength(text, 'utf8');
  if (bytes > maxBytes) {
    throw new CorralError('payload_too_large', `the event payload is ${bytes} bytes; the limit is ${maxBytes} (CORRAL_MAX_EVENT_BYTES)`, {
      details: { bytes, maxBytes },
    });
  }
  return JSON.parse(text) as unknown;
}

export interface EventQueue {
  readonly queueName: string;
  /** Enqueue one event; runs inside `dbOrTx` (commit or roll back with the caller's writes). */
  enqueueActorEvent(dbOrTx: DbOrTx, key: ActorKey, event: unknown): Promise<EnqueuedEvent>;
  /** Enqueue several events (any actors) in one statement, in array order. */
  enqueueActorEvents(dbOrTx: DbOrTx, events: { key: ActorKey; event: unknown }[]): Promise<EnqueuedEvent[]>;
}

export function createEventQueue(
  boss: PgBoss,
  queueName: string,
  opts: { maxEventBytes?: number } = {},
): EventQueue {
  const maxBytes = opts.maxEventBytes ?? DEFAULT_MAX_EVENT_BYTES;
  const jobOf = (key: ActorKey, event: unknown) => {
    const data: ActorEventJobData = {
      agentUid: key.agentUid,
      sessionId: key.sessionId,
      payload: toJsonPayload(event, maxBytes),
      enqueuedAt: new Date().toISOString(),
    };
    return { id: uuidv7(), data, singletonKey: formatActorKey(key) };
  };
  return {
    queueName,
    async enqueueActorEvent(dbOrTx, key, event) {
      const job = jobOf(key, event);
      const id = await boss.send(queueName, job.data as unknown as object, {
        id: job.id,
        singletonKey: job.singletonKey,
        db: fromDrizzle(dbOrTx, sql),
      });
      if (id !== job.id) throw new CorralError('internal', `pg-boss did not accept event ${job.id}`);
      return { eventId: job.id, actorKey: key };
    },
    async enqueueActorEvents(dbOrTx, events) {
      if (events.length === 0) return [];
      const jobs = events.map((e) => jobOf(e.key, e.event));
      await boss.insert(
        queueName,
        jobs.map((j) => ({ id: j.id, data: j.data as unknown as object, singletonKey: j.singletonKey })),
        { db: fromDrizzle(dbOrTx, sql) },
      );
      return jobs.map((j, i) => ({ eventId: j.id, actorKey: events[i]!.key }));
    },
  };
}
