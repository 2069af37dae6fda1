/**
 * Idle heap trim: once per busy spell, after `idleMs` with no job fetched and no turn in flight.
 */
import { describe, expect, it } from 'vitest';
import { HeapTrim, memoryReducingGc } from '../../src/runtime/heap-trim.ts';
import { silentLogger } from '../../src/base/logger.ts';
import { ManualClock } from '../../src/base/clock.ts';

function setup(idleMs = 10_000) {
  const clock = new ManualClock();
  let inFlight = 0;
  let trims = 0;
  const trim = new HeapTrim({ clock, logger: silentLogger, idleMs, inFlight: () => inFlight, trim: () => void trims++ });
  return { clock, trim, trims: () => trims, setInFlight: (n: number) => (inFlight = n) };
}

describe('idle heap trim', () => {
  it('trims once, idleMs after the last activity, and not again until new activity', async () => {
    const t = setup();
    expect(t.trim.pass()).toBe(false); // nothing ran yet
    t.trim.noteActivity();
    await t.clock.advance(9_999);
    expect(t.trim.pass()).toBe(false);
    await t.clock.advance(1);
    expect(t.trim.pass()).toBe(true);
    await t.clock.advance(60_000);
    expect(t.trim.pass()).toBe(false);
    expect(t.trims()).toBe(1);
    t.trim.noteActivity();
    await t.clock.advance(10_000);
    expect(t.trim.pass()).toBe(true);
    expect(t.trims()).toBe(2);
  });

  it('waits while turns are in flight: idleness counts from when the last one ended', async () => {
    const t = setup();
    t.trim.noteActivity();
    t.setInFlight(3);
    await t.clock.advance(30_000);
    expect(t.trim.pass()).toBe(false);
    t.setInFlight(0);
    await t.clock.advance(5_000);
    expect(t.trim.pass()).toBe(false);
    await t.clock.advance(5_000);
    expect(t.trim.pass()).toBe(true);
  });

  it('never trims with idleMs 0', async () => {
    const t = setup(0);
    t.trim.noteActivity();
    await t.clock.advance(1_000_000);
    expect(t.trim.pass()).toBe(false);
    expect(t.trims()).toBe(0);
  });

  it('gives back the heap a burst left behind', () => {
    let keep: unknown[][] = [];
    for (let r = 0; r < 20; r++) {
      keep.push(Array.from({ length: 50_000 }, (_, i) => ({ i, s: `x${i}` })));
      if (keep.length > 5) keep.shift();
    }
    keep = [];
    const before = process.memoryUsage().heapTotal;
    memoryReducingGc();
    const after = process.memoryUsage().heapTotal;
    expect(keep).toHaveLength(0);
    expect(after).toBeLessThan(before * 0.75);
  });
});
