/**
 * `corral daemon [--workers N] [--metrics-port P]`: the daemon of src/host/daemon.ts (migrations,
 * the embedded PostgreSQL when DATABASE_URL is unset, N local example workers, the metrics server
 * with a metrics port), run until a signal. This command only adds the signals and the exit code.
 */
import type { Config } from '../../config.ts';
import { CorralError } from '../../base/errors.ts';
import { createDaemon, type CorralDaemon } from '../../host/daemon.ts';
import { commandLogger } from '../database.ts';
import { parentWatchReason, watchParent } from '../parent-watch.ts';
import { StopRequests, type StopSource } from '../stop-requests.ts';

export interface DaemonCommandOptions {
  workers: number;
  workerCapacity: number;
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
  const daemon: CorralDaemon = createDaemon({
    ...config,
    // the settings are all given; the environment is read for OpenTelemetry's (OTEL_*)
    env: process.env,
    logger,
    ...(opts.workers > 0 ? { localWorkers: { count: opts.workers, capacity: opts.workerCapacity } } : {}),
  });
  let stopping: Promise<void> | undefined;
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
    logger.info({ ...detail, drainMs: config.drainMs }, 'shutting down: in-flight turns may finish first (signal again to force)');
    // a daemon still starting stops once the step under way is over, not in the middle of it
    stopping = daemon.stop();
  };
  const onSignal = (signal: NodeJS.Signals) => requestStop('signal', { signal });
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);
  const launcher = parentWatchReason(process.env, 'daemon');
  const stopWatching = launcher
    ? watchParent(() => requestStop('parent-gone', { launcher, reason: 'the process that started the daemon is gone' }))
    : () => undefined;
  try {
    try {
      await daemon.start();
    } catch (e) {
      if (requests.requested && e instanceof CorralError && e.code === 'shutdown') return 0;
      throw e;
    }
    // settles once the daemon stopped: after a stop requested here, or when its supervisor gave up
    await daemon.done.catch(() => undefined);
    await stopping;
    return requests.requested ? 0 : 1;
  } finally {
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
    stopWatching();
    await stopping;
  }
}
