/** `corral worker`: runs the bundled example worker until SIGINT/SIGTERM. */
import { existsSync } from 'node:fs';
import { hostname } from 'node:os';
import type { Config } from '../../config.ts';
import { CorralError } from '../../errors.ts';
import type { WorkerCredentials } from '../../worker/example.ts';
import { runExampleWorker } from '../../worker/example.ts';
import { commandLogger } from '../context.ts';

export interface WorkerCommandOptions {
  id?: string;
  endpoint?: string;
  capacity: number;
  duplicateResults?: boolean;
}

/**
 * Where the worker's key comes from, in order: `--key-file` (or CORRAL_WORKER_KEY_FILE); else,
 * when `CORRAL_HOME` holds the daemon's keys (same machine, same user), a key issued there on
 * first use; else an error naming both ways out. `--insecure` skips CURVE.
 */
export async function resolveWorkerCredentials(
  config: Config,
  requestedId: string | undefined,
): Promise<{ workerId: string; credentials: WorkerCredentials | undefined; source: string }> {
  const defaultId = () => `${hostname().replace(/[^A-Za-z0-9._:-]/g, '-').slice(0, 40)}-${process.pid}`;
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
  if (!existsSync(paths.daemonKey)) {
    throw new CorralError(
      'invalid_config',
      `no worker key: pass --key-file (made by \`corral keys add-worker <id> --out FILE\`), run with the daemon's CORRAL_HOME (no daemon key at ${paths.daemonKey}), or --insecure`,
    );
  }
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
  await new Promise<void>((resolve) => {
    const stop = () => resolve();
    process.once('SIGINT', stop);
    process.once('SIGTERM', stop);
  });
  await worker.stop({ graceMs: 0 });
  return 0;
}
