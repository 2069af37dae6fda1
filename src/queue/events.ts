/**
 * Enqueueing actor events. An event is a pg-boss job on the actor queue whose `singletonKey` is
 * the actor key and whose id is a client-generated UUIDv7: pg-boss breaks ties between jobs of one
 * transaction by id, so increasing ids keep events enqueued together in enqueue order (I4).
 */
import { sql } from '../db/orm.ts';
import { fromDrizzle, type PgBoss } from 'pg-boss';
import type { ActorKey } from '../base/actor-key.ts';
import type { DbOrTx } from '../db/client.ts';
import { CorralError } from '../base/errors.ts';
import { actorEventJob, type EnqueuedEvent } from './event-job.ts';

export type { ActorEventJobData, EnqueuedEvent } from './event-job.ts';

export interface EventQueue {
  readonly queueName: string;
  /** Enqueue one event; runs inside `dbOrTx` (commit or roll back with the caller's writes). */
  enqueueActorEvent(dbOrTx: DbOrTx, key: ActorKey, event: unknown): Promise<EnqueuedEvent>;
  /** Enqueue several events (any actors) in one statement, in array order. */
  enqueueActorEvents(dbOrTx: DbOrTx, events: { key: ActorKey; event: unknown }[]): Promise<EnqueuedEvent[]>;
}

export function createEventQueue(boss: PgBoss, queueName: string, opts: { maxEventBytes: number }): EventQueue {
  const maxBytes = opts.maxEventBytes;
  const jobOf = (key: ActorKey, event: unknown) => actorEventJob(key, event, maxBytes);
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
