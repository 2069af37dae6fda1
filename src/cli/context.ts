/**
 * What every command needs: the resolved configuration, a logger, and the database (the embedded
 * server under `.corral/` when DATABASE_URL is unset, started on demand).
 */
import { loadConfig, type Config } from '../config.ts';
import type { Database, Db } from '../db/client.ts';
import { openUsableDatabase } from '../db/postgres/open.ts';
import type { Logger } from '../base/logger.ts';
import { commandLogger } from './database.ts';
import type { PgBoss } from 'pg-boss';

export interface GlobalOptions {
  logLevel?: string;
  pretty?: boolean;
}

export { commandLogger, resolveDatabase, type ResolvedDatabase } from './database.ts';

export function resolveConfig(overrides: Partial<Config> = {}): Config {
  return loadConfig(overrides, process.env);
}

export interface CommandContext {
  config: Config;
  logger: Logger;
  database: Database;
  close(): Promise<void>;
  /** A started pg-boss (no maintenance); the queues exist afterwards. */
  boss(): Promise<PgBoss>;
}

export interface ContextOptions {
  /** Default true. */
  needsSchema?: boolean;
  /**
   * Connections of the pool, default 4. A command that only reads, outside transactions, takes
   * 1: its parallel reads (`corral status` makes five) then queue on one connection, which for
   * reads this small is quicker than the server starting three more backends (~12 ms).
   */
  connections?: number;
}

/**
 * Opens the database for a short command and checks that it is reachable and carries corral's
 * schema (unless `needsSchema` is false).
 */
export async function openCommandContext(config: Config, opts: ContextOptions = {}): Promise<CommandContext> {
  const logger = commandLogger(config);
  const database = await openUsableDatabase(config, logger, {
    max: opts.connections ?? 4,
    applicationName: 'corral-cli',
    needsSchema: opts.needsSchema ?? true,
    onSetupWait: (message) => process.stderr.write(`corral: ${message}\n`),
  });
  const { url } = database;
  let boss: PgBoss | undefined;
  return {
    config,
    logger,
    database,
    async boss() {
      if (!boss) {
        // Loaded here: most commands read corral's tables and never need pg-boss.
        const { createBoss, ensureQueues } = await import('../queue/boss.ts');
        boss = createBoss(url, config, { max: 4, onError: (e) => logger.warn({ err: e.message }, 'pg-boss error') });
        await boss.start();
        await ensureQueues(boss, config, { updateExisting: false });
      }
      return boss;
    },
    async close() {
      await boss?.stop({ graceful: false, close: true }).catch(() => undefined);
      await database.close();
    },
  };
}

/** Runs `fn` on one connection of corral's database (a command that only reads or writes corral's tables), then closes it. */
export async function withCommandDatabase<T>(config: Config, fn: (db: Db) => Promise<T>): Promise<T> {
  const ctx = await openCommandContext(config, { connections: 1 });
  try {
    return await fn(ctx.database.db);
  } finally {
    await ctx.close();
  }
}
