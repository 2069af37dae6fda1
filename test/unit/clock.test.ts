/** The system clock honours delays longer than Node's timers can hold (src/base/clock.ts). */
import { describe, expect, it } from 'vitest';
import { longTimeout, MAX_TIMER_MS, systemClock } from '../../src/base/clock.ts';

describe('systemClock with long delays', () => {
  it('does not fire a delay beyond 2^31 − 1 ms early', async () => {
    let fired = false;
    const timer = systemClock.setTimeout(() => (fired = true), MAX_TIMER_MS * 2 + 5);
    const controller = new AbortController();
    const slept = systemClock.sleep(4_294_967_295, controller.signal).then(
      () => 'woke',
      () => 'aborted',
    );
    // Node fires an overlong plain setTimeout after ~1 ms: wait well past that.
    await new Promise((r) => setTimeout(r, 50));
    expect(fired).toBe(false);
    controller.abort();
    expect(await slept).toBe('aborted');
    timer.cancel();
  });

  it('chains timers until the whole delay has passed', async () => {
    const started = Date.now();
    // 60 ms in steps of at most 7 ms: nine timers, fired once, not before 60 ms.
    const elapsed = await new Promise<number>((resolve) => longTimeout(() => resolve(Date.now() - started), 60, 7));
    expect(elapsed).toBeGreaterThanOrEqual(59);
  });

  it('cancels a chained timer between its steps', async () => {
    let fired = false;
    const t = longTimeout(() => (fired = true), 40, 5);
    await new Promise((r) => setTimeout(r, 12));
    t.cancel();
    await new Promise((r) => setTimeout(r, 60));
    expect(fired).toBe(false);
  });
});
