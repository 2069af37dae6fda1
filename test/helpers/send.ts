/**
 * Sending events in tests the way producers do: through the one enqueue (src/db/enqueue/send.ts,
 * `corral.send_events`), on a connection or inside a transaction of the test's own.
 */
import type { ActorKey } from '../../src/base/actor-key.ts';
import { sendEvents, sendEventsInBatches } from '../../src/db/enqueue/send.ts';
import type { StatementTarget } from '../../src/db/executor.ts';
import { DEFAULTS } from '../../src/config.ts';

export interface SentTestEvent {
  eventId: string;
  actorKey: ActorKey;
}

/** Sends one event to `key`; its id. */
export async function sendEvent(db: StatementTarget, key: ActorKey, data: unknown): Promise<SentTestEvent> {
  const [sent] = await sendEvents(db, [{ agentUid: key.agentUid, sessionId: key.sessionId, data }], {
    maxEventBytes: DEFAULTS.maxEventBytes,
  });
  return { eventId: sent!.eventId, actorKey: key };
}

/** Sends `events` in their order (any actors), as many calls of at most MAX_SEND_BATCH as they take. */
export async function sendMany(db: StatementTarget, events: readonly { key: ActorKey; event: unknown }[]): Promise<SentTestEvent[]> {
  const sent = await sendEventsInBatches(
    db,
    events.map((e) => ({ agentUid: e.key.agentUid, sessionId: e.key.sessionId, data: e.event })),
    { maxEventBytes: DEFAULTS.maxEventBytes },
  );
  return sent.map((s, i) => ({ eventId: s.eventId, actorKey: events[i]!.key }));
}
