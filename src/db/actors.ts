/** SQL for `corral.actors`: the durable epoch counter (I2) and the dead-letter block flag. */
import { sql } from 'drizzle-orm';
import type { ActorKey } from '../actor-key.ts';
import type { DbOrTx } from './client.ts';
import { actors } from './schema.ts';

/**
 * Takes the next epoch of each of `keys` (creating an actor row on first use), in one statement,
 * in actor-key order (so two callers lock actor rows in the same order). The row lock serialises
 * concurrent activation attempts for one actor; the counter never decreases, so an epoch is never
 * reused even if every activation row is lost. Returns each new epoch by key (`agent/session`).
 */
export async function nextEpochsMany(tx: DbOrTx, keys: readonly ActorKey[]): Promise<Map<string, number>> {
  if (keys.length === 0) return new Map();
  const sorted = [...keys].sort((a, b) => (a.agentUid === b.agentUid ? cmp(a.sessionId, b.sessionId) : cmp(a.agentUid, b.agentUid)));
  const rows = await tx
    .insert(actors)
    .values(sorted.map((k) => ({ agentUid: k.agentUid, sessionId: k.sessionId, epochCounter: 1 })))
    .onConflictDoUpdate({
      target: [actors.agentUid, actors.sessionId],
      set: { epochCounter: sql`${actors.epochCounter} + 1`, updatedAt: sql`now()` },
    })
    .returning({ agentUid: actors.agentUid, sessionId: actors.sessionId, epoch: actors.epochCounter });
  return new Map(rows.map((r) => [`${r.agentUid}/${r.sessionId}`, r.epoch]));
}

const cmp = (a: string, b: string) => (a < b ? -1 : a > b ? 1 : 0);

export async function setBlockedBy(tx: DbOrTx, key: ActorKey, eventId: string | null): Promise<void> {
  await tx
    .insert(actors)
    .values({ agentUid: key.agentUid, sessionId: key.sessionId, blockedByEventId: eventId })
    .onConflictDoUpdate({
      target: [actors.agentUid, actors.sessionId],
      set: { blockedByEventId: eventId, updatedAt: sql`now()` },
    });
}
