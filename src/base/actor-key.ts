/**
 * The actor key `{agent_uid, session_id}`: the identity of a long-lived session. Its text form
 * `agent_uid/session_id` is the pg-boss `singletonKey`, so it must be unambiguous: neither part
 * may contain `/`.
 */
import { CorralError } from './errors.ts';

export interface ActorKey {
  readonly agentUid: string;
  readonly sessionId: string;
}

/** What each part of an actor key is (also checked in SQL: src/db/enqueue/send-event.ts). */
export const ACTOR_PART = /^[A-Za-z0-9._:@-]{1,128}$/;
const PART = ACTOR_PART;

export function isValidActorPart(part: string): boolean {
  return PART.test(part);
}

export function actorKey(agentUid: string, sessionId: string): ActorKey {
  for (const [name, value] of [
    ['agent_uid', agentUid],
    ['session_id', sessionId],
  ] as const) {
    if (typeof value !== 'string' || !isValidActorPart(value)) {
      throw new CorralError(
        'invalid_actor_key',
        `invalid ${name} ${JSON.stringify(value)}: expected 1-128 characters of A-Z a-z 0-9 . _ : @ -`,
      );
    }
  }
  return { agentUid, sessionId };
}

/** Parses `agent_uid/session_id`. */
export function parseActorKey(text: string): ActorKey {
  const parts = typeof text === 'string' ? text.split('/') : [];
  if (parts.length !== 2) {
    throw new CorralError('invalid_actor_key', `invalid actor key ${JSON.stringify(text)}: expected <agent_uid>/<session_id>`);
  }
  return actorKey(parts[0]!, parts[1]!);
}

export function formatActorKey(key: ActorKey): string {
  return `${key.agentUid}/${key.sessionId}`;
}
