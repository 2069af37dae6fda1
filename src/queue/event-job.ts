/**
 * The job that carries one actor event: its data, its id (a UUIDv7: pg-boss breaks ties between
 * jobs of one transaction by id, so increasing ids keep events enqueued together in order, I4)
 * and its `singletonKey` (the actor key). Free of Drizzle and pg-boss so that a short command
 * can build one cheaply.
 */
import { v7 as uuidv7 } from 'uuid';
import { formatActorKey, type ActorKey } from '../actor-key.ts';
import { CorralError } from '../errors.ts';

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

export interface ActorEventJob {
  id: string;
  data: ActorEventJobData;
  singletonKey: string;
}

function toJsonPayload(event: unknown): unknown {
  if (event === undefined) throw new CorralError('invalid_argument', 'an event payload is required');
  try {
    return JSON.parse(JSON.stringify(event)) as unknown;
  } catch (e) {
    throw new CorralError('invalid_argument', 'the event payload must be JSON-serialisable', { cause: e });
  }
}

export function actorEventJob(key: ActorKey, event: unknown): ActorEventJob {
  const data: ActorEventJobData = {
    agentUid: key.agentUid,
    sessionId: key.sessionId,
    payload: toJsonPayload(event),
    enqueuedAt: new Date().toISOString(),
  };
  return { id: uuidv7(), data, singletonKey: formatActorKey(key) };
}
