/**
 * The database a process uses: DATABASE_URL when set, else the embedded server under
 * `CORRAL_HOME` (started on demand, shared by every corral process of that home). The CLI's
 * commands and the client (`connect()`, src/client/) resolve it here, so both find the same one.
 * Free of Drizzle and pg-boss, so that light commands (`corral send`) load little.
 */
import type { Config } from '../../config.ts';
import { ensureEmbeddedPostgres, recordedEmbeddedPostgres, type EmbeddedServer } from './embedded.ts';
import { maskUrl } from '../../config.ts';
import { CorralError, isConnectionError, isDatabaseUnavailable, toError } from '../../base/errors.ts';
import type { Logger } from '../../base/logger.ts';

export type DatabaseConfig = Pick<Config, 'databaseUrl' | 'homeDir' | 'embeddedRootDir'> & Partial<Pick<Config, 'setupWaitMs'>>;

export interface ResolvedDatabase {
  url: string;
  embedded: EmbeddedServer | undefined;
}

export async function resolveDatabase(config: DatabaseConfig, logger: Logger): Promise<ResolvedDatabase> {
  if (config.databaseUrl) return { url: config.databaseUrl, embedded: undefined };
  try {
    const embedded = await ensureEmbeddedPostgres({
      homeDir: config.homeDir,
      rootDir: config.embeddedRootDir,
      onWait: (pid) =>
        logger.info({ home: config.homeDir, holder: pid }, 'waiting for another corral process to start the embedded PostgreSQL'),
    });
    logEmbedded(config, logger, embedded);
    return { url: embedded.url, embedded };
  } catch (e) {
    if (e instanceof CorralError) throw e;
    throw new CorralError('database_unavailable', `could not start the embedded PostgreSQL: ${toError(e).message}`, {
      cause: e,
    });
  }
}

export function logEmbedded(config: DatabaseConfig, logger: Logger, embedded: EmbeddedServer): void {
  logger.info(
    {
      home: config.homeDir,
      data: embedded.dataDir,
      ...(embedded.binDir ? { binaries: embedded.binDir } : {}),
      started: embedded.startedHere,
    },
    embedded.startedHere ? 'started the embedded PostgreSQL' : 'using the embedded PostgreSQL',
  );
}

/**
 * A short command's connection to its database, made by `connect` (which cleans up after itself
 * when it fails). With the embedded server, the first try goes straight to the server the home
 * recorded: the command's own connection is then the check that it runs and is ours (E1 in
 * db/embedded.ts), instead of a check connection of its own before it, which costs the server a
 * backend start (~20 ms of a read command). Only when that fails is the server ensured (started
 * if need be) and `connect` tried again.
 */
export async function connectDatabase<T>(config: DatabaseConfig, logger: Logger, connect: (url: string) => Promise<T>): Promise<T> {
  if (!config.databaseUrl) {
    const recorded = await recordedEmbeddedPostgres({ homeDir: config.homeDir, rootDir: config.embeddedRootDir });
    if (recorded) {
      const connected = await connect(recorded.url).catch(() => undefined);
      if (connected !== undefined) {
        logEmbedded(config, logger, recorded);
        return connected;
      }
    }
  }
  const resolved = await resolveDatabase(config, logger);
  try {
    return await connect(resolved.url);
  } catch (e) {
    throw unreachable(resolved, e);
  }
}

/** A command's first contact with the database failed: a clear `database_unavailable`, or `e` as is. */
export function unreachable(db: ResolvedDatabase, e: unknown): unknown {
  if (!isDatabaseUnavailable(e)) return e;
  // the embedded server is corral's own: only a DATABASE_URL can be wrong
  const hint = isConnectionError(e) && !db.embedded ? ' (is DATABASE_URL right and the server up?)' : '';
  return new CorralError('database_unavailable', `cannot reach the database at ${maskUrl(db.url)}: ${toError(e).message}${hint}`, {
    cause: e,
  });
}

/** The embedded server a daemon started goes with it (one that found it running leaves it). */
export async function stopEmbeddedIfStartedHere(embedded: EmbeddedServer | undefined, logger: Logger): Promise<void> {
  if (!embedded?.startedHere) return;
  try {
    await embedded.stop();
    logger.info({ data: embedded.dataDir }, 'stopped the embedded PostgreSQL this daemon started');
  } catch (e) {
    logger.warn({ err: toError(e).message, data: embedded.dataDir }, 'could not stop the embedded PostgreSQL');
  }
}
