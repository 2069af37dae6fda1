/**
 * `corral/testing`: helpers for an application's own tests. Everything it does not export is internal.
 */
export { ManualClock, type Clock, type TimerHandle } from './clock.ts';
