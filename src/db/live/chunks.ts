/**
 * Live turns in the database: the chunks a running turn streams (`corral.stream_chunks`, an
 * unlogged table) and what a watcher reads to follow an actor's live turn from any daemon.
 *
 *  S1 A chunk is stored only while its delivery is live: the insert checks the delivery row, so a
 *     daemon whose in-memory view lags (its attempt was superseded elsewhere) stores nothing.
 *  S2 Each stored chunk is notified on the actor's stream channel (`corral_stream_<h>`, h as for
 *     turn channels, T1 of turn-events.ts) while a watcher registered it (T4), in seq order, one
 *     notification per chunk: `c <agent>/<session> <delivery_id> <seq> <json>` when that fits a
 *     notification, else `r <agent>/<session> <delivery_id> <seq>` (read it from the table).
 *  S3 Chunks need not outlive their delivery: the daemon deletes an ended turn's chunks, and the
 *     retention sweep those of every delivery that is not live any more.
 */
import { createHash } from 'node:crypto';
import type { DbOrTx } from '../client.ts';
import { executeNamed } from '../prepared.ts';
import { sql } from '../orm.ts';
import { DELIVERY_LIVE, onKeyedRow, sqlList } from '../schema.ts';
import { bossSql, type Queues } from '../boss/jobs.ts';
import { toDate } from '../rows.ts';

const LIVE = sqlList(DELIVERY_LIVE);

export const STREAM_CHANNEL_PREFIX = 'corral_stream_';

/** S2: the stream channel of an actor (key text `agent/session`). */
export function streamChannelOf(actor: string): string {
  return `${STREAM_CHANNEL_PREFIX}${createHash('md5').update(actor).digest('hex')[0]}`;
}

/** A notification payload stays under PostgreSQL's 8000 bytes with room for the channel name. */
export const MAX_NOTIFY_BYTES = 7_900;

/** One chunk to store. `data` is its JSON text. */
export interface ChunkRow {
  deliveryId: string;
  seq: number;
  agentUid: string;
  sessionId: string;
  epoch: number;
  attempt: number;
  data: string;
  /** S2: its channel. */
  channel: string;
}

/** S2: the notification line of a chunk. */
export function chunkLine(r: Pick<ChunkRow, 'agentUid' | 'sessionId' | 'deliveryId' | 'seq' | 'data'>): string {
  const head = `${r.agentUid}/${r.sessionId} ${r.deliveryId} ${r.seq}`;
  const inline = `c ${head} ${r.data}`;
  return Buffer.byteLength(inline) <= MAX_NOTIFY_BYTES ? inline : `r ${head}`;
}

/** A chunk as a notification carries it (S2); `data` is undefined when it must be read. */
export interface ChunkNotice {
  agentUid: string;
  sessionId: string;
  deliveryId: string;
  seq: number;
  data: string | undefined;
}

const LINE = /^([cr]) ([^/\s]+)\/([^/\s]+) ([0-9a-f-]{36}) (\d+)(?: ([\s\S]*))?$/;

/** S2: the chunk of one notification payload; undefined when malformed. */
export function parseChunkNotice(payload: string): ChunkNotice | undefined {
  const m = LINE.exec(payload);
  if (!m) return undefined;
  const inline = m[1] === 'c';
  if (inline !== (m[6] !== undefined)) return undefined;
  return { agentUid: m[2]!, sessionId: m[3]!, deliveryId: m[4]!, seq: Number(m[5]), data: inline ? m[6] : undefined };
}

/** S1, S2: stores the chunks whose delivery is still live and notifies the watched ones. Returns how many were stored. */
export async function insertChunks(db: DbOrTx, rows: readonly ChunkRow[]): Promise<number> {
  if (rows.length === 0) return 0;
  const input = rows.map((r, i) => ({
    ord: i,
    delivery_id: r.deliveryId,
    seq: r.seq,
    agent_uid: r.agentUid,
    session_id: r.sessionId,
    actor_epoch: r.epoch,
    attempt: r.attempt,
    data: r.data,
    channel: r.channel,
    line: chunkLine(r),
  }));
  const res = await executeNamed<{ stored: number }>(
    db,
    'corral_insert_stream_chunks',
    sql`
    with i as (
      select * from jsonb_to_recordset(${JSON.stringify(input)}::jsonb) as x(
        ord int, delivery_id uuid, seq int, agent_uid text, session_id text, actor_epoch int, attempt int, data text, channel text,
        line text)
    ), ins as (
      insert into corral.stream_chunks (delivery_id, seq, agent_uid, session_id, actor_epoch, attempt, data)
      select i.delivery_id, i.seq, i.agent_uid, i.session_id, i.actor_epoch, i.attempt, i.data::jsonb
        from i
       where exists (select 1 from corral.deliveries d
                      where d.delivery_id = i.delivery_id and ${onKeyedRow(sql`d.state in ${LIVE}`)})
      on conflict do nothing
      returning delivery_id, seq
    ), n as (
      select count(pg_notify(i.channel, i.line)) as sent
        from (select i.channel, i.line from i join ins using (delivery_id, seq)
               where (select exists (select 1 from corral.turn_watchers))
                 and exists (select 1 from corral.turn_watchers tw where tw.channel = i.channel)
               order by i.ord) i
    )
    select (select count(*) from ins)::int as stored, (select sent from n) as sent`,
  );
  return res[0]?.stored ?? 0;
}

/** A stored chunk. */
export interface StoredChunk {
  seq: number;
  /** Its JSON text. */
  data: string;
}

/** The chunks of `deliveryId` after `afterSeq`, in order, at most `limit`. */
export async function readChunks(db: DbOrTx, deliveryId: string, afterSeq: number, limit = 1000): Promise<StoredChunk[]> {
  const res = await db.execute<{ seq: number; data: string }>(sql`
    select seq, data::text as data from corral.stream_chunks
     where delivery_id = ${deliveryId}::uuid and seq > ${afterSeq}
     order by seq limit ${limit}`);
  return res.rows.map((r) => ({ seq: Number(r.seq), data: r.data }));
}

/** S3: deletes the chunks of deliveries that ended. */
export async function deleteChunks(db: DbOrTx, deliveryIds: readonly string[]): Promise<number> {
  if (deliveryIds.length === 0) return 0;
  const res = await db.execute(sql`
    delete from corral.stream_chunks where delivery_id = any(${`{${deliveryIds.join(',')}}`}::uuid[])`);
  return res.rowCount ?? 0;
}

/** S3: deletes the chunks of every delivery that is not live (the sweep; the table holds only live turns' chunks, so this reads little). */
export async function pruneStreamChunks(db: DbOrTx): Promise<number> {
  const res = await db.execute(sql`
    delete from corral.stream_chunks s
     where not exists (select 1 from corral.deliveries d
                        where d.delivery_id = s.delivery_id and ${onKeyedRow(sql`d.state in ${LIVE}`)})`);
  return res.rowCount ?? 0;
}

/** A turn as a watcher follows it. */
export interface WatchedTurn {
  turnId: string;
  deliveryId: string;
  eventId: string;
  epoch: number;
  attempt: number;
  status: string;
  /** Its start, exactly (microseconds, which a Date cannot hold): where the next turn is looked for. */
  startedAt: string;
  /** Every event it answers, in order: its own first. */
  events: { id: string; data: unknown; enqueued_at: string }[];
  output: unknown;
  /** The attempt's W3C traceparent (docs/observability.md), or null. */
  traceparent: string | null;
}

type TurnRow = {
  id: string;
  delivery_id: string;
  event_id: string;
  actor_epoch: number;
  attempt: number;
  status: string;
  started_at: string;
  input: unknown;
  coalesced: { event_id: string; data: unknown; enqueued_at: string }[] | null;
  output: unknown;
  traceparent: string | null;
  enqueued_at: Date | string | null;
};

const c = bossSql.col;

function turnColumns(q: Queues) {
  return sql`t.id, t.delivery_id, t.event_id, t.actor_epoch, t.attempt, t.status, t.started_at::text as started_at, t.input, t.coalesced, t.output, t.traceparent,
    (select ${c.created_on} from ${bossSql.job(q.schema)} j where ${c.name} = ${q.events} and ${c.id} = t.event_id) as enqueued_at`;
}

function watchedTurn(r: TurnRow): WatchedTurn {
  const enqueued = toDate(r.enqueued_at);
  return {
    turnId: r.id,
    deliveryId: r.delivery_id,
    eventId: r.event_id,
    epoch: Number(r.actor_epoch),
    attempt: Number(r.attempt),
    status: r.status,
    startedAt: r.started_at,
    events: [
      { id: r.event_id, data: r.input ?? null, enqueued_at: (enqueued ?? new Date(r.started_at)).toISOString() },
      ...(r.coalesced ?? []).map((m) => ({ id: m.event_id, data: m.data ?? null, enqueued_at: m.enqueued_at })),
    ],
    output: r.output ?? null,
    traceparent: r.traceparent ?? null,
  };
}

/**
 * With `since`, the actor's first turn that started after it; without, its latest turn (live or
 * not). Through its conversation and `turns_conversation`.
 */
export async function nextTurnAfter(
  db: DbOrTx,
  q: Queues,
  actor: { agentUid: string; sessionId: string },
  since: string | undefined,
): Promise<WatchedTurn | undefined> {
  const pick =
    since === undefined
      ? sql`order by t.started_at desc limit 1`
      : sql`and t.started_at > ${since}::timestamptz order by t.started_at limit 1`;
  const res = await db.execute<TurnRow>(sql`
    select ${turnColumns(q)}
      from corral.conversations cv
      join lateral (select * from corral.turns t where t.conversation_id = cv.id ${pick}) t on true
     where cv.agent_uid = ${actor.agentUid} and cv.session_id = ${actor.sessionId}`);
  const r = res.rows[0];
  return r ? watchedTurn(r) : undefined;
}

/** The turn of one delivery, if it is still there. */
export async function turnOfDelivery(db: DbOrTx, q: Queues, deliveryId: string): Promise<WatchedTurn | undefined> {
  const res = await db.execute<TurnRow>(sql`select ${turnColumns(q)} from corral.turns t where t.delivery_id = ${deliveryId}::uuid`);
  const r = res.rows[0];
  return r ? watchedTurn(r) : undefined;
}

/** The actor of one delivery's turn (`agent_uid/session_id`), if its turn is still there. */
export async function actorOfDelivery(db: DbOrTx, deliveryId: string): Promise<string | undefined> {
  const res = await db.execute<{ actor: string }>(sql`
    select cv.agent_uid || '/' || cv.session_id as actor
      from corral.turns t join corral.conversations cv on cv.id = t.conversation_id
     where t.delivery_id = ${deliveryId}::uuid`);
  return res.rows[0]?.actor;
}

/** A turn's messages, in order. */
export async function turnMessages(db: DbOrTx, turnId: string): Promise<{ seq: number; role: string; content: unknown }[]> {
  const res = await db.execute<{ seq: number; role: string; content: unknown }>(sql`
    select seq, role, content from corral.messages where turn_id = ${turnId}::uuid order by seq`);
  return res.rows.map((r) => ({ seq: Number(r.seq), role: r.role, content: r.content }));
}

/** The state of an event's job in the actor queue (undefined: not there, e.g. dead-lettered or pruned). */
export async function eventJobState(db: DbOrTx, q: Queues, eventId: string): Promise<string | undefined> {
  const res = await db.execute<{ state: string }>(sql`
    select ${c.state}::text as state from ${bossSql.job(q.schema)} where ${c.name} = ${q.events} and ${c.id} = ${eventId}::uuid`);
  return res.rows[0]?.state;
}
