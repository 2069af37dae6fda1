/**
 * Input policies for operators and applications (`corral policy set | list | clear`, the
 * client's `setInputPolicy`): what an event sent to a busy actor does, for an agent (every
 * session of it) or one actor (src/db/input-policies.ts says exactly when a send is refused).
 *
 * The input is checked before anything touches the database: a malformed target is
 * `invalid_actor_key`, a policy that does not exist or is not available yet `invalid_argument`.
 */
import { isValidActorPart, parseActorKey } from '../actor-key.ts';
import type { DbOrTx } from '../db/client.ts';
import { clearInputPolicy, defaultInputPolicy, listInputPolicies, setInputPolicy, type InputPolicyRow } from '../db/input-policies.ts';
import { AVAILABLE_INPUT_POLICIES, INPUT_POLICIES, type InputPolicy } from '../db/views.ts';
import { CorralError } from '../errors.ts';

export { AVAILABLE_INPUT_POLICIES, INPUT_POLICIES, type InputPolicy };

/** An agent (every session of it, `sessionId` null) or one actor. */
export interface PolicyTarget {
  agentUid: string;
  sessionId: string | null;
}

/** `support-bot` (the agent) or `support-bot/s-42` (one actor); `invalid_actor_key` otherwise. */
export function parsePolicyTarget(text: string): PolicyTarget {
  if (!text.includes('/')) {
    if (isValidActorPart(text)) return { agentUid: text, sessionId: null };
    throw new CorralError(
      'invalid_actor_key',
      `invalid agent_uid ${JSON.stringify(text)}: expected 1-128 characters of A-Z a-z 0-9 . _ : @ - (or <agent_uid>/<session_id> for one actor)`,
    );
  }
  const key = parseActorKey(text);
  return { agentUid: key.agentUid, sessionId: key.sessionId };
}

/** A policy that may be set today; `invalid_argument` for another word, or one not available yet. */
export function parsePolicy(text: string): InputPolicy {
  if ((AVAILABLE_INPUT_POLICIES as readonly string[]).includes(text)) return text as InputPolicy;
  if ((INPUT_POLICIES as readonly string[]).includes(text)) {
    throw new CorralError(
      'invalid_argument',
      `input policy ${text} is not available yet: choose one of ${AVAILABLE_INPUT_POLICIES.join(', ')}`,
    );
  }
  throw new CorralError(
    'invalid_argument',
    `unknown input policy ${JSON.stringify(text)}: choose one of ${AVAILABLE_INPUT_POLICIES.join(', ')}`,
  );
}

export interface PolicyView {
  /** `agent` or `agent/session`. */
  target: string;
  agentUid: string;
  sessionId: string | null;
  policy: InputPolicy;
  updatedAt: string;
}

/** `agent` or `agent/session`. */
export const targetText = (t: PolicyTarget): string => (t.sessionId === null ? t.agentUid : `${t.agentUid}/${t.sessionId}`);

const viewOf = (r: InputPolicyRow): PolicyView => ({
  target: targetText(r),
  agentUid: r.agentUid,
  sessionId: r.sessionId,
  policy: r.policy,
  updatedAt: r.updatedAt.toISOString(),
});

/** Sets the policy of `target` (checked input: `parsePolicyTarget`, `parsePolicy`). Returns it, and the policy it replaced (null: none of its own). */
export async function setPolicy(
  db: DbOrTx,
  target: PolicyTarget,
  policy: InputPolicy,
): Promise<PolicyView & { previous: InputPolicy | null }> {
  const r = await setInputPolicy(db, target.agentUid, target.sessionId, policy);
  return { ...viewOf(r), previous: r.previous };
}

/** Every policy set, by agent (the agent's own before its actors'), and the default of the others. */
export async function listPolicies(db: DbOrTx): Promise<{ policies: PolicyView[]; default: InputPolicy }> {
  const [rows, fallback] = await Promise.all([listInputPolicies(db), defaultInputPolicy(db)]);
  return { policies: rows.map(viewOf), default: fallback };
}

/** Removes the policy of `target`: the agent's or the default applies again. Returns the one it had; `nothing_matched` when it had none. */
export async function clearPolicy(db: DbOrTx, target: PolicyTarget): Promise<InputPolicy> {
  const had = await clearInputPolicy(db, target.agentUid, target.sessionId);
  if (had === null) throw new CorralError('nothing_matched', `${targetText(target)} has no input policy of its own`);
  return had;
}
