/**
 * Where one event stands, by its id, from the database alone (the client's `waitForTurn`): its
 * committed turn, its job in the actor queue, or its copy in the dead-letter queue. pg-boss's
 * names come from src/db/boss/internals.ts through `bossSql` (S8 there).
 */
import type { DbOrTx } from '../client.ts';
import { bossSql, type Queues } from '../boss/jobs.ts';
import { JOB_STATE, type JobState } from '../boss/internals.ts';
import { sql } from '../orm.ts';
import { toDate } from '../rows.ts';
import type { EmittedEntry } from './transcript.ts';
import type { MessageRole } from '../schema.ts';
import type { CommittedTurnView } from '../views.ts';

export type { CommittedTurnView } from '../views.ts';

const c = bossSql.col;

/**
 * `committed`: it has a succeeded turn. `pending`: its job waits, runs or waits to be retried.
 * `cancelled`: its turn was cancelled (`corral cancel`). `dead_lettered`: its retries are spent.
 * `unknown`: no such event (never sent, not committed yet, or gone with the retention: its job,
 * or its turn by the agent's transcript retention).
 */
export type EventState = 'committed' | 'pending' | 'cancelled' | 'dead_lettered' | 'unknown';

export interface EventStatus {
  state: EventState;
  /** The event's actor, when known (`agent_uid/session_id`). */
  actor: string | undefined;
  /** The job's state in the actor queue, when it is there. */
  jobState: JobState | undefined;
}

/** Where event `eventId` stands. */
export async function eventStatus(db: DbOrTx, q: Queues, eventId: string): Promise<EventStatus> {
  const res = await db.execute<{
    committed_actor: string | null;
    state: JobState | null;
    actor: string | null;
    cancelled: boolean | null;
    dead_actor: string | null;
  }>(sql`
    with ev as (
      select ${c.state}::text as state, ${c.singleton_key} as actor, (${c.output}->>'cancelled') = 'true' as cancelled
        from ${bossSql.job(q.schema)}
       where ${c.name} = ${q.events} and ${c.id} = ${eventId}::uuid
    )
    select
      (select cv.agent_uid || '/' || cv.session_id
         from ${committedTurnRows(eventId)} t join corral.conversations cv on cv.id = t.conversation_id) as committed_actor,
      (select state from ev) as state,
      (select actor from ev) as actor,
      (select cancelled from ev) as cancelled,
      case when not exists (select 1 from ev) then
        (select ${c.singleton_key} from ${bossSql.job(q.schema)}
          where ${c.name} = ${q.deadLetter} and ${c.source_id} = ${eventId}::uuid limit 1)
      end as dead_actor`);
  const r = res.rows[0]!;
  const jobState = r.state ?? undefined;
  if (r.committed_actor) return { state: 'committed', actor: r.committed_actor, jobState };
  if (jobState === JOB_STATE.created || jobState === JOB_STATE.retry || jobState === JOB_STATE.active) {
    return { state: 'pending', actor: r.actor ?? undefined, jobState };
  }
  // a commit writes the succeeded turn and completes the job in one transaction, and a cancel
  // completes it with `{ cancelled: true }`: a completed job of neither had its turn deleted by
  // transcript retention (src/db/operations/transcript-retention.ts), which is `unknown`
  if (jobState === JOB_STATE.cancelled || (jobState === JOB_STATE.completed && r.cancelled === true))
    return { state: 'cancelled', actor: r.actor ?? undefined, jobState };
  // failed and kept in the actor queue: dead-letter mode `block`
  if (jobState === JOB_STATE.failed) return { state: 'dead_lettered', actor: r.actor ?? undefined, jobState };
  if (r.dead_actor) return { state: 'dead_lettered', actor: r.dead_actor, jobState };
  return { state: 'unknown', actor: undefined, jobState };
}

/**
 * The succeeded turn of `eventId` as a subquery (at most one row): the turn of the event itself,
 * else the batch that took it after its head (src/db/turns/batches.ts; index `turns_coalesced_succeeded`).
 */
function committedTurnRows(eventId: string) {
  const member = JSON.stringify([{ event_id: eventId.toLowerCase() }]);
  return sql`(select * from (
      select t.* from corral.turns t where t.event_id = ${eventId}::uuid and t.status = 'succeeded'
      union all
      select t.* from corral.turns t
       where t.coalesced @> ${member}::jsonb and t.status = 'succeeded' and t.coalesced is not null) x limit 1)`;
}

/** The succeeded turn of `eventId` (undefined: none). */
export async function committedTurnOf(db: DbOrTx, eventId: string): Promise<CommittedTurnView | undefined> {
  const res = await db.execute<{
    turn_id: string;
    agent_uid: string;
    session_id: string;
    actor_epoch: number | string;
    attempt: number;
    worker_id: string | null;
    started_at: unknown;
    finished_at: unknown;
    output: unknown;
    emitted: unknown;
    seq: number | null;
    role: MessageRole | null;
    content: unknown;
    created_at: unknown;
  }>(sql`
    select t.id as turn_id, cv.agent_uid, cv.session_id, t.actor_epoch, t.attempt, t.worker_id, t.started_at, t.finished_at,
           t.output, t.emitted, m.seq, m.role, m.content, m.created_at
      from ${committedTurnRows(eventId)} t
      join corral.conversations cv on cv.id = t.conversation_id
      left join corral.messages m on m.turn_id = t.id
     order by m.seq`);
  const first = res.rows[0];
  if (!first) return undefined;
  return {
    eventId,
    actor: { agentUid: first.agent_uid, sessionId: first.session_id },
    turnId: first.turn_id,
    actorEpoch: Number(first.actor_epoch),
    attempt: first.attempt,
    workerId: first.worker_id,
    startedAt: toDate(first.started_at)!,
    finishedAt: toDate(first.finished_at)!,
    messages: res.rows
      .filter((r) => r.seq !== null)
      .map((r) => ({ seq: r.seq!, role: r.role!, content: r.content, createdAt: toDate(r.created_at)! })),
    output: first.output ?? null,
    emitted: Array.isArray(first.emitted) ? (first.emitted as EmittedEntry[]) : [],
  };
}
