/**
 * The shard tables (src/base/shard-map.ts; docs/scaling.md, "Shards"). Every shard's schema has both;
 * what they hold depends on the schema:
 *  - `shard_identity`, one row: which shard of how many this schema is. Written when the schema is
 *    migrated and never changed after (S2), so a daemon or a producer pointed at the wrong
 *    database or schema finds out before it writes an actor's rows there.
 *  - `shards`, in shard 0's schema only (the catalog): every shard, and the database it lives in
 *    (null: the catalog's own). A shard is moved by changing its URL here, never its number.
 */
import { sql, boolean, check, integer, text } from './orm.ts';
import { corral, tz } from './schema-base.ts';

/** The longest database URL the shard map stores. */
export const MAX_SHARD_URL_LENGTH = 2048;

export const shardIdentity = corral.table(
  'shard_identity',
  {
    // one row: the primary key admits only true
    one: boolean('one').primaryKey().default(true),
    shard: integer('shard').notNull(),
    shardCount: integer('shard_count').notNull(),
    createdAt: tz('created_at').notNull().defaultNow(),
  },
  (t) => [
    check('shard_identity_one', sql`${t.one}`),
    check('shard_identity_count', sql`${t.shardCount} between 1 and 1024`),
    check('shard_identity_shard', sql`${t.shard} >= 0 and ${t.shard} < ${t.shardCount}`),
  ],
);

export const shards = corral.table(
  'shards',
  {
    shard: integer('shard').primaryKey(),
    url: text('url'),
    updatedAt: tz('updated_at').notNull().defaultNow(),
  },
  (t) => [
    check('shards_shard', sql`${t.shard} between 0 and 1023`),
    check('shards_url', sql.raw(`url is null or char_length(url) between 1 and ${MAX_SHARD_URL_LENGTH}`)),
  ],
);
