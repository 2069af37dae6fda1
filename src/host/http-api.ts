/**
 * The HTTP API (src/http/) as the daemon runs it when `httpPort` is set: its own client of the
 * daemon's database, for sends and reads, and its own small pool for tokens and event states, so
 * that API traffic never waits for a connection the runtime's turns need. Loaded only when the
 * API is on: Fastify is no part of a daemon's start-up otherwise.
 */
import type { Config } from '../config.ts';
import { CorralError, toError } from '../base/errors.ts';
import type { Logger } from '../base/logger.ts';
import type { WorkerKeys } from '../http/console/index.ts';

export interface HostedApi {
  /** `http://host:port`. */
  readonly url: string;
  /** Stops taking requests, ends the streams, closes the connections. Idempotent. */
  close(): Promise<void>;
}

/** Connections of the API's client (sends, transcripts) and of its pool (tokens, event states). */
const CLIENT_CONNECTIONS = 8;
const POOL_CONNECTIONS = 4;

/**
 * Starts the API on `config.httpPort`, with the chat page when `config.httpUi`; a port that
 * cannot be bound, or a chat page that cannot be read, is a clear `invalid_config`.
 */
export async function startHostedApi(config: Config, databaseUrl: string, logger: Logger): Promise<HostedApi> {
  const [{ startApiServer }, { connect }, { openDatabase }] = await Promise.all([
    import('../http/server.ts'),
    import('../client/client.ts'),
    import('../db/client.ts'),
  ]);
  const log = logger.child({ component: 'http-api' });
  const corral = await connect({
    databaseUrl,
    env: {},
    queueName: config.queueName,
    bossSchema: config.bossSchema,
    maxEventBytes: config.maxEventBytes,
    maxConnections: CLIENT_CONNECTIONS,
    applicationName: 'corral-http',
    logger: log,
  });
  const database = openDatabase(databaseUrl, {
    max: POOL_CONNECTIONS,
    applicationName: 'corral-http',
    onError: (e) => log.warn({ err: e.message }, 'database connection error'),
  });
  const release = async () => {
    await corral.close().catch((e: unknown) => log.warn({ err: toError(e) }, 'the API client did not close cleanly'));
    await database.close();
  };
  const port = config.httpPort ?? 0;
  let server: Awaited<ReturnType<typeof startApiServer>>;
  try {
    server = await startApiServer({
      host: config.httpHost,
      port,
      corral,
      db: database.db,
      config,
      logger,
      ui: config.httpUi ? {} : undefined,
      // the operator console (src/http/console/): with CURVE on, the allow-list is this daemon's to revoke from
      console: { databaseUrl, config, workerKeys: config.insecure ? undefined : await workerKeysOf(config) },
    });
  } catch (e) {
    await release();
    // the chat page's folder missing (CORRAL_HTTP_UI) says so itself
    if (e instanceof CorralError && e.code === 'invalid_config') throw e;
    throw new CorralError('invalid_config', `the HTTP API cannot listen on ${config.httpHost}:${port}: ${toError(e).message}`, {
      cause: e,
    });
  }
  let closed: Promise<void> | undefined;
  return {
    url: server.url,
    close() {
      closed ??= server.close().finally(release);
      return closed;
    },
  };
}

/** The allow-list as `corral keys list | revoke` reads and changes it (the console's Workers view). */
async function workerKeysOf(config: Config): Promise<WorkerKeys> {
  const keys = await import('../fabric/keys.ts');
  const { rmSync } = await import('node:fs');
  const paths = keys.keyPaths(config.homeDir, {
    ...(config.daemonKeyFile ? { daemonKeyFile: config.daemonKeyFile } : {}),
    ...(config.allowlistFile ? { allowlistFile: config.allowlistFile } : {}),
  });
  return {
    list: () =>
      keys.readAllowlist(paths.allowlist).map((e) => ({
        workerId: e.worker_id,
        publicKey: e.public_key,
        capacity: e.capacity ?? null,
        agents: e.agents ?? null,
        createdAt: e.created_at ?? null,
      })),
    revoke(workerId) {
      const revoked = keys.revokeWorkerKey(paths, workerId);
      // a key file issued under CORRAL_HOME for a local worker goes too, as with corral keys revoke
      if (revoked) rmSync(keys.workerKeyPath(paths, workerId), { force: true });
      return revoked;
    },
  };
}
