/**
 * The console's other keyset pages (src/http/console/): an actor's transcript, newest message
 * first (`messages_conversation_seq`, by `seq` below the page's last), and the workers, by id
 * (the primary key). No `offset` anywhere: every page costs what the first does.
 */
import { sql } from '../orm.ts';
import type { DbOrTx } from '../client.ts';
import { toDate } from '../rows.ts';
import type { ActorKey } from '../../base/actor-key.ts';

export interface ConsoleMessage {
  seq: number;
  role: string;
  content: unknown;
  createdAt: Date;
  turnId: string;
  eventId: string;
  turnStatus: string;
  epoch: number;
}

/** Messages of `key` with `seq` below `beforeSeq` (absent: the newest), newest first, at most `limit`. */
export async function transcriptPage(
  db: DbOrTx,
  key: ActorKey,
  page: { beforeSeq?: number | undefined; limit: number },
): Promise<ConsoleMessage[]> {
  const before = page.beforeSeq === undefined ? sql`` : sql` and m.seq < ${page.beforeSeq}`;
  const res = await db.execute<{
    seq: number;
    role: string;
    content: unknown;
    created_at: unknown;
    turn_id: string;
    event_id: string;
    status: string;
    actor_epoch: string | number;
  }>(sql`
    select m.seq, m.role, m.content, m.created_at, t.id as turn_id, t.event_id, t.status, t.actor_epoch
      from corral.conversations cv
      join corral.messages m on m.conversation_id = cv.id
      join corral.turns t on t.id = m.turn_id
     where cv.agent_uid = ${key.agentUid} and cv.session_id = ${key.sessionId}${before}
     order by m.seq desc limit ${page.limit}`);
  return res.rows.map((r) => ({
    seq: Number(r.seq),
    role: r.role,
    content: r.content,
    createdAt: toDate(r.created_at)!,
    turnId: r.turn_id,
    eventId: r.event_id,
    turnStatus: r.status,
    epoch: Number(r.actor_epoch),
  }));
}

export interface ConsoleWorker {
  workerId: string;
  status: string;
  capacity: number;
  inFlight: number;
  ownerId: string;
  lastHeartbeatAt: Date;
  /** Seconds since the last heartbeat, by PostgreSQL's clock. */
  heartbeatAgeSeconds: number;
  /** The stale timeout its daemon recorded (null: its daemon left no row). */
  staleMs: number | null;
}

/** Workers with an id after `after`, by id, at most `limit`. */
export async function workersPage(db: DbOrTx, page: { after?: string | undefined; limit: number }): Promise<ConsoleWorker[]> {
  const after = page.after === undefined ? sql`` : sql` where w.worker_id collate "C" > ${page.after} collate "C"`;
  const res = await db.execute<{
    worker_id: string;
    status: string;
    capacity: number;
    in_flight: number;
    owner_id: string;
    last_heartbeat_at: unknown;
    age_s: number;
    stale_ms: number | null;
  }>(sql`
    select w.worker_id, w.status, w.capacity, w.in_flight, w.owner_id, w.last_heartbeat_at,
           greatest(0, extract(epoch from now() - w.last_heartbeat_at))::float8 as age_s, d.stale_ms
      from corral.workers w left join corral.daemons d on d.daemon_id = w.owner_id${after}
     order by w.worker_id collate "C" limit ${page.limit}`);
  return res.rows.map((r) => ({
    workerId: r.worker_id,
    status: r.status,
    capacity: Number(r.capacity),
    inFlight: Number(r.in_flight),
    ownerId: r.owner_id,
    lastHeartbeatAt: toDate(r.last_heartbeat_at)!,
    heartbeatAgeSeconds: Number(r.age_s),
    staleMs: r.stale_ms === null ? null : Number(r.stale_ms),
  }));
}
