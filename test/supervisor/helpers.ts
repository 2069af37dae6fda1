/** Shared helpers for the supervisor tests. */
import { ManualClock } from '../../src/base/clock.ts';
import type { SupervisorEvent, SupervisorHandle } from '../../src/supervisor/index.ts';

/** Resolves when `signal` aborts: a child that runs until it is told to stop. */
export function untilAbort(signal: AbortSignal): Promise<void> {
  if (signal.aborted) return Promise.resolve();
  return new Promise((resolve) => signal.addEventListener('abort', () => resolve(), { once: true }));
}

/** Let every pending promise continuation run without moving time. */
export async function settle(clock: ManualClock): Promise<void> {
  await clock.advance(0);
}

/** Read every event currently buffered, without waiting and without moving time. */
export function drain(handle: SupervisorHandle<unknown>): SupervisorEvent[] {
  const out: SupervisorEvent[] = [];
  for (let e = handle.tryNextEvent(); e && e.type !== 'end'; e = handle.tryNextEvent()) out.push(e);
  return out;
}

/** Compact "type:name#generation" strings, for readable order assertions. */
export function brief(events: SupervisorEvent[]): string[] {
  return events.map((e) => (e.type === 'lagged' ? `lagged:${e.missed}` : `${e.type}:${e.name}#${e.generation}`));
}

export function newClock(): ManualClock {
  return new ManualClock();
}
