/**
 * SQL for what a worker may read of a conversation: the context sent with every `turn_start`
 * (the latest messages, read inside the begin statement, see `contextLinesOf`) and the fenced reads of the
 * worker RPC (`history.read`, `actor.status`).
 *
 * Invariants:
 *  H1 a fenced read is ONE statement whose rows all hang off the fence CTE: when the `turn_ref`
 *     does not name a live turn of that worker (delivery live and given to it, activation live on
 *     that event at that epoch and revision, lease alive by PostgreSQL's clock, the event's job
 *     active in the delivery's attempt: what `checkFence` asks of a reply), the statement returns
 *     no row and nothing of the conversation is read.
 *  H2 message seqs are gapless from 1 (`conversations.next_seq`); transcript retention deletes
 *     only a conversation's start (src/db/operations/transcript-retention.ts, R2), through
 *     `conversations.pruned_through`. So the conversation holds the seqs `pruned_through + 1` to
 *     `next_seq - 1`, and "older messages exist" is `first seq > pruned_through + 1`.
 *  H3 every page is bounded by count and by bytes of content (`octet_length(content::text)`,
 *     which is never shorter than the compact JSON on the wire).
 */
import { sql, type SQL } from '../orm.ts';
import type { DbOrTx } from '../client.ts';
import { jobActiveOf, type Fence, type JobTable } from './fence.ts';
import { ACTIVATION_LIVE, DELIVERY_LIVE, onKeyedRow, sqlList } from '../schema.ts';

export interface HistoryMessage {
  seq: number;
  role: 'user' | 'assistant' | 'tool';
  content: unknown;
  /** The content was left out: this one message alone exceeds the page's byte budget. */
  truncated?: true;
}

/** Limits of the context sent with `turn_start`. */
export interface ContextLimits {
  maxMessages: number;
  maxBytes: number;
}

/**
 * The messages of the context of `turn_start` (docs/protocol.md §5.3) for the conversation `c` (a
 * row with `id` in scope): its latest messages, at most `maxMessages` and, counted newest first,
 * `maxBytes` of content (H3); as text, one line per message, oldest first: the role, one space,
 * the content's JSON text (which holds no raw newline); null when none. The last is the
 * conversation's `next_seq - 1` (H2), so the lines number themselves. The daemon builds the
 * context's JSON from them (src/runtime/context-cache.ts): one text value per turn reaches Node.
 */
export function contextLinesOf(c: string, limits: ContextLimits): SQL {
  const conv = sql.raw(c);
  return sql`(
    select string_agg(b.role || ' ' || b.text, E'\\n' order by b.seq)
      from (
        select l.seq, l.role, l.text, sum(octet_length(l.text)) over (order by l.seq desc) as bytes
          from (select m.seq, m.role, m.content::text as text from corral.messages m
                 where m.conversation_id = ${conv}.id
                 order by m.seq desc limit ${limits.maxMessages}) l
      ) b
     where b.bytes <= ${limits.maxBytes}
  )`;
}

/** The fence CTE of H1: one row (agent, session) when `fence` names a live turn of `workerId`. */
function liveTurn(jobs: JobTable, fence: Fence, workerId: string) {
  return sql`
    select d.agent_uid, d.session_id
      from corral.deliveries d
      join corral.activations a on a.activation_uid = d.activation_uid
     where d.delivery_id = ${fence.deliveryId}::uuid
       and d.activation_uid = ${fence.activationUid}::uuid
       and d.agent_uid = ${fence.agentUid} and d.session_id = ${fence.sessionId}
       and d.actor_epoch = ${fence.actorEpoch} and d.event_id = ${fence.eventId}::uuid
       and d.revision = ${fence.revision} and d.worker_id = ${workerId}
       and ${onKeyedRow(sql`d.state in ${sqlList(DELIVERY_LIVE)}`)}
       and ${onKeyedRow(sql`a.status in ${sqlList(ACTIVATION_LIVE)}`)}
       and a.actor_epoch = d.actor_epoch and a.current_event_id = d.event_id and a.revision = d.revision
       and a.lease_expires_at > now()
       and ${jobActiveOf(jobs, 'd')}`;
}

export interface HistoryPage {
  conversationId: string;
  /** Oldest first. */
  messages: HistoryMessage[];
  /** True when messages older than `messages[0]` exist: ask again with `before_seq = messages[0].seq`. */
  hasMore: boolean;
  /** How many messages the conversation holds (transcript retention's deletions not counted). */
  total: number;
}

type RawPage = {
  id: string;
  next_seq: number;
  pruned_through: number;
  seq: number | null;
  role: HistoryMessage['role'] | null;
  content: unknown;
  bytes: string | number | null;
  size: number | null;
};

/**
 * `history.read`: one page of the conversation of the turn `fence` names, going backwards from
 * `beforeSeq` (exclusive; absent = the newest), at most `limit` messages and `maxBytes` of
 * content. Undefined (and nothing read, H1) when the fence does not name a live turn of
 * `workerId`. A message larger than `maxBytes` on its own comes back without its content
 * (`truncated`), so paging always moves on.
 */
export async function readHistoryPage(
  db: DbOrTx,
  jobs: JobTable,
  fence: Fence,
  workerId: string,
  page: { beforeSeq?: number; limit: number; maxBytes: number },
): Promise<HistoryPage | undefined> {
  const before = page.beforeSeq ?? 2_147_483_647;
  const rows = await db.execute<RawPage>(sql`
    with f as (${liveTurn(jobs, fence, workerId)}),
    c as (
      select c.id, c.next_seq, c.pruned_through from corral.conversations c join f on c.agent_uid = f.agent_uid and c.session_id = f.session_id
    )
    select c.id, c.next_seq, c.pruned_through, w.seq, w.role, case when w.size <= ${page.maxBytes} then w.content end as content, w.bytes, w.size
      from c left join lateral (
        select l.seq, l.role, l.content, octet_length(l.content::text) as size,
               sum(octet_length(l.content::text)) over (order by l.seq desc) as bytes
          from (select m.seq, m.role, m.content from corral.messages m
                 where m.conversation_id = c.id and m.seq < ${before}
                 order by m.seq desc limit ${page.limit}) l
      ) w on true
     order by w.seq desc`);
  const first = rows.rows[0];
  if (!first) return undefined;
  const messages: HistoryMessage[] = [];
  for (const [i, r] of rows.rows.entries()) {
    if (r.seq === null) break;
    // the newest message always comes (H3: paging moves on), the others while the budget lasts
    if (i > 0 && Number(r.bytes) > page.maxBytes) break;
    const tooBig = Number(r.size) > page.maxBytes;
    messages.push({ seq: r.seq, role: r.role!, content: tooBig ? null : r.content, ...(tooBig ? { truncated: true as const } : {}) });
  }
  messages.reverse();
  const oldest = messages[0]?.seq;
  return {
    conversationId: first.id,
    messages,
    hasMore: oldest !== undefined && oldest > first.pruned_through + 1,
    total: Number(first.next_seq) - 1 - first.pruned_through,
  };
}

export interface ActorStatus {
  agentUid: string;
  sessionId: string;
  epochCounter: number;
  blockedByEventId: string | null;
  /** Committed messages in the conversation (those transcript retention deleted not counted). */
  messages: number;
  activation: {
    activationUid: string;
    epoch: number;
    status: string;
    revision: number;
    currentEventId: string | null;
    leaseExpiresAt: string;
  };
}

/** `actor.status`: the state of the actor whose live turn `fence` names; undefined when it is not live (H1). */
export async function readActorStatus(db: DbOrTx, jobs: JobTable, fence: Fence, workerId: string): Promise<ActorStatus | undefined> {
  const rows = await db.execute<{
    agent_uid: string;
    session_id: string;
    epoch_counter: string | number;
    blocked_by_event_id: string | null;
    next_seq: number | null;
    pruned_through: number | null;
    activation_uid: string;
    actor_epoch: string | number;
    status: string;
    revision: number;
    current_event_id: string | null;
    lease_expires_at: Date | string;
  }>(sql`
    with f as (${liveTurn(jobs, fence, workerId)})
    select ac.agent_uid, ac.session_id, ac.epoch_counter, ac.blocked_by_event_id, c.next_seq, c.pruned_through,
           a.activation_uid, a.actor_epoch, a.status, a.revision, a.current_event_id, a.lease_expires_at
      from f
      join corral.actors ac on ac.agent_uid = f.agent_uid and ac.session_id = f.session_id
      join corral.activations a on a.activation_uid = ${fence.activationUid}::uuid
      left join corral.conversations c on c.agent_uid = f.agent_uid and c.session_id = f.session_id`);
  const r = rows.rows[0];
  if (!r) return undefined;
  return {
    agentUid: r.agent_uid,
    sessionId: r.session_id,
    epochCounter: Number(r.epoch_counter),
    blockedByEventId: r.blocked_by_event_id,
    messages: r.next_seq === null ? 0 : r.next_seq - 1 - (r.pruned_through ?? 0),
    activation: {
      activationUid: r.activation_uid,
      epoch: Number(r.actor_epoch),
      status: r.status,
      revision: r.revision,
      currentEventId: r.current_event_id,
      leaseExpiresAt: new Date(r.lease_expires_at).toISOString(),
    },
  };
}
