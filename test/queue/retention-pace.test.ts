/**
 * The retention sweep's pacing (src/queue/retention.ts `drain`): it drains until a batch comes
 * back short, and after each full batch pauses so that deleting takes `duty` of the pass's time.
 */
import { describe, expect, it } from 'vitest';
import type { Clock } from '../../src/base/clock.ts';
import { drain } from '../../src/queue/retention.ts';

/** A clock whose time moves only when a step says so; `sleep` records the pause and returns at once. */
function steppedClock() {
  const pauses: number[] = [];
  let now = 0;
  const clock: Clock = {
    nowMs: () => now,
    sleep: async (ms) => {
      pauses.push(ms);
      now += ms;
    },
    setTimeout: () => ({ cancel: () => undefined }),
    setInterval: () => ({ cancel: () => undefined }),
  };
  return { clock, pauses, spend: (ms: number) => (now += ms) };
}

describe('retention pacing', () => {
  it('drains full batches until a short one, pausing by the duty cycle', async () => {
    const { clock, pauses, spend } = steppedClock();
    const sizes = [100, 100, 100, 40];
    const limits: number[] = [];
    const deleted = await drain(
      async (limit) => {
        limits.push(limit);
        spend(20);
        return sizes.shift() ?? 0;
      },
      { batchSize: 100, duty: 0.25, clock },
    );
    expect(deleted).toBe(340);
    expect(limits).toEqual([100, 100, 100, 100]);
    // 20 ms of deleting, then 60 ms of pause: a quarter of the time; none after the short batch
    expect(pauses).toEqual([60, 60, 60]);
  });

  it('does not pause at duty 1, and stops between batches once aborted', async () => {
    const { clock, pauses, spend } = steppedClock();
    const abort = new AbortController();
    let steps = 0;
    const deleted = await drain(
      async (limit) => {
        spend(5);
        if (++steps === 3) abort.abort();
        return limit;
      },
      { batchSize: 10, duty: 1, clock, signal: abort.signal },
    );
    expect(steps).toBe(3);
    expect(deleted).toBe(30);
    expect(pauses.every((p) => p === 0) || pauses.length === 0).toBe(true);
  });

  it('an empty first batch is one statement', async () => {
    const { clock } = steppedClock();
    let steps = 0;
    expect(await drain(async () => (steps++, 0), { clock })).toBe(0);
    expect(steps).toBe(1);
  });
});
