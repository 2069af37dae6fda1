/** Restart policies (one-for-one) after a normal return, an error result and a throw. */
import { describe, expect, it } from 'vitest';
import { ManualClock } from '../../src/base/clock.ts';
import { Supervisor, childError, type ChildExit, type RestartPolicy } from '../../src/supervisor/index.ts';
import { brief, drain, settle, untilAbort } from './helpers.ts';

type Ending = 'return' | 'error-result' | 'throw';

const expectations: Array<[RestartPolicy, Ending, boolean]> = [
  ['permanent', 'return', true],
  ['permanent', 'error-result', true],
  ['permanent', 'throw', true],
  ['transient', 'return', false],
  ['transient', 'error-result', true],
  ['transient', 'throw', true],
  ['temporary', 'return', false],
  ['temporary', 'error-result', false],
  ['temporary', 'throw', false],
];

describe('restart policies', () => {
  it.each(expectations)('%s child ending by %s: restarted = %s', async (policy, ending, restarted) => {
    const clock = new ManualClock();
    const sup = new Supervisor({}, { clock });
    let calls = 0;
    let bystanderCalls = 0;
    sup.register({
      name: 'subject',
      policy,
      factory: async (_ctx, signal): Promise<ChildExit> => {
        calls++;
        if (calls === 1) {
          await Promise.resolve();
          if (ending === 'throw') throw new Error('boom');
          if (ending === 'error-result') return childError(new Error('bad result'));
          return;
        }
        await untilAbort(signal);
      },
    });
    sup.register({
      name: 'bystander',
      policy: 'permanent',
      factory: async (_ctx, signal) => {
        bystanderCalls++;
        await untilAbort(signal);
      },
    });
    const handle = sup.start();
    await settle(clock);
    await clock.advance(10);

    expect(calls).toBe(restarted ? 2 : 1);
    // One-for-one: the sibling was never touched.
    expect(bystanderCalls).toBe(1);
    const subject = handle.children().find((c) => c.name === 'subject')!;
    expect(subject.state).toBe(restarted ? 'running' : 'ended');
    expect(subject.generation).toBe(restarted ? 2 : 1);

    const events = brief(drain(handle).filter((e) => e.type !== 'lagged' && e.name === 'subject'));
    const failed = ending !== 'return';
    if (restarted) {
      expect(events).toEqual(['started:subject#1', ...(failed ? ['failed:subject#1'] : []), 'restarted:subject#2', 'started:subject#2']);
    } else {
      expect(events).toEqual(['started:subject#1', ...(failed ? ['failed:subject#1'] : []), 'stopped:subject#1']);
    }

    const result = await handle.shutdown();
    const recorded = policy === 'temporary' && failed;
    if (recorded) {
      expect(result.kind).toBe('failed');
      if (result.kind === 'failed') expect(result.failures.map((f) => f.name)).toEqual(['subject']);
      await expect(handle.done).rejects.toThrow(ending === 'throw' ? 'boom' : 'bad result');
    } else {
      expect(result).toEqual({ kind: 'clean' });
      await expect(handle.done).resolves.toBeUndefined();
    }
  });

  it('a restart calls the factory again with a fresh signal and generation', async () => {
    const clock = new ManualClock();
    const sup = new Supervisor({ shared: 'ctx' }, { clock });
    const seen: Array<{ ctx: unknown; signal: AbortSignal; generation: number; state: string[] }> = [];
    sup.register({
      name: 'worker',
      policy: 'permanent',
      factory: async (ctx, signal, run) => {
        const state: string[] = []; // per-generation state, built from scratch
        seen.push({ ctx, signal, generation: run.generation, state });
        state.push('init');
        if (run.generation === 1) throw new Error('crash');
        await untilAbort(signal);
      },
    });
    const handle = sup.start();
    await settle(clock);
    await clock.advance(10);
    expect(seen.map((s) => s.generation)).toEqual([1, 2]);
    expect(seen[0]!.signal).not.toBe(seen[1]!.signal);
    expect(seen[1]!.state).toEqual(['init']);
    expect(seen[1]!.ctx).toEqual({ shared: 'ctx' });
    expect(await handle.shutdown()).toEqual({ kind: 'clean' });
  });

  it('a factory that throws synchronously is a failure like any other', async () => {
    const clock = new ManualClock();
    const sup = new Supervisor({}, { clock });
    let calls = 0;
    sup.register({
      name: 'sync',
      policy: 'transient',
      factory: ((_ctx: unknown, signal: AbortSignal) => {
        calls++;
        if (calls === 1) throw new Error('sync throw');
        return untilAbort(signal);
      }) as never,
    });
    const handle = sup.start();
    await settle(clock);
    await clock.advance(10);
    expect(calls).toBe(2);
    expect(drain(handle).find((e) => e.type === 'failed')).toMatchObject({ name: 'sync', willRestart: true });
    await handle.shutdown();
  });
});
