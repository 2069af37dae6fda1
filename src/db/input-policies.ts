/**
 * Input policies (`corral.input_policies`, `corral policy`): what an event sent to a busy actor
 * does. An actor is busy while its queue holds a job of it that is not finished: queued, running,
 * waiting to retry, or failed and holding its key.
 *
 *  P1 The policy of an actor is its own row (agent, session), else its agent's (agent, ''), else
 *     the daemon's CORRAL_INPUT_POLICY, which the send functions embed (src/db/send-event.ts).
 *  P2 `reject` is decided in the send's transaction (`corral.send_events`): the actor's sends
 *     take a transaction-scoped advisory lock on its key, then look for a job of it that is not
 *     finished (`corral.actor_busy`); one found refuses the send (`actor_busy`, SQLSTATE CR423)
 *     and nothing is enqueued, idempotency key included. Two sends to an idle actor therefore
 *     cannot both pass: the second waits for the first's commit and then sees its job.
 *  P3 `queue` (the default) adds nothing to a send: no lock, no look at the queue.
 *  P4 Changing a policy never touches an event already sent: it decides the sends after it.
 */
import { ACTOR_PART } from '../actor-key.ts';
import type { DbOrTx } from './client.ts';
import { asc, sql } from './orm.ts';
import { inputPolicies } from './schema.ts';
import { INPUT_POLICIES, type InputPolicy } from './views.ts';

export { INPUT_POLICIES, type InputPolicy };

export interface InputPolicyRow {
  agentUid: string;
  /** null: every session of the agent. */
  sessionId: string | null;
  policy: InputPolicy;
  updatedAt: Date;
}

function checked(agentUid: string, sessionId: string | null, policy?: string): void {
  if (!ACTOR_PART.test(agentUid)) throw new Error(`an agent uid, not ${JSON.stringify(agentUid)}`);
  if (sessionId !== null && !ACTOR_PART.test(sessionId)) throw new Error(`a session id, not ${JSON.stringify(sessionId)}`);
  if (policy !== undefined && !(INPUT_POLICIES as readonly string[]).includes(policy)) throw new Error(`a policy, not ${policy}`);
}

/** A stored `session_id` as the API says it: '' (every session of the agent) is null. */
const sessionOf = (stored: string): string | null => (stored === '' ? null : stored);

/** The default the installed send functions embed; 'queue' before the daemon first installed them. */
const INSTALLED_DEFAULT = sql`case when to_regprocedure('corral.default_input_policy()') is null then 'queue'
                                   else corral.default_input_policy() end`;

const rowOf = (r: { agent_uid: string; session_id: string; policy: string; updated_at: Date | string }): InputPolicyRow => ({
  agentUid: r.agent_uid,
  sessionId: sessionOf(r.session_id),
  policy: r.policy as InputPolicy,
  updatedAt: new Date(r.updated_at),
});

/** Sets (or replaces) the policy of an agent (`sessionId` null) or of one actor. Returns it, and the policy it replaced. */
export async function setInputPolicy(
  db: DbOrTx,
  agentUid: string,
  sessionId: string | null,
  policy: InputPolicy,
): Promise<InputPolicyRow & { previous: InputPolicy | null }> {
  checked(agentUid, sessionId, policy);
  const session = sessionId ?? '';
  const res = await db.execute<{
    agent_uid: string;
    session_id: string;
    policy: string;
    updated_at: Date | string;
    previous: string | null;
  }>(sql`
    with old as (select policy from corral.input_policies where agent_uid = ${agentUid} and session_id = ${session})
    insert into corral.input_policies as p (agent_uid, session_id, policy, updated_at)
    values (${agentUid}, ${session}, ${policy}, now())
    on conflict (agent_uid, session_id) do update set policy = excluded.policy, updated_at = now()
    returning p.agent_uid, p.session_id, p.policy, p.updated_at, (select policy from old) as previous`);
  const r = res.rows[0]!;
  return { ...rowOf(r), previous: (r.previous as InputPolicy | null) ?? null };
}

/** Removes the policy of an agent or an actor. Returns the policy it had, or null when it had none. */
export async function clearInputPolicy(db: DbOrTx, agentUid: string, sessionId: string | null): Promise<InputPolicy | null> {
  checked(agentUid, sessionId);
  const res = await db.execute<{ policy: string }>(
    sql`delete from corral.input_policies where agent_uid = ${agentUid} and session_id = ${sessionId ?? ''} returning policy`,
  );
  return (res.rows[0]?.policy as InputPolicy | undefined) ?? null;
}

/** Every policy set, by agent, the agent's own first. */
export async function listInputPolicies(db: DbOrTx): Promise<InputPolicyRow[]> {
  const rows = await db.select().from(inputPolicies).orderBy(asc(inputPolicies.agentUid), asc(inputPolicies.sessionId));
  return rows.map((r) => ({
    agentUid: r.agentUid,
    sessionId: sessionOf(r.sessionId),
    policy: r.policy,
    updatedAt: r.updatedAt,
  }));
}

/** The policy of actors and agents without one: the daemon's CORRAL_INPUT_POLICY, as the installed send functions embed it ('queue' before they are). */
export async function defaultInputPolicy(db: DbOrTx): Promise<InputPolicy> {
  const res = await db.execute<{ policy: string }>(sql`select ${INSTALLED_DEFAULT} as policy`);
  return (res.rows[0]?.policy ?? 'queue') as InputPolicy;
}

/** An actor's policy and where it comes from (P1). */
export interface EffectiveInputPolicy {
  policy: InputPolicy;
  /** `actor`: its own row; `agent`: its agent's; `default`: the daemon's CORRAL_INPUT_POLICY. */
  from: 'actor' | 'agent' | 'default';
}

/**
 * P1 for one actor, as its sends decide it: the default is the one the installed send functions
 * embed (`corral.default_input_policy()`); 'queue' before the daemon first installed them.
 */
export async function effectiveInputPolicy(db: DbOrTx, agentUid: string, sessionId: string): Promise<EffectiveInputPolicy> {
  const res = await db.execute<{ session_id: string | null; policy: string }>(sql`
    select p.session_id, p.policy from corral.input_policies p
     where p.agent_uid = ${agentUid} and p.session_id in (${sessionId}, '')
    union all
    select null, ${INSTALLED_DEFAULT}`);
  const own = res.rows.find((r) => r.session_id === sessionId);
  if (own) return { policy: own.policy as InputPolicy, from: 'actor' };
  const agent = res.rows.find((r) => r.session_id === '');
  if (agent) return { policy: agent.policy as InputPolicy, from: 'agent' };
  return { policy: (res.rows.find((r) => r.session_id === null)?.policy ?? 'queue') as InputPolicy, from: 'default' };
}
