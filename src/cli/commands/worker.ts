/** `corral worker`: runs the bundled example worker until SIGINT/SIGTERM. */
import { hostname } from 'node:os';
import type { Config } from '../../config.ts';
import { runExampleWorker } from '../../worker/example.ts';
import { commandLogger } from '../context.ts';

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
  await new Promise<void>((resolve) => {
    const stop = () => resolve();
    process.once('SIGINT', stop);
    process.once('SIGTERM', stop);
  });
  await worker.stop({ graceMs: 0 });
  return 0;
}
