/** `corral worker`: runs the bundled example worker until SIGINT/SIGTERM. */
import { hostname } from 'node:os';
import type { Config } from '../../config.ts';
import { CorralError } from '../../errors.ts';
import type { WorkerCredentials } from '../../worker/example.ts';
import { runExampleWorker } from '../../worker/example.ts';
import { commandLogger } from '../database.ts';
import { parentWatchReason, watchParent } from '../parent-watch.ts';

export interface WorkerCommandOptions {
  id?: string;
  endpoint?: string;
  capacity: number;
  duplicateResults?: boolean;
}

/**
 * Where the worker's key comes from: `--key-file` (or CORRAL_WORKER_KEY_FILE); else a key issued
 * on first use under `CORRAL_HOME`, which works with a daemon using the same `CORRAL_HOME` (same
 * machine, same user). `--insecure` skips CURVE.
 */
export async function resolveWorkerCredentials(
  config: Config,
  requestedId: string | undefined,
): Promise<{ workerId: string; credentials: WorkerCredentials | undefined; source: string }> {
  const defaultId = () =>
    `${hostname()
      .replace(/[^A-Za-z0-9._:-]/g, '-')
      .slice(0, 40)}-${process.pid}`;
  if (config.insecure) return { workerId: requestedId ?? defaultId(), credentials: undefined, source: 'insecure' };
  const keys = await import('../../fabric/keys.ts');
  if (config.workerKeyFile) {
    const file = keys.readWorkerKeyFile(config.workerKeyFile);
    if (requestedId !== undefined && requestedId !== file.worker_id) {
      throw new CorralError('invalid_argument', `--id ${requestedId} differs from the key file's worker id ${file.worker_id}`);
    }
    return {
      workerId: file.worker_id,
      credentials: keys.workerCredentials(file, config.serverKey),
      source: config.workerKeyFile,
    };
  }
  const paths = keys.keyPaths(config.homeDir, {
    ...(config.daemonKeyFile ? { daemonKeyFile: config.daemonKeyFile } : {}),
    ...(config.allowlistFile ? { allowlistFile: config.allowlistFile } : {}),
  });
  // The daemon's keypair is created by whichever of the daemon and its workers starts first
  // (exclusively: both end up with the same one), so start order does not matter.
  const workerId = requestedId ?? defaultId();
  const file = keys.ensureLocalWorkerKey(paths, workerId);
  return { workerId, credentials: keys.workerCredentials(keys.readWorkerKeyFile(file), config.serverKey), source: file };
}

export async function runWorkerCommand(config: Config, opts: WorkerCommandOptions): Promise<number> {
  const logger = commandLogger(config, { daemon: true });
  const { workerId, credentials, source } = await resolveWorkerCredentials(config, opts.id);
  if (!credentials) logger.warn('INSECURE: CURVE is off for this worker; it can only join a daemon started with --insecure');
  const endpoint = opts.endpoint ?? config.endpoint;
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
  let stopWatching = () => undefined as void;
  await new Promise<void>((resolve) => {
    const stop = () => resolve();
    process.once('SIGINT', stop);
    process.once('SIGTERM', stop);
    if (launcher) {
      stopWatching = watchParent(() => {
        logger.warn({ workerId, launcher }, 'the daemon that started this worker is gone: stopping');
        stop();
      });
    }
  });
  stopWatching();
  await worker.stop({ graceMs: 0 });
  return 0;
}
