/**
 * The observability HTTP server as a supervised child of the daemon (`extraChildren`): it binds the
 * metrics' scrape-time gauges to the daemon's database, serves until the supervisor aborts it,
 * then closes. Readiness = the daemon is `running` and the database answers a ping (`ping` in db/health.ts).
 */
import type { Daemon } from '../daemon/daemon.ts';
import { ping } from '../db/postgres/health.ts';
import { CorralError, toError } from '../base/errors.ts';
import type { Logger } from '../base/logger.ts';
import { queuesOf } from '../queue/boss.ts';
import type { ChildSpec } from '../supervisor/index.ts';
import { startObservabilityServer, type ObservabilityServer, type Readiness } from './http.ts';
import { databaseSource, type Metrics } from './metrics.ts';

export interface ObservabilityChildOptions {
  host: string;
  port: number;
  metrics: Metrics;
  logger: Logger;
  /** Called each time the server listens (its port, when `port` is 0). */
  onListening?: (server: ObservabilityServer) => void;
  /**
   * A server already listening (see `listenForObservability`), served by the first generation:
   * the daemon binds its port before it starts, so a port in use stops it at once instead of
   * failing in a supervised child that restarts forever. Later generations bind again.
   */
  server?: ObservabilityServer;
}

/** Binds the observability server for `daemon`; a port that cannot be bound is a clear `invalid_config`. */
export async function listenForObservability(
  daemon: Daemon,
  opts: Pick<ObservabilityChildOptions, 'host' | 'port' | 'metrics' | 'logger'>,
): Promise<ObservabilityServer> {
  try {
    return await startObservabilityServer({
      host: opts.host,
      port: opts.port,
      registry: opts.metrics.registry,
      ready: () => daemonReadiness(daemon, opts.logger),
      logger: opts.logger,
    });
  } catch (e) {
    throw new CorralError('invalid_config', `the metrics server cannot listen on ${opts.host}:${opts.port}: ${toError(e).message}`, {
      cause: e,
    });
  }
}

export async function daemonReadiness(daemon: Daemon, logger?: Logger): Promise<Readiness> {
  if (daemon.state !== 'running') return { ready: false, reason: `daemon is ${daemon.state}` };
  try {
    await ping(daemon.database.pool);
    return { ready: true };
  } catch (e) {
    // The endpoint may be reachable by anyone who reaches the port: the driver's text (host
    // names, user names, server versions) goes to the log only.
    logger?.warn({ err: (e as Error).message }, 'readiness: database check failed');
    return { ready: false, reason: 'database unreachable' };
  }
}

export function observabilityChild(opts: ObservabilityChildOptions): ChildSpec<Daemon> {
  let bound = opts.server;
  return {
    name: 'observability-http',
    policy: 'permanent',
    restartDelayMs: 1_000,
    factory: async (daemon, signal) => {
      opts.metrics.setSource(databaseSource(daemon.database.db, queuesOf(daemon.config)));
      opts.metrics.setBrokerSource(() => daemon.broker.stats());
      opts.metrics.setContextSource(() => daemon.runtime.contexts.stats);
      const server = bound ?? (await listenForObservability(daemon, opts));
      bound = undefined;
      opts.logger.info({ url: server.url, endpoints: ['/metrics', '/healthz', '/readyz'] }, 'observability server listening');
      opts.onListening?.(server);
      try {
        if (!signal.aborted) await new Promise<void>((resolve) => signal.addEventListener('abort', () => resolve(), { once: true }));
      } finally {
        await server.close();
      }
    },
  };
}
