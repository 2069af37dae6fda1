/**
 * Shards as schemas on one PostgreSQL (src/ops/shards.ts): `migrateShards` sets up N schema pairs
 * with corral's tables and pg-boss's, each knowing which shard it is; the count is fixed once keys
 * are placed; the map's URLs; and `corral.shard_of` agrees with the JS map.
 */
import { randomBytes } from 'node:crypto';
import pg from 'pg';
import { describe, expect, it } from 'vitest';
import { actorKey } from '../../src/base/actor-key.ts';
import { shardOf } from '../../src/base/shard-map.ts';
import { loadConfig } from '../../src/config.ts';
import { listShards, migrateShards, setShardUrl } from '../../src/ops/shards.ts';
import { sendEvents } from '../../src/db/enqueue/send.ts';
import { rewritingClient, shardSqlRewrite } from '../../src/db/shards/shard-sql.ts';
import { useTestDatabases } from '../helpers/db.ts';
import { startTestDaemon } from '../helpers/daemon.ts';

const config = loadConfig({}, {});

async function connect(url: string): Promise<pg.Client> {
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  return c;
}

async function tablesOf(c: pg.Client, schema: string): Promise<string[]> {
  const r = await c.query<{ t: string }>(
    `select table_name || ':' || string_agg(column_name || ' ' || data_type, ',' order by ordinal_position) as t
       from information_schema.columns where table_schema = $1 group by table_name order by table_name`,
    [schema],
  );
  return r.rows.map((row) => row.t);
}

describe('shards as schemas', { timeout: 120_000 }, () => {
  const dbs = useTestDatabases();

  it('sets up 4 shards on one database, each a copy of shard 0 that knows its number; again changes nothing', async () => {
    const db = await dbs.fresh();
    const seen: string[] = [];
    await migrateShards(db.url, 4, config, (shard, _url, what) => seen.push(`${shard} ${what}`));
    expect(seen).toEqual(['1 set up', '2 set up', '3 set up']);
    const c = await connect(db.url);
    try {
      const base = await tablesOf(c, 'corral');
      expect(base.length).toBeGreaterThan(10);
      for (const k of [1, 2, 3]) {
        expect(await tablesOf(c, `corral_s${k}`)).toEqual(base);
        const id = await c.query(`select shard, shard_count from corral_s${k}.shard_identity`);
        expect(id.rows).toEqual([{ shard: k, shard_count: 4 }]);
        const q = await c.query(`select name from pgboss_s${k}.queue order by name`);
        expect(q.rows.map((r) => r.name)).toEqual(['actor-events', 'actor-events-dlq']);
        // the shard's functions (the SQL enqueue, the claim) name the shard's own schemas, never shard 0's
        const fn = await c.query<{ src: string; n: number }>(
          `select string_agg(prosrc, ' ') as src, count(*)::int as n from pg_proc p join pg_namespace n on n.oid = p.pronamespace
            where n.nspname = $1`,
          [`corral_s${k}`],
        );
        expect(fn.rows[0]!.n).toBeGreaterThan(10);
        expect(fn.rows[0]!.src).toContain(`pgboss_s${k}.`);
        expect(fn.rows[0]!.src).toContain(`corral_s${k}.send_events`);
        expect(fn.rows[0]!.src).not.toMatch(/(?<![A-Za-z0-9_])(corral|pgboss)\./);
      }
      expect((await c.query('select shard, shard_count from corral.shard_identity')).rows).toEqual([{ shard: 0, shard_count: 4 }]);
      expect((await c.query('select shard, url from corral.shards order by shard')).rows).toEqual(
        [0, 1, 2, 3].map((shard) => ({ shard, url: null })),
      );

      const again: string[] = [];
      await migrateShards(db.url, 4, config, (shard, _url, what) => again.push(`${shard} ${what}`));
      expect(again).toEqual(['1 already set up', '2 already set up', '3 already set up']);

      const rows = await listShards(db.url, config);
      expect(rows.map((r) => [r.shard, r.schemas.corral, r.schemas.boss, r.actors, r.queued])).toEqual([
        [0, 'corral', 'pgboss', 0, 0],
        [1, 'corral_s1', 'pgboss_s1', 0, 0],
        [2, 'corral_s2', 'pgboss_s2', 0, 0],
        [3, 'corral_s3', 'pgboss_s3', 0, 0],
      ]);
    } finally {
      await c.end();
    }
  });

  it('fixes the count once a shard holds a key, and refuses a bad count or shard', async () => {
    const db = await dbs.fresh();
    await migrateShards(db.url, 2, config);
    const c = await connect(db.url);
    try {
      await c.query(`insert into corral_s1.actors (agent_uid, session_id) values ('a', 's')`);
      await expect(migrateShards(db.url, 4, config)).rejects.toMatchObject({ code: 'shard_count_fixed' });
      expect((await c.query('select shard_count from corral.shard_identity')).rows).toEqual([{ shard_count: 2 }]);
      expect((await c.query('select count(*)::int as n from corral.shards')).rows).toEqual([{ n: 2 }]);
      await expect(migrateShards(db.url, 0, config)).rejects.toMatchObject({ code: 'invalid_argument' });
      await expect(migrateShards(db.url, 1025, config)).rejects.toMatchObject({ code: 'invalid_argument' });
      await expect(setShardUrl(db.url, 7, 'postgres://x/y')).rejects.toMatchObject({ code: 'not_found' });
      // the stored URL is bounded by the table too, whoever writes it
      await expect(c.query("update corral.shards set url = repeat('x', 2049) where shard = 1")).rejects.toThrow(/shards_url/);
      await expect(c.query("update corral.shards set url = '' where shard = 1")).rejects.toThrow(/shards_url/);
      // an empty deployment may still change its count
      await c.query('delete from corral_s1.actors');
      await migrateShards(db.url, 3, config);
      expect((await c.query('select shard_count from corral.shard_identity')).rows).toEqual([{ shard_count: 3 }]);
      expect((await c.query('select shard, shard_count from corral_s1.shard_identity')).rows).toEqual([{ shard: 1, shard_count: 3 }]);
    } finally {
      await c.end();
    }
  });

  it('a shard at another database URL is set up there; a URL to the wrong shard is refused', async () => {
    const catalog = await dbs.fresh();
    const other = await dbs.fresh({ empty: true });
    await migrateShards(catalog.url, 2, config);
    await setShardUrl(catalog.url, 1, other.url);
    // shard 1 moves: set up at its new URL (its copy in the catalog's database stays until dropped)
    await migrateShards(catalog.url, 2, config);
    const o = await connect(other.url);
    try {
      expect((await o.query('select shard, shard_count from corral_s1.shard_identity')).rows).toEqual([{ shard: 1, shard_count: 2 }]);
      expect((await o.query("select to_regclass('corral.actors') as t")).rows).toEqual([{ t: null }]);
      await o.query(`insert into corral_s1.conversations (id, agent_uid, session_id) values (gen_random_uuid(), 'a', 'b')`);
      const rows = await listShards(catalog.url, config);
      expect(rows[1]).toMatchObject({ shard: 1, url: other.url, actors: 1 });
      // the schema says shard 1 of 2: set up as shard 1 of another deployment of 3 shards, refused
      await o.query('update corral_s1.shard_identity set shard_count = 3');
      await expect(migrateShards(catalog.url, 2, config)).rejects.toMatchObject({ code: 'shard_count_fixed' });
    } finally {
      await o.end();
    }
  });

  it('corral.shard_of gives the JS map for random keys and every count', async () => {
    const db = await dbs.fresh();
    const c = await connect(db.url);
    try {
      const keys = Array.from({ length: 200 }, () =>
        actorKey(`agent-${randomBytes(4).toString('hex')}`, randomBytes(6).toString('base64url')),
      );
      for (const n of [1, 2, 3, 4, 7, 64, 1024]) {
        const r = await c.query<{ s: number[] }>(
          'select array_agg(corral.shard_of(a, s, $3) order by i) as s from unnest($1::text[], $2::text[]) with ordinality as k(a, s, i)',
          [keys.map((k) => k.agentUid), keys.map((k) => k.sessionId), n],
        );
        expect(r.rows[0]!.s).toEqual(keys.map((k) => shardOf(k, n)));
      }
      await expect(c.query("select corral.shard_of('a', 'b', 0)")).rejects.toThrow(/invalid shard count 0/);
    } finally {
      await c.end();
    }
  });

  it("each shard's SQL enqueue takes only its own actors' events, and names the right shard otherwise", async () => {
    const db = await dbs.fresh();
    await migrateShards(db.url, 3, config);
    const c = await connect(db.url);
    try {
      const keys = Array.from({ length: 30 }, (_, i) => actorKey('agent', `s-${i}`));
      for (const shard of [0, 1, 2]) {
        const on = rewritingClient(c, shardSqlRewrite(shard, 'pgboss'));
        for (const key of keys) {
          const home = shardOf(key, 3);
          const send = sendEvents(on, [{ ...key, data: { shard } }]);
          if (home === shard) await send;
          else
            await expect(send).rejects.toMatchObject({
              code: 'wrong_shard',
              message: expect.stringContaining(`belongs to shard ${home} of 3`),
            });
        }
        const boss = shard === 0 ? 'pgboss' : `pgboss_s${shard}`;
        const jobs = await c.query<{ k: string }>(`select singleton_key as k from ${boss}.job where name = 'actor-events' order by k`);
        expect(jobs.rows.map((r) => r.k)).toEqual(
          keys
            .filter((k) => shardOf(k, 3) === shard)
            .map((k) => `${k.agentUid}/${k.sessionId}`)
            .sort(),
        );
      }
      // nothing of a refused batch is written: one event of another shard refuses the call
      const mixed = [keys.find((k) => shardOf(k, 3) === 0)!, keys.find((k) => shardOf(k, 3) === 1)!];
      const before = (await c.query('select count(*)::int as n from pgboss.job')).rows[0].n;
      await expect(
        sendEvents(
          c,
          mixed.map((k) => ({ ...k, data: 1 })),
        ),
      ).rejects.toMatchObject({ code: 'wrong_shard' });
      expect((await c.query('select count(*)::int as n from pgboss.job')).rows[0].n).toBe(before);
    } finally {
      await c.end();
    }
  });

  it('a daemon refuses shards the deployment does not have, or named twice', async () => {
    const db = await dbs.fresh();
    await migrateShards(db.url, 2, config);
    await expect(startTestDaemon({ shards: '0,2' }, { db })).rejects.toMatchObject({
      code: 'invalid_config',
      message: expect.stringContaining('no shard 2: the deployment has 2 shards (0 to 1)'),
    });
    await expect(startTestDaemon({ shards: '1,1' }, { db })).rejects.toMatchObject({
      code: 'invalid_config',
      message: expect.stringContaining('names a shard twice'),
    });
  });
});
