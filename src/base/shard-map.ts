/**
 * The map from an actor key to its shard, and the names of a shard's schemas
 * (docs/scaling.md, "Shards").
 *
 *  S1 An actor's shard is `uint32(first 4 bytes of SHA-256("<agent_uid>/<session_id>")) mod N`,
 *     the 4 bytes read big-endian, the key's text form being its pg-boss singleton key (ASCII, so
 *     its UTF-8 bytes are its characters). Any language with SHA-256 computes it; the SQL function
 *     `corral.shard_of(agent_uid, session_id, shard_count)` gives the same number.
 *  S2 N, the shard count, is fixed when a database is first migrated (`corral db migrate
 *     --shards N`): changing it would move keys between shards. Capacity grows by moving whole
 *     shards to other databases, never by changing N.
 *  S3 Shard 0 is today's layout: schemas `corral` and the configured pg-boss schema. Shard k > 0
 *     lives in `corral_s<k>` and `<pg-boss schema>_s<k>`, in the database the shard map names
 *     for it (the catalog's own database when it names none).
 */
import { createHash } from 'node:crypto';
import type { ActorKey } from './actor-key.ts';
import { CorralError } from './errors.ts';

/** The most shards a deployment may have. */
export const MAX_SHARDS = 1024;

/** The schema of corral's tables in shard 0 (today's layout). */
export const BASE_SCHEMA = 'corral';

export interface ShardSchemas {
  /** corral's tables and functions. */
  corral: string;
  /** pg-boss's tables. */
  boss: string;
}

/** S1: the shard of `key` among `shardCount` shards. */
export function shardOf(key: ActorKey, shardCount: number): number {
  checkShardCount(shardCount);
  if (shardCount === 1) return 0;
  const digest = createHash('sha256').update(`${key.agentUid}/${key.sessionId}`, 'utf8').digest();
  return digest.readUInt32BE(0) % shardCount;
}

/** S3: the schemas of shard `shard`, given the pg-boss schema of shard 0. */
export function shardSchemas(shard: number, bossSchema: string): ShardSchemas {
  if (!Number.isInteger(shard) || shard < 0 || shard >= MAX_SHARDS) {
    throw new CorralError('invalid_argument', `invalid shard ${String(shard)}: expected an integer from 0 to ${MAX_SHARDS - 1}`);
  }
  return shard === 0 ? { corral: BASE_SCHEMA, boss: bossSchema } : { corral: `${BASE_SCHEMA}_s${shard}`, boss: `${bossSchema}_s${shard}` };
}

/** Throws `invalid_argument` unless `n` is a shard count (1 to MAX_SHARDS). */
export function checkShardCount(n: number): number {
  if (!Number.isInteger(n) || n < 1 || n > MAX_SHARDS) {
    throw new CorralError('invalid_argument', `invalid shard count ${String(n)}: expected an integer from 1 to ${MAX_SHARDS}`);
  }
  return n;
}

/** The shards a daemon serves (`corral daemon --shards`, CORRAL_SHARDS): `all`, or a list such as `0,3,5`. */
export const SERVED_SHARDS_PATTERN = /^(all|\d{1,4}(,\d{1,4}){0,1023})$/;

/**
 * The shard numbers `text` names among `shardCount` shards, ascending; `invalid_config` for a
 * number past the count or named twice.
 */
export function servedShards(text: string, shardCount: number): number[] {
  checkShardCount(shardCount);
  if (!SERVED_SHARDS_PATTERN.test(text)) {
    throw new CorralError(
      'invalid_config',
      `invalid CORRAL_SHARDS ${JSON.stringify(text.slice(0, 100))}: expected all or shard numbers such as 0,3,5`,
    );
  }
  if (text === 'all') return Array.from({ length: shardCount }, (_, i) => i);
  const list = text.split(',').map(Number);
  const past = list.find((n) => n >= shardCount);
  if (past !== undefined)
    throw new CorralError(
      'invalid_config',
      `no shard ${past}: the deployment has ${shardCount} shard${shardCount === 1 ? '' : 's'} (0 to ${shardCount - 1})`,
    );
  if (new Set(list).size !== list.length)
    throw new CorralError('invalid_config', `CORRAL_SHARDS names a shard twice: ${text.slice(0, 100)}`);
  return list.sort((a, b) => a - b);
}
