/**
 * The interval wrapper of the runtime's periodic components (watchdog, recovery, job keeper):
 * `tick()` runs one pass and concurrent calls share the pass in progress (no re-entry); `run()`
 * repeats it on the injected clock until aborted, and a failing pass is logged, never fatal.
 */
import type { Clock } from '../base/clock.ts';
import { errorMessage } from '../base/errors.ts';
import type { Logger } from '../base/logger.ts';

export class Periodic<T> {
  private running: Promise<T> | undefined;
  private readonly pass: () => Promise<T>;
  private readonly opts: { clock: Clock; log: Logger; intervalMs: number; what: string; firstPass: 'now' | 'after-interval' };

  constructor(
    pass: () => Promise<T>,
    opts: { clock: Clock; log: Logger; intervalMs: number; what: string; firstPass: 'now' | 'after-interval' },
  ) {
    this.pass = pass;
    this.opts = opts;
  }

  tick(): Promise<T> {
    this.running ??= this.pass().finally(() => {
      this.running = undefined;
    });
    return this.running;
  }

  async run(signal: AbortSignal): Promise<void> {
    let wait = this.opts.firstPass === 'after-interval';
    while (!signal.aborted) {
      if (wait) await this.opts.clock.sleep(this.opts.intervalMs, signal).catch(() => undefined);
      wait = true;
      if (signal.aborted) break;
      try {
        await this.tick();
      } catch (e) {
        this.opts.log.warn({ err: errorMessage(e) }, `${this.opts.what} pass failed`);
      }
    }
  }
}
