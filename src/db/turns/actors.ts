/** SQL for `corral.actors`: the durable epoch counter (I2) and the dead-letter block flag. */
import { and, eq, sql } from '../orm.ts';
import type { ActorKey } from '../../base/actor-key.ts';
import type { DbOrTx } from '../client.ts';
import { actors } from '../schema.ts';

export async function setBlockedBy(tx: DbOrTx, key: ActorKey, eventId: string | null): Promise<void> {
  await tx
    .insert(actors)
    .values({ agentUid: key.agentUid, sessionId: key.sessionId, blockedByEventId: eventId })
    .onConflictDoUpdate({
      target: [actors.agentUid, actors.sessionId],
      set: { blockedByEventId: eventId, updatedAt: sql`now()` },
    });
}

/** The last epoch issued to `key` (its durable counter, I2); 0 for an actor never activated. */
export async function lastEpochOf(db: DbOrTx, key: ActorKey): Promise<number> {
  const rows = await db
    .select({ epoch: actors.epochCounter })
    .from(actors)
    .where(and(eq(actors.agentUid, key.agentUid), eq(actors.sessionId, key.sessionId)));
  return rows[0]?.epoch ?? 0;
}
