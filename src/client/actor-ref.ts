/** How the client names an actor: `'agent/session'` or `{ agentUid, sessionId }`, checked like the CLI's. */
import { actorKey, parseActorKey, type ActorKey } from '../base/actor-key.ts';
import { CorralError } from '../base/errors.ts';

/** An actor: its key text `agent_uid/session_id`, or its two parts. */
export type ActorRef = string | { readonly agentUid: string; readonly sessionId: string };

/** The actor key of `ref`; `invalid_actor_key` when it is not one. */
export function toActorKey(ref: ActorRef): ActorKey {
  if (typeof ref === 'string') return parseActorKey(ref);
  if (ref !== null && typeof ref === 'object') {
    const { agentUid, sessionId } = ref as { agentUid?: unknown; sessionId?: unknown };
    return actorKey(agentUid as string, sessionId as string);
  }
  throw new CorralError('invalid_actor_key', `invalid actor ${String(ref)}: expected 'agent_uid/session_id' or { agentUid, sessionId }`);
}
