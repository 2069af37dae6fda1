/** Restart delay and restart intensity (sliding window across the whole supervisor). */
import { describe, expect, it } from 'vitest';
import { ManualClock } from '../../src/base/clock.ts';
import { CorralError } from '../../src/base/errors.ts';
import { RestartWindow, Supervisor } from '../../src/supervisor/index.ts';
import { drain, settle, untilAbort } from './helpers.ts';

describe('restart delay', () => {
  it('waits the default 10 ms before restarting', async () => {
    const clock = new ManualClock();
    const sup = new Supervisor({}, { clock });
    let calls = 0;
    sup.register({
      name: 'flaky',
      policy: 'permanent',
      factory: async (_ctx, signal) => {
        calls++;
        if (calls === 1) throw new Error('first run fails');
        await untilAbort(signal);
      },
    });
    const handle = sup.start();
    await settle(clock);
    expect(calls).toBe(1);
    expect(handle.children()[0]!.state).toBe('restart-wait');
    await clock.advance(9);
    expect(calls).toBe(1);
    await clock.advance(1);
    expect(calls).toBe(2);
    expect(handle.children()[0]).toMatchObject({ state: 'running', generation: 2 });
    await handle.shutdown();
  });

  it('honours the supervisor and per-child delay options', async () => {
    const clock = new ManualClock();
    const sup = new Supervisor({}, { clock, restartDelayMs: 100 });
    const calls = { a: 0, b: 0 };
    for (const name of ['a', 'b'] as const) {
      sup.register({
        name,
        policy: 'permanent',
        restartDelayMs: name === 'b' ? 500 : undefined,
        factory: async (_ctx, signal) => {
          calls[name]++;
          if (calls[name] === 1) throw new Error('fail once');
          await untilAbort(signal);
        },
      });
    }
    const handle = sup.start();
    await settle(clock);
    await clock.advance(99);
    expect(calls).toEqual({ a: 1, b: 1 });
    await clock.advance(1);
    expect(calls).toEqual({ a: 2, b: 1 });
    await clock.advance(399);
    expect(calls).toEqual({ a: 2, b: 1 });
    await clock.advance(1);
    expect(calls).toEqual({ a: 2, b: 2 });
    await handle.shutdown();
  });

  it('a shutdown during the restart delay cancels the restart', async () => {
    const clock = new ManualClock();
    const sup = new Supervisor({}, { clock });
    let calls = 0;
    sup.register({
      name: 'c',
      policy: 'permanent',
      factory: async () => {
        calls++;
        throw new Error('always');
      },
    });
    const handle = sup.start();
    await settle(clock);
    const result = await handle.shutdown();
    await clock.advance(100);
    expect(calls).toBe(1);
    expect(result).toEqual({ kind: 'clean' });
    expect(drain(handle).at(-1)).toMatchObject({ type: 'stopped', name: 'c', reason: 'stop' });
  });
});

describe('restart intensity', () => {
  it('the 6th restart within 10 s stops every child and rejects run() with restart_intensity', async () => {
    const clock = new ManualClock();
    const sup = new Supervisor({}, { clock, name: 'root' });
    let crashes = 0;
    let bystanderStopped = false;
    sup.register({
      name: 'crashy',
      policy: 'permanent',
      factory: async () => {
        crashes++;
        throw new Error(`crash ${crashes}`);
      },
    });
    sup.register({
      name: 'bystander',
      policy: 'permanent',
      factory: async (_ctx, signal) => {
        await untilAbort(signal);
        await Promise.resolve(); // cleanup after the stop request
        bystanderStopped = true;
      },
    });
    const done = sup.run();
    let settled = false;
    done.then(
      () => (settled = true),
      () => (settled = true),
    );
    await settle(clock);
    for (let i = 0; i < 5; i++) {
      expect(settled).toBe(false);
      await clock.advance(10);
    }
    await settle(clock);
    expect(crashes).toBe(6); // 1 start + 5 restarts; the 6th failure would be the 6th restart
    const err = await done.then(
      () => null,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(CorralError);
    expect((err as CorralError).code).toBe('restart_intensity');
    expect((err as CorralError).message).toContain('"crashy"');
    expect((err as CorralError).message).toContain('6 restarts');
    expect((err as CorralError).details).toMatchObject({ child: 'crashy', restarts: 6, maxRestarts: 5 });
    expect(bystanderStopped).toBe(true);

    const events = drain(sup);
    expect(events.filter((e) => e.type === 'failed').at(-1)).toMatchObject({ name: 'crashy', willRestart: false });
    expect(events).toContainEqual(expect.objectContaining({ type: 'stopped', name: 'bystander', reason: 'stop' }));
    expect(events).toContainEqual(expect.objectContaining({ type: 'stopped', name: 'crashy', reason: 'failure' }));
    await clock.advance(1000);
    expect(crashes).toBe(6);
    const result = await sup.shutdown();
    expect(result.kind).toBe('failed');
    if (result.kind === 'failed') expect((result.failures[0]!.error as CorralError).code).toBe('restart_intensity');
  });

  it('allows exactly 5 restarts', async () => {
    const clock = new ManualClock();
    const sup = new Supervisor({}, { clock });
    let calls = 0;
    sup.register({
      name: 'five',
      policy: 'transient',
      factory: async (_ctx, signal) => {
        calls++;
        if (calls <= 5) throw new Error('not yet');
        await untilAbort(signal);
      },
    });
    const handle = sup.start();
    await settle(clock);
    for (let i = 0; i < 6; i++) await clock.advance(10);
    expect(calls).toBe(6);
    expect(handle.state).toBe('running');
    expect(await handle.shutdown()).toEqual({ kind: 'clean' });
  });

  it('counts restarts of all children together', async () => {
    const clock = new ManualClock();
    const sup = new Supervisor({}, { clock, maxRestarts: 2 });
    for (const name of ['x', 'y', 'z']) {
      sup.register({
        name,
        policy: 'permanent',
        factory: async () => {
          await clock.sleep(1000);
          throw new Error(`${name} fails`);
        },
      });
    }
    const done = sup.run();
    await clock.advance(1000);
    const err = (await done.catch((e: unknown) => e)) as CorralError;
    expect(err.code).toBe('restart_intensity');
    expect(err.message).toMatch(/child "z".*3 restarts/);
  });

  it('is a sliding window: restarts spread over time never trip it', async () => {
    const clock = new ManualClock();
    const sup = new Supervisor({}, { clock });
    let calls = 0;
    sup.register({
      name: 'slow-crash',
      policy: 'permanent',
      factory: async (_ctx, signal) => {
        calls++;
        await clock.sleep(2500, signal);
        throw new Error('periodic crash');
      },
    });
    const handle = sup.start();
    for (let i = 0; i < 10; i++) await clock.advance(2510);
    expect(calls).toBe(11); // 10 restarts in 25 s, never more than 4 in 10 s
    expect(handle.state).toBe('running');
    expect(await handle.shutdown()).toEqual({ kind: 'clean' });
  });

  it('RestartWindow drops entries that left the window', () => {
    const w = new RestartWindow(2, 1000);
    expect(w.record(0)).toBe(1);
    expect(w.record(500)).toBe(2);
    expect(w.exceeded(w.record(999))).toBe(true);
    expect(w.record(1000)).toBe(3); // 0 left; 500, 999, 1000 remain
    expect(w.record(1600)).toBe(3); // 500 left
  });
});
