/**
 * Turn events as notifications: what the daemon's begin, commit and failure transactions tell
 * watchers (`corral.watch`, `corral.waitForTurn`), committed with the change, so a watcher hears
 * of a turn only once it is durable.
 *
 * T1 Channels: `corral_turns_<h>`, where `<h>` is the first hex digit of the md5 of the actor key
 *    text (`agent_uid/session_id`): 16 channels, so a watcher of one actor hears about a sixteenth
 *    of the traffic and filters the rest. Any language can compute it (`turnChannelOf`).
 * T2 Payload: one line per event, `<kind> <agent_uid>/<session_id> <event_id> <epoch> <attempt>`
 *    (actor key parts hold no space), lines joined by `\n`; at most TURN_EVENTS_PER_NOTIFY lines,
 *    so a payload stays far below PostgreSQL's 8000-byte limit (a line is at most 339 bytes).
 * T3 Batched: the hot statements (src/db/turns/turn-rows.ts) send one `pg_notify` per channel and chunk
 *    of their batch, inside the statement itself (`notifyTurnsCte`): no extra round trip.
 * T4 Only while watched: a channel is notified only while `corral.turn_watchers` names it (a
 *    listener registers there, src/db/turns/turn-listener.ts). A NOTIFY serialises the commits of every
 *    notifying transaction of the server (PostgreSQL holds one lock from NOTIFY's pre-commit
 *    until the commit is flushed): unwatched, turn events cost the daemon one look at an empty
 *    table per statement, not that. Every statement that notifies reads the table, and so holds
 *    its ACCESS SHARE lock until its transaction ends: a registration waits for the transactions
 *    holding it then (src/db/turns/turn-listener.ts, L1), after which every statement sees the registration.
 */
import { sql, type SQL } from '../orm.ts';
import type { DbOrTx } from '../client.ts';

import { TURN_CHANNEL_PREFIX, TURN_EVENT_KINDS, turnChannelOf, type TurnEventKind } from '../views.ts';

export { TURN_EVENT_KINDS, TURN_CHANNEL_PREFIX, TURN_CHANNELS, turnChannelOf, type TurnEventKind } from '../views.ts';

/** T2: lines per notification (20 × 339 bytes, the longest line, is 6,780 bytes with the separators). */
export const TURN_EVENTS_PER_NOTIFY = 20;

/**
 * T4: whether anyone watches at all: a one-time filter (an init plan), so that while nobody
 * watches the statement skips the notify CTE's sort, window and lookups altogether.
 */
const ANY_WATCHED = '(select exists (select 1 from corral.turn_watchers))';

/** T4: whether a channel expression is watched now. */
const WATCHED = (channel: string) => `exists (select 1 from corral.turn_watchers tw where tw.channel = ${channel})`;

/** T1 in SQL, for an actor key text expression. */
const channelSql = (actor: string) => `'${TURN_CHANNEL_PREFIX}' || left(md5(${actor}), 1)`;

/** One turn event as a notification carries it. */
export interface TurnNotice {
  kind: TurnEventKind;
  agentUid: string;
  sessionId: string;
  eventId: string;
  epoch: number;
  attempt: number;
}

const KINDS: ReadonlySet<string> = new Set(TURN_EVENT_KINDS);
const LINE = /^([a-z_]+) ([^/\s]+)\/([^/\s]+) ([0-9a-f-]{36}) (\d+) (\d+)$/;

/** T2: the events of one notification payload; malformed lines are left out. */
export function parseTurnNotices(payload: string): TurnNotice[] {
  const out: TurnNotice[] = [];
  for (const line of payload.split('\n')) {
    const m = LINE.exec(line);
    if (!m || !KINDS.has(m[1]!)) continue;
    out.push({
      kind: m[1] as TurnEventKind,
      agentUid: m[2]!,
      sessionId: m[3]!,
      eventId: m[4]!,
      epoch: Number(m[5]),
      attempt: Number(m[6]),
    });
  }
  return out;
}

/** T2: a notice as its payload line. */
export function turnNoticeLine(n: TurnNotice): string {
  return `${n.kind} ${n.agentUid}/${n.sessionId} ${n.eventId} ${n.epoch} ${n.attempt}`;
}

/**
 * T3: a CTE body that notifies one event of `kind` per row of `rows` (a FROM item with columns
 * `agent_uid`, `session_id`, `event_id`, `epoch`, `attempt`), one `pg_notify` per channel and
 * chunk. A data-modifying statement runs it only if it is referenced: `turnsNotified(name)`.
 */
export function notifyTurnsCte(kind: TurnEventKind, rows: string): SQL {
  const actor = `n.agent_uid || '/' || n.session_id`;
  return sql.raw(`select pg_notify(ch, string_agg(line, E'\\n'))
        from (select ${channelSql(actor)} as ch,
                     '${kind} ' || ${actor} || ' ' || n.event_id::text || ' ' || n.epoch::text || ' ' || n.attempt::text as line,
                     (row_number() over (partition by left(md5(${actor}), 1) order by n.event_id) - 1) / ${TURN_EVENTS_PER_NOTIFY} as chunk
                from ${rows} n) x
       where ${ANY_WATCHED} and ${WATCHED('x.ch')}
       group by ch, chunk`);
}

/** T3: a condition that is always true and makes the statement run the notify CTE `name`. */
export const turnsNotified = (name: string): SQL => sql.raw(`(select count(*) from ${name}) >= 0`);

/** Notifies `notices` in the caller's transaction (the failure paths: rare, one statement). */
export async function notifyTurnEvents(tx: DbOrTx, notices: readonly TurnNotice[]): Promise<void> {
  if (notices.length === 0) return;
  const byChannel = new Map<string, string[]>();
  for (const n of notices) {
    const ch = turnChannelOf(`${n.agentUid}/${n.sessionId}`);
    const lines = byChannel.get(ch) ?? [];
    lines.push(turnNoticeLine(n));
    byChannel.set(ch, lines);
  }
  const channels: string[] = [];
  const payloads: string[] = [];
  for (const [ch, lines] of byChannel) {
    for (let i = 0; i < lines.length; i += TURN_EVENTS_PER_NOTIFY) {
      channels.push(ch);
      payloads.push(lines.slice(i, i + TURN_EVENTS_PER_NOTIFY).join('\n'));
    }
  }
  await tx.execute(
    sql`select pg_notify(x.c, x.p) from unnest(${sql.param(channels)}::text[], ${sql.param(payloads)}::text[]) as x(c, p)
         where ${sql.raw(WATCHED('x.c'))}`,
  );
}
