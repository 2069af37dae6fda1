/**
 * corral's fetch of the actor queue (src/db/boss/fetch.ts) claims exactly what pg-boss's own
 * `key_strict_fifo` fetch claims, with the same update, and two concurrent fetches never give one
 * key two jobs.
 */
import pg from 'pg';
import type { PgBoss } from 'pg-boss';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { actorKey, type ActorKey } from '../../src/base/actor-key.ts';
import { DEFAULTS } from '../../src/config.ts';
import { claimKeyHeads, keyHeadFetch, queueTable, type ClaimedJob } from '../../src/db/boss/fetch.ts';
import { formatActorKey } from '../../src/base/actor-key.ts';
import { openDatabase } from '../../src/db/client.ts';
import { inTransaction } from '../../src/db/tx.ts';
import { sql } from '../../src/db/orm.ts';
import { createBoss, ensureQueues, queuesOf } from '../../src/queue/boss.ts';
import { actorEventJob } from '../../src/queue/event-job.ts';
import { useTestDatabase } from '../helpers/db.ts';

const q = queuesOf(DEFAULTS);
const tdb = useTestDatabase();
let boss: PgBoss;
let table: string;

beforeAll(async () => {
  boss = createBoss(tdb.url, DEFAULTS, { max: 4 });
  await boss.start();
  await ensureQueues(boss, DEFAULTS);
  table = await queueTable(tdb.client, q);
});

afterAll(async () => {
  await boss?.stop({ graceful: false, close: true });
});

async function send(key: ActorKey, n: number, startAfter?: Date): Promise<string[]> {
  const ids: string[] = [];
  for (let i = 0; i < n; i++) {
    const job = actorEventJob(key, { i }, DEFAULTS.maxEventBytes);
    await boss.send(q.events, job.data as unknown as object, {
      id: job.id,
      singletonKey: job.singletonKey,
      ...(startAfter ? { startAfter } : {}),
    });
    ids.push(job.id);
  }
  return ids;
}

/** Runs `fn` on its own connection inside a transaction that is rolled back. */
async function rolledBack<T>(fn: (c: pg.Client) => Promise<T>): Promise<T> {
  const c = new pg.Client({ connectionString: tdb.url });
  await c.connect();
  try {
    await c.query('begin');
    return await fn(c);
  } finally {
    await c.query('rollback').catch(() => undefined);
    await c.end();
  }
}

const claimedRows = (c: pg.Client, ids: string[]) =>
  c.query<{ id: string; state: string; retry_count: number; started: boolean; heartbeat: boolean }>(
    `select id, state::text, retry_count, started_on is not null as started, heartbeat_on is not null as heartbeat
       from pgboss.job where name = $1 and id = any($2::uuid[]) order by id`,
    [q.events, ids],
  );

describe('the key-head fetch', () => {
  it("claims the jobs pg-boss's key_strict_fifo fetch claims, and updates them the same way", async () => {
    const a = await send(actorKey('fetch-a', 's'), 3); // head: a[0]
    const b = await send(actorKey('fetch-b', 's'), 1);
    const later = new Date(Date.now() + 3_600_000);
    const c = [...(await send(actorKey('fetch-c', 's'), 1, later)), ...(await send(actorKey('fetch-c', 's'), 1))]; // c[0] not due
    const d = await send(actorKey('fetch-d', 's'), 2); // d[0] active: d blocked
    const e = await send(actorKey('fetch-e', 's'), 2); // e[0] waits to retry (not due): e blocked
    const f = await send(actorKey('fetch-f', 's'), 2); // f[0] retry, due: the head, re-claimed
    const admin = new pg.Client({ connectionString: tdb.url });
    await admin.connect();
    await admin.query(`update pgboss.job set state = 'active', started_on = now() where id = $1`, [d[0]]);
    await admin.query(`update pgboss.job set state = 'retry', started_on = now(), start_after = now() + interval '1 hour' where id = $1`, [
      e[0],
    ]);
    await admin.query(
      `update pgboss.job set state = 'retry', started_on = now() - interval '1 minute', start_after = now() - interval '1 second' where id = $1`,
      [f[0]],
    );
    await admin.end();
    const all = [...a, ...b, ...c, ...d, ...e, ...f];

    const viaBoss = await rolledBack(async (cl) => {
      const jobs = await boss.fetch(q.events, {
        batchSize: 20,
        db: { executeSql: (text: string, values?: unknown[]) => cl.query(text, values) },
      });
      return { ids: jobs.map((j) => j.id).sort(), rows: (await claimedRows(cl, all)).rows };
    });
    const viaCorral = await rolledBack(async (cl) => {
      const jobs = await keyHeadFetch(cl, q, table)(20);
      return { ids: jobs.map((j) => j.id).sort(), rows: (await claimedRows(cl, all)).rows };
    });

    expect(viaBoss.ids).toEqual([a[0], b[0], c[1], f[0]].sort());
    expect(viaCorral.ids).toEqual(viaBoss.ids);
    expect(viaCorral.rows).toEqual(viaBoss.rows);
    expect(viaCorral.rows.find((r) => r.id === f[0])).toMatchObject({ state: 'active', retry_count: 1, started: true, heartbeat: true });
  });

  it("claims the heads of named keys under the same conditions (a busy actor's next turn, in its commit), and says which keys have more", async () => {
    const a = await send(actorKey('keys-a', 's'), 3); // head a[0], more behind it
    const b = await send(actorKey('keys-b', 's'), 1); // head b[0], nothing behind
    const later = new Date(Date.now() + 3_600_000);
    const c = [...(await send(actorKey('keys-c', 's'), 1, later)), ...(await send(actorKey('keys-c', 's'), 1))]; // c[0] not due
    const d = await send(actorKey('keys-d', 's'), 2); // d[0] active: d held
    const g = await send(actorKey('keys-g', 's'), 1); // not named
    const admin = new pg.Client({ connectionString: tdb.url });
    await admin.connect();
    await admin.query(`update pgboss.job set state = 'active', started_on = now() where id = $1`, [d[0]]);
    await admin.end();
    const names = ['a', 'b', 'c', 'd', 'nobody'].map((x) => formatActorKey(actorKey(`keys-${x}`, 's')));
    const db = openDatabase(tdb.url, { max: 1 });
    try {
      const claimed = await inTransaction(db.db, async (tx) => {
        const jobs = await claimKeyHeads(tx, q.events, names);
        const rows = await tx.execute<{ id: string; state: string }>(
          sql`select id, state::text from pgboss.job where id = any(${sql.param([...a, ...b, ...c, ...d, ...g])}::uuid[])`,
        );
        throw Object.assign(new Error('roll back'), { result: { jobs, rows: rows.rows } });
      }).catch((e: { result?: unknown }) => e.result as { jobs: ClaimedJob[]; rows: { id: string; state: string }[] });
      expect(claimed.jobs.map((j) => j.id).sort()).toEqual([a[0], b[0], c[1]].sort());
      const more = new Map(claimed.jobs.map((j) => [j.id, j.more ?? false]));
      expect(more.get(a[0]!), 'a has two more').toBe(true);
      expect(more.get(b[0]!)).toBe(false);
      expect(more.get(c[1]!), "c's other job is not due").toBe(false);
      const active = claimed.rows.filter((r) => r.state === 'active').map((r) => r.id);
      expect(active.sort(), 'claimed: active; the rest untouched').toEqual([a[0], b[0], c[1], d[0]].sort());
      // nothing named, nothing claimed, no statement
      expect(await claimKeyHeads(db.db, q.events, [])).toEqual([]);
    } finally {
      await db.close();
    }
  });

  it('says of a fetched job whether its key has more queued behind it', async () => {
    const busy = await send(actorKey('more-busy', 's'), 2);
    const lone = await send(actorKey('more-lone', 's'), 1);
    const jobs = await rolledBack(async (cl) => (await keyHeadFetch(cl, q, table)(1000)).filter((j) => [busy[0], lone[0]].includes(j.id)));
    expect(new Map(jobs.map((j) => [j.id, j.more ?? false]))).toEqual(
      new Map([
        [busy[0], true],
        [lone[0], false],
      ]),
    );
  });

  it('stops at the limit, oldest heads first', async () => {
    const keys = Array.from({ length: 5 }, (_, i) => actorKey('fetch-limit', `s${i}`));
    const heads: string[] = [];
    for (const k of keys) heads.push(...(await send(k, 1)));
    const claimed = await rolledBack(async (cl) => {
      const own = (await keyHeadFetch(cl, q, table)(50)).map((j) => j.id);
      return own.filter((id) => heads.includes(id));
    });
    expect(claimed.sort()).toEqual([...heads].sort());
    const two = await rolledBack(async (cl) => (await keyHeadFetch(cl, q, table)(2)).length);
    expect(two).toBe(2);
  });

  it('never gives one key two jobs when two fetches run at once', async () => {
    const one = new pg.Client({ connectionString: tdb.url });
    const two = new pg.Client({ connectionString: tdb.url });
    await Promise.all([one.connect(), two.connect()]);
    try {
      // the earlier tests' heads out of the way (claimed for good), so both fetches meet only these keys
      await keyHeadFetch(one, q, table)(1000);
      const keys = Array.from({ length: 20 }, (_, i) => actorKey('fetch-race', `s${i}`));
      for (const k of keys) await send(k, 3);
      await one.query('begin');
      await two.query('begin');
      // the first holds its claims uncommitted while the second fetches: it must skip them and
      // not take the next job of a key whose head the first holds
      const first = await keyHeadFetch(one, q, table)(8);
      const second = await keyHeadFetch(two, q, table)(100);
      await one.query('commit');
      await two.query('commit');
      // every key once across both fetches
      const keyOf = (j: { data: unknown }) => `${(j.data as ActorKey).agentUid}/${(j.data as ActorKey).sessionId}`;
      const claimed = [...first, ...second].map(keyOf);
      expect(new Set(claimed).size).toBe(claimed.length);
      expect(claimed.filter((k) => k.startsWith('fetch-race/'))).toHaveLength(20);
      expect(first.map(keyOf).every((k) => k.startsWith('fetch-race/'))).toBe(true);
      expect(first).toHaveLength(8);
      const active = await one.query<{ n: number; keys: number }>(
        `select count(*)::int as n, count(distinct singleton_key)::int as keys from pgboss.job
          where name = $1 and state = 'active' and singleton_key like 'fetch-race/%'`,
        [q.events],
      );
      expect(active.rows[0]).toEqual({ n: 20, keys: 20 });
    } finally {
      await Promise.all([one.end(), two.end()]);
    }
  });
});
