/**
 * Transcript retention, per agent (`corral.transcript_retention`, `corral retention`): an agent
 * with a policy keeps its transcript for `keep_seconds`; every other agent keeps it forever.
 *
 * What "forget what is older than N" means here (docs/data-model.md):
 *  R1 The unit is a finished turn with all its messages. Every message belongs to a turn
 *     (`messages.turn_id` is not null) and is written in the transaction that settles it: the
 *     commit writes the turn's `user` message (its input) and the worker's messages, a cancel its
 *     `user` message alone; a failed turn writes none. So a turn goes, with its input, output,
 *     error, emitted events, steers and messages, once it finished (`finished_at`) more than the
 *     agent's window ago. No message of it survives it: a context never starts with the result
 *     of a tool call whose request is gone.
 *  R2 What goes is the start of each conversation, never a piece in its middle. An actor's turns
 *     run one at a time and each writes its messages as it finishes, after the turn before it
 *     finished: message order is the order of `finished_at`. The turns past the window are
 *     therefore a prefix of the conversation, and each batch takes a conversation's oldest
 *     first. What stays is a run of messages without gaps, from the first kept turn's `user`
 *     message to the latest: a later turn's context is the conversation's latest messages, as
 *     ever, only without the forgotten start.
 *  R3 A `started` turn is never deleted (it is live, or recovery still has to settle it), nor
 *     anything of an agent without a policy: the statement names its agent and checks, in its
 *     own snapshot, that the policy it runs under is still the agent's.
 *  R4 The conversation row stays, with its `next_seq`: seqs are never reused, so a message
 *     number means one message forever. `pruned_through` records the highest seq deleted, in the
 *     statement that deletes it; a daemon's cached context is trusted only when the first message
 *     it holds is above it (src/db/turns/turn-rows.ts, C1 of src/runtime/context-cache.ts), so
 *     forgotten messages never reach a worker from memory.
 *  R5 Each batch is one statement (`skip locked`: turns another transaction holds are left for the
 *     next pass), so a crash leaves either the whole batch deleted or nothing. A batch takes at
 *     most `limit` turns, with their messages.
 *  R6 A pass with nothing due reads index ranges: the agent's conversations
 *     (`conversations_actor`) and, in each, the finished turns older than the window
 *     (`turns_ended`, on conversation and `finished_at`). The cutoff and the agent are
 *     literals, so a generic plan sees how few rows they select.
 *  R7 A pass reads the agent's conversations only when something may be due: after draining an
 *     agent it records `due_at`, when its oldest finished turn left will pass the window
 *     (`markTranscriptChecked`); until then `transcriptRetentionDue` leaves the agent out, so a pass
 *     with nothing due reads one row per policy, not one index probe per session. A turn that
 *     finishes later is due later than the oldest one already there; setting a policy clears
 *     `due_at`, so a shorter window takes effect at the next pass.
 */
import { ACTOR_PART } from '../../base/actor-key.ts';
import type { DbOrTx } from '../client.ts';
import { asc, sql } from '../orm.ts';
import { ageCutoff, sqlList, transcriptRetention, TURN_FINISHED } from '../schema.ts';

/** The longest window a policy takes: the column is a 32-bit integer of seconds (about 68 years). */
export const MAX_KEEP_SECONDS = 2_147_483_647;

export interface TranscriptRetention {
  agentUid: string;
  keepSeconds: number;
  updatedAt: Date;
}

function checkedPolicy(agentUid: string, keepSeconds: number): void {
  if (!ACTOR_PART.test(agentUid)) throw new Error(`an agent uid, not ${JSON.stringify(agentUid)}`);
  if (!Number.isInteger(keepSeconds) || keepSeconds < 1 || keepSeconds > MAX_KEEP_SECONDS) {
    throw new Error(`a window of 1..${MAX_KEEP_SECONDS} whole seconds, not ${keepSeconds}`);
  }
}

/** Sets (or replaces) the policy of `agentUid`. Returns it, and the window it replaced, if any. */
export async function setTranscriptRetention(
  db: DbOrTx,
  agentUid: string,
  keepSeconds: number,
): Promise<TranscriptRetention & { previousKeepSeconds: number | null }> {
  checkedPolicy(agentUid, keepSeconds);
  const res = await db.execute<{ agent_uid: string; keep_seconds: number; updated_at: Date | string; previous: number | null }>(sql`
    with old as (select keep_seconds from corral.transcript_retention where agent_uid = ${agentUid})
    insert into corral.transcript_retention as r (agent_uid, keep_seconds, updated_at)
    values (${agentUid}, ${keepSeconds}, now())
    on conflict (agent_uid) do update set keep_seconds = excluded.keep_seconds, updated_at = now(), due_at = null
    returning r.agent_uid, r.keep_seconds, r.updated_at, (select keep_seconds from old) as previous`);
  const r = res.rows[0]!;
  return { agentUid: r.agent_uid, keepSeconds: r.keep_seconds, updatedAt: new Date(r.updated_at), previousKeepSeconds: r.previous };
}

/** Removes the policy of `agentUid` (its transcript is kept forever again). Returns the window it had, or null when it had none. */
export async function clearTranscriptRetention(db: DbOrTx, agentUid: string): Promise<number | null> {
  const res = await db.execute<{ keep_seconds: number }>(
    sql`delete from corral.transcript_retention where agent_uid = ${agentUid} returning keep_seconds`,
  );
  return res.rows[0]?.keep_seconds ?? null;
}

/** Every policy, by agent. */
export async function listTranscriptRetention(db: DbOrTx): Promise<TranscriptRetention[]> {
  return db
    .select({
      agentUid: transcriptRetention.agentUid,
      keepSeconds: transcriptRetention.keepSeconds,
      updatedAt: transcriptRetention.updatedAt,
    })
    .from(transcriptRetention)
    .orderBy(asc(transcriptRetention.agentUid));
}

/** R7: the policies whose agent may have turns past the window (`due_at` unknown or passed). */
export async function transcriptRetentionDue(db: DbOrTx): Promise<{ agentUid: string; keepSeconds: number }[]> {
  const res = await db.execute<{ agent_uid: string; keep_seconds: number }>(sql`
    select agent_uid, keep_seconds from corral.transcript_retention
     where due_at is null or due_at <= now()
     order by agent_uid`);
  return res.rows.map((r) => ({ agentUid: r.agent_uid, keepSeconds: r.keep_seconds }));
}

/**
 * R7: records when the oldest finished turn left of `agentUid` passes the window (now plus the
 * window when it has none), if `keepSeconds` is still its policy. Run after a drain of the agent.
 */
export async function markTranscriptChecked(db: DbOrTx, agentUid: string, keepSeconds: number): Promise<void> {
  checkedPolicy(agentUid, keepSeconds);
  const agent = sql.raw(`'${agentUid}'`);
  await db.execute(sql`
    update corral.transcript_retention r
       set due_at = coalesce((
             select min(first.finished_at)
               from corral.conversations c
               cross join lateral (
                 select t.finished_at from corral.turns t
                  where t.conversation_id = c.id and t.status in ${sqlList(TURN_FINISHED)} and t.finished_at is not null
                  order by t.finished_at
                  limit 1) first
              where c.agent_uid = ${agent}), now()) + r.keep_seconds * interval '1 second'
     where r.agent_uid = ${agent} and r.keep_seconds = ${sql.raw(String(keepSeconds))}`);
}

export interface PrunedTranscripts {
  turns: number;
  messages: number;
}

/**
 * R1–R6: deletes up to `limit` finished turns of `agentUid`'s conversations that finished more
 * than `keepSeconds` ago, with their messages, if that is still the agent's policy. Returns how
 * many turns and messages.
 */
export async function pruneAgentTranscripts(db: DbOrTx, agentUid: string, keepSeconds: number, limit: number): Promise<PrunedTranscripts> {
  checkedPolicy(agentUid, keepSeconds);
  // checked above: an actor part holds no quote
  const agent = sql.raw(`'${agentUid}'`);
  const res = await db.execute<{ turns: number; messages: number }>(sql`
    with due as (
      select old.id
        from corral.conversations c
        cross join lateral (
          select t.id from corral.turns t
           where t.conversation_id = c.id
             and t.status in ${sqlList(TURN_FINISHED)} and t.finished_at < ${ageCutoff(keepSeconds)}
           order by t.finished_at
           limit ${limit}
             for update of t skip locked
        ) old
       where c.agent_uid = ${agent}
         and exists (select 1 from corral.transcript_retention r where r.agent_uid = ${agent} and r.keep_seconds = ${sql.raw(String(keepSeconds))})
       limit ${limit}
    ), msgs as (
      delete from corral.messages m using due where m.turn_id = due.id
      returning m.conversation_id, m.seq
    ), forgotten as (
      update corral.conversations c set pruned_through = greatest(c.pruned_through, f.seq)
        from (select conversation_id, max(seq) as seq from msgs group by conversation_id) f
       where c.agent_uid = ${agent} and c.id = f.conversation_id
    ), gone as (
      delete from corral.turns t using due where t.id = due.id
      returning 1
    )
    select (select count(*) from gone)::int as turns, (select count(*) from msgs)::int as messages`);
  const r = res.rows[0]!;
  return { turns: r.turns, messages: r.messages };
}

export interface PruneTranscriptsOptions {
  /** Turns per batch (one statement each), default 1,000. */
  batchSize?: number | undefined;
  /** At most this many batches per agent and pass, default 20, so one pass stays short. */
  maxBatches?: number | undefined;
}

/**
 * One pass of transcript retention: for each agent with a policy, its turns past the window with
 * their messages, in batches (`pruneAgentTranscripts`). Returns how many rows (turns and
 * messages) it deleted. A pass with no policy reads one small table.
 */
export async function pruneTranscripts(db: DbOrTx, opts: PruneTranscriptsOptions = {}): Promise<number> {
  const batch = opts.batchSize ?? 1_000;
  const maxBatches = opts.maxBatches ?? 20;
  let deleted = 0;
  for (const policy of await listTranscriptRetention(db)) {
    for (let i = 0; i < maxBatches; i++) {
      const n = await pruneAgentTranscripts(db, policy.agentUid, policy.keepSeconds, batch);
      deleted += n.turns + n.messages;
      if (n.turns < batch) break;
    }
  }
  return deleted;
}
