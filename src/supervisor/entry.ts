/**
 * Per-child bookkeeping of the supervisor and the small helpers it needs. Internal: not
 * exported from index.ts.
 */
import type { TimerHandle } from '../base/clock.ts';
import { CorralError } from '../base/errors.ts';
import type { ChildSpec, ChildState } from './types.ts';

const POLICIES = new Set(['permanent', 'transient', 'temporary']);

export interface Entry<C> {
  spec: ChildSpec<C>;
  dynamic: boolean;
  state: ChildState;
  generation: number;
  /** markReady() was called by the current generation. */
  ready: boolean;
  /** The current generation's controller; null when it is not running. */
  abort: AbortController | null;
  restartTimer: TimerHandle | null;
  /** Set by removeChild: drop the entry once it ended. */
  forget: boolean;
  /** removeChild() callers waiting for the end. */
  endWaiters: Array<() => void>;
}

/** Validate a spec and build its idle entry. Copies the spec so later caller edits change nothing. */
export function newEntry<C>(spec: ChildSpec<C>, dynamic: boolean): Entry<C> {
  if (typeof spec.name !== 'string' || spec.name === '') {
    throw new CorralError('invalid_argument', 'child name must be a non-empty string');
  }
  if (typeof spec.factory !== 'function') {
    throw new CorralError('invalid_argument', `child "${spec.name}": factory must be a function`);
  }
  if (!POLICIES.has(spec.policy)) {
    throw new CorralError('invalid_argument', `child "${spec.name}": unknown restart policy ${String(spec.policy)}`);
  }
  if (spec.restartDelayMs !== undefined) checkDelay(spec.restartDelayMs, `child "${spec.name}": restartDelayMs`);
  return {
    spec: { ...spec },
    dynamic,
    state: 'idle',
    generation: 0,
    ready: false,
    abort: null,
    restartTimer: null,
    forget: false,
    endWaiters: [],
  };
}

export function checkDelay(ms: number, what: string): number {
  if (!Number.isFinite(ms) || ms < 0) throw new CorralError('invalid_argument', `${what} must be >= 0, got ${ms}`);
  return ms;
}

export function deferred(): { promise: Promise<void>; resolve(): void; reject(e: unknown): void } {
  let resolve!: () => void;
  let reject!: (e: unknown) => void;
  const promise = new Promise<void>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  return { promise, resolve, reject };
}

/**
 * An error that only says "you asked me to stop": our abort reason, any AbortError (e.g. from
 * `clock.sleep(ms, signal)` or `fetch`), or a `shutdown` CorralError. Recording these as
 * failures would turn every ordinary shutdown into a `failed` result.
 */
export function isAbortLike(error: unknown, signal: AbortSignal): boolean {
  if (error === signal.reason) return true;
  if (error instanceof CorralError && error.code === 'shutdown') return true;
  return typeof error === 'object' && error !== null && (error as { name?: unknown }).name === 'AbortError';
}
