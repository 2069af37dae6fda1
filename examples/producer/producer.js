// @ts-check
/**
 * A producer: an application that sends an event to an actor and waits until a worker's turn for
 * it commits. It uses only corral's public exports (`corral`).
 *
 *   DATABASE_URL   the daemon's PostgreSQL (unset: the embedded one under CORRAL_HOME, as the daemon)
 *   EXAMPLE_ACTOR  the actor, `agent_uid/session_id` (default `example-agent/session-1`)
 *
 *   node producer.js 'hello'
 */
import { connect, parseActorKey } from 'corral';

const actor = parseActorKey(process.env.EXAMPLE_ACTOR ?? 'example-agent/session-1');
const text = process.argv[2] ?? 'hello';

const client = await connect(process.env.DATABASE_URL ? { databaseUrl: process.env.DATABASE_URL } : {});
try {
  // The same idempotency key twice is one event: a producer that retries after a crash sends nothing twice.
  const { eventId } = await client.send(actor, { text }, { idempotencyKey: `example-${text}` });
  const turn = await client.waitForTurn(eventId, { timeoutMs: 60_000 });
  console.log(JSON.stringify({ eventId, turn }));
} finally {
  await client.close();
}
