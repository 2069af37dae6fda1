/**
 * Operator use-cases of shards (src/base/shard-map.ts; docs/scaling.md, "Shards"): setting up a
 * database with N shards, the shard map, and moving a shard's URL.
 *
 *  H1 `migrateShards(url, N)` runs on the catalog (shard 0's database): it fixes N there (S2) and
 *     sets up every shard k > 0 at its URL (the catalog's own when the map names none): corral's
 *     migrations in `corral_s<k>`, pg-boss in `<boss>_s<k>`, the queues and SQL functions, and the
 *     shard's identity row. Run again, it sets up what is missing and changes nothing else.
 *  H2 N changes only while every shard is empty (no actor, no conversation, no job): a key placed on
 *     shard 0 of 1 would belong to another shard of 4. Otherwise `shard_count_fixed`, and nothing
 *     is written.
 *  H3 A shard's schema that says it is another shard, or of another count, is refused
 *     (`shard_count_fixed`): a URL pointing at the wrong database is found before anything is set up.
 */
import pg from 'pg';
import { checkShardCount, MAX_SHARDS, shardSchemas } from '../base/shard-map.ts';
import { CorralError, errorMessage } from '../base/errors.ts';
import { isConnectionString, maskUrl } from '../config.ts';
import { applyMigrations, withSetupLock } from '../db/migrate.ts';
import {
  isEmptyShard,
  readShardIdentity,
  readShardLayout,
  readShardMap,
  resizeShardMap,
  shardCounts,
  tableExists,
  updateShardUrl,
  writeShardIdentity,
  type ShardMapEntry,
} from '../db/shards/catalog.ts';
import { rewritingBossDb, rewritingClient, shardClientOf, shardSqlRewrite } from '../db/shards/shard-sql.ts';
import { openDatabase, type Database } from '../db/client.ts';
import { queuesOf } from '../queue/names.ts';
import type { Queues } from '../db/boss/jobs.ts';
import { MAX_SHARD_URL_LENGTH } from '../db/schema-shards.ts';
import { createBoss, ensureQueues, type QueueConfig } from '../queue/boss.ts';

export interface ShardSetupProgress {
  (shard: number, url: string, what: 'set up' | 'already set up'): void;
}

export interface ShardRow {
  shard: number;
  url: string | null;
  schemas: { corral: string; boss: string };
  actors: number | null;
  queued: number | null;
  /** Emits to other shards' actors waiting in this shard's outbox, and those whose delivery failed (docs/scaling.md). */
  emitsOut?: number;
  emitsFailing?: number;
  /** Why the counts are missing (the shard's database unreachable, not set up). */
  error?: string;
}

/** Validates a shard URL given by an operator. */
export function parseShardUrl(text: string): string {
  if (text.length === 0 || text.length > MAX_SHARD_URL_LENGTH) {
    throw new CorralError('invalid_argument', `invalid shard URL: expected 1 to ${MAX_SHARD_URL_LENGTH} characters`);
  }
  // DATABASE_URL's rule, less its socket forms: the map names databases on other hosts
  if (!/^postgres(ql)?:\/\//i.test(text) || !isConnectionString(text)) {
    throw new CorralError('invalid_argument', 'invalid shard URL: expected postgres://user:password@host:port/database');
  }
  return text;
}

/** Validates a shard number given by an operator. */
export function parseShardNumber(text: string): number {
  const n = /^\d{1,4}$/.test(text) ? Number(text) : NaN;
  if (!Number.isInteger(n) || n >= MAX_SHARDS) {
    throw new CorralError('invalid_argument', `invalid shard ${JSON.stringify(text)}: expected an integer from 0 to ${MAX_SHARDS - 1}`);
  }
  return n;
}

async function withClient<T>(url: string, fn: (c: pg.Client) => Promise<T>): Promise<T> {
  const c = new pg.Client({ connectionString: url, application_name: 'corral-shards', connectionTimeoutMillis: 10_000 });
  // an idle connection's error (the server restarted) fails the statement in flight, never the process
  c.on('error', () => undefined);
  try {
    await c.connect();
    return await fn(c);
  } finally {
    await c.end().catch(() => undefined);
  }
}

/** H1–H3 on the catalog at `catalogUrl` (already migrated as shard 0). */
export async function migrateShards(
  catalogUrl: string,
  shardCount: number,
  config: QueueConfig,
  progress: ShardSetupProgress = () => undefined,
): Promise<void> {
  checkShardCount(shardCount);
  const map = await withSetupLock(catalogUrl, async (c) => {
    const id = await readShardIdentity((text) => c.query(text));
    const current = id?.shardCount ?? 1;
    if (current !== shardCount) {
      // H2: every shard of the current count must be empty
      const before = await shardMapOf(c, current);
      for (const entry of before) {
        const empty = await onShard(catalogUrl, entry, config, (sc) => isEmptyShard(sc, shardSchemas(entry.shard, config.bossSchema).boss));
        if (!empty) {
          throw new CorralError(
            'shard_count_fixed',
            `this deployment has ${current} shard${current === 1 ? '' : 's'} and shard ${entry.shard} holds actors or events: ` +
              `the shard count is fixed once keys are placed (move shards to other databases to add capacity)`,
          );
        }
      }
      await writeShardIdentity(c, { shard: 0, shardCount });
    }
    await resizeShardMap(c, shardCount);
    return readShardMap(c);
  });
  // shard 0's SQL enqueue, made again for its identity (E10 of src/db/enqueue/send-event.ts)
  const boss = createBoss(catalogUrl, config);
  await boss.start();
  try {
    await ensureQueues(boss, config, { updateExisting: false, installFunctions: true });
  } finally {
    await boss.stop({ graceful: false, close: true });
  }
  for (const entry of map) {
    if (entry.shard === 0) continue;
    const url = entry.url ?? catalogUrl;
    const made = await setUpShard(url, entry.shard, shardCount, config);
    progress(entry.shard, url, made ? 'set up' : 'already set up');
  }
}

async function shardMapOf(c: pg.ClientBase, shardCount: number): Promise<ShardMapEntry[]> {
  const map = await readShardMap(c);
  if (map.length > 0) return map.filter((e) => e.shard < shardCount);
  return [{ shard: 0, url: null }];
}

/** Runs `fn` on shard `entry`'s schemas, or answers true when the shard was never set up. */
async function onShard<T>(
  catalogUrl: string,
  entry: ShardMapEntry,
  config: QueueConfig,
  fn: (c: pg.ClientBase) => Promise<T>,
): Promise<T | true> {
  return withClient(entry.url ?? catalogUrl, async (raw) => {
    const names = shardSchemas(entry.shard, config.bossSchema);
    if (!(await tableExists(raw, `${names.corral}.actors`))) return true;
    return fn(rewritingClient(raw, shardSqlRewrite(entry.shard, config.bossSchema)));
  });
}

/** Sets up shard k > 0 at `url` (H1, H3); true when something was made. */
export async function setUpShard(url: string, shard: number, shardCount: number, config: QueueConfig): Promise<boolean> {
  const rewrite = shardSqlRewrite(shard, config.bossSchema);
  const names = shardSchemas(shard, config.bossSchema);
  return withSetupLock(url, async (raw) => {
    const c = rewritingClient(raw, rewrite);
    // H3: a schema that is another shard, or of another count while it holds anything
    const id = await readShardIdentity((text) => c.query(text));
    if (id && (id.shard !== shard || (id.shardCount !== shardCount && !(await isEmptyShard(c, names.boss))))) {
      throw new CorralError(
        'shard_count_fixed',
        `the schema ${names.corral} at ${maskUrl(url)} is shard ${id.shard} of ${id.shardCount}, not shard ${shard} of ${shardCount}`,
      );
    }
    await applyMigrations(c as pg.Client, shard);
    await writeShardIdentity(c, { shard, shardCount });
    const boss = createBoss(url, { ...config, bossSchema: names.boss }, { db: rewritingBossDb(raw, rewrite) });
    await boss.start();
    try {
      await ensureQueues(boss, { ...config, bossSchema: names.boss }, { updateExisting: false, installFunctions: true });
    } finally {
      await boss.stop({ graceful: false, close: false });
    }
    return id === undefined;
  });
}

/** `corral shards list`: every shard of the catalog with its counts, read in parallel (at most 8 at once). */
export async function listShards(catalogUrl: string, config: QueueConfig & { queueName: string }): Promise<ShardRow[]> {
  const map = await withClient(catalogUrl, async (c) => {
    return (await tableExists(c, 'corral.shards')) ? shardMapOf(c, MAX_SHARDS) : [{ shard: 0, url: null }];
  });
  const rows: ShardRow[] = new Array<ShardRow>(map.length);
  let next = 0;
  const work = async () => {
    for (let i = next++; i < map.length; i = next++) {
      const entry = map[i]!;
      const schemas = shardSchemas(entry.shard, config.bossSchema);
      try {
        const counts = await onShard(catalogUrl, entry, config, (c) => shardCounts(c, schemas.boss, config.queueName));
        rows[i] =
          counts === true
            ? { ...entry, schemas, actors: null, queued: null, error: 'not set up (corral db migrate --shards N)' }
            : { ...entry, schemas, ...counts };
      } catch (e) {
        rows[i] = { ...entry, schemas, actors: null, queued: null, error: errorMessage(e) };
      }
    }
  };
  await Promise.all(Array.from({ length: Math.min(8, map.length) }, work));
  return rows;
}

/** `corral shards set-url`: the catalog's URL for `shard` (null: the catalog's database). */
export async function setShardUrl(catalogUrl: string, shard: number, url: string | null): Promise<void> {
  const found = await withClient(catalogUrl, (c) => updateShardUrl(c, shard, url));
  if (!found) throw new CorralError('not_found', `no shard ${shard} in the shard map (corral shards list shows them)`);
}

/**
 * Runs `fn` on every shard k > 0 of the deployment whose catalog is `catalog` (at `catalogUrl`),
 * one shard at a time, each on a connection of its own whose statements name the shard's schemas;
 * the results by shard (from 1). Undefined for a deployment of one shard. For reads across shards
 * (`corral status`): shard 0 is the caller's own database.
 */
export async function onOtherShards<T>(
  catalog: pg.Pool | pg.ClientBase,
  catalogUrl: string,
  config: QueueConfig,
  fn: (db: Database, queues: Queues, shard: number) => Promise<T>,
): Promise<T[] | undefined> {
  const layout = await readShardLayout(catalog, catalogUrl);
  if (layout.shardCount <= 1) return undefined;
  const out: T[] = [];
  for (let k = 1; k < layout.shardCount; k++) {
    const Client = shardClientOf(k, config.bossSchema);
    const database = openDatabase(layout.urlOf(k), { max: 1, applicationName: 'corral-shards', Client });
    try {
      out.push(await fn(database, queuesOf({ ...config, bossSchema: shardSchemas(k, config.bossSchema).boss }), k));
    } finally {
      await database.close();
    }
  }
  return out;
}
