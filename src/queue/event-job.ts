/**
 * The job that carries one actor event: its data, its id (a UUIDv7: pg-boss breaks ties between
 * jobs of one transaction by id, so increasing ids keep events enqueued together in order, I4)
 * and its `singletonKey` (the actor key). Free of Drizzle and pg-boss so that a short command
 * can build one cheaply.
 */
import { v7 as uuidv7 } from 'uuid';
import { formatActorKey, type ActorKey } from '../base/actor-key.ts';
import { CorralError } from '../base/errors.ts';
import { unstorableReason } from '../base/json-safety.ts';

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

/**
 * The payload as it will be stored, checked before anything is written: JSON-serialisable,
 * within the shape limits of src/base/json-safety.ts (nested at most MAX_JSON_DEPTH deep, no NUL, no
 * lone surrogate, no number JSON cannot keep), and at most `maxBytes` of JSON. An event too large for the wire would otherwise hold a worker slot until
 * its lease ran out, on every retry.
 */
export function toJsonPayload(event: unknown, maxBytes: number): unknown {
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
  const payload = JSON.parse(text) as unknown;
  // what is stored, checked again: a `toJSON` may have made something the value did not hold
  const stored = unstorableReason(payload);
  if (stored) throw new CorralError('invalid_argument', `the event payload cannot be stored: ${stored}`);
  return payload;
}

export function actorEventJob(key: ActorKey, event: unknown, maxEventBytes: number): ActorEventJob {
  const data: ActorEventJobData = {
    agentUid: key.agentUid,
    sessionId: key.sessionId,
    payload: toJsonPayload(event, maxEventBytes),
    enqueuedAt: new Date().toISOString(),
  };
  return { id: uuidv7(), data, singletonKey: formatActorKey(key) };
}
