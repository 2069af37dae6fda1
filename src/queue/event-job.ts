/**
 * The job that carries one actor event: its data, its id (a UUIDv7: pg-boss breaks ties between
 * jobs of one transaction by id, so increasing ids keep events enqueued together in order, I4)
 * and its `singletonKey` (the actor key). Free of Drizzle and pg-boss so that a short command
 * can build one cheaply.
 */
import { v7 as uuidv7 } from 'uuid';
import { formatActorKey, type ActorKey } from '../base/actor-key.ts';
import { toJsonPayload } from '../base/json-safety.ts';
import type { TraceCarrier } from '../base/trace-context.ts';

/** What a job of the actor queue carries. */
export interface ActorEventJobData {
  agentUid: string;
  sessionId: string;
  payload: unknown;
  enqueuedAt: string;
  /** The sender's W3C trace context (E9 of src/db/enqueue/send-event.ts); absent when none was given. */
  trace?: TraceCarrier;
}

export interface EnqueuedEvent {
  eventId: string;
  actorKey: ActorKey;
}

export interface ActorEventJob {
  id: string;
  data: ActorEventJobData;
  singletonKey: string;
}

export function actorEventJob(key: ActorKey, event: unknown, maxEventBytes: number, trace?: TraceCarrier): ActorEventJob {
  const data: ActorEventJobData = {
    agentUid: key.agentUid,
    sessionId: key.sessionId,
    payload: toJsonPayload(event, maxEventBytes),
    enqueuedAt: new Date().toISOString(),
    ...(trace ? { trace } : {}),
  };
  return { id: uuidv7(), data, singletonKey: formatActorKey(key) };
}
