/**
 * The conversation context of `turn_start` (docs/protocol.md §5.3): loaded for a whole begin
 * batch with ONE query (src/db/history.ts) after the batch's transaction, and turned into the
 * wire form. The transcript of an actor cannot change between the two: only the commit of the
 * actor's one live turn writes messages, and that turn is the one just begun.
 */
import type { DbOrTx } from '../db/client.ts';
import { loadContextMany, type ConversationContext } from '../db/history.ts';
import type { TurnContextWire } from '../fabric/protocol.ts';
import type { StartedTurn } from './turns.ts';

export interface ContextLimits {
  /** 0 = no context is sent. */
  maxMessages: number;
  maxBytes: number;
}

/**
 * Sets `context` on each begun turn (one query for the batch). Returns `turns`; never throws:
 * the turns are already begun (committed), and a failure here must not make the caller begin
 * them again. Without context a worker can still read the history over RPC.
 */
export async function withContext(
  db: DbOrTx,
  turns: StartedTurn[],
  limits: ContextLimits | undefined,
  onError: (e: unknown) => void,
): Promise<StartedTurn[]> {
  if (!limits || limits.maxMessages <= 0 || turns.length === 0) return turns;
  try {
    const found = await loadContextMany(
      db,
      turns.map((t) => t.fence),
      limits,
    );
    for (const t of turns) t.context = found.get(`${t.fence.agentUid}/${t.fence.sessionId}`);
  } catch (e) {
    onError(e);
  }
  return turns;
}

export function contextToWire(c: ConversationContext): TurnContextWire {
  return {
    conversation_id: c.conversationId,
    messages: c.messages.map((m) => ({ seq: m.seq, role: m.role, content: (m.content ?? null) as never })),
    ...(c.firstSeq === undefined ? {} : { first_seq: c.firstSeq }),
    has_more: c.hasMore,
    current_seq: c.nextSeq,
  };
}
