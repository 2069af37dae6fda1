/**
 * `corral worker`: runs the bundled example worker until SIGINT/SIGTERM, which drain it as they do
 * the daemon: it takes no new turn and lets the running ones finish and commit for
 * `CORRAL_DRAIN_MS`, then stops; a real second request exits at once (130).
 */
import type { Config } from '../../config.ts';
import type { WorkerCredentials } from '../../worker/credentials.ts';
import { runExampleWorker } from '../../worker/example.ts';
import { tracingSettings } from '../../observability/tracing-settings.ts';
import { settlesWithin, systemClock } from '../../base/clock.ts';

/** The longest a stopping worker waits for its last spans to be exported. */
const TRACE_FLUSH_MS = 1_000;
import { commandLogger } from '../database.ts';
import { parentWatchReason, watchParent } from '../parent-watch.ts';
import { StopRequests, type StopSource } from '../stop-requests.ts';

export interface WorkerCommandOptions {
  id?: string;
  endpoint?: string;
  capacity: number;
  duplicateResults?: boolean;
}

/**
 * Where the worker's key comes from (src/worker/credentials.ts): `--key-file` (or
 * CORRAL_WORKER_KEY_FILE); else a key issued on first use under `CORRAL_HOME`, which works with a
 * daemon using the same `CORRAL_HOME` (same machine, same user). `--insecure` skips CURVE.
 */
export async function resolveWorkerCredentials(
  config: Config,
  requestedId: string | undefined,
): Promise<{ workerId: string; credentials: WorkerCredentials | undefined; source: string }> {
  const { resolveWorkerKey } = await import('../../worker/credentials.ts');
  return resolveWorkerKey({
    ...(config.workerKeyFile ? { keyFile: config.workerKeyFile } : {}),
    ...(requestedId !== undefined ? { workerId: requestedId } : {}),
    ...(config.serverKey ? { serverKey: config.serverKey } : {}),
    homeDir: config.homeDir,
    ...(config.daemonKeyFile ? { daemonKeyFile: config.daemonKeyFile } : {}),
    ...(config.allowlistFile ? { allowlistFile: config.allowlistFile } : {}),
    insecure: config.insecure,
    idName: '--id',
  });
}

export async function runWorkerCommand(config: Config, opts: WorkerCommandOptions): Promise<number> {
  const logger = commandLogger(config, { daemon: true });
  const { workerId, credentials, source } = await resolveWorkerCredentials(config, opts.id);
  if (!credentials) logger.warn('INSECURE: CURVE is off for this worker; it can only join a daemon started with --insecure');
  const endpoint = opts.endpoint ?? config.endpoint;
  // OpenTelemetry's variables (OTEL_EXPORTER_OTLP_ENDPOINT, …): the turns' handler and tool spans are exported
  const settings = tracingSettings(process.env, 'corral-worker');
  const tracing = settings ? (await import('../../observability/tracing.ts')).registerProcessTracing(settings) : undefined;
  const worker = await runExampleWorker({
    endpoint,
    workerId,
    capacity: opts.capacity,
    logger,
    duplicateResults: opts.duplicateResults ?? false,
    ...(credentials ? { credentials } : {}),
  });
  logger.info({ workerId, endpoint, curve: credentials !== undefined, key: credentials ? source : undefined }, 'example worker running');
  if (credentials && !config.workerKeyFile) {
    logger.info(
      { key: source },
      'using a key issued under CORRAL_HOME: it is accepted by a daemon with the same CORRAL_HOME; for another daemon use --key-file from `corral keys add-worker`',
    );
  }
  const launcher = parentWatchReason(process.env, 'worker');
  const requests = new StopRequests();
  let stopping: Promise<void> | undefined;
  let stopWatching = () => undefined as void;
  await new Promise<void>((resolve) => {
    const requestStop = (source: StopSource, detail: Record<string, unknown>): void => {
      const decision = requests.next(source);
      if (decision === 'force') {
        logger.warn({ workerId, ...detail }, 'second request to stop: exiting now (the daemon moves the turns still running)');
        process.exit(130);
      }
      if (decision === 'ignore') return;
      // as the daemon does: no new turn, the running ones may finish and commit for CORRAL_DRAIN_MS;
      // a local worker is stopped by its daemon once the daemon has drained: it stops at once
      const drainMs = launcher ? 0 : config.drainMs;
      logger.info(
        { workerId, inFlight: worker.inFlight(), drainMs, ...detail },
        'draining: turns in flight may finish (signal again to force)',
      );
      stopping = worker.stop({ graceMs: drainMs });
      resolve();
    };
    const onSignal = (signal: NodeJS.Signals) => requestStop('signal', { signal });
    process.on('SIGINT', onSignal);
    process.on('SIGTERM', onSignal);
    if (launcher) {
      stopWatching = watchParent(() => {
        logger.warn({ workerId, launcher }, 'the daemon that started this worker is gone: stopping');
        requestStop('parent-gone', { launcher });
      });
    }
  });
  stopWatching();
  await stopping;
  // the last spans go out, but a collector that is away does not hold the stop up (its exporter retries for 30 s)
  if (tracing) {
    const flushed = tracing.shutdown().catch((e: unknown) => logger.warn({ err: String(e) }, 'the trace exporter did not flush'));
    if (!(await settlesWithin(systemClock, TRACE_FLUSH_MS, flushed)))
      logger.warn({ waitedMs: TRACE_FLUSH_MS }, 'the trace exporter did not flush in time');
  }
  logger.info({ workerId }, 'example worker stopped');
  return 0;
}
