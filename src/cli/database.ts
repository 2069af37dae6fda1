/**
 * The logger of a command and its connection to the database it uses (src/db/resolve.ts: the
 * embedded server under `CORRAL_HOME` when DATABASE_URL is unset, started on demand). Free of
 * Drizzle and pg-boss, so that light commands (`corral send`) load little.
 */
import type { Config } from '../config.ts';
import { recordedEmbeddedPostgres } from '../db/embedded.ts';
import { logEmbedded, resolveDatabase, type ResolvedDatabase } from '../db/resolve.ts';
import { maskUrl } from '../config.ts';
import { CorralError, isConnectionError, isDatabaseUnavailable, toError } from '../errors.ts';
import { createLogger, type Logger } from '../logger.ts';

export { resolveDatabase, type ResolvedDatabase } from '../db/resolve.ts';

export function commandLogger(config: Config, opts: { daemon?: boolean } = {}): Logger {
  // Short commands keep stdout for their output: their logs go to stderr, warnings only.
  if (!opts.daemon) return createLogger({ level: config.logLevel === 'info' ? 'warn' : config.logLevel, destination: 2 });
  return createLogger({ level: config.logLevel, pretty: config.logPretty });
}

/**
 * A short command's connection to its database, made by `connect` (which cleans up after itself
 * when it fails). With the embedded server, the first try goes straight to the server the home
 * recorded: the command's own connection is then the check that it runs and is ours (E1 in
 * db/embedded.ts), instead of a check connection of its own before it, which costs the server a
 * backend start (~20 ms of a read command). Only when that fails is the server ensured (started
 * if need be) and `connect` tried again.
 */
export async function connectDatabase<T>(config: Config, logger: Logger, connect: (url: string) => Promise<T>): Promise<T> {
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
