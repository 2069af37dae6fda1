import { describe, expect, it } from 'vitest';
import { actorKey } from '../../src/base/actor-key.ts';
import { ManualClock } from '../../src/base/clock.ts';
import { ActorDirectory, dispatchTo, firstDispatch, workerOf, type InFlightTurn } from '../../src/runtime/directory.ts';

describe('ActorDirectory', () => {
  it('starts one controller per actor key, idempotently, even for concurrent wakes', async () => {
    const dir = new ActorDirectory({ clock: new ManualClock(), lingerMs: 1_000 });
    const key = actorKey('a', 's');
    const [c1, c2] = await Promise.all([
      Promise.resolve().then(() => dir.wake(key)),
      Promise.resolve().then(() => dir.wake(actorKey('a', 's'))),
    ]);
    expect(c1).toBe(c2);
    expect(dir.size).toBe(1);
    // both callers' work runs, one after the other: the second waits while the first is held
    const order: string[] = [];
    let release!: () => void;
    const held = new Promise<void>((r) => (release = r));
    const first = c1.run(async () => {
      await held;
      order.push('first');
    });
    const second = c2.run(async () => {
      order.push('second');
    });
    for (let i = 0; i < 10; i++) await Promise.resolve();
    expect(order).toEqual([]);
    release();
    await Promise.all([first, second]);
    expect(order).toEqual(['first', 'second']);
  });

  it('keeps running after an operation fails', async () => {
    const dir = new ActorDirectory({ clock: new ManualClock() });
    const c = dir.wake(actorKey('a', 's'));
    await expect(c.run(async () => Promise.reject(new Error('boom')))).rejects.toThrow('boom');
    await expect(c.run(async () => 42)).resolves.toBe(42);
  });

  it('releases idle controllers after the linger, so memory follows active actors only', async () => {
    const clock = new ManualClock();
    const dir = new ActorDirectory({ clock, lingerMs: 1_000 });
    for (let i = 0; i < 100; i++) await dir.wake(actorKey('a', `s${i}`)).run(async () => undefined);
    const busy = dir.wake(actorKey('a', 'busy'));
    busy.hold({ fence: { eventId: 'e1' } } as InFlightTurn);
    await busy.run(async () => undefined);
    expect(dir.size).toBe(101);
    await clock.advance(999);
    expect(dir.size).toBe(101);
    await clock.advance(1);
    expect(dir.size).toBe(1);
    expect(dir.get(actorKey('a', 'busy'))).toBe(busy);
  });

  it('a wake during the linger keeps the controller', async () => {
    const clock = new ManualClock();
    const dir = new ActorDirectory({ clock, lingerMs: 1_000 });
    const c = dir.wake(actorKey('a', 's'));
    await c.run(async () => undefined);
    await clock.advance(500);
    expect(dir.wake(actorKey('a', 's'))).toBe(c);
    await clock.advance(2_000);
    expect(dir.size).toBe(1);
  });
});

describe('the dispatch state of an in-flight turn (D1–D4)', () => {
  const turn = (workerId: string | null): InFlightTurn =>
    ({ fence: {}, dispatch: firstDispatch(workerId), started: {}, startedAtMs: 0 }) as unknown as InFlightTurn;

  it('a turn goes assigned → sent → accepted, its first send time kept across sends and workers', () => {
    const t = turn('w1');
    expect(t.dispatch).toEqual({ kind: 'assigned', workerId: 'w1' });
    expect(dispatchTo(t, { to: 'sent' }, 10)).toBe(true);
    expect(dispatchTo(t, { to: 'sent' }, 20)).toBe(true);
    expect([t.dispatch, t.firstSentAtMs]).toEqual([{ kind: 'sent', workerId: 'w1' }, 10]);
    expect(dispatchTo(t, { to: 'accepted', workerId: 'w1' }, 30)).toBe(true);
    expect(workerOf(t)).toBe('w1');
    // redirected: another worker's slot, not accepted, sent again, the first send's time kept
    expect(dispatchTo(t, { to: 'assigned', workerId: 'w2' }, 40)).toBe(true);
    expect(dispatchTo(t, { to: 'sent' }, 50)).toBe(true);
    expect([t.dispatch, t.firstSentAtMs]).toEqual([{ kind: 'sent', workerId: 'w2' }, 10]);
  });

  it('refuses an accept from another worker, an accept after one, and a send of a parked turn', () => {
    const t = turn('w1');
    expect(dispatchTo(t, { to: 'accepted', workerId: 'w2' }, 0)).toBe(false);
    expect(dispatchTo(t, { to: 'accepted', workerId: 'w1' }, 0)).toBe(true);
    expect(dispatchTo(t, { to: 'accepted', workerId: 'w1' }, 0)).toBe(false);
    expect(dispatchTo(t, { to: 'sent' }, 0)).toBe(false);
    expect(t.dispatch).toEqual({ kind: 'accepted', workerId: 'w1' });
    expect(dispatchTo(t, { to: 'parked' }, 0)).toBe(true);
    expect(workerOf(t)).toBe(null);
    expect(dispatchTo(t, { to: 'sent' }, 0)).toBe(false);
    expect(dispatchTo(t, { to: 'accepted', workerId: 'w1' }, 0)).toBe(false);
    const parked = turn(null);
    expect([parked.dispatch, parked.firstSentAtMs]).toEqual([{ kind: 'parked' }, undefined]);
  });
});
