/** SQL for `corral.actors`: the durable epoch counter (I2) and the dead-letter block flag. */
import { sql } from './orm.ts';
import type { ActorKey } from '../actor-key.ts';
import type { DbOrTx } from './client.ts';
import { actors } from './schema.ts';

export async function setBlockedBy(tx: DbOrTx, key: ActorKey, eventId: string | null): Promise<void> {
  await tx
    .insert(actors)
    .values({ agentUid: key.agentUid, sessionId: key.sessionId, blockedByEventId: eventId })
    .onConflictDoUpdate({
      target: [actors.agentUid, actors.sessionId],
      set: { blockedByEventId: eventId, updatedAt: sql`now()` },
    });
}
