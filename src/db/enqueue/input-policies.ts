/**
 * Input policies (`corral.input_policies`, `corral policy`): what an event sent to a busy actor
 * does. An actor is busy while its queue holds a job of it that is not finished: queued, running,
 * waiting to retry, or failed and holding its key.
 *
 *  P1 The policy of an actor is its own row (agent, session), else its agent's (agent, ''), else
 *     the daemon's CORRAL_INPUT_POLICY, which the send functions embed (src/db/enqueue/send-event.ts).
 *  P2 `reject` is decided in the send's transaction (`corral.send_events`): the actor's sends
 *     take a transaction-scoped advisory lock on its key, then look for a job of it that is not
 *     finished (`corral.actor_busy`); one found refuses the send (`actor_busy`, SQLSTATE CR423)
 *     and nothing is enqueued, idempotency key included. Two sends to an idle actor therefore
 *     cannot both pass: the second waits for the first's commit and then sees its job.
 *  P3 `queue` (the default) adds nothing to a send: no lock, no look at the queue.
 *  P4 `coalesce` (src/db/turns/batches.ts) lets a turn take the events waiting behind its own, at most
 *     `max_events` (default 20) and `max_bytes` of payload; with `debounce_ms`, a send to an actor
 *     with no turn running holds the actor's waiting events until no new one came for that long,
 *     but no longer than `max_wait_ms` after the first of them (the send moves their start time,
 *     under the same advisory lock as P2). The columns are null for other policies.
 *  P5 Changing a policy never touches an event already sent: it decides the sends after it, and
 *     the batches formed after it (a retry keeps its batch, B3).
 */
import { ACTOR_PART } from '../../base/actor-key.ts';
import type { DbOrTx } from '../client.ts';
import { asc, sql } from '../orm.ts';
import { inputPolicies } from '../schema.ts';
import { INPUT_POLICIES, type InputPolicy, type InputPolicyOptions } from '../views.ts';

export { INPUT_POLICIES, type InputPolicy, type InputPolicyOptions };

export interface InputPolicyRow {
  agentUid: string;
  /** null: every session of the agent. */
  sessionId: string | null;
  policy: InputPolicy;
  options: InputPolicyOptions;
  updatedAt: Date;
}

type StoredRow = {
  agent_uid: string;
  session_id: string;
  policy: string;
  debounce_ms: number | null;
  max_wait_ms: number | null;
  max_events: number | null;
  max_bytes: number | null;
  updated_at: Date | string;
};

const optionsOf = (r: Pick<StoredRow, 'debounce_ms' | 'max_wait_ms' | 'max_events' | 'max_bytes'>): InputPolicyOptions => ({
  ...(r.debounce_ms === null ? {} : { debounceMs: r.debounce_ms }),
  ...(r.max_wait_ms === null ? {} : { maxWaitMs: r.max_wait_ms }),
  ...(r.max_events === null ? {} : { maxEvents: r.max_events }),
  ...(r.max_bytes === null ? {} : { maxBytes: r.max_bytes }),
});

function checked(agentUid: string, sessionId: string | null, policy?: string): void {
  if (!ACTOR_PART.test(agentUid)) throw new Error(`an agent uid, not ${JSON.stringify(agentUid)}`);
  if (sessionId !== null && !ACTOR_PART.test(sessionId)) throw new Error(`a session id, not ${JSON.stringify(sessionId)}`);
  if (policy !== undefined && !(INPUT_POLICIES as readonly string[]).includes(policy)) throw new Error(`a policy, not ${policy}`);
}

/** A stored `session_id` as the API says it: '' (every session of the agent) is null. */
const sessionOf = (stored: string): string | null => (stored === '' ? null : stored);

/**
 * P5: the events a debounce holds for the target, made due now (`corral.release_held`, installed
 * with the send functions; nothing to release before they are), in the transaction of the change.
 */
async function releaseHeld(db: DbOrTx, agentUid: string, sessionId: string | null): Promise<void> {
  const installed = await db.execute<{ ok: boolean }>(sql`select to_regprocedure('corral.release_held(text, text)') is not null as ok`);
  if (installed.rows[0]?.ok) await db.execute(sql`select corral.release_held(${agentUid}, ${sessionId}::text)`);
}

/** The default the installed send functions embed; 'queue' before the daemon first installed them. */
const INSTALLED_DEFAULT = sql`case when to_regprocedure('corral.default_input_policy()') is null then 'queue'
                                   else corral.default_input_policy() end`;

const rowOf = (r: StoredRow): InputPolicyRow => ({
  agentUid: r.agent_uid,
  sessionId: sessionOf(r.session_id),
  policy: r.policy as InputPolicy,
  options: optionsOf(r),
  updatedAt: new Date(r.updated_at),
});

/** Sets (or replaces) the policy of an agent (`sessionId` null) or of one actor. Returns it, and the policy it replaced. */
export async function setInputPolicy(
  db: DbOrTx,
  agentUid: string,
  sessionId: string | null,
  policy: InputPolicy,
  options: InputPolicyOptions = {},
): Promise<InputPolicyRow & { previous: InputPolicy | null }> {
  checked(agentUid, sessionId, policy);
  const session = sessionId ?? '';
  const o = (v: number | undefined) => v ?? null;
  const res = await db.execute<StoredRow & { previous: string | null }>(sql`
    with old as (select policy from corral.input_policies where agent_uid = ${agentUid} and session_id = ${session})
    insert into corral.input_policies as p
      (agent_uid, session_id, policy, debounce_ms, max_wait_ms, max_events, max_bytes, updated_at)
    values (${agentUid}, ${session}, ${policy}, ${o(options.debounceMs)}::int, ${o(options.maxWaitMs)}::int,
            ${o(options.maxEvents)}::int, ${o(options.maxBytes)}::int, now())
    on conflict (agent_uid, session_id) do update
      set policy = excluded.policy, debounce_ms = excluded.debounce_ms, max_wait_ms = excluded.max_wait_ms,
          max_events = excluded.max_events, max_bytes = excluded.max_bytes, updated_at = now()
    returning p.agent_uid, p.session_id, p.policy, p.debounce_ms, p.max_wait_ms, p.max_events, p.max_bytes, p.updated_at,
              (select policy from old) as previous`);
  await releaseHeld(db, agentUid, sessionId);
  const r = res.rows[0]!;
  return { ...rowOf(r), previous: (r.previous as InputPolicy | null) ?? null };
}

/** Removes the policy of an agent or an actor. Returns the policy it had, or null when it had none. */
export async function clearInputPolicy(db: DbOrTx, agentUid: string, sessionId: string | null): Promise<InputPolicy | null> {
  checked(agentUid, sessionId);
  const res = await db.execute<{ policy: string }>(
    sql`delete from corral.input_policies where agent_uid = ${agentUid} and session_id = ${sessionId ?? ''} returning policy`,
  );
  if (res.rows.length > 0) await releaseHeld(db, agentUid, sessionId);
  return (res.rows[0]?.policy as InputPolicy | undefined) ?? null;
}

/** Every policy set, by agent, the agent's own first. */
export async function listInputPolicies(db: DbOrTx): Promise<InputPolicyRow[]> {
  const rows = await db.select().from(inputPolicies).orderBy(asc(inputPolicies.agentUid), asc(inputPolicies.sessionId));
  return rows.map((r) => ({
    agentUid: r.agentUid,
    sessionId: sessionOf(r.sessionId),
    policy: r.policy,
    options: optionsOf({ debounce_ms: r.debounceMs, max_wait_ms: r.maxWaitMs, max_events: r.maxEvents, max_bytes: r.maxBytes }),
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
  /** A batching policy's options as set (P4); empty for the default. */
  options: InputPolicyOptions;
  /** `actor`: its own row; `agent`: its agent's; `default`: the daemon's CORRAL_INPUT_POLICY. */
  from: 'actor' | 'agent' | 'default';
}

/**
 * P1 for one actor, as its sends decide it: the default is the one the installed send functions
 * embed (`corral.default_input_policy()`); 'queue' before the daemon first installed them.
 */
export async function effectiveInputPolicy(db: DbOrTx, agentUid: string, sessionId: string): Promise<EffectiveInputPolicy> {
  const res = await db.execute<Omit<StoredRow, 'agent_uid' | 'updated_at' | 'session_id'> & { session_id: string | null }>(sql`
    select p.session_id, p.policy, p.debounce_ms, p.max_wait_ms, p.max_events, p.max_bytes from corral.input_policies p
     where p.agent_uid = ${agentUid} and p.session_id in (${sessionId}, '')
    union all
    select null, ${INSTALLED_DEFAULT}, null, null, null, null`);
  const own = res.rows.find((r) => r.session_id === sessionId);
  if (own) return { policy: own.policy as InputPolicy, options: optionsOf(own), from: 'actor' };
  const agent = res.rows.find((r) => r.session_id === '');
  if (agent) return { policy: agent.policy as InputPolicy, options: optionsOf(agent), from: 'agent' };
  return { policy: (res.rows.find((r) => r.session_id === null)?.policy ?? 'queue') as InputPolicy, options: {}, from: 'default' };
}
