/** The event stream: ordering, readiness, lag, diagnostics, timeouts, end of stream. */
import { describe, expect, it } from 'vitest';
import { ManualClock } from '../../src/base/clock.ts';
import { CorralError } from '../../src/base/errors.ts';
import { END_OF_EVENTS, Supervisor, SupervisorEventError, type ChildRun, type SupervisorEvent } from '../../src/supervisor/index.ts';
import { brief, drain, settle, untilAbort } from './helpers.ts';

describe('events', () => {
  it('`started` is emitted before the factory body runs', async () => {
    const clock = new ManualClock();
    const sup = new Supervisor({}, { clock, keepAlive: true });
    let seenInBody: unknown = null;
    sup.register({
      name: 'a',
      policy: 'transient',
      factory: async (_c, signal) => {
        seenInBody = sup.tryNextEvent();
        await untilAbort(signal);
      },
    });
    sup.start();
    expect(seenInBody).toMatchObject({ type: 'started', name: 'a', generation: 1 });
    await sup.shutdown();
  });

  it('ready carries the generation; duplicate, stale and undeclared signals are ignored', async () => {
    const clock = new ManualClock();
    const sup = new Supervisor({}, { clock });
    const runs: ChildRun[] = [];
    sup.register({
      name: 'svc',
      policy: 'permanent',
      readiness: true,
      factory: async (_c, signal, run) => {
        runs.push(run);
        await clock.sleep(5, signal); // initialisation
        run.markReady();
        run.markReady(); // duplicate
        await clock.sleep(20, signal);
        if (run.generation === 1) throw new Error('crash after ready');
        await untilAbort(signal);
      },
    });
    sup.register({
      name: 'plain',
      policy: 'permanent',
      factory: async (_c, signal, run) => {
        run.markReady(); // not declared with readiness: ignored
        await untilAbort(signal);
      },
    });
    const handle = sup.start();
    await clock.advance(5);
    expect(handle.children().find((c) => c.name === 'svc')!.ready).toBe(true);
    await clock.advance(30); // crash at 25, restart at 35
    expect(runs).toHaveLength(2);
    runs[0]!.markReady(); // stale generation
    await clock.advance(5);
    runs[1]!.markReady(); // duplicate of gen 2
    const ready = drain(handle).filter((e) => e.type === 'ready');
    expect(ready).toEqual([
      { type: 'ready', name: 'svc', generation: 1, atMs: expect.any(Number) },
      { type: 'ready', name: 'svc', generation: 2, atMs: expect.any(Number) },
    ]);
    await handle.shutdown();
  });

  it('a slow reader gets `lagged` with the number of dropped events, then the newest ones', async () => {
    const clock = new ManualClock();
    const sup = new Supervisor({}, { clock, keepAlive: true, eventBufferSize: 4 });
    const handle = sup.start();
    let finished = 0;
    for (let i = 0; i < 10; i++) {
      handle.addChild({ name: `c${i}`, policy: 'transient', factory: async () => void finished++ });
    }
    await settle(clock);
    expect(finished).toBe(10); // children were never blocked by the unread buffer
    // 20 events (started + stopped per child) into a buffer of 4: 16 dropped.
    expect(await handle.nextEvent()).toEqual({ type: 'lagged', missed: 16 });
    // Every child starts synchronously in addChild, then they all end: the 4 newest are stops.
    expect(brief(drain(handle))).toEqual(['stopped:c6#1', 'stopped:c7#1', 'stopped:c8#1', 'stopped:c9#1']);
    // The counter was reset: no second lagged notice.
    handle.addChild({ name: 'late', policy: 'transient', factory: async () => {} });
    await settle(clock);
    expect(brief(drain(handle))).toEqual(['started:late#1', 'stopped:late#1']);
    await handle.shutdown();
  });

  it('failed diagnostics are at most 1024 UTF-8 bytes and cut on a character boundary', async () => {
    const clock = new ManualClock();
    const sup = new Supervisor({}, { clock });
    sup.register({
      name: 'verbose',
      policy: 'temporary',
      factory: async () => {
        throw new Error('x' + '😀é'.repeat(1000));
      },
    });
    await sup.run().catch(() => {});
    const failed = drain(sup).find((e) => e.type === 'failed');
    if (failed?.type !== 'failed') throw new Error('no failed event');
    const bytes = Buffer.byteLength(failed.diagnostic, 'utf8');
    expect(bytes).toBeLessThanOrEqual(1024);
    expect(bytes).toBeGreaterThan(1018); // truncated, not emptied
    expect(failed.diagnostic.startsWith('Error: x😀é')).toBe(true);
    expect(Buffer.from(failed.diagnostic, 'utf8').toString('utf8')).toBe(failed.diagnostic); // no broken pair
    expect(sup.failures()[0]!.diagnostic).toBe(failed.diagnostic);
  });
});

describe('nextEvent', () => {
  it('times out on the injected clock with kind "timeout"', async () => {
    const clock = new ManualClock();
    const sup = new Supervisor({}, { clock, keepAlive: true });
    sup.start();
    const p = sup.nextEvent({ timeoutMs: 50 });
    let outcome: unknown = 'pending';
    p.then(
      (v) => (outcome = v),
      (e: unknown) => (outcome = e),
    );
    await clock.advance(49);
    expect(outcome).toBe('pending');
    await clock.advance(1);
    expect(outcome).toBeInstanceOf(SupervisorEventError);
    expect(outcome).toBeInstanceOf(CorralError);
    expect(outcome).toMatchObject({ kind: 'timeout', code: 'timeout' });
    // The timed-out reader does not swallow the next event.
    sup.addChild({ name: 'n', policy: 'transient', factory: async (_c, s) => untilAbort(s) });
    expect(await sup.nextEvent({ timeoutMs: 1 })).toMatchObject({ type: 'started', name: 'n' });
    await sup.shutdown();
  });

  it.each([0, -1, 1.5, Number.NaN, Infinity, 4_294_967_296])('rejects timeoutMs=%s with kind "invalid_timeout"', async (t) => {
    const sup = new Supervisor({});
    await expect(sup.nextEvent({ timeoutMs: t })).rejects.toMatchObject({ kind: 'invalid_timeout', code: 'invalid_timeout' });
  });

  it('accepts the bounds 1 and 4 294 967 295', async () => {
    const clock = new ManualClock();
    const sup = new Supervisor({}, { clock, keepAlive: true });
    sup.start();
    const far = sup.nextEvent({ timeoutMs: 4_294_967_295 });
    sup.addChild({ name: 'n', policy: 'transient', factory: async (_c, s) => untilAbort(s) });
    expect(await far).toMatchObject({ type: 'started' });
    const near = expect(sup.nextEvent({ timeoutMs: 1 })).rejects.toMatchObject({ kind: 'timeout' });
    await clock.advance(1);
    await near;
    await sup.shutdown();
  });

  it('unread events stay readable after cancellation; then the end, which is not an error', async () => {
    const clock = new ManualClock();
    const parent = new AbortController();
    const sup = new Supervisor({}, { clock, signal: parent.signal });
    sup.register({ name: 'a', policy: 'permanent', factory: async (_c, s) => untilAbort(s) });
    const done = sup.run();
    await settle(clock);
    parent.abort();
    await done;
    expect(await sup.nextEvent()).toMatchObject({ type: 'started', name: 'a' });
    expect(await sup.nextEvent({ timeoutMs: 10 })).toMatchObject({ type: 'stopped', name: 'a', reason: 'stop' });
    expect(await sup.nextEvent()).toBe(END_OF_EVENTS);
    expect(await sup.nextEvent({ timeoutMs: 10 })).toEqual({ type: 'end' });
  });

  it('a waiting reader receives the end when the supervisor ends', async () => {
    const clock = new ManualClock();
    const sup = new Supervisor({}, { clock, keepAlive: true });
    sup.start();
    const waiting = sup.nextEvent();
    await sup.shutdown();
    expect(await waiting).toEqual({ type: 'end' });
  });

  it('events() iterates until the end', async () => {
    const clock = new ManualClock();
    const sup = new Supervisor({}, { clock });
    sup.register({ name: 'x', policy: 'transient', factory: async () => {} });
    const collected: SupervisorEvent[] = [];
    const reading = (async () => {
      for await (const e of sup.events()) collected.push(e);
    })();
    await sup.run();
    await reading;
    expect(brief(collected)).toEqual(['started:x#1', 'stopped:x#1']);
  });
});
