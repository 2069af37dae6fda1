/** `corral worker`: runs the bundled example worker until SIGINT/SIGTERM. */
import { hostname } from 'node:os';
import type { Config } from '../../config.ts';
import { runExampleWorker } from '../../worker/example.ts';
import { commandLogger } from '../database.ts';
import { parentWatchReason, watchParent } from '../parent-watch.ts';

export interface WorkerCommandOptions {
  id?: string;
  endpoint?: string;
  capacity: number;
  duplicateResults?: boolean;
}

export async function runWorkerCommand(config: Config, opts: WorkerCommandOptions): Promise<number> {
  const logger = commandLogger(config, { daemon: true });
  const workerId = opts.id ?? `${hostname().replace(/[^A-Za-z0-9._:-]/g, '-').slice(0, 40)}-${process.pid}`;
  const worker = await runExampleWorker({
    endpoint: opts.endpoint ?? config.endpoint,
    workerId,
    capacity: opts.capacity,
    logger,
    duplicateResults: opts.duplicateResults ?? false,
  });
  logger.info({ workerId, endpoint: opts.endpoint ?? config.endpoint }, 'example worker running');
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
