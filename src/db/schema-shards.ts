/**
 * The shard tables (src/base/shard-map.ts; docs/scaling.md, "Shards"). Every shard's schema has both;
 * what they hold depends on the schema:
 *  - `shard_identity`, one row: which shard of how many this schema is. Written when the schema is
 *    migrated and never changed after (S2), so a daemon or a producer pointed at the wrong
 *    database or schema finds out before it writes an actor's rows there.
 *  - `shards`, in shard 0's schema only (the catalog): every shard, and the database it lives in
 *    (null: the catalog's own). A shard is moved by changing its URL here, never its number.
 *  - `shard_emits`, a shard's outbox of events its turns emitted to actors of other shards: written
 *    in the commit, delivered to the target shard by the relay (src/runtime/shard-relay.ts) and
 *    deleted once the target committed them, in `id` order.
 *  - `shard_inbox`, the events a shard took from other shards' outboxes, by event id: a second
 *    delivery of one (the relay died between the target's commit and its own delete) enqueues nothing.
 */
import { sql, bigserial, boolean, check, index, integer, jsonb, text, uuid } from './orm.ts';
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

export const shardEmits = corral.table(
  'shard_emits',
  {
    id: bigserial('id', { mode: 'number' }).primaryKey(),
    targetShard: integer('target_shard').notNull(),
    eventId: uuid('event_id').notNull().unique(),
    agentUid: text('agent_uid').notNull(),
    sessionId: text('session_id').notNull(),
    /** The event job's data, as the target's queue takes it (src/queue/event-job.ts). */
    data: jsonb('data').notNull(),
    delayMs: integer('delay_ms'),
    attempts: integer('attempts').notNull().default(0),
    lastError: text('last_error'),
    createdAt: tz('created_at').notNull().defaultNow(),
  },
  (t) => [
    index('shard_emits_target').on(t.targetShard, t.id),
    check('shard_emits_target_shard', sql`${t.targetShard} between 0 and 1023`),
    check('shard_emits_delay', sql`${t.delayMs} is null or ${t.delayMs} >= 0`),
  ],
);

export const shardInbox = corral.table(
  'shard_inbox',
  {
    eventId: uuid('event_id').primaryKey(),
    sourceShard: integer('source_shard').notNull(),
    receivedAt: tz('received_at').notNull().defaultNow(),
  },
  (t) => [index('shard_inbox_received').on(t.receivedAt)],
);
