/**
 * Restart intensity: a sliding window of restart times shared by every child of one supervisor.
 * Shared on purpose: five children each crashing once a second is as much a sign of a broken
 * environment (database gone, disk full) as one child crashing five times.
 */
import { CorralError } from '../base/errors.ts';

export class RestartWindow {
  private readonly times: number[] = [];
  readonly maxRestarts: number;
  readonly withinMs: number;

  constructor(maxRestarts: number, withinMs: number) {
    if (!Number.isInteger(maxRestarts) || maxRestarts < 0) {
      throw new CorralError('invalid_argument', `maxRestarts must be a non-negative integer, got ${maxRestarts}`);
    }
    if (!Number.isFinite(withinMs) || withinMs <= 0) {
      throw new CorralError('invalid_argument', `withinMs must be a positive number, got ${withinMs}`);
    }
    this.maxRestarts = maxRestarts;
    this.withinMs = withinMs;
  }

  /**
   * Count a restart at `nowMs`. Returns the number of restarts inside the window
   * `(nowMs - withinMs, nowMs]`, this one included; above `maxRestarts` means "give up".
   */
  record(nowMs: number): number {
    while (this.times.length > 0 && this.times[0]! <= nowMs - this.withinMs) this.times.shift();
    this.times.push(nowMs);
    return this.times.length;
  }

  exceeded(count: number): boolean {
    return count > this.maxRestarts;
  }
}
