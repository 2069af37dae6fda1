/**
 * The console's overview (src/http/console/): the last hour, minute by minute, from SQL alone.
 *
 *  O1 Turns are read by their ids: a turn's id is a UUIDv7 (src/db/turns/turn-rows.ts), whose
 *     first 48 bits are its start in Unix milliseconds, so "the last hour" is a range of the
 *     primary key, never a scan of every turn ever.
 *  O2 Wake latency is a first attempt's start minus its event's enqueue, both read from ids and
 *     rows already there: an event id is a UUIDv7 too (src/queue/event-job.ts).
 *  O3 Dead letters are their own partition of pg-boss's job table, read by `created_on`.
 */
import { sql } from '../orm.ts';
import type { DbOrTx } from '../client.ts';
import { toDate } from '../rows.ts';
import { bossSql, type Queues } from '../boss/jobs.ts';

export interface OverviewMinute {
  /** The minute's start. */
  at: Date;
  turns: number;
  failed: number;
  deadLetters: number;
  /** Mean wake latency of the minute's first attempts, in ms (null: none). */
  wakeMs: number | null;
}

const c = bossSql.col;
/** O1: the smallest UUIDv7 of the millisecond `ms` (an SQL bigint). */
const v7Floor = (ms: ReturnType<typeof sql>) =>
  sql`(substr(lpad(to_hex(${ms}), 12, '0'), 1, 8) || '-' || substr(lpad(to_hex(${ms}), 12, '0'), 9, 4) || '-7000-8000-000000000000')::uuid`;
/** O2: the Unix milliseconds of a UUIDv7. */
const v7Ms = (id: ReturnType<typeof sql>) => sql`('x' || substr(replace(${id}::text, '-', ''), 1, 12))::bit(48)::bigint`;

/** The last `minutes` minutes (at most 24 h), one row per minute, oldest first, empty minutes included. */
export async function overviewMinutes(db: DbOrTx, q: Queues, minutes: number): Promise<OverviewMinute[]> {
  const n = Math.max(1, Math.min(1440, Math.floor(minutes)));
  const res = await db.execute<{ at: unknown; turns: number; failed: number; dead: number; wake_ms: number | null }>(sql`
    with bounds as (select date_trunc('minute', now()) - make_interval(mins => ${n - 1}) as since),
    t as (
      select date_trunc('minute', t.started_at) as m, count(*)::int as turns,
             (count(*) filter (where t.status = 'failed'))::int as failed,
             (avg(extract(epoch from t.started_at) * 1000 - ${v7Ms(sql`t.event_id`)})
               filter (where t.attempt = 1 and extract(epoch from t.started_at) * 1000 >= ${v7Ms(sql`t.event_id`)}))::float8 as wake_ms
        from corral.turns t, bounds b
       where t.id >= ${v7Floor(sql`(extract(epoch from b.since) * 1000)::bigint`)} and t.started_at >= b.since
       group by 1),
    d as (
      select date_trunc('minute', j.${c.created_on}) as m, count(*)::int as n
        from ${bossSql.job(q.schema)} j, bounds b
       where j.${c.name} = ${q.deadLetter} and j.${c.created_on} >= b.since group by 1)
    select g.m as at, coalesce(t.turns, 0) as turns, coalesce(t.failed, 0) as failed, coalesce(d.n, 0) as dead, t.wake_ms
      from bounds b
      cross join generate_series(b.since, date_trunc('minute', now()), interval '1 minute') as g(m)
      left join t on t.m = g.m
      left join d on d.m = g.m
     order by g.m`);
  return res.rows.map((r) => ({
    at: toDate(r.at)!,
    turns: Number(r.turns),
    failed: Number(r.failed),
    deadLetters: Number(r.dead),
    wakeMs: r.wake_ms === null ? null : Math.round(Number(r.wake_ms)),
  }));
}
