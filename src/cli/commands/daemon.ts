/**
 * `corral daemon [--workers N] [--metrics-port P]`: migrations, then the daemon (and N local example
 * workers). With a metrics port (flag or CORRAL_METRICS_PORT) the runtime's metrics are bound to
 * Prometheus counters and an HTTP server (/metrics, /healthz, /readyz) runs as a supervised child.
 */
import { createHash } from 'node:crypto';
import { hostname } from 'node:os';
import { fileURLToPath } from 'node:url';
import { DEFAULTS, type Config } from '../../config.ts';
import { Daemon } from '../../daemon.ts';
import { toError } from '../../errors.ts';
import type { Logger } from '../../logger.ts';
import type { EmbeddedServer } from '../../db/embedded.ts';
import { listenForObservability, observabilityChild } from '../../observability/daemon-child.ts';
import type { ObservabilityServer } from '../../observability/http.ts';
import { createMetrics, type Metrics } from '../../observability/metrics.ts';
import { processChild, type ChildSpec } from '../../supervisor/index.ts';
import { commandLogger, resolveDatabase } from '../database.ts';
import { parentWatchReason, STOP_WITH_PARENT_ENV, watchParent } from '../parent-watch.ts';
import { StopRequests, type StopSource } from '../stop-requests.ts';
import { ensureLocalWorkerKey, keyPaths } from '../../fabric/keys.ts';

const CORRAL_BIN = fileURLToPath(new URL('../../../bin/corral.js', import.meta.url));

export interface DaemonCommandOptions {
  workers: number;
  workerCapacity: number;
}

/**
 * The id of the daemon's local worker `n`: `<host>-local-<n>` on the default endpoint; on any
 * other, a short tag of the endpoint goes in (`<host>-local-<tag>-<n>`). Two daemons on one host
 * (they cannot share an endpoint) so never give their workers the same id, which would be one
 * `corral.workers` row for two workers. The id stays the same across restarts, and so does its key.
 */
export function localWorkerId(host: string, endpoint: string, n: number): string {
  const name = host.replace(/[^A-Za-z0-9._:-]/g, '-').slice(0, 40);
  if (endpoint === DEFAULTS.endpoint) return `${name}-local-${n}`;
  return `${name}-local-${createHash('sha256').update(endpoint).digest('hex').slice(0, 6)}-${n}`;
}

/**
 * The daemon's own workers: each gets its key file under `CORRAL_HOME/keys/workers/` (issued on
 * first start, reused afterwards) and is started with `--key-file`, so `npm start` needs no
 * set-up step and still runs CURVE with a per-worker key.
 */
function localWorkers(count: number, capacity: number, config: Config): (endpoint: string) => ChildSpec<Daemon>[] {
  const host = hostname();
  return (endpoint) =>
    Array.from({ length: count }, (_, i) => {
      // the configured endpoint, not the bound one: with port 0 the id would change at every start
      const id = localWorkerId(host, config.endpoint, i + 1);
      const security = config.insecure
        ? ['--insecure']
        : [
            '--key-file',
            ensureLocalWorkerKey(
              keyPaths(config.homeDir, {
                ...(config.daemonKeyFile ? { daemonKeyFile: config.daemonKeyFile } : {}),
                ...(config.allowlistFile ? { allowlistFile: config.allowlistFile } : {}),
              }),
              id,
            ),
          ];
      return {
        name: `worker:${id}`,
        policy: 'permanent' as const,
        restartDelayMs: 200,
        factory: processChild({
          command: process.execPath,
          args: [CORRAL_BIN, 'worker', '--id', id, '--endpoint', endpoint, '--capacity', String(capacity), ...security],
          env: { ...process.env, CORRAL_LOG_LEVEL: config.logLevel, [STOP_WITH_PARENT_ENV]: '1' },
          killTimeoutMs: 5_000,
        }),
      };
    });
}

function extraChildren(
  config: Config,
  opts: DaemonCommandOptions,
  metrics: Metrics | undefined,
  logger: Logger,
  boundServer: () => ObservabilityServer | undefined,
): ((endpoint: string) => ChildSpec<Daemon>[]) | undefined {
  const workers = opts.workers > 0 ? localWorkers(opts.workers, opts.workerCapacity, config) : undefined;
  const http = (server: ObservabilityServer | undefined) =>
    metrics && config.metricsPort !== undefined
      ? observabilityChild({ host: config.metricsHost, port: config.metricsPort, metrics, logger, ...(server ? { server } : {}) })
      : undefined;
  if (!workers && !(metrics && config.metricsPort !== undefined)) return undefined;
  return (endpoint) => {
    const child = http(boundServer());
    return [...(child ? [child] : []), ...(workers?.(endpoint) ?? [])];
  };
}

/** The embedded PostgreSQL this daemon started goes with it (a command that found it running leaves it). */
async function stopEmbedded(embedded: EmbeddedServer, logger: Logger): Promise<void> {
  try {
    await embedded.stop();
    logger.info({ data: embedded.dataDir }, 'stopped the embedded PostgreSQL this daemon started');
  } catch (e) {
    logger.warn({ err: toError(e).message, data: embedded.dataDir }, 'could not stop the embedded PostgreSQL');
  }
}

/**
 * Runs the daemon until a stop is requested (see stop-requests.ts): SIGINT and SIGTERM drain
 * in-flight turns for `CORRAL_DRAIN_MS`, then stop the local workers, the daemon, and the
 * embedded PostgreSQL if this command started it; a real second request exits at once (130).
 * A daemon that cannot start (its endpoint or metrics port in use, the database unreachable)
 * releases everything and fails with that message.
 */
export async function runDaemonCommand(config: Config, opts: DaemonCommandOptions): Promise<number> {
  const logger = commandLogger(config, { daemon: true });
  const requests = new StopRequests();
  let stopRequestedAtMs: number | undefined;
  let daemon: Daemon | undefined;
  let stopping: Promise<unknown> | undefined;
  const requestStop = (source: StopSource, detail: Record<string, unknown>): void => {
    const decision = requests.next(source);
    if (decision === 'force') {
      logger.warn(detail, 'second request to stop: exiting now, without waiting for in-flight turns (their leases will expire)');
      process.exit(130);
    }
    if (decision === 'ignore') {
      logger.debug(detail, 'already stopping');
      return;
    }
    stopRequestedAtMs = Date.now();
    logger.info({ ...detail, drainMs: config.drainMs }, 'shutting down: in-flight turns may finish first (signal again to force)');
    // a daemon still starting stops once its start is over (see below), not in the middle of it
    if (daemon?.state === 'running') stopping = daemon.stop({ deadlineMs: 10_000 });
  };
  const onSignal = (signal: NodeJS.Signals) => requestStop('signal', { signal });
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);
  const launcher = parentWatchReason(process.env, 'daemon');
  const stopWatching = launcher
    ? watchParent(() => requestStop('parent-gone', { launcher, reason: 'the process that started the daemon is gone' }))
    : () => undefined;
  let embedded: EmbeddedServer | undefined;
  let server: ObservabilityServer | undefined;
  try {
    const resolved = await resolveDatabase(config, logger);
    embedded = resolved.embedded;
    if (requests.requested) return 0;
    const metrics =
      config.metricsPort !== undefined
        ? createMetrics({ onError: (e) => logger.warn({ err: e.message }, 'metrics: database snapshot failed') })
        : undefined;
    const children = extraChildren(config, opts, metrics, logger, () => server);
    const running = (daemon = new Daemon({
      config,
      databaseUrl: resolved.url,
      logger,
      ...(metrics ? { metrics: metrics.runtime } : {}),
      ...(children ? { extraChildren: children } : {}),
    }));
    try {
      if (metrics && config.metricsPort !== undefined) {
        server = await listenForObservability(running, { host: config.metricsHost, port: config.metricsPort, metrics, logger });
      }
      await running.prepare();
    } catch (e) {
      // nothing may keep running: a daemon that cannot start must not hold connections or ports
      await running.stop();
      throw e;
    }
    if (requests.requested) {
      await running.stop();
      return 0;
    }
    const handle = running.startSupervisor();
    logger.info(
      {
        endpoint: running.broker.endpoint,
        workers: opts.workers,
        database: embedded ? 'embedded' : 'DATABASE_URL',
        ...(config.metricsPort !== undefined ? { metrics: `${config.metricsHost}:${config.metricsPort}` } : {}),
      },
      'corral daemon running',
    );
    await handle.done.catch((e: unknown) => logger.error({ err: toError(e) }, 'daemon supervisor ended with an error'));
    await (stopping ?? running.stop());
    return requests.requested ? 0 : 1;
  } finally {
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
    stopWatching();
    await server?.close();
    if (embedded?.startedHere) await stopEmbedded(embedded, logger);
    if (stopRequestedAtMs !== undefined) logger.info({ stopMs: Date.now() - stopRequestedAtMs }, 'corral daemon stopped');
  }
}
