/**
 * The shard tables' statements (src/db/schema-shards.ts). Each runs on one connection of one
 * shard: for a shard k > 0 a client that rewrites schema names (src/db/shards/shard-sql.ts).
 */
import type pg from 'pg';

export interface ShardIdentity {
  shard: number;
  shardCount: number;
}

export interface ShardMapEntry {
  shard: number;
  /** null: the catalog's own database. */
  url: string | null;
}

/** Runs one statement: a pg client's or pool's `query`, or pg-boss's `executeSql`. */
export type RunSql = (text: string) => Promise<{ rows: unknown[] }>;

/**
 * This schema's identity; undefined for a database migrated before shards (shard 0 of 1). The
 * table is looked up first rather than its absence caught: pg-boss closes a connection whose
 * statement failed.
 */
export async function readShardIdentity(run: RunSql): Promise<ShardIdentity | undefined> {
  const there = await run("select to_regclass('corral.shard_identity') is not null as there");
  if ((there.rows[0] as { there?: boolean } | undefined)?.there !== true) return undefined;
  const row = (await run('select shard, shard_count from corral.shard_identity')).rows[0] as
    { shard: number; shard_count: number } | undefined;
  return row ? { shard: row.shard, shardCount: row.shard_count } : undefined;
}

/** Writes the identity when there is none, or replaces it (the caller checked that nothing lives here yet). */
export async function writeShardIdentity(c: pg.ClientBase, id: ShardIdentity): Promise<void> {
  await c.query(
    `insert into corral.shard_identity (shard, shard_count) values ($1, $2)
     on conflict (one) do update set shard = excluded.shard, shard_count = excluded.shard_count, created_at = now()`,
    [id.shard, id.shardCount],
  );
}

/** Whether nothing lives in this shard yet: no actor, no conversation, no job of pg-boss's (of any queue). */
export async function isEmptyShard(c: pg.ClientBase, bossSchema: string): Promise<boolean> {
  const r = await c.query<{ any: boolean; jobs: string | null }>(
    `select exists (select 1 from corral.actors) or exists (select 1 from corral.conversations) as any,
            to_regclass($1)::text as jobs`,
    [`${bossSchema}.job`],
  );
  if (r.rows[0]?.any !== false) return false;
  if (r.rows[0].jobs === null) return true;
  const jobs = await c.query<{ any: boolean }>(`select exists (select 1 from ${bossSchema}.job) as any`);
  return jobs.rows[0]?.any === false;
}

/** The catalog's map, as `shardCount` shards: rows past it removed, missing ones added with no URL. */
export async function resizeShardMap(c: pg.ClientBase, shardCount: number): Promise<void> {
  await c.query('delete from corral.shards where shard >= $1', [shardCount]);
  await c.query('insert into corral.shards (shard) select g from generate_series(0, $1::int - 1) as g on conflict (shard) do nothing', [
    shardCount,
  ]);
}

export async function readShardMap(c: pg.Pool | pg.ClientBase): Promise<ShardMapEntry[]> {
  const r = await c.query<{ shard: number; url: string | null }>('select shard, url from corral.shards order by shard');
  return r.rows.map((row) => ({ shard: row.shard, url: row.url }));
}

/**
 * The deployment's shard count (1 for a database migrated before shards) and where each shard
 * lives: the map's URL, or the catalog's (`catalogUrl`) when it names none.
 */
export async function readShardLayout(
  c: pg.Pool | pg.ClientBase,
  catalogUrl: string,
): Promise<{ shardCount: number; urlOf(shard: number): string }> {
  const id = await readShardIdentity((text) => c.query(text));
  const shardCount = id?.shardCount ?? 1;
  const urls = new Map(shardCount > 1 ? (await readShardMap(c)).map((e) => [e.shard, e.url]) : []);
  return { shardCount, urlOf: (shard) => urls.get(shard) ?? catalogUrl };
}

/** Sets a shard's URL (null: the catalog's database); false when the map has no such shard. */
export async function updateShardUrl(c: pg.ClientBase, shard: number, url: string | null): Promise<boolean> {
  const r = await c.query('update corral.shards set url = $2, updated_at = now() where shard = $1', [shard, url]);
  return (r.rowCount ?? 0) > 0;
}

/** Actors and queued events of one shard, for `corral shards list`. */
export async function shardCounts(
  c: pg.ClientBase,
  bossSchema: string,
  queue: string,
): Promise<{ actors: number; queued: number; emitsOut: number; emitsFailing: number }> {
  const r = await c.query<{ actors: string; queued: string }>(
    `select (select count(*) from corral.conversations) as actors,
            (select count(*) from ${bossSchema}.job where name = $1 and state in ('created', 'retry')) as queued`,
    [queue],
  );
  // the outbox of emits to other shards (a schema migrated before it has none)
  const out = (await tableExists(c, 'corral.shard_emits'))
    ? (
        await c.query<{ n: string; failing: string }>(
          'select count(*) as n, count(*) filter (where attempts > 0) as failing from corral.shard_emits',
        )
      ).rows[0]
    : undefined;
  return {
    actors: Number(r.rows[0]?.actors ?? 0),
    queued: Number(r.rows[0]?.queued ?? 0),
    emitsOut: Number(out?.n ?? 0),
    emitsFailing: Number(out?.failing ?? 0),
  };
}

/** Whether the table `schema.table` exists (a shard's schemas made yet). */
export async function tableExists(c: pg.ClientBase, qualified: string): Promise<boolean> {
  const r = await c.query<{ ok: boolean }>('select to_regclass($1) is not null as ok', [qualified]);
  return r.rows[0]?.ok === true;
}
