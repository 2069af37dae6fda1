/** Registration, run/end, explicit stops, cancellation, shutdown results. */
import { describe, expect, it } from 'vitest';
import { ManualClock } from '../../src/base/clock.ts';
import { CorralError } from '../../src/base/errors.ts';
import { Supervisor } from '../../src/supervisor/index.ts';
import { brief, drain, settle, untilAbort } from './helpers.ts';

function track(p: Promise<unknown>): { settled: boolean } {
  const s = { settled: false };
  p.then(
    () => (s.settled = true),
    () => (s.settled = true),
  );
  return s;
}

describe('registration and run', () => {
  it('registering starts nothing; run() starts the children and closes registration', async () => {
    const clock = new ManualClock();
    const sup = new Supervisor({}, { clock });
    let started = 0;
    sup.register({ name: 'a', policy: 'transient', factory: async () => void started++ });
    await settle(clock);
    expect(started).toBe(0);
    expect(sup.state).toBe('idle');
    const done = sup.run();
    expect(started).toBe(1);
    expect(() => sup.register({ name: 'b', policy: 'transient', factory: async () => {} })).toThrow(/registration is closed/);
    await expect(done).resolves.toBeUndefined();
  });

  it('run() resolves only after every child ended', async () => {
    const clock = new ManualClock();
    const sup = new Supervisor({}, { clock });
    let cleaned = false;
    sup.register({ name: 'quick', policy: 'transient', factory: async () => {} });
    sup.register({
      name: 'slow',
      policy: 'transient',
      factory: async () => {
        try {
          await clock.sleep(100);
        } finally {
          cleaned = true;
        }
      },
    });
    const done = sup.run();
    const t = track(done);
    await clock.advance(99);
    expect(t.settled).toBe(false);
    await clock.advance(1);
    expect(t.settled).toBe(true);
    expect(cleaned).toBe(true);
    await expect(done).resolves.toBeUndefined();
    expect(brief(drain(sup))).toEqual(['started:quick#1', 'started:slow#1', 'stopped:quick#1', 'stopped:slow#1']);
  });

  it('rejects duplicate names and bad policies', () => {
    const sup = new Supervisor({});
    sup.register({ name: 'a', policy: 'permanent', factory: async () => {} });
    expect(() => sup.register({ name: 'a', policy: 'permanent', factory: async () => {} })).toThrow(/already has/);
    expect(() => sup.register({ name: 'b', policy: 'sometimes' as never, factory: async () => {} })).toThrow(/policy/);
  });

  it('a temporary failure is recorded, the others continue, and run() rejects after cleanup', async () => {
    const clock = new ManualClock();
    const sup = new Supervisor({}, { clock });
    let otherCleaned = false;
    sup.register({
      name: 'temp',
      policy: 'temporary',
      factory: async () => {
        throw new Error('temp broke');
      },
    });
    sup.register({
      name: 'other',
      policy: 'transient',
      factory: async () => {
        await clock.sleep(50);
        otherCleaned = true;
      },
    });
    const done = sup.run();
    const t = track(done);
    await settle(clock);
    expect(sup.children().find((c) => c.name === 'temp')!.state).toBe('ended');
    expect(sup.children().find((c) => c.name === 'other')!.state).toBe('running');
    expect(sup.failures().map((f) => f.name)).toEqual(['temp']);
    expect(t.settled).toBe(false);
    await clock.advance(50);
    expect(otherCleaned).toBe(true);
    await expect(done).rejects.toThrow('temp broke');
  });
});

describe('explicit stops and cancellation', () => {
  it('removeChild stops a permanent child without restart or failure', async () => {
    const clock = new ManualClock();
    const sup = new Supervisor({}, { clock, keepAlive: true });
    let calls = 0;
    sup.register({
      name: 'p',
      policy: 'permanent',
      // clock.sleep rejects with the abort reason: an abort error, not a failure.
      factory: async (_ctx, signal) => {
        calls++;
        await clock.sleep(1_000_000, signal);
      },
    });
    const handle = sup.start();
    await settle(clock);
    expect(await handle.removeChild('p')).toBe(true);
    await clock.advance(1000);
    expect(calls).toBe(1);
    expect(handle.failures()).toEqual([]);
    expect(drain(handle).map((e) => e.type)).toEqual(['started', 'stopped']);
    expect(handle.children()).toEqual([]);
    expect(await handle.removeChild('p')).toBe(false);
    expect(await handle.shutdown()).toEqual({ kind: 'clean' });
  });

  it("the parent's cancellation stops every child without restarts; run() resolves", async () => {
    const clock = new ManualClock();
    const parent = new AbortController();
    const sup = new Supervisor({}, { clock, signal: parent.signal });
    let calls = 0;
    for (const name of ['a', 'b']) {
      sup.register({
        name,
        policy: 'permanent',
        factory: async (_ctx, signal) => {
          calls++;
          await untilAbort(signal);
          throw signal.reason; // rethrowing the abort reason is a clean stop
        },
      });
    }
    const done = sup.run();
    await settle(clock);
    parent.abort();
    await expect(done).resolves.toBeUndefined();
    await clock.advance(100);
    expect(calls).toBe(2);
    expect(drain(sup).filter((e) => e.type === 'stopped')).toHaveLength(2);
  });

  it('an already-cancelled parent means nothing starts', async () => {
    const parent = new AbortController();
    parent.abort();
    const sup = new Supervisor({}, { signal: parent.signal });
    let calls = 0;
    sup.register({ name: 'a', policy: 'permanent', factory: async () => void calls++ });
    await expect(sup.run()).resolves.toBeUndefined();
    expect(calls).toBe(0);
  });

  it('dropping the handle does not stop the supervisor', async () => {
    const clock = new ManualClock();
    const sup = new Supervisor({}, { clock });
    let ticks = 0;
    sup.register({
      name: 'ticker',
      policy: 'permanent',
      factory: async (_ctx, signal) => {
        for (;;) {
          await clock.sleep(10, signal);
          ticks++;
        }
      },
    });
    sup.start(); // handle discarded
    await clock.advance(100);
    expect(ticks).toBe(10);
    expect(sup.state).toBe('running');
    await sup.shutdown();
  });
});

describe('shutdown results', () => {
  it('clean', async () => {
    const clock = new ManualClock();
    const sup = new Supervisor({}, { clock });
    sup.register({ name: 'a', policy: 'permanent', factory: async (_c, s) => untilAbort(s) });
    const handle = sup.start();
    await settle(clock);
    expect(await handle.shutdown({ deadlineMs: 1000 })).toEqual({ kind: 'clean' });
    expect(handle.state).toBe('ended');
    // Idempotent.
    expect(await handle.shutdown()).toEqual({ kind: 'clean' });
  });

  it('failed: a child that errors while stopping is recorded (and not restarted)', async () => {
    const clock = new ManualClock();
    const sup = new Supervisor({}, { clock });
    sup.register({
      name: 'messy',
      policy: 'permanent',
      factory: async (_c, signal) => {
        await untilAbort(signal);
        throw new Error('flush failed');
      },
    });
    const handle = sup.start();
    await settle(clock);
    const result = await handle.shutdown();
    expect(result.kind).toBe('failed');
    if (result.kind !== 'failed') return;
    expect(result.failures).toHaveLength(1);
    expect(result.failures[0]).toMatchObject({ name: 'messy', generation: 1 });
    expect(result.failures[0]!.diagnostic).toContain('flush failed');
    await expect(handle.done).rejects.toThrow('flush failed');
  });

  it('deadline: a child ignoring its abort signal is reported and still tracked', async () => {
    const clock = new ManualClock();
    const sup = new Supervisor({}, { clock });
    sup.register({ name: 'polite', policy: 'permanent', factory: async (_c, s) => untilAbort(s) });
    sup.register({
      name: 'stubborn',
      policy: 'permanent',
      factory: async () => {
        await clock.sleep(5000); // ignores the signal
      },
    });
    const handle = sup.start();
    await settle(clock);
    const pending = handle.shutdown({ deadlineMs: 1000 });
    await clock.advance(1000);
    expect(await pending).toEqual({ kind: 'deadline', stillRunning: ['stubborn'] });
    expect(handle.state).toBe('stopping');
    expect(handle.children().find((c) => c.name === 'stubborn')!.state).toBe('stopping');
    drain(handle);
    const t = track(handle.done);
    await clock.advance(3999);
    expect(t.settled).toBe(false);
    await clock.advance(1);
    // Its eventual end still emits `stopped`, and it is not restarted despite `permanent`.
    expect(brief(drain(handle))).toEqual(['stopped:stubborn#1']);
    await expect(handle.done).resolves.toBeUndefined();
    expect(await handle.shutdown()).toEqual({ kind: 'clean' });
  });

  it('rejects an invalid deadline', async () => {
    const sup = new Supervisor({});
    await expect(sup.shutdown({ deadlineMs: -1 })).rejects.toMatchObject({ code: 'invalid_timeout' });
  });
});

describe('dynamic children', () => {
  it('keepAlive: stays up while empty, adds and removes children, ends only on shutdown', async () => {
    const clock = new ManualClock();
    const sup = new Supervisor({}, { clock, keepAlive: true });
    const handle = sup.start();
    await clock.advance(1000);
    expect(handle.state).toBe('running');

    let stops = 0;
    const controller = (name: string) => ({
      name,
      policy: 'transient' as const,
      factory: async (_c: unknown, signal: AbortSignal) => {
        await untilAbort(signal);
        stops++;
      },
    });
    handle.addChild(controller('actor-1'));
    handle.addChild(controller('actor-2'));
    expect(() => handle.addChild(controller('actor-1'))).toThrow(/already has/);
    await settle(clock);
    expect(handle.children().map((c) => [c.name, c.state, c.dynamic])).toEqual([
      ['actor-1', 'running', true],
      ['actor-2', 'running', true],
    ]);
    expect(await handle.removeChild('actor-1')).toBe(true);
    expect(stops).toBe(1);
    expect(handle.children().map((c) => c.name)).toEqual(['actor-2']);
    handle.addChild(controller('actor-1')); // the name is free again
    await settle(clock);
    expect(handle.children().find((c) => c.name === 'actor-1')!.generation).toBe(1);
    expect(handle.failures()).toEqual([]);

    expect(await handle.shutdown()).toEqual({ kind: 'clean' });
    expect(stops).toBe(3);
    const err = (() => {
      try {
        handle.addChild(controller('late'));
      } catch (e) {
        return e;
      }
    })();
    expect(err).toBeInstanceOf(CorralError);
    expect((err as CorralError).code).toBe('shutdown');
  });

  it('a dynamic child that ends for good is forgotten', async () => {
    const clock = new ManualClock();
    const sup = new Supervisor({}, { clock, keepAlive: true });
    const handle = sup.start();
    handle.addChild({ name: 'once', policy: 'transient', factory: async () => {} });
    await settle(clock);
    expect(handle.children()).toEqual([]);
    expect(handle.state).toBe('running');
    await handle.shutdown();
  });

  it('without keepAlive an empty supervisor ends at once, and after its last child ends', async () => {
    await expect(new Supervisor({}).run()).resolves.toBeUndefined();

    const clock = new ManualClock();
    const sup = new Supervisor({}, { clock });
    const handle = sup.start();
    expect(handle.state).toBe('ended');

    const sup2 = new Supervisor({}, { clock });
    sup2.addChild({ name: 'd', policy: 'permanent', factory: async (_c, s) => untilAbort(s) });
    const h2 = sup2.start();
    await settle(clock);
    expect(h2.state).toBe('running');
    await h2.removeChild('d');
    expect(h2.state).toBe('ended');
    await expect(h2.done).resolves.toBeUndefined();
  });

  it('nests: a child running a keepAlive supervisor stops with its parent', async () => {
    const clock = new ManualClock();
    const root = new Supervisor({}, { clock, name: 'root' });
    let sessions: Supervisor<{}> | null = null;
    let sessionStops = 0;
    root.register({
      name: 'sessions',
      policy: 'permanent',
      factory: async (ctx, signal) => {
        const s = new Supervisor(ctx, { clock, name: 'sessions', keepAlive: true, signal });
        sessions = s;
        await s.run();
      },
    });
    const handle = root.start();
    await settle(clock);
    sessions!.addChild({
      name: 'actor-9',
      policy: 'transient',
      factory: async (_c, s) => {
        await untilAbort(s);
        sessionStops++;
      },
    });
    await settle(clock);
    expect(await handle.shutdown()).toEqual({ kind: 'clean' });
    expect(sessionStops).toBe(1);
    expect(sessions!.state).toBe('ended');
  });
});
