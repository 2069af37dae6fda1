/**
 * What the commands that set rows of one of corral's tables share (`corral retention`,
 * `corral policy`): how they are registered, and their database, opened only when a command
 * runs so that `--help` and argument errors answer without loading the database modules.
 */
import type { Config } from '../../config.ts';
import type { Db } from '../../db/client.ts';

export type ConfigFn = () => Config;
export type RunFn = (p: Promise<number>) => void;
export interface Io {
  out: NodeJS.WritableStream;
  err: NodeJS.WritableStream;
}

/** Runs `fn` on one connection of corral's database, then closes it. */
export async function withDatabase<T>(config: Config, fn: (db: Db) => Promise<T>): Promise<T> {
  const { withCommandDatabase } = await import('../context.ts');
  return withCommandDatabase(config, fn);
}
