/**
 * The console's list of actors (src/http/console/): one keyset page of `corral.actors`, each row
 * with what an operator scans for (state, queued events, input policy, last turn, epoch).
 *
 *  L1 Pages are keyset pages on `(agent_uid, session_id)` in byte order (`collate "C"`, the
 *     index `actors_console`), never `offset`: page 1,000 costs what page 1 does. An agent prefix
 *     is a range of that index (`>= prefix` and `< prefix || '~'`: every character an actor key
 *     may hold sorts below `~`), so a prefix never scans the actors outside it.
 *  L2 `running` is a live activation with an event in flight (a warm activation between turns is
 *     idle). A state filter starts from the rows that state is rare in, each through its own index:
 *     `running` from the live activations (`activations_live_lease`), `blocked` from the partial
 *     index `actors_console_blocked`, `dead_lettered` from the dead-letter queue (its own
 *     partition of pg-boss's job table). `idle` is most actors: read from `actors_console`, the
 *     others left out by their index probes.
 *  L3 A row's figures are per-row index probes, at most `limit` of each: queued events and dead
 *     letters (pg-boss's `job_i17`, on a queue's singleton keys of jobs before `active`: each
 *     probe says `state < 'active' and singleton_key is not null`, its predicate), the live activation, the last turn (the
 *     conversation's `turns_conversation`), the policy (`input_policies`' primary key).
 */
import { sql, type SQL } from '../orm.ts';
import type { DbOrTx } from '../client.ts';
import { toDate } from '../rows.ts';
import { ACTIVATION_LIVE } from '../schema.ts';
import { bossSql, type Queues } from '../boss/jobs.ts';

export const CONSOLE_ACTOR_STATES = ['idle', 'running', 'blocked', 'dead_lettered'] as const;
export type ConsoleActorState = (typeof CONSOLE_ACTOR_STATES)[number];

export interface ConsoleActorFilter {
  state?: ConsoleActorState | undefined;
  /** Actors whose agent_uid starts with this (L1). */
  agentPrefix?: string | undefined;
  /** With `agentPrefix` an exact agent: sessions starting with this. */
  sessionPrefix?: string | undefined;
}

export interface ConsoleActorRow {
  agentUid: string;
  sessionId: string;
  state: ConsoleActorState;
  epoch: number;
  blockedByEventId: string | null;
  /** Events waiting (created, retry): not the one in flight; a failed one holding its actor shows as `blocked`. */
  queued: number;
  deadLetters: number;
  /** Its own policy, its agent's, or null (the default applies). */
  policy: string | null;
  lastTurnAt: Date | null;
  /** The live activation's status while a turn is in flight. */
  liveStatus: string | null;
}

const c = bossSql.col;
const st = bossSql.state;
const LIVE_ACT = sql.raw(`(${ACTIVATION_LIVE.map((s) => `'${s}'`).join(', ')})`);
/** L1: above every character an actor key part may hold (A-Z a-z 0-9 . _ : @ -). */
const PREFIX_END = '~';

/** One page (L1, L2, L3), after the key `after` (exclusive), at most `limit` rows, in key order. */
export async function listConsoleActors(
  db: DbOrTx,
  q: Queues,
  filter: ConsoleActorFilter,
  page: { after?: { agentUid: string; sessionId: string } | undefined; limit: number },
): Promise<ConsoleActorRow[]> {
  const keyOf = (a: string, s: string) => sql`(${sql.raw(a)} collate "C", ${sql.raw(s)} collate "C")`;
  const where = (a: string, s: string): SQL[] => {
    const w: SQL[] = [];
    if (page.after) w.push(sql`${keyOf(a, s)} > (${page.after.agentUid} collate "C", ${page.after.sessionId} collate "C")`);
    if (filter.agentPrefix !== undefined && filter.sessionPrefix !== undefined) {
      w.push(sql`${sql.raw(a)} = ${filter.agentPrefix}`);
      w.push(sql`${sql.raw(s)} collate "C" >= ${filter.sessionPrefix} collate "C"`);
      w.push(sql`${sql.raw(s)} collate "C" < ${filter.sessionPrefix + PREFIX_END} collate "C"`);
    } else if (filter.agentPrefix !== undefined) {
      w.push(sql`${sql.raw(a)} collate "C" >= ${filter.agentPrefix} collate "C"`);
      w.push(sql`${sql.raw(a)} collate "C" < ${filter.agentPrefix + PREFIX_END} collate "C"`);
    }
    return w;
  };
  const and = (w: SQL[]) => (w.length === 0 ? sql`true` : sql.join(w, sql` and `));
  const order = sql`order by agent_uid collate "C", session_id collate "C" limit ${page.limit}`;

  // L2: the candidate keys of one page
  let keys: SQL;
  switch (filter.state) {
    case 'running':
      keys = sql`select v.agent_uid, v.session_id from corral.activations v
        where v.status in ${LIVE_ACT} and v.current_event_id is not null and ${and(where('v.agent_uid', 'v.session_id'))} ${order}`;
      break;
    case 'blocked':
      keys = sql`select a.agent_uid, a.session_id from corral.actors a
        where a.blocked_by_event_id is not null and ${and(where('a.agent_uid', 'a.session_id'))} ${order}`;
      break;
    case 'dead_lettered':
      keys = sql`select x.agent_uid, x.session_id from (
          select distinct split_part(d.${c.singleton_key}, '/', 1) as agent_uid, split_part(d.${c.singleton_key}, '/', 2) as session_id
            from ${bossSql.job(q.schema)} d where d.${c.name} = ${q.deadLetter} and d.${c.singleton_key} is not null) x
        where ${and(where('x.agent_uid', 'x.session_id'))} ${order}`;
      break;
    case 'idle':
      keys = sql`select a.agent_uid, a.session_id from corral.actors a
        where a.blocked_by_event_id is null and ${and(where('a.agent_uid', 'a.session_id'))}
          and not exists (select 1 from corral.activations v where v.agent_uid = a.agent_uid and v.session_id = a.session_id and v.status in ${LIVE_ACT} and v.current_event_id is not null)
          and not exists (select 1 from ${bossSql.job(q.schema)} d where d.${c.name} = ${q.deadLetter}
            and d.${c.singleton_key} = a.agent_uid || '/' || a.session_id and d.${c.state} < ${st.active} and d.${c.singleton_key} is not null)
        ${order}`;
      break;
    default:
      keys = sql`select a.agent_uid, a.session_id from corral.actors a where ${and(where('a.agent_uid', 'a.session_id'))} ${order}`;
  }

  const res = await db.execute<{
    agent_uid: string;
    session_id: string;
    epoch_counter: string | number | null;
    blocked_by_event_id: string | null;
    queued: number;
    dead_letters: number;
    policy: string | null;
    last_turn_at: unknown;
    live_status: string | null;
  }>(sql`
    with k as (${keys})
    select k.agent_uid, k.session_id, a.epoch_counter, a.blocked_by_event_id,
      (select count(*)::int from ${bossSql.job(q.schema)} j
        where j.${c.name} = ${q.events} and j.${c.singleton_key} = k.agent_uid || '/' || k.session_id
          and j.${c.state} < ${st.active} and j.${c.singleton_key} is not null) as queued,
      (select count(*)::int from ${bossSql.job(q.schema)} d
        where d.${c.name} = ${q.deadLetter} and d.${c.singleton_key} = k.agent_uid || '/' || k.session_id
          and d.${c.state} < ${st.active} and d.${c.singleton_key} is not null) as dead_letters,
      (select p.policy from corral.input_policies p
        where p.agent_uid = k.agent_uid and p.session_id in (k.session_id, '') order by p.session_id desc limit 1) as policy,
      (select max(t.started_at) from corral.conversations cv join corral.turns t on t.conversation_id = cv.id
        where cv.agent_uid = k.agent_uid and cv.session_id = k.session_id) as last_turn_at,
      (select v.status from corral.activations v
        where v.agent_uid = k.agent_uid and v.session_id = k.session_id and v.status in ${LIVE_ACT} and v.current_event_id is not null limit 1) as live_status
    from k left join corral.actors a on a.agent_uid = k.agent_uid and a.session_id = k.session_id
    order by k.agent_uid collate "C", k.session_id collate "C"`);
  return res.rows.map((r) => {
    const deadLetters = Number(r.dead_letters);
    const state: ConsoleActorState =
      r.live_status !== null ? 'running' : r.blocked_by_event_id !== null ? 'blocked' : deadLetters > 0 ? 'dead_lettered' : 'idle';
    return {
      agentUid: r.agent_uid,
      sessionId: r.session_id,
      state,
      epoch: Number(r.epoch_counter ?? 0),
      blockedByEventId: r.blocked_by_event_id,
      queued: Number(r.queued),
      deadLetters,
      policy: r.policy,
      lastTurnAt: toDate(r.last_turn_at),
      liveStatus: r.live_status,
    };
  });
}
