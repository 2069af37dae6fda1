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
import { observabilityChild } from '../../observability/daemon-child.ts';
import { createMetrics, type Metrics } from '../../observability/metrics.ts';
import { processChild, type ChildSpec } from '../../supervisor/index.ts';
import { commandLogger, resolveDatabase } from '../database.ts';
import { parentWatchReason, STOP_WITH_PARENT_ENV, watchParent } from '../parent-watch.ts';
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
): ((endpoint: string) => ChildSpec<Daemon>[]) | undefined {
  const workers = opts.workers > 0 ? localWorkers(opts.workers, opts.workerCapacity, config) : undefined;
  const http =
    metrics && config.metricsPort !== undefined
      ? observabilityChild({ host: config.metricsHost, port: config.metricsPort, metrics, logger })
      : undefined;
  if (!workers && !http) return undefined;
  return (endpoint) => [...(http ? [http] : []), ...(workers?.(endpoint) ?? [])];
}

export async function runDaemonCommand(config: Config, opts: DaemonCommandOptions): Promise<number> {
  const logger = commandLogger(config, { daemon: true });
  const { url, embedded } = await resolveDatabase(config, logger);
  const metrics =
    config.metricsPort !== undefined
      ? createMetrics({ onError: (e) => logger.warn({ err: e.message }, 'metrics: database snapshot failed') })
      : undefined;
  const children = extraChildren(config, opts, metrics, logger);
  const daemon = new Daemon({
    config,
    databaseUrl: url,
    logger,
    ...(metrics ? { metrics: metrics.runtime } : {}),
    ...(children ? { extraChildren: children } : {}),
  });
  let signals = 0;
  let stopping: Promise<unknown> | undefined;
  const onSignal = (sig: NodeJS.Signals) => {
    signals++;
    if (signals > 1) {
      logger.warn({ signal: sig }, 'second signal: exiting now');
      process.exit(130);
    }
    logger.info({ signal: sig }, 'shutting down (send again to force)');
    stopping = daemon.stop({ deadlineMs: 10_000 });
  };
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);
  const launcher = parentWatchReason(process.env, 'daemon');
  const stopWatching = launcher
    ? watchParent(() => {
        logger.info({ launcher }, 'the process that started the daemon is gone: shutting down');
        onSignal('SIGTERM');
      })
    : () => undefined;
  try {
    await daemon.prepare();
    const handle = daemon.startSupervisor();
    logger.info(
      {
        endpoint: daemon.broker.endpoint,
        workers: opts.workers,
        database: embedded ? 'embedded' : 'DATABASE_URL',
        ...(config.metricsPort !== undefined ? { metrics: `${config.metricsHost}:${config.metricsPort}` } : {}),
      },
      'corral daemon running',
    );
    await handle.done.catch((e: unknown) => logger.error({ err: toError(e) }, 'daemon supervisor ended with an error'));
    await (stopping ?? daemon.stop());
    return signals > 0 ? 0 : 1;
  } finally {
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
    stopWatching();
    if (embedded?.startedHere) await embedded.stop();
  }
}
