/**
 * The runtime's background operations: everything it starts without awaiting (a fenced reply on
 * an actor's controller, a durable worker write). Each failure is logged where it happened, and
 * shutdown and tests can wait for all of them.
 */
import { errorMessage, isConnectionError, toError } from '../base/errors.ts';
import type { Logger } from '../base/logger.ts';

export class BackgroundWork {
  private readonly running = new Set<Promise<unknown>>();
  private readonly log: Logger;

  constructor(log: Logger) {
    this.log = log;
  }

  /** Runs `p` to its end; a failure is logged with `fields` (a database outage as a warning). */
  track(p: Promise<unknown>, fields: Record<string, unknown>): void {
    const tracked = p.catch((e: unknown) => {
      const err = toError(e);
      if (isConnectionError(err)) this.log.warn({ ...fields, err: errorMessage(err) }, 'database unavailable; will recover');
      else this.log.error({ ...fields, err }, 'runtime operation failed');
    });
    this.running.add(tracked);
    void tracked.finally(() => this.running.delete(tracked));
  }

  /** Waits until nothing tracked is running (including work started meanwhile). */
  async drain(): Promise<void> {
    while (this.running.size > 0) await Promise.allSettled([...this.running]);
  }
}
