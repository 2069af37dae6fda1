/**
 * The database a daemon or a command uses: `databaseUrl` when set, else the embedded server under
 * `homeDir`, started on demand (src/db/embedded.ts). Free of Drizzle and pg-boss, so that light
 * commands (`corral send`) load little.
 */
import type { Config } from '../config.ts';
import { CorralError, toError } from '../errors.ts';
import type { Logger } from '../logger.ts';
import { ensureEmbeddedPostgres, type EmbeddedServer } from './embedded.ts';

export interface ResolvedDatabase {
  url: string;
  /** The embedded server, when `databaseUrl` is unset (`startedHere`: this call started it). */
  embedded: EmbeddedServer | undefined;
}

export async function resolveDatabase(
  config: Pick<Config, 'databaseUrl' | 'homeDir' | 'embeddedRootDir'>,
  logger: Logger,
): Promise<ResolvedDatabase> {
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

export function logEmbedded(config: Pick<Config, 'homeDir'>, logger: Logger, embedded: EmbeddedServer): void {
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
