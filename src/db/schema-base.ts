/** What every module of the Drizzle schema shares: the `corral` schema and the timestamp column. */
import { pgSchema, timestamp } from './orm.ts';

/** Shard 0's schema; shard k's tables are these in `corral_s<k>` (src/base/shard-map.ts, S3). */
export const corral = pgSchema('corral');

export const tz = (name: string) => timestamp(name, { withTimezone: true, mode: 'date' });
